"""The remediate loop: owns ``repairing``. Built-in actions run as Jobs on the node:

- ``reset-gpu``: done when its Job succeeds;
- ``reboot``: done when the node's ``status.nodeInfo.bootID`` differs from the one recorded before
  the reboot and the node is Ready again (or, with ``reboot_wait_for_boot_id = false``, when the
  Job succeeds — for simulated nodes that cannot really reboot).

A failed or timed-out attempt is followed by a new attempt (a new Job name) up to
``remediation.max_attempts``; then the node is quarantined.
"""

from __future__ import annotations

import dataclasses
import logging

from gpuremediate.actions.events import WARNING
from gpuremediate.actions.jobs import FAILED, SUCCEEDED
from gpuremediate.actions.nodes import Node, boot_id, is_ready, name_of
from gpuremediate.loops import custom_remediate
from gpuremediate.loops.jobs import DELETED, TIMED_OUT, JobLoop
from gpuremediate.policy.findings import ACTION_REBOOT, ACTION_RESET_GPU
from gpuremediate.policy.workflow import JobPolicy, RemediationPolicy
from gpuremediate.state import decide, states
from gpuremediate.state.record import ActionInProgress, NodeRecord

log = logging.getLogger(__name__)

BUILTIN_REPAIRS = (ACTION_RESET_GPU, ACTION_REBOOT)


class RemediateLoop(JobLoop):
    name = "remediate"
    owned = frozenset({states.REPAIRING})

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        held = self.held_by_pause(node, record)
        if held is not None:
            return held
        policy = self.ctx.policy_for(node).remediation
        kind = record.fault.action if record.fault else ""
        if kind not in BUILTIN_REPAIRS:
            return self.custom(node, record, kind)
        job_policy = policy.reset_gpu if kind == ACTION_RESET_GPU else policy.reboot
        action = record.action
        if action is None or not action.name:
            attempt = action.attempt if action else 1
            timeout = job_policy.timeout_s + (policy.reboot_ready_timeout_s if kind == ACTION_REBOOT else 0.0)
            detail = boot_id(node) if kind == ACTION_REBOOT else ""
            return self.start_job(node, record, kind, attempt, job_policy, timeout_s=timeout, detail=detail)
        return self._progress(node, record, action, kind, policy, job_policy)

    def custom(self, node: Node, record: NodeRecord, kind: str) -> float | None:
        """A custom remediation action (``actions.<name>``): a plugin's resource (issue 5 hook)."""
        return custom_remediate.CustomRemediation(self).step(node, record, kind)

    def _progress(
        self, node: Node, record: NodeRecord, action: ActionInProgress, kind: str,
        policy: RemediationPolicy, job_policy: JobPolicy,
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
                                max_attempts=policy.max_attempts)
        # The reboot kills the Job's own pod (restartPolicy Never): the kubelet marks it Failed once it is back,
        # or the Job hits its activeDeadlineSeconds while the node is down. Until the record's deadline, only a
        # node that neither rebooted nor went down makes a failed reboot Job a failed attempt.
        before_deadline = action.deadline is None or self.ctx.clock() < action.deadline
        if by_boot_id and before_deadline and (rebooted or not is_ready(node)) and outcome in (FAILED, TIMED_OUT,
                                                                                                DELETED):
            return 1.0
        if outcome == DELETED:  # someone stopped this attempt: it failed, the next one gets a new Job
            return self.finish_attempt(node, record, ok=False, max_attempts=policy.max_attempts,
                                       detail=f"{kind} Job {action.name} was deleted before it finished")
        if outcome == FAILED:
            return self.finish_attempt(node, record, ok=False, detail=f"{kind} Job {action.name} failed",
                                max_attempts=policy.max_attempts)
        if outcome == TIMED_OUT:  # written first; the Job is deleted only once the record says so
            return self.finish_attempt(node, record, ok=False, detail=f"{kind} attempt {action.attempt} timed out",
                                max_attempts=policy.max_attempts, cancel=action)
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
        decision = dataclasses.replace(decide.complete_repair(record, ok, now, max_attempts, detail), cancel=cancel)
        if self.apply(node, decision) is None:  # a 409 decides again: nothing below may have happened yet
            return self.retry_after_conflict()
        if record.action is not None:
            self.ctx.metrics.remediation_seconds.observe(max(0.0, now - record.action.started),
                                                         action=record.action.kind)
        if not ok:
            self.ctx.events.node_event(name_of(node), "GPURemediationFailed", detail, WARNING)
            log.warning("repair attempt failed", extra={"node": name_of(node), "detail": detail})
        return 0.0 if decision.record.state == states.REPAIRING else None
