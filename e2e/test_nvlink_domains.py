"""NVLink domains (issue 28): a GB200 NVL72 rack of 18 compute trays (4 GPUs each, GPU Feature Discovery's
``nvidia.com/gpu.clique``), a single-tray domain and a plain HGX node, as gpu-sim and NodeSim model them.

A Fabric Manager stopped on one tray is a finding on that tray only; one tray whose fabric registration failed
is repaired as a tray (reboot, validation, back); idle racks, a single-tray domain whose IMEX is not running and
the plain node raise nothing even with every fabric grace at 0; 10 of 18 trays failing at once open the domain
breaker on the clique label (``[fabric] domain_breaker``): no tray is cordoned or rebooted; with ``[fabric]
domain_action = "quarantine"`` the rack is one unit: every tray drained, then quarantined for a person.
In-process targets only (the trays are gpu-sim's and NodeSim's). Run: ``python -m pytest e2e/test_nvlink_domains.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import SYSTEM_NS, Cluster, EmulatorCluster, make_cluster
from e2e.plugins.remediation import API_VERSION, KIND, ExampleRemediationController, install_crd, remediation_crd
from gpuremediate.signals.fabric import CLIQUE_LABEL
from gpuremediate.vocab import states

TRAYS = 18
NOW: dict[str, Any] = {"failure_grace_s": 0, "stuck_after_s": 0, "not_started_grace_s": 0, "imex_grace_s": 0}
ALL_BUDGET = {"max_unavailable": "100%"}


@pytest.fixture
def rack(tmp_path: Path) -> Iterator[EmulatorCluster]:
    """One plain node, an NVL72 rack (rack-1, 18 trays) and a single-tray domain (rack-2)."""
    cluster = make_cluster(tmp_path, nodes=1, nvl72=(TRAYS, 1))
    if not isinstance(cluster, EmulatorCluster):
        pytest.skip("simulated NVL72 trays (gpu-sim and NodeSim in process)")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop_controller()
        problems = cluster.log_problems()
        cluster.stop()
        assert problems == []


def trays(cluster: EmulatorCluster, rack: str = "rack-1") -> list[str]:
    return list(cluster.sim.racks[rack])


def healthy(cluster: Cluster, node: str) -> bool:
    return cluster.state(node) == states.HEALTHY and not cluster.unschedulable(node)


def fault_kind(cluster: Cluster, node: str) -> str:
    record = cluster.record(node)
    return record.fault.kind if record is not None and record.fault is not None else ""


def test_the_trays_carry_their_domain(rack: EmulatorCluster) -> None:
    cliques = {(rack.node(t)["metadata"].get("labels") or {}).get(CLIQUE_LABEL) for t in trays(rack)}
    assert len(cliques) == 1 and None not in cliques
    single = (rack.node(trays(rack, "rack-2")[0])["metadata"].get("labels") or {}).get(CLIQUE_LABEL)
    assert single not in cliques | {None}
    assert CLIQUE_LABEL not in (rack.node("gpu-node-1")["metadata"].get("labels") or {})
    out = rack.cli("status", "--by", "domain")
    assert out.returncode == 0, out.stderr
    assert f"DOMAIN {cliques.pop()}: {TRAYS} node(s), 0 out of service" in out.stdout


def test_fabric_manager_stopped_on_one_tray_is_a_finding_on_that_tray_only(rack: EmulatorCluster) -> None:
    target = trays(rack)[2]
    rack.inject(target, 0, "fabric-manager-down")
    rack.start_controller({"fabric": {"not_started_grace_s": 0}})
    rack.wait(lambda: fault_kind(rack, target) == "fabric-unhealthy" and rack.unschedulable(target), 20,
              f"{target} cordoned for its Fabric Manager", seen=lambda: rack.summary(target))
    domain = (rack.node(target)["metadata"].get("labels") or {})[CLIQUE_LABEL]
    rack.wait_metric("gpuremediate_domain_nodes_out", 1, domain=domain)  # one tray of the rack out
    others = [n for n in rack.nodes if n != target]
    rack.holds(lambda: all(healthy(rack, n) for n in others), 2.0, "every other node healthy and schedulable",
               seen=lambda: [rack.summary(n) for n in others if not healthy(rack, n)])
    assert rack.job_runs(target, "reboot") == 0  # a cordon, not a repair: the workloads stay
    rack.gpusim(target, "reboot", {"node": target})  # a person restarts its software: the fabric registers again
    rack.wait(lambda: healthy(rack, target), 20, f"{target} uncordoned once its fabric is good again",
              seen=lambda: rack.summary(target))


@pytest.mark.parametrize("domain_action", ["none", "quarantine"])
def test_one_tray_with_a_failed_fabric_is_repaired_as_a_tray(rack: EmulatorCluster, domain_action: str) -> None:
    """One tray in a healthy domain takes the ordinary path, with or without a domain action."""
    target = trays(rack)[4]
    rack.inject(target, 1, "fabric-failure")
    rack.start_controller({"fabric": {"failure_grace_s": 0, "domain_action": domain_action}})
    rack.wait(lambda: rack.job_runs(target, "reboot") >= 1, 30, f"{target} rebooted",
              seen=lambda: rack.summary(target))
    rack.wait(lambda: healthy(rack, target), 30, f"{target} back in service", seen=lambda: rack.summary(target))
    assert rack.job_runs(target, "reboot") == 1
    assert all(rack.job_runs(n, "reboot") == 0 for n in rack.nodes if n != target)
    assert rack.metrics().value("gpuremediate_circuit_breaker_open") == 0


def test_idle_racks_a_single_tray_domain_and_a_plain_node_raise_nothing(rack: EmulatorCluster) -> None:
    single = trays(rack, "rack-2")[0]
    rack.inject(single, 0, "imex-down", -3)  # no IMEX daemon running (it comes with a ComputeDomain)
    for tray in trays(rack)[:6]:
        rack.inject(tray, 0, "imex-down", -3)
    rack.start_controller({"fabric": {**NOW, "imex_action": "cordon"}})  # any IMEX finding would cordon at once
    rack.holds(lambda: all(healthy(rack, n) for n in rack.nodes), 4.0, "every node healthy and schedulable",
               seen=lambda: [rack.summary(n) for n in rack.nodes if not healthy(rack, n)])
    reasons = {reason for n in rack.nodes for reason in rack.event_reasons(n)}
    assert not {r for r in reasons if "Fabric" in r or "Imex" in r or "IMEX" in r}, reasons
    assert rack.controller_log().count("fabric-") == 0


def test_ten_of_eighteen_trays_failing_open_the_domain_breaker_with_no_tray_rebooted(rack: EmulatorCluster) -> None:
    failing = trays(rack)[:10]
    for tray in failing:
        rack.inject(tray, 0, "fabric-failure")
    # The fleet-wide breaker (30 % of 20 nodes) is set out of the way: the rack's own breaker must hold them.
    rack.start_controller({"fabric": {"failure_grace_s": 0}, "budget": ALL_BUDGET,
                           "breaker": {"threshold_percent": 90, "domain_threshold_percent": 50}})

    def held(node: str) -> bool:
        record = rack.record(node)
        return record is not None and record.blocked is not None and record.blocked.reason == "breaker" \
            and "domain breaker open for " + CLIQUE_LABEL in record.blocked.detail

    rack.wait(lambda: all(held(n) for n in failing), 30, "every failing tray held by the domain breaker",
              seen=lambda: [rack.summary(n) for n in failing if not held(n)])
    event = rack.wait_event(failing[0], "GPURemediationDomainBreakerOpen", f"10 of {TRAYS} nodes", timeout=10)
    assert CLIQUE_LABEL in event["message"]
    rack.holds(lambda: not any(rack.unschedulable(n) for n in rack.nodes), 2.0, "no tray cordoned",
               seen=lambda: [n for n in rack.nodes if rack.unschedulable(n)])
    assert sum(rack.job_runs(n, "reboot") for n in rack.nodes) == 0
    assert rack.metrics().value("gpuremediate_circuit_breaker_open") == 0  # the fleet's breaker stays closed
    out = rack.cli("status")
    assert "DOMAIN BREAKER OPEN for " + CLIQUE_LABEL in out.stdout, out.stdout
    explained = rack.cli("explain", failing[0]).stdout
    assert f"NVLink domain: {CLIQUE_LABEL}=" in explained and f": {TRAYS} node(s), 0 out of service" in explained, \
        explained
    assert "domain breaker open for" in explained, explained


def test_ten_of_eighteen_trays_failing_with_a_domain_action_drain_every_tray_for_a_person(
        rack: EmulatorCluster) -> None:
    """``[fabric] domain_action = "quarantine"``: the domain breaker's threshold passed, the rack is one unit: each of
    its 18 trays (the 8 healthy ones too) is drained, then quarantined for a person, with the domain decision in its
    record and an Event; no tray rebooted; a controller restart takes no tray twice; the other rack is untouched."""
    failing = trays(rack)[:10]
    for tray in failing:
        rack.inject(tray, 0, "fabric-failure")
    rack.start_controller({"fabric": {"failure_grace_s": 0, "domain_action": "quarantine"}, "budget": ALL_BUDGET,
                           "breaker": {"threshold_percent": 90, "domain_threshold_percent": 50}})

    def handed_over(node: str) -> bool:
        record = rack.record(node)
        return rack.state(node) == states.QUARANTINED and rack.unschedulable(node) and record is not None \
            and record.fault is not None and record.fault.kind == "domain"

    rack.wait(lambda: all(handed_over(n) for n in trays(rack)), 60, "every tray of the rack quarantined",
              seen=lambda: [rack.summary(n) for n in trays(rack) if not handed_over(n)])
    prints = {rack.record(n).fault.fingerprint for n in trays(rack)}  # type: ignore[union-attr]
    assert len(prints) == 1 and CLIQUE_LABEL in next(iter(prints)), prints  # one decision, on every tray
    event = rack.wait_event(trays(rack)[-1], "GPURemediationDomainAction", "domain action for " + CLIQUE_LABEL,
                            timeout=10)
    assert "every tray drained" in event["message"], event
    assert sum(rack.job_runs(n, "reboot") for n in rack.nodes) == 0
    assert all(healthy(rack, n) for n in rack.nodes if n not in trays(rack))
    assert rack.metrics().value("gpuremediate_domain_action_trays_total", action="quarantine") == TRAYS
    explained = rack.cli("explain", trays(rack)[12]).stdout
    assert "Held by the domain decision for " + CLIQUE_LABEL in explained, explained
    rack.restart_controller()
    rack.holds(lambda: all(handed_over(n) for n in trays(rack)), 3.0, "the rack stays handed over after a restart",
               seen=lambda: [rack.summary(n) for n in trays(rack) if not handed_over(n)])
    assert {rack.record(n).fault.fingerprint for n in trays(rack)} == prints  # type: ignore[union-attr]
    assert rack.metrics().value("gpuremediate_domain_action_trays_total", action="quarantine") == 0  # none again


def test_a_released_domain_returns_as_one_unit_once_every_tray_validated(rack: EmulatorCluster) -> None:
    """After a quarantine domain action a person fixes the rack (the failed fabrics registered again) and releases
    the trays: each validates, then waits in validating (cordoned, blocked on its domain) until the last tray has
    validated too; then all return together, and the domain's decision is not taken again while its trip stands."""
    failing, all_trays = trays(rack)[:10], trays(rack)
    for tray in failing:
        rack.inject(tray, 0, "fabric-failure")
    rack.start_controller({"fabric": {"failure_grace_s": 0, "domain_action": "quarantine"}, "budget": ALL_BUDGET,
                           "breaker": {"threshold_percent": 90, "domain_threshold_percent": 50}})
    rack.wait(lambda: all(rack.state(n) == states.QUARANTINED for n in all_trays), 60, "the rack handed over",
              seen=lambda: [rack.summary(n) for n in all_trays if rack.state(n) != states.QUARANTINED])
    for tray in failing:
        rack.reset_gpu(tray, 0)  # the person's fix: the fabric registered again
    first, last = all_trays[:-1], all_trays[-1]
    for tray in first:
        assert rack.cli("release", tray, "--by", "e2e-operator").returncode == 0

    def waits_for_domain(node: str) -> bool:
        record = rack.record(node)
        return rack.state(node) == states.VALIDATING and rack.unschedulable(node) and record is not None \
            and record.blocked is not None and "returns as one unit" in record.blocked.detail

    rack.wait(lambda: all(waits_for_domain(n) for n in first), 60, "the released trays validated, waiting for theirs",
              seen=lambda: [rack.summary(n) for n in first if not waits_for_domain(n)])
    rack.wait(lambda: f"1 of its {TRAYS} trays" in rack.record(first[0]).blocked.detail,  # type: ignore[union-attr]
              20, "the tray's block names the one tray its domain waits for", seen=lambda: rack.summary(first[0]))
    assert last in rack.record(first[0]).blocked.detail  # type: ignore[union-attr]
    assert rack.state(last) == states.QUARANTINED
    assert rack.cli("release", last, "--by", "e2e-operator").returncode == 0
    rack.wait(lambda: all(healthy(rack, n) for n in all_trays), 60, "the rack back in service as one unit",
              seen=lambda: [rack.summary(n) for n in all_trays if not healthy(rack, n)])
    rack.holds(lambda: all(healthy(rack, n) for n in all_trays), 2.0, "not taken again while the trip stands",
               seen=lambda: [rack.summary(n) for n in all_trays if not healthy(rack, n)])
    assert sum(rack.job_runs(n, "reboot") for n in rack.nodes) == 0
    assert all(rack.job_runs(n, "validate") == 1 for n in all_trays)


