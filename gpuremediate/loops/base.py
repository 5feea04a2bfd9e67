"""What every loop shares: the context (client, nodes, writer, policy, metrics) and the node loop
skeleton (one thread, a work queue of node names, a periodic resync, errors that never kill it)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.actions.budget_claims import BudgetClaims
from gpuremediate.actions.custom import PermissionBackoff, PermissionDenied, conditions_problem
from gpuremediate.actions.events import WARNING, EventRecorder
from gpuremediate.actions.jobs import ActionJobs
from gpuremediate.actions.nodes import (
    Node,
    NodeView,
    NodeWriter,
    is_excluded,
    labels_of,
    name_of,
    node_unschedulable_of,
)
from gpuremediate.config import Settings
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.shards import ShardSet, acting_for
from gpuremediate.kube.workqueue import WorkQueue, run_worker
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.policy.config import Policy, PolicyFile
from gpuremediate.signals.model import NodeReadings
from gpuremediate.state import decide
from gpuremediate.vocab.record import (
    BLOCK_PAUSED,
    BLOCK_PERMISSION,
    NodeRecord,
    RecordError,
    block,
    record_from_node,
    unblock,
)

log = logging.getLogger(__name__)


@dataclass
class LoopContext:
    client: KubeClient
    settings: Settings
    policy: PolicyFile
    metrics: ControllerMetrics
    events: EventRecorder
    nodes: NodeView
    writer: NodeWriter
    breakers: BreakerStore
    stop: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] = time.time
    # The latest successful readings per node (the detect loop writes, the drain loop reads pods from them).
    readings: dict[str, NodeReadings] = field(default_factory=dict)
    # Plugin kinds RBAC refused (403): not asked again until their backoff has passed.
    permissions: PermissionBackoff = field(init=False)
    # The controller's own Jobs, from one watch shared by the loops that run them (started by the first look).
    jobs: ActionJobs = field(init=False)
    # --shards > 1: the shard Leases this replica holds (None: one controller owns every node) and the
    # fleet-wide admitted set drains are claimed in (None: this replica's informer is the whole truth).
    shards: ShardSet | None = None
    claims: BudgetClaims | None = None

    def __post_init__(self) -> None:
        self.permissions = PermissionBackoff(lambda: self.clock())
        self.jobs = ActionJobs(self.client, self.settings.jobs_namespace)

    def policy_for(self, node: Mapping[str, Any]) -> Policy:
        return self.policy.for_node(labels_of(node))

    def owns(self, name: str) -> bool:
        """This replica acts on the node now: unsharded, or its shard's Lease is held within the deadline."""
        return self.shards is None or self.shards.owns(name)

    def owned_gpu_nodes(self) -> list[Node]:
        """The GPU nodes this replica acts on now (every one when unsharded)."""
        if self.shards is None:
            return self.nodes.gpu_nodes()
        return self.nodes.gpu_nodes_of(self.shards.owned(), self.shards.shard_index)

    def owned_of(self, nodes: list[Node]) -> list[Node]:
        """Those of ``nodes`` this replica acts on now (the shards held are read once, not per node)."""
        if self.shards is None:
            return nodes
        owned = self.shards.owned()
        return [n for n in nodes if self.shards.shard_index(name_of(n)) in owned]


RESYNC_KEY = "\0resync"  # a queue key no Node can have (a node name is a DNS subdomain)


