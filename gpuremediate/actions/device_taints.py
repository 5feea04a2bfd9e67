"""GPU-level isolation with DRA device taints: one ``DeviceTaintRule`` per isolated GPU (KEP-5055).

The API (Kubernetes docs, "Device Taints and Tolerations"; k8s.io/api resource/v1beta2 types.go of v1.36):
a DeviceTaintRule is cluster-scoped, ``spec.deviceSelector`` = {driver, pool, device} (every field set must
match; ``deviceClassName`` and ``selectors`` were tombstoned in 1.35), ``spec.taint`` = {key, value, effect,
timeAdded}. Effects: ``None`` (informational: our dry run), ``NoSchedule`` (the scheduler allocates the device
to no new claim that does not tolerate it), ``NoExecute`` (also: kube-controller-manager's
device-taint-eviction-controller DELETES the pods whose allocated claims do not tolerate it; not an eviction,
PodDisruptionBudgets are not consulted). The controller reports in ``status.conditions[EvictionInProgress]``.
Where it is served: resource.k8s.io/v1alpha3 (1.33+, alpha), v1beta2 (1.36: gate ``DRADeviceTaintRules`` on
kube-apiserver and kube-controller-manager and ``--runtime-config=resource.k8s.io/v1beta2=true``), v1 (1.37,
GA). The version is discovered, most stable first (``api_version`` says which one is in use).

A GPU is found by its UUID in the node's ResourceSlices (``fieldSelector=spec.nodeName=<node>``, every page):
NVIDIA's DRA driver for GPUs (driver ``gpu.nvidia.com``) publishes one pool per node, named after the node,
with a device ``gpu-<minor>`` per GPU carrying the attribute ``uuid``.

Ownership: a rule is ours when it carries ``app.kubernetes.io/managed-by=gpuremediate`` (docs/design.md §10).
Names are derived from node, device and GPU UUID (``gpur-<node>-<device>-<hash>``), so a restarted controller
finds its rules by name and, by label, lists them all. Nothing here modifies or deletes a rule without our
label: a same-named foreign rule is a ``ForeignRule`` error and no write.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuremediate.actions.custom import MANAGED_BY, MANAGED_BY_LABEL, dns_name, label_value, selector
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import (
    DEVICE_TAINT_RULE_API_VERSIONS,
    DEVICE_TAINT_RULE_KIND,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Resource,
)
from gpuremediate.policy.taint import DEFAULT_TAINT_KEY

log = logging.getLogger(__name__)

NVIDIA_DRIVER = "gpu.nvidia.com"
TAINT_KEY = DEFAULT_TAINT_KEY  # gpuremediate.io/unhealthy, the node taint's key too
NODE_LABEL = "gpuremediate.io/node"
GPU_UUID_LABEL = "gpuremediate.io/gpu-uuid"
FAULT_ANNOTATION = "gpuremediate.io/fault"
FINGERPRINT_ANNOTATION = "gpuremediate.io/fingerprint"
DRY_RUN_ANNOTATION = "gpuremediate.io/dry-run-effect"  # the effect a dry run's None rule stands for

GA_API_VERSION = DEVICE_TAINT_RULE_API_VERSIONS[0]  # resource.k8s.io/v1
EFFECT_NONE = "None"
EFFECT_NO_SCHEDULE = "NoSchedule"
EFFECT_NO_EXECUTE = "NoExecute"
EFFECTS = (EFFECT_NONE, EFFECT_NO_SCHEDULE, EFFECT_NO_EXECUTE)
EVICTION_CONDITION = "EvictionInProgress"

NOT_SERVED = ("DRA device taints are not served by this cluster: no DeviceTaintRule in resource.k8s.io/v1, "
              "v1beta2 or v1alpha3 (Kubernetes 1.36 needs --feature-gates=DRADeviceTaintRules=true on "
              "kube-apiserver and kube-controller-manager and --runtime-config=resource.k8s.io/v1beta2=true; "
              "GA and on by default in 1.37)")


class DeviceTaintError(Exception):
    """Base of what this module raises beyond the kube client's own errors."""


