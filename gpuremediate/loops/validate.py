"""The validate loop: owns ``validating``.

A GPU-level isolation (``record.isolation`` at gpu, docs/dra.md) validates its GPU only while the other GPUs keep
running. With ``[isolation] validation = "claim"`` (the default) the Job takes exactly that GPU through a
ResourceClaim (a CEL selector on its UUID, tolerating our taint, owned by the Job), and kube-scheduler places it on
the node (a required node affinity on the node's name: a pod given ``nodeName`` would skip the claim's allocation);
its container sees that GPU alone. With ``"privileged"`` the Job asks for no GPU resource, runs on the node with
GPU_IDS = that GPU, and needs the access the Job policy gives it. On success the GPU's DeviceTaintRule is deleted
first, then the record goes healthy (a restart in between deletes nothing twice and writes healthy). Node-level
validation of a node whose isolation was escalated also deletes the rule it kept. A Job pinned to the node asks
for every GPU slice it has (the capacity of each ``[gpu_resources]`` resource: ``nvidia.com/gpu``, each
``nvidia.com/mig-<profile>``) and runs DCGM diagnostics (``dcgmi diag -r 2`` by default). Success → healthy and
uncordoned (only if we cordoned it); failure or timeout → quarantined.

Before the Job: pods still holding GPU resources are waited for (the kubelet would refuse the Job), and so is
a device plugin that reports fewer devices allocatable than the node has (after a reboot it registers again;
a device it marked unhealthy stays out). The kubelet admits no pod asking for more than allocatable, so
"every GPU" cannot be held then: past ``[gpu_resources] allocatable_wait_s`` validation fails, its message
naming the short resources — a GPU its device plugin calls unhealthy is not fit to return to service.

A GPU isolated by the device plugin (``[isolation] without_dra = "device-plugin"``, no DRA) cannot be validated
alone through a GPU request (a pod asks the device plugin for a count, never for one GPU): unless ``[isolation]
validation = "privileged"`` (the Job asks for no GPU, GPU_IDS = that GPU), its validation is node-level: the node
is cordoned for it, the record and an Event say so, and the Job holds every GPU as above (the pods on the other
GPUs are waited for)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from gpuremediate.actions.device_taints import (
    DeviceTaints,
    DeviceTaintsNotServed,
    GpuDevice,
    claimable,
    ensure_validation_claim,
    validation_claim,
)
from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.jobs import FAILED, FAULT_ANNOTATION, JOB_LABEL, SUCCEEDED
from gpuremediate.actions.nodes import Node, labels_of, name_of, unschedulable_before_us
from gpuremediate.actions.pods import list_node_pods, never_drained, pod_key
from gpuremediate.gpu_resources import GpuHold, GpuResourcesPolicy, requests_gpu, validation_hold
from gpuremediate.kube import errors
from gpuremediate.kube.resources import NODES
from gpuremediate.loops.base import LoopContext
from gpuremediate.loops.jobs import DELETED, TIMED_OUT, JobLoop
from gpuremediate.loops.new_node import startup_taint_of
from gpuremediate.policy import safety
from gpuremediate.policy.fabric import conditions as fabric_conditions
from gpuremediate.policy.fabric import is_domain_fault
from gpuremediate.policy.isolation import VALIDATE_BY_CLAIM
from gpuremediate.policy.workflow import JobPolicy
from gpuremediate.state import decide
from gpuremediate.vocab import states
from gpuremediate.vocab.record import (
    BLOCK_GATE,
    BLOCK_GPU_PODS,
    BLOCK_GPU_UNAVAILABLE,
    SCOPE_NODE,
    ActionInProgress,
    Blocked,
    NodeRecord,
    RecordError,
    block,
    isolated_at_gpu,
    occurrence,
    record_from_node,
)

VALIDATE = "validate"
DOMAIN_WAIT = "domain-wait"  # the step of a domain action's tray validated, waiting for its domain's trays
# Rules of ours no flow holds are looked for at the first resync, then this often: one label-selected LIST of
# DeviceTaintRules each time (a leftover costs the GPU it isolates, so minutes are soon enough; every resync
# would be six LISTs a minute at steady state, where the controller otherwise only watches).
ORPHAN_SWEEP_S = 300.0
CLAIM_RETRY_S = 30.0  # a validation claim the server refused is asked for again this often, not every step

log = logging.getLogger(__name__)


def _holds(record: NodeRecord | None, rule: str) -> bool:
    """The record's flow holds (or is about to record) that rule."""
    isolation = record.isolation if record is not None else None
    if isolation is None:
        return False
    return isolation.rule == rule or (isolation.at_gpu and not isolation.rule)


