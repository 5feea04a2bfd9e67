"""The shipped RBAC against a GPU-level isolation (``[isolation] scope = "gpu"``, docs/dra.md).

`gpuremediate run` with the base Deployment's args runs under the rules the base manifests bind to it (the
emulator enforces them) on a DRA cluster: XID 48 on GPU 1 of a node whose pods hold their GPUs through
ResourceClaims -> DeviceTaintRule NoSchedule -> NoExecute -> the pod on GPU 1 deleted by the eviction controller
-> reset Job -> validation Job -> the rule deleted -> healthy. Every call must be allowed, and every permission
granted for isolation (which the node-level flow of test_rbac_calls.py lists as unused there) used here.
"""

from __future__ import annotations

from pathlib import Path

from manifests_support import (
    CONTROLLER_USER,
    allows,
    controller_calls,
    controller_grants,
    controller_under_rbac,
)

from gpuremediate.kube.resources import NODES
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.cluster import SimCluster
from sim.dra_claims import run_on_gpu
from sim.waiting import wait_for

NODE = "gpu-node-1"
ISOLATION_PERMISSIONS = {("resource.k8s.io", resource, verb) for resource, verb in (
    ("devicetaintrules", "get"), ("devicetaintrules", "list"), ("devicetaintrules", "create"),
    ("devicetaintrules", "update"), ("devicetaintrules", "delete"), ("resourceslices", "list"),
    ("resourceclaims", "get"), ("resourceclaims", "create"))}
POLICY = """
[isolation]
scope = "gpu"
before_ga = "gpu"  # the emulator serves DeviceTaintRule at v1beta2, as 1.36 does

[drain]
retry_s = 0.3
"""


def _healthy_again(cluster: SimCluster) -> bool:
    record = record_from_node(cluster.kube.get(NODES, NODE))
    return isinstance(record, NodeRecord) and record.state == "healthy" and bool(record.history)


def test_a_gpu_level_isolation_runs_under_the_shipped_rules_and_uses_them(tmp_path: Path) -> None:
    cluster = SimCluster(nodes=1, gpus=4, job_duration_s=0.3, dra=True).start()
    try:
        assert cluster.api is not None and cluster.nodesim is not None
        wait_for(lambda: cluster.nodesim is not None and cluster.nodesim.resource_slices(NODE), 10, "the slice")
        for gpu in range(4):
            run_on_gpu(cluster.kube, f"w{gpu}", "workloads", NODE, f"gpu-{gpu}")
        with controller_under_rbac(cluster, tmp_path, POLICY) as log_path:
            wait_for(lambda: any(r[3] == "leases" and r[0] == CONTROLLER_USER for r in list(cluster.api.requests)),
                     30, "the controller to start")
            cluster.gpusim.inject_xid(NODE, 1, 48)
            wait_for(lambda: _healthy_again(cluster), 60, f"{NODE} isolated, repaired, validated and healthy",
                     interval=0.1)
        text = log_path.read_text(encoding="utf-8")
        calls = controller_calls(cluster)
        grants = controller_grants()
        missing = sorted({c for c in calls if not any(allows(g, *c) for g in grants)}, key=str)
        assert not missing, f"calls the manifests do not allow (403): {missing}"
        assert "Forbidden" not in text and "Traceback" not in text, text
        used = {(c[1], c[2], c[0]) for c in calls}
        assert used >= ISOLATION_PERMISSIONS, f"granted for isolation but not used: {ISOLATION_PERMISSIONS - used}"
    finally:
        cluster.stop()
