"""Replay over hand-made saved scrapes: the controller's own loops, on the simulated clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuremediate.policy.config import loads_policy
from gpuremediate.replay.engine import ReplayError, replay
from gpuremediate.replay.history import History
from gpuremediate.replay.result import BELOW_THRESHOLD, BREAKER_HELD, EXCLUDED, NOTICE, UNKNOWN
from tests.replay.helpers import HOUR, T0, fault, first, fleet, moves, run, xid

# Default simulated durations: drain 10 min, reset-gpu 5 min, reboot 15 min, validation 10 min.


def test_one_xid_79_walks_drain_reboot_validate_back_to_healthy(tmp_path: Path) -> None:
    result = run(tmp_path, fleet(faults=[xid(1, 600, 3 * HOUR)]))

    assert moves(result) == [
        (600, "node-1", "healthy", "draining", "xid-79"),
        (1200, "node-1", "draining", "repairing", "drain-complete"),
        (2100, "node-1", "repairing", "validating", "repair-complete"),
        (2700, "node-1", "validating", "healthy", "validation-passed"),
    ]  # the XID stays in the history until 3 h: handled, not acted on twice
    assert result.node_hours() == pytest.approx(2100 / 3600)
    assert result.gpu_hours() == pytest.approx(8 * 2100 / 3600)
    assert result.affected == ["node-1"]


def test_a_second_fault_waits_for_the_budget(tmp_path: Path) -> None:
    scenario = fleet(faults=[xid(0, 600, 2 * HOUR), xid(1, 660, 2 * HOUR)])
    result = run(tmp_path, scenario, '[budget]\nmax_unavailable = "1"\n')

    assert first(result, "node-1", "draining").at == T0 + 660  # cordoned at once, drain not started
    [wait] = [w for w in result.waits if w.node == "node-1"]
    assert wait.reason == "budget" and "node-0" in wait.detail
    assert (wait.start - T0, wait.end - T0) == (660, 2730)  # node-0 healthy at 2700; next drain-loop pass
    assert moves(result, "node-1")[1] == (2730 + 600, "node-1", "draining", "repairing", "drain-complete")
    assert result.summary()["budget_waits"] == 1


def test_the_same_history_without_a_tight_budget_has_no_wait(tmp_path: Path) -> None:
    result = run(tmp_path, fleet(count=8, faults=[xid(0, 600, 2 * HOUR), xid(1, 660, 2 * HOUR)]))  # 25% of 8: 2

    assert result.waits == []
    assert first(result, "node-1", "repairing").at == T0 + 660 + 600


def test_a_burst_trips_the_breaker_and_holds_the_later_fault(tmp_path: Path) -> None:
    policy = "[breaker]\nthreshold_percent = 20.0\nmin_nodes = 2\nwindow_s = 600.0\n"
    result = run(tmp_path, fleet(count=5, faults=[xid(0, 600, HOUR), xid(1, 630, HOUR)]), policy)

    [trip] = result.trips
    assert (trip.at - T0, trip.node) == (630, "node-1")
    assert "2 of 5 GPU nodes" in trip.reason
    assert moves(result, "node-1") == []  # an open breaker starts nothing, not even the cordon
    [held] = [u for u in result.unacted if u.category == BREAKER_HELD]
    assert (held.node, held.start - T0, held.end - T0) == ("node-1", 630, HOUR)  # until the XID left the history
    assert first(result, "node-0", "healthy").reason == "validation-passed"  # admitted before the trip


def test_the_third_repair_within_the_window_quarantines_a_repeat_offender(tmp_path: Path) -> None:
    faults = [xid(0, 600, 1800, code=48), xid(0, 4 * HOUR, 4.5 * HOUR, code=48), xid(0, 8 * HOUR, 8.5 * HOUR, code=48)]
    result = run(tmp_path, fleet(faults=faults), "[repeat_offender]\ncount = 2\n")

    assert [(at, to, reason) for at, _, _, to, reason in moves(result)] == [
        (600, "draining", "xid-48"), (1200, "repairing", "drain-complete"),
        (1500, "validating", "repair-complete"), (2100, "healthy", "validation-passed"),
        (4 * HOUR, "draining", "xid-48"), (4 * HOUR + 600, "repairing", "drain-complete"),
        (4 * HOUR + 900, "validating", "repair-complete"), (4 * HOUR + 1500, "healthy", "validation-passed"),
        (8 * HOUR, "quarantined", "repeat-offender"),
    ]
    assert result.summary()["quarantined_at_end"] == ["node-0"]
    assert result.node_hours("node-0") == pytest.approx((1500 + 1500 + 4 * 3600) / 3600)  # quarantined till the end


def test_unknown_and_excluded_nodes_are_reported_not_acted_on(tmp_path: Path) -> None:
    scenario = fleet(faults=[xid(3, 600, HOUR)], down=[("node-2", T0 + HOUR, T0 + 3 * HOUR)], excluded=["node-3"])
    result = run(tmp_path, scenario)

    assert result.moves == []
    [unknown] = [u for u in result.unacted if u.category == UNKNOWN]
    assert (unknown.node, unknown.start - T0, unknown.end - T0) == ("node-2", HOUR, 3 * HOUR)
    assert unknown.detail == "exporter unreachable (connection refused)"
    [excluded] = [u for u in result.unacted if u.category == EXCLUDED]
    assert (excluded.node, excluded.start - T0) == ("node-3", 600)
    assert "xid:GPU-node-3-0:79" in excluded.detail


def test_notices_and_signals_below_the_threshold_are_reported(tmp_path: Path) -> None:
    scenario = fleet(faults=[xid(0, 600, HOUR, code=13), fault(1, 600, None, uncorrectable_rows=3),
                             fault(2, 600, 630, temp=95)])
    result = run(tmp_path, scenario)

    assert result.moves == []
    [notice] = [u for u in result.unacted if u.category == NOTICE]
    assert notice.node == "node-0" and "XID 13" in notice.detail
    below = sorted((u.node, u.start - T0) for u in result.unacted if u.category == BELOW_THRESHOLD)
    assert below == [("node-1", 600), ("node-2", 600)]


def test_a_hot_gpu_is_cordoned_after_the_hold_and_released_after_the_clear_hold(tmp_path: Path) -> None:
    result = run(tmp_path, fleet(faults=[fault(0, 600, 1800, temp=95)]))

    assert moves(result) == [
        (660, "node-0", "healthy", "cordoned", "thermal"),  # hold_s 60
        (2100, "node-0", "cordoned", "healthy", "thermal-cleared"),  # clear_hold_s 300 after cooling at 1800
    ]


def test_a_row_remap_failure_is_quarantined_at_once(tmp_path: Path) -> None:
    result = run(tmp_path, fleet(faults=[fault(2, 600, None, gpu=5, remap_failure=1)]))

    assert moves(result) == [(600, "node-2", "healthy", "quarantined", "row-remap-failure")]
    assert result.node_hours() == pytest.approx(12 - 600 / 3600)


def test_a_custom_action_in_the_policy_is_refused_with_a_reason() -> None:
    policy = loads_policy('[xid.overrides]\n79 = "vendor-rma"\n\n[actions.vendor-rma]\napiGroup = "x.io"\n'
                          'kind = "Rma"\n')
    with pytest.raises(ReplayError, match="custom remediation actions"):
        replay(History(start=T0, end=T0 + HOUR), policy)


def test_time_jumps_over_quiet_stretches(tmp_path: Path) -> None:
    result = run(tmp_path, fleet(hours=30 * 24, faults=[xid(1, 600, 3 * HOUR)]))

    assert len(result.moves) == 4
    assert result.steps < 200  # a month of 30 s steps is 86,400 instants; only the busy ones are visited


GPU_OPERATOR_NODE = {"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true",
                     "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_a_reset_on_a_gpu_operator_node_runs_the_sequence_to_healthy(tmp_path: Path) -> None:
    """The node list of an operator fleet has the operand labels: the reset goes through the operand sequence,
    whose end waits for readings newer than the restore (the exporter serves its last scrape until the next)."""
    result = run(tmp_path, fleet(faults=[xid(1, 600, 3 * HOUR, code=48)]), labels=GPU_OPERATOR_NODE)

    assert [m[2:] for m in moves(result)] == [("healthy", "draining", "xid-48"),
                                              ("draining", "repairing", "drain-complete"),
                                              ("repairing", "validating", "repair-complete"),
                                              ("validating", "healthy", "validation-passed")]
    repaired = first(result, "node-1", "validating")
    assert "operands and exporter back" in repaired.message, repaired.message
    assert repaired.at - first(result, "node-1", "repairing").at < 600  # the 5 min reset, not a 10 min timeout
