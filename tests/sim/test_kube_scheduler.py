"""The emulator's placement of pods pinned to one node that wait for ResourceClaims (sim.kube_scheduler): the
claim allocated a device of that node that its CEL selector accepts, no other claim holds and whose taints it
tolerates (the tolerations copied into the result), reserved for the pod, the pod bound."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, Resource
from sim.dra_claims import run_on_gpu
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

RULES = Resource("resource.k8s.io", "v1beta2", "devicetaintrules", "DeviceTaintRule", False)
NS = "work"
NODE = "node-a"
DRIVER = "gpu.nvidia.com"
KEY = "gpuremediate.io/unhealthy"


@pytest.fixture
def client() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    kube = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    kube.create(NAMESPACES, {"metadata": {"name": NS}})
    wait_for(lambda: srv.store.get("/serviceaccounts", NS, "default"), 10, "the default ServiceAccount")
    kube.create(RESOURCE_SLICES, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                  "metadata": {"name": f"{NODE}-gpus"},
                                  "spec": {"driver": DRIVER, "nodeName": NODE,
                                           "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                                           "devices": [{"name": f"gpu-{i}", "attributes": {"uuid": {
                                               "string": f"GPU-{i:04d}"}}} for i in range(4)]}})
    try:
        yield kube
    finally:
        kube.close()
        srv.stop()


def claim(name: str, uuid: str, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "selectors": [{"cel": {
        "expression": f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].uuid == "{uuid}"'}}]}
    if tolerations:
        exactly["tolerations"] = tolerations
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def pinned_pod(name: str, claim_name: str, node: str = NODE) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term]}}},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]}}


def bound(kube: KubeClient, name: str) -> str:
    return str(kube.get(PODS, name, NS)["spec"].get("nodeName") or "")


def results(kube: KubeClient, name: str) -> list[dict[str, Any]]:
    status = kube.get(RESOURCE_CLAIMS, name, NS).get("status") or {}
    return list(((status.get("allocation") or {}).get("devices") or {}).get("results") or [])


def test_the_claim_gets_the_device_its_selector_names_and_the_pod_is_bound(client: KubeClient) -> None:
    client.create(RESOURCE_CLAIMS, claim("c", "GPU-0002"), NS)
    pod = client.create(PODS, pinned_pod("p", "c"), NS)

    wait_for(lambda: bound(client, "p") == NODE, 10, "the pod bound")
    assert [(r["driver"], r["pool"], r["device"]) for r in results(client, "c")] == [(DRIVER, NODE, "gpu-2")]
    reserved = client.get(RESOURCE_CLAIMS, "c", NS)["status"]["reservedFor"]
    assert reserved == [{"resource": "pods", "name": "p", "uid": pod["metadata"]["uid"]}]


def test_a_pod_whose_claim_comes_later_waits_for_it(client: KubeClient) -> None:
    client.create(PODS, pinned_pod("p", "c"), NS)
    wait_for(lambda: client.get(PODS, "p", NS) is not None, 5, "the pod")
    assert bound(client, "p") == ""
    client.create(RESOURCE_CLAIMS, claim("c", "GPU-0001"), NS)
    wait_for(lambda: bound(client, "p") == NODE, 10, "the pod bound once its claim exists")


def test_a_tainted_device_needs_a_toleration_which_the_result_carries(client: KubeClient) -> None:
    client.create(RULES, {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
                          "metadata": {"name": "r"},
                          "spec": {"deviceSelector": {"driver": DRIVER, "pool": NODE, "device": "gpu-3"},
                                   "taint": {"key": KEY, "effect": "NoExecute"}}})
    client.create(RESOURCE_CLAIMS, claim("plain", "GPU-0003"), NS)
    client.create(PODS, pinned_pod("plain", "plain"), NS)
    tolerating = [{"key": KEY, "operator": "Exists", "effect": "NoExecute"}]
    client.create(RESOURCE_CLAIMS, claim("tol", "GPU-0003", tolerating), NS)
    client.create(PODS, pinned_pod("tol", "tol"), NS)

    wait_for(lambda: bound(client, "tol") == NODE, 10, "the tolerating pod bound")
    assert [r["tolerations"] for r in results(client, "tol")] == [tolerating]
    assert bound(client, "plain") == "" and results(client, "plain") == []


def test_a_device_another_claim_holds_is_not_given_again(client: KubeClient) -> None:
    run_on_gpu(client, "w", NS, NODE, "gpu-1")  # a workload holds gpu-1 (allocated as the scheduler would)
    client.create(RESOURCE_CLAIMS, claim("c", "GPU-0001"), NS)
    client.create(PODS, pinned_pod("p", "c"), NS)
    client.create(RESOURCE_CLAIMS, claim("free", "GPU-0000"), NS)
    client.create(PODS, pinned_pod("q", "free"), NS)

    wait_for(lambda: bound(client, "q") == NODE, 10, "the pod on a free device bound")
    assert bound(client, "p") == "" and results(client, "c") == []


def test_a_pod_pinned_to_a_node_without_the_device_stays_pending(client: KubeClient) -> None:
    client.create(RESOURCE_CLAIMS, claim("c", "GPU-0000"), NS)
    client.create(PODS, pinned_pod("p", "c", node="node-b"), NS)
    client.create(RESOURCE_CLAIMS, claim("d", "GPU-0000"), NS)
    client.create(PODS, pinned_pod("q", "d"), NS)

    wait_for(lambda: bound(client, "q") == NODE, 10, "the other pod bound")
    assert bound(client, "p") == ""


def test_a_device_whose_claim_lost_its_pod_is_free_again(client: KubeClient) -> None:
    run_on_gpu(client, "w", NS, NODE, "gpu-1")
    client.delete(PODS, "w", NS, grace_period_seconds=0)
    wait_for(lambda: not client.list(PODS, NS, field_selector="metadata.name=w")["items"], 10, "the workload gone")
    client.create(RESOURCE_CLAIMS, claim("c", "GPU-0001"), NS)
    client.create(PODS, pinned_pod("p", "c"), NS)

    wait_for(lambda: bound(client, "p") == NODE, 10, "the pod bound to the device the gone pod held")
