"""The drain loop: owns ``draining``. A resumable step per reconcile, never one blocking call.

First the node waits until no new work is stopped (a pause, the circuit breaker, its failure domain's
breaker), for the budget (fleet-wide and per failure domain) and for the gates (blocking alerts, blocking
pods, the settle delay after a node returned); each wait is the record's ``blocked``, checked again on the
next retry. Once admitted, the drain
is recorded as the action in progress (so it holds a budget slot across restarts), and each
step lists the node's pods, evicts (or waits for, or deletes) what the mode says, records the
outcome — a PDB's refusal names the PDB in ``blocked`` — and requeues. When no pod of the
drain's scope is left, the node moves on to repairing (or validating / quarantined).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuremediate.actions import budget_claims
from gpuremediate.actions import evict as eviction
from gpuremediate.actions.events import WARNING
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.actions.pods import SCOPE_GPU, SCOPE_IMPACTED, is_terminating, list_node_pods, pod_key, pods_to_drain
from gpuremediate.kube import errors
from gpuremediate.kube.resources import PODS
from gpuremediate.loops import custom_drain
from gpuremediate.loops.base import LoopContext, NodeLoop
from gpuremediate.loops.drain_scope import drain_scope
from gpuremediate.obs import notify
from gpuremediate.policy import gates, safety
from gpuremediate.policy.selector import parse_selector
from gpuremediate.policy.workflow import DrainPolicy, budget_value
from gpuremediate.signals.alerts import AlertsReader
from gpuremediate.state import decide, states
from gpuremediate.state.record import (
    BLOCK_BREAKER,
    BLOCK_BUDGET,
    BLOCK_PDB,
    NodeRecord,
    block,
    record_from_node,
    start_action,
    unblock,
)

log = logging.getLogger(__name__)

DRAIN_ACTION = "drain"

BLOCK_PAUSED, BLOCK_GATE = safety.BLOCK_PAUSED, safety.BLOCK_GATE


def waiting_for_budget(nodes: Sequence[Node]) -> list[str]:
    """The nodes cordoned for a fault whose drain has not started: they are admitted oldest fault first.
    One held by its own blocking pods is left out: it would keep every younger fault waiting."""
    waiting = []
    for node in nodes:
        record = record_from_node(node)
        if isinstance(record, NodeRecord) and safety.is_waiting(record) and not _held_by_own_pods(record):
            waiting.append(name_of(node))
    return waiting


def _held_by_own_pods(record: NodeRecord) -> bool:
    return record.blocked is not None and record.blocked.detail.startswith(gates.BLOCKING_PODS)


class DrainLoop(NodeLoop):
    name = "drain"
    owned = frozenset({states.DRAINING})

    def __init__(self, ctx: LoopContext, alerts: AlertsReader | None = None, alerts_problem: str = "") -> None:
        """``alerts``: the blocking-alerts reader the controller built once (None with ``alerts_problem`` saying
        why when ``[gates].blocking_alerts`` is set but no reader could be built: those drains wait)."""
        super().__init__(ctx)
        self.alerts = alerts
        self.alerts_problem = alerts_problem
        self._next_attempt: dict[str, float] = {}  # pod uid -> monotonic time of its next eviction attempt
        self._notified_blocked: set[tuple[str, str, float]] = set()  # (node, fingerprint, first seen) told once

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
        pause = self.ctx.breakers.latest_pause()  # the detect loop reloads it every cycle
        self.ctx.metrics.paused.set(1.0 if pause.paused else 0.0)
        self.ctx.metrics.domains_tripped.set(float(len(self.ctx.breakers.latest().domains)))
        super().resync()

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
        now = self.ctx.clock()
        cluster = self.ctx.policy.cluster
        name = name_of(node)
        nodes = self.ctx.nodes.gpu_nodes()
        views = [safety.node_view(n) for n in nodes]
        view = next((v for v in views if v.name == name), None) or safety.node_view(node)
        held = self._stopped(view) or self._fleet_gate(nodes, now)
        if held:
            return self._wait(node, block(record, *held, now))
        budget = safety.Budget(cluster.budget.as_budget_value())
        domains = [safety.DomainBudget(d.label, budget_value(d.max_unavailable)) for d in cluster.budget.domains]
        result = safety.budget_check(views, name, budget, domains)
        self.ctx.metrics.budget_in_use.set(float(result.in_use))
        self.ctx.metrics.budget_limit.set(float(result.limit))
        if not result.allowed:
            return self._wait(node, block(record, BLOCK_BUDGET, result.reason, now))
        if name not in safety.admit(views, [*waiting_for_budget(nodes), name], budget, domains):
            return self._wait(node, block(record, BLOCK_BUDGET, "older faults go first: " + result.reason, now))
        pods = self._blocking_pods(name)
        if pods:
            return self._wait(node, block(record, BLOCK_GATE, pods, now))
        if self.ctx.claims is not None:  # --shards: the API server decides who takes the last slot
            refused = self.ctx.claims.claim(name, lambda claimed: budget_claims.budget_refusal(
                views, name, waiting_for_budget(nodes), budget, domains, claimed))
            if refused:
                return self._wait(node, block(record, BLOCK_BUDGET, refused, now))
        scope = drain_scope(self.ctx.policy_for(node), node, record)
        started = start_action(unblock(record), DRAIN_ACTION, "", 1, now, policy.timeout_s, scope.detail)
        if self.ctx.writer.write(node, started) is None:
            return self.retry_after_conflict()
        log.info("drain started", extra={"node": name, "mode": policy.mode, "scope": scope.scope,
                                         **({"scope_why": scope.why} if scope.why else {})})
        return 0.0

    def _stopped(self, view: safety.NodeView) -> tuple[str, str] | None:
        """A pause, the circuit breaker or the node's failure-domain breaker: no new drain (the detect loop
        reloads both every cycle)."""
        pause = self.ctx.breakers.latest_pause()
        if pause.paused:
            return BLOCK_PAUSED, f"paused by {pause.by or '?'}: {pause.reason or '-'}"
        if not self.ctx.policy.cluster.breaker.enabled:
            return None
        why = self.ctx.breakers.latest().blocks(view)
        return (BLOCK_BREAKER, why) if why else None

    def _fleet_gate(self, nodes: Sequence[Node], now: float) -> tuple[str, str] | None:
        """The gates that hold every drain alike: blocking alerts firing, the settle delay."""
        cfg = self.ctx.policy.cluster.gates
        if cfg.blocking_alerts:
            firing, problem = self.alerts.firing() if self.alerts is not None else (None, self.alerts_problem)
            why = gates.blocking_alerts(firing, cfg.blocking_alerts, problem)
            if why:
                return BLOCK_GATE, why
        if cfg.settle_s > 0:
            histories = [r.history for n in nodes if isinstance(r := record_from_node(n), NodeRecord)]
            why = gates.settle_reason(gates.settle_remaining(gates.last_return(histories), now, cfg.settle_s),
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
        custom = self.ctx.policy_for(node).customDrain
        if custom.enabled and not custom_drain.fell_back(record):  # hook: a drain plugin drains (issue 5)
            return custom_drain.CustomDrain(self, custom).step(node, record, policy)
        now = self.ctx.clock()
        pods = self.targets(node, record, policy)
        if not pods:
            return self._complete(node, record, now)
        assert record.action is not None
        if record.action.deadline is not None and now >= record.action.deadline:
            return self._timed_out(node, record, pods, now, policy)
        immediate = [p for p in pods if policy.mode_of(pod_key(p)[0]) == "Immediate"]
        if immediate:  # the others (AllowCompletion, DeleteAfterTimeout) are waited for meanwhile
            return self._evict(node, record, immediate, now, policy)
        return self._note_waiting(node, record, pods, now, policy)

    def _timed_out(
        self, node: Node, record: NodeRecord, pods: Sequence[Mapping[str, Any]], now: float, policy: DrainPolicy
    ) -> float | None:
        """At the drain's timeout: pods whose mode is DeleteAfterTimeout (all of them with ``timeout_action =
        delete``) are deleted and waited for; any other pod left fails the drain (quarantine: a person decides)."""
        deletable = [p for p in pods if policy.timeout_action == "delete"
                     or policy.mode_of(pod_key(p)[0]) == "DeleteAfterTimeout"]
        self._delete(deletable, policy)
        left = [p for p in pods if p not in deletable]
        if left:
            return self._failed(node, record, left, now)
        return self._note_waiting(node, record, pods, now, policy)

    def targets(self, node: Node, record: NodeRecord, policy: DrainPolicy) -> list[Mapping[str, Any]]:
        """The pods this drain must see gone (the same set a custom drain hands to its plugin)."""
        pods = list_node_pods(self.ctx.client, name_of(node))
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

    def _evict(
        self, node: Node, record: NodeRecord, pods: Sequence[Mapping[str, Any]], now: float, policy: DrainPolicy
    ) -> float:
        grace = None if policy.grace_period_s < 0 else policy.grace_period_s
        dry = "true" if self.ctx.writer.dry_run else "false"
        blocked: eviction.EvictionOutcome | None = None
        attempted = False
        for pod in pods:
            if is_terminating(pod) or not self._attempt_due(pod, policy.retry_s):
                continue
            attempted = True
            outcome = eviction.evict(self.ctx.client, pod, dry_run=self.ctx.writer.dry_run, grace_period_seconds=grace)
            self.ctx.metrics.evictions.inc(result=outcome.result, dry_run=dry)
            log.info("eviction", extra={"node": name_of(node), "pod": f"{outcome.namespace}/{outcome.name}",
                                        "result": outcome.result, "pdb": outcome.pdb, "dry_run": dry})
            if outcome.result in (eviction.BLOCKED, eviction.FAILED) and blocked is None:
                blocked = outcome
        if not attempted:
            return policy.retry_s  # nothing new learnt: keep what the record says
        after = unblock(record)
        if blocked is not None:
            detail = f"{blocked.namespace}/{blocked.pdb}" if blocked.pdb else \
                f"{blocked.namespace}/{blocked.name}: {blocked.message}"
            after = block(record, BLOCK_PDB, detail, now)
        if after != record and self.ctx.writer.write(node, after) is None:
            return self.retry_after_conflict()
        return policy.retry_s

    def _attempt_due(self, pod: Mapping[str, Any], retry_s: float) -> bool:
        """One eviction attempt per pod per ``retry_s``, however often the node is reconciled
        (informer events, resyncs and requeues all queue it)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "/".join(pod_key(pod)))
        now = time.monotonic()
        if now < self._next_attempt.get(uid, 0.0):
            return False
        self._next_attempt = {k: t for k, t in self._next_attempt.items() if t > now}
        self._next_attempt[uid] = now + retry_s
        return True

    def _note_waiting(
        self, node: Node, record: NodeRecord, pods: Sequence[Mapping[str, Any]], now: float, policy: DrainPolicy
    ) -> float:
        log.info("drain waiting for pods to finish", extra={"node": name_of(node), "pods": len(pods)})
        return policy.retry_s

    def _delete(self, pods: Sequence[Mapping[str, Any]], policy: DrainPolicy) -> None:
        grace = None if policy.grace_period_s < 0 else policy.grace_period_s
        for pod in pods:
            if is_terminating(pod):
                continue
            namespace, name = pod_key(pod)
            with contextlib.suppress(errors.NotFound):
                self.ctx.client.delete(PODS, name, namespace, grace_period_seconds=grace,
                                       dry_run=self.ctx.writer.dry_run)

    def _failed(self, node: Node, record: NodeRecord, pods: Sequence[Mapping[str, Any]], now: float) -> float | None:
        left = ", ".join("/".join(pod_key(p)) for p in pods[:5])
        detail = f"drain timed out with {len(pods)} pod(s) left ({left})"
        if self.apply(node, decide.drain_failed(record, now, detail)) is None:
            return self.retry_after_conflict()
        self.ctx.events.node_event(name_of(node), "GPUDrainTimedOut", detail, WARNING)
        return None

    def _complete(self, node: Node, record: NodeRecord, now: float) -> float | None:
        if self.apply(node, decide.complete_drain(record, now)) is None:
            return self.retry_after_conflict()
        if record.action is not None:
            self.ctx.metrics.drain_seconds.observe(max(0.0, now - record.action.started))
        return None
