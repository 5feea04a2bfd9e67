"""GPU-level isolation without DRA (issue 26, ``[isolation] scope = "gpu"``, ``without_dra = "device-plugin"``).

The nodes offer their GPUs as ``nvidia.com/gpu`` (no ResourceSlice) and NVIDIA's device plugin takes a GPU with a
critical XID out of the node's allocatable (``SimCluster(device_plugin="health")``: sim.device_plugin); each
workload pod holds one GPU and dcgm-exporter maps it to that GPU. An XID 48 on GPU 3 evicts only GPU 3's pod
while the node stays schedulable, GPU 3 alone is reset, and the validation is node-level (no pod can ask the
device plugin for GPU 3 alone): the node is cordoned for it and the record says so. A device plugin that does not
drop the GPU (``device_plugin="blind"``) makes the fault node-level after ``device_plugin_wait_s``, said in the
record and an Event.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import JOBS_NS, EmulatorCluster, make_cluster
from gpuremediate.kube.resources import JOBS, PODS
from gpuremediate.vocab.record import EFFECT_UNHEALTHY, SCOPE_GPU, SCOPE_NODE, VIA_DEVICE_PLUGIN
from sim.gpusim import gpu_uuid

GPUS = 8
WAIT_S = 2.0
BY_DEVICE_PLUGIN: dict[str, dict[str, Any]] = {
    "isolation": {"scope": "gpu", "without_dra": "device-plugin", "device_plugin_wait_s": WAIT_S},
    "drain": {"retry_s": 0.3, "timeout_s": 30},
}
# A reset Job that runs until the scenario lets it end (``release_reset``): what the scenario looks at while the node
# is repairing (two CLI subprocesses take seconds on a loaded machine) stays so, instead of racing a 2 s Job.
HELD_S = 3600.0
HELD_RESET: dict[str, dict[str, Any]] = {**BY_DEVICE_PLUGIN, "remediation.reset_gpu": {"timeout_s": 600}}


def hold_reset(c: EmulatorCluster, node: str) -> None:
    assert c.sim.nodesim is not None
    c.sim.nodesim.set_job_outcome(node, succeed=True, duration_s=HELD_S, kind="reset-gpu")


def release_reset(c: EmulatorCluster, node: str) -> None:
    """The running reset Job ends now (NodeSim reads a Job's outcome at each tick)."""
    assert c.sim.nodesim is not None
    c.sim.nodesim.set_job_outcome(node, succeed=True, duration_s=0.2, kind="reset-gpu")


def cluster_with(tmp_path: Path, device_plugin: str) -> Iterator[EmulatorCluster]:
    """A started device-plugin cluster (controller not started), one pod per GPU on its first node, each mapped to
    its GPU by the exporter."""
    c = make_cluster(tmp_path, device_plugin=device_plugin)
    assert isinstance(c, EmulatorCluster), c
    c.start()
    try:
        node = c.nodes[0]
        for gpu in range(GPUS):
            c.workload(f"w{gpu}", node)
            c.sim.gpusim.set_pod(node, gpu, "workloads", f"w{gpu}")
        c.wait(lambda: all(c.pod_exists(f"w{gpu}") for gpu in range(GPUS)), 10, "the workloads")
        yield c
    finally:
        tail = c.controller_log().splitlines()[-40:]
        c.stop()
        print("\n".join(tail))


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[EmulatorCluster]:
    yield from cluster_with(tmp_path, "health")


@pytest.fixture
def blind(tmp_path: Path) -> Iterator[EmulatorCluster]:
    yield from cluster_with(tmp_path, "blind")


def allocatable(c: EmulatorCluster, node: str) -> str:
    return str(c.node(node)["status"]["allocatable"].get("nvidia.com/gpu"))


def cordoned_before_validation(c: EmulatorCluster) -> str | None:
    node = c.nodes[0]
    if c.unschedulable(node) and c.state(node) != "validating":
        return f"{node} cordoned while {c.state(node)}"
    return None


def gpu_ids(job: dict[str, Any]) -> str:
    env = job["spec"]["template"]["spec"]["containers"][0].get("env") or []
    return next((str(e.get("value", "")) for e in env if e.get("name") == "GPU_IDS"), "")


def gpu_limits(job: dict[str, Any]) -> dict[str, str]:
    return dict(job["spec"]["template"]["spec"]["containers"][0].get("resources", {}).get("limits") or {})


def test_xid48_on_gpu3_evicts_only_its_pod_resets_it_and_validates_node_level(plugin: EmulatorCluster) -> None:
    c, node = plugin, plugin.nodes[0]
    assert c.sim.nodesim is not None
    hold_reset(c, node)  # repairing until the scenario has looked at it
    c.start_controller(HELD_RESET)
    with c.invariant(lambda: cordoned_before_validation(c), "schedulable until its validation"):
        c.inject(node, 3, "xid", 48)
        c.wait(lambda: "workloads/w3" in c.evicted(), 20, "the pod on GPU 3 evicted")
        record = c.wait_state(node, "repairing", timeout=20)
        assert allocatable(c, node) == str(GPUS - 1), "the device plugin holds GPU 3 out"
        isolation = record.isolation
        assert isolation is not None and (isolation.scope, isolation.via, isolation.effect) == \
            (SCOPE_GPU, VIA_DEVICE_PLUGIN, EFFECT_UNHEALTHY)
        assert isolation.uuid == gpu_uuid(node, 3) and not isolation.rule
        status = c.cli("status")
        assert f"{GPUS - 1}/{GPUS} GPUs" in status.stdout, status.stdout + status.stderr
        explained = c.cli("explain", node).stdout
        assert "taken out alone by the device plugin" in explained, explained
        c.wait_metric("gpuremediate_isolated_gpus", 1)
        assert c.evicted() == {"workloads/w3"}, "only the pod on GPU 3 moved"
        assert all(c.pod_exists(f"w{gpu}") for gpu in range(GPUS) if gpu != 3), "the other pods keep running"
        c.workload("newcomer", node)  # the node still takes new pods (the kubelet admits it: 7 GPUs offered)
        release_reset(c, node)
        c.wait(lambda: c.unschedulable(node), 20, "the node cordoned for its node-level validation")
    rec = c.wait(lambda: c.blocked_record(node, "gpu-pods"), 20, "the validation waiting for the other GPUs' pods",
                 seen=lambda: c.summary(node))
    assert rec is not None and rec.isolation is not None and rec.isolation.scope == SCOPE_NODE
    assert "validation is node-level" in rec.isolation.why and "cordoned" in rec.message
    event = c.wait_event(node, "GPUValidationNodeLevel")
    assert gpu_uuid(node, 3) in str(event.get("message"))
    assert [gpu_ids(j) for j in c.jobs(node, "reset-gpu")] == ["3"], "GPU 3 alone is reset"
    assert c.jobs(node, "validate") == [], "no validation Job while the other GPUs are held"
    for name in [f"w{gpu}" for gpu in range(GPUS) if gpu != 3] + ["newcomer"]:  # a person drains them
        c.kube.delete(PODS, name, "workloads")
    c.wait_state(node, "healthy", timeout=40)
    assert not c.unschedulable(node), "uncordoned: the cordon was ours"
    [validation] = c.jobs(node, "validate")
    assert gpu_limits(validation) == {"nvidia.com/gpu": str(GPUS)}, "node-level: every GPU"
    assert "GPUIsolated" in c.event_reasons(node)
    history = c.record(node).history  # type: ignore[union-attr]
    assert history[-1].scope == SCOPE_GPU, "GPU 3 failing again within the window is node-level"
    c.stop_controller()
    assert c.log_problems() == []


def test_privileged_validation_checks_gpu3_alone_and_never_cordons(plugin: EmulatorCluster) -> None:
    c, node = plugin, plugin.nodes[0]
    c.start_controller({**BY_DEVICE_PLUGIN, "isolation": {**BY_DEVICE_PLUGIN["isolation"],
                                                          "validation": "privileged"}})
    with c.invariant(lambda: f"{node} was cordoned" if c.unschedulable(node) else None, "never cordoned"):
        c.inject(node, 3, "xid", 48)
        c.wait(lambda: "workloads/w3" in c.evicted(), 20, "the pod on GPU 3 evicted")
        c.wait_state(node, "healthy", timeout=40)
    [validation] = c.jobs(node, "validate")
    assert gpu_ids(validation) == "3" and gpu_limits(validation) == {}, "GPU 3 alone, no GPU asked for"
    assert c.evicted() == {"workloads/w3"}
    assert allocatable(c, node) == str(GPUS), "reset: the device plugin offers it again"
    assert "GPUIsolated" in c.event_reasons(node) and "GPUReturned" in c.event_reasons(node)


def test_allocatable_that_never_drops_goes_node_level_and_says_so(blind: EmulatorCluster) -> None:
    c, node = blind, blind.nodes[0]
    c.start_controller(BY_DEVICE_PLUGIN)
    c.inject(node, 3, "xid", 48)
    c.wait(lambda: c.unschedulable(node), 15 + WAIT_S, "the node cordoned: node-level")
    event = c.wait_event(node, "GPUIsolationNodeLevel")
    assert "did not mark" in str(event.get("message")) and "cordoned" in str(event.get("message")), event
    record = c.record(node)
    assert record is not None and record.isolation is not None and record.isolation.scope == SCOPE_NODE
    assert f"stayed {GPUS} of {GPUS}" in record.isolation.why and "node-level" in record.message
    c.wait_state(node, "healthy", timeout=40)
    assert not c.unschedulable(node)
    assert {f"workloads/w{gpu}" for gpu in range(GPUS)} <= c.evicted(), "node-level: the usual drain"


def test_a_second_gpu_failing_while_one_is_isolated_goes_node_level(plugin: EmulatorCluster) -> None:
    c, node = plugin, plugin.nodes[0]
    assert c.sim.nodesim is not None
    hold_reset(c, node)  # GPU 3's reset still runs when GPU 5 fails
    c.start_controller(HELD_RESET)
    c.inject(node, 3, "xid", 48)
    first = c.wait_state(node, "repairing", timeout=20)
    assert first.isolation is not None and first.isolation.by_device_plugin and first.isolation.at_gpu
    assert not c.unschedulable(node)
    c.inject(node, 5, "xid", 48)
    c.wait(lambda: c.unschedulable(node), 15, "the node cordoned: node-level now")
    record = c.record(node)
    assert record is not None and record.isolation is not None and record.isolation.scope == SCOPE_NODE
    assert record.fault is not None and set(record.fault.gpus) == {gpu_uuid(node, 3), gpu_uuid(node, 5)}
    c.wait_event(node, "GPUIsolationEscalated")
    release_reset(c, node)
    c.wait_state(node, "healthy", timeout=40)
    assert not c.unschedulable(node), "uncordoned: the cordon was ours"
    assert "3,5" in [gpu_ids(j) for j in c.jobs(node, "reset-gpu")], "both GPUs reset node-level"


def test_dry_run_evicts_nothing(plugin: EmulatorCluster) -> None:
    c, node = plugin, plugin.nodes[0]
    c.start_controller(BY_DEVICE_PLUGIN, dry_run=True)
    with c.invariant(lambda: f"{node} was cordoned" if c.unschedulable(node) else None, "never cordoned"):
        c.inject(node, 3, "xid", 48)
        c.wait(lambda: allocatable(c, node) == str(GPUS - 1), 10, "the device plugin holding GPU 3 out")
        c.holds(lambda: not c.evicted(), 3.0 + WAIT_S, "no pod is evicted")
    assert all(c.pod_exists(f"w{gpu}") for gpu in range(GPUS))
    assert c.kube.list(JOBS, JOBS_NS)["items"] == [], "a dry run creates no Job"
