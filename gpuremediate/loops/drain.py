"""The drain loop: owns ``draining``. A resumable step per reconcile, never one blocking call.

First the node waits until no new work is stopped (a pause, the circuit breaker, its failure domain's
breaker), for the budget (fleet-wide and per failure domain) and for the gates (blocking alerts, blocking
pods, the settle delay after a node returned); each wait is the record's ``blocked``, checked again on the
next retry. Before those waits, the variant the table picks may act (``before_admission``): a GPU-level
isolation's NoSchedule DeviceTaintRule goes on at once, as a node-level fault's cordon did at detection.
Once admitted, the drain is recorded as the action in progress (so it holds a budget slot across restarts), and each
step runs one drain variant (``loops.drainer``) picked from the table in ``loops.drainers``: a DrainRequest for a
drain plugin (``loops.custom_drain``), else the built-in eviction drain (``loops.drain_evict``: the node's pods from
a watch of that node's pods, started with the drain, no LIST per retry; a LIST confirms that none is left before
the drain is done). The variant returns in progress, done or failed; this loop writes what follows: when no pod
of the drain's scope is left, the node moves on to repairing (or validating / quarantined); a failed drain
quarantines it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpuremediate.actions import budget_claims
from gpuremediate.actions.events import WARNING
from gpuremediate.actions.nodes import Node, labels_of, name_of
from gpuremediate.actions.pods import (
    SCOPE_GPU,
    SCOPE_IMPACTED,
    NodePods,
    list_node_pods,
    pods_to_drain,
)
from gpuremediate.loops.base import LoopContext, LoopView, NodeLoop, state_of
from gpuremediate.loops.drain_scope import drain_scope
from gpuremediate.loops.drainer import Drainer, DrainRow
from gpuremediate.loops.drainers import select as select_drainer
from gpuremediate.loops.step import Done, InProgress, StepResult
from gpuremediate.obs import notify
from gpuremediate.policy import gates, safety
from gpuremediate.policy.fabric import is_domain_fault
from gpuremediate.policy.selector import parse_selector
from gpuremediate.policy.workflow import DrainPolicy, budget_value
from gpuremediate.signals.alerts import AlertsReader
from gpuremediate.state import decide
from gpuremediate.vocab import states
from gpuremediate.vocab.record import (
    BLOCK_BREAKER,
    BLOCK_BUDGET,
    NodeRecord,
    block,
    record_from_node,
    start_action,
    unblock,
)

log = logging.getLogger(__name__)

DRAIN_ACTION = "drain"

BLOCK_PAUSED, BLOCK_GATE = safety.BLOCK_PAUSED, safety.BLOCK_GATE


def _waits_for_budget(node: Node) -> bool:
    """Cordoned for a fault whose drain has not started: such nodes are admitted oldest fault first. One held by
    its own blocking pods is left out (it would keep every younger fault waiting), and a domain action's trays
    (admitted together, by their own check)."""
    record = record_from_node(node)
    return isinstance(record, NodeRecord) and safety.is_waiting(record) and not _held_by_own_pods(record) \
        and not (record.fault is not None and is_domain_fault(record.fault.kind))


class FleetViews:
    """The budget's view of each node an admission looks at (the notable GPU nodes, ``NodeView.budget_nodes``; every
    GPU node where no index is kept), and whether it waits for admission, made once per version of its Node object
    (the node cache hands out the same object until the node changes): in a drain burst, decoding each node's record
    for each of hundreds of admissions was most of the controller's CPU. Cleared at each resync: it would otherwise
    keep, after a burst, the Node objects of its last admission for as long as the controller runs."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[Node, safety.NodeView, bool]] = {}

    def clear(self) -> None:
        self._made = {}

    def of(self, nodes: Sequence[Node]) -> tuple[list[safety.NodeView], list[str]]:
        """``nodes``' views and the names of those waiting for admission (``_waits_for_budget``)."""
        made: dict[str, tuple[Node, safety.NodeView, bool]] = {}
        known = self._made
        for node in nodes:
            name = name_of(node)
            entry = known.get(name)
            if entry is None or entry[0] is not node:
                entry = (node, safety.node_view(node), _waits_for_budget(node))
            made[name] = entry
        self._made = made  # nodes gone drop out; concurrent admissions each build a whole one
        return [entry[1] for entry in made.values()], [name for name, entry in made.items() if entry[2]]


