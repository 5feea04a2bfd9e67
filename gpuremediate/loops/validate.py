"""The validate loop: owns ``validating``. A Job pinned to the node asks for all of its
``nvidia.com/gpu`` and runs DCGM diagnostics (``dcgmi diag -r 2`` by default). Success → healthy
and uncordoned (only if we cordoned it); failure or timeout → quarantined."""

from __future__ import annotations

import dataclasses

from gpuremediate.actions.jobs import FAILED, SUCCEEDED
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.actions.pods import list_node_pods, never_drained, pod_key, requests_gpu
from gpuremediate.loops.jobs import DELETED, TIMED_OUT, JobLoop
from gpuremediate.policy.workflow import JobPolicy
from gpuremediate.state import decide, states
from gpuremediate.state.record import BLOCK_GPU_PODS, ActionInProgress, NodeRecord, block, occurrence

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
            busy = self.gpu_pods(node)
            if busy:
                return self._wait_for_gpus(node, record, busy)
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

    def gpu_pods(self, node: Node) -> list[str]:
        """Pods that hold GPUs on the node (a node quarantined without a drain, then released, still has
        them): the kubelet would refuse a validation Job that asks for every GPU (OutOf nvidia.com/gpu)."""
        pods = list_node_pods(self.ctx.client, name_of(node))
        return sorted("/".join(pod_key(p)) for p in pods if requests_gpu(p) and not never_drained(p))

    def _wait_for_gpus(self, node: Node, record: NodeRecord, busy: list[str]) -> float | None:
        shown = ", ".join(busy[:5]) + (f" and {len(busy) - 5} more" if len(busy) > 5 else "")
        detail = f"validation needs every GPU; still held by {shown} (drain them: kubectl drain)"
        after = block(record, BLOCK_GPU_PODS, detail, self.ctx.clock())
        if after != record and self.ctx.writer.write(node, after) is None:
            return self.retry_after_conflict()
        return self.ctx.settings.resync_s

    def _finish(
        self, node: Node, record: NodeRecord, ok: bool, detail: str, cancel: ActionInProgress | None = None
    ) -> float | None:
        decision = dataclasses.replace(decide.complete_validation(record, ok, self.ctx.clock(), detail), cancel=cancel)
        if self.apply(node, decision) is None:
            return self.retry_after_conflict()
        return None
