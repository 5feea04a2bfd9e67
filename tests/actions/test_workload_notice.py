"""The workload notice: a GPUFault Event on each pod a fault moves and on its owner, once per fault occurrence."""

from __future__ import annotations

from typing import Any

from gpuremediate.actions.events import EventRecorder, ObjectRef
from gpuremediate.actions.workload_notice import JOBSET_LABEL, REASON, WorkloadNotice, owners, why_of
from gpuremediate.vocab.record import Fault, NodeRecord
from gpuremediate.vocab.states import DRAINING


class Recorder(EventRecorder):
    def __init__(self, dry_run: bool = False) -> None:
        super().__init__(None, host="test", dry_run=dry_run)  # type: ignore[arg-type]
        self.told: list[tuple[ObjectRef, str, str, str]] = []

    def object_event(self, ref: ObjectRef, reason: str, message: str, type_: str = "Normal") -> None:
        self.told.append((ref, reason, message, type_))


def record(fingerprint: str = "xid-48/GPU-aa@1") -> NodeRecord:
    fault = Fault(kind="xid", code="48", gpus=("GPU-aa",), fingerprint=fingerprint, action="reset-gpu",
                  first_seen=1_796_000_000.0, last_seen=1_796_000_000.0, message="double-bit ECC error")
    return NodeRecord(state=DRAINING, fault=fault)


def pod(name: str, *, owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta}


JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid", "controller": True}


def test_the_pod_and_its_job_are_told_the_gpu_the_fault_and_when() -> None:
    events = Recorder()
    why = why_of("gpu-node-1", record(), "evicted by gpuremediate's drain")
    written = WorkloadNotice().tell(events, record(), [pod("train-0", owner=JOB)], why)

    assert written == 2
    (pod_ref, reason, message, type_), (job_ref, _, job_message, _) = events.told
    assert (pod_ref.kind, pod_ref.namespace, pod_ref.name, pod_ref.uid) == ("Pod", "ml", "train-0", "uid-train-0")
    assert (job_ref.api_version, job_ref.kind, job_ref.name, job_ref.uid) == ("batch/v1", "Job", "train", "job-uid")
    assert reason == REASON and type_ == "Warning"
    assert "XID 48 on GPU GPU-aa" in message and "gpu-node-1" in message and "2026-" in message
    assert "double-bit ECC error" in message and "evicted" in message
    assert "train-0" in job_message


def test_each_is_told_once_per_fault_and_again_for_another_fault() -> None:
    events, notice = Recorder(), WorkloadNotice()
    pods = [pod("a", owner=JOB), pod("b", owner=JOB)]
    why = why_of("n", record(), "evicted")
    assert notice.tell(events, record(), pods, why) == 3  # two pods, their one Job
    assert notice.tell(events, record(), pods, why) == 0  # a PDB refusal retried: nothing new
    assert notice.tell(events, record("xid-48/GPU-aa@2"), pods[:1], why) == 2  # the next occurrence


def test_only_the_controller_reference_and_a_jobsets_label_are_owners() -> None:
    not_controller = {**JOB, "controller": False}
    assert list(owners(pod("p", owner=not_controller))) == []
    found = list(owners(pod("p", owner=JOB, labels={JOBSET_LABEL: "big-run"})))
    assert [(o.kind, o.name) for o in found] == [("Job", "train"), ("JobSet", "big-run")]


def test_a_dry_run_tells_nobody() -> None:
    events = Recorder(dry_run=True)
    assert WorkloadNotice().tell(events, record(), [pod("a", owner=JOB)], why_of("n", record(), "evicted")) == 0
    assert events.told == []
