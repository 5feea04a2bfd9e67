"""Pipeline scenarios (issue 4): each asserts labels, record, events, metrics and which pods were evicted.

Run: ``python -m pytest e2e/test_pipeline.py -x -q`` (``-s`` shows the measured fault-to-cordon latency).
"""

from __future__ import annotations

import functools
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


def test_dbe_reset_gpu_healthy(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    cluster.workload("infer", node)
    cluster.start_controller()
    cluster.inject(node, 2, "dbe", 1)
    rec = cluster.wait_state(node, "healthy", 20)
    assert rec.reason == "validation-passed" and not rec.stopped
    assert [(h.kind, h.action, h.outcome) for h in rec.history] == [("ecc-dbe", "reset-gpu", "repaired")] or \
        [(h.action, h.outcome) for h in rec.history] == [("reset-gpu", "repaired")], rec.history
    assert cluster.label(node) == "healthy" and not cluster.unschedulable(node)
    jobs = cluster.jobs(node, "reset-gpu")
    assert len(jobs) == 1, jobs
    env = {e["name"]: e.get("value") for e in jobs[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPU_IDS"] == "2", env
    assert cluster.jobs(node, "reboot") == []
    assert cluster.event_reasons(node)[:4] == ["GPUNodeDraining", "GPUNodeRepairing", "GPUNodeValidating",
                                               "GPUNodeHealthy"]
    assert cluster.evicted() == {"workloads/infer"}
    m = cluster.metrics()
    assert m.value("gpuremediate_remediation_seconds_count", action="reset-gpu") == 1
    assert m.value(TRANSITIONS, to="validating", reason="repair-complete") == 1


def test_row_remap_failure_quarantined_then_released(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    cluster.workload("job-x", node)
    cluster.start_controller()
    cluster.inject(node, 1, "row-remap-failure")
    rec = cluster.wait_state(node, "quarantined", 10)
    assert rec.fault is not None and rec.fault.action == "quarantine", rec.fault
    assert cluster.label(node) == "quarantined" and cluster.unschedulable(node)
    assert rec.cordoned_by_us
    # Quarantine needs a person: nothing is evicted or repaired, and it stays put.
    time.sleep(1.0)
    assert cluster.state(node) == "quarantined" and cluster.evicted() == set() and cluster.jobs(node) == []
    assert "GPUNodeQuarantined" in cluster.event_reasons(node)
    assert cluster.metrics().value(TRANSITIONS, **{"from": "healthy", "to": "quarantined"}) == 1

    done = cluster.cli("release", node, "--by", "e2e-operator")
    assert done.returncode == 0, done.stderr
    rec = cluster.wait_state(node, "healthy", 15)
    assert rec.reason == "validation-passed" and not cluster.unschedulable(node)
    assert len(cluster.jobs(node, "validate")) == 1
    m = cluster.metrics()
    assert m.value(TRANSITIONS, **{"from": "validating", "to": "healthy"}) == 1
    # The remap failure is still reported (it persists on the GPU): a released node is not re-quarantined
    # for the fault a person already dealt with.
    time.sleep(1.0)
    assert cluster.state(node) == "healthy" and not cluster.unschedulable(node)


def test_thermal_cordon_and_recovery_without_flapping(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    cluster.workload("hot-job", node)
    cluster.start_controller({"thermal": {"hold_s": 0, "clear_hold_s": 1.0}})
    states_seen: list[str] = []

    def track() -> str | None:
        state = cluster.state(node)
        if not states_seen or states_seen[-1] != state:
            states_seen.append(state)
        return None

    with cluster.invariant(track, "state sequence"):
        cluster.inject(node, 0, "temp", 95)
        rec = cluster.wait_state(node, "cordoned", 5)
        assert cluster.unschedulable(node) and rec.fault is not None and rec.fault.kind == "thermal"
        # Between the clear (80) and cordon (90) thresholds: stays cordoned (hysteresis).
        cluster.inject(node, 0, "temp", 85)
        time.sleep(2.0)
        assert cluster.state(node) == "cordoned"
        cluster.inject(node, 0, "temp", 70)
        rec = cluster.wait_state(node, "healthy", 8)
    assert rec.reason == "thermal-cleared"
    assert states_seen == ["healthy", "cordoned", "healthy"], states_seen
    assert not cluster.unschedulable(node) and cluster.label(node) == "healthy"
    assert cluster.evicted() == set() and cluster.jobs(node) == []  # a soft fault keeps its workloads
    assert cluster.event_reasons(node) == ["GPUNodeCordoned", "GPUNodeHealthy"]
    m = cluster.metrics()
    assert_transitions(m, [("healthy", "cordoned", "thermal"), ("cordoned", "healthy", "thermal-cleared")])


def test_pdb_blocks_drain_until_relaxed(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    cluster.workload("guarded", node, labels={"app": "guarded"})
    cluster.workload("free", node)
    cluster.pdb("guarded-pdb", {"app": "guarded"}, min_available=1)
    cluster.start_controller()
    cluster.inject(node, 4, "dbe", 2)

    def blocked_by_pdb() -> bool:
        rec = cluster.record(node)
        return rec is not None and rec.blocked is not None and rec.blocked.reason == "pdb"

    cluster.wait(blocked_by_pdb, 10, f"{node} blocked by the PDB", seen=lambda: cluster.summary(node))
    rec = cluster.record(node)
    assert rec is not None and rec.state == "draining" and rec.blocked is not None
    assert "guarded-pdb" in rec.blocked.detail, rec.blocked
    cluster.wait(lambda: "workloads/free" in cluster.evicted(), 5, "the unguarded pod evicted")
    assert cluster.pod_exists("guarded")
    blocked_events = [e["message"] for e in cluster.events(node) if e["reason"] == "GPURemediationBlocked"]
    assert any("guarded-pdb" in msg for msg in blocked_events), blocked_events
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_blocked_nodes", reason="pdb") == 1, 5,
                 "blocked_nodes{reason=pdb} = 1")
    m = cluster.metrics()
    assert m.value("gpuremediate_evictions_total", result="blocked") >= 1
    time.sleep(1.0)
    assert cluster.state(node) == "draining" and cluster.jobs(node) == []

    cluster.set_pdb_min_available("guarded-pdb", 0)
    rec = cluster.wait_state(node, "healthy", 20)
    assert cluster.evicted() == {"workloads/guarded", "workloads/free"}
    assert not cluster.unschedulable(node) and rec.blocked is None
    assert cluster.metrics().value("gpuremediate_blocked_nodes", reason="pdb") == 0


def _in_flight(cluster: Cluster) -> list[str]:
    """Nodes being drained (admitted), repaired or validated: what the budget limits."""
    out = []
    for name in cluster.nodes:
        rec = cluster.record(name)
        if rec is None:
            continue
        if rec.state in ("repairing", "validating") or (rec.state == "draining" and rec.action is not None):
            out.append(name)
    return out


def test_budget_of_one_with_two_faults(cluster: Cluster) -> None:
    a, b = cluster.nodes[0], cluster.nodes[1]
    cluster.workload("pod-a", a)
    cluster.workload("pod-b", b)
    cluster.start_controller({"budget": {"max_unavailable": "1"}})

    def at_most_one() -> str | None:
        busy = _in_flight(cluster)
        return f"{len(busy)} nodes out at once: {busy}" if len(busy) > 1 else None

    with cluster.invariant(at_most_one, "budget 1: never two nodes out at once"):
        cluster.inject(a, 0, "xid", 79)
        cluster.inject(b, 0, "xid", 79)
        # Both are cordoned at once (a fatal fault is cordoned regardless of the budget) ...
        cluster.wait(lambda: cluster.unschedulable(a) and cluster.unschedulable(b), 5, "both cordoned")

        def someone_waits_for_budget() -> bool:
            recs = [cluster.record(n) for n in (a, b)]
            return any(r is not None and r.blocked is not None and r.blocked.reason == "budget" for r in recs)

        cluster.wait(someone_waits_for_budget, 5, "one node blocked=budget",
                     seen=lambda: [cluster.summary(n) for n in (a, b)])
        cluster.wait_state(a, "healthy", 30)
        cluster.wait_state(b, "healthy", 30)
    assert cluster.evicted() == {"workloads/pod-a", "workloads/pod-b"}
    assert not cluster.unschedulable(a) and not cluster.unschedulable(b)
    reasons = cluster.event_reasons(a) + cluster.event_reasons(b)
    assert reasons.count("GPUNodeHealthy") == 2
    blocked = [e["message"] for n in (a, b) for e in cluster.events(n) if e["reason"] == "GPURemediationBlocked"]
    assert any("budget" in msg for msg in blocked), blocked
    m = cluster.metrics()
    assert m.value("gpuremediate_budget_limit") == 1
    assert m.value(TRANSITIONS, to="healthy", reason="validation-passed") == 2


def _repaired_and_clean(cluster: Cluster, node: str, repairs: int) -> bool:
    rec = cluster.record(node)
    return rec is not None and rec.state == "healthy" and len(rec.history) == repairs and not rec.handled


def test_repeat_offender_quarantined(cluster: Cluster) -> None:
    node = cluster.nodes[3]
    cluster.start_controller({"repeat_offender": {"count": 2, "window_s": 3600}})
    for round_ in (1, 2):
        cluster.inject(node, 5, "dbe", 1)
        # Done, and a clean read seen since (the handled fingerprint forgotten): the next DBE is a new fault.
        cluster.wait(functools.partial(_repaired_and_clean, cluster, node, round_), 20, f"repair #{round_} done",
                     seen=lambda: cluster.summary(node))
    cluster.inject(node, 5, "dbe", 1)
    rec = cluster.wait_state(node, "quarantined", 10)
    assert rec.reason == "repeat-offender", rec.reason
    assert cluster.unschedulable(node) and cluster.label(node) == "quarantined"
    assert len(cluster.jobs(node, "reset-gpu")) == 2
    assert cluster.event_reasons(node)[-1] == "GPUNodeQuarantined"
    m = cluster.metrics()
    assert m.value(TRANSITIONS, **{"from": "healthy", "to": "quarantined", "reason": "repeat-offender"}) == 1
    assert m.value("gpuremediate_faults_total") == 3


def test_validation_failure_quarantined(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    cluster.require("choose a validation outcome per node")
    cluster.set_validation(node, False)
    cluster.workload("w", node)
    cluster.start_controller()
    cluster.inject(node, 0, "dbe", 1)
    rec = cluster.wait_state(node, "quarantined", 20)
    assert rec.reason == "validation-failed"
    assert cluster.unschedulable(node) and cluster.label(node) == "quarantined"
    assert cluster.evicted() == {"workloads/w"}
    assert len(cluster.jobs(node, "validate")) == 1
    assert cluster.event_reasons(node)[-1] == "GPUNodeQuarantined"
    assert cluster.metrics().value(TRANSITIONS, **{"from": "validating", "to": "quarantined"}) == 1


def test_dry_run_changes_nothing(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    cluster.workload("keep-me", node)
    mark = cluster.audit_mark()
    cluster.start_controller(dry_run=True)
    cluster.inject(node, 3, "xid", 79)

    def dry_events() -> list[str]:
        return [e["message"] for e in cluster.events(node) if "(dry-run)" in e["message"]]

    cluster.wait(lambda: any("draining" in msg for msg in dry_events()), 5, "a (dry-run) draining Event")
    time.sleep(1.5)  # let the would-be drain run a few steps
    assert all("(dry-run)" in e["message"] for e in cluster.events(node)), cluster.events(node)
    assert cluster.record(node) is None and cluster.label(node) is None
    assert not cluster.unschedulable(node)
    assert cluster.evicted() == set() and cluster.pod_exists("keep-me")
    assert cluster.jobs() == []
    # Server-side dry-run evictions (dryRun=All: the PDB's answer without the effect) are all it sends.
    assert {m[:4] for m in cluster.mutations_since(mark)} <= {("create", "", "pods", "eviction")}
    m = cluster.metrics()
    assert m.value("gpuremediate_dry_run") == 1
    assert_transitions(m, [("healthy", "draining", "xid-79")], dry_run="true")
    assert m.value(TRANSITIONS, dry_run="false") == 0
