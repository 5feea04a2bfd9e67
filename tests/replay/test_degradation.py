"""Replay of issue 29's degradation findings: the detector fed the fleet's readings each pass, slow GPUs and degraded
links cordoned (no drain) and lifted on recovery, trends reported or scheduled into a maintenance window, and
none of it with ``[degradation]`` off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuremediate.policy.config import loads_policy
from gpuremediate.replay import cli
from gpuremediate.replay.engine import replay
from gpuremediate.replay.history import load_scrapes
from gpuremediate.replay.html import render_html
from gpuremediate.replay.prometheus import DEGRADATION_METRICS, PrometheusHistory
from gpuremediate.replay.result import ReplayResult
from gpuremediate.replay.text import render_compare, render_text
from gpuremediate.signals.sources import POLICY_METRICS
from sim.history import (
    DEGRADATION_FIELDS,
    FIELDS,
    FULL_CLOCK,
    MINUTE,
    Fault,
    Fleet,
    degradation_fleet,
    gpu_values,
    main,
    write_all,
    write_scrapes,
)
from tests.replay.helpers import HOUR, T0, fleet, moves, run
from tests.replay.test_prometheus import _served

ON = "[degradation]\nenabled = true\ntrends = true\n"
MAINTENANCE = ON + 'trend_action = "maintenance"\n'
# Defaults: hold_s 300, clear_hold_s 600; link_hold_s 180, link_clear_s 1800; sbe_min 100 within 3600 s.


def busy_fleet(*faults: Fault, count: int = 4, hours: float = 6.0) -> Fleet:
    scenario = fleet(count=count, hours=hours, faults=faults)
    scenario.degradation = True
    return scenario


def slow(node: int, gpu: int, at: float, until: float, share: float = 0.6) -> Fault:
    return Fault(f"node-{node}", gpu, T0 + at, T0 + until, {"sm_clock": share * FULL_CLOCK, "reasons": 0x40})


def rising(node: int, gpu: int, at: float, until: float, **per_minute: float) -> Fault:
    return Fault(f"node-{node}", gpu, T0 + at, T0 + until, {}, per_minute)


def found(result: ReplayResult) -> list[tuple[str, str, str, float, float]]:
    """(node, kind, code, start, end) of each degradation finding, seconds after T0."""
    return [(f.node, f.kind, f.code, f.start - T0, f.end - T0) for f in result.findings]


def test_a_slow_gpu_is_found_after_its_hold_cordoned_without_a_drain_and_lifted_on_recovery(tmp_path: Path) -> None:
    result = run(tmp_path, busy_fleet(slow(1, 3, HOUR, 2 * HOUR)), ON)

    assert found(result) == [("node-1", "slow-gpu", "sm-clock", HOUR + 300, 2 * HOUR + 600)]
    assert moves(result) == [
        (HOUR + 300, "node-1", "healthy", "cordoned", "slow-gpu"),  # the hold: 300 s an outlier
        (2 * HOUR + 600, "node-1", "cordoned", "healthy", "degradation-cleared"),  # the clear hold: 600 s calm
    ]
    assert result.summary()["drains"] == 0 and result.summary()["degradation_findings"] == {
        "slow-gpu": 1, "link-degraded": 0, "trend": 0}
    [finding] = result.findings
    assert finding.gpus == ("GPU-node-1-3",) and finding.action == "cordon" and not finding.ongoing
    assert "60% of its peers' median" in finding.message


def test_the_same_history_with_degradation_off_finds_nothing(tmp_path: Path) -> None:
    scenario = busy_fleet(slow(1, 3, HOUR, 2 * HOUR), rising(2, 5, HOUR, 1.5 * HOUR, pcie_replays=30.0),
                          rising(3, 2, HOUR, 2 * HOUR, sbe=10.0))
    result = run(tmp_path, scenario, "")  # the built-in policy: [degradation] off

    assert result.findings == [] and result.maintenances == [] and result.moves == []
    assert result.summary()["degradation_findings"] == {"slow-gpu": 0, "link-degraded": 0, "trend": 0}
    assert "Degradation findings" not in render_text(result)


def test_a_slow_gpu_under_drain_is_drained_then_validated(tmp_path: Path) -> None:
    result = run(tmp_path, busy_fleet(slow(1, 3, HOUR, 2 * HOUR)), ON + 'slow_action = "drain"\n')

    assert moves(result)[0] == (HOUR + 300, "node-1", "healthy", "draining", "slow-gpu")
    assert result.summary()["drains"] == 1


def test_a_slow_gpu_shorter_than_the_hold_and_an_idle_node_are_not_findings(tmp_path: Path) -> None:
    idle = [Fault("node-2", gpu, T0 + HOUR, T0 + 3 * HOUR, {"util": 0.0, "sm_clock": 210.0, "reasons": 0x1})
            for gpu in range(8)]
    result = run(tmp_path, busy_fleet(slow(1, 3, HOUR, HOUR + 120), *idle), ON)

    assert result.findings == [] and result.moves == []


@pytest.mark.parametrize(("counter", "code"), [("pcie_replays", "pcie"), ("nvlink_errors", "nvlink")])
def test_a_rising_link_counter_is_link_degraded_cordoned_and_lifted_once_quiet(tmp_path: Path, counter: str,
                                                                                 code: str) -> None:
    result = run(tmp_path, busy_fleet(rising(2, 5, HOUR, 1.5 * HOUR, **{counter: 30.0})), ON)

    # rising from the first minute's scrape (3660 s): found 180 s later; quiet after the last rise (5400 s) for 1800 s
    assert found(result) == [("node-2", "link-degraded", code, HOUR + 240, 1.5 * HOUR + 1800)]
    assert moves(result) == [(HOUR + 240, "node-2", "healthy", "cordoned", "link-degraded"),
                             (1.5 * HOUR + 1800, "node-2", "cordoned", "healthy", "degradation-cleared")]


def test_a_second_finding_on_a_cordoned_node_says_the_node_was_out_already(tmp_path: Path) -> None:
    scenario = busy_fleet(rising(1, 5, HOUR, 1.5 * HOUR, pcie_replays=30.0), slow(1, 3, HOUR + 600, HOUR + 1200))
    result = run(tmp_path, scenario, ON)

    assert found(result) == [("node-1", "link-degraded", "pcie", HOUR + 240, 2 * HOUR),
                             ("node-1", "slow-gpu", "sm-clock", HOUR + 900, HOUR + 1800)]
    assert [m[2:] for m in moves(result)] == [("healthy", "cordoned", "link-degraded"),
                                             ("cordoned", "healthy", "degradation-cleared")]
    text = render_text(result)
    assert "(sm-clock, action cordon): the node was cordoned already (link-degraded)" in text


def test_a_cordon_stays_while_another_degradation_finding_of_the_node_stands(tmp_path: Path) -> None:
    scenario = busy_fleet(rising(1, 5, HOUR, 1.5 * HOUR, pcie_replays=30.0), slow(1, 3, HOUR + 600, 2 * HOUR))
    result = run(tmp_path, scenario, ON)

    assert [f[1] for f in found(result)] == ["link-degraded", "slow-gpu"]  # slow from 4500 s, calm at 7200 s
    assert [m[2:] for m in moves(result)] == [("healthy", "cordoned", "link-degraded"),
                                             ("cordoned", "healthy", "degradation-cleared")]
    assert moves(result)[-1][0] == 2 * HOUR + 600  # lifted once the slow GPU is calm for its clear hold


def test_sporadic_replays_are_not_a_degraded_link(tmp_path: Path) -> None:
    result = run(tmp_path, busy_fleet(rising(2, 5, HOUR, HOUR + 180, pcie_replays=1.0)), ON)

    assert result.findings == []


def test_a_trend_is_reported_and_never_drained(tmp_path: Path) -> None:
    result = run(tmp_path, busy_fleet(rising(3, 2, HOUR, 2 * HOUR, sbe=10.0)), ON)

    [(node, kind, code, start, _end)] = found(result)
    assert (node, kind, code) == ("node-3", "trend", "sbe-rate")
    assert HOUR + 10 * MINUTE <= start <= HOUR + 11 * MINUTE  # 100 single-bit errors: 10 minutes of 10 a minute
    assert result.findings[0].action == "none" and result.moves == [] and result.maintenances == []
    assert "reported only" in render_text(result)


@pytest.mark.parametrize(("fault", "code"), [
    (rising(3, 2, HOUR, HOUR + 120, remapped_rows=1.0), "remapped-rows"),  # 2 new rows within a day
    (Fault("node-3", 2, T0 + HOUR, None, {"retired_pending": 1.0}), "retired-pending"),
])
def test_remapped_rows_and_pending_retirements_are_trends(tmp_path: Path, fault: Fault, code: str) -> None:
    result = run(tmp_path, busy_fleet(fault), ON)

    assert [(f[0], f[1], f[2]) for f in found(result)] == [("node-3", "trend", code)]
    assert result.moves == []


def test_trend_maintenance_says_when_it_would_schedule_the_drain(tmp_path: Path) -> None:
    # 2026-11-01 is a Sunday; the trend window is Sat,Sun 02:00-06:00 UTC: it found at 01:10, the window opens 02:00
    result = run(tmp_path, busy_fleet(rising(3, 2, HOUR, 2 * HOUR, sbe=10.0)), MAINTENANCE)

    [request] = result.maintenances
    assert request.node == "node-3" and request.name.startswith("trend-node-3-")
    assert request.at == result.findings[0].start and request.drain_at == T0 + 2 * HOUR
    assert request.trends == (f"trend:sbe-rate:GPU-node-3-2:{result.findings[0].start:.3f}",)
    assert result.moves == []  # nothing drained at once: the maintenance would, in its window
    text = render_text(result)
    assert "would schedule a maintenance at 2026-11-01T02:00:00Z" in text
    assert result.summary()["maintenances_scheduled"] == 1


def test_a_quiet_fleet_with_degradation_on_still_jumps_between_changes(tmp_path: Path) -> None:
    result = run(tmp_path, busy_fleet(slow(1, 3, HOUR, 2 * HOUR), hours=48.0), ON)

    assert len(result.findings) == 1
    assert result.steps < 400  # 48 h at 30 s is 5,760 instants: visited only while a hold or clear runs


def test_a_prometheus_history_asks_for_the_detector_series_when_a_policy_enables_it(tmp_path: Path) -> None:
    on, off = loads_policy(ON, "on"), loads_policy("", "off")
    assert cli.history_metrics([off]) == POLICY_METRICS
    assert cli.history_metrics([off, on]) == (*POLICY_METRICS, *DEGRADATION_METRICS)

    scenario = busy_fleet(slow(1, 3, HOUR, 2 * HOUR), rising(2, 5, HOUR, 1.5 * HOUR, pcie_replays=30.0))
    source = PrometheusHistory("http://prometheus.test:9090", metrics=cli.history_metrics([on]),
                               fetcher=_served(scenario, 30.0, {**FIELDS, **DEGRADATION_FIELDS}))
    from_prometheus = replay(source.load(T0, T0 + 6 * HOUR, 30.0, chunk_s=6 * HOUR), on)
    write_scrapes(scenario, tmp_path / "scrapes")
    from_scrapes = replay(load_scrapes(tmp_path / "scrapes"), on)

    assert found(from_prometheus) == found(from_scrapes) and len(from_scrapes.findings) == 2
    assert moves(from_prometheus) == moves(from_scrapes)


def test_the_drivers_recovery_action_is_acted_on_and_a_zero_is_not(tmp_path: Path) -> None:
    verdict = Fault("node-1", 4, T0 + HOUR, T0 + 1.5 * HOUR, {"recovery_action": 1.0})  # GPU_RESET
    result = run(tmp_path, busy_fleet(verdict), "")  # [recovery_action] is on in the built-in policy

    assert [m[2:] for m in moves(result)] == [("healthy", "draining", "recovery-action"),
                                             ("draining", "repairing", "drain-complete"),
                                             ("repairing", "validating", "repair-complete"),
                                             ("validating", "healthy", "validation-passed")]
    assert moves(result)[0][0] == HOUR
    assert result.findings == []  # not a degradation finding: the driver's verdict is a fault


# ---- the synthetic scenario, through the command ------------------------------------------------------------


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("degradation")
    write_all(degradation_fleet(), out)
    return out


def test_the_scenario_replayed_reports_each_kind_and_compares_with_degradation_off(
        scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "off.toml").write_text("")
    args = ["--scrapes", str(scenario / "scrapes"), "--nodes", str(scenario / "nodes.json"),
            "--policy", str(scenario / "policy-degradation.toml"), "--compare", str(tmp_path / "off.toml")]
    assert cli.entry([*args, "--json", str(tmp_path / "out.json"), "--html", str(tmp_path / "out.html")]) == 0
    text = capsys.readouterr().out

    on, off = json.loads((tmp_path / "out.json").read_text())["compare"]
    assert on["summary"]["degradation_findings"] == {"slow-gpu": 1, "link-degraded": 2, "trend": 1}
    assert off["summary"]["degradation_findings"] == {"slow-gpu": 0, "link-degraded": 0, "trend": 0}
    assert on["summary"]["maintenances_scheduled"] == 1 and off["summary"]["maintenances_scheduled"] == 0
    assert {(f["node"], f["kind"], f["code"]) for f in on["degradation_findings"]} == {
        ("gpu-node-003", "slow-gpu", "sm-clock"), ("gpu-node-007", "link-degraded", "pcie"),
        ("gpu-node-009", "link-degraded", "nvlink"), ("gpu-node-011", "trend", "sbe-rate")}
    assert on["summary"]["drains"] == 0 and on["summary"]["cordons"] == 3  # slow GPU and links cordoned, no drain
    assert [m["reason"] for m in on["transitions"]].count("degradation-cleared") == 3  # each lifted on recovery
    assert on["maintenances"][0]["drain_at"] == 1_793_491_200.0 + 6 * 86400 + 2 * HOUR  # Sat 2026-11-07 02:00
    assert off["transitions"] == []

    [row] = [line for line in text.splitlines() if line.strip().startswith("findings: link-degraded")]
    assert row.split()[-2:] == ["2", "0"]
    assert "Degradation findings ([degradation]: slow-gpu 1, link-degraded 2, trend 1)" in text
    page = (tmp_path / "out.html").read_text()
    assert "degradation findings (slow-gpu 1, link-degraded 2, trend 1; 1 maintenance(s))" in page
    assert "<td>findings: slow-gpu</td><td>1</td><td>0</td>" in page


def test_text_and_html_name_each_finding_with_what_its_node_did(tmp_path: Path) -> None:
    result = run(tmp_path, busy_fleet(slow(1, 3, HOUR, 2 * HOUR)), ON)
    text, page = render_text(result), render_html([result])

    line = next(x for x in text.splitlines() if "GPU-node-1-3 (sm-clock" in x)
    assert "cordoned 2026-11-01T01:05:00Z; lifted 2026-11-01T02:10:00Z" in line
    assert "cordoned 2026-11-01T01:05:00Z; lifted 2026-11-01T02:10:00Z" in page
    assert "findings: slow-gpu" in render_compare([result, result])


# ---- sim.history's degradation series ------------------------------------------------------------------------


def test_counters_rise_by_the_minute_and_keep_their_total() -> None:
    scenario = busy_fleet(rising(2, 5, HOUR, 1.5 * HOUR, pcie_replays=30.0), slow(1, 3, HOUR, 2 * HOUR))

    assert gpu_values(scenario, "node-2", 5, T0 + HOUR + 59)["pcie_replays"] == 0
    assert gpu_values(scenario, "node-2", 5, T0 + HOUR + 120)["pcie_replays"] == 60
    assert gpu_values(scenario, "node-2", 5, T0 + 5 * HOUR)["pcie_replays"] == 900  # 30 minutes of 30
    assert gpu_values(scenario, "node-1", 3, T0 + HOUR)["sm_clock"] == 0.6 * FULL_CLOCK
    assert gpu_values(scenario, "node-1", 3, T0 + 2 * HOUR)["sm_clock"] > 0.98 * FULL_CLOCK


def test_the_command_writes_the_degradation_scenario_with_its_policy(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--degradation"]) == 0

    assert "enabled = true" in (tmp_path / "policy-degradation.toml").read_text()
    first = sorted((tmp_path / "scrapes" / "gpu-node-003").iterdir())[0].read_text()
    assert "DCGM_FI_DEV_SM_CLOCK" in first and "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in first
    assert len(json.loads((tmp_path / "nodes.json").read_text())["items"]) == 16
