"""The simulated GPU Operator: operand pods follow their deploy labels, hold the GPUs, and take the exporter
with them."""

from __future__ import annotations

from gpuremediate.kube.resources import NODES, PODS
from sim.cluster import DEPLOY_LABEL, OPERANDS, SimCluster
from sim.waiting import wait_for

NODE = "gpu-node-1"


def _set_all(cluster: SimCluster, value: str) -> None:
    labels = {DEPLOY_LABEL + operand: value for operand in OPERANDS}
    cluster.kube.patch(NODES, NODE, {"metadata": {"labels": labels}})


def _pods(cluster: SimCluster) -> set[str]:
    items = cluster.kube.list(PODS, "gpu-operator", field_selector=f"spec.nodeName={NODE}")["items"]
    return {p["metadata"]["name"] for p in items}


def test_operand_pods_leave_and_come_back_with_their_labels() -> None:
    with SimCluster(nodes=1, gpus=2, gpu_operator=True, busy_writes_per_s=0) as cluster:
        assert len(_pods(cluster)) == len(OPERANDS)
        assert "In use by another client" in cluster.gpusim.reset_refusal(NODE, [0])
        _set_all(cluster, "false")
        wait_for(lambda: not _pods(cluster), 10, "the operand pods gone")
        wait_for(lambda: cluster.gpusim.reset_refusal(NODE, [0]) == "", 5, "the GPUs free")
        assert cluster.gpusim.node(NODE).down == "refuse"  # no exporter: gpu-sim does not serve the node
        _set_all(cluster, "true")
        wait_for(lambda: len(_pods(cluster)) == len(OPERANDS), 10, "the operand pods back")
        wait_for(lambda: cluster.gpusim.node(NODE).down is None, 10, "the exporter serving again")
        assert "In use by another client" in cluster.gpusim.reset_refusal(NODE, [0])


def test_a_stuck_pod_keeps_holding_the_gpus() -> None:
    with SimCluster(nodes=1, gpus=2, gpu_operator=True, busy_writes_per_s=0) as cluster:
        assert cluster.operator is not None
        cluster.operator.stuck(NODE, "dcgm")
        _set_all(cluster, "false")
        wait_for(lambda: _pods(cluster) == {f"nvidia-dcgm-{NODE}"}, 10, "all but the stuck pod gone")
        assert "nv-hostengine" in cluster.gpusim.reset_refusal(NODE, [0])


def test_an_sxm2_node_refuses_a_reset_of_some_of_its_gpus() -> None:
    with SimCluster(nodes=1, gpus=2, products={NODE: "Tesla-V100-SXM2-32GB"}, busy_writes_per_s=0) as cluster:
        assert "must be reset in the same command" in cluster.reset_refusal(NODE, [1])
        assert cluster.reset_refusal(NODE, [0, 1]) == ""
        labels = cluster.kube.get(NODES, NODE)["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == "Tesla-V100-SXM2-32GB"
        assert not any(key.startswith(DEPLOY_LABEL) for key in labels)  # no operator: no deploy labels
