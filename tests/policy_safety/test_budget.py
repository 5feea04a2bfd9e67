"""The disruption budget: what counts as out of service, rounding, concurrent candidates."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.policy.safety import (
    Budget,
    DomainBudget,
    FleetSize,
    NodeView,
    admit,
    budget_check,
    domain_admission,
    is_waiting,
    node_view,
    notable,
)
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states as s


@pytest.mark.parametrize(
    ("value", "total", "limit"),
    [
        ("25%", 8, 2),
        ("25%", 10, 2),  # 2.5 rounds down
        ("25%", 3, 1),  # 0.75 rounds down to 0, floored at 1
        ("25%", 0, 1),
        ("100%", 7, 7),
        ("0%", 50, 0),  # explicit zero: nothing drains
        (0, 50, 0),
        (3, 2, 3),
        (" 50% ", 5, 2),
    ],
)
def test_limit(value: int | str, total: int, limit: int) -> None:
    assert Budget(value).limit(total) == limit


@pytest.mark.parametrize("value", [-1, "101%", "25", "x%", "2.5%", True, 2.5, None])
def test_bad_budget_is_refused_with_a_clear_error(value: Any) -> None:
    with pytest.raises(ValueError, match="maxUnavailable"):
        Budget(value)


def nodes(*specs: NodeView) -> list[NodeView]:
    return list(specs)


def test_counts_unschedulable_for_any_reason_and_active_states_once() -> None:
    fleet = nodes(
        NodeView("a", unschedulable=True),  # a person's cordon
        NodeView("b", state=s.REPAIRING, unschedulable=True),  # ours: counts once
        NodeView("c", ready=False),  # NotReady
        NodeView("d", state=s.VALIDATING),
        NodeView("e"),
        NodeView("cand", state=s.DRAINING, unschedulable=True, waiting=True),
        *[NodeView(f"h{i}") for i in range(10)],
    )
    result = budget_check(fleet, "cand", Budget(4))
    assert (result.allowed, result.in_use, result.limit) == (False, 4, 4)
    assert "(a: unschedulable; b: repairing; c: not Ready; d: validating)" in result.reason
    assert budget_check(fleet, "cand", Budget(5)).allowed


def test_nodes_that_only_wait_count_unless_the_policy_says_otherwise() -> None:
    """A small cluster: one node quarantined (waits for a person), one cordoned for heat, budget 1. By default
    they hold the budget (capacity first), and the wait names them; count_held = false lets a repair pass."""
    fleet = nodes(NodeView("q", state=s.QUARANTINED, unschedulable=True),
                  NodeView("t", state=s.CORDONED, unschedulable=True),
                  NodeView("cand", state=s.DRAINING, unschedulable=True, waiting=True),
                  *[NodeView(f"h{i}") for i in range(3)])
    held = budget_check(fleet, "cand", Budget(1))
    assert not held.allowed
    assert "(q: quarantined, needs a person; t: cordoned, cooling down)" in held.reason, held.reason
    assert "count_held = false" in held.reason
    assert budget_check(fleet, "cand", Budget(1, count_held=False)).allowed
    assert admit(fleet, ["cand"], Budget(1, count_held=False)) == ["cand"]
    busy = nodes(NodeView("r", state=s.REPAIRING, unschedulable=True), *fleet)
    assert not budget_check(busy, "cand", Budget(1, count_held=False)).allowed  # our own work still counts


def test_a_budget_wait_says_since_when_each_holder_holds_it_from_its_record() -> None:
    """``budget full: ... (gpu-q: quarantined since <UTC time>, needs a person)``: the since is the holder's
    record's (node_view); a NotReady node or a person's cordon has none to say."""
    quarantined = r.NodeRecord(state=s.QUARANTINED, since=1_793_534_400.0, cordoned_by_us=True)
    node = {"metadata": {"name": "gpu-q", "annotations": {r.RECORD_ANNOTATION: r.encode(quarantined)}},
            "spec": {"unschedulable": True}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    fleet = [node_view(node), NodeView("gpu-p", unschedulable=True), NodeView("gpu-n", ready=False),
             NodeView("cand", state=s.DRAINING, unschedulable=True, waiting=True), NodeView("h")]
    reason = budget_check(fleet, "cand", Budget(3)).reason
    assert ("budget full: 3 of 3 out of service (gpu-n: not Ready; gpu-p: unschedulable; "
            "gpu-q: quarantined since 2026-11-01T12:00:00Z, needs a person)") in reason, reason


def test_a_budget_over_its_limit_says_how_it_came_to_be_over() -> None:
    """``budget full: 3 of 2`` read as a contradiction (issue 50): the wait says which holders were never the budget's
    to admit: a person's cordon, a NotReady node, a quarantine or a thermal cordon (those never wait for it)."""
    quarantined = r.NodeRecord(state=s.QUARANTINED, since=1_793_534_400.0, cordoned_by_us=True)
    node = {"metadata": {"name": "gpu-q", "annotations": {r.RECORD_ANNOTATION: r.encode(quarantined)}},
            "spec": {"unschedulable": True}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    fleet = [node_view(node), NodeView("gpu-p", unschedulable=True), NodeView("gpu-n", ready=False),
             NodeView("cand", state=s.DRAINING, unschedulable=True, waiting=True), NodeView("h")]
    reason = budget_check(fleet, "cand", Budget(2)).reason
    assert reason.startswith("budget full: 3 of 2 out of service (gpu-n: not Ready; gpu-p: unschedulable; "), reason
    assert reason.endswith("; over 2 because every node out of service counts, not only gpuremediate's drains: "
                           "NotReady or cordoned by someone else (gpu-n, gpu-p) and quarantined or cordoned while "
                           "hot, which never waits for the budget (gpu-q)"), reason
    at_limit = budget_check(fleet, "cand", Budget(3)).reason
    assert at_limit.startswith("budget full: 3 of 3 out of service") and "over 3" not in at_limit, at_limit
    ours = [NodeView(n, state=s.REPAIRING, unschedulable=True) for n in ("a", "b")] + [NodeView("cand")]
    assert budget_check(ours, "cand", Budget(1)).reason.endswith(
        "over 1 because every node out of service counts, not only gpuremediate's drains: admitted while the limit "
        "allowed them (a smaller fleet or a new policy lowered it)")


def test_waiting_nodes_do_not_block_each_other() -> None:
    # three fatal faults at once, each cordoned at once, limit 1: one of them must still get through
    fleet = [NodeView(n, unschedulable=True, state=s.DRAINING, waiting=True) for n in "xyz"] + [NodeView("h")]
    assert budget_check(fleet, "x", Budget(1)).allowed
    assert admit(fleet, ["x", "y", "z"], Budget(1)) == ["x"]


def test_a_candidate_already_out_counts_in_in_use_but_not_against_itself() -> None:
    fleet = [NodeView("cand", unschedulable=True), NodeView("h")]
    result = budget_check(fleet, "cand", Budget(1))
    assert result.allowed and result.in_use == 1


def test_unknown_candidate_is_an_error() -> None:
    with pytest.raises(ValueError, match="not among the GPU nodes: ghost"):
        budget_check([NodeView("a")], "ghost")
    with pytest.raises(ValueError, match="ghost"):
        admit([NodeView("a")], ["a", "ghost"])


def test_admit_orders_by_first_seen_then_name() -> None:
    fleet = [
        NodeView("b", first_seen=10.0),
        NodeView("a", first_seen=10.0),
        NodeView("c", first_seen=5.0),
        NodeView("d"),  # no fault time: last
        NodeView("busy", state=s.DRAINING),
        *[NodeView(f"h{i}") for i in range(8)],
    ]
    assert admit(fleet, ["d", "b", "a", "c"], Budget(3)) == ["c", "a"]
    assert admit(fleet, ["d", "b", "a", "c"], Budget(10)) == ["c", "a", "b", "d"]
    assert admit(fleet, ["d", "b"], Budget(1)) == []


views = st.builds(
    NodeView,
    name=st.just(""),
    unschedulable=st.booleans(),
    ready=st.booleans(),
    state=st.sampled_from(s.STATES),
    waiting=st.booleans(),
    first_seen=st.none() | st.floats(0, 1e6),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(views, min_size=1, max_size=20),
    st.data(),
    st.one_of(st.integers(0, 6), st.integers(0, 100).map(lambda p: f"{p}%")),
)
def test_never_more_admitted_than_the_limit(raw: list[NodeView], data: st.DataObject, value: int | str) -> None:
    fleet = [NodeView(f"n{i}", v.unschedulable, v.ready, v.state, v.waiting, v.first_seen) for i, v in enumerate(raw)]
    names = [v.name for v in fleet]
    candidates = data.draw(st.lists(st.sampled_from(names), unique=True))
    budget = Budget(value)
    limit = budget.limit(len(fleet))
    admitted = admit(fleet, candidates, budget)
    out_before = {v.name for v in fleet if v.out_of_service}
    out_after = out_before | set(admitted)
    assert set(admitted) <= set(candidates)
    assert len(out_after) <= max(limit, len(out_before))  # never more out than the limit allows
    if admitted:
        assert len(out_after) <= limit
    for name in set(candidates) - set(admitted):  # maximal: nobody left out who would have fit
        assert len(out_after | {name}) > limit
    assert admit(fleet, list(reversed(candidates)), budget) == admitted  # deterministic
    for name in candidates:  # one candidate alone: admit and budget_check agree
        assert (admit(fleet, [name], budget) == [name]) == budget_check(fleet, name, budget).allowed


def _node(
    name: str,
    *,
    unschedulable: bool = False,
    ready: str | None = "True",
    rec: r.NodeRecord | None = None,
    raw: str | None = None,
) -> dict[str, Any]:
    node: dict[str, Any] = {"metadata": {"name": name, "annotations": {}}, "spec": {"unschedulable": unschedulable}}
    if ready is not None:
        node["status"] = {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]
        }
    if rec is not None:
        node["metadata"]["annotations"][r.RECORD_ANNOTATION] = r.encode(rec)
    if raw is not None:
        node["metadata"]["annotations"][r.RECORD_ANNOTATION] = raw
    return node


