"""The GPU-level drain (``[isolation] scope = "gpu"``, issue 26): one DeviceTaintRule takes the faulty GPU out, the
node stays schedulable and its other GPUs' pods stay.

Each step, from the record's ``isolation``:

1. no rule yet: the GPU is found by its UUID in the node's ResourceSlices and the rule written with ``NoSchedule``
   (the name is derived from node, device and UUID: a restart finds the same rule, and writing it again is a
   no-op), then the record names it. A cluster without DRA device taints, a GPU in no ResourceSlice (or a fault
   naming it by index only), a same-named rule that is not ours or a rule the server refuses: the flow goes
   node-level here and now (cordoned, the eviction drain takes over), said once in an Event and in the record.
2. ``NoSchedule`` → ``NoExecute`` when the drain is due, as far as one rule for every pod of the GPU allows: at
   once when no pod holds the GPU or every holder's namespace drains ``Immediate``; else at the drain's timeout
   if ``timeout_action = "delete"`` or a holder drains ``DeleteAfterTimeout``; ``AllowCompletion`` pods are waited
   for until the timeout, which fails the drain (quarantined, as for the eviction drain). The eviction controller
   deletes the holders with their own grace period (``[drain] grace_period_s`` cannot apply) and asks no PDB.
3. ``NoExecute``: done once no allocated ResourceClaim holds the device for a pod still on the node.

Without DRA device taints (none served, the GPU in no ResourceSlice) and ``[isolation] without_dra =
"device-plugin"``, the record says ``via = device-plugin`` instead of going node-level, and the device-plugin row
(``loops.drain_device_plugin``) takes the next step.

Dry run: the rule is written with effect ``None`` (annotated with the effect it stands for), nothing is deleted,
and the drain is done once the would-be ``NoExecute`` is written.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from gpuremediate.actions.device_taints import (
    DRY_RUN_ANNOTATION,
    EFFECT_NO_EXECUTE,
    EFFECT_NO_SCHEDULE,
    DeviceTaintError,
    DeviceTaints,
    DeviceTaintsNotServed,
    GpuDevice,
    Holder,
    RuleConflict,
    device_holders,
    find_gpu_device,
)
from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.nodes import Node, name_of, unschedulable_before_us
from gpuremediate.actions.pods import list_node_pods, pod_key
from gpuremediate.actions.workload_notice import WorkloadNotice, why_of
from gpuremediate.loops.drainer import DrainContext
from gpuremediate.loops.step import CONFLICT, Done, Failed, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.workflow import DrainPolicy
from gpuremediate.vocab.record import (
    SCOPE_GPU,
    SCOPE_NODE,
    VIA_DEVICE_PLUGIN,
    Isolation,
    NodeRecord,
    isolated_at_gpu,
    occurrence,
)

log = logging.getLogger(__name__)

DETAIL_PREFIX = "isolation: "  # the drain action's detail while it waits: what for


def isolating(policy: Policy, record: NodeRecord) -> bool:
    """The table row's ``matches``: the open fault takes only its GPU out."""
    return isolated_at_gpu(record)


