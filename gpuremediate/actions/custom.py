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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import Resource
from gpuremediate.state.maintenance import RequestError, parse_time

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


class CustomResources:
    """The API calls on custom resources of any kind (the plural from discovery)."""

    def __init__(self, client: KubeClient, *, dry_run: bool = False) -> None:
        self.client = client
        self.dry_run = dry_run

    def resource(self, ref: Ref) -> Resource:
        return self.client.resolve(ref.api_version, ref.kind)

    def _ns(self, ref: Ref) -> str | None:
        return ref.namespace or None

    def get(self, ref: Ref, name: str) -> dict[str, Any] | None:
        try:
            return self.client.get(self.resource(ref), name, self._ns(ref))
        except errors.NotFound:
            return None

    def list(self, ref: Ref, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        res = self.resource(ref)
        items: list[dict[str, Any]] = self.client.list(res, self._ns(ref), label_selector=selector(labels))["items"]
        return items

    def ensure(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        """Create ``body`` unless an object of that name exists (then return that one)."""
        name = body["metadata"]["name"]
        existing = self.get(ref, name)
        if existing is not None:
            return existing
        try:
            return self.client.create(self.resource(ref), body, self._ns(ref), dry_run=self.dry_run)
        except errors.AlreadyExists:
            return self.get(ref, name) or body

    def delete(self, ref: Ref, name: str) -> None:
        if self.dry_run:
            return
        with contextlib.suppress(errors.NotFound):
            self.client.delete(self.resource(ref), name, self._ns(ref), propagation_policy="Background")


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
