"""Where the emulator differed from kube-apiserver v1.28 (shared/data/kube-apiserver, the API reference)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CRDS, EVENTS, JOBS, LEASES, NODES, PODS, Resource
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

from .conftest import NS

MICRO = "2026-01-01T00:00:00.123456Z"


def _lease(renew: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l1"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "acquireTime": MICRO, "renewTime": renew}}


def test_lease_micro_time_needs_six_fractional_digits(client: KubeClient) -> None:
    """Exchange 25: a renewTime without microseconds is refused (422 on a patch, a decode error on a write)."""
    with pytest.raises(errors.BadRequest) as created:
        client.create(LEASES, _lease("2026-01-01T00:00:00Z"), NS)
    assert 'cannot parse "Z" as ".000000"' in created.value.message
    lease = client.create(LEASES, _lease(MICRO), NS)
    with pytest.raises(errors.Invalid) as patched:
        client.patch(LEASES, "l1", {"spec": {"renewTime": "2024-01-01T00:00:00Z"}}, NS)
    assert patched.value.causes[0]["field"] == "patch"
    assert 'parsing time "2024-01-01T00:00:00Z" as "2006-01-02T15:04:05.000000Z07:00"' in patched.value.message
    with pytest.raises(errors.BadRequest):
        client.replace(LEASES, "l1", {**lease, "spec": {**lease["spec"], "renewTime": "2026-01-01T00:00:01.5Z"}},
                       NS)
    renewed = client.patch(LEASES, "l1", {"spec": {"renewTime": "2026-01-01T00:00:02.000001Z"}}, NS)
    assert renewed["spec"]["renewTime"] == "2026-01-01T00:00:02.000001Z"


def _gadgets(client: KubeClient) -> Resource:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "gadgets.sem.example.com"},
           "spec": {"group": "sem.example.com", "scope": "Namespaced",
                    "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {"type": "object",
                                                                 "x-kubernetes-preserve-unknown-fields": True}}}]}}
    client.create(CRDS, crd)
    return client.resolve("sem.example.com/v1", "Gadget")


def test_custom_resource_put_needs_a_resource_version(client: KubeClient) -> None:
    """CRs do not allow unconditional update (customResourceStrategy.AllowUnconditionalUpdate is false)."""
    gadgets = _gadgets(client)
    made = client.create(gadgets, {"apiVersion": "sem.example.com/v1", "kind": "Gadget",
                                   "metadata": {"name": "g1"}, "spec": {"x": 1}}, NS)
    body: dict[str, Any] = {"apiVersion": "sem.example.com/v1", "kind": "Gadget", "metadata": {"name": "g1"},
                            "spec": {"x": 2}}
    with pytest.raises(errors.Invalid) as refused:
        client.replace(gadgets, "g1", body, NS)
    assert refused.value.causes == [{"reason": "FieldValueInvalid", "field": "metadata.resourceVersion",
                                     "message": "Invalid value: 0x0: must be specified for an update"}]
    assert refused.value.message.startswith('gadgets.sem.example.com "g1" is invalid')
    body["metadata"]["resourceVersion"] = made["metadata"]["resourceVersion"]
    assert client.replace(gadgets, "g1", body, NS)["spec"] == {"x": 2}


def test_core_event_about_a_node_lives_in_default_only(client: KubeClient) -> None:
    """Legacy (core/v1, no eventTime) Events about a cluster-scoped object: namespace "" or "default"."""
    event: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "n1.1", "namespace": "kube-system"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "n1"}, "reason": "R", "message": "m",
        "type": "Normal", "source": {"component": "c"}}
    with pytest.raises(errors.Invalid) as refused:
        client.create(EVENTS, event, "kube-system")
    assert refused.value.causes[0]["field"] == "involvedObject.namespace"
    event["metadata"]["namespace"] = "default"
    assert client.create(EVENTS, event, "default")["metadata"]["namespace"] == "default"


def test_unconditional_patch_is_retried_by_the_server_on_a_concurrent_write(
        srv: KubeAPIServer, client: KubeClient) -> None:
    """A patch without metadata.resourceVersion never answers 409 for a write that raced it: the server
    applies it again to the newer object (GuaranteedUpdate retries)."""
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    original = srv.verbs._patched
    raced: list[bool] = []

    def racing(req: Any, old: dict[str, Any], kind: str) -> dict[str, Any]:
        result = original(req, old, kind)
        if not raced:  # someone else writes between our read and our write
            raced.append(True)
            other = client.get(NODES, "n1")
            client.replace(NODES, "n1", {**other, "metadata": {**other["metadata"], "labels": {"other": "x"}}})
        return result

    srv.verbs._patched = racing  # type: ignore[method-assign]
    patched = client.patch(NODES, "n1", {"metadata": {"annotations": {"mine": "y"}}})
    assert raced
    assert patched["metadata"]["annotations"] == {"mine": "y"}
    assert patched["metadata"]["labels"] == {"other": "x"}


def _job(name: str, deadline: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"backoffLimit": 0, "template": {"spec": {
        "nodeName": "n1", "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def _pods(client: KubeClient, job: str) -> list[dict[str, Any]]:
    return list(client.list(PODS, NS, label_selector=f"job-name={job}")["items"])


def test_active_deadline_fails_the_job_and_deletes_its_pods(client: KubeClient) -> None:
    client.create(JOBS, _job("slow", deadline=1), NS)
    assert wait_for(lambda: len(_pods(client, "slow")) == 1, 3.0)

    def condition(kind: str) -> dict[str, Any] | None:
        conds = client.get(JOBS, "slow", NS).get("status", {}).get("conditions") or []
        return next((c for c in conds if c["type"] == kind and c["status"] == "True"), None)

    target = wait_for(lambda: condition("FailureTarget"), 4.0)
    assert (target["reason"], target["message"]) == ("DeadlineExceeded",
                                                     "Job was active longer than specified deadline")
    assert wait_for(lambda: all(p["metadata"].get("deletionTimestamp") for p in _pods(client, "slow")), 3.0)
    # v1.36: Failed only once no pod of the Job is terminating (here: once the kubelet confirms it stopped)
    assert condition("Failed") is None and client.get(JOBS, "slow", NS)["status"]["terminating"] == 1
    for pod in _pods(client, "slow"):
        client.delete(PODS, pod["metadata"]["name"], NS, grace_period_seconds=0)
    failed = wait_for(lambda: condition("Failed"), 4.0)
    assert (failed["reason"], failed["message"]) == (target["reason"], target["message"])


def test_pods_of_a_deleted_job_lose_the_tracking_finalizer(client: KubeClient) -> None:
    """The Job controller removes batch.kubernetes.io/job-tracking from pods whose Job is gone, so a
    background-deleted Job's pods really disappear once the kubelet is done with them."""
    client.create(JOBS, _job("gone"), NS)
    assert wait_for(lambda: len(_pods(client, "gone")) == 1, 3.0)
    client.delete(JOBS, "gone", NS, propagation_policy="Background")
    assert wait_for(lambda: all(p["metadata"].get("deletionTimestamp") for p in _pods(client, "gone")), 3.0)
    for pod in _pods(client, "gone"):  # the kubelet confirms the pod stopped
        client.delete(PODS, pod["metadata"]["name"], NS, grace_period_seconds=0)
    assert wait_for(lambda: not _pods(client, "gone"), 3.0), _pods(client, "gone")


def test_uncordon_leaves_no_unschedulable_key(client: KubeClient) -> None:
    """Exchange 29: spec.unschedulable is omitempty; false (or null) is never echoed."""
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    assert client.patch(NODES, "n1", {"spec": {"unschedulable": True}})["spec"]["unschedulable"] is True
    assert "unschedulable" not in client.patch(NODES, "n1", {"spec": {"unschedulable": False}})["spec"]
    assert "unschedulable" not in client.get(NODES, "n1").get("spec", {})
    node = client.get(NODES, "n1")
    node["spec"] = {"unschedulable": False}
    assert "unschedulable" not in client.replace(NODES, "n1", node)["spec"]
