"""The workload signal: Failed pods reduced to their GPU error (or nothing), counted per node in a window."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuremediate.policy.workload import KIND_WORKLOAD, WorkloadJudge
from gpuremediate.signals.workload import ADMISSION, CONTAINER, WorkloadSignal, failure_of, reduce

T0 = 1_796_000_000.0


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def admission_refused(name: str, node: str = "gpu-node-1", at: float = T0) -> dict[str, Any]:
    """What the kubelet leaves of a pod whose device plugin could not hand out a GPU (v1.28+ wording)."""
    return {"metadata": {"name": name, "namespace": "ml", "resourceVersion": "7", "uid": f"u-{name}",
                         "labels": {"big": "x" * 1000}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda"}]},
            "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "startTime": stamp(at),
                       "message": "Pod was rejected: Allocate failed due to requested number of devices unavailable "
                                  "for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected"}}


def crashed(name: str, message: str, *, node: str = "gpu-node-1", at: float = T0, code: int = 1) -> dict[str, Any]:
    terminated = {"exitCode": code, "reason": "Error", "message": message, "finishedAt": stamp(at)}
    return {"metadata": {"name": name, "namespace": "ml", "resourceVersion": "9"},
            "spec": {"nodeName": node},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": terminated}}]}}


def test_a_device_plugin_admission_refusal_is_a_gpu_failure_and_the_cache_keeps_little() -> None:
    reduced = reduce(admission_refused("p"))
    failure = failure_of(reduced)
    assert failure is not None and (failure.pod, failure.node, failure.how) == ("ml/p", "gpu-node-1", ADMISSION)
    assert failure.at == T0 and "nvidia.com/gpu" in failure.text
    assert "labels" not in reduced["metadata"] and "spec" not in reduced  # a few strings, not the pod


def test_gpu_unusable_termination_messages_count_and_application_bugs_do_not() -> None:
    for message in ("RuntimeError: CUDA error: no CUDA-capable device is detected",
                    "cudaErrorDevicesUnavailable: CUDA-capable device(s) is/are busy or unavailable",
                    "CUDA error: uncorrectable ECC error encountered", "Failed to initialize NVML: Unknown Error"):
        failure = failure_of(reduce(crashed("p", message)))
        assert failure is not None and failure.how == CONTAINER, message
    for message in ("RuntimeError: CUDA error: an illegal memory access was encountered",
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "Killed"):
        assert failure_of(reduce(crashed("p", message))) is None, message
    assert failure_of(reduce(crashed("p", "no CUDA-capable device is detected", code=0))) is None  # exit 0


def test_other_admission_refusals_are_not_the_gpus() -> None:
    pod = admission_refused("p")
    pod["status"]["message"] = "Pod was rejected: Node didn't have enough resource: cpu, requested: 4"
    assert failure_of(reduce(pod)) is None


def test_a_node_gets_one_finding_once_enough_pods_failed_within_the_window() -> None:
    signal = WorkloadSignal()
    judge = WorkloadJudge(signal)
    for i in range(2):
        signal.seen(reduce(admission_refused(f"p{i}", at=T0 + 10 * i)))
    signal.seen(reduce(admission_refused("elsewhere", node="gpu-node-2", at=T0)))
    assert judge.findings("gpu-node-1", T0 + 30, min_pods=3, window_s=600, action="cordon") == []
    signal.seen(reduce(admission_refused("p2", at=T0 + 20)))
    [finding] = judge.findings("gpu-node-1", T0 + 30, min_pods=3, window_s=600, action="cordon")
    assert (finding.kind, finding.action, finding.node) == (KIND_WORKLOAD, "cordon", "gpu-node-1")
    assert "3 pods refused at admission" in finding.message and "ml/p2" in finding.message
    signal.seen(reduce(admission_refused("p3", at=T0 + 40)))
    [again] = judge.findings("gpu-node-1", T0 + 50, min_pods=3, window_s=600, action="cordon")
    assert again.fingerprint == finding.fingerprint  # the same run of failures: one fault
    assert judge.findings("gpu-node-1", T0 + 1000, min_pods=3, window_s=600, action="cordon") == []  # aged out
    assert judge.findings("gpu-node-2", T0 + 30, min_pods=3, window_s=600, action="cordon") == []


def test_the_same_pod_seen_again_counts_once_and_a_pod_no_longer_failing_for_the_gpu_drops_out() -> None:
    signal = WorkloadSignal()
    judge = WorkloadJudge(signal)
    for _ in range(3):
        signal.seen(reduce(admission_refused("same")))
    assert judge.findings("gpu-node-1", T0 + 1, min_pods=2, window_s=600, action="cordon") == []
    signal.seen(reduce(admission_refused("other")))
    assert judge.findings("gpu-node-1", T0 + 1, min_pods=2, window_s=600, action="cordon")
    signal.seen(reduce(crashed("other", "Killed")))
    assert judge.findings("gpu-node-1", T0 + 1, min_pods=2, window_s=600, action="cordon") == []


def test_a_refusal_with_no_status_time_is_dated_by_its_creation_never_by_when_it_is_seen() -> None:
    pod = admission_refused("old", at=T0)
    del pod["status"]["startTime"]
    pod["metadata"]["creationTimestamp"] = stamp(T0 - 7 * 86400)  # last week's, relisted by a restarted controller
    failure = failure_of(reduce(pod))
    assert failure is not None and failure.at == T0 - 7 * 86400
    signal = WorkloadSignal()
    judge = WorkloadJudge(signal)
    for i in range(3):
        old = admission_refused(f"old-{i}")
        del old["status"]["startTime"]
        old["metadata"]["creationTimestamp"] = stamp(T0 - 7 * 86400)
        signal.seen(reduce(old))
    assert judge.findings("gpu-node-1", T0, min_pods=3, window_s=600, action="cordon") == []


def test_a_run_of_failures_longer_than_the_window_stays_one_fault_and_a_new_run_is_another() -> None:
    signal = WorkloadSignal()
    judge = WorkloadJudge(signal)
    fingerprints = []
    for i in range(12):  # a pod refused every 5 minutes for an hour: always 2-3 within the 10-minute window
        signal.seen(reduce(admission_refused(f"p{i}", at=T0 + 300 * i)))
        fingerprints += [f.fingerprint for f in judge.findings("gpu-node-1", T0 + 300 * i + 1, min_pods=2,
                                                                window_s=600, action="cordon")]
    assert len(fingerprints) == 11 and len(set(fingerprints)) == 1  # the first pod's, for the whole run
    assert judge.findings("gpu-node-1", T0 + 5000, min_pods=2, window_s=600, action="cordon") == []  # it ended
    for i in range(2):
        signal.seen(reduce(admission_refused(f"q{i}", at=T0 + 6000 + i)))
    [later] = judge.findings("gpu-node-1", T0 + 6002, min_pods=2, window_s=600, action="cordon")
    assert later.fingerprint != fingerprints[0]
