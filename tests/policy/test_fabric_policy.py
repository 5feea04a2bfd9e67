"""``[fabric]`` (issue 28): fabric state and IMEX as findings, and the false alarms they must not raise."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from gpuremediate.policy.config import Policy, PolicyError, default_policy, loads_policy
from gpuremediate.policy.evaluate import Evaluation, PolicyMemory, evaluate
from gpuremediate.policy.fabric import (
    KIND_FABRIC_FAILURE,
    KIND_FABRIC_STUCK,
    KIND_FABRIC_UNHEALTHY,
    KIND_IMEX,
    breaker_domain_labels,
)
from gpuremediate.signals.fabric import CLIQUE_LABEL, STATE_COMPLETED, STATE_IN_PROGRESS, STATE_NOT_STARTED
from gpuremediate.signals.fabric_model import GpuFabric
from gpuremediate.signals.model import GpuReading, NodeReadings

CLUSTER = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
RACK = {CLIQUE_LABEL: f"{CLUSTER}.1"}
HEALTHY = GpuFabric(state=STATE_COMPLETED, status="Success", cluster_uuid=CLUSTER, clique_id=1, imex_daemon=5,
                    imex_domain="UP")


def tray(*fabrics: GpuFabric | None) -> NodeReadings:
    gpus = tuple(GpuReading(node="tray-1", gpu=str(i), uuid=f"GPU-{i}", fabric=f) for i, f in enumerate(fabrics))
    return NodeReadings(node="tray-1", source="exporter", gpus=gpus)


def over(readings: NodeReadings, seconds: float, labels: Mapping[str, str], policy: Policy | None = None,
         step: float = 30.0) -> list[Evaluation]:
    """Every cycle's evaluation over ``seconds``, memory carried (and round-tripped as the node record does)."""
    memory, results, now = PolicyMemory(), [], 1000.0
    while now <= 1000.0 + seconds:
        result = evaluate(readings, policy or default_policy().defaults, memory, now, labels)
        memory = PolicyMemory.from_dict(result.memory.to_dict())
        results.append(result)
        now += step
    return results


def kinds(results: list[Evaluation]) -> set[str]:
    return {f.kind for r in results for f in r.findings}


DAY = 86400.0


@pytest.mark.parametrize(("labels", "fabric"), [
    (RACK, HEALTHY),  # an idle, healthy NVL72 tray
    (RACK, dataclasses.replace(HEALTHY, imex_daemon=-3, imex_domain="UNAVAILABLE")),  # IMEX only with a ComputeDomain
    ({CLIQUE_LABEL: f"{CLUSTER}.9"}, HEALTHY),  # a single-tray domain: its IMEX domain is itself, READY and UP
    ({}, GpuFabric(state=STATE_NOT_STARTED, imex_daemon=-3)),  # GB200 used alone: no domain, no Fabric Manager
    ({}, GpuFabric(state=STATE_COMPLETED, status="Success", clique_id=0)),  # HGX H100 alone (real capture)
    ({}, GpuFabric(state="not-supported", imex_daemon=-2)),  # single-node NVSwitch: IMEX not configured (#1471)
    ({}, None),  # not an NVLink node: no fabric fields at all
])
def test_no_finding_over_a_simulated_day(labels: Mapping[str, str], fabric: GpuFabric | None) -> None:
    assert kinds(over(tray(fabric, fabric, fabric, fabric), DAY, labels, step=600.0)) == set()


def test_a_registration_completed_with_an_error_reboots_after_its_grace() -> None:
    bad = dataclasses.replace(HEALTHY, status="Insufficient Resources")
    results = over(tray(HEALTHY, bad), 120.0, RACK)
    assert not results[0].findings  # not at once: the grace is 60 s
    later = [f for r in results[2:] for f in r.findings]
    assert {(f.kind, f.action, f.gpus) for f in later} == {(KIND_FABRIC_FAILURE, "reboot", ("GPU-1",))}
    assert len({f.fingerprint for f in later}) == 1  # one occurrence: one fingerprint across cycles
    assert "Insufficient Resources" in later[0].message
    assert later[0].code == "insufficient-resources"  # a short word: the status column, the metrics' code label


def test_dcgm_failure_is_the_same_finding() -> None:
    failed = GpuFabric(state=STATE_COMPLETED, status="Failure (error code 3)")
    results = over(tray(failed), 90.0, {})
    assert kinds(results) == {KIND_FABRIC_FAILURE}  # a failed fabric needs no domain label
    assert {f.code for f in results[-1].findings} == {"failure"}


def test_in_progress_too_long_cordons_and_a_finished_one_forgets() -> None:
    booting = tray(GpuFabric(state=STATE_IN_PROGRESS))
    assert kinds(over(booting, 600.0, RACK)) == set()  # fabric training at boot takes minutes
    assert {(f.kind, f.action) for r in over(booting, 960.0, RACK) for f in r.findings} == {
        (KIND_FABRIC_STUCK, "cordon")}
    policy = default_policy().defaults
    first = evaluate(booting, policy, PolicyMemory(), 0.0, RACK)
    done = evaluate(tray(HEALTHY), policy, first.memory, 500.0, RACK)
    assert not done.memory.fabric  # the timer is dropped once the state is good
    again = evaluate(booting, policy, done.memory, 1000.0, RACK)
    assert again.memory.fabric == {"fabric-stuck:GPU-0": 1000.0}  # a new occurrence starts its own timer


