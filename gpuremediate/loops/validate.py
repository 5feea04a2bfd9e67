"""The validate loop: owns ``validating``. A Job pinned to the node asks for all of its
``nvidia.com/gpu`` and runs DCGM diagnostics (``dcgmi diag -r 2`` by default). Success → healthy
and uncordoned (only if we cordoned it); failure or timeout → quarantined."""

from __future__ import annotations

from gpuremediate.actions.jobs import FAILED, MISSING, SUCCEEDED, delete_job, job_outcome, read_job
from gpuremediate.actions.nodes import Node
from gpuremediate.loops.jobs import JobLoop
from gpuremediate.state import decide, states
from gpuremediate.state.record import NodeRecord

VALIDATE = "validate"


class ValidateLoop(JobLoop):
    name = "validate"
    owned = frozenset({states.VALIDATING})

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        policy = self.ctx.policy_for(node).validation
        if not policy.enabled:
            return self._finish(node, record, True, "validation disabled by policy")
        action = record.action
        if action is None or action.kind != VALIDATE or not action.name:
            return self.start_job(node, record, VALIDATE, 1, policy.job, timeout_s=policy.job.timeout_s,
                                  request_all_gpus=True)
        namespace = self.ctx.settings.jobs_namespace
        outcome = job_outcome(read_job(self.ctx.client, action.name, namespace))
        if outcome == MISSING and not self.ctx.writer.dry_run:
            self.create_job(node, record, VALIDATE, action.name, action.attempt, policy.job, True)
            return 1.0
        if outcome == SUCCEEDED:
            return self._finish(node, record, True, f"validation Job {action.name} passed")
        if outcome == FAILED:
            return self._finish(node, record, False, f"validation Job {action.name} failed")
        if action.deadline is not None and self.ctx.clock() >= action.deadline:
            delete_job(self.ctx.client, action.name, namespace)
            return self._finish(node, record, False, f"validation Job {action.name} timed out")
        return 1.0

    def _finish(self, node: Node, record: NodeRecord, ok: bool, detail: str) -> float | None:
        decision = decide.complete_validation(record, ok, self.ctx.clock(), detail)
        if self.apply(node, decision) is None:
            return self.retry_after_conflict()
        return None
