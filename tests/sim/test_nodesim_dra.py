"""NodeSim's opt-in DRA side: the ResourceSlice NVIDIA's DRA driver for GPUs would publish for each node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NODES, RESOURCE_SLICES
from sim.gpusim import gpu_uuid
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim
from sim.waiting import wait_for


@pytest.fixture
def client() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    made = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    yield made
    made.close()
    srv.stop()


def test_a_node_gets_one_slice_with_its_gpus_uuids(client: KubeClient) -> None:
    sim = NodeSim(client, dra=True)
    node = sim.add_node("gpu-a", gpus=8)
    (published,) = sim.resource_slices("gpu-a")
    assert published["metadata"]["name"].startswith("00000-gpu.nvidia.com-gpu-a-")
    assert published["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-a", "uid": node["metadata"]["uid"], "controller": True}]
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        "gpu.nvidia.com", "gpu-a", {"name": "gpu-a", "generation": 1, "resourceSliceCount": 1})
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert [d["attributes"]["uuid"]["string"] for d in spec["devices"]] == [gpu_uuid("gpu-a", i) for i in range(8)]
    assert [d["attributes"]["index"]["int"] for d in spec["devices"]] == list(range(8))
    assert spec["devices"][0]["attributes"]["type"] == {"string": "gpu"}


def test_publishing_again_moves_the_pool_generation_only_when_the_devices_change(client: KubeClient) -> None:
    sim = NodeSim(client, dra=True)
    sim.add_node("gpu-a", gpus=8)
    first = sim.resource_slices("gpu-a")[0]
    assert sim.publish_resource_slice("gpu-a")["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    sim.nodes["gpu-a"].gpus = 7  # a GPU fell off the bus
    again = sim.publish_resource_slice("gpu-a")
    assert again["metadata"]["name"] == first["metadata"]["name"]
    assert again["spec"]["pool"]["generation"] == 2 and len(again["spec"]["devices"]) == 7


def test_the_slice_goes_with_its_node_and_is_off_by_default(client: KubeClient) -> None:
    NodeSim(client).add_node("plain", gpus=8)
    assert client.list(RESOURCE_SLICES)["items"] == []
    NodeSim(client, dra=True).add_node("gpu-a", gpus=2)
    client.delete(NODES, "gpu-a")
    wait_for(lambda: client.list(RESOURCE_SLICES)["items"] == [], 10, "the garbage collector to take the slice")
