"""Custom resources handed to plugins (NVSentinel's contracts): names, labels, bodies, conditions.

Everything here is either pure (names, labels, template rendering, reading a condition) or one
API call. Names are durable (node + event id [+ attempt]) so a restarted controller finds what it
created (lookup before create; AlreadyExists means "mine"). Every resource carries labels that
say whose it is (node, action, equivalence group, entity, fault), so equivalence lookups are a
label-selected list, never a scan.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import Resource
from gpuremediate.state.maintenance import RequestError, parse_time
from gpuremediate.vocab.record import NodeRecord, occurrence

# NVSentinel's label for the node a DrainRequest is about.
NVSENTINEL_NODE_LABEL = "nvsentinel.nvidia.com/node-name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuremediate"
NODE_LABEL = "gpuremediate.io/node"
ACTION_LABEL = "gpuremediate.io/action"
GROUP_LABEL = "gpuremediate.io/equivalence-group"
ENTITY_LABEL = "gpuremediate.io/entity"
FAULT_LABEL = "gpuremediate.io/fault"
ATTEMPT_LABEL = "gpuremediate.io/attempt"

_T = TypeVar("_T")

# A resource's completion condition, read.
SUCCEEDED = "succeeded"
FAILED = "failed"
IN_PROGRESS = "in-progress"

_MAX_NAME = 253
_MAX_LABEL_VALUE = 63
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z]+)\s*\}\}")


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def event_id(fingerprint: str) -> str:
    """The health event id of a fault: DNS-safe, stable for the fault's fingerprint."""
    return _digest(fingerprint, 12)


def fault_event_id(record: NodeRecord) -> str:
    """The health event id of the record's fault occurrence (a recurring fingerprint gets a new one): the one
    a custom drain's request and a custom action's resources are labelled with."""
    return event_id(occurrence(record))


def dns_name(*parts: str) -> str:
    """A DNS subdomain from parts joined by '-'; too long or unsafe text is cut and hashed, so the
    result is stable, unique per input and always a valid object name."""
    raw = "-".join(parts)
    name = _NOT_DNS.sub("-", raw.lower()).strip("-.")
    if name == raw and len(name) <= _MAX_NAME:
        return name
    suffix = _digest(raw, 10)
    head = name[:_MAX_NAME - len(suffix) - 1].rstrip("-.")
    return f"{head}-{suffix}" if head else suffix


def label_value(text: str) -> str:
    """``text`` when it is a valid label value; else a stable cut-and-hashed one."""
    if len(text) <= _MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(text):
        return text
    suffix = _digest(text, 10)
    head = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[: _MAX_LABEL_VALUE - len(suffix) - 1].strip("-_.")
    return f"{head}-{suffix}" if head else suffix


def selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def render(template: Any, values: Mapping[str, str]) -> Any:
    """A deep copy of ``template`` with ``{{name}}`` replaced in string values (keys untouched).

    Structured substitution, never text templating into YAML: a value cannot inject structure.
    """
    if isinstance(template, str):
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)
    if isinstance(template, Mapping):
        return {key: render(value, values) for key, value in template.items()}
    if isinstance(template, list):
        return [render(value, values) for value in template]
    return copy.deepcopy(template)


def condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    """The condition of that type; entries of the wrong shape are skipped (see conditions_problem)."""
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, Mapping) and cond.get("type") == type_:
            return cond
    return None


def conditions_problem(obj: Mapping[str, Any]) -> str | None:
    """What is wrong with ``status.conditions`` (a plugin's permissive CRD lets anything in), or None."""
    status = obj.get("status")
    if status is None:
        return None
    if not isinstance(status, Mapping):
        return f"status is {type(status).__name__}, not an object"
    conditions = status.get("conditions")
    if conditions is None:
        return None
    if not isinstance(conditions, list):
        return f"status.conditions is {type(conditions).__name__}, not a list"
    for i, cond in enumerate(conditions):
        if not isinstance(cond, Mapping):
            return f"status.conditions[{i}] is {type(cond).__name__}, not an object"
    return None


def outcome(obj: Mapping[str, Any], type_: str) -> str:
    """True → succeeded, False → failed, absent or anything else (Unknown) → in progress."""
    cond = condition(obj, type_)
    status = cond.get("status") if cond else None
    return SUCCEEDED if status == "True" else FAILED if status == "False" else IN_PROGRESS


def condition_is(obj: Mapping[str, Any], type_: str, status: str) -> bool:
    cond = condition(obj, type_)
    return cond is not None and cond.get("status") == status


@dataclass(frozen=True)
class Ref:
    """Where one custom resource lives; ``encode()`` fits in a record's action detail."""

    api_version: str
    kind: str
    namespace: str  # "" for cluster-scoped

    def encode(self) -> str:
        return f"{self.api_version} {self.kind} {self.namespace}".rstrip()

    @staticmethod
    def decode(text: str) -> Ref | None:
        parts = text.split()
        if len(parts) not in (2, 3):
            return None
        return Ref(parts[0], parts[1], parts[2] if len(parts) == 3 else "")


