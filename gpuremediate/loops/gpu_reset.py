"""``reset-gpu`` on a GPU Operator node: the operands off, the reset, the operands back (issue 13, part 2).

Why: on a node the NVIDIA GPU Operator serves, the device plugin, DCGM (nv-hostengine), dcgm-exporter and GPU
Feature Discovery keep the GPUs open, and persistence mode counts as a client too, so a bare
``nvidia-smi --gpu-reset`` is refused: "In use by another client". NVSentinel's janitor (GPUReset controller)
does what the GPU Operator team advises: it sets the operands' node labels ``nvidia.com/gpu.deploy.<operand>``
to ``"false"`` (each operand DaemonSet's nodeSelector wants ``"true"``), waits for their pods to go, runs a
privileged reset Job on the node (persistence mode off where it is on, ``nvidia-smi --gpu-reset -i <ids>``, a
health check, persistence back on), and then, whatever the Job's outcome, puts the labels back and waits for
the operands to be ready again. References:

- NVSentinel ADR-019 "Janitor Support for GPU Reset" and ADR-020 "NVSentinel Support for GPU Reset"
  (github.com/NVIDIA/NVSentinel, docs/design), its registry of operands and their labels
  (janitor/pkg/gpuservices/manager.go: device-plugin, dcgm, dcgm-exporter, gpu-feature-discovery; teardown
  timeout 5 min, restore timeout 10 min) and its reset script (gpu-reset/gpu_reset.sh: "Persistence mode counts
  as an attachment to the device, so nvidia-smi --gpu-reset is refused with 'In use by another client'").
- The operand DaemonSets' ``nodeSelector: nvidia.com/gpu.deploy.<operand>: "true"`` (github.com/NVIDIA/
  gpu-operator, assets/state-*/); the operator's own driver upgrade pauses operands the same way
  (value ``paused-for-driver-upgrade``), which is why only labels holding ``"true"`` are ours to change.
- nvidia-smi(1), ``-r/--gpu-reset``: no process may use the GPU; from Ampere on, NVLink-connected GPUs can be
  reset one by one (Ampere NVSwitch systems need Fabric Manager, Hopper and later NVSwitch systems do not);
  before Ampere every GPU of an NVLink group is reset in the same command — hence ``[gpu_operator] scope``.

The steps, each written into the record (``ActionInProgress.step``, ``step_since``; the step's deadline is the
action's ``deadline``) before anything it leads to happens, so a restart resumes where the record says:

1. operands off: ONE guarded merge patch sets the deployed operands' labels to ``off_value``, saves their values
   in ``gpuremediate.io/operand-labels`` (``actions.operands``) and writes the record (Job name, step
   ``operands-gone``). A 409 changed nothing: the next step reads the node again and decides again.
2. ``operands-gone``: until no pod of those operands is left on the node; past ``gone_timeout_s`` → failed.
3. ``reset``: the record says so first, then the Job is created (lookup before create, ``loops.jobs`` order),
   then noted as created. Its outcome as for the bare reset (failed, deleted, timed out → failed).
4. restore: ONE patch puts back the labels that still hold our value (a label someone changed since is left
   as it is), removes the annotation and writes the record (``operands-back``, or ``failed`` with the reason).
5. ``operands-back``: every operand whose label is ``"true"`` has a Ready pod on the node and the exporter's
   readings are newer than the restore; then the attempt succeeded (validation next). Past
   ``back_timeout_s`` → the attempt failed.
6. ``failed``: the labels are back already (the restore and ``failed`` land together): the attempt fails, then
   the next attempt or quarantine, as ``[remediation] max_attempts`` says. A node never stays with its device
   plugin off because an attempt failed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.jobs import FAILED, SUCCEEDED, job_name
from gpuremediate.actions.nodes import (
    EXCLUDE_LABEL,
    GPU_COUNT_LABEL,
    GPU_RESOURCE,
    Node,
    is_excluded,
    is_ready,
    labels_of,
    name_of,
)
from gpuremediate.actions.operands import (
    OPERAND_ANNOTATION,
    OperandAnnotationError,
    SavedLabels,
    off_patch,
    restore_patch,
    saved_labels,
    write_node,
)
from gpuremediate.actions.pods import list_node_pods
from gpuremediate.loops.jobs import DELETED, TIMED_OUT
from gpuremediate.loops.repair import RepairContext, RepairRequest, WritesNodes
from gpuremediate.loops.step import CONFLICT, Done, Failed, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.gpu_operator import SCOPE_NODE, GpuOperatorPolicy
from gpuremediate.policy.workflow import JobPolicy
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_RESET_GPU
from gpuremediate.vocab.record import (
    MAX_TIMESTAMP,
    ActionInProgress,
    NodeRecord,
    RecordError,
    record_from_node,
    start_action,
)

log = logging.getLogger(__name__)

STEP_GONE = "operands-gone"
STEP_RESET = "reset"
STEP_BACK = "operands-back"
STEP_FAILED = "failed"
STEPS = (STEP_GONE, STEP_RESET, STEP_BACK, STEP_FAILED)
POLL_S = 1.0
MAX_NODE_GPUS = 64  # more than any node has (an HGX board has 8, a GB200 NVL72 tray 4)
RUNNING_PREFIX = "running="  # action.detail during the sequence: the operands that had a pod when taken off


def applies(policy: Policy, node: Node, record: NodeRecord) -> bool:
    """Whether this reset-gpu step belongs to the sequence: one under way (the record has a step), or a new
    attempt on a node with an operand deployed. A bare reset Job already under way goes on as it is."""
    action = record.action
    if action is not None and action.step:
        return True
    if action is not None and action.name:
        return False
    return policy.gpu_operator.applies(labels_of(node))


def abandoned(node: Node) -> str:
    """Why operand labels we took off (the annotation is on the node) have no sequence left to put them back
    ("" when one is under way, or nothing is off). The labels go off and come back in the same patches that
    move the step into and out of operands-gone/reset, so the annotation outside those steps means the node
    left the sequence some other way: a person uncordoned or released it, deleted the record, or excluded it."""
    if OPERAND_ANNOTATION not in ((node.get("metadata") or {}).get("annotations") or {}):
        return ""
    if is_excluded(node):
        return f"the node is excluded ({EXCLUDE_LABEL}=true)"
    record = record_from_node(node)
    if isinstance(record, RecordError):
        return ""  # the malformed record is handled first (decide.on_malformed); its next state decides
    if record is None:
        return "the node has no record any more"
    action = record.action
    if record.state == states.REPAIRING and action is not None and action.kind == ACTION_RESET_GPU \
            and action.step in (STEP_GONE, STEP_RESET):
        return ""
    return f"the node is {record.state} ({record.reason or '-'}), not in a reset"


def resync_node(ctx: WritesNodes, node: Node, said: set[str]) -> Node | None:
    """The remediate loop's resync hook: put back the operand labels of a sequence that no longer runs."""
    why = abandoned(node)
    return restore_abandoned(ctx, node, why, said) if why else None