class DeviceTaintDrain:
    """The ``Drainer`` of a GPU-level isolation."""

    def __init__(self) -> None:
        self._taints: DeviceTaints | None = None  # discovered once per loop (dry run is fixed per controller)
        self.notice = WorkloadNotice()

    def taints(self, ctx: DrainContext) -> DeviceTaints:
        if self._taints is None:
            self._taints = DeviceTaints(ctx.client, dry_run=ctx.writer.dry_run)
        return self._taints

    def before_admission(self, ctx: DrainContext, node: Node, record: NodeRecord) -> InProgress | None:
        """The rule with NoSchedule as soon as the fault is open, before the drain is admitted (the budget, a gate
        may hold it a while): what a cordon does for a node-level fault. None: placed already, go on."""
        isolation = record.isolation
        if isolation is None or not isolation.at_gpu or isolation.rule:
            return None
        result = self._guarded(ctx, node, record, isolation, lambda: self._place(ctx, node, record, isolation))
        return result if isinstance(result, InProgress) else None

    def step(self, ctx: DrainContext, node: Node, record: NodeRecord) -> StepResult:
        isolation = record.isolation
        assert isolation is not None and record.action is not None
        if not isolation.rule:
            return self._guarded(ctx, node, record, isolation, lambda: self._place(ctx, node, record, isolation))
        if isolation.effect != EFFECT_NO_EXECUTE:
            return self._guarded(ctx, node, record, isolation,
                                 lambda: self._escalate_when_due(ctx, node, record, isolation))
        return self._drained(ctx, node, record, isolation)

    def _guarded(self, ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation,
                 write: Callable[[], StepResult]) -> StepResult:
        """A step that writes the rule: a cluster that cannot take it makes the flow node-level."""
        try:
            return write()
        except RuleConflict:  # someone wrote our rule meanwhile: the next step reads it again
            return InProgress(ctx.policy.drain.retry_s)
        except DeviceTaintsNotServed as exc:
            return self._without_dra(ctx, node, record, isolation, str(exc))
        except DeviceTaintError as exc:  # not served, a foreign rule of that name, refused by the server
            return self._node_level(ctx, node, record, isolation, str(exc))

    def _drained(self, ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation) -> StepResult:
        if ctx.writer.dry_run:
            return Done(f"dry run: rule {isolation.rule} written with effect None, nothing deleted")
        holders, _ = self._holders(ctx, node, isolation)
        if not holders:
            return Done(f"no pod holds {isolation.device} any more (rule {isolation.rule})")
        if _past_deadline(ctx, record):
            return Failed(f"the eviction controller left {_names(holders)} on {isolation.device} past the drain's "
                          f"timeout (rule {isolation.rule})")
        return self._note(ctx, node, record, f"waiting for the eviction controller to delete {_names(holders)}")

    def _place(self, ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation) -> StepResult:
        name = name_of(node)
        if not isolation.uuid.startswith("GPU-"):
            return self._node_level(ctx, node, record, isolation, f"the fault names GPU {isolation.uuid} without a "
                                    "UUID: no ResourceSlice device can be matched to it")
        # Discovery first: a cluster without the API says DeviceTaintsNotServed before any slice is read.
        taints = self.taints(ctx)
        before_ga = not taints.served_ga and ctx.policy.isolation.before_ga != SCOPE_GPU
        adopted = None if before_ga else self._adopt(ctx, node, record, isolation)
        if adopted is not None:
            return adopted
        # The slice first: a GPU no DRA driver publishes (a device-plugin node) is no matter of the rule's version.
        gpu = find_gpu_device(ctx.client, name, isolation.uuid)
        if gpu is None:
            return self._without_dra(ctx, node, record, isolation, f"GPU {isolation.uuid} is in no ResourceSlice of "
                                     f"{name} (no DRA driver publishes it)")
        if before_ga:
            return self._node_level(ctx, node, record, isolation, before_ga_reason(taints.api_version))
        rule = self._write(ctx, record, gpu, EFFECT_NO_SCHEDULE)
        placed = dataclasses.replace(isolation, rule=rule, driver=gpu.driver, pool=gpu.pool, device=gpu.device,
                                     effect=EFFECT_NO_SCHEDULE, effect_since=ctx.clock())
        if ctx.writer.write(node, dataclasses.replace(record, isolation=placed)) is None:
            return CONFLICT
        self._said_isolated(ctx, node, placed)
        return InProgress(0.0)

    def _adopt(self, ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation) -> StepResult | None:
        """A rule of ours for this GPU that the record does not name (a controller killed between its write and
        the record's): found by label and carried on with, as it is (None: there is none)."""
        found = self.taints(ctx).owned(name_of(node), uuid=isolation.uuid)
        if not found:
            return None
        rule = found[0]
        effect = str(((rule.obj.get("metadata") or {}).get("annotations") or {}).get(DRY_RUN_ANNOTATION, "")) \
            or rule.effect
        adopted = dataclasses.replace(isolation, rule=rule.name, driver=rule.driver, pool=rule.pool,
                                      device=rule.device, effect=effect, effect_since=ctx.clock())
        if ctx.writer.write(node, dataclasses.replace(record, isolation=adopted)) is None:
            return CONFLICT
        log.info("DeviceTaintRule found by label: carried on", extra={"node": name_of(node), "rule": rule.name})
        self._said_isolated(ctx, node, adopted)  # its first write was lost (a 409, a kill): not said yet
        return InProgress(0.0)

    @staticmethod
    def _said_isolated(ctx: DrainContext, node: Node, isolation: Isolation) -> None:
        ctx.events.node_event(name_of(node), "GPUIsolated", f"GPU {isolation.uuid} ({isolation.device}) isolated by "
                              f"DeviceTaintRule {isolation.rule} ({isolation.effect}); the node stays schedulable",
                              NORMAL)

    def _escalate_when_due(self, ctx: DrainContext, node: Node, record: NodeRecord,
                           isolation: Isolation) -> StepResult:
        policy = ctx.policy.drain
        holders, pods = ([], []) if ctx.writer.dry_run else self._holders(ctx, node, isolation)
        modes = {policy.mode_of(h.pod.partition("/")[0]) for h in holders}
        late = _past_deadline(ctx, record)
        if not (modes <= {"Immediate"} or (late and _deletes_at_timeout(policy, modes))):
            if late:
                return Failed(f"drain timed out with {_names(holders)} left on {isolation.device} (AllowCompletion)")
            return self._note(ctx, node, record, f"NoSchedule; waiting for {_names(holders)} to finish")
        gpu = GpuDevice(name_of(node), isolation.uuid, isolation.driver, isolation.pool, isolation.device)
        if policy.pod_events:
            self._tell(ctx, node, record, holders, pods)
        self._write(ctx, record, gpu, EFFECT_NO_EXECUTE)
        after = dataclasses.replace(isolation, effect=EFFECT_NO_EXECUTE, effect_since=ctx.clock())
        if ctx.writer.write(node, dataclasses.replace(record, isolation=after)) is None:
            return CONFLICT
        return InProgress(0.0)

    def _tell(self, ctx: DrainContext, node: Node, record: NodeRecord, holders: list[Holder],
              node_pods: list[dict[str, Any]]) -> None:
        """The workload notice for the pods the NoExecute rule is about to have deleted (from the step's own list)."""
        held = {h.pod for h in holders}
        pods = [p for p in node_pods if "/".join(pod_key(p)) in held]
        how = "deleted by the device taint eviction controller: gpuremediate took its GPU out (the node stays)"
        self.notice.tell(ctx.events, record, pods, why_of(name_of(node), record, how))

    def _write(self, ctx: DrainContext, record: NodeRecord, gpu: GpuDevice, effect: str) -> str:
        fault = record.fault
        kind = f"{fault.kind}-{fault.code}" if fault is not None and fault.code else (fault.kind if fault else "")
        return self.taints(ctx).isolate(gpu, effect, fault=kind, fingerprint=occurrence(record)).name

    @staticmethod
    def _holders(ctx: DrainContext, node: Node, isolation: Isolation) -> tuple[list[Holder], list[dict[str, Any]]]:
        """The device's holders, and the node's pods they were found among (one LIST for both)."""
        pods = list_node_pods(ctx.client, name_of(node))
        return device_holders(ctx.client, isolation.driver, isolation.pool, isolation.device, pods), pods

    @staticmethod
    def _note(ctx: DrainContext, node: Node, record: NodeRecord, waiting: str) -> StepResult:
        """What the drain waits for, in the drain action's detail (``explain`` prints it)."""
        assert record.action is not None
        detail = DETAIL_PREFIX + waiting
        if record.action.detail != detail:
            after = dataclasses.replace(record, action=dataclasses.replace(record.action, detail=detail))
            if ctx.writer.write(node, after) is None:
                return CONFLICT
        return InProgress(ctx.policy.drain.retry_s)

    @staticmethod
    def _without_dra(ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation,
                     why: str) -> StepResult:
        """No DRA device taint for this GPU: node-level, or (``without_dra = "device-plugin"``) left to the device
        plugin's health: the record says so and the device-plugin row takes the next step (its clock starts now)."""
        if not ctx.policy.isolation.by_device_plugin:
            return node_level(ctx, node, record, isolation, why)
        why = f"no DRA device taint ({why}): by the device plugin"
        after = dataclasses.replace(record, isolation=dataclasses.replace(isolation, via=VIA_DEVICE_PLUGIN, why=why,
                                                                          effect="", effect_since=ctx.clock()),
                                    message=f"{record.message}; {why}")
        if ctx.writer.write(node, after) is None:
            return CONFLICT
        log.info("GPU-level isolation by the device plugin", extra={"node": name_of(node), "detail": why})
        return InProgress(0.0)

    @staticmethod
    def _node_level(ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation, why: str) -> StepResult:
        return node_level(ctx, node, record, isolation, why)


