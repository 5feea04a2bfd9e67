"""kube-controller-manager's node lifecycle and taint-eviction controllers, as the emulator runs them.

- Taints by condition (written right after the change that causes them, so a client's resourceVersion-
  guarded node patch meets 409 as on a real cluster): ``node.kubernetes.io/unschedulable:NoSchedule``
  while ``spec.unschedulable``; ``not-ready`` NoSchedule + NoExecute while Ready is False; ``unreachable``
  NoSchedule + NoExecute while Ready is Unknown. Each added taint carries ``timeAdded``.
- Lease monitoring: a Node whose Lease in ``kube-node-lease`` (name = node name; ``spec.renewTime``
  changes on each renewal) is not renewed, nor its Ready condition's ``lastHeartbeatTime`` posted, for
  ``grace_s`` gets every condition Unknown
  ("NodeStatusUnknown", "Kubelet stopped posting node status.") and its pods Ready=False. A Node that
  never had a Lease is left alone.
- Taint-based eviction: a pod on a node with a NoExecute taint it does not tolerate is deleted at once;
  one it tolerates for ``tolerationSeconds`` is deleted that long after the taint appeared.
- Node Events in ``default``: RegisteredNode / RemovingNode and NodeNotReady (node-controller),
  NodeNotSchedulable / NodeSchedulable (what the kubelet reports on a cordon).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sim import kube_errors as errs
from sim.kube_events import record_event
from sim.kube_store import Obj, WatchEvent, now_time

if TYPE_CHECKING:
    from sim.kube_host import EventHost
    from sim.kube_resources import ResourceType
    from sim.kube_store import Store

NODE_LEASE_NAMESPACE = "kube-node-lease"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
MANAGED_KEYS = (UNSCHEDULABLE, NOT_READY, UNREACHABLE)
NODE_CONTROLLER = "node-controller"
EVICTION_CONTROLLER = "taint-eviction-controller"
DEFAULT_GRACE_S = 50.0  # kube-controller-manager --node-monitor-grace-period (v1.32+)
NODE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")


def ready_status(node: Obj) -> str | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return None


def wanted_taints(node: Obj) -> set[tuple[str, str]]:
    """(key, effect) of the condition taints the node should carry now."""
    want: set[tuple[str, str]] = set()
    if (node.get("spec") or {}).get("unschedulable"):
        want.add((UNSCHEDULABLE, "NoSchedule"))
    ready = ready_status(node)
    if ready == "False":
        want |= {(NOT_READY, "NoSchedule"), (NOT_READY, "NoExecute")}
    elif ready == "Unknown":
        want |= {(UNREACHABLE, "NoSchedule"), (UNREACHABLE, "NoExecute")}
    return want


def reconciled_taints(node: Obj) -> list[dict[str, Any]]:
    """The node's taints with the managed ones made to match its state (others kept, in order). While no
    Ready condition exists the admission-added not-ready:NoSchedule taint stays, as on a real server."""
    want = wanted_taints(node)
    no_ready_yet = ready_status(node) is None
    kept, present = [], set()
    for taint in (node.get("spec") or {}).get("taints") or []:
        ident = (taint.get("key"), taint.get("effect"))
        if taint.get("key") in MANAGED_KEYS and ident not in want and not (no_ready_yet and ident[0] == NOT_READY):
            continue
        kept.append(taint)
        present.add(ident)
    for key, effect in sorted(want - present, key=lambda ident: (ident[1] != "NoSchedule", ident[0])):
        kept.append({"key": key, "effect": effect, "timeAdded": now_time()})
    return kept


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def tolerated_for(pod: Obj, taints: list[dict[str, Any]]) -> float | None:
    """Seconds the pod may stay on a node with these NoExecute taints: 0 when one is not tolerated,
    None (forever) when every matching toleration has no tolerationSeconds."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    limit: float | None = None
    for taint in taints:
        matching = [t for t in tolerations if tolerates(t, taint)]
        if not matching:
            return 0.0
        for toleration in matching:
            seconds = toleration.get("tolerationSeconds")
            if seconds is not None:
                limit = max(0.0, float(seconds)) if limit is None else min(limit, max(0.0, float(seconds)))
    return limit


