"""spec.taints has no patch merge key in the real API (NodeSpec.Taints carries no patchStrategy tag), so a
strategic merge patch replaces the list as a whole, as a JSON merge patch does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NODES
from sim.kube_patch import strategic_merge
from sim.kubeapi import KubeAPIServer

OTHERS = {"key": "example.com/maintenance", "effect": "NoSchedule"}
OURS = {"key": "gpuremediate.io/unhealthy", "effect": "NoSchedule"}


def test_a_strategic_patch_of_taints_replaces_the_list() -> None:
    node = {"spec": {"taints": [OTHERS]}}
    assert strategic_merge(node, {"spec": {"taints": [OURS]}}) == {"spec": {"taints": [OURS]}}


def test_conditions_still_merge_by_type() -> None:
    node = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    patched = strategic_merge(node, {"status": {"conditions": [{"type": "GPUHealthy", "status": "False"}]}})
    assert [c["type"] for c in patched["status"]["conditions"]] == ["Ready", "GPUHealthy"]


@pytest.fixture
def client(tmp_path) -> Iterator[KubeClient]:  # type: ignore[no-untyped-def]
    api = KubeAPIServer().start()
    path = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    kube = KubeClient(load_config(str(path)))
    try:
        yield kube
    finally:
        kube.close()
        api.stop()


def test_the_emulator_replaces_the_taint_list_on_a_strategic_patch(client: KubeClient) -> None:
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                          "spec": {"taints": [OTHERS]}})
    client.patch(NODES, "n1", {"spec": {"taints": [OURS]}}, patch_type="strategic")
    assert client.get(NODES, "n1")["spec"]["taints"] == [OURS]
