"""The built-in repairs, each a Job on the node (``loops.jobs``: its name in the record before the create):

- ``reset-gpu``: done when its Job succeeds;
- ``reboot``: done when the node's ``status.nodeInfo.bootID`` differs from the one recorded before the reboot
  and the node is Ready again (or, with ``reboot_wait_for_boot_id = false``, when the Job succeeds — for
  simulated nodes that cannot really reboot).

A failed, deleted or timed-out Job is a failed attempt; the remediate loop decides what follows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuremediate.actions.custom import label_value
from gpuremediate.actions.jobs import FAILED, JOB_LABEL, NODE_LABEL, RUNNING, SUCCEEDED
from gpuremediate.actions.nodes import Node, boot_id, is_ready, name_of
from gpuremediate.kube.resources import PODS
from gpuremediate.loops.jobs import DELETED, TIMED_OUT
from gpuremediate.loops.repair import RepairContext, RepairRequest
from gpuremediate.loops.step import Done, Failed, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.workflow import JobPolicy
from gpuremediate.vocab.findings import ACTION_REBOOT, ACTION_RESET_GPU
from gpuremediate.vocab.record import ActionInProgress, NodeRecord

POLL_S = 1.0

log = logging.getLogger(__name__)


def kind_is(kind: str) -> Callable[[Policy, Node, NodeRecord, str], bool]:
    """A table row's ``matches``: the step's action kind is ``kind``."""
    def matches(policy: Policy, node: Node, record: NodeRecord, step_kind: str) -> bool:
        return step_kind == kind
    return matches


class JobRepair:
    """The ``Repair`` for a built-in Job action (``reset-gpu``, ``reboot``)."""

    def step(self, ctx: RepairContext, node: Node, record: NodeRecord, request: RepairRequest) -> StepResult:
        kind, policy = request.kind, request.remediation
        job_policy = policy.reset_gpu if kind == ACTION_RESET_GPU else policy.reboot
        if request.rung.timeout_s:
            job_policy = dataclasses.replace(job_policy, timeout_s=request.rung.timeout_s)
        action = record.action
        if action is None or not action.name:
            attempt = action.attempt if action else 1
            timeout = job_policy.timeout_s + (policy.reboot_ready_timeout_s if kind == ACTION_REBOOT else 0.0)
            detail = boot_id(node) if kind == ACTION_REBOOT else ""
            return InProgress(ctx.jobs.start_job(node, record, kind, attempt, job_policy, timeout_s=timeout,
                                                 detail=detail))
        return self._progress(ctx, node, record, action, request, job_policy)

    def _progress(
        self, ctx: RepairContext, node: Node, record: NodeRecord, action: ActionInProgress, request: RepairRequest,
        job_policy: JobPolicy,
    ) -> StepResult:
        kind = request.kind
        outcome = ctx.jobs.attempt_outcome(action, lambda: self._recreate(ctx, node, record, kind, action, job_policy),
                                           lambda job: ctx.jobs.note_created(node, record, job))
        done = outcome == SUCCEEDED
        by_boot_id = kind == ACTION_REBOOT and request.remediation.reboot_wait_for_boot_id
        rebooted = bool(action.detail) and boot_id(node) != action.detail
        if by_boot_id:
            done = rebooted and is_ready(node)
        if done and outcome == RUNNING:  # the Job's status lags, or the node rebooted on its own before it ran
            return self._end_unneeded(ctx, node, action)
        if done:
            return Done(f"{kind} done ({action.name})")
        # The reboot kills the Job's own pod (restartPolicy Never): the kubelet marks it Failed once it is back,
        # or the Job hits its activeDeadlineSeconds while the node is down. Until the record's deadline, only a
        # node that neither rebooted nor went down makes a failed reboot Job a failed attempt.
        before_deadline = action.deadline is None or ctx.clock() < action.deadline
        if by_boot_id and before_deadline and (rebooted or not is_ready(node)) and outcome in (FAILED, TIMED_OUT,
                                                                                                DELETED):
            return InProgress(POLL_S)
        if outcome == DELETED:  # someone stopped this attempt: it failed, the next one gets a new Job
            return Failed(f"{kind} Job {action.name} was deleted before it finished")
        if outcome == FAILED:
            return Failed(f"{kind} Job {action.name} failed")
        if outcome == TIMED_OUT:  # written first; the Job is deleted only once the record says so
            return Failed(f"{kind} attempt {action.attempt} timed out", cancel=action)
        return InProgress(POLL_S)

    @staticmethod
    def _end_unneeded(ctx: RepairContext, node: Node, action: ActionInProgress) -> StepResult:
        """The node has the new boot the attempt waits for, but its Job has not finished. Either its pod ran (the
        reboot is the Job's: a real Job's status follows its pods a second or more later, SyncJobBatchPeriod) and
        the attempt is done, or no pod of it has started (a watchdog, a person or the BMC rebooted the machine while
        the pod was pending or pulling its image): then the attempt is over only once the Job and its pods are
        gone, else that pod reboots the node back in service. Foreground deletion: the Job goes after its pods."""
        job = ctx.jobs.read(action.name) if action.name else None
        if job is None:
            return InProgress(POLL_S)
        meta = job.get("metadata") or {}
        pods = ctx.client.list(PODS, meta.get("namespace"), label_selector=f"{JOB_LABEL}={ACTION_REBOOT},"
                               f"{NODE_LABEL}={label_value(name_of(node))}")["items"]
        own = [p for p in pods if any(ref.get("uid") == meta.get("uid")
                                      for ref in (p.get("metadata") or {}).get("ownerReferences") or [])]
        if any(started(p) for p in own):
            return Done(f"{ACTION_REBOOT} done ({action.name})")
        if not meta.get("deletionTimestamp"):
            log.info("node rebooted before its reboot Job's pod started; deleting the Job", extra={"job": action.name})
            ctx.jobs.cancel(ACTION_REBOOT, action.name, with_pods=True)
        return InProgress(POLL_S)

    @staticmethod
    def _recreate(ctx: RepairContext, node: Node, record: NodeRecord, kind: str, action: ActionInProgress,
                  job: JobPolicy) -> None:
        created = ctx.jobs.create_job(node, record, kind, action.name, action.attempt, job, False)
        if created is not None:
            ctx.jobs.note_created(node, record, created)


def started(pod: Mapping[str, Any]) -> bool:
    """A container of the pod ran (or the pod ended): a pod still pulling its image or waiting has not."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    return any((c.get("state") or {}).keys() & {"running", "terminated"} for c in status.get("containerStatuses") or [])
