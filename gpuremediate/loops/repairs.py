"""The table of repair variants: action kind → the ``Repair`` that runs it (``loops.repair``).

The remediate loop runs the first row whose ``matches`` takes the step: the diagnostics step (once per fault,
before the first attempt), the GPU Operator reset sequence (reset-gpu on a node with operands deployed), the
built-in Jobs (reset-gpu, reboot), the replace rung (``loops.replace_step``), and last any other kind, a
custom resource (``[actions.<name>]``).

A new action is one new module (a class with ``step(ctx, node, record, request) -> StepResult``) and one row
here, above the custom row that takes any kind left; the loop is not edited.
"""

from __future__ import annotations

from gpuremediate.actions.nodes import Node
from gpuremediate.loops import custom_remediate, diagnostics, gpu_reset, repair_job, replace_step
from gpuremediate.loops.repair import RepairRow
from gpuremediate.policy.config import Policy
from gpuremediate.vocab.findings import ACTION_REBOOT, ACTION_REPLACE, ACTION_RESET_GPU
from gpuremediate.vocab.record import NodeRecord

REPAIRS: tuple[RepairRow, ...] = (
    RepairRow(diagnostics.DIAGNOSTICS, diagnostics.due_step, diagnostics.DiagnosticsStep),
    RepairRow("gpu-operator-reset", gpu_reset.applies_to, gpu_reset.GpuOperatorReset, resync=gpu_reset.resync_node),
    RepairRow(ACTION_RESET_GPU, repair_job.kind_is(ACTION_RESET_GPU), repair_job.JobRepair),
    RepairRow(ACTION_REBOOT, repair_job.kind_is(ACTION_REBOOT), repair_job.JobRepair),
    RepairRow(ACTION_REPLACE, replace_step.matches, replace_step.ReplaceRepair),
    RepairRow("custom-resource", custom_remediate.any_other, custom_remediate.CustomResourceRepair, guarded=True),
)


def select(policy: Policy, node: Node, record: NodeRecord, kind: str,
           rows: tuple[RepairRow, ...] = REPAIRS) -> RepairRow:
    """The first row that takes this step (the custom row takes any kind)."""
    return next(row for row in rows if row.matches(policy, node, record, kind))
