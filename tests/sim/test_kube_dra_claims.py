"""The end of a ResourceClaim's use, as kube-scheduler and kube-controller-manager's resourceclaim controller do it,
and as the emulator does it (sim.kube_dra_claims): the scheduler's allocation carries the finalizer
``resource.kubernetes.io/delete-protection``; a reservation whose pod is gone or done is dropped, and a claim that
loses its last consumer is deallocated and loses the finalizer, only if it carries it.

Against the emulator by default; against a real control plane with GPUREMEDIATE_TEST_KUBECONFIG (1.36 with DRA; its
kube-scheduler places the pinned pods, its kube-controller-manager deallocates): the same tests, each in a
namespace and on a Node of its own, removed after."""

from __future__ import annotations

import contextlib
import os
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken, load_config
from gpuremediate.kube.resources import NAMESPACES, NODES, PODS, RESOURCE_CLAIMS, SERVICEACCOUNTS
from sim.dra_claims import claim_body, ensure_device_class, pod_body, run_on_gpu
from sim.gpusim import gpu_uuid
from sim.kube_dra_claims import FINALIZER
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim
from sim.waiting import wait_for

REAL_KUBECONFIG = os.environ.get("GPUREMEDIATE_TEST_KUBECONFIG")
WAIT_S = 30.0 if REAL_KUBECONFIG else 10.0
DRIVER = "gpu.nvidia.com"


@dataclass
class Target:
    client: KubeClient
    ns: str
    node: str


@pytest.fixture
def target() -> Iterator[Target]:
    token = uuidlib.uuid4().hex[:6]
    srv = None
    if REAL_KUBECONFIG:
        kube = KubeClient(load_config(REAL_KUBECONFIG), qps=100, burst=100)
    else:
        srv = KubeAPIServer().start()
        kube = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    made = Target(kube, f"dc-{token}", f"dc-{token}-node")
    kube.create(NAMESPACES, {"metadata": {"name": made.ns}})
    try:
        wait_for(lambda: kube.get(SERVICEACCOUNTS, "default", made.ns), 30, "the default ServiceAccount")
        ensure_device_class(kube)
        NodeSim(kube, dra=True).add_node(made.node, gpus=2)  # its ResourceSlice: gpu-0, gpu-1
        yield made
    finally:
        for claim in kube.list(RESOURCE_CLAIMS, made.ns)["items"]:  # the finalizer would hold the namespace
            with contextlib.suppress(errors.NotFound):
                kube.patch(RESOURCE_CLAIMS, claim["metadata"]["name"], {"metadata": {"finalizers": None}}, made.ns)
        for pod in kube.list(PODS, made.ns)["items"]:
            with contextlib.suppress(errors.NotFound):
                kube.delete(PODS, pod["metadata"]["name"], made.ns, grace_period_seconds=0)
        with contextlib.suppress(errors.NotFound):
            kube.delete(NAMESPACES, made.ns)
        with contextlib.suppress(errors.NotFound):
            kube.delete(NODES, made.node)  # its ResourceSlice goes with it (owner reference)
        kube.close()
        if srv is not None:
            srv.stop()


def get(t: Target, name: str) -> dict[str, Any] | None:
    try:
        return t.client.get(RESOURCE_CLAIMS, name, t.ns)
    except errors.NotFound:
        return None


def deallocated(t: Target, name: str) -> bool:
    claim = get(t, name)
    return claim is not None and not (claim.get("status") or {}).get("allocation")


def pinned(t: Target, name: str, claim: str) -> dict[str, Any]:
    """A pod the scheduler places: pinned to the node by a required node affinity, waiting for its claim."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [t.node]}]}
    pod = pod_body(name, t.ns, t.node, claim)
    del pod["spec"]["nodeName"]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]  # a Node no kubelet renews may turn unreachable
    return pod


def gpu_claim(t: Target, name: str, gpu: int) -> dict[str, Any]:
    """A claim for GPU ``gpu`` of the node (its UUID, as gpuremediate's validation claim names it)."""
    body = claim_body(name, t.ns)
    expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].uuid == "{gpu_uuid(t.node, gpu)}"'
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return body


