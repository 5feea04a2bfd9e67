"""kube-controller-manager's device-taint-eviction-controller (KEP-5055), as the emulator runs it.

Modelled on pkg/controller/devicetainteviction of v1.36.2 and checked against that build (/work/cp):

- The taints that evict: every DeviceTaintRule with effect ``NoExecute`` whose ``deviceSelector`` (driver, pool,
  device; an absent field matches all, an absent selector matches nothing) matches an allocated device, and every
  ``NoExecute`` taint a driver wrote on a device in its ResourceSlice (the pool's newest generation).
- The pods: bound to a node (``spec.nodeName``), not terminating, not finished, using a ResourceClaim
  (``spec.resourceClaims[].resourceClaimName``, or from a template through ``status.resourceClaimStatuses``) that is
  allocated (``status.allocation.devices.results[]``: driver, pool, device) and reserved for that pod
  (``status.reservedFor[].uid``).
- Tolerations: those the scheduler copied into the allocation result (``results[].tolerations``; the request's
  ``spec.devices.requests[].exactly.tolerations`` are not read here, as upstream), and only those with
  ``effect: NoExecute`` count. One without ``tolerationSeconds`` tolerates forever; else the pod goes at the
  taint's ``timeAdded`` + the smallest such toleration.
- Eviction is a DELETE of the pod (with a uid precondition; its own grace period) after a ``DisruptionTarget``
  condition (reason ``DeletionByDeviceTaintManager``): not the Eviction API, so PodDisruptionBudgets are not
  consulted. A Normal Event ``DeviceTaintManagerEviction`` "Marking for deletion" on the pod (source
  ``device-taint-eviction-controller``); "Cancelling deletion" when a delayed eviction is no longer due.
- Each DeviceTaintRule's ``status.conditions[EvictionInProgress]``, with the real reasons and messages: NoExecute
  True / ``PodsPendingEviction`` ("1 pod needs to be evicted in 1 namespace.") while pods remain, then False /
  ``Completed`` ("1 pod evicted since starting the controller.") or ``NotStarted``; None False / ``NoEffect`` with
  what NoExecute would do, once per generation; NoSchedule False / ``OtherEffect``. The condition is computed at
  a spec change (before that pass's deletions, so it reads True first) and then at most every
  ``status_period_s`` (upstream: 10 s) while there is something to report.

Differences: the emulator polls (a pass after any pod / claim / slice / rule change, and when a delayed eviction
or a status update is due) instead of upstream's informer handlers and work queue; the status is written directly
(upstream: a server-side apply by ``device-taint-eviction-controller``, visible in managedFields); the count of
evicted pods lives as long as the emulator (upstream: "since starting the controller"); workload ResourceClaims
(``DRAWorkloadResourceClaims``) are not modelled.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim import kube_errors as errs
from sim.kube_dra import parse_time
from sim.kube_events import record_event
from sim.kube_resources import DRA_GROUP
from sim.kube_store import Obj, WatchEvent, now_time

if TYPE_CHECKING:
    from sim.kube_host import EventHost
    from sim.kube_resources import ResourceType
    from sim.kube_store import Store

CONTROLLER = "device-taint-eviction-controller"
CONDITION = "EvictionInProgress"
STATUS_PERIOD_S = 10.0  # upstream ruleStatusPeriod
_WATCHED = ("/pods", f"{DRA_GROUP}/resourceclaims", f"{DRA_GROUP}/resourceslices", f"{DRA_GROUP}/devicetaintrules")
DeviceKey = tuple[str, str, str]  # driver, pool, device


@dataclass
class _Eviction:
    when: float
    rules: set[str] = field(default_factory=set)  # uids of the DeviceTaintRules among the reasons

    def merge(self, other: _Eviction) -> None:
        self.when = min(self.when, other.when)
        self.rules |= other.rules


class DeviceTaintEviction:
    def __init__(self, store: Store, api: EventHost, status_period_s: float = STATUS_PERIOD_S,
                 min_pass_interval_s: float = 0.05) -> None:
        self.store = store
        self.api = api
        self.status_period_s = status_period_s
        # A burst of pod changes makes one pass, not one each (a pass reads every bound pod with a claim).
        self.min_pass_interval_s = min_pass_interval_s
        self._next_pass = 0.0  # monotonic
        self.clock: Callable[[], float] = time.time  # taints' timeAdded are wall-clock times
        self.dirty = True
        self.next_due = math.inf
        self.evicted: set[str] = set()  # pod uids deleted
        self.evicted_by_rule: dict[str, int] = {}  # rule uid -> pods it evicted
        self.pending: dict[str, Obj] = {}  # pod uid -> the pod, whose eviction waits for a tolerationSeconds
        self.passes = 0

    # --- intake ----------------------------------------------------------------------------------
    def react(self, event: WatchEvent) -> None:
        if event.key in _WATCHED:
            self.dirty = True

    def tick(self) -> None:
        now = self.clock()
        if (not self.dirty and now < self.next_due) or time.monotonic() < self._next_pass:
            return
        self._next_pass = time.monotonic() + self.min_pass_interval_s
        self.dirty, self.next_due = False, math.inf
        try:
            self._pass(now)
        except Exception:
            self.dirty = True  # a write raced another writer: look again at the next tick
            raise
        self.passes += 1

    # --- one pass --------------------------------------------------------------------------------
    def _pass(self, now: float) -> None:
        rules = self._list("devicetaintrules")
        devices = _published_devices(self._list("resourceslices"))
        evicting = [r for r in rules if _effect(r) == "NoExecute"]
        if not rules and not self.pending and not any(_slice_taints(d) for d in devices.values()):
            return
        claims = {(_ns(c), _name(c)): c for c in self._list("resourceclaims") if _allocation(c)}
        pods = self._bound_pods()
        plan = {uid: ev for uid, (pod, ev) in self._evictions(pods, claims, devices, evicting).items()}
        for rule in rules:
            self._rule_status(rule, now, pods, claims, devices, plan)
        self._act(pods, plan, now)

    def _act(self, pods: dict[str, Obj], plan: dict[str, _Eviction], now: float) -> None:
        for uid, eviction in plan.items():
            if eviction.when <= now:
                self.pending.pop(uid, None)
                self._evict(pods[uid], eviction)
            else:
                self.pending[uid] = pods[uid]
                self.next_due = min(self.next_due, eviction.when)
        for uid in [u for u in self.pending if u not in plan]:
            pod = self.pending.pop(uid)
            if uid in pods:
                self._event(pod, "Cancelling deletion")

    def _evictions(self, pods: dict[str, Obj], claims: dict[tuple[str, str], Obj],
                   devices: dict[DeviceKey, Obj], rules: list[Obj],
                   slice_taints: bool = True) -> dict[str, tuple[Obj, _Eviction]]:
        """uid -> (pod, when and why) for every pod that must go (now or later)."""
        out: dict[str, tuple[Obj, _Eviction]] = {}
        by_claim: dict[tuple[str, str], _Eviction | None] = {}
        for uid, pod in pods.items():
            if uid in self.evicted:
                continue
            eviction: _Eviction | None = None
            for key in _claims_of(pod):
                claim = claims.get(key)
                if claim is None or not _reserved_for(claim, uid):
                    continue
                if key not in by_claim:
                    by_claim[key] = _claim_eviction(claim, devices, rules, slice_taints)
                found = by_claim[key]
                if found is None:
                    continue
                if eviction is None:
                    eviction = _Eviction(found.when, set(found.rules))
                else:
                    eviction.merge(found)
            if eviction is not None:
                out[uid] = (pod, eviction)
        return out

    # --- the rule's status -----------------------------------------------------------------------
    def _rule_status(self, rule: Obj, now: float, pods: dict[str, Obj], claims: dict[tuple[str, str], Obj],
                     devices: dict[DeviceKey, Obj], plan: dict[str, _Eviction]) -> None:
        old = _condition(rule)
        generation = int(rule["metadata"].get("generation") or 1)
        if old is not None and old.get("observedGeneration") == generation:
            if _effect(rule) != "NoExecute":
                return  # None and NoSchedule: set once per change of the spec
            due = (parse_time(old.get("lastTransitionTime")) or 0.0) + self.status_period_s
            uid = rule["metadata"]["uid"]
            interesting = old.get("status") == "True" or any(uid in e.rules for e in plan.values())
            if now < due:
                if interesting:
                    self.next_due = min(self.next_due, due)
                return
        new = self._new_condition(rule, pods, claims, devices, plan)
        if old is not None and all(old.get(k) == v for k, v in new.items()):
            return
        new["lastTransitionTime"] = now_time()
        self._write_condition(rule, new)
        if _effect(rule) == "NoExecute":
            self.next_due = min(self.next_due, now + self.status_period_s)

    def _new_condition(self, rule: Obj, pods: dict[str, Obj], claims: dict[tuple[str, str], Obj],
                       devices: dict[DeviceKey, Obj], plan: dict[str, _Eviction]) -> dict[str, Any]:
        uid, effect = rule["metadata"]["uid"], _effect(rule)
        condition: dict[str, Any] = {"type": CONDITION, "status": "False",
                                     "observedGeneration": int(rule["metadata"].get("generation") or 1)}
        if effect == "NoExecute":
            pending = [pods[u] for u, e in plan.items() if uid in e.rules]
            condition.update(_no_execute(pending, self.evicted_by_rule.get(uid, 0)))
        elif effect == "None":
            as_no_execute = copy.deepcopy(rule)
            as_no_execute["spec"]["taint"]["effect"] = "NoExecute"
            would = [p for p, _ in self._evictions(pods, claims, devices, [as_no_execute], False).values()]
            condition.update(reason="NoEffect", message=_no_effect(rule, devices, claims, would))
        else:
            condition.update(reason="OtherEffect", message="Eviction only happens for the NoExecute effect.")
        return condition

    def _write_condition(self, rule: Obj, condition: dict[str, Any]) -> None:
        rt = self.api.type_for(DRA_GROUP, "devicetaintrules")
        updated = copy.deepcopy(rule)
        status = updated.setdefault("status", {})
        others = [c for c in status.get("conditions") or [] if c.get("type") != CONDITION]
        status["conditions"] = [*others, {"type": CONDITION, "status": condition["status"],
                                          "observedGeneration": condition["observedGeneration"],
                                          "lastTransitionTime": condition["lastTransitionTime"],
                                          "reason": condition["reason"], "message": condition["message"]}]
        self.store.update(rt, updated, rule)

    # --- the pod ---------------------------------------------------------------------------------
    def _evict(self, pod: Obj, eviction: _Eviction) -> None:
        pods_rt = self.api.type_for("", "pods")
        meta = pod["metadata"]
        self._event(pod, "Marking for deletion")
        self._disruption_target(pods_rt, pod)
        try:
            self.store.delete(pods_rt, meta["namespace"], meta["name"], preconditions={"uid": meta["uid"]})
        except errs.ApiError as err:
            if err.code != 404:
                raise
        self.evicted.add(meta["uid"])
        for uid in eviction.rules:
            self.evicted_by_rule[uid] = self.evicted_by_rule.get(uid, 0) + 1

    def _disruption_target(self, pods_rt: ResourceType, pod: Obj) -> None:
        current = self.store.get(pods_rt.key, pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
            return
        updated = copy.deepcopy(current)
        status = updated.setdefault("status", {})
        kept = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
        status["conditions"] = [*kept, {"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                                        "lastTransitionTime": now_time(), "reason": "DeletionByDeviceTaintManager",
                                        "message": "Device Taint manager: deleting due to NoExecute taint"}]
        self.store.update(pods_rt, updated, current)

    def _event(self, pod: Obj, message: str) -> None:
        record_event(self.api, self.api.type_for("", "pods"), pod, "DeviceTaintManagerEviction", message,
                     component=CONTROLLER)

    # --- reads -----------------------------------------------------------------------------------
    def _list(self, resource: str) -> list[Obj]:
        try:
            rt = self.api.type_for(DRA_GROUP, resource)
        except KeyError:
            return []  # not served (DeviceTaintRule without its gate)
        return self.store.select(rt.key, "")

    def _bound_pods(self) -> dict[str, Obj]:
        def keep(pod: Obj) -> bool:
            spec = pod.get("spec") or {}
            return bool(spec.get("nodeName")) and bool(spec.get("resourceClaims")) \
                and not pod["metadata"].get("deletionTimestamp") \
                and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        return {p["metadata"]["uid"]: p for p in self.store.select(self.api.type_for("", "pods").key, "", keep)}


# --- pure helpers ------------------------------------------------------------------------------------

def _ns(obj: Obj) -> str:
    return str(obj["metadata"].get("namespace", ""))


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _effect(rule: Obj) -> str:
    return str(((rule.get("spec") or {}).get("taint") or {}).get("effect") or "")


def _allocation(claim: Obj) -> dict[str, Any] | None:
    allocation = (claim.get("status") or {}).get("allocation")
    return allocation if isinstance(allocation, dict) else None


def _results(claim: Obj) -> list[dict[str, Any]]:
    return [r for r in ((_allocation(claim) or {}).get("devices") or {}).get("results") or [] if isinstance(r, dict)]


def _condition(rule: Obj) -> dict[str, Any] | None:
    return next((c for c in (rule.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None)


def _published_devices(slices: list[Obj]) -> dict[DeviceKey, Obj]:
    """(driver, pool, device) -> the device, from each pool's slices of its newest generation."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        spec = s.get("spec") or {}
        key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
        newest[key] = max(newest.get(key, 0), int((spec.get("pool") or {}).get("generation") or 0))
    out: dict[DeviceKey, Obj] = {}
    for s in slices:
        spec = s.get("spec") or {}
        driver, pool = str(spec.get("driver", "")), (spec.get("pool") or {})
        if int(pool.get("generation") or 0) != newest[(driver, str(pool.get("name", "")))]:
            continue
        for device in spec.get("devices") or []:
            out[(driver, str(pool.get("name", "")), str(device.get("name", "")))] = device
    return out


