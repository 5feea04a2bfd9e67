"""The breaker judges how fast faults arrive (issue 49): faster than the policy's rate, new faults are held for a
storm look; past the threshold meanwhile the breaker opens with them held, else the look ends and they go on."""

from __future__ import annotations

import json

import pytest

from gpuremediate.policy.config import PolicyError, loads_policy
from gpuremediate.policy.safety import LOOK_OPENED, LOOK_RELEASED, CircuitBreaker, Look, LookRate

FLEET = 5000
RATE = LookRate(nodes=10, percent=10.0, window_s=30.0, look_s=20.0, min_nodes=3)


def judge(breaker: CircuitBreaker, names: list[str], now: float, total: int = FLEET,
          rate: LookRate | None = RATE) -> CircuitBreaker:
    return breaker.judge(names, total, now, threshold_pct=30.0, window_s=600.0, min_nodes=3, rate=rate)


def nodes(first: int, count: int) -> list[str]:
    return [f"n{i:05d}" for i in range(first, first + count)]


def test_a_single_fault_and_a_handful_open_no_look() -> None:
    breaker = judge(CircuitBreaker(), ["a"], 100.0)
    assert breaker.look is None and breaker.faults == (("a", 100.0),)
    breaker = judge(breaker, nodes(0, 9), 101.0)  # 10 within the window: not more than look_nodes
    assert breaker.look is None and not breaker.is_open


def test_faster_than_the_rate_opens_a_look_holding_the_batch() -> None:
    breaker = judge(CircuitBreaker(), nodes(0, 8), 100.0)
    breaker = judge(breaker, nodes(8, 5), 105.0)  # 13 within 30 s: more than 10
    look = breaker.looking
    assert look is not None and look.opened_at == 105.0 and look.until == 125.0
    assert look.nodes == tuple(nodes(8, 5))  # the 8 before it were acted on already; the batch is held
    assert look.holds("n00009") and not look.holds("n00001")
    assert "13 GPU nodes faulted within 30s, more than 10" in look.reason and "1501 of 5000" in look.reason
    assert not breaker.is_open


def test_arrivals_outside_the_window_do_not_count() -> None:
    breaker = judge(CircuitBreaker(), nodes(0, 8), 100.0)
    breaker = judge(breaker, nodes(8, 5), 131.0)  # the first 8 are 31 s old
    assert breaker.look is None


def test_faults_during_a_look_join_it_and_the_storm_past_the_threshold_opens_the_breaker() -> None:
    breaker = judge(CircuitBreaker(), nodes(0, 160), 100.0)  # one Prometheus endpoint's installment
    assert breaker.looking is not None and len(breaker.looking.nodes) == 160
    for step in range(1, 9):
        breaker = judge(breaker, nodes(160 * step, 160), 100.0 + step)
        assert not breaker.is_open and breaker.looking is not None
    assert len(breaker.looking.nodes) == 1440
    breaker = judge(breaker, nodes(1440, 160), 110.0)  # 1,600 of 5,000: past 30 %
    assert breaker.is_open and "1600 of 5000" in breaker.reason
    assert breaker.look is not None and breaker.look.outcome == LOOK_OPENED and breaker.look.ended_at == 110.0
    assert len(breaker.look.nodes) == 1600 and breaker.looking is None


def test_a_look_under_the_threshold_ends_released_and_its_faults_are_not_counted_twice() -> None:
    breaker = judge(CircuitBreaker(), nodes(0, 750), 100.0)
    assert breaker.looking is not None
    breaker = breaker.end_look(120.0)
    assert breaker.look is not None and breaker.look.outcome == LOOK_RELEASED and breaker.looking is None
    again = judge(breaker, nodes(0, 750), 120.5)  # the released faults go on: not new arrivals
    assert again.faults == breaker.faults and again.look == breaker.look
    one = judge(again, ["late"], 121.0)  # counted from the look's end: one fault alone opens none
    assert one.looking is None and one.faults[-1] == ("late", 121.0)
    many = judge(one, nodes(800, 12), 122.0)
    assert many.looking is not None and many.looking.nodes == tuple(nodes(800, 12))


def test_the_percent_counts_in_a_small_fleet_never_below_min_nodes() -> None:
    assert RATE.limit(5000) == 10 and RATE.limit(40) == 4 and RATE.limit(20) == 2 and RATE.limit(4) == 2
    assert judge(CircuitBreaker(), nodes(0, 4), 100.0, total=40).look is None
    assert judge(CircuitBreaker(), nodes(0, 5), 100.0, total=40).looking is not None
    # 3 of 4 is past the threshold itself: the breaker opens, no look needed
    tiny = judge(CircuitBreaker(), nodes(0, 3), 100.0, total=4)
    assert tiny.is_open and tiny.look is None


def test_no_rate_or_a_zero_look_means_no_look() -> None:
    assert judge(CircuitBreaker(), nodes(0, 100), 100.0, rate=None).look is None
    off = LookRate(look_s=0.0)
    assert judge(CircuitBreaker(), nodes(0, 100), 100.0, rate=off).look is None


def test_the_look_survives_the_configmap_and_a_reset_forgets_it() -> None:
    breaker = judge(CircuitBreaker(), nodes(0, 50), 100.0)
    back = CircuitBreaker.from_dict(json.loads(json.dumps(breaker.to_dict())))
    assert back == breaker and back.looking is not None and back.looking.holds("n00007")
    assert CircuitBreaker.from_dict({"open": False}).look is None  # a state written before looks
    assert breaker.reset(by="ops", now=200.0).look is None
    with pytest.raises(ValueError, match=r"look\.outcome 'maybe'"):
        CircuitBreaker.from_dict({"look": {"opened_at": 1, "until": 2, "outcome": "maybe"}})
    with pytest.raises(ValueError, match="malformed circuit breaker state"):
        CircuitBreaker.from_dict({"look": {"until": 2}})


def test_describe_says_what_is_held_and_for_how_long() -> None:
    look = Look(opened_at=0.0, until=20.0, reason="why", nodes=("a", "b"))
    assert look.describe(5.0).startswith("2 new faults held for a storm look, 15 s left (until 1970-01-01T00:00:20Z)")
    assert "they went on" in Look(0.0, 20.0, "why", ("a",), 20.0, LOOK_RELEASED).describe(30.0)


def test_the_policy_keys_are_checked() -> None:
    policy = loads_policy("[breaker]\nlook_nodes = 25\nlook_percent = 2.5\nlook_window_s = 45\nlook_s = 0\n")
    cfg = policy.cluster.breaker
    assert (cfg.look_nodes, cfg.look_percent, cfg.look_window_s, cfg.look_s) == (25, 2.5, 45.0, 0.0)
    defaults = loads_policy("").cluster.breaker
    assert (defaults.look_nodes, defaults.look_percent, defaults.look_window_s, defaults.look_s) == (10, 10.0, 30.0,
                                                                                                       20.0)
    with pytest.raises(PolicyError, match=r"breaker\.look_nodes: must be at least 1"):
        loads_policy("[breaker]\nlook_nodes = 0\n")
    with pytest.raises(PolicyError, match=r"breaker\.look_s: must be between 0 and 3600"):
        loads_policy("[breaker]\nlook_s = -1\n")
    with pytest.raises(ValueError, match="look rate out of range"):
        LookRate(nodes=0)
