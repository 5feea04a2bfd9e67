"""The domain action (issue 28): an NVLink domain past its domain breaker's threshold handled as one unit.

Pure parts: the policy setting, the domain finding, ``decide.on_domain_action``, the all-or-none admission
(``safety.domain_admission``), the domain breaker not holding its own decision, the drain scope."""

from __future__ import annotations

import dataclasses

import pytest

from gpuremediate.loops.drain_scope import drain_scope
from gpuremediate.policy.config import PolicyError, default_policy, loads_policy
from gpuremediate.policy.fabric import KIND_DOMAIN, FabricPolicy, domain_finding, domain_trips
from gpuremediate.policy.safety import Budget, CircuitBreaker, DomainTrip, NodeView, domain_admission
from gpuremediate.signals.fabric import CLIQUE_LABEL
from gpuremediate.state import decide
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_NONE, ACTION_QUARANTINE, ACTION_REBOOT, Finding
from gpuremediate.vocab.record import ActionInProgress, NodeRecord

NOW = 1_800_000_000.0
CLIQUE = "7a1c0b3e-0000-4000-8000-000000000001.1"
TRIP = DomainTrip(CLIQUE_LABEL, CLIQUE, "10 of 18 nodes ... faulted", NOW - 5)
QUARANTINE = FabricPolicy(domain_action=ACTION_QUARANTINE)


def reboot_finding(node: str = "tray-1") -> Finding:
    return Finding(node, "fabric-failure", "failure", ("GPU-1",), ACTION_REBOOT, "fabric-failure:GPU-1:1", "failed")


def test_the_setting_defaults_to_the_hold_and_refuses_a_cordon() -> None:
    assert default_policy().defaults.fabric.domain_action == ACTION_NONE
    assert loads_policy('[fabric]\ndomain_action = "quarantine"\n').defaults.fabric.domain_action == "quarantine"
    with pytest.raises(PolicyError, match=r"^fabric\.domain_action: cordon is not a domain action"):
        loads_policy('[fabric]\ndomain_action = "cordon"\n')
    with pytest.raises(PolicyError, match=r"^fabric\.domain_action: custom action .rack-rma. is not defined"):
        parsed = loads_policy('[fabric]\ndomain_action = "rack-rma"\n')
        parsed.check_custom_actions(parsed.cluster.actions)  # as load_policy does


def test_only_a_trip_of_the_domain_label_with_an_action_is_a_domain_action() -> None:
    rack = DomainTrip("topology.kubernetes.io/rack", "r1", "", NOW)
    assert domain_trips((TRIP, rack), QUARANTINE) == {CLIQUE: TRIP}
    assert domain_trips((TRIP,), FabricPolicy()) == {}  # none: the breaker's hold only
    assert domain_trips((TRIP,), dataclasses.replace(QUARANTINE, domain_breaker=False)) == {}
    assert domain_trips((TRIP,), dataclasses.replace(QUARANTINE, enabled=False)) == {}


def test_every_tray_gets_the_same_fingerprint_and_a_later_trip_is_a_new_decision() -> None:
    one, other = domain_finding("tray-1", TRIP, QUARANTINE), domain_finding("tray-9", TRIP, QUARANTINE)
    assert one.fingerprint == other.fingerprint and one.kind == KIND_DOMAIN and one.action == ACTION_QUARANTINE
    assert CLIQUE_LABEL + "=" + CLIQUE in one.message and "every tray drained" in one.message
    later = domain_finding("tray-1", dataclasses.replace(TRIP, opened_at=NOW + 3600), QUARANTINE)
    assert later.fingerprint != one.fingerprint


def test_a_healthy_tray_is_cordoned_and_drained_for_the_domain() -> None:
    finding = domain_finding("tray-1", TRIP, QUARANTINE)
    decision = decide.on_domain_action(None, finding, False, NOW)
    assert decision.cordon and decision.transition is not None
    assert decision.record.state == states.DRAINING and decision.record.reason == "domain"
    assert decision.record.fault is not None and decision.record.fault.fingerprint == finding.fingerprint
    assert decision.record.cordoned_by_us and decision.record.action is None
    again = decide.on_domain_action(decision.record, finding, True, NOW + 1)  # idempotent: the same decision
    assert not again.changed and again.transition is None