def node_level(ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation, why: str) -> StepResult:
    """GPU-level cannot be done here: node-level from now (cordoned unless already unschedulable; the eviction
    drain's row takes the next step), said once: this write ends the GPU-level scope."""
    name = name_of(node)
    cordon = not unschedulable_before_us(node)
    after = dataclasses.replace(record, isolation=dataclasses.replace(isolation, scope=SCOPE_NODE, why=why),
                                cordoned_by_us=cordon, message=f"{record.message}; node-level: {why}")
    if ctx.writer.write(node, after, cordon=cordon) is None:
        return CONFLICT
    log.warning("GPU-level isolation not possible: node-level", extra={"node": name, "detail": why})
    ctx.events.node_event(name, "GPUIsolationNodeLevel", f"GPU {isolation.uuid} cannot be isolated alone "
                          f"({why}): the node is cordoned and drained instead", WARNING)
    return InProgress(0.0)


def before_ga_reason(api_version: str) -> str:
    return (f"DeviceTaintRule is served at {api_version}, before GA (resource.k8s.io/v1, Kubernetes 1.37): this "
            "cluster's kube-scheduler does not honour NoSchedule device taints, so new pods could be handed the bad "
            'GPU ([isolation] before_ga = "gpu" isolates it anyway)')


def _past_deadline(ctx: DrainContext, record: NodeRecord) -> bool:
    deadline = record.action.deadline if record.action is not None else None
    return deadline is not None and ctx.clock() >= deadline


def _deletes_at_timeout(policy: DrainPolicy, modes: set[str]) -> bool:
    return policy.timeout_action == "delete" or "DeleteAfterTimeout" in modes


def _names(holders: list[Holder]) -> str:
    shown = ", ".join(f"{h.pod} (claim {h.claim})" for h in holders[:5])
    return shown + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")

