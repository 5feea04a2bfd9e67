"""Idle-node checks (issue 46, off by default): a GPU node that has had no GPU pod for ``[preflight]
idle_check_interval_s`` gets the preflight as a low-priority Job (``actions.idle_check``), so a quiet node's bad GPU
is found before a job is scheduled on it.

Each resync (``--resync``), on this loop's thread:

1. The idle-check Jobs (the controller's Jobs watch, no extra read): a finished one is counted by result
   (``gpuremediate_idle_checks_total``: passed, failed, unknown) and deleted; a running one on a node that is no
   longer eligible (cordoned, in a remediation state, gone) is deleted at once, so it never holds GPUs a repair or
   validation needs.
2. Nodes due (eligible by the Node cache; no GPU pod seen on them, and no check, for an interval): as many as
   ``idle_check_max_jobs`` (fleet-wide) leaves room for, each looked at with one field-selected pod LIST (what
   validation reads before it holds every GPU). A pod holding GPUs, or a GPU pod that ended within the interval,
   postpones it; otherwise its Job is created. LISTs per pass are bounded (``LOOKS_PER_SLOT`` per free slot); a
   node is listed at most once per interval.

A failed check is a failed pod whose ``gpuremediate-preflight`` container wrote ``preflight failed: GPU ...``: the
failed-pod watch reads it into the same ``preflight-failed`` finding as the webhook's init container, and the
node is acted on by the detect loop as for any finding. Which pod it was is what tells failed from unknown here.

Not known: a GPU pod that ran and was deleted between two looks (a LIST shows what is still there). A node is first
looked at an interval after this process first saw it, so a restart postpones checks by one interval.
"""

from __future__ import annotations

import hashlib
import logging

from gpuremediate.actions.idle_check import KIND, build_idle_check, gpu_use, why_not_eligible
from gpuremediate.actions.jobs import FAILED, JOB_LABEL, SUCCEEDED, delete_job, ensure_job, job_node, job_outcome
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.actions.pods import list_node_pods
from gpuremediate.gpu_resources import validation_hold
from gpuremediate.kube import errors
from gpuremediate.loops.base import LoopContext, NodeLoop
from gpuremediate.policy.preflight import PREFLIGHT_ONLY
from gpuremediate.signals.workload import WorkloadSignal
from gpuremediate.vocab.record import record_from_node

PASSED = "passed"
UNKNOWN = "unknown"
LOOKS_PER_SLOT = 4  # pod LISTs per free slot per pass (a busy node found costs one)
SIGNAL_WAIT_S = 60.0  # a failed Job's pod not yet read by the failed-pod watch is waited for this long

log = logging.getLogger(__name__)


