"""NVIDIA's device plugin's health in the simulated cluster (``sim.device_plugin``): a GPU with a critical XID leaves
the node's allocatable nvidia.com/gpu (an application XID does not), a reset GPU comes back; ``blind`` never drops."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NODES
from sim.device_plugin import BLIND, HEALTH, DevicePluginHealth
from sim.gpusim import GpuSim
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim

NODE = "gpu-1"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[KubeClient, NodeSim, GpuSim]]:
    srv = KubeAPIServer().start()
    client = KubeClient(load_config(srv.write_kubeconfig(tmp_path / "kubeconfig")))
    nodes = NodeSim(client, grace_cap_s=0.3, tick_s=0.05)
    nodes.add_node(NODE, gpus=8)
    gpus = GpuSim(port=0, files_dir=str(tmp_path / "hosts"))
    gpus.add_node(NODE, gpus=8)
    yield client, nodes, gpus
    nodes.stop()
    client.close()
    srv.stop()


def offered(client: KubeClient) -> tuple[str, str]:
    status = client.get(NODES, NODE)["status"]
    return status["allocatable"]["nvidia.com/gpu"], status["capacity"]["nvidia.com/gpu"]


def test_a_critical_xid_leaves_allocatable_until_the_reset(env: tuple[KubeClient, NodeSim, GpuSim]) -> None:
    client, nodes, gpus = env
    plugin = DevicePluginHealth(gpus, nodes, [NODE], HEALTH)
    gpus.inject_xid(NODE, 2, 13)  # an application error: the plugin skips it
    plugin.tick()
    assert offered(client) == ("8", "8")
    gpus.inject_xid(NODE, 3, 48)
    plugin.tick()
    assert offered(client) == ("7", "8")
    gpus.reset_gpu(NODE, 3)
    plugin.tick()
    assert offered(client) == ("8", "8")


def test_blind_never_drops_allocatable(env: tuple[KubeClient, NodeSim, GpuSim]) -> None:
    client, nodes, gpus = env
    plugin = DevicePluginHealth(gpus, nodes, [NODE], BLIND)
    gpus.inject_xid(NODE, 3, 48)
    plugin.tick()
    assert plugin.unhealthy(NODE) == 0 and offered(client) == ("8", "8")
    with pytest.raises(ValueError, match="expected one of health, blind"):
        DevicePluginHealth(gpus, nodes, [NODE], "off")
