"""Pipeline scenarios (issue 4): each asserts labels, record, events, metrics and which pods were evicted.

Run: ``python -m pytest e2e/test_pipeline.py -x -q`` (``-s`` shows the measured fault-to-cordon latency).
"""

from __future__ import annotations

import time

from e2e.harness import Cluster, Metrics

TRANSITIONS = "gpuremediate_transitions_total"


def assert_transitions(m: Metrics, moves: list[tuple[str, str, str]], dry_run: str = "false", count: float = 1) -> None:
    for frm, to, reason in moves:
        got = m.value(TRANSITIONS, **{"from": frm, "to": to, "reason": reason, "dry_run": dry_run})
        assert got == count, f"transitions_total{{from={frm},to={to},reason={reason}}} = {got}, expected {count}"


def test_xid79_reboot_validate_healthy(cluster: Cluster) -> None:
    node, other = cluster.nodes[0], cluster.nodes[1]
    cluster.workload("train-a", node)
    cluster.workload("bystander", other)
    cluster.start_controller()
    boot_before = cluster.node(node)["status"]["nodeInfo"]["bootID"]

    injected = time.monotonic()
    cluster.inject(node, 3, "xid", 79)
    cluster.wait(lambda: cluster.unschedulable(node), 5, f"{node} cordoned", seen=lambda: cluster.summary(node))
    latency = time.monotonic() - injected
    print(f"\nfault-to-cordon latency: {latency:.2f}s (scrape interval {getattr(cluster, 'INTERVAL_S', '?')}s)")
    assert latency < getattr(cluster, "INTERVAL_S", 15.0) * cluster.slow + 1.0

    rec = cluster.wait_state(node, "healthy", 30)
    assert rec.reason == "validation-passed"
    assert rec.fault is None and rec.action is None
    assert [(h.kind, h.code, h.action, h.outcome) for h in rec.history] == [("xid", "79", "reboot", "repaired")]
    assert cluster.label(node) == "healthy"
    assert not cluster.unschedulable(node)
    assert cluster.node(node)["status"]["nodeInfo"]["bootID"] != boot_before or cluster.target != "emulator"
    reasons = cluster.event_reasons(node)
    assert reasons[:4] == ["GPUNodeDraining", "GPUNodeRepairing", "GPUNodeValidating", "GPUNodeHealthy"], reasons
    assert cluster.evicted() == {"workloads/train-a"}
    assert cluster.pod_exists("bystander")
    assert len(cluster.jobs(node, "reboot")) == 1 and len(cluster.jobs(node, "validate")) == 1
    m = cluster.metrics()
    assert m.value("gpuremediate_faults_total", kind="xid", code="79") == 1
    assert_transitions(m, [("healthy", "draining", "xid-79"), ("draining", "repairing", "drain-complete"),
                           ("repairing", "validating", "repair-complete"),
                           ("validating", "healthy", "validation-passed")])
    assert m.value("gpuremediate_evictions_total", result="evicted") == 1
    assert m.value("gpuremediate_remediation_seconds_count", action="reboot") == 1
