"""What the remediate and validate loops share: running one Job per attempt for a node.

Order matters for "never repeat a one-shot side effect": the Job's (deterministic) name is written
into the record first, then the Job is created, then the record notes it created (``action.created``).
A controller killed before the create finds the name in the record, no Job and ``created`` unset: it
creates the Job under that same name, which is idempotent (lookup before create). A Job missing once
``created`` is set was deleted by someone else: that attempt failed, and it is never created again.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpuremediate.actions.custom import created_at
from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.jobs import (
    BOOT_ID_ANNOTATION,
    FAILED,
    FAULT_ANNOTATION,
    JOB_LABEL,
    MISSING,
    RUNNING,
    SUCCEEDED,
    JobSpec,
    build_job,
    create_job_once,
    deadline_exceeded,
    delete_job,
    finished,
    job_name,
    job_outcome,
)
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.gpu_resources import validation_hold
from gpuremediate.loops.base import NodeLoop
from gpuremediate.policy.workflow import JobPolicy
from gpuremediate.vocab.record import ActionInProgress, NodeRecord, mark_created, occurrence, start_action

log = logging.getLogger(__name__)

TIMED_OUT = "timed-out"
DELETED = "deleted"  # created, then deleted by someone else before it finished
EARLIER_JOB_POLL_S = 2.0  # how often an attempt waiting for an earlier flow's Job on its node looks again


def job_spec(policy: JobPolicy, *, request_all_gpus: bool = False, device_claim: str = "") -> JobSpec:
    return JobSpec(
        device_claim=device_claim,
        image=policy.image,
        command=tuple(shlex.split(policy.command)),
        service_account=policy.service_account,
        privileged=policy.privileged,
        host_pid=policy.host_pid,
        timeout_s=int(policy.timeout_s),
        request_all_gpus=request_all_gpus,
    )


def named_gpu_ids(node: str, keys: Iterable[str]) -> list[str]:
    """GPU_IDS from a fault's GPU keys alone: a UUID as it is, ``<node>/gpu<N>`` (a GPU without one) as N."""
    prefix = f"{node}/gpu"
    return sorted({key.removeprefix(prefix) if key.startswith(prefix) else key for key in keys})