def test_node_view_from_node_objects() -> None:
    assert node_view(_node("a")) == NodeView("a")
    assert node_view(_node("a", ready="Unknown")).out_of_service
    assert node_view(_node("a", ready=None)).out_of_service
    fault = r.Fault("xid", "79", (), "fp", "reboot", 42.0, 42.0, "")
    waiting = r.NodeRecord(state=s.DRAINING, fault=fault, cordoned_by_us=True)
    view = node_view(_node("w", unschedulable=True, rec=waiting))
    assert view.waiting and not view.out_of_service and view.first_seen == 42.0
    started = r.start_action(waiting, "drain", "", 1, 50.0)
    assert node_view(_node("w", unschedulable=True, rec=started)).out_of_service
    assert node_view(_node("m", unschedulable=True, raw="{garbage")).out_of_service


def test_is_waiting_only_for_our_own_not_started_drain() -> None:
    base = r.NodeRecord(state=s.DRAINING, cordoned_by_us=True)
    assert is_waiting(base)
    assert not is_waiting(r.NodeRecord(state=s.DRAINING, was_unschedulable=True))  # a person's cordon: out anyway
    assert not is_waiting(r.start_action(base, "drain", "", 1, 1.0))
    assert not is_waiting(r.NodeRecord(state=s.CORDONED, cordoned_by_us=True))


