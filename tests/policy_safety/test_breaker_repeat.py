"""The circuit breaker and the repeat-offender rule."""

from __future__ import annotations

import json

import pytest

from gpuremediate.policy.safety import CircuitBreaker, repeat_offender
from gpuremediate.vocab.record import OUTCOME_REPAIR_FAILED, OUTCOME_REPAIRED, OUTCOME_STOPPED, HistoryEntry

WINDOW = 600.0


def faulted(*nodes_at: tuple[str, float]) -> CircuitBreaker:
    breaker = CircuitBreaker()
    for node, at in nodes_at:
        breaker = breaker.record_fault(node, at)
    return breaker


def test_opens_when_more_than_threshold_of_nodes_fault_in_window() -> None:
    breaker = faulted(("a", 100.0), ("b", 110.0), ("c", 120.0))
    tripped = breaker.evaluate(10, 130.0, threshold_pct=20, window_s=WINDOW, min_nodes=2)
    assert tripped.is_open and tripped.opened_at == 130.0 and "3 of 10" in tripped.reason
    # the threshold says where it comes from (the sandbox's 90 % is its policy's, the docs' 30 % the default)
    assert tripped.reason == ("3 of 10 GPU nodes faulted within 600s (more than 20%: the policy's [breaker] "
                              "threshold_percent)"), tripped.reason


def test_exactly_threshold_does_not_open() -> None:
    breaker = faulted(("a", 100.0), ("b", 110.0))
    assert not breaker.evaluate(10, 130.0, threshold_pct=20, window_s=WINDOW).is_open


def test_same_node_twice_counts_once() -> None:
    breaker = faulted(("a", 100.0), ("a", 110.0), ("a", 120.0))
    assert not breaker.evaluate(4, 130.0, threshold_pct=30, window_s=WINDOW).is_open


def test_min_nodes_guards_small_fleets() -> None:
    breaker = faulted(("a", 100.0))
    assert not breaker.evaluate(2, 101.0, threshold_pct=10, window_s=WINDOW, min_nodes=2).is_open
    assert breaker.evaluate(2, 101.0, threshold_pct=10, window_s=WINDOW, min_nodes=1).is_open


def test_old_faults_leave_the_window() -> None:
    breaker = faulted(("a", 0.0), ("b", 10.0), ("c", 700.0))
    evaluated = breaker.evaluate(10, 700.0, threshold_pct=20, window_s=WINDOW)
    assert not evaluated.is_open
    assert evaluated.faults == (("c", 700.0),)  # pruned
    edge = faulted(("a", 100.0), ("b", 100.0), ("c", 100.0)).evaluate(10, 700.0, 20, WINDOW)
    assert edge.is_open  # at exactly now - window: still inside


def test_stays_open_until_reset_then_forgets() -> None:
    tripped = faulted(("a", 1.0), ("b", 2.0)).evaluate(4, 3.0, threshold_pct=25, window_s=WINDOW)
    assert tripped.is_open
    later = tripped.evaluate(4, 10_000.0, threshold_pct=25, window_s=WINDOW)
    assert later.is_open and later.opened_at == 3.0
    reset = later.reset("alice", 10_001.0)
    assert not reset.is_open and reset.faults == () and reset.reset_by == "alice"
    assert not reset.evaluate(4, 10_002.0, 25, WINDOW).is_open


def test_no_nodes_never_opens() -> None:
    """However many faults, at any threshold: an empty (or unknown, negative) fleet does not open it."""
    breaker = faulted(*((f"n{i}", float(i)) for i in range(6)))
    for total in (0, -1):
        for now in (6.0, 60.0, 599.0):
            for pct in (0, 10, 100):
                assert not breaker.evaluate(total, now, pct, WINDOW, min_nodes=1).is_open, (total, now, pct)


def test_json_round_trip() -> None:
    tripped = faulted(("a", 1.0), ("b", 2.0)).evaluate(4, 3.0, 25, WINDOW)
    text = json.dumps(tripped.to_dict())
    assert CircuitBreaker.from_dict(json.loads(text)) == tripped
    with pytest.raises(ValueError, match="open must be a boolean"):
        CircuitBreaker.from_dict({"open": "yes"})
    with pytest.raises(ValueError, match="malformed circuit breaker"):
        CircuitBreaker.from_dict({"faults": [["a"]]})


DAY = 86400.0
NOW = 100 * DAY


def entries(*ats: float, outcome: str = OUTCOME_REPAIRED) -> list[HistoryEntry]:
    return [HistoryEntry(at, "xid", "79", "reboot", outcome) for at in ats]


@pytest.mark.parametrize(
    ("ats", "expected"),
    [
        ((NOW - 7 * DAY, NOW - DAY, NOW), True),  # the window edge is inside
        ((NOW - 7 * DAY - 0.001, NOW - DAY, NOW), False),  # just outside
        ((NOW - DAY, NOW - 2), False),  # only two
        ((NOW - 3, NOW - 2, NOW - 1, NOW - 30 * DAY), True),
        ((NOW + 5, NOW - 1, NOW - 2), True),  # a clock ahead still counts
        ((), False),
    ],
)
def test_repeat_offender_window_edges(ats: tuple[float, ...], expected: bool) -> None:
    assert repeat_offender(entries(*ats), NOW) is expected


def test_only_repairs_count() -> None:
    history = entries(NOW - 3, NOW - 2, outcome=OUTCOME_STOPPED) + entries(NOW - 1, outcome=OUTCOME_REPAIR_FAILED)
    assert not repeat_offender(history, NOW)
    assert repeat_offender(history + entries(NOW, NOW), NOW)


def test_count_and_window_are_parameters() -> None:
    history = entries(NOW - 50, NOW - 10)
    assert repeat_offender(history, NOW, count=2, window_s=60)
    assert not repeat_offender(history, NOW, count=2, window_s=40)
    assert not repeat_offender(history, NOW, count=0)  # off