class DeviceTaintsNotServed(DeviceTaintError):
    """The cluster serves no DeviceTaintRule (the API is off or too old): GPU-level isolation is not possible."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(NOT_SERVED + (f": {detail}" if detail else ""))


class ForeignRule(DeviceTaintError):
    """A DeviceTaintRule with our name exists but is not ours (no managed-by label): never written."""

    def __init__(self, name: str) -> None:
        super().__init__(f"DeviceTaintRule {name} exists and is not managed by gpuremediate "
                         f"({MANAGED_BY_LABEL}={MANAGED_BY} missing): left as it is")
        self.name = name


class RuleConflict(DeviceTaintError):
    """Our rule changed under us twice in a row (409): the caller should read again later."""


class RuleInvalid(DeviceTaintError):
    """The server refused the rule (422); the message is the server's."""

    def __init__(self, name: str, err: errors.ApiError) -> None:
        super().__init__(f"DeviceTaintRule {name} refused: {err.message}")
        self.name = name
        self.causes = err.causes


@dataclass(frozen=True)
class GpuDevice:
    """Where one GPU is in DRA terms: what a DeviceTaintRule's selector and a claim's allocation name."""

    node: str
    uuid: str
    driver: str
    pool: str
    device: str
    slice_name: str = ""


@dataclass(frozen=True)
class TaintRule:
    """One of our DeviceTaintRules, read."""

    name: str
    node: str
    uuid: str
    driver: str
    pool: str
    device: str
    effect: str
    fault: str
    fingerprint: str
    generation: int
    eviction: Mapping[str, Any] | None  # the EvictionInProgress condition, if the eviction controller wrote one
    obj: Mapping[str, Any]

    @property
    def eviction_in_progress(self) -> bool:
        return bool(self.eviction and self.eviction.get("status") == "True")

    @property
    def eviction_done(self) -> bool:
        """NoExecute and the eviction controller reports, for this generation of the spec, no pod left to evict."""
        return self.effect == EFFECT_NO_EXECUTE and self.eviction is not None \
            and self.eviction.get("status") == "False" and self.eviction.get("observedGeneration") == self.generation


# --- finding a GPU's device ------------------------------------------------------------------------------

def find_gpu_device(client: KubeClient, node: str, uuid: str, driver: str | None = NVIDIA_DRIVER, *,
                    page_size: int = 500) -> GpuDevice | None:
    """The device whose ``uuid`` attribute is ``uuid`` in the node's ResourceSlices (of ``driver``; None: any
    driver), from each pool's newest generation; None when no slice of the node has it. Every page is read."""
    listed = client.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}", limit=page_size)["items"]
    slices = [s for s in listed if driver is None or (s.get("spec") or {}).get("driver") == driver]
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        newest[_pool_id(s)] = max(newest.get(_pool_id(s), 0), _generation(s))
    for s in slices:
        if _generation(s) != newest[_pool_id(s)]:
            continue
        driver_name, pool = _pool_id(s)
        for device in (s.get("spec") or {}).get("devices") or []:
            published = _device_uuid(device, driver_name)
            if published.lower() == uuid.lower():  # as the driver spells it (NVML: "GPU-" + lower-case hex)
                return GpuDevice(node, published, driver_name, pool, str(device.get("name", "")), s["metadata"]["name"])
    return None


def _pool_id(slice_: Mapping[str, Any]) -> tuple[str, str]:
    spec = slice_.get("spec") or {}
    return str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))