class IdleCheckLoop(NodeLoop):
    name = "idle-check"
    owned: frozenset[str] = frozenset()  # no node state of its own: it works on healthy nodes at each resync

    def __init__(self, ctx: LoopContext, signal: WorkloadSignal | None) -> None:
        super().__init__(ctx)
        self.signal = signal
        self._quiet_since: dict[str, float] = {}  # node -> since when no GPU pod was seen (first seen, at worst)
        self._checked: dict[str, float] = {}  # node -> when its last check was started
        self._failed_seen: dict[str, float] = {}  # failed Job -> when first seen failed (waiting for its pod)
        self._counted: set[str] = set()  # Jobs counted and deleted that the Jobs watch may still show

    def on_node(self, node: Node) -> None:
        """Nothing per Node event: the resync looks at the fleet."""

    def resync(self) -> None:
        if not self.ctx.policy.defaults.preflight.idle_check_interval_s and not any(
                g.policy.preflight.idle_check_interval_s for g in self.ctx.policy.groups):
            return
        running = self._conclude()
        self._start(running)

    # ---- the Jobs there are -------------------------------------------------------------------------------

    def _conclude(self) -> int:
        """Count and delete finished checks, delete those on nodes no longer eligible; the count still running."""
        now = self.ctx.clock()
        running = 0
        listed = [job for job in self.ctx.jobs.all()
                  if ((job.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL) == KIND]
        self._counted &= {str(job["metadata"].get("name")) for job in listed}  # gone from the watch: forgotten
        for job in listed:
            meta = job.get("metadata") or {}
            node, name = job_node(job), str(meta.get("name") or "")
            if meta.get("deletionTimestamp") or name in self._counted:
                continue  # counted once (a watch lags our own delete)
            outcome = job_outcome(job)
            if outcome == SUCCEEDED:
                self._count(node, name, PASSED)
            elif outcome == FAILED:
                result = self._failed_result(node, name, now)
                if result:
                    self._count(node, name, result)
                else:
                    running += 1  # its pod's end not read yet: it still counts against the cap
            else:
                current = self.ctx.nodes.get(node)
                why = why_not_eligible(current, record_from_node(current)) if current is not None else "gone"
                if why:
                    log.info("idle check stopped", extra={"node": node, "job": name, "reason": why})
                    self._count(node, name, UNKNOWN)
                else:
                    running += 1
        return running

    def _failed_result(self, node: str, job: str, now: float) -> str:
        """failed: the failed-pod watch read a ``preflight failed`` line from this Job's pod; unknown once it has
        not within SIGNAL_WAIT_S (it could not tell, ran out of time, was preempted); "" while waiting."""
        prefix = f"{self.ctx.settings.jobs_namespace}/{job}-"
        failures = self.signal.failures(node, now, 24 * 3600.0, hows=PREFLIGHT_ONLY) if self.signal else []
        if any(f.pod.startswith(prefix) for f in failures):
            return FAILED
        first = self._failed_seen.setdefault(job, now)
        return UNKNOWN if now - first >= SIGNAL_WAIT_S else ""

    def _count(self, node: str, job: str, result: str) -> None:
        self.ctx.metrics.idle_checks.inc(result=result)
        self._counted.add(job)
        self._failed_seen.pop(job, None)
        self._checked[node] = self.ctx.clock()  # the next check an interval from this one's end
        try:
            delete_job(self.ctx.client, job, self.ctx.settings.jobs_namespace, dry_run=self.ctx.settings.dry_run)
        except errors.KubeError as exc:
            log.warning("idle check Job not deleted", extra={"job": job, "error": str(exc)})

    # ---- new checks ---------------------------------------------------------------------------------------

    def _start(self, running: int) -> None:
        image = self.ctx.settings.preflight_image
        cap = self.ctx.policy.defaults.preflight.idle_check_max_jobs
        if running >= cap or not image:
            return
        now = self.ctx.clock()
        due = sorted(self._due(now), key=lambda pair: pair[0])
        slots, looks = cap - running, (cap - running) * LOOKS_PER_SLOT
        for _, node in due:
            if slots <= 0 or looks <= 0:
                break
            looks -= 1
            if self._start_on(node, now, image):
                slots -= 1

    def _due(self, now: float) -> list[tuple[float, Node]]:
        """(since when it is due, node) for each eligible node whose interval has passed, without a check."""
        on_nodes = {job_node(j) for j in self.ctx.jobs.all()
                    if ((j.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL) == KIND
                    and (j.get("metadata") or {}).get("name") not in self._counted}
        found = []
        for node in self.ctx.owned_gpu_nodes():
            name = name_of(node)
            policy = self.ctx.policy_for(node).preflight
            interval = policy.idle_check_interval_s
            if not interval or not policy.enabled or name in on_nodes:
                continue
            if why_not_eligible(node, record_from_node(node)):
                self._quiet_since.pop(name, None)  # out of service: quiet again only from its return
                continue
            since = max(self._quiet_since.setdefault(name, now), self._checked.get(name, 0.0))
            if now - since >= interval:
                found.append((since + interval, node))
        return found

    def _start_on(self, node: Node, now: float, image: str) -> bool:
        name = name_of(node)
        policy = self.ctx.policy_for(node)
        interval = policy.preflight.idle_check_interval_s
        try:
            busy, ended = gpu_use(list_node_pods(self.ctx.client, name), policy.gpu_resources.names)
        except errors.KubeError as exc:
            log.warning("idle check: pods not listed", extra={"node": name, "error": str(exc)})
            return False
        if busy or now - ended < interval:
            self._quiet_since[name] = now if busy else ended
            return False
        hold = validation_hold(node, policy.gpu_resources.names)
        if hold.problem:  # no GPU to hold, or the device plugin offers fewer than it has: not idle-checkable
            self._quiet_since[name] = now
            return False
        stamp = hashlib.sha256(f"{name}@{now:.0f}".encode()).hexdigest()[:12]
        job = build_idle_check(node, f"{KIND}/{stamp}", namespace=self.ctx.settings.jobs_namespace, image=image,
                               policy=policy.preflight, gpus=hold.requests,
                               service_account=policy.validation.job.service_account)
        try:
            ensure_job(self.ctx.client, job, dry_run=self.ctx.settings.dry_run)
        except errors.KubeError as exc:
            log.warning("idle check Job not created", extra={"node": name, "error": str(exc)})
            self._checked[name] = now  # asked again an interval from now, not every pass
            return False
        self._checked[name] = now
        log.info("idle check started", extra={"node": name, "job": job["metadata"]["name"]})
        return True