def test_a_tray_waiting_or_draining_for_its_own_fault_takes_the_domain_fault_instead() -> None:
    own = decide.on_findings(None, [reboot_finding()], False, NOW - 3).record
    draining = dataclasses.replace(own, action=ActionInProgress("drain", "", 1, NOW - 2))
    finding = domain_finding("tray-1", TRIP, QUARANTINE)
    for before in (own, draining):
        decision = decide.on_domain_action(before, finding, True, NOW)
        after = decision.record
        assert after.state == states.DRAINING and decision.transition is None and not decision.cordon
        assert after.fault is not None and after.fault.kind == KIND_DOMAIN
        assert "fabric-failure:GPU-1:1" in after.handled  # its own repair is not done after the domain's
        assert after.action is None  # admitted again as the domain's (every pod in scope)


def test_a_held_fault_is_covered_and_a_repair_under_way_is_left_to_finish() -> None:
    finding = domain_finding("tray-1", TRIP, QUARANTINE)
    held = dataclasses.replace(decide.fresh_record(NOW - 9), held=decide.fault_from_finding(reboot_finding(), NOW))
    after = decide.on_domain_action(held, finding, False, NOW).record
    assert after.held is None and "fabric-failure:GPU-1:1" in after.handled
    for state in (states.REPAIRING, states.VALIDATING, states.QUARANTINED, states.MAINTENANCE):
        record = NodeRecord(state=state, since=NOW - 9)
        assert not decide.on_domain_action(record, finding, True, NOW).changed
    handled = NodeRecord(state=states.HEALTHY, since=NOW - 1, handled=(finding.fingerprint,))  # released by a person
    assert not decide.on_domain_action(handled, finding, False, NOW).changed


def test_after_the_drain_a_quarantine_domain_action_hands_the_tray_to_a_person() -> None:
    finding = domain_finding("tray-1", TRIP, QUARANTINE)
    drained = decide.on_domain_action(None, finding, False, NOW).record
    after = decide.complete_drain(drained, NOW + 60).record
    assert after.state == states.QUARANTINED and after.reason == "domain"


def rack(out: set[str] = frozenset(), trays: int = 18, others: int = 22) -> list[NodeView]:  # type: ignore[assignment]
    views = [NodeView(f"tray-{i}", labels={CLIQUE_LABEL: CLIQUE}) for i in range(trays)]
    views += [NodeView(f"node-{i}", state=states.DRAINING if f"node-{i}" in out else states.HEALTHY)
              for i in range(others)]
    return views


def test_the_budget_counts_the_domains_trays_together_all_or_none() -> None:
    members = {f"tray-{i}" for i in range(18)}
    assert domain_admission(rack(), members, Budget("50%")).allowed  # 18 of 20 allowed
    full = domain_admission(rack(out={"node-0", "node-1", "node-2"}), members, Budget("50%"))
    assert not full.allowed and "the domain's 18 trays together" in full.reason and full.limit == 20
    assert not domain_admission(rack(), members, Budget("25%")).allowed  # 10 slots: never a part of the rack


def test_the_domain_breaker_does_not_hold_its_own_decision() -> None:
    breaker = CircuitBreaker(domains=(TRIP, DomainTrip("topology.kubernetes.io/rack", "r1", "x", NOW)))
    tray = NodeView("tray-1", labels={CLIQUE_LABEL: CLIQUE})
    assert breaker.blocks(tray).startswith("domain breaker open for " + CLIQUE_LABEL)
    assert breaker.blocks(tray, CLIQUE_LABEL) == ""
    in_rack = NodeView("tray-1", labels={CLIQUE_LABEL: CLIQUE, "topology.kubernetes.io/rack": "r1"})
    assert "topology.kubernetes.io/rack=r1" in breaker.blocks(in_rack, CLIQUE_LABEL)  # another domain still holds
    assert CircuitBreaker(open=True, reason="storm").blocks(tray, CLIQUE_LABEL).startswith("circuit breaker open")


def test_a_domain_tray_is_drained_of_every_pod() -> None:
    record = decide.on_domain_action(None, domain_finding("tray-1", TRIP, QUARANTINE), False, NOW).record
    node = {"metadata": {"name": "tray-1", "labels": {CLIQUE_LABEL: CLIQUE}}}
    policy = loads_policy('[drain]\nscope = "gpu"\n').defaults
    scope = drain_scope(policy, node, record)
    assert scope.scope == "all" and "domain action" in scope.why


def test_a_node_created_after_the_decision_is_not_part_of_it() -> None:
    from gpuremediate.loops.detect import _created_after

    node = {"metadata": {"name": "tray-1", "creationTimestamp": "2027-01-15T08:00:05Z"}}
    opened = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    assert _created_after(node, opened)
    assert not _created_after(node, opened + 10)
    assert not _created_after({"metadata": {"name": "tray-1"}}, opened)  # unknown: part of it
    assert not _created_after({"metadata": {"creationTimestamp": "yesterday"}}, opened)
