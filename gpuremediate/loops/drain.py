"""The drain loop: owns ``draining``. A resumable step per reconcile, never one blocking call.

First the node waits for the budget (and a closed circuit breaker); once admitted, the drain
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

from gpuremediate.actions import evict as eviction
from gpuremediate.actions.events import WARNING
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.actions.pods import SCOPE_GPU, SCOPE_IMPACTED, is_terminating, list_node_pods, pod_key, pods_to_drain
from gpuremediate.kube import errors
from gpuremediate.kube.resources import PODS
from gpuremediate.loops import custom_drain
from gpuremediate.loops.base import LoopContext, NodeLoop
from gpuremediate.policy import safety
from gpuremediate.policy.workflow import DrainPolicy
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


def waiting_for_budget(nodes: Sequence[Node]) -> list[str]:
    """The nodes cordoned for a fault whose drain has not started: they are admitted oldest fault first."""
    waiting = []
    for node in nodes:
        record = record_from_node(node)
        if isinstance(record, NodeRecord) and safety.is_waiting(record):
            waiting.append(name_of(node))
    return waiting


class DrainLoop(NodeLoop):
    name = "drain"
    owned = frozenset({states.DRAINING})

    def __init__(self, ctx: LoopContext) -> None:
        super().__init__(ctx)
        self._next_attempt: dict[str, float] = {}  # pod uid -> monotonic time of its next eviction attempt

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        policy = self.ctx.policy_for(node).drain
        if record.action is None or record.action.kind != DRAIN_ACTION:
            return self._admit(node, record, policy)
        return self._step(node, record, policy)

    # ---- admission ---------------------------------------------------------------------------------

    def _admit(self, node: Node, record: NodeRecord, policy: DrainPolicy) -> float | None:
        now = self.ctx.clock()
        cluster = self.ctx.policy.cluster
        name = name_of(node)
        if cluster.breaker.enabled and self._breaker_open():
            return self._wait(node, block(record, BLOCK_BREAKER, "circuit breaker open: no new work", now))
        nodes = self.ctx.nodes.gpu_nodes()
        views = [safety.node_view(n) for n in nodes]
        budget = safety.Budget(cluster.budget.as_budget_value())
        result = safety.budget_check(views, name, budget)
        self.ctx.metrics.budget_in_use.set(float(result.in_use))
        self.ctx.metrics.budget_limit.set(float(result.limit))
        if not result.allowed:
            return self._wait(node, block(record, BLOCK_BUDGET, result.reason, now))
        if name not in safety.admit(views, [*waiting_for_budget(nodes), name], budget):
            return self._wait(node, block(record, BLOCK_BUDGET, "older faults go first: " + result.reason, now))
        started = start_action(unblock(record), DRAIN_ACTION, "", 1, now, policy.timeout_s)
        if self.ctx.writer.write(node, started) is None:
            return self.retry_after_conflict()
        log.info("drain started", extra={"node": name, "mode": policy.mode, "scope": policy.scope})
        return 0.0

    def _breaker_open(self) -> bool:
        return self.ctx.breakers.latest().is_open  # the detect loop reloads it every cycle

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
        timed_out = record.action.deadline is not None and now >= record.action.deadline
        if policy.mode == "DeleteAfterTimeout" or (timed_out and policy.timeout_action == "delete"):
            if timed_out:
                self._delete(pods, policy)
            return self._note_waiting(node, record, pods, now, policy)
        if timed_out:
            return self._failed(node, record, pods, now)
        if policy.mode == "AllowCompletion":
            return self._note_waiting(node, record, pods, now, policy)
        return self._evict(node, record, pods, now, policy)

    def targets(self, node: Node, record: NodeRecord, policy: DrainPolicy) -> list[Mapping[str, Any]]:
        """The pods this drain must see gone (the same set a custom drain hands to its plugin)."""
        pods = list_node_pods(self.ctx.client, name_of(node))
        scope, impacted = policy.scope, self._impacted(name_of(node), record)
        if scope == SCOPE_IMPACTED and impacted is None:
            scope = SCOPE_GPU  # the exporter maps no pods to GPUs here: every GPU pod may be on the faulty GPU
        return pods_to_drain(pods, scope, impacted or ())

    def _impacted(self, node: str, record: NodeRecord) -> set[tuple[str, str]] | None:
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