class PermissionDenied(errors.Forbidden):
    """A 403 on a plugin's kind, naming what is missing; ``fresh``: the server said so now (else the
    backoff answered for it without asking again)."""

    def __init__(self, verb: str, ref: Ref, plural: str, cause: errors.ApiError, *, fresh: bool,
                 retry_in: float) -> None:
        self.verb, self.ref, self.plural, self.fresh, self.retry_in = verb, ref, plural, fresh, retry_in
        self.first = fresh  # the first refusal of this kind since it was last allowed (refused() says)
        super().__init__(403, cause.status)

    @property
    def group(self) -> str:
        return self.ref.api_version.split("/", 1)[0] if "/" in self.ref.api_version else ""

    def describe(self) -> str:
        where = f"in namespace {self.ref.namespace}" if self.ref.namespace else "cluster-wide"
        return (f"RBAC refuses {self.verb} on {self.plural}.{self.group} {where} (a ClusterRole/Role granting it "
                f"to the controller's ServiceAccount is missing); retrying in {self.retry_in:.0f}s")


class PermissionBackoff:
    """Kinds the API server refused (403): not asked again until the backoff has passed (30 s doubling to
    10 min), so a missing ClusterRole is one refusal now and then, not a request per reconcile."""

    def __init__(self, clock: Callable[[], float], first_s: float = 30.0, max_s: float = 600.0) -> None:
        self.clock, self.first_s, self.max_s = clock, first_s, max_s
        self._until: dict[Ref, tuple[float, float, PermissionDenied]] = {}  # ref -> (until, delay, refusal)
        self._lock = threading.Lock()

    def check(self, ref: Ref) -> None:
        """Raise the last refusal (not fresh) while ``ref`` is in backoff."""
        with self._lock:
            held = self._until.get(ref)
        if held is not None and self.clock() < held[0]:
            last = held[2]
            raise PermissionDenied(last.verb, ref, last.plural, last, fresh=False, retry_in=held[0] - self.clock())

    def refused(self, verb: str, ref: Ref, plural: str, cause: errors.ApiError) -> PermissionDenied:
        with self._lock:
            held = self._until.get(ref)
            delay = self.first_s if held is None else min(self.max_s, held[1] * 2)
            denied = PermissionDenied(verb, ref, plural, cause, fresh=True, retry_in=delay)
            denied.first = held is None
            self._until[ref] = (self.clock() + delay, delay, denied)
        return denied

    def allowed(self, ref: Ref) -> None:
        with self._lock:
            self._until.pop(ref, None)

    def known(self, ref: Ref) -> bool:
        with self._lock:
            return ref in self._until


class CustomResources:
    """The API calls on custom resources of any kind (the plural from discovery)."""

    def __init__(self, client: KubeClient, *, dry_run: bool = False,
                 permissions: PermissionBackoff | None = None) -> None:
        self.client = client
        self.dry_run = dry_run
        self.permissions = permissions

    def resource(self, ref: Ref) -> Resource:
        return self.client.resolve(ref.api_version, ref.kind)

    def _ns(self, ref: Ref) -> str | None:
        return ref.namespace or None

    def _call(self, verb: str, ref: Ref, call: Callable[[Resource], _T]) -> _T:
        """One API call on ``ref``'s kind; a 403 becomes PermissionDenied (and backoff for the kind)."""
        if self.permissions is not None:
            self.permissions.check(ref)
        res = self.resource(ref)
        try:
            result = call(res)
        except errors.Forbidden as exc:
            if self.permissions is None:
                raise PermissionDenied(verb, ref, res.plural, exc, fresh=True, retry_in=0.0) from exc
            raise self.permissions.refused(verb, ref, res.plural, exc) from exc
        if self.permissions is not None:
            self.permissions.allowed(ref)
        return result

    def get(self, ref: Ref, name: str) -> dict[str, Any] | None:
        def get(res: Resource) -> dict[str, Any] | None:
            try:
                return self.client.get(res, name, self._ns(ref))
            except errors.NotFound:
                return None
        return self._call("get", ref, get)

    def list(self, ref: Ref, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        def list_(res: Resource) -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = self.client.list(res, self._ns(ref), label_selector=selector(labels))["items"]
            return items
        return self._call("list", ref, list_)

    def ensure(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        """Create ``body`` unless an object of that name exists (then return that one)."""
        name = body["metadata"]["name"]
        existing = self.get(ref, name)
        if existing is not None:
            return existing

        def create(res: Resource) -> dict[str, Any]:
            try:
                return self.client.create(res, body, self._ns(ref), dry_run=self.dry_run)
            except errors.AlreadyExists:
                return self.get(ref, name) or body
        return self._call("create", ref, create)

    def delete(self, ref: Ref, name: str) -> None:
        if self.dry_run:
            return

        def delete(res: Resource) -> None:
            with contextlib.suppress(errors.NotFound):
                self.client.delete(res, name, self._ns(ref), propagation_policy="Background")
        self._call("delete", ref, delete)


def created_at(obj: Mapping[str, Any] | None, default: float) -> float:
    """An object's ``metadata.creationTimestamp`` in unix seconds; ``default`` when absent or unreadable."""
    text = ((obj or {}).get("metadata") or {}).get("creationTimestamp")
    try:
        return parse_time(text, "metadata.creationTimestamp")
    except RequestError:
        return default


def base_body(ref: Ref, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if ref.namespace:
        meta["namespace"] = ref.namespace
    return {"apiVersion": ref.api_version, "kind": ref.kind, "metadata": meta}
