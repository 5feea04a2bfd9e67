"""NodeSim's MIG nodes and unhealthy GPUs (issue 13): capacity, allocatable and GPU feature discovery's labels
as the device plugin and GFD show them, and the kubelet's admission refusing what allocatable cannot hold."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.gpu_resources import validation_hold
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NAMESPACES, NODES, PODS
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim
from sim.waiting import wait_for


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[KubeClient, NodeSim]]:
    srv = KubeAPIServer().start()
    client = KubeClient(load_config(srv.write_kubeconfig(tmp_path / "kubeconfig")))
    client.create(NAMESPACES, {"metadata": {"name": "work"}})
    sim = NodeSim(client, grace_cap_s=0.3, tick_s=0.05)
    yield client, sim
    sim.stop()
    client.close()
    srv.stop()


def gpu_status(client: KubeClient, name: str, section: str) -> dict[str, str]:
    return {k: v for k, v in client.get(NODES, name)["status"][section].items() if k.startswith("nvidia.com/")}


def pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": "gpu-1", "containers": [
        {"name": "c", "image": "x", "resources": {"limits": limits}}]}}


def test_mixed_strategy_lists_each_profile_and_the_whole_gpus(env: tuple[KubeClient, NodeSim]) -> None:
    client, sim = env
    sim.add_node("gpu-1", gpus=8)
    sim.set_mig("gpu-1", "mixed", ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), mig_gpus=6)
    wanted = {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "6", "nvidia.com/mig-2g.20gb": "6",
              "nvidia.com/mig-1g.10gb": "12"}
    assert gpu_status(client, "gpu-1", "capacity") == wanted == gpu_status(client, "gpu-1", "allocatable")
    labels = client.get(NODES, "gpu-1")["metadata"]["labels"]
    assert labels["nvidia.com/mig.strategy"] == "mixed" and labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "12" and labels["nvidia.com/mig.config.state"] == "success"


def test_single_strategy_counts_mig_devices_as_gpus(env: tuple[KubeClient, NodeSim]) -> None:
    client, sim = env
    sim.add_node("gpu-1", gpus=8)
    sim.set_mig("gpu-1", "mixed", ("3g.40gb",))
    sim.set_mig("gpu-1", "single", ("1g.10gb",) * 7)
    assert gpu_status(client, "gpu-1", "capacity") == {"nvidia.com/gpu": "56"}  # the mixed profiles are gone
    labels = client.get(NODES, "gpu-1")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "56" and "nvidia.com/mig-3g.40gb.count" not in labels
    with pytest.raises(ValueError, match="single strategy needs every GPU split into one profile"):
        sim.set_mig("gpu-1", "single", ("3g.40gb", "1g.10gb"))


def test_unhealthy_gpus_leave_allocatable_and_pods_asking_for_them_are_refused(
        env: tuple[KubeClient, NodeSim]) -> None:
    client, sim = env
    sim.add_node("gpu-1", gpus=8)
    sim.set_unhealthy("gpu-1", "nvidia.com/gpu", 1)
    assert gpu_status(client, "gpu-1", "capacity") == {"nvidia.com/gpu": "8"}
    assert gpu_status(client, "gpu-1", "allocatable") == {"nvidia.com/gpu": "7"}
    assert validation_hold(client.get(NODES, "gpu-1")).short == {"nvidia.com/gpu": (7, 8)}
    client.create(PODS, pod("all-eight", {"nvidia.com/gpu": "8"}), "work")
    client.create(PODS, pod("seven", {"nvidia.com/gpu": "7"}), "work")
    sim.start()
    refused = wait_for(lambda: (p := client.get(PODS, "all-eight", "work"))["status"].get("phase") == "Failed" and p,
                       5, "the 8-GPU pod refused")
    assert refused["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert "requested: 8" in refused["status"]["message"] and "capacity: 7" in refused["status"]["message"]
    wait_for(lambda: client.get(PODS, "seven", "work")["status"].get("phase") == "Running", 5, "the 7-GPU pod runs")


def test_plain_nodes_admit_as_before(env: tuple[KubeClient, NodeSim]) -> None:
    client, sim = env
    sim.add_node("gpu-1", gpus=1)
    client.create(PODS, pod("two", {"nvidia.com/gpu": "2"}), "work")  # older scenarios oversubscribe
    sim.start()
    wait_for(lambda: client.get(PODS, "two", "work")["status"].get("phase") == "Running", 5, "the pod runs")