def test_not_started_on_a_domain_tray_is_fabric_manager_down() -> None:
    down = tray(*[GpuFabric(state=STATE_NOT_STARTED, imex_daemon=-3)] * 4)
    found = [f for r in over(down, 330.0, RACK) for f in r.findings]
    assert {(f.kind, f.action) for f in found} == {(KIND_FABRIC_UNHEALTHY, "cordon")}
    assert "Fabric Manager" in found[0].message
    assert kinds(over(down, DAY, {}, step=3600.0)) == set()  # the same GPUs on a node in no domain: nothing


@pytest.mark.parametrize(("daemon", "domain", "code"), [(2, "DOWN", "waiting-for-peers"),
                                                       (5, "DEGRADED", "domain-degraded"), (0, None, "initializing")])
def test_imex_not_ready_in_a_domain_is_an_event_only(daemon: int, domain: str | None, code: str) -> None:
    waiting = tray(dataclasses.replace(HEALTHY, imex_daemon=daemon, imex_domain=domain))
    found = [f for r in over(waiting, 330.0, RACK) for f in r.findings]
    assert {(f.kind, f.code, f.action, f.needs_repair) for f in found} == {(KIND_IMEX, code, "none", False)}
    assert not over(waiting, 240.0, RACK)[-1].findings  # within its 300 s grace


def test_the_policy_file_section_and_its_checks() -> None:
    policy = loads_policy('[fabric]\nfailure_action = "quarantine"\nimex_action = "cordon"\nimex_grace_s = 0\n'
                          '[[groups]]\nselector = "pool=h100"\nfabric = { enabled = false }\n')
    assert (policy.defaults.fabric.failure_action, policy.defaults.fabric.imex_action) == ("quarantine", "cordon")
    assert not policy.for_node({"pool": "h100"}).fabric.enabled
    waiting = tray(dataclasses.replace(HEALTHY, imex_daemon=2))
    assert kinds(over(waiting, 0.0, RACK, policy.defaults)) == {KIND_IMEX}
    assert kinds(over(waiting, 900.0, RACK, policy.for_node({"pool": "h100"}))) == set()
    with pytest.raises(PolicyError, match=r"^fabric\.domain_label: invalid label key"):
        loads_policy('[fabric]\ndomain_label = "not a label"\n')
    with pytest.raises(PolicyError, match=r"^fabric\.stuck_after_s"):
        loads_policy('[fabric]\nstuck_after_s = -1\n')


def test_memory_keeps_timers_of_gpus_not_read_this_cycle() -> None:
    policy = default_policy().defaults
    first = evaluate(tray(GpuFabric(state=STATE_IN_PROGRESS)), policy, PolicyMemory(), 0.0, RACK)
    blank = evaluate(NodeReadings(node="tray-1", source="exporter"), policy, first.memory, 10.0, RACK)
    assert blank.memory.fabric == first.memory.fabric == {"fabric-stuck:GPU-0": 0.0}


def test_the_clique_label_joins_the_breakers_domain_labels_unless_told_not_to() -> None:
    rules = default_policy().defaults.fabric
    assert breaker_domain_labels((), rules) == (CLIQUE_LABEL,)
    assert breaker_domain_labels(("topology.kubernetes.io/rack",), rules) == ("topology.kubernetes.io/rack",
                                                                            CLIQUE_LABEL)
    assert breaker_domain_labels((CLIQUE_LABEL,), rules) == (CLIQUE_LABEL,)  # named once
    assert breaker_domain_labels((), dataclasses.replace(rules, domain_breaker=False)) == ()
    assert breaker_domain_labels((), dataclasses.replace(rules, enabled=False)) == ()


def test_domains_out_counts_per_domain_and_leaves_healthy_domains_out() -> None:
    from gpuremediate.policy.fabric import domains_out
    from gpuremediate.policy.safety import NodeView

    a, b = {CLIQUE_LABEL: "a.1"}, {CLIQUE_LABEL: "b.1"}
    views = [NodeView("a1", unschedulable=True, labels=a), NodeView("a2", state="repairing", labels=a),
             NodeView("a3", labels=a), NodeView("b1", labels=b), NodeView("b2", ready=False, labels=b),
             NodeView("hgx", unschedulable=True)]
    assert domains_out(views, CLIQUE_LABEL) == [({"domain": "a.1"}, 2.0), ({"domain": "b.1"}, 1.0)]
    assert domains_out(views[2:4], CLIQUE_LABEL) == []


def test_not_started_anywhere_for_a_group_of_nodes_whose_fabric_manager_must_run() -> None:
    policy = loads_policy('[[groups]]\nselector = "pool=hgx"\nfabric = { not_started_anywhere = true, '
                          'not_started_grace_s = 0 }\n')
    down = tray(GpuFabric(state=STATE_NOT_STARTED))
    assert kinds(over(down, 0.0, {}, policy.for_node({"pool": "hgx"}))) == {KIND_FABRIC_UNHEALTHY}
    assert kinds(over(down, 600.0, {}, policy.for_node({}))) == set()  # elsewhere: still nothing off a domain
