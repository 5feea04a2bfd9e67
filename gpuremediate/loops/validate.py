"""The validate loop: owns ``validating``. A Job pinned to the node asks for every GPU slice it has (the
capacity of each ``[gpu_resources]`` resource: ``nvidia.com/gpu``, each ``nvidia.com/mig-<profile>``) and runs
DCGM diagnostics (``dcgmi diag -r 2`` by default). Success → healthy and uncordoned (only if we cordoned it);
failure or timeout → quarantined.

Before the Job: pods still holding GPU resources are waited for (the kubelet would refuse the Job), and so is
a device plugin that reports fewer devices allocatable than the node has (after a reboot it registers again;
a device it marked unhealthy stays out). The kubelet admits no pod asking for more than allocatable, so
"every GPU" cannot be held then: past ``[gpu_resources] allocatable_wait_s`` validation fails, its message
naming the short resources — a GPU its device plugin calls unhealthy is not fit to return to service."""

from __future__ import annotations

import dataclasses

from gpuremediate.actions.jobs import FAILED, SUCCEEDED
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.actions.pods import list_node_pods, never_drained, pod_key
from gpuremediate.gpu_resources import GpuHold, GpuResourcesPolicy, requests_gpu, validation_hold
from gpuremediate.loops.jobs import DELETED, TIMED_OUT, JobLoop
from gpuremediate.policy.workflow import JobPolicy
from gpuremediate.state import decide, states
from gpuremediate.state.record import (
    BLOCK_GPU_PODS,
    BLOCK_GPU_UNAVAILABLE,
    ActionInProgress,
    Blocked,
    NodeRecord,
    block,
    occurrence,
)

VALIDATE = "validate"


class ValidateLoop(JobLoop):
    name = "validate"
    owned = frozenset({states.VALIDATING})

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        held = self.held_by_pause(node, record)
        if held is not None:
            return held
        policy = self.ctx.policy_for(node).validation
        if not policy.enabled:
            return self._finish(node, record, True, "validation disabled by policy")
        action = record.action
        if action is None or action.kind != VALIDATE or not action.name:
            gpus = self.ctx.policy_for(node).gpu_resources
            busy = self.gpu_pods(node, gpus.names)
            if busy:
                return self._wait_for_gpus(node, record, busy)
            hold = validation_hold(node, gpus.names)
            if hold.problem:
                return self._wait_for_allocatable(node, record, hold, gpus)
            return self.start_job(node, record, VALIDATE, 1, policy.job, timeout_s=policy.job.timeout_s,
                                  request_all_gpus=True)
        outcome = self.attempt_outcome(action, lambda: self._recreate(node, record, action, policy.job),
                                       lambda job: self.note_created(node, record, job))
        if outcome == SUCCEEDED:
            return self._finish(node, record, True, f"validation Job {action.name} passed")
        if outcome == FAILED:
            return self._finish(node, record, False, f"validation Job {action.name} failed")
        if outcome == DELETED:  # nothing validated the node: it waits for a person (quarantined)
            return self._finish(node, record, False, f"validation Job {action.name} was deleted before it finished")
        if outcome == TIMED_OUT:  # written first; the Job is deleted only once the record says so
            return self._finish(node, record, False, f"validation Job {action.name} timed out", cancel=action)
        return 1.0

    def fingerprint(self, record: NodeRecord) -> str:
        """Each validation run has its own Job: a node released again after a failed validation must not
        find the first run's (kept) failed Job under its name. ``since`` is when this run began (entering
        ``validating``), stable across restarts and unchanged by the run's own writes."""
        return f"{occurrence(record)}/validation@{int(record.since * 1000)}"

    def _recreate(self, node: Node, record: NodeRecord, action: ActionInProgress, job: JobPolicy) -> None:
        created = self.create_job(node, record, VALIDATE, action.name, action.attempt, job, True)
        if created is not None:
            self.note_created(node, record, created)

    def gpu_pods(self, node: Node, gpu_resources: tuple[str, ...]) -> list[str]:
        """Pods that hold GPUs or MIG slices on the node (a node quarantined without a drain, then released,
        still has them): the kubelet would refuse a validation Job that asks for every GPU (OutOf<resource>)."""
        pods = list_node_pods(self.ctx.client, name_of(node))
        return sorted("/".join(pod_key(p)) for p in pods if requests_gpu(p, gpu_resources) and not never_drained(p))

    def _wait_for_gpus(self, node: Node, record: NodeRecord, busy: list[str]) -> float | None:
        shown = ", ".join(busy[:5]) + (f" and {len(busy) - 5} more" if len(busy) > 5 else "")
        detail = f"validation needs every GPU; still held by {shown} (drain them: kubectl drain)"
        after = block(record, BLOCK_GPU_PODS, detail, self.ctx.clock())
        if after != record and self.ctx.writer.write(node, after) is None:
            return self.retry_after_conflict()
        return self.ctx.settings.resync_s

    def _wait_for_allocatable(
        self, node: Node, record: NodeRecord, hold: GpuHold, gpus: GpuResourcesPolicy
    ) -> float | None:
        """The device plugin does not offer every GPU: wait (blocked, the wait timed from ``blocked.since``, so
        a restart resumes it) up to ``allocatable_wait_s``, then fail: no Job could hold every GPU."""
        now = self.ctx.clock()
        current = record.blocked
        # Timed from the first wait, whatever the counts say since (a device plugin that flaps changes the text).
        since = current.since if current is not None and current.reason == BLOCK_GPU_UNAVAILABLE else now
        after = dataclasses.replace(record, blocked=Blocked(BLOCK_GPU_UNAVAILABLE,
                                                            f"validation needs every GPU; {hold.problem}", since))
        waited = now - since
        if waited >= gpus.allocatable_wait_s:
            detail = (f"validation cannot hold every GPU: {hold.problem} (waited {waited:.0f}s); a person checks "
                      "the device plugin's log and the GPUs before releasing the node")
            return self._finish(node, record, False, detail)
        if after != record and self.ctx.writer.write(node, after) is None:
            return self.retry_after_conflict()
        return min(self.ctx.settings.resync_s, max(0.1, gpus.allocatable_wait_s - waited))

    def _finish(
        self, node: Node, record: NodeRecord, ok: bool, detail: str, cancel: ActionInProgress | None = None
    ) -> float | None:
        decision = dataclasses.replace(decide.complete_validation(record, ok, self.ctx.clock(), detail), cancel=cancel)
        if self.apply(node, decision) is None:
            return self.retry_after_conflict()
        return None
