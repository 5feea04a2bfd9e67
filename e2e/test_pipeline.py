"""Pipeline scenarios (issue 4): each asserts labels, record, events, metrics and which pods were evicted.

Run: ``python -m pytest e2e/test_pipeline.py -x -q`` (``-s`` shows the measured fault-to-cordon latency).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import pytest

from e2e.harness import Cluster
from gpuremediate.kube.resources import EVENTS, PODS
from gpuremediate.vocab.record import NodeRecord

TRANSITIONS = "gpuremediate_transitions_total"


@pytest.fixture(autouse=True)
def clean_controller_log(cluster: Cluster) -> Iterator[None]:
    """Every scenario ends with a clean SIGTERM shutdown and no traceback in the controller's log."""
    yield
    cluster.stop_controller()
    assert cluster.log_problems() == []


def assert_transitions(cluster: Cluster, moves: list[tuple[str, str, str]], dry_run: str = "false",
                       count: float = 1) -> None:
    """transitions_total reads ``count`` for each move (waited for: it moves after the node write)."""
    for frm, to, reason in moves:
        cluster.wait_metric(TRANSITIONS, count, **{"from": frm, "to": to, "reason": reason, "dry_run": dry_run})


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
    assert cluster.node(node)["status"]["nodeInfo"]["bootID"] != boot_before or not cluster.simulated_nodes
    reasons = cluster.event_reasons(node)
    assert reasons[:4] == ["GPUNodeDraining", "GPUNodeRepairing", "GPUNodeValidating", "GPUNodeHealthy"], reasons
    assert cluster.evicted() == {"workloads/train-a"}
    assert cluster.pod_exists("bystander")
    assert len(cluster.jobs(node, "reboot")) == 1 and len(cluster.jobs(node, "validate")) == 1
    cluster.wait_metric("gpuremediate_faults_total", 1, kind="xid", code="79")
    assert_transitions(cluster, [("healthy", "draining", "xid-79"), ("draining", "repairing", "drain-complete"),
                                 ("repairing", "validating", "repair-complete"),
                                 ("validating", "healthy", "validation-passed")])
    cluster.wait_metric("gpuremediate_evictions_total", 1, result="evicted")
    cluster.wait_metric("gpuremediate_remediation_seconds_count", 1, action="reboot")


def test_the_pods_a_gpu_fault_moves_and_their_job_are_told_why(cluster: Cluster) -> None:
    """Issue 29's workload notice: a Warning Event GPUFault on the evicted pod and on its owner (here a PyTorchJob,
    a kind this server does not serve, as most clusters' training operators), naming the node, the GPU and the
    fault; the pod on the healthy node hears nothing."""
    node, other = cluster.nodes[2], cluster.nodes[3]
    trainer = cluster.workload("trainer-0", node)
    cluster.kube.patch(PODS, "trainer-0", {"metadata": {"ownerReferences": [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llm", "uid": "pytorchjob-llm-uid",
         "controller": True}]}}, trainer["metadata"]["namespace"])
    cluster.workload("bystander-2", other)
    cluster.start_controller()
    cluster.inject(node, 5, "xid", 79)

    def told() -> dict[str, str] | None:
        items = cluster.kube.list(EVENTS, trainer["metadata"]["namespace"], field_selector="reason=GPUFault")["items"]
        found = {f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}": e["message"] for e in items}
        return found if len(found) >= 2 else None

    found = cluster.wait(told, 20, "GPUFault Events on the pod and its PyTorchJob")
    assert set(found) == {"Pod/trainer-0", "PyTorchJob/llm"}, found
    assert all(node in m and "XID 79" in m and "GPU-" in m for m in found.values()), found
    assert "evicted" in found["Pod/trainer-0"] and "trainer-0" in found["PyTorchJob/llm"]
    cluster.wait_state(node, "healthy", 30)
    assert set(told() or {}) == set(found), "each told once"


