"""A failed preflight as a finding (issue 46): the failed-pod reducer recognises the preflight init container by name
and its ``preflight failed`` line (never its ``unknown``, never its other words as a GPU error), the judge gives
the node one ``preflight-failed`` finding per run, the workload judge does not count it, and the replay drives it
through the detect loop's batch to the policy's action (the breaker counting a storm of them)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.policy.config import PolicyError, loads_policy
from gpuremediate.policy.preflight import PreflightJudge, PreflightPolicy
from gpuremediate.policy.workload import WorkloadJudge
from gpuremediate.signals.workload import PREFLIGHT, WorkloadSignal, failure_of, reduce
from gpuremediate.vocab.preflight import CONTAINER_NAME, KIND_PREFLIGHT, failed_message, unknown_message
from sim.history import Fleet
from tests.replay.helpers import HOUR, T0, fleet, moves, run

UUID = "GPU-5e3f8a11-7c2b-4e55-9a3e-0c1d2e3f4a5b"
FAILED_LINE = failed_message((UUID,), "ecc-dbe", f"GPU {UUID} has 2 volatile double-bit ECC error(s)")


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def preflighted(name: str, message: str, *, node: str = "node-1", at: float = T0, code: int = 1,
                phase: str = "Failed", restarted: bool = False) -> dict[str, Any]:
    """A pod whose preflight init container ended with ``message`` (restarted: in place, the pod still Pending)."""
    ended = {"terminated": {"exitCode": code, "reason": "Error", "message": message, "startedAt": stamp(at - 5),
                            "finishedAt": stamp(at)}}
    init = {"name": CONTAINER_NAME, "ready": False, "restartCount": 1 if restarted else 0,
            **({"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": ended} if restarted
               else {"state": ended})}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "creationTimestamp": stamp(at - 10),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                              "uid": "uid-job", "controller": True}]},
            "spec": {"nodeName": node, "restartPolicy": "Always" if restarted else "Never"},
            "status": {"phase": phase, "startTime": stamp(at - 10), "initContainerStatuses": [init],
                       "containerStatuses": [{"name": "train", "state": {"waiting": {"reason": "PodInitializing"}}}]}}


def test_the_reducer_reads_a_failed_preflight_with_its_owner() -> None:
    failure = failure_of(reduce(preflighted("p", FAILED_LINE)))
    assert failure is not None and (failure.how, failure.node, failure.at) == (PREFLIGHT, "node-1", T0)
    assert failure.text == FAILED_LINE and failure.uid == "uid-p"
    assert failure.owners == (("batch/v1", "Job", "train", "uid-job"),)
    restarted = failure_of(reduce(preflighted("p", FAILED_LINE, phase="Pending", restarted=True)))
    assert restarted is not None and restarted.how == PREFLIGHT and restarted.at == T0


@pytest.mark.parametrize("message", [
    unknown_message("nvidia-smi: nvidia-smi exited 9 (Failed to initialize NVML: driver not loaded)"),
    "preflight failed but not in the contract's words",
    "no CUDA-capable device is detected",  # the preflight's own words are never matched as a workload GPU error
])
def test_an_unknown_or_unreadable_preflight_is_no_failure(message: str) -> None:
    assert failure_of(reduce(preflighted("p", message))) is None
    assert failure_of(reduce(preflighted("p", FAILED_LINE, code=0))) is None  # --on-unknown pass exits 0


def test_one_finding_per_run_naming_the_gpu_and_the_workload_judge_does_not_count_it() -> None:
    signal = WorkloadSignal()
    judge = PreflightJudge(signal)
    policy = PreflightPolicy()
    assert judge.findings("node-1", T0, policy) == []
    signal.seen(reduce(preflighted("p0", FAILED_LINE)))
    [finding] = judge.findings("node-1", T0 + 30, policy)
    assert (finding.kind, finding.code, finding.gpus, finding.action) == (KIND_PREFLIGHT, "ecc-dbe", (UUID,),
                                                                          "reset-gpu")
    assert "ml/p0" in finding.message and "ecc-dbe" in finding.message
    signal.seen(reduce(preflighted("p1", failed_message(("0",), "dcgm-diag", "GPU Memory: failed"), at=T0 + 60)))
    [again] = judge.findings("node-1", T0 + 90, policy)
    assert again.fingerprint == finding.fingerprint and again.gpus == (UUID, "node-1/gpu0")
    assert WorkloadJudge(signal).findings("node-1", T0 + 90, min_pods=1, window_s=600, action="cordon") == []
    assert judge.findings("node-1", T0 + 4000, policy) == []  # out of the window
    two = PreflightPolicy(min_failures=3)
    assert judge.findings("node-1", T0 + 90, two) == []
    assert judge.findings("node-1", T0 + 90, PreflightPolicy(enabled=False)) == []


def test_the_policy_section_parses_and_refuses_bad_values() -> None:
    policy = loads_policy('[preflight]\nmin_failures = 2\naction = "cordon"\ncommand = "all_reduce_perf -g 8"\n',
                          "t").defaults.preflight
    assert (policy.min_failures, policy.action, policy.command) == (2, "cordon", "all_reduce_perf -g 8")
    for bad in ('on_unknown = "maybe"', "min_failures = 0", 'command = "\'open"', 'action = ""'):
        with pytest.raises(PolicyError, match="preflight"):
            loads_policy(f"[preflight]\n{bad}\n", "t")


def with_pods(*pods: dict[str, Any], count: int = 4) -> Fleet:
    scenario = fleet(count=count, hours=3.0)
    scenario.pods = list(pods)
    return scenario


def test_replay_a_failed_preflight_takes_the_node_through_the_policys_action(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(preflighted("train-0", FAILED_LINE, node="node-2", at=T0 + HOUR)))
    first = moves(result)[0]
    assert first[1:] == ("node-2", "healthy", "draining", KIND_PREFLIGHT) and HOUR <= first[0] <= HOUR + 60
    cordoned = run(tmp_path / "c", with_pods(preflighted("train-0", FAILED_LINE, node="node-2", at=T0 + HOUR)),
                   '[preflight]\naction = "cordon"\n')
    assert [m[1:] for m in moves(cordoned)] == [("node-2", "healthy", "cordoned", KIND_PREFLIGHT)]
    unknown = run(tmp_path / "u", with_pods(preflighted("train-0", unknown_message("no nvidia-smi"), node="node-2",
                                                         at=T0 + HOUR, code=3)))
    assert moves(unknown) == []
    off = run(tmp_path / "o", with_pods(preflighted("train-0", FAILED_LINE, node="node-2", at=T0 + HOUR)),
              "[preflight]\nenabled = false\n")
    assert moves(off) == []


def test_replay_a_failed_preflight_on_every_node_at_once_opens_the_breaker(tmp_path: Path) -> None:
    pods = [preflighted(f"train-{i}", FAILED_LINE, node=f"node-{i}", at=T0 + HOUR) for i in range(10)]
    result = run(tmp_path, with_pods(*pods, count=10), '[preflight]\naction = "cordon"\n')
    cordoned = {m[1] for m in moves(result) if m[3] == "cordoned"}
    assert len(cordoned) < 10  # a bad image failing every preflight must not cordon the fleet
    assert result.trips  # the breaker opened on them


def test_a_lost_gpu_takes_the_reboot_rung_where_the_policy_says_reset_gpu() -> None:
    """A reset needs the GPU on the bus: a preflight naming a GPU lost (XID 79) reboots the node; an operator's
    cordon or quarantine stays theirs."""
    lost = failed_message(("pci0000:5d:00.0",), "gpu-lost", "GPU at PCI 0000:5d:00.0 is lost: GPU is lost.")
    signal = WorkloadSignal()
    signal.seen(reduce(preflighted("p0", lost)))
    [finding] = PreflightJudge(signal).findings("node-1", T0 + 30, PreflightPolicy())
    assert (finding.code, finding.gpus, finding.action) == ("gpu-lost", ("node-1/pci0000:5d:00.0",), "reboot")
    assert finding.message.endswith("action reboot")
    [kept] = PreflightJudge(signal).findings("node-1", T0 + 30, PreflightPolicy(action="cordon"))
    assert kept.action == "cordon"