_view = st.builds(
    NodeView,
    name=st.just(""),  # named by position below
    unschedulable=st.booleans(),
    ready=st.booleans() | st.just(True),
    state=st.sampled_from([s.HEALTHY, s.HEALTHY, s.DRAINING, s.REPAIRING, s.VALIDATING, s.QUARANTINED, s.CORDONED]),
    waiting=st.booleans(),
    first_seen=st.none() | st.floats(0, 100),
    labels=st.dictionaries(st.sampled_from(["rack", "zone"]), st.sampled_from(["a", "b"]), max_size=2),
    gpus=st.sampled_from([0, 4, 8]),
    gpus_out=st.none() | st.integers(1, 8),
)


@settings(max_examples=300, deadline=None)
@given(
    fleet=st.lists(_view, min_size=1, max_size=14),
    value=st.sampled_from([0, 1, 2, 3, "10%", "25%", "50%", "100%"]),
    count_held=st.booleans(),
    domain_values=st.lists(st.tuples(st.sampled_from(["rack", "zone"]), st.sampled_from([0, 1, "50%"])),
                           max_size=2, unique_by=lambda d: d[0]),
    data=st.data(),
)
def test_the_notable_nodes_and_the_fleet_s_size_decide_as_every_node_does(
        fleet: list[NodeView], value: int | str, count_held: bool, domain_values: list[tuple[str, int | str]],
        data: st.DataObject) -> None:
    """A drain's admission views only the notable nodes (issue 48: at 100,000 nodes a view of each per admission
    held the interpreter): the verdict, its reason and its counts are those of a view of the whole fleet."""
    views = [dataclasses.replace(v, name=f"n{i:02d}") for i, v in enumerate(fleet)]
    budget = Budget(value, count_held)
    domains = [DomainBudget(label, limit) for label, limit in domain_values]
    candidates = data.draw(st.lists(st.sampled_from([v.name for v in views]), min_size=1, max_size=4, unique=True))
    size = FleetSize(len(views), lambda label, val: sum(1 for v in views if v.labels.get(label) == val))
    asked = set(candidates)
    seen = [v for v in views if notable(v) or v.name in asked]
    for candidate in candidates:
        assert budget_check(seen, candidate, budget, domains, size) == budget_check(views, candidate, budget, domains)
    assert admit(seen, candidates, budget, domains, size) == admit(views, candidates, budget, domains)
    assert domain_admission(seen, asked, budget, size) == domain_admission(views, asked, budget)
