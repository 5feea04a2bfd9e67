"""The end of a ResourceClaim's use in the emulator, as kube-scheduler and kube-controller-manager's resourceclaim
controller do it (sim.kube_dra_claims): the scheduler's allocation carries the finalizer
``resource.kubernetes.io/delete-protection``; a reservation whose pod is gone or done is dropped, and a claim that
loses its last consumer is deallocated and loses the finalizer, only if it carries it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from sim.dra_claims import allocate, claim_body, pod_body, run_on_gpu
from sim.kube_dra_claims import FINALIZER
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "work"
NODE = "node-a"
DRIVER = "gpu.nvidia.com"


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
                                               "string": f"GPU-{i:04d}"}}} for i in range(2)]}})
    try:
        yield kube
    finally:
        kube.close()
        srv.stop()


def get(kube: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return kube.get(RESOURCE_CLAIMS, name, NS)
    except errors.NotFound:
        return None


def deallocated(kube: KubeClient, name: str) -> bool:
    claim = get(kube, name)
    return claim is not None and not (claim.get("status") or {}).get("allocation")


def pinned(name: str, claim: str) -> dict[str, Any]:
    """A pod the emulator's scheduler places: pinned to NODE by a required node affinity, waiting for its claim."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    pod = pod_body(name, NS, NODE, claim)
    del pod["spec"]["nodeName"]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}
    return pod


def uuid_claim(name: str, uuid: str) -> dict[str, Any]:
    body = claim_body(name, NS)
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{uuid}"'}}]
    return body


def test_the_schedulers_allocation_carries_the_finalizer(client: KubeClient) -> None:
    _, claim = run_on_gpu(client, "w", NS, NODE, "gpu-0")
    assert claim["metadata"]["finalizers"] == [FINALIZER]
    assert claim["status"]["reservedFor"][0]["name"] == "w"
    client.create(RESOURCE_CLAIMS, uuid_claim("placed", "GPU-0001"), NS)
    client.create(PODS, pinned("placed", "placed"), NS)
    placed = wait_for(lambda: (get(client, "placed") or {}).get("status", {}).get("reservedFor"), 10,
                      "the emulator's scheduler placing the pinned pod")
    assert placed[0]["name"] == "placed"
    assert (get(client, "placed") or {})["metadata"]["finalizers"] == [FINALIZER]


def test_the_last_consumer_gone_deallocates_and_drops_the_finalizer(client: KubeClient) -> None:
    run_on_gpu(client, "w", NS, NODE, "gpu-0")
    client.delete(PODS, "w", NS, grace_period_seconds=0)
    wait_for(lambda: deallocated(client, "w"), 10, "the claim deallocated once its pod is gone")
    claim = get(client, "w")
    assert claim is not None and not claim["status"].get("reservedFor") and not claim["metadata"].get("finalizers")


def test_a_consumer_that_is_done_counts_as_gone(client: KubeClient) -> None:
    pod, _ = run_on_gpu(client, "w", NS, NODE, "gpu-0")
    client.patch(PODS, "w", {"status": {"phase": "Succeeded"}}, NS, subresource="status")
    wait_for(lambda: deallocated(client, "w"), 10, "the claim of a pod that Succeeded deallocated")
    assert client.get(PODS, "w", NS)["metadata"]["uid"] == pod["metadata"]["uid"], "the pod itself stays"


def test_a_running_consumer_keeps_the_claim_allocated(client: KubeClient) -> None:
    run_on_gpu(client, "w", NS, NODE, "gpu-0")
    run_on_gpu(client, "other", NS, NODE, "gpu-1")
    client.delete(PODS, "other", NS, grace_period_seconds=0)
    wait_for(lambda: deallocated(client, "other"), 10, "the other claim deallocated")
    claim = get(client, "w")
    assert claim is not None and claim["status"]["allocation"] and claim["metadata"]["finalizers"] == [FINALIZER]


def test_without_the_finalizer_the_claim_keeps_its_device_for_good(client: KubeClient) -> None:
    """What issue 43 met on a real server: an allocation written without the finalizer is never cleared, only the
    reservation goes, and the device stays taken for the scheduler."""
    claim = client.create(RESOURCE_CLAIMS, claim_body("bare", NS), NS)
    pod = client.create(PODS, pod_body("bare", NS, NODE, "bare"), NS)
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    client.replace(RESOURCE_CLAIMS, "bare", {**claim, "status": {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "bare", "uid": pod["metadata"]["uid"]}]}}, NS,
        subresource="status")
    client.delete(PODS, "bare", NS, grace_period_seconds=0)
    wait_for(lambda: not ((get(client, "bare") or {}).get("status") or {}).get("reservedFor"), 10,
             "the reservation of the gone pod dropped")
    assert (get(client, "bare") or {})["status"]["allocation"]["devices"]["results"] == [result]
    client.create(RESOURCE_CLAIMS, uuid_claim("wants", "GPU-0000"), NS)
    client.create(PODS, pinned("wants", "wants"), NS)
    client.create(RESOURCE_CLAIMS, uuid_claim("free", "GPU-0001"), NS)
    client.create(PODS, pinned("free", "free"), NS)
    wait_for(lambda: client.get(PODS, "free", NS)["spec"].get("nodeName"), 10, "the pod on the free GPU bound")
    assert not client.get(PODS, "wants", NS)["spec"].get("nodeName"), "gpu-0 is still allocated to 'bare'"


def test_an_allocated_claim_never_reserved_stays_allocated(client: KubeClient) -> None:
    claim = client.create(RESOURCE_CLAIMS, claim_body("c", NS), NS)
    pod = client.create(PODS, pod_body("p", NS, NODE, "c"), NS)
    allocated = allocate(client, claim, pod, node=NODE, device="gpu-0")
    unreserved = {**allocated, "status": {"allocation": allocated["status"]["allocation"]}}
    client.replace(RESOURCE_CLAIMS, "c", unreserved, NS, subresource="status")
    client.delete(PODS, "p", NS, grace_period_seconds=0)
    run_on_gpu(client, "tick", NS, NODE, "gpu-1")  # the controller looked at the claims since
    client.delete(PODS, "tick", NS, grace_period_seconds=0)
    wait_for(lambda: deallocated(client, "tick"), 10, "the other claim deallocated")
    assert (get(client, "c") or {})["status"].get("allocation"), "no consumer went away: it stays allocated"


def test_a_deleted_claim_waits_for_its_consumer_then_goes(client: KubeClient) -> None:
    run_on_gpu(client, "w", NS, NODE, "gpu-0")
    client.delete(RESOURCE_CLAIMS, "w", NS)
    claim = get(client, "w")
    assert claim is not None and claim["metadata"].get("deletionTimestamp"), "kept while its pod may run"
    client.delete(PODS, "w", NS, grace_period_seconds=0)
    wait_for(lambda: get(client, "w") is None, 10, "the claim gone with its last consumer")