class ValidateLoop(JobLoop):
    name = "validate"
    owned = frozenset({states.VALIDATING})
    _next_sweep = 0.0  # monotonic time of the next look for rules no flow holds (the first resync looks)

    def __init__(self, ctx: LoopContext) -> None:
        super().__init__(ctx)
        self._claims_made: set[str] = set()  # validation claims this process made or found (one look each)
        self._claim_failed: dict[str, float] = {}  # claim -> monotonic time of its last failed create

    def concluded_by_this_flow(self, job: Mapping[str, Any], record: NodeRecord) -> bool:
        """A repair Job of the fault being validated: the flow reached Validating only once that repair was over
        (a reboot by the node's new boot, its pod run). A real Job's status follows its pods a second or more
        later (SyncJobBatchPeriod), so it may still read running here; a repair Job being deleted is waited for."""
        meta = job.get("metadata") or {}
        return (not meta.get("deletionTimestamp")
                and (meta.get("annotations") or {}).get(FAULT_ANNOTATION) == occurrence(record)
                and (meta.get("labels") or {}).get(JOB_LABEL) != VALIDATE)

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        held = self.held_by_pause(node, record)
        if held is not None:
            return held
        action = record.action
        if action is not None and action.kind == VALIDATE and action.step == DOMAIN_WAIT:
            return self._finish(node, record, True, action.detail)  # the tray passed: its domain's trays are awaited
        policy = self.ctx.policy_for(node).validation
        if not policy.enabled:
            return self._finish(node, record, True, "validation disabled by policy")
        one_gpu = isolated_at_gpu(record)
        if action is None or action.kind != VALIDATE or not action.name:
            if one_gpu and self._node_level_for_validation(node, record):
                return self._cordon_for_validation(node, record)
            if one_gpu:
                return self.start_job(node, record, VALIDATE, 1, policy.job, timeout_s=policy.job.timeout_s)
            gpus = self.ctx.policy_for(node).gpu_resources
            busy = self.gpu_pods(node, gpus.names)
            if busy:
                return self._wait_for_gpus(node, record, busy)
            hold = validation_hold(node, gpus.names)
            if hold.problem:
                return self._wait_for_allocatable(node, record, hold, gpus)
            return self.start_job(node, record, VALIDATE, 1, policy.job, timeout_s=policy.job.timeout_s,
                                  request_all_gpus=True)
        if one_gpu and action.created:
            self._claim_after_restart(node, record, action)
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

    def resync(self) -> None:
        super().resync()
        policies = (self.ctx.policy.defaults, *(g.policy for g in self.ctx.policy.groups))
        if not any(p.isolation.gpu_level for p in policies):
            return
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + ORPHAN_SWEEP_S
            self._sweep_orphan_rules()

    def _sweep_orphan_rules(self) -> None:
        """Delete rules of ours no flow holds any more: the node's record names no isolation, or another rule (the
        flow ended some other way: a person deleted the record, a malformed record was replaced). A rule whose
        flow has not recorded it yet (``isolation`` at gpu, no rule) is left to that flow to adopt; a rule for a
        node this replica does not own, or does not know, is left alone."""
        taints = DeviceTaints(self.ctx.client, dry_run=self.ctx.writer.dry_run)
        try:
            rules = taints.owned()
        except DeviceTaintsNotServed:
            return
        except (errors.ApiError, errors.TransportError) as exc:
            self.ctx.metrics.count_api_error(exc)
            log.warning("DeviceTaintRules could not be listed; the next resync retries", extra={"error": str(exc)})
            return
        owned = {name_of(n): n for n in self.ctx.owned_gpu_nodes()}
        for rule in rules:
            if rule.node not in owned or self._held_by_flow(owned[rule.node], rule.name):
                continue
            # The cache may not show yet the record that names the rule (written right after it): a read of the Node
            # as the API server has it now decides.
            with contextlib.suppress(errors.NotFound):
                if self._held_by_flow(self.ctx.client.get(NODES, rule.node), rule.name):
                    continue
                if taints.release_rule(rule.name):
                    log.warning("orphaned DeviceTaintRule deleted", extra={"node": rule.node, "rule": rule.name})

    @staticmethod
    def _held_by_flow(node: Node, rule: str) -> bool:
        record = record_from_node(node)
        return isinstance(record, RecordError) or _holds(record, rule)

    def _release_rule(self, node: Node, record: NodeRecord) -> None:
        """The isolated GPU passed (or its node did): its DeviceTaintRule goes, before the record says healthy."""
        isolation = record.isolation
        if isolation is not None and isolation.at_gpu and isolation.by_device_plugin:
            self.ctx.events.node_event(name_of(node), "GPUReturned", f"GPU {isolation.uuid} validated alone; the "
                                       "device plugin offers it again once it reports it healthy", NORMAL)
            return
        if isolation is None or not isolation.rule:
            return
        try:
            released = DeviceTaints(self.ctx.client, dry_run=self.ctx.writer.dry_run).release(name_of(node),
                                                                                              isolation.uuid)
        except DeviceTaintsNotServed:
            return  # the API was switched off: no rule of ours is left to act
        if released:
            self.ctx.events.node_event(name_of(node), "GPUReturned", f"GPU {isolation.uuid} validated: DeviceTaintRule "
                                       f"{', '.join(released)} deleted", NORMAL)

    def fingerprint(self, record: NodeRecord) -> str:
        """Each validation run has its own Job: a node released again after a failed validation must not
        find the first run's (kept) failed Job under its name. ``since`` is when this run began (entering
        ``validating``), stable across restarts and unchanged by the run's own writes."""
        return f"{occurrence(record)}/validation@{int(record.since * 1000)}"

    def create_job(
        self, node: Node, record: NodeRecord, kind: str, name: str, attempt: int, policy: JobPolicy,
        request_all_gpus: bool, env: Mapping[str, str] | None = None,
        targets: tuple[list[str], list[str]] | None = None, device_claim: str = "", boot_id: str = "",
    ) -> Mapping[str, Any] | None:
        """The validation Job of an isolated GPU takes it through its claim (named as the Job), made after the Job
        so that it can be owned by it."""
        claim = device_claim or (name if kind == VALIDATE and self._claimed_gpu(node, record) else "")
        job = super().create_job(node, record, kind, name, attempt, policy, request_all_gpus, env, targets,
                                 device_claim=claim, boot_id=boot_id)
        if job is not None and claim:
            self._make_claim(node, record, job, claim)
        return job

    def _claimed_gpu(self, node: Node, record: NodeRecord) -> GpuDevice | None:
        """The isolated GPU, when its validation goes through a claim (the policy says so, the rule named it)."""
        isolation = record.isolation
        if not isolated_at_gpu(record) or isolation is None or \
                self.ctx.policy_for(node).isolation.validation != VALIDATE_BY_CLAIM:
            return None
        gpu = GpuDevice(name_of(node), isolation.uuid, isolation.driver, isolation.pool, isolation.device)
        return gpu if gpu.device and gpu.pool and claimable(gpu) else None

    def _make_claim(self, node: Node, record: NodeRecord, job: Mapping[str, Any], claim: str) -> None:
        gpu = self._claimed_gpu(node, record)
        failed = self._claim_failed
        if gpu is None or claim in self._claims_made or time.monotonic() < failed.get(claim, -math.inf) + CLAIM_RETRY_S:
            return
        body = validation_claim(claim, self.ctx.settings.jobs_namespace, gpu, job,
                                device_class=self.ctx.policy_for(node).isolation.device_class)
        try:
            if ensure_validation_claim(self.ctx.client, body):
                log.info("validation claim created", extra={"node": name_of(node), "claim": claim,
                                                            "device": gpu.device})
        except (errors.ApiError, errors.TransportError) as err:  # the Job waits for it: tried again, then it times out
            log.warning("validation claim not created", extra={"node": name_of(node), "claim": claim,
                                                               "detail": str(err)})
            failed[claim] = time.monotonic()  # not every step: one try per CLAIM_RETRY_S
            return
        failed.pop(claim, None)
        self._claims_made.add(claim)

    def _claim_after_restart(self, node: Node, record: NodeRecord, action: ActionInProgress) -> None:
        """A Job created by a controller killed before its claim: made now (one look per process and Job)."""
        if action.name in self._claims_made or self._claimed_gpu(node, record) is None:
            return
        job = self.ctx.jobs.read(action.name)
        if job is not None and job["spec"]["template"]["spec"].get("resourceClaims"):
            self._make_claim(node, record, job, action.name)

    def _recreate(self, node: Node, record: NodeRecord, action: ActionInProgress, job: JobPolicy) -> None:
        created = self.create_job(node, record, VALIDATE, action.name, action.attempt, job, not isolated_at_gpu(record))
        if created is not None:
            self.note_created(node, record, created)

    def _node_level_for_validation(self, node: Node, record: NodeRecord) -> bool:
        """A GPU isolated by the device plugin, validated through a GPU request: no pod can ask for it alone."""
        isolation = record.isolation
        return isolation is not None and isolation.by_device_plugin and \
            self.ctx.policy_for(node).isolation.validation == VALIDATE_BY_CLAIM

    def _cordon_for_validation(self, node: Node, record: NodeRecord) -> float | None:
        """Node-level from here: cordoned (unless unschedulable already), said in the record and an Event."""
        isolation = record.isolation
        assert isolation is not None
        why = (f"validation is node-level: a pod cannot ask the device plugin for GPU {isolation.uuid} alone "
               '([isolation] validation = "privileged" validates it alone); the node is cordoned for it')
        cordon = not unschedulable_before_us(node)
        after = dataclasses.replace(record, isolation=dataclasses.replace(isolation, scope=SCOPE_NODE, why=why),
                                    cordoned_by_us=record.cordoned_by_us or cordon,
                                    message=f"{record.message}; {why}")
        if self.ctx.writer.write(node, after, cordon=cordon) is None:
            return self.retry_after_conflict()
        log.info("GPU isolated by the device plugin: node-level validation", extra={"node": name_of(node)})
        self.ctx.events.node_event(name_of(node), "GPUValidationNodeLevel", f"GPU {isolation.uuid} was isolated by "
                                   f"the device plugin; {why}", WARNING)
        return 0.0

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
        if ok and record.fault is not None and is_domain_fault(record.fault.kind):
            waiting = self._domain_not_back(node, record)
            if waiting:
                return self._wait_for_domain(node, record, detail, waiting)
        if record.reason == states.NEW_NODE and not ok:
            detail = f"a new node failed its validation before taking work: {detail}"
        decision = dataclasses.replace(decide.complete_validation(record, ok, self.ctx.clock(), detail), cancel=cancel)
        if ok:  # a new node's startup taint ([remediation.replace] startup_taint) goes with the healthy record
            key = self.ctx.policy_for(node).remediation.replace.startup_taint
            decision = dataclasses.replace(decision, untaint=key if startup_taint_of(node, key) else "")
        if ok:
            self._release_rule(node, record)
        if self.apply(node, decision) is None:
            return self.retry_after_conflict()
        return None

    # ---- a domain action's validation: the domain, not the tray alone --------------------------------------------

    def _domain_not_back(self, node: Node, record: NodeRecord) -> str:
        """Why this tray, validated, may not return yet ("" when it may): after a domain action the domain returns
        as one unit. Every other tray of its NVLink domain must be back (healthy, schedulable, Ready) or validated
        too and waiting here, and this tray's own fabric state good (its latest readings show no fabric
        condition: registered, Fabric Manager running, IMEX ready where it runs). A tray still repairing, or
        quarantined, holds the domain: a person releases it, or the domain waits. From the node informer only."""
        assert record.fault is not None
        rules = self.ctx.policy_for(node).fabric
        labels = labels_of(node)
        readings = self.ctx.readings.get(name_of(node))
        if readings is None:
            return "its GPU readings are not known yet (the fabric state is checked before the domain returns)"
        bad = sorted(f"GPU {g.key}: {', '.join(sorted(found))}" for g in readings.gpus
                     if (found := fabric_conditions(g.fabric, labels, rules)))
        if bad:
            return f"its NVLink fabric state is not good ({'; '.join(bad[:4])})"
        value = labels.get(rules.domain_label, "")
        members = self.ctx.nodes.gpu_nodes_with({rules.domain_label: [value]}) if value else []
        fingerprint, out = record.fault.fingerprint, []
        for member in members:
            if name_of(member) == name_of(node):
                continue
            view, theirs = safety.node_view(member), record_from_node(member)
            back = view.state == states.HEALTHY and view.ready and not view.unschedulable
            validated = isinstance(theirs, NodeRecord) and theirs.state == states.VALIDATING \
                and theirs.fault is not None and theirs.fault.fingerprint == fingerprint \
                and theirs.action is not None and theirs.action.step == DOMAIN_WAIT
            if not back and not validated:
                out.append(view.describe() if view.state != states.VALIDATING else f"{view.name}: validating")
        if not out:
            return ""
        shown = "; ".join(sorted(out)[:5]) + ("; ..." if len(out) > 5 else "")
        return (f"the domain {rules.domain_label}={value} returns as one unit: {len(out)} of its {len(members)} "
                f"trays not validated or back yet ({shown})")

    def _wait_for_domain(self, node: Node, record: NodeRecord, detail: str, why: str) -> float | None:
        """Validated, held in validating (still cordoned) until its domain is back: the step says so across a
        restart (no Job is run again), ``blocked`` says why; the domain's other trays are looked at again now."""
        now = self.ctx.clock()
        action = record.action
        if action is None or action.step != DOMAIN_WAIT:
            action = ActionInProgress(kind=VALIDATE, name=action.name if action is not None else "",
                                      attempt=action.attempt if action is not None else 1,
                                      started=action.started if action is not None else now,
                                      created_at=action.created_at if action is not None else None,
                                      detail=detail, step=DOMAIN_WAIT, step_since=now)
            label = self.ctx.policy_for(node).fabric.domain_label
            value = labels_of(node).get(label)
            for member in self.ctx.nodes.gpu_nodes_with({label: [value]}) if value else []:
                if name_of(member) != name_of(node):
                    self.queue.add(name_of(member))
        after = block(dataclasses.replace(record, action=action), BLOCK_GATE, why, now)
        if after != record and self.ctx.writer.write(node, after) is None:
            return self.retry_after_conflict()
        return self.ctx.settings.resync_s
