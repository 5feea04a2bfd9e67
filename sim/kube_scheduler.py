"""The one part of kube-scheduler the emulator runs: pods pinned to one node by a required node affinity on
``metadata.name`` (how the DaemonSet controller places its pods, and how gpuremediate places a validation Job that
takes one GPU through a ResourceClaim), bound once their ResourceClaims are allocated.

For each such pod (no ``spec.nodeName``, not terminating) every claim it names (``resourceClaimName``) must exist;
an unallocated one is allocated as the DRA plugin of a GA scheduler would: per request (``exactly``, ExactCount 1)
a device of that node's ResourceSlices (each pool's newest generation) that the request's CEL selectors accept
(``device.driver``, ``device.attributes["<domain>"].<name>``), that no other claim's allocation names (an allocated
claim holds its devices until ``status.allocation`` is cleared, by the resourceclaim controller once its last
consumer is gone: sim.kube_dra_claims), and whose taints — DeviceTaintRules with effect NoSchedule or NoExecute and
the slice's own — the request tolerates; the request's tolerations are copied into the result (the eviction
controller reads them there). As the DRA plugin's ``bindClaim`` does, the claim first gets the finalizer
``resource.kubernetes.io/delete-protection`` (a normal update), then its allocation; then it is reserved for the pod
and the pod bound (``spec.nodeName``). A pod that cannot be placed stays Pending and is looked at again at the next
change.

Not modelled: every other pod (the emulator binds nothing else: tests and NodeSim set ``spec.nodeName``), DeviceClass
selectors, allocation modes other than one device, admin access, prioritized lists, node resources and taints.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from sim import kube_cel as cel
from sim.kube_dra_claims import FINALIZER
from sim.kube_dra_eviction import rule_matches, tolerates
from sim.kube_resources import DRA_GROUP
from sim.kube_store import Obj, WatchEvent

if TYPE_CHECKING:
    from sim.kube_host import Types
    from sim.kube_store import Store

_WATCHED = ("/pods", f"{DRA_GROUP}/resourceclaims", f"{DRA_GROUP}/resourceslices", f"{DRA_GROUP}/devicetaintrules")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
Device = tuple[str, str, Obj]  # driver, pool, the slice's device entry


class PinnedScheduler:
    def __init__(self, store: Store, api: Types) -> None:
        self.store = store
        self.api = api
        self.dirty = True
        self.bound = 0
        # The pending pinned pods, kept from the pod events: a scan of every pod after each event made a drain
        # of 10,000 pods quadratic (most of the emulator's CPU). None until the first tick's one full scan.
        self.pending: dict[tuple[str, str], None] | None = None

    def react(self, event: WatchEvent) -> None:
        if event.key == "/pods" and self.pending is not None:
            ident = (_ns(event.obj), event.obj["metadata"]["name"])
            if event.type != "DELETED" and _pending_pinned(event.obj):
                self.pending[ident] = None
            else:
                self.pending.pop(ident, None)
        if event.key in _WATCHED:
            self.dirty = True

    def tick(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        if self.pending is None:
            self.pending = dict.fromkeys((_ns(p), p["metadata"]["name"])
                                         for p in self.store.select("/pods", "", _pending_pinned))
        for ns, name in list(self.pending):
            pod = self.store.get("/pods", ns, name)
            if pod is None or not _pending_pinned(pod):
                self.pending.pop((ns, name), None)
                continue
            self._place(pod, str(_pinned_node(pod)))

    def _place(self, pod: Obj, node: str) -> None:
        claims = [self.store.get(self._key("resourceclaims"), _ns(pod), name) for name in _claim_names(pod)]
        if any(claim is None for claim in claims):
            return  # not made yet: the claim's creation marks us dirty
        for claim in claims:
            assert claim is not None
            if not _allocation(claim) and not self._allocate(claim, node):
                return
        for claim in claims:
            assert claim is not None
            self._reserve(claim["metadata"]["name"], _ns(pod), pod)
        current = self.store.get("/pods", _ns(pod), pod["metadata"]["name"])
        if current is not None and not current["spec"].get("nodeName"):
            bound = copy.deepcopy(current)
            bound["spec"]["nodeName"] = node
            self.store.update(self.api.type_for("", "pods"), bound, current)
            self.bound += 1

    def _allocate(self, claim: Obj, node: str) -> bool:
        taken = {(r.get("driver"), r.get("pool"), r.get("device")) for c in self._list("resourceclaims")
                 for r in _results(c)}
        rules = [r for r in self._list("devicetaintrules")
                 if ((r.get("spec") or {}).get("taint") or {}).get("effect") in BLOCKING_EFFECTS]
        results = []
        for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or []:
            exactly = request.get("exactly") or {}
            tolerations = list(exactly.get("tolerations") or [])
            found = next((d for d in self._devices(node) if (d[0], d[1], d[2].get("name")) not in taken
                          and _selected(exactly, d) and _tolerated(d, rules, tolerations)), None)
            if found is None:
                return False
            taken.add((found[0], found[1], found[2].get("name")))
            result: dict[str, Any] = {"request": request.get("name", ""), "driver": found[0], "pool": found[1],
                                      "device": found[2].get("name", "")}
            if tolerations:
                result["tolerations"] = copy.deepcopy(tolerations)
            results.append(result)
        selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                            "values": [node]}]}]}
        self._protect(claim)
        self._write_status(claim, {"allocation": {"devices": {"results": results}, "nodeSelector": selector}})
        return True

    def _protect(self, claim: Obj) -> None:
        """The builtin finalizer, added in a normal update before the allocation is written (``bindClaim``)."""
        current = self.store.get(self._key("resourceclaims"), _ns(claim), claim["metadata"]["name"])
        if current is None or FINALIZER in (current["metadata"].get("finalizers") or []):
            return
        updated = copy.deepcopy(current)
        updated["metadata"]["finalizers"] = [*(current["metadata"].get("finalizers") or []), FINALIZER]
        self.store.update(self.api.type_for(DRA_GROUP, "resourceclaims"), updated, current)

    def _reserve(self, name: str, namespace: str, pod: Obj) -> None:
        claim = self.store.get(self._key("resourceclaims"), namespace, name)
        if claim is None:
            return
        reserved = list((claim.get("status") or {}).get("reservedFor") or [])
        if any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
            return
        reserved.append({"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]})
        self._write_status(claim, {**(claim.get("status") or {}), "reservedFor": reserved})

    def _write_status(self, claim: Obj, status: dict[str, Any]) -> None:
        current = self.store.get(self._key("resourceclaims"), _ns(claim), claim["metadata"]["name"])
        if current is None:
            return
        updated = copy.deepcopy(current)
        updated["status"] = {**(current.get("status") or {}), **status}
        self.store.update(self.api.type_for(DRA_GROUP, "resourceclaims"), updated, current)

    def _devices(self, node: str) -> list[Device]:
        slices = [s for s in self._list("resourceslices") if (s.get("spec") or {}).get("nodeName") == node]
        newest: dict[tuple[str, str], int] = {}
        for s in slices:
            driver, pool = _pool(s)
            newest[(driver, pool)] = max(newest.get((driver, pool), 0), _generation(s))
        return [(*_pool(s), device) for s in slices if _generation(s) == newest[_pool(s)]
                for device in (s.get("spec") or {}).get("devices") or []]

    def _list(self, resource: str) -> list[Obj]:
        try:
            return self.store.select(self._key(resource), "")
        except KeyError:
            return []

    def _key(self, resource: str) -> str:
        try:
            return self.api.type_for(DRA_GROUP, resource).key
        except KeyError:
            return f"{DRA_GROUP}/{resource}"


def _pending_pinned(pod: Obj) -> bool:
    return not (pod.get("spec") or {}).get("nodeName") and not pod["metadata"].get("deletionTimestamp") \
        and _pinned_node(pod) is not None and bool(_claim_names(pod))


def _pinned_node(pod: Obj) -> str | None:
    """The one node a required node affinity on ``metadata.name`` allows, or None."""
    required = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if len(terms) != 1:
        return None
    fields = [f for f in terms[0].get("matchFields") or [] if f.get("key") == "metadata.name"]
    if len(fields) == 1 and fields[0].get("operator") == "In" and len(fields[0].get("values") or []) == 1:
        return str(fields[0]["values"][0])
    return None


def _claim_names(pod: Obj) -> list[str]:
    return [str(c["resourceClaimName"]) for c in (pod.get("spec") or {}).get("resourceClaims") or []
            if c.get("resourceClaimName")]


def _selected(exactly: dict[str, Any], device: Device) -> bool:
    scope = {"device": {"driver": device[0], "attributes": _attributes(device[0], device[2])}}
    for selector in exactly.get("selectors") or []:
        expression = (selector.get("cel") or {}).get("expression")
        try:
            if expression and cel.evaluate(cel.compile_rule(str(expression)), scope) is not True:
                return False
        except cel.CelError:
            return False  # a runtime error (no such attribute) does not select the device, as upstream
    return True


def _attributes(driver: str, device: Obj) -> dict[str, dict[str, Any]]:
    """``device.attributes`` as CEL sees it: by domain (an unqualified name is in the driver's), typed values."""
    out: dict[str, dict[str, Any]] = {}
    for name, typed in (device.get("attributes") or {}).items():
        domain, _, short = str(name).rpartition("/")
        value = next(iter(typed.values())) if isinstance(typed, dict) and typed else None
        out.setdefault(domain or driver, {})[short] = value
    return out


def _tolerated(device: Device, rules: list[Obj], tolerations: list[dict[str, Any]]) -> bool:
    driver, pool, entry = device
    taints = [(r.get("spec") or {}).get("taint") or {} for r in rules
              if rule_matches(r, driver, pool, str(entry.get("name", "")))]
    taints += [t for t in entry.get("taints") or [] if t.get("effect") in BLOCKING_EFFECTS]
    return all(any(tolerates(t, taint) for t in tolerations) for taint in taints)


def _ns(obj: Obj) -> str:
    return str(obj["metadata"].get("namespace", ""))


def _pool(slice_: Obj) -> tuple[str, str]:
    spec = slice_.get("spec") or {}
    return str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))


def _generation(slice_: Obj) -> int:
    return int(((slice_.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _allocation(claim: Obj) -> dict[str, Any] | None:
    allocation = (claim.get("status") or {}).get("allocation")
    return allocation if isinstance(allocation, dict) else None


def _results(claim: Obj) -> list[dict[str, Any]]:
    return [r for r in ((_allocation(claim) or {}).get("devices") or {}).get("results") or [] if isinstance(r, dict)]
