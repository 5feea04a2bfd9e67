"""DRA workloads for tests and scenarios, against any API server (through KubeClient): a DeviceClass for NVIDIA's
driver, a ResourceClaim for one GPU, a pod bound to a node using it, and the allocation kube-scheduler writes.

``allocate`` writes what kube-scheduler's DRA plugin writes (v1.36, ``bindClaim`` in
pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go): first the finalizer
``resource.kubernetes.io/delete-protection`` in a normal update, then ``status.allocation`` and ``status.reservedFor``
in one status update (the result names request, driver, pool, device and carries a copy of the request's
tolerations; the allocation's node selector is the node's ``metadata.name``; the pod is reserved by resource, name
and uid). The finalizer is what lets kube-controller-manager's resourceclaim controller deallocate the claim once its
last consumer is gone (sim.kube_dra_claims): written without it, the claim keeps its device for good on a real
server (issue 43). The emulator places only pods pinned to one node (sim.kube_scheduler): a scenario whose pod is
bound already (``spec.nodeName``) calls this, as a scheduler would have.
"""

from __future__ import annotations

import copy
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS
from sim.kube_dra_claims import FINALIZER
from sim.nodesim_dra import DRIVER

DEVICE_CLASS = "gpu.nvidia.com"  # the class NVIDIA's Helm chart installs


def device_class(name: str = DEVICE_CLASS, driver: str = DRIVER) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]}}


def claim_body(name: str, namespace: str, *, device_class_name: str = DEVICE_CLASS,
               tolerations: list[dict[str, Any]] | None = None, request: str = "gpu") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name}
    if tolerations:
        exactly["tolerations"] = copy.deepcopy(tolerations)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}}


def pod_body(name: str, namespace: str, node: str, claim: str, *, labels: dict[str, str] | None = None,
             request: str = "gpu") -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", "resources": {"claims": [{"name": request}]}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                           "labels": dict(labels or {})},
            "spec": {"nodeName": node, "containers": [container],
                     "resourceClaims": [{"name": request, "resourceClaimName": claim}]}}


def allocate(client: KubeClient, claim: dict[str, Any], pod: dict[str, Any], *, node: str, device: str,
             pool: str | None = None, driver: str = DRIVER) -> dict[str, Any]:
    """The scheduler's write: ``claim`` (as read) allocated ``device`` of ``pool`` (default: the node's pool) and
    reserved for ``pod`` (as created)."""
    meta = claim["metadata"]
    results = []
    for request in claim["spec"]["devices"]["requests"]:
        result: dict[str, Any] = {"request": request["name"], "driver": driver, "pool": pool or node,
                                  "device": device}
        tolerations = (request.get("exactly") or {}).get("tolerations")
        if tolerations:
            result["tolerations"] = copy.deepcopy(tolerations)
        results.append(result)
    selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                        "values": [node]}]}]}
    if FINALIZER not in (meta.get("finalizers") or []):  # a write of its own: a status write ignores metadata
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"],
                              "finalizers": [*(meta.get("finalizers") or []), FINALIZER]}}
        meta = client.patch(RESOURCE_CLAIMS, meta["name"], patch, meta["namespace"])["metadata"]
    body = {**claim, "metadata": meta, "status": {
        "allocation": {"devices": {"results": results}, "nodeSelector": selector},
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]}}
    return client.replace(RESOURCE_CLAIMS, meta["name"], body, meta["namespace"], subresource="status")


def run_on_gpu(client: KubeClient, name: str, namespace: str, node: str, device: str, *,
               tolerations: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None,
               device_class_name: str = DEVICE_CLASS) -> tuple[dict[str, Any], dict[str, Any]]:
    """A claim ``name``, a pod ``name`` bound to ``node`` using it, the claim allocated ``device``: (pod, claim)."""
    body = claim_body(name, namespace, tolerations=tolerations, device_class_name=device_class_name)
    claim = client.create(RESOURCE_CLAIMS, body, namespace)
    pod = client.create(PODS, pod_body(name, namespace, node, name, labels=labels), namespace)
    return pod, allocate(client, claim, pod, node=node, device=device)


def ensure_device_class(client: KubeClient, name: str = DEVICE_CLASS) -> dict[str, Any]:
    try:
        return client.create(DEVICE_CLASSES, device_class(name))
    except errors.AlreadyExists:
        return client.get(DEVICE_CLASSES, name)
