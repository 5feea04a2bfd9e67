"""The agent's NIC watch (agent/network.py): a sysfs tree (sim/nic_sysfs) → GPUNetworkHealthy on the Node."""

from __future__ import annotations

from pathlib import Path

from gpuremediate.agent.network import NetworkWatch, network_condition, sysfs_address
from gpuremediate.policy import conditions as c
from gpuremediate.policy.network import NetworkPolicy
from gpuremediate.signals.nic import NetworkReadings
from sim.nic_sysfs import NicTree
from tests.agent.test_agent_run import World, world  # noqa: F401  # the fixture


def test_nvidia_smi_bus_ids_as_sysfs_names_them() -> None:
    assert sysfs_address("00000000:83:00.0") == "0000:83:00.0"
    assert sysfs_address("0000:17:00.0") == "0000:17:00.0"


def test_no_rdma_device_is_healthy_and_unreadable_is_unknown() -> None:
    assert network_condition(NetworkReadings(), (), "/sys").reason == "NoRdmaDevice"
    unknown = network_condition(NetworkReadings(problems=("/sys/class/infiniband: Permission denied",)), (), "/sys")
    assert (unknown.status, unknown.reason) == ("Unknown", "SysfsUnreadable")


def test_off_writes_no_condition(tmp_path: Path) -> None:
    NicTree(tmp_path)
    assert NetworkWatch("n", str(tmp_path)).cycle(NetworkPolicy(enabled=False), 0.0, None) is None


def test_port_down_names_the_nic_and_its_gpu_then_lifts(world: World) -> None:  # noqa: F811
    tree = NicTree(world.tmp / "sys")  # the H200 capture's GPU (83:00.0) shares mlx5_7's PCIe switch
    agent = world.agent()
    agent.cycle()
    condition = world.condition(c.GPU_NETWORK_HEALTHY)
    assert (condition["status"], condition["reason"]) == ("True", "PortsHealthy")
    assert agent.metrics.nic_port_up.value(device="mlx5_7", port="1", link_layer="InfiniBand") == 1.0

    tree.port_down("mlx5_7")
    world.clock.now += 30
    agent.cycle()
    condition = world.condition(c.GPU_NETWORK_HEALTHY)
    assert (condition["status"], condition["reason"]) == ("False", "NicDown:mlx5_7")
    assert "mlx5_7/1" in condition["message"] and "GPU-" in condition["message"]
    assert agent.metrics.nic_port_up.value(device="mlx5_7", port="1", link_layer="InfiniBand") == 0.0
    assert agent.metrics.nic_findings.value(device="mlx5_7", kind="nic-down") == 1.0
    assert world.condition(c.GPU_HEALTHY)["status"] == "True"  # the GPUs are not blamed

    tree.port_up("mlx5_7")
    world.clock.now += 30
    agent.cycle()
    assert world.condition(c.GPU_NETWORK_HEALTHY)["status"] == "False"  # hysteresis: clearing
    world.clock.now += 61
    agent.cycle()
    assert world.condition(c.GPU_NETWORK_HEALTHY)["reason"] == "PortsHealthy"