class NodeLoop:
    """Reconciles the nodes in the states this loop owns, ``--loop-workers`` nodes at once, each worker its own
    thread on one queue (a node is handed to one worker at a time: the queue's processing set). What a step shares
    with other nodes' steps (a drain's budget admission) is serialized where it is decided."""

    name = "loop"
    owned: frozenset[str] = frozenset()

    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        self.queue = WorkQueue(base_delay=0.5, max_delay=60.0)
        self._threads: list[threading.Thread] = []
        self._reported_shapes: set[tuple[str, str]] = set()  # (plugin resource, problem) evented once

    # ---- wiring ---------------------------------------------------------------------------------------

    def start(self) -> None:
        workers = max(1, self.ctx.settings.loop_workers)
        self._threads = [threading.Thread(target=self._run, args=(i == 0,), daemon=True,
                                          name=f"loop-{self.name}" + (f"-{i}" if i else "")) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.queue.shutdown()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def running(self) -> bool:
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def on_node(self, node: Node) -> None:
        """Informer handler: queue the node when its state is one this loop owns."""
        if state_of(node) in self.owned and self.ctx.owns(name_of(node)):
            self.queue.add(str(node["metadata"]["name"]))

    def resync(self) -> None:
        for node in self.ctx.owned_gpu_nodes():
            self.on_node(node)

    def request_resync(self) -> None:
        """A resync soon, on this loop's own thread (from another thread: the shard Leases' on a change, which
        must never wait on a loop's API calls)."""
        self.queue.add(RESYNC_KEY)

    # ---- the loop --------------------------------------------------------------------------------------

    def _run(self, resyncs: bool = True) -> None:
        """One worker; the first also resyncs (one resync per interval, whatever the count of workers)."""
        run_worker(self.queue, self.reconcile_name, self.ctx.stop, what=self.name,
                   resync=self.resync if resyncs else None,
                   resync_s=self.ctx.settings.resync_s, on_api_error=self.ctx.metrics.count_api_error)

    def reconcile_name(self, name: str) -> float | None:
        if name == RESYNC_KEY:
            self.resync()
            return None
        if not self.ctx.owns(name):
            return None  # another replica's shard (or ours lost): its holder reconciles it
        with acting_for(name):  # every write of this step is fenced by the node's shard
            return self._reconcile_owned(name)

    def _reconcile_owned(self, name: str) -> float | None:
        node = self.ctx.nodes.get(name)
        if node is None or is_excluded(node):
            return None
        record = record_from_node(node)
        if isinstance(record, RecordError):
            return self._malformed(node, record)
        if record is None or record.state not in self.owned:
            return None
        if decide.person_uncordoned(record, node_unschedulable_of(node)):
            return self._person_took_over(node, record)
        return self.reconcile(node, record)

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        """One step for a node in an owned state; returns seconds until the next step, or None."""
        raise NotImplementedError

    def retry_after_conflict(self) -> float:
        return 0.2

    def held_by_pause(self, node: Node, record: NodeRecord) -> float | None:
        """``[pause] in_flight = "hold"``: while paused, a step under way waits (``blocked: paused`` says who
        and why); once resumed, that block goes and the step goes on. None: go on now."""
        held = self.ctx.breakers.holds_in_flight(self.ctx.policy.cluster.pause.in_flight)
        if held:
            after = block(record, BLOCK_PAUSED, held, self.ctx.clock())
            if after != record and self.ctx.writer.write(node, after) is None:
                return self.retry_after_conflict()
            return self.ctx.settings.resync_s
        if record.blocked is not None and record.blocked.reason == BLOCK_PAUSED:
            self.ctx.writer.write(node, unblock(record))  # a 409 is simply noted again on the next step
            return self.retry_after_conflict()  # the next step reads the node as written
        return None

    # ---- shared steps ----------------------------------------------------------------------------------

    def apply(self, node: Node, decision: decide.Decision) -> Node | None:
        written = self.ctx.writer.apply(node, decision)
        if written is not None and decision.cancel is not None:
            self.cancel(decision.cancel.kind, decision.cancel.name)
        return written

    def cancel(self, kind: str, name: str) -> None:
        """Clean up the object of an action a person interrupted (loops that create objects override)."""

    def permission_denied(self, node: Node, record: NodeRecord, denied: PermissionDenied) -> float:
        """A plugin kind RBAC refuses: the node waits (``blocked: permission`` names verb, group, resource and
        namespace — shown by status/explain, evented once by the writer), the kind is not asked again before
        its backoff, and the refusal is logged once and counted."""
        if denied.fresh:
            self.ctx.metrics.permission_denied.inc(verb=denied.verb, group=denied.group, resource=denied.plural,
                                                   namespace=denied.ref.namespace)
            log.log(logging.WARNING if denied.first else logging.DEBUG, "permission denied",
                    extra={"node": name_of(node), "detail": denied.describe(), "error": denied.message})
        after = block(record, BLOCK_PERMISSION, denied.describe().rsplit("; retrying", 1)[0], self.ctx.clock())
        if after != record:
            self.ctx.writer.write(node, after)  # a 409 is simply noted again on the next step
        return max(1.0, denied.retry_in)

    def permission_granted(self, name: str) -> None:
        """A step got past its plugin calls: a ``blocked: permission`` on the node (as it is now) is over."""
        node = self.ctx.nodes.get(name)
        record = record_from_node(node) if node is not None else None
        if node is not None and isinstance(record, NodeRecord) and record.blocked is not None \
                and record.blocked.reason == BLOCK_PERMISSION:
            self.ctx.writer.write(node, unblock(record))  # a 409 is simply noted again on the next step

    def check_shape(self, node: Node, kind: str, obj: Mapping[str, Any]) -> None:
        """A plugin resource whose ``status.conditions`` has the wrong shape (a permissive CRD): reported once
        (a log line and a Warning Event), and its bad entries ignored."""
        problem = conditions_problem(obj)
        key = (f"{kind}/{name_of(obj)}", problem or "")
        if problem is None or key in self._reported_shapes:
            return
        self._reported_shapes.add(key)
        namespace = (obj.get("metadata") or {}).get("namespace")
        text = f"{kind} {namespace + '/' if namespace else ''}{name_of(obj)}: {problem}; such entries are ignored"
        log.warning("malformed plugin resource", extra={"node": name_of(node), "detail": text})
        self.ctx.events.node_event(name_of(node), "GPUPluginResourceMalformed", text, WARNING)

    def guarded_step(self, node: Node, record: NodeRecord, step: Callable[[], float | None]) -> float | None:
        """Run a step that calls a plugin's kind: a 403 is ``permission_denied``, never an error."""
        try:
            result = step()
        except PermissionDenied as denied:
            return self.permission_denied(node, record, denied)
        if record.blocked is not None and record.blocked.reason == BLOCK_PERMISSION:
            self.permission_granted(name_of(node))
        return result

    def _person_took_over(self, node: Node, record: NodeRecord) -> float | None:
        decision = decide.on_person_uncordoned(record, self.ctx.clock())
        if self.apply(node, decision) is None:
            return self.retry_after_conflict()
        return None

    def _malformed(self, node: Node, error: RecordError) -> float | None:
        """Replaced (schedulable) or held for a person (unschedulable); the writer logs and Events it."""
        decision = decide.on_malformed(error, node_unschedulable_of(node), self.ctx.clock())
        if self.apply(node, decision) is None:
            return self.retry_after_conflict()
        return None


def state_of(node: Mapping[str, Any]) -> str:
    record = record_from_node(node)
    if record is None:
        return "healthy"
    if isinstance(record, RecordError):
        return "malformed"
    return record.state


class LoopView:
    """What every variant's narrow context shares (``loops.step.StepContext``), read from its loop's context when
    used: the node writer, the API client, Events, metrics, permission backoff, the clock, the node's policy and
    the loop's report of a plugin resource of the wrong shape. ``DrainView`` and ``RepairView`` add their own."""

    def __init__(self, loop: NodeLoop, policy: Policy) -> None:
        self._loop = loop
        self._ctx: LoopContext = loop.ctx
        self.policy = policy

    @property
    def writer(self) -> NodeWriter:
        return self._ctx.writer

    @property
    def client(self) -> KubeClient:
        return self._ctx.client

    @property
    def events(self) -> EventRecorder:
        return self._ctx.events

    @property
    def metrics(self) -> ControllerMetrics:
        return self._ctx.metrics

    @property
    def permissions(self) -> PermissionBackoff:
        return self._ctx.permissions

    def clock(self) -> float:
        return self._ctx.clock()

    def check_shape(self, node: Node, kind: str, obj: Mapping[str, Any]) -> None:
        self._loop.check_shape(node, kind, obj)