def test_dbe_reset_gpu_healthy(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    cluster.workload("infer", node)
    cluster.start_controller()
    cluster.inject(node, 2, "dbe", 1)
    rec = cluster.wait_state(node, "healthy", 20)
    assert rec.reason == "validation-passed" and not rec.stopped
    assert [(h.kind, h.action, h.outcome) for h in rec.history] == [("ecc-dbe", "reset-gpu", "repaired")]
    assert cluster.label(node) == "healthy" and not cluster.unschedulable(node)
    jobs = cluster.jobs(node, "reset-gpu")
    assert len(jobs) == 1, jobs
    env = {e["name"]: e.get("value") for e in jobs[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPU_IDS"] == "2", env
    assert cluster.jobs(node, "reboot") == []
    assert cluster.event_reasons(node)[:4] == ["GPUNodeDraining", "GPUNodeRepairing", "GPUNodeValidating",
                                               "GPUNodeHealthy"]
    assert cluster.evicted() == {"workloads/infer"}
    cluster.wait_metric("gpuremediate_remediation_seconds_count", 1, action="reset-gpu")
    cluster.wait_metric(TRANSITIONS, 1, to="validating", reason="repair-complete")


def test_a_reboot_drains_the_pods_a_gpu_scope_would_leave(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    cluster.workload("train", node)
    cluster.workload("cpu-side", node, gpus=0, labels={"app": "cpu-side"})  # a reboot would end it unasked
    cluster.pdb("cpu-side-pdb", {"app": "cpu-side"}, min_available=1)
    cluster.start_controller({"drain": {"scope": "gpu"}})
    cluster.inject(node, 4, "xid", 79)
    rec = cluster.wait(lambda: cluster.blocked_record(node, "pdb"), 15, "the drain held by the CPU pod's PDB",
                       seen=lambda: cluster.summary(node))
    assert rec is not None and rec.action is not None and rec.blocked is not None
    assert rec.action.detail == "scope all: a reboot ends every pod on the node", rec.action
    assert "cpu-side-pdb" in rec.blocked.detail
    assert "Drain scope all: a reboot ends every pod on the node." in cluster.cli("explain", node).stdout
    cluster.set_pdb_min_available("cpu-side-pdb", 0)
    rec = cluster.wait_state(node, "healthy", 30)
    assert [(h.code, h.action, h.outcome) for h in rec.history] == [("79", "reboot", "repaired")]
    assert cluster.evicted() == {"workloads/train", "workloads/cpu-side"}


def test_row_remap_failure_quarantined_then_released(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    cluster.workload("job-x", node)
    cluster.start_controller()
    cluster.inject(node, 1, "row-remap-failure")
    rec = cluster.wait_state(node, "quarantined", 10)
    assert rec.fault is not None and rec.fault.action == "quarantine", rec.fault
    assert rec.reason == "row-remap-failure" and rec.fault.gpus and rec.fault.kind == "row-remap-failure"
    assert cluster.label(node) == "quarantined" and cluster.unschedulable(node)
    assert rec.cordoned_by_us
    # Quarantine needs a person: nothing is evicted or repaired, and it stays put.
    cluster.holds(lambda: cluster.state(node) == "quarantined" and cluster.evicted() == set()
                  and cluster.jobs(node) == [], 1.0, f"{node} quarantined, nothing evicted, no Job",
                  seen=lambda: (cluster.summary(node), cluster.evicted(), cluster.jobs(node)))
    assert "GPUNodeQuarantined" in cluster.event_reasons(node)
    cluster.wait_metric(TRANSITIONS, 1, **{"from": "healthy", "to": "quarantined"})

    done = cluster.cli("release", node, "--by", "e2e-operator")
    assert done.returncode == 0, done.stderr
    # Validation needs every GPU: it waits, saying which pod holds one, until the person drains the node.
    waiting = cluster.wait(lambda: cluster.blocked_record(node, "gpu-pods"), 10, "validation waiting for the GPU pods")
    assert waiting is not None and waiting.blocked is not None and waiting.state == "validating", waiting
    assert "workloads/job-x" in waiting.blocked.detail, waiting.blocked
    assert cluster.jobs(node, "validate") == []
    cluster.kube.delete(PODS, "job-x", "workloads", grace_period_seconds=0)  # the person: kubectl drain
    rec = cluster.wait_state(node, "healthy", 15)
    assert rec.reason == "validation-passed" and not cluster.unschedulable(node)
    assert len(cluster.jobs(node, "validate")) == 1
    cluster.wait_metric(TRANSITIONS, 1, **{"from": "validating", "to": "healthy"})
    # The remap failure is still reported (it persists on the GPU): a released node is not re-quarantined
    # for the fault a person already dealt with.
    cluster.holds(lambda: cluster.state(node) == "healthy" and not cluster.unschedulable(node), 1.0,
                  f"{node} healthy and schedulable after the release", seen=lambda: cluster.summary(node))


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
        cluster.holds(lambda: cluster.state(node) == "cordoned", 2.0, f"{node} cordoned at 85 (hysteresis)",
                      seen=lambda: cluster.summary(node))
        cluster.inject(node, 0, "temp", 70)
        rec = cluster.wait_state(node, "healthy", 8)
    track()  # the sampler may not have run since the last change
    assert rec.reason == "thermal-cleared"
    assert states_seen == ["healthy", "cordoned", "healthy"], states_seen
    assert not cluster.unschedulable(node) and cluster.label(node) == "healthy"
    assert cluster.evicted() == set() and cluster.jobs(node) == []  # a soft fault keeps its workloads
    assert cluster.event_reasons(node) == ["GPUNodeCordoned", "GPUNodeHealthy"]
    assert_transitions(cluster, [("healthy", "cordoned", "thermal"), ("cordoned", "healthy", "thermal-cleared")])


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
    cluster.wait_event(node, "GPURemediationBlocked", "guarded-pdb")
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_blocked_nodes", reason="pdb") == 1, 5,
                 "blocked_nodes{reason=pdb} = 1")
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_evictions_total", result="blocked") >= 1, 5,
                 "evictions_total{result=blocked} >= 1")
    cluster.holds(lambda: cluster.state(node) == "draining" and cluster.jobs(node) == [], 1.0,
                  f"{node} draining (PDB-blocked) with no repair Job", seen=lambda: cluster.summary(node))

    cluster.set_pdb_min_available("guarded-pdb", 0)
    rec = cluster.wait_state(node, "healthy", 20)
    assert cluster.evicted() == {"workloads/guarded", "workloads/free"}
    assert not cluster.unschedulable(node) and rec.blocked is None
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_blocked_nodes", reason="pdb") == 0, 5,
                 "blocked_nodes{reason=pdb} back to 0")


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
    # The Event follows the node write: wait for it rather than race it.
    cluster.wait(lambda: (cluster.event_reasons(a) + cluster.event_reasons(b)).count("GPUNodeHealthy") == 2, 5,
                 "a GPUNodeHealthy Event for each node")
    blocked = [e["message"] for n in (a, b) for e in cluster.events(n) if e["reason"] == "GPURemediationBlocked"]
    assert any("budget" in msg for msg in blocked), blocked
    cluster.wait_metric("gpuremediate_budget_limit", 1)
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_budget_in_use") == 0, 5,
                 "budget_in_use back to 0 once both nodes are back in service")
    cluster.wait_metric(TRANSITIONS, 2, to="healthy", reason="validation-passed")


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
    cluster.wait_metric(TRANSITIONS, 1, **{"from": "healthy", "to": "quarantined", "reason": "repeat-offender"})
    cluster.wait_metric("gpuremediate_faults_total", 3)


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
    cluster.wait_metric(TRANSITIONS, 1, **{"from": "validating", "to": "quarantined"})


def test_dry_run_changes_nothing(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    cluster.workload("keep-me", node)
    mark = cluster.audit_mark()
    cluster.start_controller(dry_run=True)
    cluster.inject(node, 3, "xid", 79)

    def dry_events() -> list[str]:
        return [e["message"] for e in cluster.events(node) if "(dry-run)" in e["message"]]

    cluster.wait(lambda: any("draining" in msg for msg in dry_events()), 5, "a (dry-run) draining Event")
    # While the would-be drain runs a few steps, nothing is written for real.
    cluster.holds(lambda: cluster.record(node) is None and cluster.label(node) is None
                  and not cluster.unschedulable(node) and cluster.jobs() == [], 1.5,
                  f"dry run: no record, label, cordon or Job on {node}",
                  seen=lambda: (cluster.summary(node), cluster.jobs()))
    assert all("(dry-run)" in e["message"] for e in cluster.events(node)), cluster.events(node)
    assert cluster.evicted() == set() and cluster.pod_exists("keep-me")
    # Server-side dry-run evictions (dryRun=All: the PDB's answer without the effect) are all it sends, beside
    # its journal for the CLI (ConfigMap gpuremediate-dry-run in its own namespace).
    sent = [m for m in cluster.mutations_since(mark) if not (m[2] == "configmaps" and m[5] in ("gpuremediate-dry-run",
                                                                                                "None"))]
    assert {m[:4] for m in sent} <= {("create", "", "pods", "eviction")}, sent
    cluster.wait_metric("gpuremediate_dry_run", 1)
    assert_transitions(cluster, [("healthy", "draining", "xid-79")], dry_run="true")
    assert cluster.metrics().value(TRANSITIONS, dry_run="false") == 0


def test_controller_killed_mid_drain_resumes_without_repeating(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    cluster.workload("stuck", node, labels={"app": "stuck"})
    cluster.pdb("stuck-pdb", {"app": "stuck"}, min_available=1)
    cluster.start_controller()
    cluster.inject(node, 6, "xid", 79)
    cluster.wait(lambda: (r := cluster.record(node)) is not None and r.action is not None and r.blocked is not None,
                 10, f"{node} mid-drain (blocked by the PDB)", seen=lambda: cluster.summary(node))
    cluster.kill_controller()
    started = cluster.record(node)
    assert started is not None and started.action is not None
    cluster.set_pdb_min_available("stuck-pdb", 0)
    cluster.start_controller()
    cluster.wait_state(node, "repairing", 10)
    # The drain resumed (same action, not restarted) and the repair Job is named in the record
    # (written by the remediate loop just after the transition: wait for it).
    def attempt_named() -> NodeRecord | None:
        rec = cluster.record(node)
        return rec if rec is not None and rec.action is not None else None

    rec = cluster.wait(attempt_named, 5, "the repair attempt named in the record", seen=lambda: cluster.summary(node))
    assert rec is not None and rec.action is not None and rec.action.kind == "reboot"
    cluster.wait(lambda: cluster.jobs(node, "reboot"), 5, "the reboot Job")
    cluster.kill_controller()  # again, right after the one-shot Job was created
    cluster.start_controller()
    rec = cluster.wait_state(node, "healthy", 20)
    assert len(cluster.jobs(node, "reboot")) == 1 and len(cluster.jobs(node, "validate")) == 1
    assert cluster.job_runs(node, "reboot") == 1
    assert [(h.action, h.outcome) for h in rec.history] == [("reboot", "repaired")]
    assert cluster.evicted() == {"workloads/stuck"}
    assert not cluster.unschedulable(node)
    reasons = cluster.event_reasons(node)
    for reason in ("GPUNodeDraining", "GPUNodeRepairing", "GPUNodeValidating", "GPUNodeHealthy"):
        assert reasons.count(reason) == 1, reasons
    # The last process's counters: it saw the validation through.
    cluster.wait_metric(TRANSITIONS, 1, **{"from": "validating", "to": "healthy"})


def test_person_cordon_survives_and_person_uncordon_stops_us(cluster: Cluster) -> None:
    held, taken = cluster.nodes[0], cluster.nodes[1]
    cluster.workload("a", held)
    cluster.workload("b", taken, labels={"app": "b"})
    cluster.pdb("b-pdb", {"app": "b"}, min_available=1)
    cluster.cordon(held)  # a person cordoned it before any fault
    cluster.start_controller({"budget": {"max_unavailable": "2"}})
    cluster.inject(held, 0, "dbe", 1)
    rec = cluster.wait_state(held, "healthy", 20)
    assert rec.reason == "validation-passed"
    assert cluster.unschedulable(held), "a person's cordon was undone"
    assert cluster.evicted() == {"workloads/a"}

    cluster.inject(taken, 0, "dbe", 1)
    cluster.wait(lambda: (r := cluster.record(taken)) is not None and r.blocked is not None
                 and r.blocked.reason == "pdb", 10, f"{taken} drain blocked", seen=lambda: cluster.summary(taken))
    cluster.uncordon(taken)  # a person takes the node back mid-flow
    rec = cluster.wait_state(taken, "healthy", 5)
    assert rec.reason == "person-uncordoned" and rec.stopped
    # The DBE is still reported: we do not act on it again.
    cluster.holds(lambda: cluster.state(taken) == "healthy" and not cluster.unschedulable(taken)
                  and cluster.jobs(taken) == [], 1.5, f"{taken} left alone after the person's uncordon",
                  seen=lambda: cluster.summary(taken))
    assert cluster.pod_exists("b")
    assert cluster.event_reasons(taken).count("GPUNodeDraining") == 1
    cluster.wait_metric(TRANSITIONS, 1, **{"from": "draining", "to": "healthy", "reason": "person-uncordoned"})
    cluster.wait_metric("gpuremediate_faults_total", 2, kind="ecc-dbe")


def test_exporter_down_is_not_unhealthy(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    cluster.workload("w", node)
    cluster.start_controller()
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_detect_cycles_total") >= 1, 5, "the first detect cycle")
    cluster.exporter_down(node, "refuse")
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_nodes_unknown") == 1, 5, "nodes_unknown = 1")
    cluster.wait(lambda: "GPUHealthUnknown" in cluster.event_reasons(node), 5, "a GPUHealthUnknown Event")
    cluster.holds(lambda: cluster.record(node) is None and cluster.label(node) is None
                  and not cluster.unschedulable(node), 1.0, f"{node} untouched while its exporter is down",
                  seen=lambda: cluster.summary(node))
    m = cluster.metrics()
    assert m.value(TRANSITIONS) == 0 and m.value("gpuremediate_scrape_errors_total") >= 1
    cluster.exporter_up(node)
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_nodes_unknown") == 0, 5, "nodes_unknown = 0")
    cluster.wait(lambda: "GPUHealthKnown" in cluster.event_reasons(node), 5, "a GPUHealthKnown Event")
    assert cluster.event_reasons(node).count("GPUHealthUnknown") == 1  # an Event on change, not per scrape
    assert cluster.evicted() == set() and cluster.record(node) is None


def test_excluded_node_reported_never_touched(cluster: Cluster) -> None:
    node = cluster.nodes[3]
    cluster.set_label(node, "gpuremediate.io/exclude", "true")
    cluster.workload("w", node)
    cluster.start_controller()
    cluster.inject(node, 1, "xid", 79)
    cluster.wait(lambda: "GPUFaultExcludedNode" in cluster.event_reasons(node), 5, "a GPUFaultExcludedNode Event")
    cluster.holds(lambda: cluster.record(node) is None and cluster.label(node) is None
                  and not cluster.unschedulable(node) and cluster.jobs(node) == [], 1.0,
                  f"excluded {node} untouched", seen=lambda: (cluster.summary(node), cluster.jobs(node)))
    assert cluster.evicted() == set()
    assert cluster.event_reasons(node) == ["GPUFaultExcludedNode"]  # once, not per scrape
    m = cluster.metrics()
    assert m.value(TRANSITIONS) == 0 and m.value("gpuremediate_faults_total") == 0


def test_circuit_breaker_opens_and_reset_closes_it(cluster: Cluster) -> None:
    a, b, c = cluster.nodes[0], cluster.nodes[1], cluster.nodes[2]
    cluster.start_controller({"budget": {"max_unavailable": "4"},
                              "breaker": {"threshold_percent": 50, "min_nodes": 3, "window_s": 600}})
    cluster.inject(a, 0, "dbe", 1)
    cluster.inject(b, 0, "dbe", 1)
    cluster.wait(lambda: cluster.unschedulable(a) and cluster.unschedulable(b), 5, "two faults acted on")
    cluster.inject(c, 0, "dbe", 1)  # 3 of 4 nodes (75% > 50%) within the window: the breaker opens

    def blocked_by_breaker() -> bool:
        rec = cluster.record(c)
        return rec is not None and rec.blocked is not None and rec.blocked.reason == "breaker"

    cluster.wait(blocked_by_breaker, 5, f"{c} blocked by the breaker", seen=lambda: cluster.summary(c))
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_circuit_breaker_open") == 1, 5, "breaker_open = 1")
    assert cluster.state(c) == "healthy" and not cluster.unschedulable(c)  # no new work, not even a cordon
    cluster.wait(lambda: any(r == "GPURemediationBreakerOpen" for n in (a, b, c) for r in cluster.event_reasons(n)),
                 5, "a GPURemediationBreakerOpen Event")
    status = cluster.cli("breaker", "status")
    assert status.returncode == 0 and "open" in status.stdout, status
    cluster.holds(lambda: cluster.state(c) == "healthy" and not cluster.unschedulable(c) and cluster.jobs(c) == [],
                  1.0, f"{c} untouched while the breaker is open", seen=lambda: cluster.summary(c))

    reset = cluster.cli("breaker", "reset")
    assert reset.returncode == 0 and "closed" in reset.stdout, (reset.stdout, reset.stderr)
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_circuit_breaker_open") == 0, 5, "breaker_open = 0")
    cluster.wait(lambda: len(cluster.jobs(c, "reset-gpu")) == 1, 10, f"{c} repaired after the reset")
    rec = cluster.wait_state(c, "healthy", 20)
    assert [h.outcome for h in rec.history] == ["repaired"]
    for n in (a, b):
        assert cluster.wait_state(n, "healthy", 20).history


def test_stale_xid_after_repair_is_not_a_new_fault(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    cluster.start_controller({"xid.overrides": {"79": "reset-gpu"}})
    cluster.inject(node, 2, "xid", 79)
    cluster.wait_state(node, "validating", 15)
    # The GPU was reset, but dcgm-exporter's XID gauge keeps its last value: the same XID is still reported.
    cluster.inject(node, 2, "xid", 79)
    cluster.wait_state(node, "healthy", 15)
    cluster.holds(lambda: cluster.state(node) == "healthy" and not cluster.unschedulable(node), 1.5,
                  f"{node} healthy through several scrapes of the stale gauge", seen=lambda: cluster.summary(node))
    rec = cluster.record(node)
    assert rec is not None
    assert rec.handled, "the repaired fault's fingerprint must stay handled while it is still reported"
    assert len(cluster.jobs(node, "reset-gpu")) == 1
    cluster.wait_metric("gpuremediate_faults_total", 1, kind="xid", code="79")
    cluster.wait_metric(TRANSITIONS, 1, **{"from": "healthy", "to": "draining"})