class JobLoop(NodeLoop):
    """A node loop whose action is a Job on the node."""

    def fingerprint(self, record: NodeRecord) -> str:
        return occurrence(record)

    def gpu_ids(self, node: Node, record: NodeRecord) -> tuple[list[str], list[str]]:
        """(GPU_IDS, UUIDs) of the faulty GPUs: their indexes from the latest readings (every GPU's for a fault
        naming none). Where the readings do not show them — none yet (a restarted controller before its first
        scrape), the exporter gone (the GPU Operator sequence, a condition acted on while it is down), the GPU
        off the bus — the fault's own names: its UUIDs, which ``nvidia-smi -i`` takes as well as an index."""
        readings = self.ctx.readings.get(name_of(node))
        faulty = set(record.fault.gpus) if record.fault else set()
        uuids = sorted(g for g in faulty if g.startswith("GPU-"))
        gpus = [g for g in readings.gpus if not faulty or g.key in faulty] if readings is not None else []
        if not gpus:
            return named_gpu_ids(name_of(node), faulty), uuids
        return sorted({g.gpu for g in gpus}), sorted({g.uuid for g in gpus if g.uuid})

    def start_job(
        self, node: Node, record: NodeRecord, kind: str, attempt: int, policy: JobPolicy, *,
        timeout_s: float, request_all_gpus: bool = False, detail: str = "",
    ) -> float | None:
        """Write the attempt into the record, then create its Job; unless a Job of ours is still in flight on the
        node outside this record (``_earlier_in_flight``): then it is followed or waited for, never doubled."""
        name = job_name(kind, name_of(node), self.fingerprint(record), attempt)
        earlier = self._earlier_in_flight(node, record, kind, name, attempt, timeout_s)
        if earlier is not None:
            return earlier
        started = start_action(record, kind, name, attempt, self.ctx.clock(), timeout_s, detail)
        written = self.ctx.writer.write(node, started)
        if written is None:
            return self.retry_after_conflict()
        job = self.create_job(written, started, kind, name, attempt, policy, request_all_gpus, boot_id=detail)
        if job is not None:
            self.note_created(written, started, job)
        return 1.0

    def _earlier_in_flight(
        self, node: Node, record: NodeRecord, kind: str, name: str, attempt: int, timeout_s: float,
    ) -> float | None:
        """A Job of ours still running on the node that this record does not name: an earlier flow's (the Node was
        deleted and registered again, its record lost with it) or one being deleted. A Job of the same kind from
        another occurrence is taken over as this attempt: its outcome is this attempt's (a reboot is never run
        twice for one fault); any other is waited for. None: nothing in flight, start as usual."""
        if self.ctx.writer.dry_run:
            return None
        fingerprint = self.fingerprint(record)
        others = [job for job in self.ctx.jobs.on_node(name_of(node))
                  if not finished(job) and job["metadata"]["name"] != name
                  and not self.concluded_by_this_flow(job, record)]
        if not others:
            return None
        same = [job for job in others if not job["metadata"].get("deletionTimestamp")
                and (job["metadata"].get("labels") or {}).get(JOB_LABEL) == kind
                and (job["metadata"].get("annotations") or {}).get(FAULT_ANNOTATION) != fingerprint]
        if len(others) == 1 and same:
            return self._take_over(node, record, same[0], kind, attempt, timeout_s)
        names = ", ".join(sorted(job["metadata"]["name"] for job in others))
        if self._waiting_for.get(name_of(node)) != names:
            self._waiting_for[name_of(node)] = names
            log.info("attempt waits for an earlier Job on the node", extra={"node": name_of(node), "kind": kind,
                                                                          "jobs": names})
            self.ctx.events.node_event(name_of(node), "GPURemediationWaiting",
                                       f"{kind} waits for Job(s) {names} of ours still running on the node", NORMAL)
        return EARLIER_JOB_POLL_S

    def concluded_by_this_flow(self, job: Mapping[str, Any], record: NodeRecord) -> bool:
        """``job`` is an earlier step of this very flow that the flow has already concluded (so not in flight, even
        while its status still reads running). None by default: a loop that knows says which."""
        return False

    def _take_over(self, node: Node, record: NodeRecord, job: Mapping[str, Any], kind: str, attempt: int,
                   timeout_s: float) -> float | None:
        """Record ``job`` as this attempt, created (its pod may be running): followed like a Job of our own."""
        meta = job["metadata"]
        boot_id = str((meta.get("annotations") or {}).get(BOOT_ID_ANNOTATION) or "")
        now = self.ctx.clock()
        started = start_action(record, kind, str(meta["name"]), attempt, now, timeout_s, boot_id)
        if self.ctx.writer.write(node, mark_created(started, created_at(job, now))) is None:
            return self.retry_after_conflict()
        self._waiting_for.pop(name_of(node), None)
        log.warning("following an earlier flow's Job", extra={"node": name_of(node), "job": meta["name"],
                                                               "kind": kind})
        self.ctx.events.node_event(name_of(node), "GPURemediationJob",
                                   f"{kind} Job {meta['name']} of an earlier record of this node (deleted and "
                                   f"registered again?) is still running: this attempt follows it instead of starting "
                                   f"another",
                                   WARNING)
        return 1.0

    @property
    def _waiting_for(self) -> dict[str, str]:
        """node -> the earlier Jobs its attempt was last told to wait for (one Event per change, not per look)."""
        waiting: dict[str, str] = self.__dict__.setdefault("_earlier_jobs_told", {})
        return waiting

    def create_job(
        self, node: Node, record: NodeRecord, kind: str, name: str, attempt: int, policy: JobPolicy,
        request_all_gpus: bool, env: Mapping[str, str] | None = None,
        targets: tuple[list[str], list[str]] | None = None, device_claim: str = "", boot_id: str = "",
    ) -> Mapping[str, Any] | None:
        """Create the attempt's Job unless it exists; the Job as it exists now (None in dry-run). ``boot_id``: a
        reboot's node bootID before it, kept on the Job. With
        ``request_all_gpus`` it asks for the capacity of every GPU resource of the node (every MIG slice);
        ``env`` is added to the Job's own variables (NODE_NAME, GPU_IDS, GPU_UUIDS); ``targets`` (indexes, UUIDs)
        replaces the faulty GPUs in GPU_IDS / GPU_UUIDS; ``device_claim`` names the ResourceClaim its pod takes its
        GPU through (placed by the scheduler then, not by ``nodeName``)."""
        indexes, uuids = targets if targets is not None else self.gpu_ids(node, record)
        gpus = validation_hold(node, self.ctx.policy_for(node).gpu_resources.names).requests if request_all_gpus else {}
        spec = job_spec(policy, request_all_gpus=request_all_gpus, device_claim=device_claim)
        spec = JobSpec(**{**spec.__dict__, "env": {**(env or {}), "GPU_UUIDS": ",".join(uuids)}})
        job = build_job(kind, name_of(node), self.fingerprint(record), attempt, spec,
                        namespace=self.ctx.settings.jobs_namespace, gpus=gpus, gpu_ids=indexes, boot_id=boot_id)
        assert job["metadata"]["name"] == name
        if self.ctx.writer.dry_run:
            self.ctx.events.node_event(name_of(node), "GPURemediationJob", f"would create Job {name} ({kind})", NORMAL)
            return None
        found, created = create_job_once(self.ctx.client, job)
        if created:
            log.info("job created", extra={"node": name_of(node), "job": name, "kind": kind, "attempt": attempt})
        return found

    def attempt_outcome(
        self, action: ActionInProgress, recreate: Callable[[], None],
        note_created: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> str:
        """succeeded / failed / timed-out / deleted / running, for the attempt's Job.

        A Job the Job controller failed at its activeDeadlineSeconds timed out, like one past the record's
        deadline. A Job missing although the record says it was created was deleted by someone else (a person
        stopping it): the attempt failed, the Job is never created again. A Job missing before the deadline and
        never created (killed between the record write and the create) is created now under the same name.
        Past the deadline a missing Job is not created again — the attempt timed out, and the loop writes that
        before deleting anything. ``note_created`` writes ``created`` for a running Job the record does not
        know as created yet (the write after the create was lost).
        """
        job = self.ctx.jobs.read(action.name)
        outcome = job_outcome(job)
        if outcome == FAILED and deadline_exceeded(job):
            return TIMED_OUT  # activeDeadlineSeconds (the same timeout) ended it first: its Job goes too
        if outcome in (SUCCEEDED, FAILED):
            return outcome
        if outcome == MISSING and action.created:
            return DELETED
        if action.deadline is not None and self.ctx.clock() >= action.deadline:
            return TIMED_OUT
        if outcome == MISSING and not self.ctx.writer.dry_run:
            recreate()
        elif job is not None and not action.created and note_created is not None and not self.ctx.writer.dry_run:
            note_created(job)
        return RUNNING

    def read(self, name: str) -> Mapping[str, Any] | None:
        return self.ctx.jobs.read(name)

    def note_created(self, node: Node, record: NodeRecord, job: Mapping[str, Any]) -> None:
        at = created_at(job, self.ctx.clock())
        self.ctx.writer.write(node, mark_created(record, at))  # a 409 is simply noted again on the next step

    def cancel(self, kind: str, name: str, *, with_pods: bool = False) -> None:
        if name and not self.ctx.writer.dry_run:
            delete_job(self.ctx.client, name, self.ctx.settings.jobs_namespace, with_pods=with_pods)


def names(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "-"
