"""The replay's in-memory cluster answers the controller's writes the way the API server does."""

from __future__ import annotations

from gpuremediate.kube.resources import NODES
from gpuremediate.replay.cluster import Durations, ReplayCluster, SimClock, replay_node


def test_a_status_condition_patch_merges_by_type_and_keeps_ready() -> None:
    node = replay_node({"metadata": {"name": "n1"}}, gpus=8)
    cluster = ReplayCluster([node], SimClock(0.0), Durations(), on_write=lambda _before, _after: None)
    condition = {"type": "GPURemediation", "status": "True", "reason": "Repairing", "message": "reboot"}
    cluster.patch(NODES, "n1", {"status": {"conditions": [condition]}}, patch_type="strategic",
                  subresource="status")
    cluster.patch(NODES, "n1", {"status": {"conditions": [{**condition, "reason": "Validating"}]}},
                  patch_type="strategic", subresource="status")
    conditions = {c["type"]: c for c in cluster.get(NODES, "n1")["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True"  # a merge patch would have replaced the whole list
    assert conditions["GPURemediation"]["reason"] == "Validating"
    assert len(cluster.get(NODES, "n1")["status"]["conditions"]) == 2
