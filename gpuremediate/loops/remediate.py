"""The remediate loop: owns ``repairing``. Each step runs one repair variant (``loops.repair``), picked from the
table in ``loops.repairs`` by the step's action kind: built-in Jobs (``reset-gpu``, ``reboot``: ``loops.repair_job``),
the GPU Operator reset sequence (``loops.gpu_reset``), a custom resource (``loops.custom_remediate``), the
diagnostics step (``loops.diagnostics``). The variant returns in progress, done or failed; this loop owns what
follows.

A failed or timed-out attempt is followed by a new attempt (a new Job name) up to
``remediation.max_attempts``; then the node is quarantined.

Escalation (``[remediation.ladders]``): the fault's recommended action picks a ladder of rungs, each a repair
action (built-in Job or custom resource) with its attempts and timeout; when a rung's attempts are spent the
next rung runs (``GPURemediationEscalated``, ``escalations_total``), after the last the node is quarantined.
Without a ladder the action is its own only rung: ``max_attempts``, then quarantine. The record holds the
rung's index (``action.rung``); a policy reload mid-flow keeps that index, clamped to the new ladder's last
rung, and an attempt in flight finishes as the action it was started as.

Diagnostics (``[remediation.diagnostics]``): once per fault, before the first rung's first attempt
(``loops.diagnostics``); its outcome never blocks the repair.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from gpuremediate.actions.events import WARNING
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.loops.base import LoopContext, LoopView
from gpuremediate.loops.jobs import JobLoop
from gpuremediate.loops.repair import JobActions, RepairRequest
from gpuremediate.loops.repairs import REPAIRS, select
from gpuremediate.loops.step import Done, InProgress, StepResult
from gpuremediate.policy.workflow import CustomAction, RemediationPolicy, Rung
from gpuremediate.signals.model import NodeReadings
from gpuremediate.state import decide
from gpuremediate.vocab import states
from gpuremediate.vocab.record import ActionInProgress, NodeRecord

log = logging.getLogger(__name__)

def current_rung(policy: RemediationPolicy, record: NodeRecord) -> tuple[int, tuple[Rung, ...]]:
    """(index of the current rung, the ladder) for the open fault; the index is clamped to the ladder's last rung
    (a reload may have shortened the ladder mid-flow)."""
    ladder = policy.ladder_for(record.fault.action if record.fault else "")
    index = record.action.rung if record.action is not None else 0
    return min(index, len(ladder) - 1), ladder


def attempt_kind(record: NodeRecord, rung: Rung) -> str:
    """The action to run: an attempt in flight (its object named) finishes as the action it was started as."""
    action = record.action
    return action.kind if action is not None and action.name else rung.action


class RemediateLoop(JobLoop):
    name = "remediate"
    owned = frozenset({states.REPAIRING})

    def __init__(self, ctx: LoopContext) -> None:
        super().__init__(ctx)
        self._unreadable_operands: set[str] = set()  # nodes whose operand annotation was said unreadable

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        held = self.held_by_pause(node, record)
        if held is not None:
            return held
        policy = self.ctx.policy_for(node)
        index, ladder = current_rung(policy.remediation, record)
        rung = ladder[index]
        kind = attempt_kind(record, rung)
        attempts = policy.remediation.attempts_of(rung, self.ctx.policy.cluster.actions)
        request = RepairRequest(kind=kind, rung=rung, attempts=attempts, remediation=policy.remediation)
        row = select(policy, node, record, kind)
        view = RepairView(self, policy)

        def step() -> float | None:
            return self._outcome(node, record, request, row.make().step(view, node, record, request))
        return self.guarded_step(node, record, step) if row.guarded else step()

    def _outcome(self, node: Node, record: NodeRecord, request: RepairRequest, result: StepResult) -> float | None:
        """What a variant's step leads to: a requeue, or the attempt's end (written here, never by the variant)."""
        if isinstance(result, InProgress):
            return result.requeue_s
        at_node, at_record = result.written or (node, record)
        attempts = result.max_attempts if result.max_attempts is not None else request.attempts
        if isinstance(result, Done):
            return self.finish_attempt(at_node, at_record, ok=True, detail=result.detail, max_attempts=attempts)
        return self.finish_attempt(at_node, at_record, ok=False, detail=result.reason, max_attempts=attempts,
                                   cancel=result.cancel)

    def resync(self) -> None:
        """Queue the nodes in repairing; run the variants' resync hooks per owned node (the GPU Operator reset puts
        back the operand labels of sequences that no longer run: the node left repairing some other way, nothing
        else would, and a node without its device plugin serves no GPU). In this loop's thread, so never beside a
        variant's own step."""
        super().resync()
        hooks = [row.resync for row in REPAIRS if row.resync is not None]
        for node in self.ctx.owned_gpu_nodes():
            for hook in hooks:
                hook(self.ctx, node, self._unreadable_operands)

    def finish_attempt(
        self, node: Node, record: NodeRecord, *, ok: bool, detail: str, max_attempts: int,
        cancel: ActionInProgress | None = None,
    ) -> float | None:
        """An attempt ended (built-in or custom): the next attempt, validation, or quarantine."""
        now = self.ctx.clock()
        index, ladder = current_rung(self.ctx.policy_for(node).remediation, record)
        next_action = ladder[index + 1].action if index + 1 < len(ladder) else None
        decision = dataclasses.replace(decide.complete_repair(record, ok, now, max_attempts, detail, next_action),
                                       cancel=cancel)
        if self.apply(node, decision) is None:  # a 409 decides again: nothing below may have happened yet
            return self.retry_after_conflict()
        if record.action is not None:
            self.ctx.metrics.remediation_seconds.observe(max(0.0, now - record.action.started),
                                                         action=record.action.kind)
        if not ok:
            self.ctx.events.node_event(name_of(node), "GPURemediationFailed", detail, WARNING)
            log.warning("repair attempt failed", extra={"node": name_of(node), "detail": detail})
        if decision.escalation is not None:
            self._report_escalation(node, decision.escalation, len(ladder))
        return 0.0 if decision.record.state == states.REPAIRING else None

    def _report_escalation(self, node: Node, move: decide.Escalation, rungs: int) -> None:
        text = f"rung {move.to_rung + 1}/{rungs} {move.to_action}: {move.message}"
        self.ctx.events.node_event(name_of(node), "GPURemediationEscalated", text, WARNING)
        self.ctx.metrics.escalations.inc(1.0, **{"from": move.from_action, "to": move.to_action})
        log.warning("repair escalated", extra={"node": name_of(node), "detail": text})


class RepairView(LoopView):
    """The narrow context a repair variant gets (``loops.repair.RepairContext``): the shared part, with this loop
    as its Job actions, the latest readings and the cluster's custom actions."""

    _loop: RemediateLoop

    @property
    def jobs(self) -> JobActions:
        return self._loop

    @property
    def readings(self) -> Mapping[str, NodeReadings]:
        return self._ctx.readings

    @property
    def actions(self) -> Mapping[str, CustomAction]:
        return self._ctx.policy.cluster.actions

    @property
    def namespace(self) -> str:
        return self._ctx.settings.namespace

    @property
    def resync_s(self) -> float:
        return self._ctx.settings.resync_s

    def breaker_open(self) -> bool:
        return self._ctx.breakers.latest().is_open
