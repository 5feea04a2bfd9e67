"""Reading and writing GPU Nodes: the node view the loops share, and the one writer of records.

Every transition is one JSON merge patch carrying the record annotation, the state label and,
when the decision says so, ``spec.unschedulable`` — the cordon (or uncordon) and the record that
explains it land together or not at all. The patch carries the node's resourceVersion, so a
node changed since it was read gives 409 Conflict: the loop re-reads and decides again.

With ``[taint]`` enabled the same patch also carries ``spec.taints`` (our taint added while the node is
held, taken off when it is healthy again, only if the record says we added it; every other taint as read):
taints have no merge key, so the list is whole and the resourceVersion guards it. After a write the
``GPURemediation`` NodeCondition is set on ``nodes/<name>/status`` (strategic merge: only our condition);
a failure there is logged and retried with the next write, never undoes or blocks the record.

In dry-run mode nothing is sent: the patch is kept in an in-memory overlay so the loops see the
world as if it had been written (and do not decide the same thing again every cycle).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from gpuremediate.actions import held
from gpuremediate.actions.autoscaler_marks import MARKS, marks_change
from gpuremediate.actions.dry_run_journal import DryRunJournal
from gpuremediate.actions.events import NORMAL, WARNING, EventRecorder
from gpuremediate.actions.node_status import (
    REMEDIATION_CONDITION,
    STATUS_PATCH_TYPE,
    TaintPolicy,
    build_condition,
    conditions_patch,
    find_condition,
    nic_taints,
    remediation_condition,
    remediation_taint,
    taints_of,
)
from gpuremediate.gpu_resources import (  # noqa: F401  # gpu_count and its label: re-exported
    GPU,
    GPU_COUNT_LABEL,
    count_of,
    gpu_count,
    mig_strategy,
    node_gpu_resources,
)
from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer, strip_node
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.patch import merge_patch
from gpuremediate.kube.resources import NODES
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.obs.notify import DRAIN_KIND, KIND_DRAIN_STARTED, WebhookNotifier, drain_started, for_transition
from gpuremediate.policy import safety
from gpuremediate.policy.gates import last_return
from gpuremediate.state.decide import Decision
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, RecordError, node_patch, record_from_node

log = logging.getLogger(__name__)

GPU_RESOURCE = GPU
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
EXCLUDE_LABEL = "gpuremediate.io/exclude"
# A person's intent: "this node stays cordoned whatever gpuremediate finishes" (kubectl annotate node X
# gpuremediate.io/keep-cordoned="<why>"). A person's cordon of a node we had already cordoned changes nothing
# the API server records (spec.unschedulable was true already: no new resourceVersion, no managedFields owner),
# so only the person can say it; gpuremediate never removes the annotation.
KEEP_CORDONED_ANNOTATION = "gpuremediate.io/keep-cordoned"

Node = dict[str, Any]

EVENT_REASONS = {
    states.HEALTHY: "GPUNodeHealthy",
    states.CORDONED: "GPUNodeCordoned",
    states.DRAINING: "GPUNodeDraining",
    states.REPAIRING: "GPUNodeRepairing",
    states.VALIDATING: "GPUNodeValidating",
    states.QUARANTINED: "GPUNodeQuarantined",
    states.MAINTENANCE: "GPUNodeMaintenance",
}


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    """Any GPU resource in its capacity (nvidia.com/gpu or a MIG profile), or GFD's gpu.present label."""
    return bool(node_gpu_resources(node)) or labels_of(node).get(GPU_PRESENT_LABEL) == "true"


def is_excluded(node: Mapping[str, Any]) -> bool:
    return labels_of(node).get(EXCLUDE_LABEL) == "true"


def is_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def keeps_cordoned(node: Mapping[str, Any]) -> bool:
    """A person annotated the node to stay cordoned (any value but "false" or empty)."""
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(KEEP_CORDONED_ANNOTATION)
    return value is not None and str(value).strip().lower() not in ("", "false")


