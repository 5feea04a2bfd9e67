"""The controller's requests as a real API server would judge them (run against the emulator)."""

from __future__ import annotations

import json
import time
from typing import Any

from gpuremediate.actions.breaker import BREAKER_CONFIGMAP, RESET_ANNOTATION, BreakerStore
from gpuremediate.actions.jobs import NODE_LABEL, JobSpec, build_job, ensure_job
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.leader import LeaderElector, micro_time
from gpuremediate.kube.resources import CONFIGMAPS, JOBS, LEASES, NODES
from gpuremediate.policy.safety import CircuitBreaker

from .conftest import NS

LONG_NODE = "gpu-node-" + "a" * 60 + ".rack-17.datacenter.example.com"  # a valid node name, > 63 chars


def test_job_for_a_node_whose_name_is_no_label_value_is_valid(client: KubeClient) -> None:
    """Label values stop at 63 characters; node names go up to 253. The Job must still be accepted."""
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": LONG_NODE}})
    job = build_job("reset-gpu", LONG_NODE, "xid-79/gpu0", 1, JobSpec(image="x", command=("true",)), namespace=NS)
    created = ensure_job(client, job)
    assert created["spec"]["template"]["spec"]["nodeName"] == LONG_NODE
    label = created["metadata"]["labels"][NODE_LABEL]
    assert len(label) <= 63 and label.startswith("gpu-node-")
    short = build_job("reset-gpu", "gpu-node-1", "xid-79/gpu0", 1, JobSpec(image="x", command=("true",)),
                      namespace=NS)
    assert short["metadata"]["labels"][NODE_LABEL] == "gpu-node-1"  # unchanged where it fits


def test_leader_waits_out_the_holders_lease_duration(client: KubeClient) -> None:
    """client-go measures expiry with the Lease's leaseDurationSeconds, not the candidate's own setting."""
    now = micro_time()
    client.create(LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": "lead", "namespace": NS},
                           "spec": {"holderIdentity": "other", "leaseDurationSeconds": 60, "acquireTime": now,
                                    "renewTime": now, "leaseTransitions": 0}}, NS)
    elector = LeaderElector(client, NS, "lead", "me", lease_duration=0.6, renew_deadline=0.4, retry_period=0.1)
    assert not elector._try_acquire_or_renew()
    time.sleep(0.8)  # past our 0.6 s, far inside the holder's 60 s
    assert not elector._try_acquire_or_renew()
    assert client.get(LEASES, "lead", NS)["spec"]["holderIdentity"] == "other"


def test_breaker_write_keeps_labels_and_other_annotations(client: KubeClient) -> None:
    """The ConfigMap is replaced (PUT): whatever is not in the body is gone. Only the reset annotation
    the controller consumed may go."""
    state = json.dumps(CircuitBreaker(open=True, opened_at=1.0, reason="r").to_dict())
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": BREAKER_CONFIGMAP, "namespace": NS, "labels": {"app.kubernetes.io/part-of": "gpuremediate"},
        "annotations": {"team": "gpu-infra", RESET_ANNOTATION: "alice"}}, "data": {"state": state}}
    client.create(CONFIGMAPS, body, NS)
    store = BreakerStore(client, NS)
    assert not store.load().is_open  # the annotation reset it
    cm = client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)
    assert cm["metadata"].get("labels") == {"app.kubernetes.io/part-of": "gpuremediate"}
    assert cm["metadata"].get("annotations") == {"team": "gpu-infra"}
    store.save(CircuitBreaker(open=True, opened_at=2.0, reason="again"))
    assert client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)["metadata"].get("labels")


def test_job_body_is_batch_v1_valid(client: KubeClient) -> None:
    job = build_job("validate", "gpu-node-1", "xid-79/gpu0", 2,
                    JobSpec(image="x", command=("dcgmi", "diag"), privileged=True, host_pid=True, timeout_s=60,
                            request_all_gpus=True), namespace=NS, gpus=8, gpu_ids=("0", "1"))
    created = client.create(JOBS, job, NS, dry_run=True)
    spec = created["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (0, 60, 86400)
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["tolerations"] == [{"operator": "Exists"}]
    limits = pod["containers"][0]["resources"]
    assert limits["limits"] == limits["requests"] == {"nvidia.com/gpu": "8"}  # extended resources: equal


def test_a_job_taking_its_gpu_through_a_claim_is_placed_by_affinity_not_node_name(client: KubeClient) -> None:
    """A pod given spec.nodeName skips the scheduler, so its claim would never be allocated: the claim's Job is
    pinned by a required node affinity on the node's name instead, and its container names the claim."""
    job = build_job("validate", "gpu-node-1", "xid-48/gpu3", 1,
                    JobSpec(image="x", command=("dcgmi", "diag"), device_claim="gpur-validate-c"), namespace=NS)
    pod = client.create(JOBS, job, NS, dry_run=True)["spec"]["template"]["spec"]
    assert "nodeName" not in pod
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}]}]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "gpur-validate-c"}]
    assert pod["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
    plain = build_job("validate", "gpu-node-1", "xid-48/gpu3", 1, JobSpec(image="x", command=("true",)), namespace=NS)
    assert plain["spec"]["template"]["spec"]["nodeName"] == "gpu-node-1"
