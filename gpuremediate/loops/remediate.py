"""The remediate loop: owns ``repairing``. Built-in actions run as Jobs on the node:

- ``reset-gpu``: done when its Job succeeds;
- ``reboot``: done when the node's ``status.nodeInfo.bootID`` differs from the one recorded before
  the reboot and the node is Ready again (or, with ``reboot_wait_for_boot_id = false``, when the
  Job succeeds — for simulated nodes that cannot really reboot).

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

from gpuremediate.actions.events import WARNING
from gpuremediate.actions.jobs import FAILED, SUCCEEDED
from gpuremediate.actions.nodes import Node, boot_id, is_ready, name_of
from gpuremediate.loops import custom_remediate, diagnostics, gpu_reset
from gpuremediate.loops.base import LoopContext
from gpuremediate.loops.jobs import DELETED, TIMED_OUT, JobLoop
from gpuremediate.policy.findings import ACTION_REBOOT, ACTION_RESET_GPU
from gpuremediate.policy.workflow import JobPolicy, RemediationPolicy, Rung
from gpuremediate.state import decide, states
from gpuremediate.state.record import ActionInProgress, NodeRecord

log = logging.getLogger(__name__)

BUILTIN_REPAIRS = (ACTION_RESET_GPU, ACTION_REBOOT)


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
        policy = self.ctx.policy_for(node).remediation
        if diagnostics.due(policy.diagnostics, record):
            return diagnostics.DiagnosticsJob(self).step(node, record, policy.diagnostics)
        index, ladder = current_rung(policy, record)
        rung = ladder[index]
        kind = attempt_kind(record, rung)
        if kind not in BUILTIN_REPAIRS:
            return self.custom(node, record, kind, rung)
        job_policy = policy.reset_gpu if kind == ACTION_RESET_GPU else policy.reboot
        if rung.timeout_s:
            job_policy = dataclasses.replace(job_policy, timeout_s=rung.timeout_s)
        attempts = policy.attempts_of(rung, self.ctx.policy.cluster.actions)
        if kind == ACTION_RESET_GPU and gpu_reset.applies(self.ctx.policy_for(node), node, record):
            return gpu_reset.GpuResetSequence(self, job_policy, attempts).step(node, record)  # GPU Operator node
        action = record.action
        if action is None or not action.name:
            attempt = action.attempt if action else 1
            timeout = job_policy.timeout_s + (policy.reboot_ready_timeout_s if kind == ACTION_REBOOT else 0.0)
            detail = boot_id(node) if kind == ACTION_REBOOT else ""
            return self.start_job(node, record, kind, attempt, job_policy, timeout_s=timeout, detail=detail)
        return self._progress(node, record, action, kind, policy, job_policy, attempts)

    def resync(self) -> None:
        """Queue the nodes in repairing; put back the operand labels of reset sequences that no longer run (the
        node left repairing some other way): nothing else would, and a node without its device plugin serves
        no GPU. In this loop's thread, so never beside a sequence's own step."""
        super().resync()
        for node in self.ctx.owned_gpu_nodes():
            why = gpu_reset.abandoned(node)
            if why:
                gpu_reset.restore_abandoned(self.ctx, node, why, self._unreadable_operands)

    def custom(self, node: Node, record: NodeRecord, kind: str, rung: Rung | None = None) -> float | None:
        """A custom remediation action (``actions.<name>``): a plugin's resource (issue 5 hook), with the rung's
        attempts and timeout where it sets them."""
        return custom_remediate.CustomRemediation(self, rung).step(node, record, kind)

    def _progress(
        self, node: Node, record: NodeRecord, action: ActionInProgress, kind: str,
        policy: RemediationPolicy, job_policy: JobPolicy, attempts: int,
    ) -> float | None:
        outcome = self.attempt_outcome(action, lambda: self._recreate(node, record, kind, action, job_policy),
                                       lambda job: self.note_created(node, record, job))
        done = outcome == SUCCEEDED
        by_boot_id = kind == ACTION_REBOOT and policy.reboot_wait_for_boot_id
        rebooted = bool(action.detail) and boot_id(node) != action.detail
        if by_boot_id:
            done = rebooted and is_ready(node)
        if done:
            return self.finish_attempt(node, record, ok=True, detail=f"{kind} done ({action.name})",
                                max_attempts=attempts)
        # The reboot kills the Job's own pod (restartPolicy Never): the kubelet marks it Failed once it is back,
        # or the Job hits its activeDeadlineSeconds while the node is down. Until the record's deadline, only a
        # node that neither rebooted nor went down makes a failed reboot Job a failed attempt.
        before_deadline = action.deadline is None or self.ctx.clock() < action.deadline
        if by_boot_id and before_deadline and (rebooted or not is_ready(node)) and outcome in (FAILED, TIMED_OUT,
                                                                                                DELETED):
            return 1.0
        if outcome == DELETED:  # someone stopped this attempt: it failed, the next one gets a new Job
            return self.finish_attempt(node, record, ok=False, max_attempts=attempts,
                                       detail=f"{kind} Job {action.name} was deleted before it finished")
        if outcome == FAILED:
            return self.finish_attempt(node, record, ok=False, detail=f"{kind} Job {action.name} failed",
                                max_attempts=attempts)
        if outcome == TIMED_OUT:  # written first; the Job is deleted only once the record says so
            return self.finish_attempt(node, record, ok=False, detail=f"{kind} attempt {action.attempt} timed out",
                                max_attempts=attempts, cancel=action)
        return 1.0

    def _recreate(self, node: Node, record: NodeRecord, kind: str, action: ActionInProgress, job: JobPolicy) -> None:
        created = self.create_job(node, record, kind, action.name, action.attempt, job, False)
        if created is not None:
            self.note_created(node, record, created)

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