def restore_abandoned(ctx: WritesNodes, node: Node, why: str, said: set[str]) -> Node | None:
    """Put back the labels of a sequence that no longer runs (only those still holding our value), drop the
    annotation; the record is left as it is. None on a 409, or on an unreadable annotation: which labels were
    ours is unknown, so none is touched (said once per node in ``said``)."""
    try:
        saved = saved_labels(node)
    except OperandAnnotationError as exc:
        if name_of(node) not in said:
            said.add(name_of(node))
            ctx.events.node_event(name_of(node), "GPUOperandsUnknown",
                                  f"{exc}; {why}: put back by hand the operand labels that were on", WARNING)
        return None
    restore = restore_patch(node, None, saved)
    written = write_node(ctx.writer, node, restore.patch)
    if written is not None:
        text = f"put back {', '.join(restore.restored) or 'no label'}: {why}"
        if restore.left:
            text += f"; left {', '.join(restore.left)} as someone changed them since"
        ctx.events.node_event(name_of(node), "GPUOperandsRestored", text, WARNING if restore.left else NORMAL)
        log.info("operand labels restored outside a reset", extra={"node": name_of(node), "detail": text})
    return written


def with_step(record: NodeRecord, step: str, now: float, timeout_s: float | None, detail: str | None = None
              ) -> NodeRecord:
    """The record with the action in ``step`` since ``now``; its deadline ``timeout_s`` from now (None: none)."""
    action = record.action
    assert action is not None
    deadline = None if timeout_s is None else min(now + timeout_s, MAX_TIMESTAMP)
    changed = dataclasses.replace(action, step=step, step_since=now, deadline=deadline,
                                  detail=action.detail if detail is None else detail)
    return dataclasses.replace(record, action=changed)