def bound(t: Target, name: str) -> str:
    return str(t.client.get(PODS, name, t.ns)["spec"].get("nodeName") or "")


def test_the_schedulers_allocation_carries_the_finalizer(target: Target) -> None:
    t = target
    _, claim = run_on_gpu(t.client, "w", t.ns, t.node, "gpu-0")
    assert claim["metadata"]["finalizers"] == [FINALIZER]
    assert claim["status"]["reservedFor"][0]["name"] == "w"
    t.client.create(RESOURCE_CLAIMS, gpu_claim(t, "placed", 1), t.ns)
    t.client.create(PODS, pinned(t, "placed", "placed"), t.ns)
    wait_for(lambda: bound(t, "placed") == t.node, WAIT_S, "the scheduler placing the pinned pod")
    placed = get(t, "placed")
    assert placed is not None and placed["metadata"]["finalizers"] == [FINALIZER]
    assert [r["name"] for r in placed["status"]["reservedFor"]] == ["placed"]
    assert [r["device"] for r in placed["status"]["allocation"]["devices"]["results"]] == ["gpu-1"]


def test_the_last_consumer_gone_deallocates_and_drops_the_finalizer(target: Target) -> None:
    t = target
    run_on_gpu(t.client, "w", t.ns, t.node, "gpu-0")
    t.client.delete(PODS, "w", t.ns, grace_period_seconds=0)
    wait_for(lambda: deallocated(t, "w"), WAIT_S, "the claim deallocated once its pod is gone",
             seen=lambda: get(t, "w"))
    wait_for(lambda: not (get(t, "w") or {})["metadata"].get("finalizers"), WAIT_S, "the finalizer dropped")
    claim = get(t, "w")
    assert claim is not None and not (claim.get("status") or {}).get("reservedFor")


def test_a_consumer_that_is_done_counts_as_gone(target: Target) -> None:
    t = target
    pod, _ = run_on_gpu(t.client, "w", t.ns, t.node, "gpu-0")
    t.client.patch(PODS, "w", {"status": {"phase": "Succeeded"}}, t.ns, subresource="status")
    wait_for(lambda: deallocated(t, "w"), WAIT_S, "the claim of a pod that Succeeded deallocated",
             seen=lambda: get(t, "w"))
    assert t.client.get(PODS, "w", t.ns)["metadata"]["uid"] == pod["metadata"]["uid"], "the pod itself stays"


def test_a_running_consumer_keeps_the_claim_allocated(target: Target) -> None:
    t = target
    run_on_gpu(t.client, "w", t.ns, t.node, "gpu-0")
    run_on_gpu(t.client, "other", t.ns, t.node, "gpu-1")
    t.client.delete(PODS, "other", t.ns, grace_period_seconds=0)
    wait_for(lambda: deallocated(t, "other"), WAIT_S, "the other claim deallocated")
    claim = get(t, "w")
    assert claim is not None and claim["status"]["allocation"] and claim["metadata"]["finalizers"] == [FINALIZER]


def test_without_the_finalizer_the_claim_keeps_its_device_for_good(target: Target) -> None:
    """What issue 43 met on a real server: an allocation written without the finalizer is never cleared, only the
    reservation goes, and the device stays taken for the scheduler."""
    t = target
    claim = t.client.create(RESOURCE_CLAIMS, claim_body("bare", t.ns), t.ns)
    pod = t.client.create(PODS, pod_body("bare", t.ns, t.node, "bare"), t.ns)
    result = {"request": "gpu", "driver": DRIVER, "pool": t.node, "device": "gpu-0"}
    t.client.replace(RESOURCE_CLAIMS, "bare", {**claim, "status": {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "bare", "uid": pod["metadata"]["uid"]}]}}, t.ns,
        subresource="status")
    t.client.delete(PODS, "bare", t.ns, grace_period_seconds=0)
    wait_for(lambda: not ((get(t, "bare") or {}).get("status") or {}).get("reservedFor"), WAIT_S,
             "the reservation of the gone pod dropped")
    assert (get(t, "bare") or {})["status"]["allocation"]["devices"]["results"] == [result]
    t.client.create(RESOURCE_CLAIMS, gpu_claim(t, "wants", 0), t.ns)
    t.client.create(PODS, pinned(t, "wants", "wants"), t.ns)
    t.client.create(RESOURCE_CLAIMS, gpu_claim(t, "free", 1), t.ns)
    t.client.create(PODS, pinned(t, "free", "free"), t.ns)
    wait_for(lambda: bound(t, "free") == t.node, WAIT_S, "the pod on the free GPU bound")
    assert bound(t, "wants") == "", "gpu-0 is still allocated to 'bare'"


