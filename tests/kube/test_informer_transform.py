"""The node informer keeps only what the controller reads (issue 16: memory that does not grow with what
the cluster stores), from the first list and from every watch event; pods are never cached cluster-wide."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.nodes import boot_id, gpu_count, is_ready
from gpuremediate.kube.cache import Informer, strip_node
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NODES, PODS
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def bulky_status(images: int) -> dict[str, Any]:
    return {
        "capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
        "conditions": [{"type": "Ready", "status": "True"}],
        "nodeInfo": {"bootID": "boot-1", "kubeletVersion": "v1.36.0"},
        "images": [{"names": [f"registry.example/img-{i}@sha256:{i:064d}"], "sizeBytes": i} for i in range(images)],
        "volumesInUse": ["kubernetes.io/csi/ebs^vol-1"],
        "volumesAttached": [{"name": "kubernetes.io/csi/ebs^vol-1", "devicePath": ""}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    }


@pytest.fixture
def client() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    yield KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    srv.stop()


def assert_only_what_is_read(node: dict[str, Any]) -> None:
    assert "managedFields" not in node["metadata"]
    assert LAST_APPLIED not in node["metadata"]["annotations"]
    assert not {"images", "volumesInUse", "volumesAttached", "addresses", "daemonEndpoints"} & set(node["status"])
    assert node["metadata"]["labels"] == {"nvidia.com/gpu.present": "true"}
    assert node["metadata"]["annotations"]["gpuremediate.io/state"] == "{}"
    assert node["metadata"]["resourceVersion"] and node["metadata"]["uid"]
    assert gpu_count(node) == 8 and is_ready(node) and boot_id(node) == "boot-1"


def test_node_informer_strips_what_is_never_read(client: KubeClient) -> None:
    client.create(NODES, {"metadata": {
        "name": "n1", "labels": {"nvidia.com/gpu.present": "true"},
        "annotations": {LAST_APPLIED: "{" + "x" * 10_000 + "}", "gpuremediate.io/state": "{}"},
    }})
    client.patch(NODES, "n1", {"status": bulky_status(50)}, subresource="status")
    informer = Informer(client, NODES).start()
    updates: list[dict[str, Any]] = []
    informer.add_handler(on_update=lambda _old, new: updates.append(new))
    try:
        assert informer.wait_for_sync(10)
        listed = informer.get("n1")
        assert listed is not None
        assert_only_what_is_read(listed)
        client.patch(NODES, "n1", {"status": {"images": bulky_status(60)["images"],
                                              "nodeInfo": {"bootID": "boot-1", "kubeletVersion": "v1.36.1"}}},
                     subresource="status")
        watched = wait_for(lambda: updates and updates[-1], 10, "the watch event")
        assert_only_what_is_read(watched)
        assert_only_what_is_read(informer.get("n1") or {})
    finally:
        informer.stop()


def test_strip_node_leaves_the_original_alone() -> None:
    node = {"metadata": {"name": "n", "managedFields": [{"manager": "kubelet"}]}, "status": bulky_status(3)}
    stripped = strip_node(node)
    assert "managedFields" in node["metadata"] and len(node["status"]["images"]) == 3
    assert "managedFields" not in stripped["metadata"] and "images" not in stripped["status"]


def test_a_custom_transform_is_applied(client: KubeClient) -> None:
    client.create(NODES, {"metadata": {"name": "n2"}})
    informer = Informer(client, NODES, transform=lambda o: {"metadata": o["metadata"], "seen": True}).start()
    try:
        assert informer.wait_for_sync(10)
        assert (informer.get("n2") or {}).get("seen") is True
    finally:
        informer.stop()


def test_pods_are_never_cached_cluster_wide(client: KubeClient) -> None:
    with pytest.raises(ValueError, match="never cached cluster-wide"):
        Informer(client, PODS)
    Informer(client, PODS, "gpu-operator", label_selector="app=nvidia-dcgm-exporter")  # one namespace is fine


def test_a_relist_that_finds_a_name_under_a_new_uid_says_delete_then_add(client: KubeClient) -> None:
    """A Node deleted and created again under its name while the watch was down (a replacement under the same
    name): the relist finds the key with another uid. That is another object: handlers hear the old one deleted
    and the new one added (client-go's consumers compare uids; ours rely on the delete to end the old flow)."""
    client.create(NODES, {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.present": "true"}}})
    informer = Informer(client, NODES)
    informer._relist()
    heard: list[tuple[str, str]] = []
    informer.add_handler(on_add=lambda n: heard.append(("add", n["metadata"]["uid"])),
                         on_update=lambda _o, n: heard.append(("update", n["metadata"]["uid"])),
                         on_delete=lambda n: heard.append(("delete", n["metadata"]["uid"])))
    old_uid = client.get(NODES, "n1")["metadata"]["uid"]
    heard.clear()  # add_handler replays the store
    client.delete(NODES, "n1")
    new_uid = client.create(NODES, {"metadata": {"name": "n1"}})["metadata"]["uid"]
    assert new_uid != old_uid
    informer._relist()
    assert heard == [("delete", old_uid), ("add", new_uid)]
    assert informer.get("n1") is not None and informer.get("n1")["metadata"]["uid"] == new_uid  # type: ignore[index]


def test_nodes_decoded_one_by_one_share_their_keys() -> None:
    """A Node from its own watch event holds no copy of a key another cached Node has (a third of its bytes)."""
    import json

    first, second = (strip_node(json.loads(json.dumps({"metadata": {"name": n, "labels": {"team.example/pool": "a"}},
                                                       "status": bulky_status(2)})))
                     for n in ("n1", "n2"))
    assert first["metadata"] == {"name": "n1", "labels": {"team.example/pool": "a"}}
    assert "images" not in first["status"] and first["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    for a, b in ((first, second), (first["metadata"]["labels"], second["metadata"]["labels"]),
                 (first["status"]["conditions"][0], second["status"]["conditions"][0])):
        assert [id(k) for k in a] == [id(k) for k in b]  # the same string objects, not equal copies