def with_targets(record: NodeRecord, indexes: list[str], uuids: list[str]) -> NodeRecord:
    """The record with the GPUs its action resets."""
    action = record.action
    assert action is not None
    return dataclasses.replace(record, action=dataclasses.replace(action, gpu_ids=tuple(indexes),
                                                                  gpu_uuids=tuple(uuids)))


def operand_pods(pods: list[dict[str, Any]], namespace: str, apps: Mapping[str, str]) -> list[dict[str, Any]]:
    """The pods of these operands (``apps``: deploy label → pod app label) among a node's pods."""
    wanted = set(apps.values())
    return [p for p in pods if (p.get("metadata") or {}).get("namespace") == namespace
            and ((p.get("metadata") or {}).get("labels") or {}).get("app") in wanted]


def all_gpu_indexes(node: Node, readings_gpus: list[str]) -> list[str]:
    """Every GPU of the node: the exporter's indexes, else GPU Feature Discovery's ``nvidia.com/gpu.count``, else
    0..capacity-1. Allocatable drops to 0 as soon as the device plugin is off, capacity after the kubelet's grace
    period; the GFD label stays as GFD left it. (With the single MIG strategy both count MIG devices: a MIG GPU's
    reset needs its instances gone first, which this sequence does not do.)"""
    if readings_gpus:
        return sorted(set(readings_gpus), key=lambda g: (len(g), g))
    count = labels_of(node).get(GPU_COUNT_LABEL) or \
        str(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, "0"))
    if not (count.isascii() and count.isdigit()) or not 0 < int(count) <= MAX_NODE_GPUS:
        return []  # a garbage label (63 digits fit in one) must not become a list of that many indexes
    return [str(i) for i in range(int(count))]


def applies_to(policy: Policy, node: Node, record: NodeRecord, kind: str) -> bool:
    """The table's row (``loops.repairs``): a reset-gpu step that belongs to the sequence."""
    return kind == ACTION_RESET_GPU and applies(policy, node, record)


class GpuOperatorReset:
    """The ``Repair`` for reset-gpu on a GPU Operator node: one step of the sequence (``loops.repairs``)."""

    def step(self, ctx: RepairContext, node: Node, record: NodeRecord, request: RepairRequest) -> StepResult:
        remediation = request.remediation
        job = dataclasses.replace(remediation.reset_gpu, timeout_s=request.rung.timeout_s) if request.rung.timeout_s \
            else remediation.reset_gpu
        return GpuResetSequence(ctx, job, request.attempts).step(node, record)