def test_a_domain_action_waits_whole_when_the_budget_cannot_take_all_its_trays(rack: EmulatorCluster) -> None:
    """The budget counts a domain action as its trays: 25 % of 20 nodes (5 slots) cannot take 18 trays, so none is
    drained (never a part of the rack) and each says why; the plain node's own fault still gets its repair."""
    for tray in trays(rack)[:10]:
        rack.inject(tray, 0, "fabric-failure")
    rack.start_controller({"fabric": {"failure_grace_s": 0, "domain_action": "quarantine"},
                           "budget": {"max_unavailable": "25%"},
                           "breaker": {"threshold_percent": 90, "domain_threshold_percent": 50}})

    def waits(node: str) -> bool:
        record = rack.record(node)
        return rack.state(node) == states.DRAINING and record is not None and record.action is None \
            and record.blocked is not None and "budget full for the domain's 18 trays together" in record.blocked.detail

    rack.wait(lambda: all(waits(n) for n in trays(rack)), 30, "every tray waiting for the budget, whole",
              seen=lambda: [rack.summary(n) for n in trays(rack) if not waits(n)])
    plain = next(n for n in rack.nodes if n not in trays(rack) and n not in trays(rack, "rack-2"))
    rack.inject(plain, 0, "xid", 79)
    rack.wait(lambda: rack.job_runs(plain, "reboot") >= 1, 30, f"{plain} repaired while the domain waits",
              seen=lambda: rack.summary(plain))
    rack.holds(lambda: all(waits(n) for n in trays(rack)), 1.0, "no tray of the domain drained",
               seen=lambda: [rack.summary(n) for n in trays(rack) if not waits(n)])
    assert sum(rack.job_runs(n, "reboot") for n in trays(rack)) == 0