def _generation(slice_: Mapping[str, Any]) -> int:
    return int(((slice_.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _device_uuid(device: Mapping[str, Any], driver: str) -> str:
    """The ``uuid`` attribute (unqualified names are in the driver's domain, so ``<driver>/uuid`` is the same)."""
    attributes = device.get("attributes") or {}
    value = attributes.get("uuid") or attributes.get(f"{driver}/uuid") or {}
    return str(value.get("string") or "")


# --- names, labels, bodies --------------------------------------------------------------------------------

def rule_name(node: str, uuid: str, device: str) -> str:
    """``gpur-<node>-<device>-<hash of node and UUID>``: a DNS subdomain of at most 253 characters; a GPU swapped
    into the same slot (a new UUID) gets another name."""
    digest = hashlib.sha256(f"{node}\0{uuid}".encode()).hexdigest()[:10]
    head = dns_name("gpur", node, device)[: 253 - len(digest) - 1].rstrip("-.")
    return f"{head}-{digest}"


def rule_labels(node: str, uuid: str) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY, NODE_LABEL: label_value(node), GPU_UUID_LABEL: label_value(uuid)}


def rule_body(gpu: GpuDevice, effect: str, api_version: str, *, taint_key: str = TAINT_KEY, fault: str = "",
              fingerprint: str = "", dry_run_effect: str = "") -> dict[str, Any]:
    annotations = {FAULT_ANNOTATION: fault, FINGERPRINT_ANNOTATION: fingerprint, DRY_RUN_ANNOTATION: dry_run_effect}
    taint: dict[str, Any] = {"key": taint_key, "effect": effect}
    if fault:
        taint["value"] = label_value(fault)
    return {"apiVersion": api_version, "kind": DEVICE_TAINT_RULE_KIND,
            "metadata": {"name": rule_name(gpu.node, gpu.uuid, gpu.device), "labels": rule_labels(gpu.node, gpu.uuid),
                         "annotations": {k: v for k, v in annotations.items() if v}},
            "spec": {"deviceSelector": {"driver": gpu.driver, "pool": gpu.pool, "device": gpu.device},
                     "taint": taint}}


def is_ours(obj: Mapping[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def read_rule(obj: Mapping[str, Any]) -> TaintRule:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    annotations, selector_ = meta.get("annotations") or {}, spec.get("deviceSelector") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    return TaintRule(
        name=str(meta.get("name", "")), node=str((meta.get("labels") or {}).get(NODE_LABEL, "")),
        uuid=str((meta.get("labels") or {}).get(GPU_UUID_LABEL, "")), driver=str(selector_.get("driver", "")),
        pool=str(selector_.get("pool", "")), device=str(selector_.get("device", "")),
        effect=str((spec.get("taint") or {}).get("effect", "")), fault=str(annotations.get(FAULT_ANNOTATION, "")),
        fingerprint=str(annotations.get(FINGERPRINT_ANNOTATION, "")), generation=int(meta.get("generation") or 0),
        eviction=next((c for c in conditions if c.get("type") == EVICTION_CONDITION), None), obj=obj)


# --- the rules ----------------------------------------------------------------------------------------------

class DeviceTaints:
    """Create, escalate, list and remove our DeviceTaintRules. With ``dry_run`` every rule is written with
    effect None (it taints for information only: no scheduling or eviction effect) and annotated with the
    effect it stands for."""

    def __init__(self, client: KubeClient, *, taint_key: str = TAINT_KEY, dry_run: bool = False) -> None:
        self.client = client
        self.taint_key = taint_key
        self.dry_run = dry_run
        self._resource: Resource | None = None

    @property
    def resource(self) -> Resource:
        """The DeviceTaintRule resource, discovered once (v1, then v1beta2, then v1alpha3)."""
        if self._resource is None:
            self._resource = self._discover()
        return self._resource

    @property
    def api_version(self) -> str:
        return self.resource.api_version

    @property
    def served_ga(self) -> bool:
        """The rules are served at resource.k8s.io/v1 (Kubernetes 1.37, GA): the version whose kube-scheduler
        honours NoSchedule device taints. Before it (v1beta2 on 1.36, v1alpha3) the scheduler either ignores the
        rules or, with the gate on, fails to start (docs/dra.md)."""
        return self.api_version == GA_API_VERSION

    def _discover(self) -> Resource:
        for api_version in DEVICE_TAINT_RULE_API_VERSIONS:
            try:
                found = self.client.resolve(api_version, DEVICE_TAINT_RULE_KIND)
            except errors.NotFound:
                continue
            log.info("DeviceTaintRule is served at %s", found.api_version)
            return found
        raise DeviceTaintsNotServed()

    # --- writes -----------------------------------------------------------------------------------
    def isolate(self, gpu: GpuDevice, effect: str, *, fault: str = "", fingerprint: str = "") -> TaintRule:
        """Our rule for ``gpu`` with ``effect`` (None when dry-running): created, or updated in place when the
        effect or the fault differ (NoSchedule -> NoExecute is the escalation). Idempotent."""
        if effect not in EFFECTS:
            raise ValueError(f"effect {effect!r} is not one of {', '.join(EFFECTS)}")
        written, stands_for = (EFFECT_NONE, effect) if self.dry_run else (effect, "")
        body = rule_body(gpu, written, self.api_version, taint_key=self.taint_key, fault=fault,
                         fingerprint=fingerprint, dry_run_effect=stands_for)
        name = body["metadata"]["name"]
        try:
            created = self._call(name, lambda: self.client.create(self.resource, body))
        except errors.AlreadyExists:
            return self._update(name, body)
        log.info("DeviceTaintRule %s: %s/%s/%s tainted %s", name, gpu.driver, gpu.pool, gpu.device, written)
        return read_rule(created)

    def _update(self, name: str, body: dict[str, Any]) -> TaintRule:
        for attempt in (1, 2):
            current = self._get(name)
            if current is None:  # deleted since our create met it: create it again
                return read_rule(self._call(name, lambda: self.client.create(self.resource, body)))
            if not is_ours(current):
                raise ForeignRule(name)
            wanted = _merged(current, body)
            if wanted == current:
                return read_rule(current)
            try:
                replaced = self._call(name, functools.partial(self.client.replace, self.resource, name, wanted))
            except errors.Conflict:
                if attempt == 2:
                    raise RuleConflict(f"DeviceTaintRule {name} changed while being updated, twice") from None
                continue
            log.info("DeviceTaintRule %s: effect %s", name, body["spec"]["taint"]["effect"])
            return read_rule(replaced)
        raise AssertionError("unreachable")

    def release(self, node: str, uuid: str) -> list[str]:
        """Delete our rules for that GPU (the GPU is validated); the names deleted. Foreign rules are never
        listed (the label selector), so never deleted."""
        deleted = []
        for rule in self.owned(node, uuid=uuid):
            if self._delete(rule.obj):
                deleted.append(rule.name)
        return deleted

    def release_rule(self, name: str) -> bool:
        """Delete our rule ``name``; False when it is gone already; ForeignRule when it is not ours."""
        current = self._get(name)
        if current is None:
            return False
        if not is_ours(current):
            raise ForeignRule(name)
        return self._delete(current)

    def _delete(self, obj: Mapping[str, Any]) -> bool:
        meta = obj["metadata"]
        try:  # the uid precondition: never a same-named rule someone else made since we read ours
            self._call(meta["name"], lambda: self.client.delete(self.resource, meta["name"],
                                                                preconditions={"uid": meta["uid"]}))
        except errors.NotFound:
            return False
        except errors.Conflict:  # the uid differs: replaced since we read it; the next look decides
            log.warning("DeviceTaintRule %s was replaced since it was read: not deleted", meta["name"])
            return False
        log.info("DeviceTaintRule %s deleted", meta["name"])
        return True

    # --- reads ------------------------------------------------------------------------------------
    def get(self, gpu: GpuDevice) -> TaintRule | None:
        """Our rule for ``gpu``, or None (none, or a foreign one of that name: ``ForeignRule``)."""
        name = rule_name(gpu.node, gpu.uuid, gpu.device)
        current = self._get(name)
        if current is None:
            return None
        if not is_ours(current):
            raise ForeignRule(name)
        return read_rule(current)

    def owned(self, node: str | None = None, *, uuid: str | None = None) -> list[TaintRule]:
        """Our rules (all pages), optionally only one node's (and one GPU's): what a restarted controller has."""
        labels = {MANAGED_BY_LABEL: MANAGED_BY}
        if node is not None:
            labels[NODE_LABEL] = label_value(node)
        if uuid is not None:
            labels[GPU_UUID_LABEL] = label_value(uuid)
        listed = self._call("", lambda: self.client.list(self.resource, label_selector=selector(labels)))
        return [read_rule(obj) for obj in listed["items"] if is_ours(obj)]

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call(name, lambda: self.client.get(self.resource, name))
        except errors.NotFound:
            return None

    def _call(self, name: str, request: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """One request, its errors in this module's terms: a 404 that names no object means the API is gone
        (the gate was turned off since discovery), a 422 is RuleInvalid."""
        try:
            return request()
        except errors.NotFound as err:
            if not err.details.get("name"):
                self._resource = None
                raise DeviceTaintsNotServed(err.message) from err
            raise
        except errors.Invalid as err:
            raise RuleInvalid(name, err) from err


def _merged(current: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` with our labels, annotations and spec (timeAdded kept: the server moves it when the effect
    changes); everything else (others' labels, status, resourceVersion for the conditional PUT) as read."""
    meta = dict(current["metadata"])
    meta["labels"] = {**(meta.get("labels") or {}), **body["metadata"]["labels"]}
    ours = (FAULT_ANNOTATION, FINGERPRINT_ANNOTATION, DRY_RUN_ANNOTATION)
    kept = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in ours}
    annotations = {**kept, **body["metadata"]["annotations"]}
    meta["annotations"] = annotations
    if not annotations:
        meta.pop("annotations")
    taint = dict(body["spec"]["taint"])
    old_taint = (current.get("spec") or {}).get("taint") or {}
    if "timeAdded" in old_taint:
        taint["timeAdded"] = old_taint["timeAdded"]
    spec = {**(current.get("spec") or {}), "deviceSelector": body["spec"]["deviceSelector"], "taint": taint}
    return {**current, "metadata": meta, "spec": spec}


# --- the validation Job's claim on the device ----------------------------------------------------------------

VALIDATION_REQUEST = "gpu"  # the claim's request, and the pod's name for the claim
_CEL_SAFE = re.compile(r"[A-Za-z0-9._-]+")


def claimable(gpu: GpuDevice) -> bool:
    """Its driver and UUID can be quoted in a CEL selector as they are."""
    return bool(_CEL_SAFE.fullmatch(gpu.driver) and _CEL_SAFE.fullmatch(gpu.uuid))


def validation_claim(name: str, namespace: str, gpu: GpuDevice, job: Mapping[str, Any], *, device_class: str,
                     taint_key: str = TAINT_KEY) -> dict[str, Any]:
    """A ResourceClaim for exactly that GPU (a CEL selector on its ``uuid`` attribute), tolerating our taint (both
    effects: the scheduler checks NoSchedule, the eviction controller NoExecute), owned by the validation Job so the
    garbage collector deletes it with the Job. ValueError for a driver or UUID no CEL string should hold."""
    if not claimable(gpu):
        raise ValueError(f"GPU {gpu.uuid!r} of driver {gpu.driver!r}: not a name a CEL selector can quote")
    expression = f'device.driver == "{gpu.driver}" && device.attributes["{gpu.driver}"].uuid == "{gpu.uuid}"'
    tolerations = [{"key": taint_key, "operator": "Exists", "effect": effect}
                   for effect in (EFFECT_NO_SCHEDULE, EFFECT_NO_EXECUTE)]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
             "uid": job["metadata"]["uid"], "blockOwnerDeletion": False}
    return {"apiVersion": RESOURCE_CLAIMS.api_version, "kind": RESOURCE_CLAIMS.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": rule_labels(gpu.node, gpu.uuid),
                         "ownerReferences": [owner]},
            "spec": {"devices": {"requests": [{"name": VALIDATION_REQUEST, "exactly": {
                "deviceClassName": device_class, "selectors": [{"cel": {"expression": expression}}],
                "tolerations": tolerations}}]}}}


def ensure_validation_claim(client: KubeClient, body: Mapping[str, Any]) -> bool:
    """Create the claim unless it exists; True when this call created it."""
    meta = body["metadata"]
    try:
        client.get(RESOURCE_CLAIMS, meta["name"], meta["namespace"])
        return False
    except errors.NotFound:
        pass
    try:
        client.create(RESOURCE_CLAIMS, dict(body), meta["namespace"])
    except errors.AlreadyExists:
        return False
    return True


# --- who holds a device -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Holder:
    """A ResourceClaim allocated the device and reserved for a pod that still exists (it may be terminating)."""

    claim: str  # namespace/name
    pod: str  # namespace/name


def device_holders(client: KubeClient, driver: str, pool: str, device: str,
                   pods: Sequence[Mapping[str, Any]]) -> list[Holder]:
    """The claims allocated ``driver``/``pool``/``device`` and reserved for one of ``pods`` (the node's pods, as
    listed) by uid: the device is free once the eviction controller's deletions are done. Only the pods' own claims
    are read (one GET each: ``spec.resourceClaims[].resourceClaimName``, or a template's claim through
    ``status.resourceClaimStatuses``), never every claim of the cluster. A claim left allocated for a pod that is
    gone holds nothing (the claim controller deallocates it)."""
    live = {str((p.get("metadata") or {}).get("uid", "")): p for p in pods
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
    holders = []
    for namespace, name in sorted({key for pod in live.values() for key in pod_claims(pod)}):
        try:
            claim = client.get(RESOURCE_CLAIMS, name, namespace)
        except errors.NotFound:
            continue  # deleted with its pod (a template's claim), or not made yet
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not any((r.get("driver"), r.get("pool"), r.get("device")) == (driver, pool, device) for r in results):
            continue
        for ref in status.get("reservedFor") or []:
            pod = live.get(str(ref.get("uid", "")))
            if pod is not None:
                pod_meta = pod.get("metadata") or {}
                holders.append(Holder(f"{namespace}/{name}",
                                      f"{pod_meta.get('namespace', '')}/{pod_meta.get('name', '')}"))
    return holders


def pod_claims(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(namespace, claim name) of each ResourceClaim the pod uses: named in its spec, or made from a template
    (the name the claim controller gave it is in ``status.resourceClaimStatuses``)."""
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    names = [entry.get("resourceClaimName") or generated.get(entry.get("name"))
             for entry in (pod.get("spec") or {}).get("resourceClaims") or []]
    return [(namespace, str(n)) for n in names if n]