class NodeLifecycle:
    def __init__(self, store: Store, api: EventHost, grace_s: float = DEFAULT_GRACE_S,
                 monitor_s: float = 0.25) -> None:
        self.api = api
        self.store = store
        self.grace_s = grace_s
        self.monitor_s = monitor_s
        self.renewals: dict[str, tuple[Any, float]] = {}  # node -> (spec.renewTime, when that was seen)
        self.no_execute_since: dict[tuple[str, str], float] = {}  # (node, taint key) -> first seen
        self._next_monitor = 0.0
        self.clock: Callable[[], float] = time.monotonic  # for Lease ages and tolerations (tests move it)
        self.passes = 0  # monitor passes done

    def nodes_rt(self) -> ResourceType:
        return self.api.type_for("", "nodes")

    # --- intake ----------------------------------------------------------------------------------
    def react(self, event: WatchEvent) -> None:
        if event.key == "/nodes":
            self._node_changed(event)
        elif event.key == "coordination.k8s.io/leases" and \
                event.obj["metadata"].get("namespace") == NODE_LEASE_NAMESPACE:
            self._lease_changed(event)

    def _lease_changed(self, event: WatchEvent) -> None:
        name = event.obj["metadata"]["name"]
        if event.type == "DELETED":
            self.renewals.pop(name, None)
            return
        renew = (event.obj.get("spec") or {}).get("renewTime")
        seen = self.renewals.get(name)
        if seen is None or seen[0] != renew:
            self.renewals[name] = (renew, self.clock())

    def _node_changed(self, event: WatchEvent) -> None:
        node, name = event.obj, event.obj["metadata"]["name"]
        if event.type == "DELETED":
            self.renewals.pop(name, None)
            self._node_event(node, "RemovingNode", f"Node {name} event: Removing Node {name} from Controller")
            return
        if event.type == "ADDED":
            self._node_event(node, "RegisteredNode", f"Node {name} event: Registered Node {name} in Controller")
        if name in self.renewals and _heartbeat(node) != _heartbeat(event.prev):
            self.renewals[name] = (self.renewals[name][0], self.clock())  # a status post is a sign of life too
        self._report_transitions(node, event.prev)
        self._retaint(name)

    def _report_transitions(self, node: Obj, prev: Obj | None) -> None:
        name = node["metadata"]["name"]
        was = bool(((prev or {}).get("spec") or {}).get("unschedulable"))
        now = bool((node.get("spec") or {}).get("unschedulable"))
        if now != was and (prev is not None or now):
            status = "NodeNotSchedulable" if now else "NodeSchedulable"
            self._node_event(node, status, f"Node {name} status is now: {status}", component="kubelet", host=name)
        if prev is not None and ready_status(prev) == "True" and ready_status(node) not in ("True", None):
            self._node_event(node, "NodeNotReady", f"Node {name} status is now: NodeNotReady")

    def _node_event(self, node: Obj, reason: str, message: str, component: str = NODE_CONTROLLER,
                    host: str = "") -> None:
        record_event(self.api, self.nodes_rt(), node, reason, message, component=component, host=host)

    def _retaint(self, name: str) -> None:
        rt = self.nodes_rt()
        with self.store.lock:
            node = self.store.get(rt.key, "", name)
            if node is None:
                return
            taints = reconciled_taints(node)
            if taints == ((node.get("spec") or {}).get("taints") or []):
                return
            updated = copy.deepcopy(node)
            spec = updated.setdefault("spec", {})
            if taints:
                spec["taints"] = taints
            else:
                spec.pop("taints", None)
            self.store.update(rt, updated, node)

    # --- periodic work ---------------------------------------------------------------------------
    def tick(self) -> None:
        if time.monotonic() < self._next_monitor:
            return
        self._next_monitor = time.monotonic() + self.monitor_s
        now = self.clock()
        for name, (_, seen) in list(self.renewals.items()):
            if now - seen > self.grace_s:
                self._mark_unknown(name)
        self._evict(now)
        self.passes += 1

    def _mark_unknown(self, name: str) -> None:
        rt = self.nodes_rt()
        with self.store.lock:
            node = self.store.get(rt.key, "", name)
            if node is None or ready_status(node) == "Unknown":
                return
            updated = copy.deepcopy(node)
            updated.setdefault("status", {})["conditions"] = _unknown_conditions(node)
            self.store.update(rt, updated, node)
        self._pods_not_ready(name)

    def _pods_not_ready(self, node_name: str) -> None:
        pods = self.api.type_for("", "pods")
        for pod in self.store.select(pods.key, "", lambda p: (p.get("spec") or {}).get("nodeName") == node_name):
            conditions = (pod.get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                continue
            updated = copy.deepcopy(pod)
            for cond in updated["status"]["conditions"]:
                if cond.get("type") == "Ready":
                    cond.update(status="False", lastTransitionTime=now_time())
            try:
                self.store.update(pods, updated, pod)
            except errs.ApiError:
                continue  # written meanwhile: the kubelet (or someone) has a newer word on it

    def _evict(self, now: float) -> None:
        pods_rt = self.api.type_for("", "pods")
        live: set[tuple[str, str]] = set()
        for node in self.store.select(self.nodes_rt().key, "", _has_no_execute):
            name = node["metadata"]["name"]
            taints = [t for t in node["spec"]["taints"] if t.get("effect") == "NoExecute"]
            since = now
            for taint in taints:
                since = min(since, self.no_execute_since.setdefault((name, taint.get("key", "")), now))
                live.add((name, taint.get("key", "")))
            for pod in self.store.select(pods_rt.key, "", _evictable_on(name)):
                allowed = tolerated_for(pod, taints)
                if allowed is not None and now - since >= allowed:
                    self._evict_pod(pods_rt, pod)
        for gone in set(self.no_execute_since) - live:
            del self.no_execute_since[gone]

    def _evict_pod(self, pods_rt: ResourceType, pod: Obj) -> None:
        meta = pod["metadata"]
        try:
            self.store.delete(pods_rt, meta["namespace"], meta["name"])
        except errs.ApiError:
            return
        record_event(self.api, pods_rt, pod, "TaintManagerEviction",
                     f"Marking for deletion Pod {meta['namespace']}/{meta['name']}", component=EVICTION_CONTROLLER)


def _heartbeat(node: Obj | None) -> Any:
    for cond in ((node or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("lastHeartbeatTime")
    return None


def _has_no_execute(node: Obj) -> bool:
    return any(t.get("effect") == "NoExecute" for t in (node.get("spec") or {}).get("taints") or [])


def _evictable_on(node_name: str) -> Callable[[Obj], bool]:
    def evictable(pod: Obj) -> bool:
        return (pod.get("spec") or {}).get("nodeName") == node_name and not pod["metadata"].get("deletionTimestamp") \
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    return evictable


def _unknown_conditions(node: Obj) -> list[dict[str, Any]]:
    """tryUpdateNodeHealth: every kubelet condition becomes Unknown (order kept); one never posted is added."""
    now = now_time()
    out, seen = [], set()
    for cond in (node.get("status") or {}).get("conditions") or []:
        seen.add(cond.get("type"))
        if cond.get("type") in NODE_CONDITIONS:
            cond = {**cond, "status": "Unknown", "lastTransitionTime": now, "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status."}
        out.append(cond)
    out += [{"type": kind, "status": "Unknown", "lastHeartbeatTime": now, "lastTransitionTime": now,
             "reason": "NodeStatusNeverUpdated", "message": "Kubelet never posted node status."}
            for kind in NODE_CONDITIONS if kind not in seen]
    return out


def add_not_ready_taint(node: Obj) -> None:
    """The TaintNodesByCondition admission plugin: a new Node starts tainted not-ready:NoSchedule (the
    node lifecycle controller lifts it once Ready is True)."""
    spec = node.setdefault("spec", {})
    taints = spec.get("taints") or []
    if not any(t.get("key") == NOT_READY and t.get("effect") == "NoSchedule" for t in taints):
        spec["taints"] = [*taints, {"key": NOT_READY, "effect": "NoSchedule"}]
