"""Failure-domain budgets, the domain breaker and the pause switch (pure rules in policy.safety)."""

from __future__ import annotations

import pytest

from gpuremediate.policy.safety import (
    Budget,
    CircuitBreaker,
    DomainBudget,
    NodeView,
    Pause,
    admit,
    budget_check,
    clustered_domains,
)
from gpuremediate.vocab import states

RACK = "topology.kubernetes.io/rack"
DRIVER = "nvidia.com/cuda.driver-version.full"


def rack_fleet(racks: dict[str, int], out: set[str] = frozenset()) -> list[NodeView]:  # type: ignore[assignment]
    """Nodes r<rack>-n<i>, labelled with their rack; the named ones out of service (draining)."""
    views = []
    for rack, count in racks.items():
        for i in range(count):
            name = f"{rack}-n{i}"
            views.append(NodeView(name=name, labels={RACK: rack},
                                  state=states.DRAINING if name in out else states.HEALTHY))
    return views


@pytest.mark.parametrize(
    ("out", "candidate", "allowed", "reason_part"),
    [
        (set(), "r1-n0", True, "within budget"),
        ({"r1-n1"}, "r1-n0", False, f"domain budget full: {RACK}=r1: 1 of 1 out of service (r1-n1)"),
        ({"r1-n1"}, "r2-n0", True, "within budget"),  # another rack has its own slot
        ({"r1-n0"}, "r1-n0", True, "within budget"),  # already out: it keeps its own slot
    ],
)
def test_one_node_per_rack(out: set[str], candidate: str, allowed: bool, reason_part: str) -> None:
    fleet = rack_fleet({"r1": 4, "r2": 4}, out)
    result = budget_check(fleet, candidate, Budget("100%"), [DomainBudget(RACK, 1)])
    assert result.allowed is allowed
    assert reason_part in result.reason


def test_fleet_budget_still_applies_before_domains() -> None:
    fleet = rack_fleet({"r1": 4, "r2": 4}, {"r1-n1"})
    result = budget_check(fleet, "r2-n0", Budget(1), [DomainBudget(RACK, 1)])
    assert not result.allowed and result.reason.startswith("budget full")


def test_a_node_without_the_label_is_in_no_domain() -> None:
    fleet = [*rack_fleet({"r1": 2}, {"r1-n0"}), NodeView(name="loose")]
    assert budget_check(fleet, "loose", Budget("100%"), [DomainBudget(RACK, 1)]).allowed


def test_admit_takes_one_per_rack_oldest_first() -> None:
    fleet = [
        NodeView(name="a", labels={RACK: "r1"}, first_seen=30.0),
        NodeView(name="b", labels={RACK: "r1"}, first_seen=10.0),
        NodeView(name="c", labels={RACK: "r2"}, first_seen=20.0),
        NodeView(name="d", labels={RACK: "r2"}, first_seen=40.0),
    ]
    assert admit(fleet, ["a", "b", "c", "d"], Budget("100%"), [DomainBudget(RACK, 1)]) == ["b", "c"]


def test_percentage_domain_budget_of_each_domains_own_size() -> None:
    fleet = rack_fleet({"big": 8, "small": 2})
    admitted = admit(fleet, [v.name for v in fleet], Budget("100%"), [DomainBudget(RACK, "25%")])
    assert sorted(admitted) == ["big-n0", "big-n1", "small-n0"]  # 25% of 8 = 2; of 2 rounds to at least 1


def test_two_domain_keys_both_hold() -> None:
    pool = "cloud.google.com/gke-nodepool"
    fleet = [
        NodeView(name="x", labels={RACK: "r1", pool: "p1"}),
        NodeView(name="y", labels={RACK: "r2", pool: "p1"}),
        NodeView(name="z", labels={RACK: "r3", pool: "p2"}),
    ]
    assert admit(fleet, ["x", "y", "z"], Budget("100%"), [DomainBudget(RACK, 1), DomainBudget(pool, 1)]) == ["x", "z"]


def test_no_domains_changes_nothing() -> None:
    fleet = rack_fleet({"r1": 4}, {"r1-n1"})
    assert admit(fleet, ["r1-n0", "r1-n2"], Budget(3)) == ["r1-n0", "r1-n2"]


@pytest.mark.parametrize("bad", ["", "x"])
def test_domain_budget_rejects_bad_values(bad: str) -> None:
    with pytest.raises(ValueError):
        DomainBudget(bad, "x" if bad else 1)


# ---- domain breaker ------------------------------------------------------------------------------


def driver_fleet() -> list[NodeView]:
    return [NodeView(name=f"n{i}", labels={DRIVER: "550.54" if i < 4 else "535.161", RACK: f"r{i % 3}"})
            for i in range(12)]


def test_clustered_faults_name_their_common_label() -> None:
    trips = clustered_domains(driver_fleet(), {"n0", "n1", "n2"}, [DRIVER, RACK], 50.0, 2, now=100.0, window_s=600)
    assert [(t.label, t.value) for t in trips] == [(DRIVER, "550.54")]
    assert "3 of 4 nodes with nvidia.com/cuda.driver-version.full=550.54" in trips[0].reason


def test_scattered_faults_trip_no_domain() -> None:
    assert clustered_domains(driver_fleet(), {"n0", "n5", "n10"}, [DRIVER, RACK], 50.0, 2, 0.0, 600) == []


def test_domain_breaker_blocks_only_its_domain_and_survives_a_round_trip() -> None:
    fleet = driver_fleet()
    breaker = CircuitBreaker()
    for node in ("n0", "n1", "n2"):
        breaker = breaker.record_fault(node, 100.0)
    breaker = breaker.evaluate(len(fleet), 100.0, threshold_pct=30.0, window_s=600)
    assert not breaker.is_open  # 3 of 12 is not more than 30 %: the fleet-wide breaker stays closed
    breaker = breaker.evaluate_domains(fleet, 100.0, [DRIVER], threshold_pct=50.0, window_s=600)
    by_name = {v.name: v for v in fleet}
    assert "domain breaker open for nvidia.com/cuda.driver-version.full=550.54" in breaker.blocks(by_name["n3"])
    assert breaker.blocks(by_name["n7"]) == ""
    assert CircuitBreaker.from_dict(breaker.to_dict()) == breaker
    again = breaker.evaluate_domains(fleet, 200.0, [DRIVER], threshold_pct=50.0, window_s=600)
    assert again.domains == breaker.domains  # an open domain is not opened twice
    assert breaker.reset("a person", 300.0).blocks(by_name["n3"]) == ""


def test_old_faults_outside_the_window_do_not_cluster() -> None:
    breaker = CircuitBreaker(faults=(("n0", 0.0), ("n1", 0.0), ("n2", 0.0)))
    assert breaker.evaluate_domains(driver_fleet(), 1000.0, [DRIVER], 50.0, window_s=600).domains == ()


def test_breaker_state_without_domains_still_loads() -> None:
    assert CircuitBreaker.from_dict({"open": False, "faults": []}).domains == ()
    with pytest.raises(ValueError, match="malformed circuit breaker state"):
        CircuitBreaker.from_dict({"domains": [{"label": RACK}]})


# ---- pause ---------------------------------------------------------------------------------------------


def test_pause_round_trip_and_bad_state() -> None:
    pause = Pause(paused=True, by="alice", reason="cluster upgrade", at=5.0)
    assert Pause.from_dict(pause.to_dict()) == pause
    assert Pause.from_dict({}) == Pause()
    with pytest.raises(ValueError, match="paused must be a boolean"):
        Pause.from_dict({"paused": "yes"})
