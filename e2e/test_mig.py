"""MIG scenarios (issue 13 part 1): on a mixed-strategy MIG node a faulty GPU is drained with scope ``impacted``
(only the pods on that GPU's MIG instances go) and scope ``gpu`` (every MIG pod goes), and the validation Job
asks for every GPU slice; on a node whose device plugin holds a GPU back (allocatable < capacity) validation
says why and quarantines instead of leaving a Job Pending.

The MIG node is NodeSim's (capacity, allocatable, GFD labels) and gpu-sim's (one series per GPU instance with
GPU_I_ID / GPU_I_PROFILE, the pod on its instance's series): in-process targets only.
Run: ``python -m pytest e2e/test_mig.py -x -q``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.harness import WORKLOAD_NS, Cluster
from gpuremediate.kube.resources import PODS
from sim.cluster import SimCluster

PROFILES = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")  # GPU instances 1..4 of each MIG GPU
MIG_GPUS = 6  # GPUs 0-5 in MIG mode, 6 and 7 whole
SLICES = {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "6", "nvidia.com/mig-2g.20gb": "6",
          "nvidia.com/mig-1g.10gb": "12"}
# pod -> (GPU, GPU instance or None for a whole GPU, resource)
PODS_ON = {"train-3": (3, 1, "nvidia.com/mig-3g.40gb"), "notebook-3": (3, 4, "nvidia.com/mig-1g.10gb"),
           "infer-5": (5, 2, "nvidia.com/mig-2g.20gb"), "whole-6": (6, None, "nvidia.com/gpu")}


@pytest.fixture(autouse=True)
def clean_controller_log(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.stop_controller()
    assert cluster.log_problems() == []


def simulated(cluster: Cluster) -> SimCluster:
    cluster.require("shape a node's MIG devices (NodeSim and gpu-sim in process)")
    sim: SimCluster = cluster.sim  # type: ignore[attr-defined]
    return sim


def mig_node(cluster: Cluster, node: str) -> None:
    """A mixed-strategy node: 6 GPUs split into PROFILES, 2 whole; a pod on some instances and a CPU pod."""
    sim = simulated(cluster)
    assert sim.nodesim is not None
    sim.nodesim.set_mig(node, "mixed", PROFILES, mig_gpus=MIG_GPUS)
    for gpu in range(MIG_GPUS):
        sim.gpusim.set_mig(node, gpu, PROFILES)
    for name, (gpu, instance, resource) in PODS_ON.items():
        mig_pod(cluster, name, node, resource)
        if instance is None:
            sim.gpusim.set_pod(node, gpu, WORKLOAD_NS, name)
        else:
            sim.gpusim.set_mig_pod(node, gpu, instance, WORKLOAD_NS, name)
    cluster.workload("cpu-only", node, gpus=0)
    cluster.wait(lambda: all(running(cluster, p) for p in [*PODS_ON, "cpu-only"]), 10, "the workloads running")


def mig_pod(cluster: Cluster, name: str, node: str, resource: str) -> dict[str, Any]:
    return cluster.kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOAD_NS, "labels": {"app": name}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                 "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "main", "image": cluster.workload_image(),
                                 "resources": {"limits": {resource: "1"}}}]},
    }, WORKLOAD_NS)


def running(cluster: Cluster, name: str) -> bool:
    return bool(cluster.kube.get(PODS, name, WORKLOAD_NS).get("status", {}).get("phase") == "Running")


def validation_resources(cluster: Cluster, node: str) -> dict[str, Any]:
    [job] = cluster.jobs(node, "validate")
    resources: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    return resources


def test_impacted_scope_drains_only_the_faulty_gpus_mig_instances(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    mig_node(cluster, node)
    cluster.start_controller({"drain": {"scope": "impacted"}})
    cluster.inject(node, 3, "dbe", 1)  # GPU 3: every instance's series shows it, under GPU 3's UUID
    cluster.wait(lambda: cluster.evicted() == {"workloads/train-3", "workloads/notebook-3"}, 30,
                 "the pods of GPU 3's instances evicted", seen=lambda: (cluster.evicted(), cluster.summary(node)))
    # Validation needs every slice: the pods left on other GPUs (a MIG one among them) hold it back.
    rec = cluster.wait(lambda: cluster.blocked_record(node, "gpu-pods"), 30, "validation waiting for GPU pods",
                       seen=lambda: cluster.summary(node))
    assert rec is not None and rec.blocked is not None and rec.state == "validating"
    assert "workloads/infer-5" in rec.blocked.detail and "workloads/whole-6" in rec.blocked.detail
    assert "cpu-only" not in rec.blocked.detail
    assert cluster.evicted() == {"workloads/train-3", "workloads/notebook-3"}
    for name in ("infer-5", "whole-6"):  # a person drains them (kubectl drain)
        cluster.kube.delete(PODS, name, WORKLOAD_NS)
    cluster.wait_state(node, "healthy", 40)
    wanted = {"limits": SLICES, "requests": SLICES}
    assert validation_resources(cluster, node) == wanted
    assert cluster.pod_exists("cpu-only")


def test_gpu_scope_drains_every_mig_pod_and_validation_holds_every_slice(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    mig_node(cluster, node)
    cluster.start_controller({"drain": {"scope": "gpu"}})
    cluster.inject(node, 3, "dbe", 1)
    rec = cluster.wait_state(node, "healthy", 60)
    assert rec.reason == "validation-passed"
    assert cluster.evicted() == {f"workloads/{name}" for name in PODS_ON}
    assert cluster.pod_exists("cpu-only")
    assert validation_resources(cluster, node) == {"limits": SLICES, "requests": SLICES}
    assert cluster.job_runs(node, "validate") == 1  # the kubelet admitted it: every slice was free


def test_a_gpu_the_device_plugin_holds_back_fails_validation_saying_why(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    sim = simulated(cluster)
    assert sim.nodesim is not None
    cluster.start_controller({"gpu_resources": {"allocatable_wait_s": 3}})
    cluster.inject(node, 2, "dbe", 1)
    sim.nodesim.set_unhealthy(node, "nvidia.com/gpu", 1)  # the device plugin saw it too: 7 of 8 allocatable
    rec = cluster.wait_state(node, "quarantined", 60)
    assert rec.reason == "validation-failed"
    assert "validation cannot hold every GPU: nvidia.com/gpu 7 of 8 allocatable" in rec.message, rec.message
    assert "1 GPU device(s) as unhealthy" in rec.message
    blocked = cluster.wait_event(node, "GPURemediationBlocked", "nvidia.com/gpu 7 of 8 allocatable")
    assert "(gpu-unavailable: validation needs every GPU" in blocked["message"], blocked["message"]
    cluster.wait_event(node, "GPUNodeQuarantined", "validation cannot hold every GPU")
    assert cluster.jobs(node, "validate") == []  # never a Job the kubelet could not admit
