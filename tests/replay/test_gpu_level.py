"""Replay under ``[isolation] scope = "gpu"`` (issue 26): the replay's cluster serves DRA (slices, the workload's
claim, DeviceTaintRules with the eviction on NoExecute), and the result counts one GPU out for a GPU-level flow."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpuremediate.policy.config import loads_policy
from gpuremediate.replay.cluster import Durations
from gpuremediate.replay.engine import Replay, ReplayOptions
from gpuremediate.replay.history import load_scrapes
from gpuremediate.replay.result import ReplayResult, Span
from gpuremediate.replay.text import render_text
from gpuremediate.vocab import states
from sim.history import FAULT_MIX, GPUS, Fleet, catalog_fleet, node_list, write_scrapes
from tests.replay.helpers import HOUR, fleet, moves, run, xid

GPU_LEVEL = '[isolation]\nscope = "gpu"\n'
# Default simulated durations: drain 10 min, reset-gpu 5 min, validation 10 min: a reset flow is 25 min.
RESET_FLOW_S = 600 + 300 + 600


def replay_of(tmp: Path, scenario: Fleet, policy: str) -> Replay:
    write_scrapes(scenario, tmp / "scrapes")
    nodes = node_list(scenario)["items"]
    engine = Replay(load_scrapes(tmp / "scrapes"), loads_policy(policy, "test"), nodes,  # type: ignore[arg-type]
                    ReplayOptions(step_s=30.0))
    engine.run()
    return engine


def test_an_xid_48_takes_one_gpu_out_and_the_node_stays_schedulable(tmp_path: Path) -> None:
    engine = replay_of(tmp_path, fleet(faults=[xid(1, 600, 3 * HOUR, code=48, gpu=3)]), GPU_LEVEL)
    result = engine.result

    assert [m[2:] for m in moves(result)] == [("healthy", "draining", "xid-48"), ("draining", "repairing",
                                               "drain-complete"), ("repairing", "validating", "repair-complete"),
                                              ("validating", "healthy", "validation-passed")]
    assert {s.gpus for s in result.spans} == {1}
    assert result.gpu_hours() == pytest.approx(RESET_FLOW_S / 3600)  # one GPU, not eight
    assert result.gpu_level_flows() == 1
    dra = engine.cluster.dra
    assert dra is not None and dra.created == 1 and dra.rules == {}  # written, then deleted once validated
    assert not engine.cluster.nodes["node-1"]["spec"].get("unschedulable")
    assert engine.cluster.evicted == {}  # its workload came back when the node was healthy again


def test_the_same_history_node_level_costs_eight_times_the_gpu_hours(tmp_path: Path) -> None:
    scenario = fleet(faults=[xid(1, 600, 3 * HOUR, code=48, gpu=3)])
    node_level = run(tmp_path / "node", scenario)
    gpu_level = run(tmp_path / "gpu", scenario, GPU_LEVEL)

    assert node_level.gpu_hours() == pytest.approx(GPUS * gpu_level.gpu_hours())
    assert node_level.gpu_hours_by_fault() == {"xid 48": pytest.approx(GPUS * RESET_FLOW_S / 3600)}
    assert gpu_level.summary()["gpu_hours_by_fault"] == {"xid 48": round(RESET_FLOW_S / 3600, 3)}


def test_the_gpu_pod_is_evicted_by_the_no_execute_rule_and_the_drain_waits_for_it(tmp_path: Path) -> None:
    result = run(tmp_path, fleet(faults=[xid(1, 600, 3 * HOUR, code=48, gpu=3)]), GPU_LEVEL)

    drained = next(m for m in result.moves if m.to_state == states.REPAIRING)
    assert drained.at - result.start == 600 + 600  # the workload pod's termination (10 min) is the drain


def test_a_reboot_fault_stays_node_level(tmp_path: Path) -> None:
    engine = replay_of(tmp_path, fleet(faults=[xid(1, 600, 3 * HOUR, code=79, gpu=3)]), GPU_LEVEL)

    assert {s.gpus for s in engine.result.spans} == {None}
    assert engine.result.gpu_level_flows() == 0
    assert engine.cluster.dra is not None and engine.cluster.dra.created == 0


def test_a_second_gpu_failing_escalates_to_the_node(tmp_path: Path) -> None:
    scenario = fleet(faults=[xid(1, 600, 3 * HOUR, code=48, gpu=3), xid(1, 1500, 3 * HOUR, code=48, gpu=5)])
    result = run(tmp_path, scenario, GPU_LEVEL)

    spans = [(s.state, s.gpus) for s in result.spans]
    assert spans[0] == (states.DRAINING, 1) and (states.DRAINING, None) in spans  # widened mid-flow
    assert result.gpu_hours() > RESET_FLOW_S / 3600 * 2  # the node was out as a whole after the escalation
    assert moves(result)[-1][3] == states.HEALTHY


def test_the_default_policy_serves_no_dra_in_the_replay(tmp_path: Path) -> None:
    engine = replay_of(tmp_path, fleet(faults=[xid(1, 600, 3 * HOUR, code=48, gpu=3)]), "")

    assert engine.cluster.dra is None
    assert {s.gpus for s in engine.result.spans} == {None}


def test_catalog_fleet_draws_its_faults_from_the_mix_at_the_rate_and_by_seed() -> None:
    first = catalog_fleet(100, 30.0, per_1000_gpu_days=2.0, seed=5)
    again = catalog_fleet(100, 30.0, per_1000_gpu_days=2.0, seed=5)
    other = catalog_fleet(100, 30.0, per_1000_gpu_days=2.0, seed=6)

    assert first.faults == again.faults != other.faults
    assert len(first.faults) == round(2.0 * 100 * GPUS * 30 / 1000)
    codes = Counter(int(f.values["xid"]) for f in first.faults)
    assert set(codes) <= {code for code, _ in FAULT_MIX}
    assert all(first.start <= f.at < (f.until or 0) <= first.end for f in first.faults)


def test_gpu_hours_of_a_gpu_span_never_exceed_the_node(tmp_path: Path) -> None:
    result = ReplayResult(policy="p", start=0.0, end=10.0, step_s=1.0, gpus={"n": 1})
    result.spans = [Span("n", states.DRAINING, 0.0, 3600.0, gpus=4, fault="xid 48")]
    assert result.gpu_hours() == pytest.approx(1.0)


def test_durations_shorter_repairs_shrink_the_gpu_level_flow(tmp_path: Path) -> None:
    scenario = fleet(faults=[xid(1, 600, 3 * HOUR, code=48, gpu=3)])
    write_scrapes(scenario, tmp_path / "scrapes")
    fast = Durations(drain_s=60.0, reset_gpu_s=60.0, validate_s=60.0)
    engine = Replay(load_scrapes(tmp_path / "scrapes"), loads_policy(GPU_LEVEL, "t"),
                    node_list(scenario)["items"], ReplayOptions(step_s=30.0, durations=fast))  # type: ignore[arg-type]
    result = engine.run()
    assert result.gpu_hours() == pytest.approx(180 / 3600, abs=60 / 3600)  # within a step of the three Jobs


def test_the_text_output_shows_gpu_hours_by_fault_and_the_gpu_level_flows(tmp_path: Path) -> None:
    text = render_text(run(tmp_path, fleet(faults=[xid(1, 600, 3 * HOUR, code=48, gpu=3)]), GPU_LEVEL))
    assert "GPU-hours by fault" in text and "GPU-level flows: 1" in text
    assert any(line.split() == ["xid", "48", f"{RESET_FLOW_S / 3600:.2f}"] for line in text.splitlines())


def test_gpu_level_flows_share_one_node_slot_of_the_budget(tmp_path: Path) -> None:
    """Budget 1 node: three GPU-level faults at once run together (3/8 of a slot); node-level, they queue."""
    faults = [xid(k, 600 + 30 * k, 3 * HOUR, code=48, gpu=k) for k in range(3)]
    budget = '[budget]\nmax_unavailable = "1"\n'
    gpu_level = run(tmp_path / "gpu", fleet(count=20, faults=faults), budget + GPU_LEVEL)
    node_level = run(tmp_path / "node", fleet(count=20, faults=faults), budget)

    assert gpu_level.waits == []
    assert [m.to_state for m in gpu_level.moves].count(states.HEALTHY) == 3
    assert max(s.end for s in gpu_level.spans) - gpu_level.start < 600 + 90 + RESET_FLOW_S + 120
    assert {w.node for w in node_level.waits if w.reason == "budget"} == {"node-1", "node-2"}
    assert gpu_level.gpu_hours() == pytest.approx(3 * RESET_FLOW_S / 3600, rel=0.05)