def _slice_taints(device: Obj) -> list[dict[str, Any]]:
    return [t for t in device.get("taints") or [] if t.get("effect") == "NoExecute"]


def rule_matches(rule: Obj, driver: str, pool: str, device: str) -> bool:
    """ruleMatchesDevice: every field the selector sets must be equal; no selector matches nothing."""
    selector = (rule.get("spec") or {}).get("deviceSelector")
    if not isinstance(selector, dict):
        return False
    return all(selector.get(k) is None or selector.get(k) == v
               for k, v in (("driver", driver), ("pool", pool), ("device", device)))


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """resourceclaim.ToleratesTaint (an empty operator is Equal)."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


def _claim_eviction(claim: Obj, devices: dict[DeviceKey, Obj], rules: list[Obj],
                    slice_taints: bool) -> _Eviction | None:
    """claimEvictionTime: the earliest time one of the claim's devices' NoExecute taints is no longer tolerated."""
    found: _Eviction | None = None
    for result in _results(claim):
        key = (str(result.get("driver", "")), str(result.get("pool", "")), str(result.get("device", "")))
        for taint, rule_uid in _taints_of(key, devices, rules, slice_taints):
            when = _taint_deadline(taint, result.get("tolerations") or [])
            if when is None:
                continue
            item = _Eviction(when, {rule_uid} if rule_uid else set())
            if found is None:
                found = item
            else:
                found.merge(item)
    return found


def _taints_of(key: DeviceKey, devices: dict[DeviceKey, Obj], rules: list[Obj],
               slice_taints: bool) -> Iterator[tuple[dict[str, Any], str]]:
    device = devices.get(key)
    if device is not None and slice_taints:
        for taint in _slice_taints(device):
            yield taint, ""
    for rule in rules:
        if rule_matches(rule, *key):
            yield (rule.get("spec") or {}).get("taint") or {}, str(rule["metadata"]["uid"])


def _taint_deadline(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> float | None:
    """When the taint evicts: its timeAdded (+ the shortest NoExecute toleration's seconds); None: tolerated."""
    added = parse_time(taint.get("timeAdded")) or 0.0
    seconds: float | None = None
    for toleration in tolerations:
        if toleration.get("effect") != "NoExecute" or not tolerates(toleration, taint):
            continue
        if toleration.get("tolerationSeconds") is None:
            return None
        value = max(0.0, float(toleration["tolerationSeconds"]))
        seconds = value if seconds is None else min(seconds, value)
    return added + (seconds or 0.0)


def _claims_of(pod: Obj) -> list[tuple[str, str]]:
    """(namespace, claim name) of each of the pod's claims (a template's through resourceClaimStatuses)."""
    namespace = _ns(pod)
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    out = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or (generated.get(entry.get("name"))
                                                  if entry.get("resourceClaimTemplateName") else None)
        if name:
            out.append((namespace, str(name)))
    return out


def _reserved_for(claim: Obj, pod_uid: str) -> bool:
    return any(ref.get("uid") == pod_uid and ref.get("resource") == "pods"
               for ref in (claim.get("status") or {}).get("reservedFor") or [])


def _count(n: int, one: str, many: str) -> str:
    return one if n == 1 else f"{n} {many}"


def _no_execute(pending: list[Obj], evicted: int) -> dict[str, str]:
    if pending:
        namespaces = len({_ns(p) for p in pending})
        message = ("1 pod needs to be evicted in " if len(pending) == 1 else
                   f"{len(pending)} pods need to be evicted in ") + \
            _count(namespaces, "1 namespace.", "different namespaces.")
        return {"status": "True", "reason": "PodsPendingEviction", "message": _with_evicted(message, evicted)}
    return {"status": "False", "reason": "Completed" if evicted else "NotStarted",
            "message": _with_evicted("", evicted)}


def _with_evicted(message: str, evicted: int) -> str:
    if not evicted:
        return message
    tail = _count(evicted, "1 pod", "pods") + " evicted since starting the controller."
    return f"{message} {tail}" if message else tail


def _no_effect(rule: Obj, devices: dict[DeviceKey, Obj], claims: dict[tuple[str, str], Obj],
               would: list[Obj]) -> str:
    published = sum(1 for key in devices if rule_matches(rule, *key))
    allocated = sum(1 for c in claims.values() for r in _results(c)
                    if rule_matches(rule, str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))))
    namespaces = len({_ns(p) for p in would})
    return (_count(published, "1 published device", "published devices") + " selected. "
            + _count(allocated, "1 allocated device", "allocated devices") + " selected. "
            + _count(len(would), "1 pod", "pods") + " would be evicted in "
            + _count(namespaces, "1 namespace", "different namespaces") + " if the effect was NoExecute. This "
            "information will not be updated again. Recreate the DeviceTaintRule to trigger an update.")
