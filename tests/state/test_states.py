"""The transition table, edge by edge: every legal move accepted, every other one refused."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.vocab import states as s
from gpuremediate.vocab.record import NodeRecord, transition

# The brief's table (design §3 plus the person / maintenance edges), one representative reason each.
LEGAL = {
    (s.HEALTHY, s.CORDONED): "thermal",
    (s.HEALTHY, s.DRAINING): "xid-79",
    (s.HEALTHY, s.QUARANTINED): "row-remap-failure",
    (s.HEALTHY, s.MAINTENANCE): s.MAINTENANCE_REQUESTED,
    (s.HEALTHY, s.VALIDATING): s.NEW_NODE,
    (s.CORDONED, s.HEALTHY): s.THERMAL_CLEARED,
    (s.CORDONED, s.DRAINING): "xid-48",
    (s.CORDONED, s.QUARANTINED): s.REPEAT_OFFENDER,
    (s.DRAINING, s.REPAIRING): s.DRAIN_COMPLETE,
    (s.DRAINING, s.QUARANTINED): s.DRAIN_FAILED,
    (s.DRAINING, s.HEALTHY): s.PERSON_UNCORDONED,
    (s.DRAINING, s.VALIDATING): s.DRAIN_COMPLETE,
    (s.DRAINING, s.MAINTENANCE): s.DRAIN_COMPLETE,
    (s.REPAIRING, s.VALIDATING): s.REPAIR_COMPLETE,
    (s.REPAIRING, s.QUARANTINED): s.REPAIR_FAILED,
    (s.VALIDATING, s.HEALTHY): s.VALIDATION_PASSED,
    (s.VALIDATING, s.QUARANTINED): s.VALIDATION_FAILED,
    (s.REPAIRING, s.DRAINING): "xid-48",  # a GPU-level isolation escalated to node-level
    (s.VALIDATING, s.DRAINING): "xid-48",
    (s.QUARANTINED, s.VALIDATING): s.RELEASED,
    (s.QUARANTINED, s.HEALTHY): s.RELEASED,
    (s.MAINTENANCE, s.DRAINING): s.MAINTENANCE_START,
    (s.MAINTENANCE, s.HEALTHY): s.MAINTENANCE_CANCELLED,
    (s.MAINTENANCE, s.VALIDATING): s.MAINTENANCE_COMPLETE,
}
ALL_PAIRS = list(itertools.product(s.STATES, s.STATES))


def test_table_has_exactly_the_specified_edges() -> None:
    table_edges = {(frm, to) for frm, edges in s.TRANSITIONS.items() for to in edges}
    assert table_edges == set(LEGAL)
    assert set(s.TRANSITIONS) == set(s.STATES)


@pytest.mark.parametrize(("frm", "to"), sorted(LEGAL))
def test_legal_transition_moves_the_record(frm: str, to: str) -> None:
    record = NodeRecord(state=frm, since=1.0)
    moved = transition(record, to, LEGAL[(frm, to)], 50.0, "why")
    assert (moved.state, moved.since, moved.reason, moved.message) == (to, 50.0, LEGAL[(frm, to)], "why")


@pytest.mark.parametrize(("frm", "to"), [p for p in ALL_PAIRS if p not in LEGAL])
def test_illegal_transition_names_from_to_and_reason(frm: str, to: str) -> None:
    with pytest.raises(s.IllegalTransition) as info:
        transition(NodeRecord(state=frm), to, "xid-79", 5.0)
    text = str(info.value)
    assert frm in text and to in text and "xid-79" in text
    assert (info.value.from_state, info.value.to_state, info.value.reason) == (frm, to, "xid-79")


@pytest.mark.parametrize(
    ("frm", "to", "reason"),
    [
        (s.DRAINING, s.REPAIRING, "xid-79"),  # a fault reason on a lifecycle-only edge
        (s.REPAIRING, s.VALIDATING, s.DRAIN_COMPLETE),
        (s.VALIDATING, s.HEALTHY, s.VALIDATION_FAILED),
        (s.HEALTHY, s.DRAINING, s.DRAIN_COMPLETE),  # lifecycle word is not a fault reason
        (s.HEALTHY, s.CORDONED, ""),
        (s.HEALTHY, s.CORDONED, "Not A Word"),
        (s.QUARANTINED, s.VALIDATING, s.VALIDATION_PASSED),
        (s.MAINTENANCE, s.DRAINING, "xid-79"),
    ],
)
def test_wrong_reason_on_a_legal_edge_is_refused(frm: str, to: str, reason: str) -> None:
    with pytest.raises(s.IllegalTransition, match="allowed reasons"):
        transition(NodeRecord(state=frm), to, reason, 1.0)


def test_unknown_from_state_is_refused() -> None:
    with pytest.raises(s.IllegalTransition, match="unknown state 'broken'"):
        s.check_transition("broken", s.HEALTHY, s.RELEASED)


def test_same_state_is_not_a_transition() -> None:
    for state in s.STATES:
        assert not s.is_allowed(state, state, "xid-79")


def test_transition_clears_blocked_and_applies_changes() -> None:
    from gpuremediate.vocab.record import Blocked

    record = NodeRecord(state=s.DRAINING, blocked=Blocked("budget", "full", 3.0))
    moved = transition(record, s.REPAIRING, s.DRAIN_COMPLETE, 9.0, cordoned_by_us=True)
    assert moved.blocked is None and moved.cordoned_by_us


@pytest.mark.parametrize(
    ("kind", "code", "reason"), [("xid", "79", "xid-79"), ("ecc-dbe", "", "ecc-dbe"), ("thermal", "gpu", "thermal")]
)
def test_fault_reason(kind: str, code: str, reason: str) -> None:
    assert s.fault_reason(kind, code) == reason
    assert s.is_fault_reason(reason)


@pytest.mark.parametrize(
    ("kind", "code", "reason"),
    [
        ("NVLink Down", "", "nvlink-down"),
        ("xid", "79 (fell off bus)", "xid-79-fell-off-bus"),
        ("", "", "fault"),
        ("!!!", "", "fault"),
        (s.DRAIN_COMPLETE, "", "fault-drain-complete"),
        ("x" * 100, "", "x" * 63),
    ],
)
def test_fault_reason_is_always_a_usable_machine_word(kind: str, code: str, reason: str) -> None:
    assert s.fault_reason(kind, code) == reason
    assert s.is_allowed(s.HEALTHY, s.DRAINING, reason)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.text(max_size=20))
def test_any_finding_gives_a_reason_the_table_accepts(kind: str, code: str) -> None:
    assert s.is_allowed(s.HEALTHY, s.DRAINING, s.fault_reason(kind, code))