def _domain_admitted(node: Node, fingerprint: str) -> bool:
    """The tray's record has the domain action ``fingerprint`` past its admission (its drain started, or on)."""
    record = record_from_node(node)
    if not isinstance(record, NodeRecord) or record.fault is None or record.fault.fingerprint != fingerprint:
        return False
    return record.state != states.DRAINING or (record.action is not None and record.action.kind == DRAIN_ACTION)
    # (a tray taken mid-drain starts its drain again as the domain's: every drain of this fingerprint was admitted
    # by the domain's check)


def _held_by_own_pods(record: NodeRecord) -> bool:
    return record.blocked is not None and record.blocked.detail.startswith(gates.BLOCKING_PODS)


class Admitted:
    """An admission verdict: start the drain."""


ADMITTED = Admitted()


class DrainLoop(NodeLoop):
    name = "drain"
    owned = frozenset({states.DRAINING})

    def __init__(self, ctx: LoopContext, alerts: AlertsReader | None = None, alerts_problem: str = "") -> None:
        """``alerts``: the blocking-alerts reader the controller built once (None with ``alerts_problem`` saying
        why when ``[gates].blocking_alerts`` is set but no reader could be built: those drains wait)."""
        super().__init__(ctx)
        self.alerts = alerts
        self.alerts_problem = alerts_problem
        self._notified_blocked: set[tuple[str, str, float]] = set()  # (node, fingerprint, first seen) told once
        # The pods of the nodes being drained, watched per node (started by a drain's first step, stopped when it
        # ends): a step reads them from here, and a pod that changes queues its node.
        self.node_pods = NodePods(ctx.client, on_change=self.queue.add)
        self.fleet_views = FleetViews()
        # One admission at a time: each counts the fleet's drains and then writes its own start, so two workers
        # deciding at once would both see the last slot free.
        self._admission = threading.Lock()
        self._starting: set[str] = set()  # admitted, start not yet written (guarded by _admission)
        self._drainers_lock = threading.Lock()

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        policy = self.ctx.policy_for(node).drain
        self._notify_if_blocked_long(node, record)
        if record.action is None or record.action.kind != DRAIN_ACTION:
            return self._admit(node, record, policy)
        held = self.held_by_pause(node, record)
        if held is not None:
            return held
        return self._step(node, record, policy)

    def resync(self) -> None:
        self.fleet_views.clear()
        pause = self.ctx.breakers.latest_pause()  # the detect loop reloads it every cycle
        self.ctx.metrics.paused.set(1.0 if pause.paused else 0.0)
        self.ctx.metrics.domains_tripped.set(float(len(self.ctx.breakers.latest().domains)))
        draining = {name_of(n) for n in self.ctx.owned_gpu_nodes() if state_of(n) == states.DRAINING}
        self.node_pods.keep_only(draining)
        for drainer in self._made_drainers().values():
            keep_only = getattr(drainer, "keep_only", None)
            if callable(keep_only):
                keep_only(draining)  # what it keeps per node, for the nodes still draining only
        super().resync()

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        self.node_pods.stop()
        for drainer in self._made_drainers().values():
            close = getattr(drainer, "close", None)
            if callable(close):
                close()  # its evictions still in flight end on their own; none is sent after this

    def _notify_if_blocked_long(self, node: Node, record: NodeRecord) -> None:
        """One notification per fault whose drain stays blocked longer than ``drain_blocked_after_s``."""
        notifier, cfg = self.ctx.writer.notifier, self.ctx.policy.cluster.notifications
        blocked, now = record.blocked, self.ctx.clock()
        if notifier is None or blocked is None or now - blocked.since < cfg.drain_blocked_after_s:
            return
        key = (name_of(node), record.fault.fingerprint if record.fault else "", record.fault.first_seen
               if record.fault else 0.0)
        if key in self._notified_blocked:
            return
        self._notified_blocked.add(key)
        message = f"drain blocked for {now - blocked.since:.0f}s: {blocked.reason}: {blocked.detail}"
        notifier.notify(notify.Notification(notify.KIND_DRAIN_BLOCKED, name_of(node), blocked.reason, message, now))

    # ---- admission ---------------------------------------------------------------------------------

    def _admit(self, node: Node, record: NodeRecord, policy: DrainPolicy) -> float | None:
        """Admission is decided one node at a time (``_admission``), its writes made outside: a node admitted and
        not yet written holds its slot in ``_starting``, so another worker's decision counts it."""
        prepared = self._before_admission(node, record)
        if prepared is not None:
            return prepared.requeue_s
        name, now = name_of(node), self.ctx.clock()
        with self._admission:
            verdict = self._admission_verdict(node, record, policy, now)
            if verdict is ADMITTED:
                self._starting.add(name)
        if isinstance(verdict, NodeRecord):
            return self._wait(node, verdict)
        if not isinstance(verdict, Admitted):
            return verdict
        try:
            return self._start(node, record, policy, now)
        finally:
            with self._admission:
                self._starting.discard(name)

    def _admission_verdict(self, node: Node, record: NodeRecord, policy: DrainPolicy,
                           now: float) -> NodeRecord | float | Admitted | None:
        """ADMITTED, the blocked record to write, or (a domain's trays, a contended claim) the requeue."""
        cluster = self.ctx.policy.cluster
        name = name_of(node)
        nodes, size = self._budget_fleet(node)
        views, waiting = self.fleet_views.of(nodes)
        if self._starting:  # admitted by another worker, its start not written yet: out of service already
            views = [dataclasses.replace(v, waiting=False) if v.name in self._starting else v for v in views]
            waiting = [w for w in waiting if w not in self._starting]
        view = next((v for v in views if v.name == name), None) or safety.node_view(node)
        domain_label = self.ctx.policy_for(node).fabric.domain_label
        is_domain = record.fault is not None and is_domain_fault(record.fault.kind)
        held = self._stopped(view, domain_label if is_domain else "") or self._fleet_gate(now)
        if held:
            return block(record, *held, now)
        budget = safety.Budget(cluster.budget.as_budget_value(), cluster.budget.count_held)
        if is_domain:  # rare: decided and started under the lock, trays together
            return self._admit_domain(node, record, policy, views, budget, domain_label, size, now)
        domains = [safety.DomainBudget(d.label, budget_value(d.max_unavailable)) for d in cluster.budget.domains]
        result = safety.budget_check(views, name, budget, domains, size)
        self.ctx.metrics.budget_in_use.set(float(result.in_use))
        self.ctx.metrics.budget_limit.set(float(result.limit))
        if not result.allowed:
            return block(record, BLOCK_BUDGET, result.reason, now)
        # With --shards the claim decides the order too (budget_refusal): a node whose claim is in the admitted set
        # already holds its slot, and yielding it here to an older fault, whose replica counts that claim and
        # waits for it, would leave both waiting for ever.
        if self.ctx.claims is None and name not in safety.admit(views, [*waiting, name], budget, domains, size):
            return block(record, BLOCK_BUDGET, "older faults go first: " + result.reason, now)
        pods = self._blocking_pods(name)
        if pods:
            return block(record, BLOCK_GATE, pods, now)
        if self.ctx.claims is not None:  # --shards: the API server decides who takes the last slot
            def refusal(candidate: str) -> budget_claims.Refusal:
                return lambda claimed: budget_claims.budget_refusal(views, candidate, waiting, budget, domains,
                                                                    claimed, size, self._view_of)
            def ahead() -> dict[str, budget_claims.Refusal]:
                return {other: refusal(other) for other in self._claimable_ahead(name, views, waiting)}
            try:
                refused, taken = self.ctx.claims.claim_ahead(name, refusal(name), ahead)
            except budget_claims.Contended:
                return self._claim_contended(name)
            for other in taken:  # each starts its drain at its own admission, which finds its claim made
                self.queue.add(other)
            if refused:
                return block(record, BLOCK_BUDGET, refused, now)
        return ADMITTED

    def _claimable_ahead(self, name: str, views: Sequence[safety.NodeView], waiting: Sequence[str]) -> list[str]:
        """This replica's other nodes waiting for admission that nothing but the budget holds (the fleet's gates
        have just let ``name`` through; a pause or breaker holding the node, its blocking pods, a variant's step
        before admission or another worker's start leave it out): claimed in ``name``'s write, at most
        ``CLAIM_AHEAD``, older faults first as the refusal itself orders them."""
        by_name = {v.name: v for v in views}
        mine = sorted((by_name[other] for other in waiting if other in by_name and other != name
                       and other not in self._starting and self.ctx.owns(other)), key=safety.admission_order)
        out: list[str] = []
        for view in mine:
            if len(out) == budget_claims.CLAIM_AHEAD:
                break
            other = view.name
            if self._stopped(view) is not None:
                continue
            node = self.ctx.nodes.get(other)
            record = record_from_node(node) if node is not None else None
            if node is None or not isinstance(record, NodeRecord) or self._prepares(node, record) \
                    or self._blocking_pods(other):
                continue
            out.append(other)
        return out

    def _prepares(self, node: Node, record: NodeRecord) -> bool:
        """The node's drainer has a step of its own before admission (``_before_admission``)."""
        return callable(getattr(self._drainer(select_drainer(self.ctx.policy_for(node), record)), "before_admission",
                                None))

    def _budget_fleet(self, node: Node) -> tuple[list[Node], safety.FleetSize | None]:
        """The nodes the budget views (``node`` among them) and, where those are only the notable ones
        (``NodeView.budget_nodes``), the fleet's size; else every GPU node and None."""
        nodes, size = self.ctx.nodes.budget_fleet()
        if size is None:
            return nodes, None
        name = name_of(node)
        return [*(n for n in nodes if name_of(n) != name), node], size

    def _view_of(self, name: str) -> safety.NodeView | None:
        node = self.ctx.nodes.get(name)
        return safety.node_view(node) if node is not None and self.ctx.nodes.node_filter(node) else None

    def _claim_contended(self, name: str) -> float:
        """Other replicas kept writing the admitted set: asked again as after any conflict, nothing recorded."""
        log.info("budget claim contended; asking again", extra={"node": name})
        return self.retry_after_conflict()

    def _start(self, node: Node, record: NodeRecord, policy: DrainPolicy, now: float) -> float | None:
        scope = drain_scope(self.ctx.policy_for(node), node, record)
        started = start_action(unblock(record), DRAIN_ACTION, "", 1, now, policy.timeout_s, scope.detail)
        if self.ctx.writer.write(node, started) is None:
            return self.retry_after_conflict()
        log.info("drain started", extra={"node": name_of(node), "mode": policy.mode, "scope": scope.scope,
                                         **({"scope_why": scope.why} if scope.why else {})})
        return 0.0

    def _admit_domain(self, node: Node, record: NodeRecord, policy: DrainPolicy, views: Sequence[safety.NodeView],
                      budget: safety.Budget, label: str, size: safety.FleetSize | None, now: float) -> float | None:
        """A tray of a domain action: the domain's trays are admitted together. The first one's check counts every
        tray of the domain whole against the fleet-wide budget (all or none); once one is admitted the domain
        holds its slots and the others follow without a check of their own (each is queued at once). The domain
        budgets, the blocking pods and the older faults' turn are for ordinary repairs."""
        assert record.fault is not None
        value = labels_of(node).get(label, "")
        members = (self.ctx.nodes.gpu_nodes_with({label: [value]}) if value else []) or [node]
        fingerprint, name = record.fault.fingerprint, name_of(node)
        if not any(_domain_admitted(n, fingerprint) for n in members if name_of(n) != name):
            known = {v.name for v in views}  # the domain's trays in service are not among the notable nodes
            views = [*views, *(safety.node_view(n) for n in members if name_of(n) not in known)]
            result = safety.domain_admission(views, {name_of(n) for n in members}, budget, size)
            if not result.allowed:
                return self._wait(node, block(record, BLOCK_BUDGET, result.reason, now))
        if self.ctx.claims is not None:  # --shards: in the admitted set, so the other replicas count the tray
            try:
                refused = self.ctx.claims.claim(name, lambda claimed: "")
            except budget_claims.Contended:
                return self._claim_contended(name)
            if refused:
                return self._wait(node, block(record, BLOCK_BUDGET, refused, now))
        requeue = self._start(node, record, policy, now)
        for member in members:
            if name_of(member) != name:
                self.queue.add(name_of(member))
        return requeue

    def _before_admission(self, node: Node, record: NodeRecord) -> InProgress | None:
        """A variant's ``before_admission(ctx, node, record)``, if it has one: what it does while the drain waits
        for admission (a GPU-level isolation's NoSchedule rule, as a cordon would be); its InProgress: requeue."""
        node_policy = self.ctx.policy_for(node)
        prepare = getattr(self._drainer(select_drainer(node_policy, record)), "before_admission", None)
        if not callable(prepare):
            return None
        result = prepare(DrainView(self, node_policy), node, record)
        return result if isinstance(result, InProgress) else None

    def _stopped(self, view: safety.NodeView, acting_for: str = "") -> tuple[str, str] | None:
        """A pause, the circuit breaker or the node's failure-domain breaker: no new drain (the detect loop
        reloads both every cycle). ``acting_for``: a domain action's label (its own breaker does not hold it)."""
        pause = self.ctx.breakers.latest_pause()
        if pause.paused:
            return BLOCK_PAUSED, f"paused by {pause.by or '?'}: {pause.reason or '-'}"
        if not self.ctx.policy.cluster.breaker.enabled:
            return None
        why = self.ctx.breakers.latest().blocks(view, acting_for)
        return (BLOCK_BREAKER, why) if why else None

    def _fleet_gate(self, now: float) -> tuple[str, str] | None:
        """The gates that hold every drain alike: blocking alerts firing, the settle delay (which reads every GPU
        node's history: only where it is set)."""
        cfg = self.ctx.policy.cluster.gates
        if cfg.blocking_alerts:
            firing, problem = self.alerts.firing() if self.alerts is not None else (None, self.alerts_problem)
            why = gates.blocking_alerts(firing, cfg.blocking_alerts, problem)
            if why:
                return BLOCK_GATE, why
        if cfg.settle_s > 0:
            why = gates.settle_reason(gates.settle_remaining(self.ctx.nodes.last_return(), now, cfg.settle_s),
                                      cfg.settle_s)
            if why:
                return BLOCK_GATE, why
        return None

    def _blocking_pods(self, name: str) -> str:
        """Pods matching ``[gates].blocking_pod_selectors`` on the node (its one field-selected pod list)."""
        texts = self.ctx.policy.cluster.gates.blocking_pod_selectors
        if not texts:
            return ""
        selectors = [(text, parse_selector(text)) for text in texts]
        return gates.blocking_pods(list_node_pods(self.ctx.client, name), selectors)

    def _wait(self, node: Node, record: NodeRecord) -> float:
        if self.ctx.writer.write(node, record) is None:
            return self.retry_after_conflict()
        return self.ctx.settings.resync_s

    # ---- one step -----------------------------------------------------------------------------------

    def _step(self, node: Node, record: NodeRecord, policy: DrainPolicy) -> float | None:
        """One step of the admitted drain by the variant the table picks (``loops.drainers``)."""
        node_policy = self.ctx.policy_for(node)
        row = select_drainer(node_policy, record)
        drainer = self._drainer(row)
        view = DrainView(self, node_policy)

        def step() -> float | None:
            return self._outcome(node, record, drainer.step(view, node, record))
        return self.guarded_step(node, record, step) if row.guarded else step()

    def _drainer(self, row: DrainRow) -> Drainer:
        """The row's variant, made once per loop (the eviction drain paces attempts per pod across steps)."""
        made = self._made_drainers()
        with self._drainers_lock:  # one per kind, however many workers ask first
            if row.kind not in made:
                made[row.kind] = row.make()
            return made[row.kind]

    def _made_drainers(self) -> dict[str, Drainer]:
        made: dict[str, Drainer] = self.__dict__.setdefault("_drainers", {})
        return made

    def _outcome(self, node: Node, record: NodeRecord, result: StepResult) -> float | None:
        """What a variant's step leads to: a requeue, or the drain's end (written here, never by the variant)."""
        if isinstance(result, InProgress):
            return result.requeue_s
        now = result.at if result.at is not None else self.ctx.clock()
        if isinstance(result, Done):
            if self.apply(node, decide.complete_drain(record, now)) is None:
                return self.retry_after_conflict()
            if record.action is not None:
                self.ctx.metrics.drain_seconds.observe(max(0.0, now - record.action.started))
        else:
            if self.apply(node, decide.drain_failed(record, now, result.reason)) is None:
                return self.retry_after_conflict()
            self.ctx.events.node_event(name_of(node), "GPUDrainTimedOut", result.reason, WARNING)
        if result.then is not None:
            result.then()
        return None

    def targets(self, node: Node, record: NodeRecord, policy: DrainPolicy,
                confirm: bool = False) -> list[Mapping[str, Any]]:
        """The pods this drain must see gone (the same set a custom drain hands to its plugin): from the node's
        pod watch, or with ``confirm`` from a LIST (what the API server has now)."""
        name = name_of(node)
        pods = self.node_pods.confirm(name) if confirm else self.node_pods.pods(name)
        scope = drain_scope(self.ctx.policy_for(node), node, record).scope  # widened for a reboot, say
        impacted = self._impacted(name_of(node), record)
        if scope == SCOPE_IMPACTED and impacted is None:
            scope = SCOPE_GPU  # the exporter maps no pods to GPUs here: every GPU pod may be on the faulty GPU
        return pods_to_drain(pods, scope, impacted or (), policy.skip_namespaces,
                             self.ctx.policy_for(node).gpu_resources.names)

    def _impacted(self, node: str, record: NodeRecord) -> set[tuple[str, str]] | None:
        """The pods the exporter attributes to the faulty GPUs (every GPU for a fault naming none); None when
        it attributes no pod to any GPU of the node.

        On a MIG GPU dcgm-exporter writes one series per GPU instance (``GPU_I_ID``, ``GPU_I_PROFILE``) that
        keeps the parent's ``gpu`` index and ``UUID``, and puts each pod on its instance's series (the kubelet's
        pod-resources API names the pod's MIG device; the exporter maps it to the parent and the instance ID).
        A reading's key is the parent's UUID (else node/gpuN), so a fault on GPU 3 impacts the pods of every
        MIG instance of GPU 3, and only those. A fault is never narrowed to one instance, even when only one
        instance's series shows it: the XID gauge, ECC and row remapping are DCGM device fields of the whole
        GPU (a real A30 scrape in NVIDIA/dcgm-exporter#317 has DCGM_FI_DEV_XID_ERRORS once per GPU_I_ID, each
        with the parent's UUID), and the repair (a GPU reset, a reboot) takes every instance down anyway."""
        readings = self.ctx.readings.get(node)
        if readings is None or not any(g.pods for g in readings.gpus):
            return None
        faulty = set(record.fault.gpus) if record.fault else set()
        return {(p.namespace, p.name) for g in readings.gpus if g.key in faulty or not faulty for p in g.pods}


class DrainView(LoopView):
    """The narrow context a drain variant gets (``loops.drainer.DrainContext``): the shared part, with the loop's
    pod watch for the drain's pods and its queue."""

    _loop: DrainLoop

    def targets(self, node: Node, record: NodeRecord, confirm: bool = False) -> list[Mapping[str, Any]]:
        return self._loop.targets(node, record, self.policy.drain, confirm)

    def stop_watching(self, node: str) -> None:
        self._loop.node_pods.stop_node(node)

    def requeue(self, node: str) -> None:
        self._loop.queue.add(node)