def test_a_custom_domain_action_asks_the_provider_for_each_tray_then_the_rack_returns(rack: EmulatorCluster) -> None:
    """``domain_action = "rack-rma"``, a custom action: after the drain each tray gets its remediation resource (the
    provider's rack maintenance, here the example controller completing it by hand once the rack is fixed), then
    its validation; the rack returns as one unit. No reboot, one resource per tray."""
    install_crd(rack.kube, remediation_crd(), API_VERSION, KIND)
    provider = ExampleRemediationController(rack.kube, mode="never").start()
    try:
        failing = trays(rack)[:10]
        for tray in failing:
            rack.inject(tray, 0, "fabric-failure")
        rack.start_controller({
            "fabric": {"failure_grace_s": 0, "domain_action": "rack-rma"}, "budget": ALL_BUDGET,
            "breaker": {"threshold_percent": 90, "domain_threshold_percent": 50},
            "actions.rack-rma": {"apiGroup": "remediation.example.com", "version": "v1alpha1", "kind": KIND,
                                 "scope": "Namespaced", "namespace": SYSTEM_NS, "completeConditionType": "Complete",
                                 "timeout": 120, "maxAttempts": 1,
                                 "template": {"spec": {"nodeName": "{{nodeName}}", "action": "{{action}}",
                                                       "healthEventId": "{{healthEventID}}"}}}})
        res = rack.kube.resolve(API_VERSION, KIND)

        def requests() -> list[dict[str, Any]]:
            return list(rack.kube.list(res, SYSTEM_NS)["items"])

        rack.wait(lambda: len(requests()) == TRAYS, 60, "one remediation resource per tray",
                  seen=lambda: [rack.summary(n) for n in trays(rack)])
        assert {r["spec"]["nodeName"] for r in requests()} == set(trays(rack))
        assert all(r["spec"]["action"] == "rack-rma" for r in requests())
        for tray in failing:
            rack.reset_gpu(tray, 0)  # the provider's fix
        for request in requests():
            provider.complete(request["metadata"]["name"])
        rack.wait(lambda: all(healthy(rack, n) for n in trays(rack)), 60, "the rack back in service",
                  seen=lambda: [rack.summary(n) for n in trays(rack) if not healthy(rack, n)])
        assert len(requests()) == TRAYS
        assert sum(rack.job_runs(n, "reboot") for n in rack.nodes) == 0
        histories = {tuple((h.kind, h.action, h.outcome) for h in rack.record(n).history)  # type: ignore[union-attr]
                     for n in trays(rack)}
        assert histories == {(("domain", "rack-rma", "repaired"),)}, histories
    finally:
        provider.stop()
