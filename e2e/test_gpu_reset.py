"""reset-gpu on GPU Operator nodes (issue 13, part 2): the operands go off through their deploy labels, the GPU
is reset, the labels come back; a failure restores first; a killed controller's successor restores.

The nodes are simulated GPU Operator nodes (``SimCluster(gpu_operator=True)``, sim.cluster.OperatorSim): the
device plugin, DCGM, dcgm-exporter and GPU Feature Discovery run as pods while their
``nvidia.com/gpu.deploy.<operand>`` label is "true" and hold the GPUs, so gpu-sim refuses a reset while they run.
The operator and gpu-sim's holders run in process: the emulator and apiserver targets (on the latter the real
DaemonSet controller and scheduler make and remove the operand pods; OperatorSim follows them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import EmulatorCluster, make_cluster
from gpuremediate.actions.operands import OPERAND_ANNOTATION
from gpuremediate.kube.resources import JOBS
from sim.cluster import DEPLOY_LABEL, OPERANDS

NODE = "gpu-node-1"
DEPLOY_LABELS = [DEPLOY_LABEL + operand for operand in OPERANDS]
ALL_ON = dict.fromkeys(DEPLOY_LABELS, "true")
POLICY: dict[str, dict[str, Any]] = {
    "remediation.reset_gpu": {"timeout_s": 20},
    "gpu_operator": {"gone_timeout_s": 10, "back_timeout_s": 20},
}

Factory = Callable[..., EmulatorCluster]


@pytest.fixture
def operator_cluster(tmp_path: Path) -> Iterator[Factory]:
    """``make(products=None)``: a started GPU Operator cluster of the target, controller not started."""
    made: list[EmulatorCluster] = []

    def make(products: dict[str, str] | None = None) -> EmulatorCluster:
        c = make_cluster(tmp_path, gpu_operator=True, products=products)
        assert isinstance(c, EmulatorCluster), c  # the operator is simulated in process
        made.append(c.start())
        return c

    yield make
    for c in made:
        tail = c.controller_log().splitlines()[-40:]
        c.stop()
        print("\n".join(tail))


def deploy_labels(c: EmulatorCluster) -> dict[str, str | None]:
    labels = c.node(NODE)["metadata"].get("labels") or {}
    return {label: labels.get(label) for label in DEPLOY_LABELS}


def annotation(c: EmulatorCluster) -> str | None:
    return (c.node(NODE)["metadata"].get("annotations") or {}).get(OPERAND_ANNOTATION)


def step(c: EmulatorCluster) -> str:
    record = c.record(NODE)
    return record.action.step if record is not None and record.action is not None else ""


def repaired(c: EmulatorCluster) -> bool:
    record = c.record(NODE)
    return record is not None and record.state == "healthy" and len(record.history) >= 1


def reset_gpu_ids(c: EmulatorCluster) -> list[str]:
    jobs = c.kube.list(JOBS, "gpuremediate-jobs", label_selector="gpuremediate.io/job=reset-gpu")["items"]
    return [next(e["value"] for e in j["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "GPU_IDS")
            for j in jobs if j["spec"]["template"]["spec"]["nodeName"] == NODE]


def test_the_bare_reset_is_refused_on_an_operator_node(operator_cluster: Factory) -> None:
    c = operator_cluster()
    c.start_controller({"gpu_operator": {"enabled": False}, "remediation": {"max_attempts": 1}})
    c.inject(NODE, 1, "xid", 48)
    c.wait_state(NODE, "quarantined", timeout=30)
    assert any("In use by another client" in why for node, why in c.sim.reset_refusals if node == NODE)
    assert deploy_labels(c) == ALL_ON


def test_the_sequence_resets_the_gpu_and_brings_the_operands_back(operator_cluster: Factory) -> None:
    c = operator_cluster()
    c.start_controller(POLICY)
    c.inject(NODE, 1, "xid", 48)
    c.wait(lambda: step(c) == "operands-gone", 20, "the operands going off")
    assert set(deploy_labels(c).values()) == {"false"} and annotation(c) is not None
    c.wait(lambda: repaired(c), 40, f"{NODE} reset, validated and healthy")
    assert c.sim.reset_refusals == []
    assert reset_gpu_ids(c) == ["1"]
    assert deploy_labels(c) == ALL_ON and annotation(c) is None
    reasons = c.event_reasons(NODE)
    assert reasons.index("GPUOperandsOff") < reasons.index("GPUOperandsRestored")
    c.stop_controller()
    assert c.log_problems() == []


def test_a_controller_killed_mid_sequence_is_succeeded_by_one_that_restores(operator_cluster: Factory) -> None:
    c = operator_cluster()
    assert c.sim.nodesim is not None
    c.sim.nodesim.set_job_outcome(NODE, succeed=True, duration_s=3.0)  # the kill lands during the reset
    c.start_controller(POLICY)
    c.inject(NODE, 1, "xid", 48)
    c.wait(lambda: step(c) == "reset", 30, "the reset step")
    c.kill_controller()
    assert set(deploy_labels(c).values()) == {"false"}  # off, and the annotation says what they were
    c.start_controller(POLICY)
    c.wait(lambda: repaired(c), 40, f"{NODE} repaired by the restarted controller")
    assert deploy_labels(c) == ALL_ON and annotation(c) is None
    assert reset_gpu_ids(c) == ["1"]  # the first controller's Job, found again, never a second


def test_operands_that_stay_are_restored_before_the_attempt_fails(operator_cluster: Factory) -> None:
    c = operator_cluster()
    assert c.sim.operator is not None
    c.sim.operator.stuck(NODE, "dcgm")
    c.start_controller({**POLICY, "gpu_operator": {"gone_timeout_s": 2}, "remediation": {"max_attempts": 1}})
    c.inject(NODE, 1, "xid", 48)
    record = c.wait_state(NODE, "quarantined", timeout=30)
    assert deploy_labels(c) == ALL_ON and annotation(c) is None
    assert "operand pods still on the node" in record.message
    assert reset_gpu_ids(c) == []


def test_an_nvlink_group_node_is_reset_whole(operator_cluster: Factory) -> None:
    c = operator_cluster(products={NODE: "Tesla-V100-SXM2-32GB"})
    c.start_controller(POLICY)
    c.inject(NODE, 1, "xid", 48)
    c.wait(lambda: repaired(c), 40, f"{NODE} reset whole, validated and healthy")
    assert reset_gpu_ids(c) == [",".join(str(i) for i in range(c.sim.gpus))]
    assert c.sim.reset_refusals == []
    assert deploy_labels(c) == ALL_ON
