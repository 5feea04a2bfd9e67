"""The workload signal (issue 29): a node whose pods keep failing with GPU errors, while its exporter shows nothing,
is cordoned for it (``[workload]``, action cordon: no new pods land there, the running ones stay); a node with one
such failure, or with pods failing for their own reasons, is left alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.harness import WORKLOAD_NS, Cluster
from gpuremediate.kube.resources import PODS

REFUSED = ("Pod was rejected: Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
           "Requested: 1, Available: 0, which is unexpected")
FAST = {"workload": {"min_pods": 3, "window_s": 600}}


@pytest.fixture(autouse=True)
def clean_controller_log(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.stop_controller()
    assert cluster.log_problems() == []


def refused(cluster: Cluster, name: str, node: str, message: str = REFUSED,
            reason: str = "UnexpectedAdmissionError") -> None:
    """A pod the node's kubelet refused at admission, as it leaves it (phase Failed, its reason and message)."""
    cluster.workload(name, node, gpus=1)
    cluster.kube.patch(PODS, name, {"status": {"phase": "Failed", "reason": reason, "message": message}},
                       WORKLOAD_NS, subresource="status")


def test_pods_refused_for_the_gpu_cordon_their_node_and_nothing_is_evicted(cluster: Cluster) -> None:
    node, other = cluster.nodes[0], cluster.nodes[1]
    cluster.workload("running", node, gpus=0)  # a pod that runs there: cordoned around, never evicted
    cluster.start_controller(FAST)
    for i in range(3):
        refused(cluster, f"rejected-{i}", node)
    refused(cluster, "cpu-short", other, message="Pod was rejected: Node didn't have enough resource: cpu",
            reason="OutOfcpu")
    refused(cluster, "one-off", other)

    cluster.wait(lambda: cluster.unschedulable(node), 20, f"{node} cordoned for its pods' GPU errors",
                 seen=lambda: cluster.summary(node))
    record = cluster.wait_state(node, "cordoned", 10)
    assert record.fault is not None and record.fault.kind == "workload-gpu-errors", record
    assert "3 pods refused at admission" in record.fault.message, record.fault.message
    explained = cluster.cli("explain", node).stdout
    assert "workload-gpu-errors" in explained and "rejected-" in explained, explained
    cluster.holds(lambda: not cluster.unschedulable(other) and cluster.record(other) is None, 2.0,
                  f"{other}: one GPU refusal and a CPU shortage are no fault of its GPUs")
    assert cluster.evicted() == set() and cluster.pod_exists("running")