class GpuResetSequence:
    """One step of the sequence for one node."""

    def __init__(self, ctx: RepairContext, job: JobPolicy, max_attempts: int) -> None:
        self.ctx = ctx
        self.job = job  # [remediation.reset_gpu] with the ladder rung's timeout; the command is [gpu_operator]'s
        self.max_attempts = max_attempts

    def step(self, node: Node, record: NodeRecord) -> StepResult:
        policy = self.ctx.policy
        action = record.action
        if action is None or not action.step:
            return self._operands_off(node, record, policy)
        if action.step == STEP_FAILED:  # restored already, in the patch that wrote "failed"
            return self._finish(node, record, policy, ok=False, detail=action.detail or "reset sequence failed")
        try:
            saved = saved_labels(node)
        except OperandAnnotationError as exc:
            return self._unreadable_annotation(node, record, policy, str(exc))
        if action.step == STEP_GONE:
            return self._wait_gone(node, record, action, policy, saved)
        if action.step == STEP_RESET:
            return self._reset(node, record, action, policy, saved)
        if action.step == STEP_BACK:
            return self._wait_back(node, record, action, policy)
        return self._fail(node, record, policy, saved, f"unknown reset step {action.step!r} in the record")

    # ---- 1. operands off -------------------------------------------------------------------------------

    def _operands_off(self, node: Node, record: NodeRecord, policy: Policy) -> StepResult:
        gop = policy.gpu_operator
        now = self.ctx.clock()
        attempt = record.action.attempt if record.action else 1
        name = job_name(ACTION_RESET_GPU, name_of(node), self.ctx.jobs.fingerprint(record), attempt)
        labels = gop.operands_on(labels_of(node))
        started = start_action(record, ACTION_RESET_GPU, name, attempt, now)
        started = with_step(started, STEP_GONE, now, gop.gone_timeout_s, self._running_detail(node, gop, labels))
        started = with_targets(started, *self._targets(node, started, gop))  # the exporter still answers now
        try:
            earlier = saved_labels(node)
        except OperandAnnotationError:
            earlier = None  # unreadable: what it said is lost either way; the labels deployed now are saved
        patch, saved = off_patch(node, started, labels, gop.off_value, earlier)
        if write_node(self.ctx.writer, node, patch) is None:
            return CONFLICT
        self._event(node, "GPUOperandsOff", f"set {', '.join(sorted(saved.previous))} to {gop.off_value!r} for "
                    f"reset-gpu attempt {attempt}; waiting for their pods to leave", NORMAL)
        return InProgress(POLL_S)

    # ---- 2. operands gone ------------------------------------------------------------------------------

    def _wait_gone(self, node: Node, record: NodeRecord, action: ActionInProgress, policy: Policy,
                   saved: SavedLabels | None) -> StepResult:
        gop = policy.gpu_operator
        apps = {label: app for label, app in gop.apps.items() if saved is None or label in saved.previous}
        left = [] if self.ctx.writer.dry_run else \
            operand_pods(list_node_pods(self.ctx.client, name_of(node)), gop.namespace, apps)
        now = self.ctx.clock()
        if not left:
            at_reset = with_step(record, STEP_RESET, now, self.job.timeout_s)
            written = self.ctx.writer.write(node, at_reset)
            if written is None:
                return CONFLICT
            self._create_job(written, at_reset, policy)
            return InProgress(POLL_S)
        if action.deadline is not None and now >= action.deadline:
            names = ", ".join(sorted(name_of(p) for p in left))
            return self._fail(node, record, policy, saved,
                              f"operand pods still on the node after {gop.gone_timeout_s:g}s: {names}")
        return InProgress(POLL_S)

    # ---- 3. the reset Job ------------------------------------------------------------------------------

    def _create_job(self, node: Node, record: NodeRecord, policy: Policy) -> None:
        """Create the attempt's Job unless it exists (its name is in the record), then note it created."""
        action = record.action
        assert action is not None
        gop = policy.gpu_operator
        job_policy = dataclasses.replace(self.job, command=gop.command)
        found = self.ctx.jobs.create_job(node, record, ACTION_RESET_GPU, action.name, action.attempt, job_policy, False,
                                     targets=self._targets(node, record, gop))
        if found is not None:
            self.ctx.jobs.note_created(node, record, found)

    def _targets(self, node: Node, record: NodeRecord, gop: GpuOperatorPolicy) -> tuple[list[str], list[str]]:
        """(indexes, UUIDs) to reset: those the attempt recorded when it turned the operands off, else the faulty
        GPUs, or every GPU where they reset only together (or the fault names none)."""
        action = record.action
        if action is not None and action.kind == ACTION_RESET_GPU and action.gpu_ids:
            return list(action.gpu_ids), list(action.gpu_uuids)
        indexes, uuids = self.ctx.jobs.gpu_ids(node, record)
        readings = self.ctx.readings.get(name_of(node))
        every = all_gpu_indexes(node, [g.gpu for g in readings.gpus] if readings else [])
        if gop.reset_scope(labels_of(node)) == SCOPE_NODE or not indexes:
            all_uuids = sorted({g.uuid for g in readings.gpus if g.uuid}) if readings else uuids
            return every, all_uuids
        return indexes, uuids

    def _reset(self, node: Node, record: NodeRecord, action: ActionInProgress, policy: Policy,
               saved: SavedLabels | None) -> StepResult:
        outcome = self.ctx.jobs.attempt_outcome(action, lambda: self._create_job(node, record, policy),
                                            lambda job: self.ctx.jobs.note_created(node, record, job))
        if outcome == SUCCEEDED:
            return self._restore(node, record, policy, saved)
        if outcome == FAILED:
            return self._fail(node, record, policy, saved, f"reset-gpu Job {action.name} failed")
        if outcome == DELETED:
            return self._fail(node, record, policy, saved, f"reset-gpu Job {action.name} was deleted before it "
                              "finished")
        if outcome == TIMED_OUT:  # written (with the restore) first; the Job is deleted only after
            return self._fail(node, record, policy, saved, f"reset-gpu attempt {action.attempt} timed out",
                              cancel=True)
        return InProgress(POLL_S)

    # ---- 4. restore ------------------------------------------------------------------------------------

    def _restore(self, node: Node, record: NodeRecord, policy: Policy, saved: SavedLabels | None) -> StepResult:
        after = with_step(record, STEP_BACK, self.ctx.clock(), policy.gpu_operator.back_timeout_s)
        if self._write_restore(node, after, saved) is None:
            return CONFLICT
        return InProgress(POLL_S)

    def _fail(self, node: Node, record: NodeRecord, policy: Policy, saved: SavedLabels | None, detail: str, *,
              cancel: bool = False, warning: tuple[str, str] | None = None,
              drop_annotation: bool = False) -> StepResult:
        """The labels back and the failure in the record (one patch), then the attempt fails. ``warning``: an Event
        (reason, message) that the write, once it landed, is to be followed by. ``drop_annotation``: the
        annotation goes in that patch even though nothing could be read from it."""
        after = with_step(record, STEP_FAILED, self.ctx.clock(), None, detail)
        written = self._write_restore(node, after, saved, drop_annotation)
        if written is None:
            return CONFLICT
        if warning is not None:
            self._event(node, warning[0], warning[1], WARNING)
        if cancel and record.action is not None:
            self.ctx.jobs.cancel(ACTION_RESET_GPU, record.action.name)
        return self._finish(written, after, policy, ok=False, detail=detail)

    def _write_restore(self, node: Node, record: NodeRecord, saved: SavedLabels | None,
                       drop_annotation: bool = False) -> Node | None:
        restore = restore_patch(node, record, saved)
        if drop_annotation:
            restore.patch["metadata"]["annotations"][OPERAND_ANNOTATION] = None
        written = write_node(self.ctx.writer, node, restore.patch)
        if written is None or saved is None:
            return written
        text = f"put back {', '.join(restore.restored) or 'no label'}"
        if restore.left:
            text += f"; left {', '.join(restore.left)} as someone changed them since"
        self._event(node, "GPUOperandsRestored", text, WARNING if restore.left else NORMAL)
        return written

    def _unreadable_annotation(self, node: Node, record: NodeRecord, policy: Policy, problem: str) -> StepResult:
        """A person broke the annotation: which labels were ours is unknown, so none is touched (said loudly)."""
        gop = policy.gpu_operator
        off = sorted(label for label in gop.apps if labels_of(node).get(label) == gop.off_value)
        text = (f"{problem}; the operand labels are left as they are (set to {gop.off_value!r} now: "
                f"{', '.join(off) or 'none'}; put back by hand those that were on)")
        # The annotation goes: kept, it would make every later attempt and restart say this again, and the
        # Warning already names the labels that are off.
        return self._fail(node, record, policy, None, problem, warning=("GPUOperandsUnknown", text),
                          drop_annotation=True)

    # ---- 5. operands back ------------------------------------------------------------------------------

    def _wait_back(self, node: Node, record: NodeRecord, action: ActionInProgress, policy: Policy) -> StepResult:
        gop = policy.gpu_operator
        missing = [] if self.ctx.writer.dry_run else self._not_back(node, gop, action.step_since or 0.0, action.detail)
        if not missing:
            return self._finish(node, record, policy, ok=True,
                                detail=f"reset-gpu done ({action.name}); operands and exporter back")
        now = self.ctx.clock()
        if action.deadline is not None and now >= action.deadline:
            return self._finish(node, record, policy, ok=False,
                                detail=f"reset-gpu done but not back after {gop.back_timeout_s:g}s: "
                                       f"{', '.join(missing)}")
        return InProgress(POLL_S)

    def _running_detail(self, node: Node, gop: GpuOperatorPolicy, labels: list[str] | tuple[str, ...]) -> str:
        """The operands that have a pod on the node now (``running=app,app``): only those are waited for when
        the labels come back. The operator labels every GPU node ``gpu.deploy.dcgm=true`` although its chart
        deploys no standalone DCGM by default (dcgm.enabled=false: the exporter embeds nv-hostengine), and an
        operand disabled in its ClusterPolicy has its label but no pod either."""
        if self.ctx.writer.dry_run:
            return ""
        apps = {label: gop.apps[label] for label in labels}
        pods = operand_pods(list_node_pods(self.ctx.client, name_of(node)), gop.namespace, apps)
        running = sorted({((p.get("metadata") or {}).get("labels") or {}).get("app", "") for p in pods} - {""})
        return RUNNING_PREFIX + ",".join(running)

    def _not_back(self, node: Node, gop: GpuOperatorPolicy, since: float, detail: str) -> list[str]:
        """What is not back yet: operands deployed (and running before the reset) without a Ready pod, and the
        exporter's fresh readings."""
        deployed = {label: gop.apps[label] for label in gop.operands_on(labels_of(node))}
        if detail.startswith(RUNNING_PREFIX):  # a record from before this was kept waits for every operand
            before = set(detail.removeprefix(RUNNING_PREFIX).split(","))
            deployed = {label: app for label, app in deployed.items() if app in before}
        pods = operand_pods(list_node_pods(self.ctx.client, name_of(node)), gop.namespace, deployed)
        ready = {((p.get("metadata") or {}).get("labels") or {}).get("app") for p in pods
                 if is_ready(p) and not (p.get("metadata") or {}).get("deletionTimestamp")}
        missing = [f"{app} pod" for app in sorted(set(deployed.values()) - ready)]
        readings = self.ctx.readings.get(name_of(node))
        if readings is None or readings.observed_at < since:
            missing.append("fresh exporter readings")
        return missing

    # ---- 6. the attempt's end --------------------------------------------------------------------------

    def _finish(self, node: Node, record: NodeRecord, policy: Policy, *, ok: bool, detail: str) -> StepResult:
        """The attempt ended: the loop writes what follows (validation, the next attempt, quarantine)."""
        if ok:
            return Done(detail, max_attempts=self.max_attempts, written=(node, record))
        return Failed(detail, max_attempts=self.max_attempts, written=(node, record))

    def _event(self, node: Node, reason: str, message: str, kind: str) -> None:
        self.ctx.events.node_event(name_of(node), reason, message, kind)  # the recorder says "(dry-run)"