def allocated_unreserved(t: Target, name: str, device: str) -> dict[str, Any]:
    """A claim with the scheduler's finalizer and an allocation of ``device``, reserved for no one."""
    claim = t.client.create(RESOURCE_CLAIMS, claim_body(name, t.ns), t.ns)
    claim = t.client.patch(RESOURCE_CLAIMS, name, {"metadata": {"finalizers": [FINALIZER]}}, t.ns)
    result = {"request": "gpu", "driver": DRIVER, "pool": t.node, "device": device}
    return t.client.replace(RESOURCE_CLAIMS, name, {**claim, "status": {"allocation": {"devices": {
        "results": [result]}}}}, t.ns, subresource="status")


def test_an_allocated_claim_never_reserved_stays_allocated(target: Target) -> None:
    """Deallocation follows the loss of the last consumer: a claim no pod ever used stays allocated."""
    t = target
    allocated_unreserved(t, "c", "gpu-0")
    run_on_gpu(t.client, "tick", t.ns, t.node, "gpu-1")  # the controller looked at the claims since
    t.client.delete(PODS, "tick", t.ns, grace_period_seconds=0)
    wait_for(lambda: deallocated(t, "tick"), WAIT_S, "the other claim deallocated")
    claim = get(t, "c")
    assert claim is not None and claim["status"].get("allocation") and not claim["status"].get("reservedFor")


def test_a_bound_pod_naming_an_allocated_claim_is_reserved_by_the_controller(target: Target) -> None:
    """``syncPod``: a pod given its node without the scheduler gets the allocated claim it names reserved; a
    reservation removed by hand comes back while the pod runs, and goes once it is gone."""
    t = target
    allocated_unreserved(t, "c", "gpu-0")
    pod = t.client.create(PODS, pod_body("p", t.ns, t.node, "c"), t.ns)
    uid = pod["metadata"]["uid"]
    wait_for(lambda: [r["uid"] for r in (get(t, "c") or {}).get("status", {}).get("reservedFor") or []] == [uid],
             WAIT_S, "the claim reserved for the bound pod", seen=lambda: get(t, "c"))
    claim = get(t, "c")
    assert claim is not None
    t.client.replace(RESOURCE_CLAIMS, "c", {**claim, "status": {"allocation": claim["status"]["allocation"]}}, t.ns,
                     subresource="status")
    wait_for(lambda: (get(t, "c") or {}).get("status", {}).get("reservedFor"), WAIT_S, "the reservation back")
    t.client.delete(PODS, "p", t.ns, grace_period_seconds=0)
    wait_for(lambda: deallocated(t, "c"), WAIT_S, "deallocated once the pod is gone", seen=lambda: get(t, "c"))


def test_a_deleted_claim_waits_for_its_consumer_then_goes(target: Target) -> None:
    t = target
    run_on_gpu(t.client, "w", t.ns, t.node, "gpu-0")
    t.client.delete(RESOURCE_CLAIMS, "w", t.ns)
    claim = get(t, "w")
    assert claim is not None and claim["metadata"].get("deletionTimestamp"), "kept while its pod may run"
    t.client.delete(PODS, "w", t.ns, grace_period_seconds=0)
    wait_for(lambda: get(t, "w") is None, WAIT_S, "the claim gone with its last consumer")
