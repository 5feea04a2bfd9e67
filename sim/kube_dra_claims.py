"""kube-controller-manager's resourceclaim controller, the part of it the emulator runs: the end of a claim's use.

What the real controllers do (kubernetes/kubernetes, read from the source; issue 43 met each rule on a v1.36.2
control plane: a claim allocated without the finalizer kept its GPU after its pod was gone):

- kube-scheduler's DRA plugin (pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go,
  ``bindClaim``): before it writes an allocation it adds the finalizer ``resource.kubernetes.io/delete-protection``
  (``resourceapi.Finalizer``) in a normal update, then writes ``status.allocation`` and appends the pod to
  ``status.reservedFor`` in one status update. ``sim.dra_claims.allocate`` and ``sim.kube_scheduler`` write the same.
- the resourceclaim controller (pkg/controller/resourceclaim/controller.go, ``syncPod``): a pod bound to a node
  (``spec.nodeName``), not marked for deletion, that names an allocated claim not reserved for it is appended to
  the claim's ``reservedFor`` (a pod placed without the scheduler; at most 256 consumers). The emulator leaves out
  pods that are done (upstream reserves and then drops them again).
- the resourceclaim controller (``syncClaim``): a ``reservedFor``
  entry whose pod is gone, was replaced (another uid under that name) or is done (phase Succeeded or Failed, or
  deleted before it was bound) is removed. When that removal leaves no consumer and the claim carries the
  finalizer, the allocation is cleared in the same status update, then the finalizer is removed (a normal update).
  A claim without the finalizer (allocated by someone who did not add it) keeps its allocation, and so its
  devices, for good; a claim allocated but never reserved is not deallocated either (the transition from "used"
  to "unused" triggers it). A claim being deleted that carries the finalizer and has no consumer left loses its
  allocation and the finalizer, so its deletion completes.

Not modelled: claims made from ResourceClaimTemplates (the controller's creation and deletion of them), consumers
other than pods (an entry of another kind is kept, as upstream keeps one it does not know), PodGroups.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from sim.kube_resources import DRA_GROUP
from sim.kube_store import Obj, WatchEvent

if TYPE_CHECKING:
    from sim.kube_host import Types
    from sim.kube_store import Store

FINALIZER = "resource.kubernetes.io/delete-protection"
TERMINAL = ("Succeeded", "Failed")
MAX_RESERVED = 256  # ResourceClaimReservedForMaxSize


class ClaimController:
    def __init__(self, store: Store, api: Types) -> None:
        self.store = store
        self.api = api
        self.dirty = True
        self.deallocated = 0  # claims whose allocation this controller cleared
        # The pods that name claims, kept from the pod events (a scan of every pod per tick would cost a drain of
        # 10,000 pods dearly). None until the first tick's one full scan.
        self.claim_pods: dict[tuple[str, str], None] | None = None

    def react(self, event: WatchEvent) -> None:
        if event.key == "/pods" and self.claim_pods is not None:
            ident = (_ns(event.obj), event.obj["metadata"]["name"])
            if event.type != "DELETED" and _claim_names(event.obj):
                self.claim_pods[ident] = None
            else:
                self.claim_pods.pop(ident, None)
        if event.key == "/pods" or event.key == self._key():
            self.dirty = True

    def tick(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        if self.claim_pods is None:
            named = self.store.select("/pods", "", lambda pod: bool(_claim_names(pod)))
            self.claim_pods = dict.fromkeys((_ns(p), p["metadata"]["name"]) for p in named)
        for ns, name in list(self.claim_pods):
            pod = self.store.get("/pods", ns, name)
            if pod is not None:
                self.reserve_for(pod)
        for claim in self.store.select(self._key(), ""):
            status = claim.get("status") or {}
            if status.get("reservedFor") or (claim["metadata"].get("deletionTimestamp") and _protected(claim)):
                self.sync(claim)

    def reserve_for(self, pod: Obj) -> None:
        """``syncPod``: a bound pod's allocated claims, reserved for it if they are not."""
        meta = pod["metadata"]
        if not (pod.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp") or \
                (pod.get("status") or {}).get("phase") in TERMINAL:
            return
        for name in _claim_names(pod):
            claim = self.store.get(self._key(), _ns(pod), name)
            status = (claim or {}).get("status") or {}
            reserved = list(status.get("reservedFor") or [])
            if claim is None or not status.get("allocation") or len(reserved) >= MAX_RESERVED or \
                    any(ref.get("uid") == meta.get("uid") for ref in reserved):
                continue
            reserved.append({"resource": "pods", "name": meta["name"], "uid": meta["uid"]})
            self._write(claim, {**claim, "status": {**status, "reservedFor": reserved}})

    def sync(self, claim: Obj) -> None:
        """``syncClaim``: drop the reservations of consumers that will not run; deallocate on the last one."""
        reserved = list((claim.get("status") or {}).get("reservedFor") or [])
        valid = [ref for ref in reserved if self._will_run(_ns(claim), ref)]
        if len(valid) < len(reserved):
            status = {**(claim.get("status") or {}), "reservedFor": valid}
            if not valid:
                status.pop("reservedFor")
                if _protected(claim) and status.pop("allocation", None) is not None:
                    self.deallocated += 1
            written = self._write(claim, {**claim, "status": status})
            if written is not None and _protected(written) and not (written.get("status") or {}).get("allocation"):
                self._drop_finalizer(written)
        elif not valid and _protected(claim) and claim["metadata"].get("deletionTimestamp"):
            status = dict(claim.get("status") or {})
            if status.pop("allocation", None) is not None:
                self.deallocated += 1
                written = self._write(claim, {**claim, "status": status})
                if written is None:
                    return
                claim = written
            self._drop_finalizer(claim)

    def _will_run(self, namespace: str, ref: dict[str, Any]) -> bool:
        if ref.get("resource") != "pods" or ref.get("apiGroup"):
            return True  # not a pod: the real controller fails on it ("unsupported ReservedFor entry"), keeps it
        pod = self.store.get("/pods", namespace, str(ref.get("name", "")))
        if pod is None or pod["metadata"].get("uid") != ref.get("uid"):
            return False
        done = (pod.get("status") or {}).get("phase") in TERMINAL or \
            (pod["metadata"].get("deletionTimestamp") and not (pod.get("spec") or {}).get("nodeName"))
        return not done

    def _write(self, current: Obj, updated: Obj) -> Obj | None:
        stored = self.store.get(self._key(), _ns(current), current["metadata"]["name"])
        if stored is None or stored["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            self.dirty = True  # changed meanwhile: looked at again at the next tick
            return None
        return self.store.update(self.api.type_for(DRA_GROUP, "resourceclaims"), copy.deepcopy(updated), stored)

    def _drop_finalizer(self, claim: Obj) -> None:
        self.store.remove_finalizer(self.api.type_for(DRA_GROUP, "resourceclaims"), claim, FINALIZER)

    def _key(self) -> str:
        try:
            return self.api.type_for(DRA_GROUP, "resourceclaims").key
        except KeyError:
            return f"{DRA_GROUP}/resourceclaims"


def _protected(claim: Obj) -> bool:
    return FINALIZER in (claim["metadata"].get("finalizers") or [])


def _ns(obj: Obj) -> str:
    return str(obj["metadata"].get("namespace", ""))


def _claim_names(pod: Obj) -> list[str]:
    """The claims a pod names (``resourceClaimName``; a template's claim is not modelled)."""
    return [str(c["resourceClaimName"]) for c in (pod.get("spec") or {}).get("resourceClaims") or []
            if c.get("resourceClaimName")]