def node_unschedulable_of(node: Mapping[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable", False))


def unschedulable_before_us(node: Mapping[str, Any]) -> bool:
    """Unschedulable, and not by a cordon of ours that has no record yet (``held``: annotations full)."""
    return node_unschedulable_of(node) and not held.held_by_us(node)


def boot_id(node: Mapping[str, Any]) -> str:
    return str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID", ""))


# A 409 whose Node changed in nothing a decision reads is written again under the new version, this many times (a
# heartbeat or our own status write can land between the re-read and the write, more so on a slow server).
RESEND_ATTEMPTS = 3


class NodeView:
    """The nodes as the loops see them: the informer's cache, corrected by our own recent writes.

    After a write, the informer may lag behind; until it shows a newer version of the node, the
    object the API server returned to us is the truth (else the next reconcile would send a stale
    resourceVersion and get a needless 409). In dry-run mode the overlay is permanent.
    """

    def __init__(self, informer: Informer, node_filter: Callable[[Mapping[str, Any]], bool] = is_gpu_node) -> None:
        self.informer = informer
        self.node_filter = node_filter
        self._written: dict[str, tuple[str, Node]] = {}  # name -> (resourceVersion we wrote over, result)
        self._overlay: dict[str, dict[str, Any]] = {}  # dry-run: name -> merged patch
        # name -> (the Node object, whether the filter takes it): the informer hands out the same object until the
        # node changes, so the filter runs once per version, not once per node per call (each loop asks often)
        self._filtered: dict[str, tuple[Node, bool]] = {}
        self._lock = threading.Lock()
        # --shards: the GPU node names by shard, kept by the informer's events (index_shards), so that a replica's
        # walk of its own nodes costs its share, not the fleet (100,000 cached Nodes: 0.3 CPU-s a walk, six loops
        # every resync, the fast path's check, each holding the interpreter while a fault poll waits)
        self._shard_of: Callable[[str], int] | None = None
        self._by_shard: dict[int, set[str]] = {}
        self._gpu_count = 0
        self._watching = False
        # index_labels: per label, each GPU node's value and each value's nodes (the breaker's failure domains: a
        # fault's domain is found from its members, not by making a view of every Node of the fleet)
        self._label_of: dict[str, dict[str, str]] = {}
        self._with_value: dict[str, dict[str, set[str]]] = {}
        # the GPU nodes the budget must see (``safety.notable``), each as its event gave it, kept by the same
        # events: a drain's admission and the budget gauge view these and the fleet's size, not a view of every Node
        # (``budget_nodes``); held here, not read from the informer, whose store keeps another shard's Nodes packed
        self._notable: dict[str, Node] = {}
        # the GPU nodes that came back repaired, and when last (the drain's settle gate: the fleet's latest return)
        self._returned: dict[str, float] = {}

    def get(self, name: str) -> Node | None:
        obj = self.informer.get(name)
        return None if obj is None else self._corrected(name, obj)

    def _corrected(self, name: str, obj: Node) -> Node:
        """The informer's ``obj`` for ``name``, or our newer write of it, with the dry run's overlay."""
        with self._lock:
            written = self._written.get(name)
            if written is not None:
                if _rv(obj) == written[0]:
                    obj = written[1]
                else:
                    del self._written[name]
            overlay = self._overlay.get(name)
        if overlay is not None:
            obj = merge_patch(obj, overlay)
        return obj

    def gpu_nodes(self) -> list[Node]:
        filtered: dict[str, tuple[Node, bool]] = {}
        known = self._filtered
        for listed in self.informer.list():
            name = name_of(listed)
            node = self._corrected(name, listed)
            entry = known.get(name)
            if entry is None or entry[0] is not node:
                entry = (node, self.node_filter(node))
            filtered[name] = entry
        self._filtered = filtered  # nodes gone drop out; concurrent callers each build a whole one
        return [filtered[name][0] for name in sorted(filtered) if filtered[name][1]]

    def index_shards(self, shard_of: Callable[[str], int]) -> None:
        """Keep the GPU nodes' names by ``shard_of(name)`` from now on (the informer's store replayed, then its
        events): ``gpu_nodes_of`` and ``gpu_count`` then cost what they return, not the fleet."""
        if self._watching:
            raise RuntimeError("index_shards must come before index_labels (the index is built once, from events)")
        self._shard_of = shard_of
        self._watch()

    def index_labels(self, labels: Iterable[str]) -> None:
        """Keep the GPU nodes' values of these labels from now on (the informer's store replayed, then its events):
        ``gpu_nodes_with`` then costs the nodes it returns for them. Before the informer starts: a label asked for
        later (a reloaded policy's) is found by walking the cache. Once, after ``index_shards``, if at all."""
        if self._label_of:
            raise RuntimeError("index_labels is called once (its labels are replayed from the store then)")
        with self._lock:
            for label in labels:
                self._label_of[label], self._with_value[label] = {}, {}
        if self._label_of and not self._watching:
            self._watch()
        elif self._label_of:  # already watching for the shards: these labels are filled from the store now
            for node in self.informer.list():
                self._indexed(node)

    def index_budget(self) -> None:
        """Keep the notable GPU nodes' names from now on (``budget_nodes``); they are kept by any index's events,
        so this only starts the watch where no other index did. Last, after ``index_shards`` and ``index_labels``."""
        if not self._watching:
            self._watch()

    def budget_nodes(self) -> list[Node] | None:
        """The GPU nodes the budget must see, by name: the notable ones as the informer's events left them, and
        every node our own writes changed since (not in the cache yet: a drain just admitted counts at once). None
        before any index: the caller views ``gpu_nodes``."""
        if not self._watching:
            return None
        with self._lock:
            notable = dict(self._notable)
            written = self._written.keys() | self._overlay.keys()
        out: list[Node] = []
        for name in sorted(notable.keys() | written):
            node = self._newest(name, notable.get(name))
            if node is not None and self.node_filter(node):
                out.append(node)
        return out

    def _newest(self, name: str, indexed: Node | None) -> Node | None:
        """``name``'s Node as ``get`` gives it where the cache holds it whole; where it holds it packed (another
        shard's node, never one we wrote), ``indexed``: the object its last event gave the index."""
        stored = self.informer.get_stored(name)
        return self._corrected(name, stored) if stored is not None else indexed

    def views_with(self, wanted: Mapping[str, Collection[str]]) -> list[safety.NodeView]:
        """The budget's views (``safety.node_view``) of ``gpu_nodes_with(wanted)``, made from the indexes where
        ``wanted``'s labels are indexed: a member in service (not notable) is its name and its indexed labels' values,
        and no Node is read for it (a breaker's domain may be a zone: a third of the fleet, most of it another
        replica's, whose Nodes the informer keeps packed)."""
        with self._lock:
            indexed = all(label in self._label_of for label in wanted)
            names = {name for label, values in wanted.items() for value in values
                     for name in self._with_value[label].get(value, ())} if indexed else set()
            notable = {name: self._notable[name] for name in names if name in self._notable}
            written = names & (self._written.keys() | self._overlay.keys())
            labels = {name: {label: values[name] for label, values in self._label_of.items() if name in values}
                      for name in names - notable.keys() - written}
        if not indexed:
            return [safety.node_view(n) for n in self.gpu_nodes_with(wanted)]
        out: list[safety.NodeView] = []
        for name in sorted(names):
            if name in labels:
                out.append(safety.NodeView(name=name, labels=labels[name]))
                continue
            node = self._newest(name, notable.get(name))
            if node is None or not self.node_filter(node):
                continue
            node_labels = labels_of(node)
            if any(label in node_labels and str(node_labels[label]) in values for label, values in wanted.items()):
                out.append(safety.node_view(node))
        return out

    def last_return(self) -> float | None:
        """When a GPU node last came back repaired (``gates.last_return`` over every GPU node's history): from the
        index, or a walk of the cache before any."""
        if not self._watching:
            return last_return([r.history for n in self.gpu_nodes()
                                if isinstance(r := record_from_node(n), NodeRecord)])
        with self._lock:
            return max(self._returned.values(), default=None)

    def budget_fleet(self) -> tuple[list[Node], safety.FleetSize | None]:
        """What the budget views: the ``budget_nodes`` and the fleet's size, or, before any index, every GPU node
        and None (the views are the fleet then)."""
        nodes = self.budget_nodes()
        return (self.gpu_nodes(), None) if nodes is None else (nodes, self.fleet_size())

    def label_count(self, label: str, value: str) -> int:
        """How many GPU nodes carry ``label=value`` (an indexed label: from the index; any other: a walk)."""
        with self._lock:
            if label in self._label_of:
                return len(self._with_value[label].get(value, ()))
        return sum(1 for n in self.gpu_nodes() if labels_of(n).get(label) == value)

    def fleet_size(self) -> safety.FleetSize:
        """The budget's fleet size, for views of the ``budget_nodes`` only."""
        return safety.FleetSize(self.gpu_count(), self.label_count)

    def _watch(self) -> None:
        self._watching = True
        self.informer.add_handler(on_add=self._indexed, on_update=lambda _old, new: self._indexed(new),
                                  on_delete=self._unindexed)

    def _indexed(self, node: Node) -> None:
        name = name_of(node)
        if not self.node_filter(node):
            self._unindexed(node)
            return
        shard = self._shard_of(name) if self._shard_of is not None else 0
        labels = labels_of(node)
        notable, returned = _notable(node), _returned_at(node)
        with self._lock:
            names = self._by_shard.setdefault(shard, set())
            if name not in names:
                names.add(name)
                self._gpu_count += 1
            if notable:
                self._notable[name] = node
            else:
                self._notable.pop(name, None)
            self._note_return(name, returned)
            for label, values in self._label_of.items():
                self._move_label(label, name, values.get(name), labels.get(label))

    def _unindexed(self, node: Node) -> None:
        name = name_of(node)
        shard = self._shard_of(name) if self._shard_of is not None else 0
        with self._lock:
            names = self._by_shard.get(shard)
            if names is not None and name in names:
                names.discard(name)
                self._gpu_count -= 1
            self._notable.pop(name, None)
            self._returned.pop(name, None)
            for label, values in self._label_of.items():
                self._move_label(label, name, values.get(name), None)

    def _move_label(self, label: str, name: str, was: str | None, now: object) -> None:
        """``name``'s value of ``label`` from ``was`` to ``now`` (None: none) in the index; the lock is held."""
        value = None if now is None else str(now)
        if was == value:
            return
        with_value = self._with_value[label]
        if was is not None:
            members = with_value.get(was)
            if members is not None:
                members.discard(name)
                if not members:
                    del with_value[was]
            del self._label_of[label][name]
        if value is not None:
            with_value.setdefault(value, set()).add(name)
            self._label_of[label][name] = value

    def gpu_nodes_with(self, wanted: Mapping[str, Collection[str]]) -> list[Node]:
        """The GPU nodes whose value of a label of ``wanted`` is one of its values, by name. Indexed labels
        (``index_labels``) cost the nodes returned; any other walks the cache."""
        with self._lock:
            walk = any(label not in self._label_of for label in wanted)
            names = set() if walk else {name for label, values in wanted.items() for value in values
                                        for name in self._with_value[label].get(value, ())}
        candidates = self.gpu_nodes() if walk else [n for n in map(self.get, sorted(names)) if n is not None]
        out: list[Node] = []
        for node in candidates:  # the index only names candidates: each is judged by its object as it is now
            labels = labels_of(node)
            if any(label in labels and str(labels[label]) in values for label, values in wanted.items()) \
                    and (walk or self.node_filter(node)):
                out.append(node)
        return out

    def gpu_count(self) -> int:
        """How many GPU nodes the cache holds (the breaker's and the budget's fleet)."""
        if not self._watching:
            return len(self.gpu_nodes())
        with self._lock:
            return self._gpu_count

    def gpu_nodes_of(self, shards: frozenset[int], shard_of: Callable[[str], int]) -> list[Node]:
        """The GPU nodes of these shards, by name; indexed (``index_shards``), only theirs are looked at."""
        if self._shard_of is None:
            return [n for n in self.gpu_nodes() if shard_of(name_of(n)) in shards]
        with self._lock:
            names = sorted(name for shard in shards for name in self._by_shard.get(shard, ()))
        out: list[Node] = []
        for name in names:
            listed = self.informer.get(name)
            if listed is None:
                continue  # deleted since: its delete event drops it from the index
            node = self._corrected(name, listed)
            entry = self._filtered.get(name)
            if entry is None or entry[0] is not node:
                entry = self._filtered[name] = (node, self.node_filter(node))
            if entry[1]:
                out.append(node)
        return out

    def _note_return(self, name: str, returned: float | None) -> None:
        """``name`` last came back repaired at ``returned`` (None: never, as its record says); the lock is held."""
        if returned is None:
            self._returned.pop(name, None)
        else:
            self._returned[name] = returned

    def remember_write(self, old_rv: str, result: Node) -> None:
        notable = self._watching and _notable(result)
        returned = _returned_at(result) if self._watching else None
        with self._lock:
            self._written[name_of(result)] = (old_rv, result)
            self._mark_notable(result, notable, returned)

    def replace_written(self, seen_rv: str, result: Node) -> None:
        """``result`` is a newer version of the node we saw at ``seen_rv``: if that was our own write not yet in
        the informer, it takes its place (keeping the version the informer must pass to drop it)."""
        name = name_of(result)
        notable = self._watching and _notable(result)
        returned = _returned_at(result) if self._watching else None
        with self._lock:
            entry = self._written.get(name)
            if entry is not None and _rv(entry[1]) == seen_rv:
                self._written[name] = (entry[0], result)
            else:
                self._written[name] = (seen_rv, result)
            self._mark_notable(result, notable, returned)

    def _mark_notable(self, result: Node, notable: bool, returned: float | None) -> None:
        """Our write made the node notable: in the index at once, the lock held. ``budget_nodes`` names our writes
        not yet in the cache too, but the informer stores an event before its handlers index it, and a reader
        between the two drops the write (the cache has it) while the index does not show it yet: a node we just
        quarantined would be missing from an admission's count for that moment. Its event's ``_indexed`` then
        says what the node is. So does the settle gate's time of its last return."""
        name = name_of(result)
        if notable:
            self._notable.setdefault(name, result)  # (read from the cache: it holds our nodes whole)
        if returned is not None:
            self._returned[name] = max(returned, self._returned.get(name, returned))

    def overlay(self, name: str, patch: Mapping[str, Any]) -> None:
        with self._lock:
            current = self._overlay.get(name, {})
            self._overlay[name] = merge_patch(current, _without_rv(patch))


def _returned_at(node: Node) -> float | None:
    """When the node last came back repaired, by its record's history (None: never, or no record to read)."""
    record = record_from_node(node)
    return last_return([record.history]) if isinstance(record, NodeRecord) else None


def _notable(node: Node) -> bool:
    """Whether the budget must see the node (``safety.notable``); a Node that cannot be viewed counts (never less)."""
    try:
        return safety.notable(safety.node_view(node))
    except Exception:  # an index kept by the informer's thread must not stop at one odd Node
        log.warning("node not viewable for the budget; counted as notable", extra={"node": name_of(node)},
                    exc_info=True)
        return True


NOISE_METADATA = ("resourceVersion", "managedFields", "generation")
OWN_PREFIX = "gpuremediate.io/"  # every Node annotation the controller reads is one of ours


def decision_inputs(node: Mapping[str, Any]) -> dict[str, Any]:
    """What of a Node any decision reads: all of it, as the node cache holds it (``strip_node``), but its version,
    others' annotations (the autoscaler marks excepted), and the writes that say nothing new (the conditions'
    heartbeat times, our own GPURemediation condition, published after each write). Labels all count: a group's
    selector may read any."""
    node = strip_node(dict(node))
    meta = {k: v for k, v in (node.get("metadata") or {}).items() if k not in NOISE_METADATA}
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                           if k.startswith(OWN_PREFIX) or k in MARKS}  # the marks' patch was built from them
    status = dict(node.get("status") or {})
    status["conditions"] = [{k: v for k, v in cond.items() if k != "lastHeartbeatTime"}
                            for cond in status.get("conditions") or [] if cond.get("type") != REMEDIATION_CONDITION]
    return {"metadata": meta, "spec": node.get("spec") or {}, "status": status}


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _without_rv(patch: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(patch))
    (out.get("metadata") or {}).pop("resourceVersion", None)
    return out


class NodeWriter:
    """Applies Decisions to Nodes: the record patch, then the Event and the metric."""

    def __init__(
        self,
        client: KubeClient,
        view: NodeView,
        events: EventRecorder,
        metrics: ControllerMetrics,
        *,
        dry_run: bool = False,
    ) -> None:
        self.client = client
        self.view = view
        self.events = events
        self.metrics = metrics
        self.dry_run = dry_run
        self.notifier: WebhookNotifier | None = None  # set by the controller when [notifications] is enabled
        self.taint = TaintPolicy()  # [taint]: set by the controller from the policy (default: no taint)
        self.clock: Callable[[], float] = time.time
        self.journal: DryRunJournal | None = None  # dry-run: what it would have written, for the CLI
        self._refused: dict[str, str] = {}  # node -> the fault whose record its full annotations refused
        # Set by the controller: the GPURemediation condition is published off the caller's thread, after the
        # actions, the latest per node (EventQueue.submit_latest). None: published right after each write.
        self.defer_condition: Callable[[str, Callable[[], None]], object] | None = None
        self._refused_lock = threading.Lock()

    def apply(self, node: Node, decision: Decision) -> Node | None:
        """Write the decision; returns the node as written, or None on a 409 (re-read and re-decide).

        Every effect follows the write: after a 409 the caller decides again, and nothing must have
        happened yet (a notice, an Event or a metric of a transition would be repeated)."""
        written: Node | None = node
        if decision.uncordon and keeps_cordoned(node):
            log.info("kept cordoned", extra={"node": name_of(node), "reason": KEEP_CORDONED_ANNOTATION})
            decision = dataclasses.replace(decision, uncordon=False, kept_cordoned=True)
        if decision.changed or decision.cordon or decision.uncordon:
            written = self.write(node, decision.record, cordon=decision.cordon, uncordon=decision.uncordon,
                                 untaint=decision.untaint)
            if written is None:
                return None
            if decision.transition is not None:
                self._report_transition(node, decision)
        for notice in decision.notices:
            self.events.node_event(name_of(node), "GPUFaultNotice", notice.message, NORMAL)
        return written

    def write(self, node: Node, record: NodeRecord, *, cordon: bool = False, uncordon: bool = False,
              untaint: str = "") -> Node | None:
        """Write ``record`` (and the cordon / uncordon, the taint ``untaint`` taken off) guarded by the node's
        resourceVersion."""
        name, rv = name_of(node), _rv(node)
        record, taints = self._with_taint(node, record, untaint)
        previous = record_from_node(node)
        marks = marks_change(node, record, previous.marked_by_us if isinstance(previous, NodeRecord) else ())
        record = dataclasses.replace(record, marked_by_us=marks.marked_by_us)
        if self.taint.enabled and self.taint.instead_of_cordon:
            # The taint keeps pods off: no new cordon. A cordon of ours from before the setting (the record as
            # read says so) stays ours, and is still lifted when the flow ends.
            previous = record_from_node(node)
            ours_before = isinstance(previous, NodeRecord) and previous.cordoned_by_us
            cordon = False
            uncordon = uncordon and ours_before
            if not ours_before:
                record = dataclasses.replace(record, cordoned_by_us=False)
        unschedulable = True if cordon else (False if uncordon else None)
        patch = node_patch(record, unschedulable=unschedulable, resource_version=rv or None, owner=node)
        if taints is not None:
            patch.setdefault("spec", {}).update(taints["spec"])
        patch["metadata"]["annotations"].update(marks.annotations)
        if held.held_by_us(node):
            patch["metadata"]["labels"][held.HELD_LABEL] = None  # the record fits now: it says why from here
        before = _blocked_text(node)
        if self.dry_run:
            self.view.overlay(name, patch)
            result = merge_patch(node, _without_rv(patch))
            if self.journal is not None:
                self.journal.note_record(name, record)
        elif (held.held_by_us(node) or name in self._refused) and held.would_overflow(node, patch):
            self._record_refused(node, record, cordon, patch)  # still full: not asked again every cycle
            return None
        else:
            try:
                result, rv = self._patch_guarded(node, patch)
            except errors.Conflict:
                log.info("node changed since read; deciding again", extra={"node": name})
                return None
            except errors.Invalid as exc:
                if not held.annotations_full(exc):
                    raise
                self._record_refused(node, record, cordon, patch)
                return None  # decided again next cycle: the record is written once it fits
            self._record_written(name)
            self._notify_drain_start(node, record)
            self.view.remember_write(rv, result)
            if self.defer_condition is not None:
                written = result
                self.defer_condition(f"condition/{name}", lambda: self._publish_latest(name, written))
            else:
                published = self._publish_condition(result, record)
                if published is not None:  # the status patch moved the resourceVersion: that is the truth now
                    self.view.remember_write(rv, published)
                    result = published
        self._report_blocked(name, before, record)
        return result

    def _patch_guarded(self, node: Node, patch: dict[str, Any]) -> tuple[Node, str]:
        """The resourceVersion-guarded patch. On a 409 the Node is read again: where nothing a decision reads
        changed (a kubelet's heartbeat, our own GPURemediation condition published meanwhile), the decision holds
        and the same patch is sent once more under the new version, instead of the loop deciding again from a cache
        that lags (on an API server answering in seconds each heartbeat cost a whole decision). Else the 409 is
        raised: the caller re-reads and decides again. Returns the node as written and the version it was based
        on (the informer may still show that one)."""
        name = name_of(node)
        based_on = node
        for attempt in range(RESEND_ATTEMPTS + 1):
            try:
                result: Node = self.client.patch(NODES, name, patch)
                return result, _rv(based_on)
            except errors.Conflict:
                if not _rv(node) or attempt == RESEND_ATTEMPTS:
                    raise
                based_on = self.client.get(NODES, name)
                if decision_inputs(based_on) != decision_inputs(node):
                    raise
            log.info("node changed since read, not what the decision read: written again", extra={"node": name})
            patch["metadata"]["resourceVersion"] = _rv(based_on)
        raise AssertionError("unreachable")  # the loop returns or raises

    # ---- a record that does not fit (actions/held.py) -------------------------------------------------------

    def _record_refused(self, node: Node, record: NodeRecord, cordon: bool, patch: Mapping[str, Any]) -> None:
        """Said once per fault; a node the fault asks to cordon, and that has no record of ours yet, is
        cordoned and labelled (held) so that no work lands on the faulty GPU meanwhile."""
        name = name_of(node)
        what = record.fault.fingerprint if record.fault is not None else record.state
        with self._refused_lock:
            first = self._refused.get(name) != what
            self._refused[name] = what
            self.metrics.records_refused.set(float(len(self._refused)))
        hold = cordon and record_from_node(node) is None and not node_unschedulable_of(node)
        if not first and not hold:
            return
        why = held.describe_full(self._with_managed_fields(node), held.record_bytes(patch))
        fault = record.fault.message if record.fault is not None else record.message or record.state
        outcome = (f"the node is cordoned and labelled {held.HELD_LABEL} until the record fits" if hold or
                   held.held_by_us(node) else "the flow waits until it fits")
        message = f"cannot write the gpuremediate record ({fault}): {why}; {outcome}"
        if first:
            log.error("node record not writable: annotations full", extra={"node": name, "detail": message})
            self.events.node_event(name, "GPURemediationRecordRefused", message, WARNING)
        if hold:
            self._hold(node, record, message)

    def _hold(self, node: Node, record: NodeRecord, message: str) -> None:
        name = name_of(node)
        try:
            result = self.client.patch(NODES, name, held.hold_patch(node, record.reason))
        except errors.Conflict:
            return  # the next cycle decides again
        self.view.remember_write(_rv(node), result)
        condition = build_condition(find_condition(result, REMEDIATION_CONDITION), REMEDIATION_CONDITION, "True",
                                    held.HELD_REASON, message[:1024], self.clock())
        self._patch_condition(name, condition)

    def lift_hold(self, node: Node) -> Node | None:
        """The fault of a held node is gone before its record could be written: uncordon, drop the label."""
        name = name_of(node)
        if self.dry_run:
            return node
        try:
            result = self.client.patch(NODES, name, held.lift_patch(node))
        except errors.Conflict:
            return None
        self._record_written(name)
        self.view.remember_write(_rv(node), result)
        condition = build_condition(find_condition(result, REMEDIATION_CONDITION), REMEDIATION_CONDITION, "False",
                                    "Healthy", "no open GPU fault (it cleared before its record could be written)",
                                    self.clock())
        self._patch_condition(name, condition)
        self.events.node_event(name, "GPUNodeHealthy", "the fault cleared: hold lifted, uncordoned", NORMAL)
        return result

    def forget(self, name: str) -> None:
        """The Node is gone: what was kept under its name goes."""
        self._record_written(name)

    def _record_written(self, name: str) -> None:
        with self._refused_lock:
            if self._refused.pop(name, None) is not None:
                self.metrics.records_refused.set(float(len(self._refused)))

    def _with_managed_fields(self, node: Node) -> Node:
        """The node with its managedFields (the informer drops them): one GET, only on this rare path."""
        if (node.get("metadata") or {}).get("managedFields"):
            return node
        try:
            return self.client.get(NODES, name_of(node))
        except (errors.ApiError, errors.TransportError):
            return node

    def _patch_condition(self, name: str, condition: Mapping[str, Any]) -> None:
        try:
            self.client.patch(NODES, name, conditions_patch([condition]), patch_type=STATUS_PATCH_TYPE,
                              subresource="status")
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("cannot set the GPURemediation condition", extra={"node": name, "error": str(exc)})

    def _with_taint(self, node: Node, record: NodeRecord,
                    untaint: str = "") -> tuple[NodeRecord, dict[str, Any] | None]:
        """The record with ``tainted_by_us`` as it will be after this write, and the taints patch (None: no
        change). Whether the taint on the node is ours comes from the record on the node, as read. ``untaint``:
        a key whose taints go in the same patch (a new node's startup taint, once validated)."""
        previous = record_from_node(node)
        ours = isinstance(previous, NodeRecord) and previous.tainted_by_us
        if not _rv(node):
            log.warning("node read without a resourceVersion: taint unchanged", extra={"node": name_of(node)})
            return dataclasses.replace(record, tainted_by_us=ours), None
        patch: dict[str, Any] | None = None
        if not self.taint.enabled and not ours:
            record = dataclasses.replace(record, tainted_by_us=False) if record.tainted_by_us else record
        else:
            change = remediation_taint(node, record, self.taint, ours)
            record, patch = dataclasses.replace(record, tainted_by_us=change.tainted_by_us), change.patch
        # The NIC taint ([network]): beside the [taint] one, on the taints as that change leaves them.
        nic = nic_taints(patch["spec"]["taints"] if patch is not None else taints_of(node), record)
        if nic is not None:
            patch = {"metadata": {"resourceVersion": str(_rv(node))}, "spec": {"taints": nic}}
        current = patch["spec"]["taints"] if patch is not None else taints_of(node)
        if untaint and any(t.get("key") == untaint for t in current):
            kept = [t for t in current if t.get("key") != untaint]
            patch = {"metadata": {"resourceVersion": str(_rv(node))}, "spec": {"taints": kept}}
        return record, patch

    def _publish_condition(self, node: Node, record: NodeRecord) -> Node | None:
        """``GPURemediation`` on the node as written: the node as the server returned it, or None (nothing to
        change, or a failure, which waits for the next write and is logged)."""
        condition = remediation_condition(node, record, self.clock())
        if condition is None:
            return None
        try:
            return self.client.patch(NODES, name_of(node), conditions_patch([condition]),
                                     patch_type=STATUS_PATCH_TYPE, subresource="status")
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("cannot set the GPURemediation condition; the next write retries",
                        extra={"node": name_of(node), "error": str(exc)})
            return None

    def _publish_latest(self, name: str, written: Node) -> None:
        """The condition for the node's record as the view has it now (``written``, the write that asked, where
        the view has no such node)."""
        node = self.view.get(name) or written
        record = record_from_node(node)
        if not isinstance(record, NodeRecord):  # no record of ours (any more), or one that does not parse
            return
        published = self._publish_condition(node, record)
        if published is not None:
            self.view.replace_written(_rv(node), published)

    def _report_transition(self, node: Node, decision: Decision) -> None:
        move = decision.transition
        assert move is not None
        name = name_of(node)
        dry = "true" if self.dry_run else "false"
        labels = {"from": move.from_state, "to": move.to_state, "reason": move.reason, "dry_run": dry}
        self.metrics.transitions.inc(1.0, **labels)
        bad = move.to_state in (states.QUARANTINED, states.DRAINING, states.CORDONED) or \
            move.reason == states.RECORD_MALFORMED
        text = f"{move.from_state} → {move.to_state} ({move.reason})"
        if move.message:
            text += f": {move.message}"
        if decision.cordon:
            text += "; cordoned"
        if decision.uncordon:
            text += "; uncordoned"
        if decision.kept_cordoned:
            text += f"; kept cordoned ({KEEP_CORDONED_ANNOTATION} is set)"
        log.info(
            "transition",
            extra={"node": name, "from": move.from_state, "to": move.to_state, "reason": move.reason, "dry_run": dry},
        )
        if self.journal is not None:
            self.journal.note_transition(name, move.from_state, move.to_state, move.reason, move.message)
        uid = str((node.get("metadata") or {}).get("uid", ""))
        self.events.node_event(name, EVENT_REASONS[move.to_state], text, WARNING if bad else NORMAL, uid=uid)
        if self.notifier is not None and not self.dry_run:
            note = for_transition(name, move.from_state, move.to_state, move.reason, move.message,
                                  decision.record.since, self.notifier.events)
            if note is not None:
                self.notifier.notify(note)  # queued: never waits for the receiver

    def _notify_drain_start(self, node: Node, record: NodeRecord) -> None:
        """``drain-started`` once per drain, when the record that starts it (admitted: budget, breaker, gates) is
        written; the node as read shows whether that drain had started before."""
        notifier, action = self.notifier, record.action
        if notifier is None or action is None or action.kind != DRAIN_KIND or not notifier.wants(KIND_DRAIN_STARTED):
            return
        before = record_from_node(node)
        if isinstance(before, NodeRecord) and before.action is not None and before.action.kind == DRAIN_KIND \
                and before.action.started == action.started:
            return  # the same drain, written again
        from_state = before.state if isinstance(before, NodeRecord) else states.HEALTHY
        notifier.notify(drain_started(name_of(node), from_state, record.state, record.reason, record.message,
                                      action.started))

    def _report_blocked(self, name: str, before: str, record: NodeRecord) -> None:
        after = "" if record.blocked is None else f"{record.blocked.reason}: {record.blocked.detail}"
        if after and after != before:
            self.events.node_event(name, "GPURemediationBlocked", f"waiting ({after})", NORMAL)


def _blocked_text(node: Node) -> str:
    record = record_from_node(node)
    if record is None or isinstance(record, RecordError) or record.blocked is None:
        return ""
    return f"{record.blocked.reason}: {record.blocked.detail}"
