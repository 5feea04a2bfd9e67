"""Replay of issue 29's workload signal: a history's failed pods fed to the detect loop's WorkloadSignal at their
time, the node whose pods keep failing with GPU errors found and cordoned at the min_pods-th failure within
window_s, an application's own errors not counted, old failures out of the window not counted, nothing with
``[workload]`` off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.workload import KIND_WORKLOAD
from gpuremediate.replay import cli
from gpuremediate.replay.engine import IN_FLIGHT, Replay, replay
from gpuremediate.replay.history import HistoryError, load_pods, load_scrapes
from gpuremediate.replay.result import BELOW_THRESHOLD, ReplayResult
from gpuremediate.replay.text import render_compare, render_text
from sim.history import Fleet, admission_error, container_error, main, node_list, workload_fleet, write_scrapes
from tests.replay.helpers import HOUR, T0, fleet, moves, run, xid

NO_DEVICE = "RuntimeError: No CUDA GPUs are available: no CUDA-capable device is detected"
ILLEGAL_ACCESS = "RuntimeError: CUDA error: an illegal memory access was encountered"
OFF = "[workload]\nenabled = false\n"
# Defaults: min_pods 3, window_s 600, action cordon.


def refused(node: int, *at: float) -> list[dict[str, object]]:
    """Pods refused at admission on node-<node> (a GPU the device plugin cannot hand out), T0+at each."""
    return [admission_error(f"train-{node}-{k}", f"node-{node}", T0 + a) for k, a in enumerate(at)]


def failing(node: int, reason: str, message: str, *at: float, exit_code: int = 1) -> list[dict[str, object]]:
    return [container_error(f"job-{node}-{k}", f"node-{node}", T0 + a, reason, message, exit_code)
            for k, a in enumerate(at)]


def with_pods(*pods: dict[str, object], hours: float = 3.0) -> Fleet:
    scenario = fleet(count=4, hours=hours)
    scenario.pods = list(pods)
    return scenario


def found(result: ReplayResult) -> list[tuple[str, str, str, float, float]]:
    """(node, kind, code, start, end) of each workload finding, seconds after T0."""
    return [(f.node, f.kind, f.code, f.start - T0, f.end - T0) for f in result.workload_findings]


def test_a_node_refusing_pods_is_cordoned_at_the_third_refusal_and_stays_cordoned(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(*refused(2, *(HOUR + k * 150 for k in range(5)))))

    assert moves(result) == [(HOUR + 300, "node-2", "healthy", "cordoned", KIND_WORKLOAD)]  # the 3rd within 600 s
    # found while 3 of them lie within 600 s: the 3rd (HOUR+300) leaves the window after HOUR+900
    assert found(result) == [("node-2", KIND_WORKLOAD, "admission", HOUR + 300, HOUR + 930)]
    [finding] = result.workload_findings
    assert finding.action == "cordon" and not finding.ongoing and finding.gpus == ()
    assert finding.message.startswith("5 pods refused at admission on this node within 600s")  # the most at once
    assert result.final_states() == {"node-2": "cordoned"}  # a person uncordons it: no lift by itself
    assert result.summary()["workload_findings"] == 1 and result.summary()["drains"] == 0
    assert result.summary()["failed_pods"] == {"in_history": 5, "gpu_errors": 5}
    assert result.unacted == []


@pytest.mark.parametrize("min_pods", [1, 2, 5])
def test_the_cordon_comes_at_the_min_pods_th_failure(tmp_path: Path, min_pods: int) -> None:
    result = run(tmp_path, with_pods(*refused(1, *(HOUR + k * 150 for k in range(5)))),
                 f"[workload]\nmin_pods = {min_pods}\n")

    assert moves(result) == [(HOUR + (min_pods - 1) * 150, "node-1", "healthy", "cordoned", KIND_WORKLOAD)]


def test_a_policy_action_other_than_cordon_is_taken(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(*refused(1, HOUR, HOUR + 60, HOUR + 120)), '[workload]\naction = "reboot"\n')

    assert moves(result)[0] == (HOUR + 120, "node-1", "healthy", "draining", KIND_WORKLOAD)
    assert result.summary()["repairs"] == 1


def test_containers_ending_with_a_gpu_error_count(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(*failing(3, "Error", NO_DEVICE, HOUR, HOUR + 90, HOUR + 180)))

    assert moves(result) == [(HOUR + 180, "node-3", "healthy", "cordoned", KIND_WORKLOAD)]
    assert found(result)[0][:3] == ("node-3", KIND_WORKLOAD, "container")
    assert "no CUDA-capable device is detected" in result.workload_findings[0].message


def test_the_applications_own_errors_are_not_counted(tmp_path: Path) -> None:
    pods = [*failing(1, "OOMKilled", "", *(HOUR + k * 60 for k in range(5)), exit_code=137),
            *[container_error(f"cuda-{k}", "node-1", T0 + HOUR + 30 + k * 60, "Error", ILLEGAL_ACCESS)
              for k in range(5)]]
    result = run(tmp_path, with_pods(*pods))

    assert result.moves == [] and result.workload_findings == [] and result.unacted == []
    assert result.summary()["failed_pods"] == {"in_history": 10, "gpu_errors": 0}


def test_failures_older_than_the_window_do_not_count(tmp_path: Path) -> None:
    # 0 and 60 are more than 600 s before 690 and 720: three within the window only at 750
    result = run(tmp_path, with_pods(*refused(2, *(HOUR + a for a in (0, 60, 690, 720, 750)))))

    assert moves(result) == [(HOUR + 750, "node-2", "healthy", "cordoned", KIND_WORKLOAD)]


def test_failures_too_far_apart_are_below_the_threshold(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(*failing(3, "Error", NO_DEVICE, HOUR, HOUR + 400, HOUR + 1100)))

    assert result.moves == [] and result.workload_findings == []
    [early, late] = [u for u in result.unacted if u.category == BELOW_THRESHOLD]
    assert (early.node, early.start - T0, early.end - T0) == ("node-3", HOUR, HOUR + 400)
    assert "2 pods failed with GPU errors, never 3 within 600s" in early.detail
    assert (late.start - T0, late.end - T0) == (HOUR + 1100, HOUR + 1100)


def test_failures_before_the_range_are_listed_at_its_start_and_do_not_count(tmp_path: Path) -> None:
    scenario = with_pods(*refused(1, -2 * HOUR, -2 * HOUR + 60, -2 * HOUR + 120))
    result = run(tmp_path, scenario)

    assert result.moves == [] and result.workload_findings == [] and result.unacted == []


def test_failures_just_before_the_range_count_with_those_in_it(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(*refused(1, -120, -60, 240)))  # the controller's first list has the two

    assert moves(result) == [(240, "node-1", "healthy", "cordoned", KIND_WORKLOAD)]


def test_a_run_going_on_past_the_window_is_one_finding_and_one_cordon(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(*refused(2, *(HOUR + k * 120 for k in range(20)))))  # 40 minutes of them

    assert moves(result) == [(HOUR + 240, "node-2", "healthy", "cordoned", KIND_WORKLOAD)]
    # one finding until the third newest (HOUR+2040) leaves the window: the instant after HOUR+2640
    assert found(result) == [("node-2", KIND_WORKLOAD, "admission", HOUR + 240, HOUR + 17 * 120 + 630)]


def test_workload_off_finds_nothing_and_says_the_pods_were_not_counted(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(*refused(2, *(HOUR + k * 150 for k in range(5)))), OFF)

    assert result.moves == [] and result.workload_findings == [] and result.unacted == []
    assert any("not counted: [workload] is off" in n for n in result.notes)


def test_a_failure_at_the_end_of_a_quiet_stretch_is_fed_at_its_instant(tmp_path: Path) -> None:
    # a quiet fleet jumps from change to change: the pods are changes too (not on the 30 s grid: the next instant)
    result = run(tmp_path, with_pods(*refused(0, *(5 * HOUR + 7 + k * 10 for k in range(3))), hours=6))

    assert moves(result) == [(5 * HOUR + 30, "node-0", "healthy", "cordoned", KIND_WORKLOAD)]


def test_pods_files_load_as_jsonl_or_a_pod_list(tmp_path: Path) -> None:
    pods = refused(1, HOUR, HOUR + 60) + failing(2, "OOMKilled", "", HOUR, exit_code=137)
    (tmp_path / "pods.json").write_text(json.dumps({"kind": "PodList", "items": pods}))
    (tmp_path / "bad.jsonl").write_text('{"kind": "Node"}\n')

    assert load_pods(tmp_path / "pods.json") == pods
    with pytest.raises(HistoryError, match="expected Pod objects"):
        load_pods(tmp_path / "bad.jsonl")

    scenario = with_pods(*pods, *refused(3, 4 * HOUR))  # the last one after the end: dropped
    write_scrapes(scenario, tmp_path / "scrapes")
    history = load_scrapes(tmp_path / "scrapes")
    assert [(p.at - T0, p.node) for p in history.pods] == [(0, ""), (HOUR, "node-1"), (HOUR + 60, "node-1")]
    assert all(set(p.reduced) <= {"metadata", "gpuFailure"} for p in history.pods)  # the watch's reduced form


def test_the_sim_scenario_the_cli_outputs_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--workload"]) == 0
    out = tmp_path / "scrapes"
    assert (out / "pods.jsonl").is_file() and (tmp_path / "policy-workload-off.toml").is_file()
    capsys.readouterr()
    code = cli.entry(["--scrapes", str(out), "--nodes", str(tmp_path / "nodes.json"), "--format", "json",
                      "--html", str(tmp_path / "r.html"), "--compare", str(tmp_path / "policy-workload-off.toml")])
    assert code == 0
    on, off = json.loads(capsys.readouterr().out)["compare"]
    assert on["summary"]["workload_findings"] == 1 and off["summary"]["workload_findings"] == 0
    assert on["summary"]["failed_pods"] == {"in_history": 14, "gpu_errors": 8}
    [finding] = on["workload_findings"]
    assert (finding["node"], finding["code"], finding["start"] - T0) == ("gpu-node-002", "admission", 3 * HOUR + 300)
    assert [(m["node"], m["to_state"]) for m in on["transitions"]] == [("gpu-node-002", "cordoned")]
    assert on["summary"]["unacted"][BELOW_THRESHOLD] == 3  # gpu-node-006's three, 20 minutes apart
    page = (tmp_path / "r.html").read_text()
    assert "workload findings (1; 14 failed pod(s) in the history, 8 with a GPU error)" in page
    assert "<tr><td>findings: workload-gpu-errors</td><td>1</td><td>0</td></tr>" in page
    assert "5 pods refused at admission on this node within 600s" in page

    history = load_scrapes(out)
    nodes = json.loads((tmp_path / "nodes.json").read_text())["items"]
    result = replay(history, loads_policy("", "default"), nodes)
    text = render_text(result)
    assert "Workload findings ([workload]: 1; 14 failed pod(s) in the history, 8 with a GPU error)" in text
    assert "gpu-node-002 (admission, action cordon): cordoned 2026-11-01T03:05:00Z" in text
    assert "findings: workload" in render_compare([result, result])
    assert "gpu-node-004" not in text  # its pods failed of their own errors


def test_pods_given_apart_from_the_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = workload_fleet()
    pods, scenario.pods = scenario.pods, []
    write_scrapes(scenario, tmp_path / "scrapes")
    (tmp_path / "failed.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pods))
    capsys.readouterr()

    assert cli.entry(["--scrapes", str(tmp_path / "scrapes"), "--pods", str(tmp_path / "failed.jsonl")]) == 0
    assert "healthy → cordoned (workload-gpu-errors)" in capsys.readouterr().out


class _TickingEveryCordon(Replay):
    """The engine without its settled-workload-cordon shortcut: every cordoned node seen each interval."""

    def _ticking(self) -> set[str]:
        return {name for name, state in self._states.items() if state in IN_FLIGHT and not self._parked(name)} \
            | {name for name, memory in self.detect.memory.items() if memory.thermal}


def test_a_settled_workload_cordon_is_not_visited_every_interval_and_decides_the_same(tmp_path: Path) -> None:
    scenario = with_pods(*refused(2, HOUR, HOUR + 60, HOUR + 120), *refused(1, 5 * HOUR, 5 * HOUR + 30, 5 * HOUR + 60),
                         hours=8)
    scenario.faults = [xid(2, 3 * HOUR, 3 * HOUR + 1200), xid(1, 6 * HOUR, None)]  # XID 79: reboot, on both nodes
    write_scrapes(scenario, tmp_path / "scrapes")
    nodes = node_list(scenario)["items"]
    history, policy = load_scrapes(tmp_path / "scrapes"), loads_policy("", "default")

    fast = Replay(history, policy, nodes).run()  # type: ignore[arg-type]
    slow = _TickingEveryCordon(load_scrapes(tmp_path / "scrapes"), policy, nodes).run()  # type: ignore[arg-type]

    assert moves(fast)[:2] == [(HOUR + 120, "node-2", "healthy", "cordoned", KIND_WORKLOAD),
                               (3 * HOUR, "node-2", "cordoned", "draining", "xid-79")]
    assert (moves(fast), fast.spans, fast.workload_findings, fast.unacted) == \
        (moves(slow), slow.spans, slow.workload_findings, slow.unacted)
    assert fast.steps < slow.steps / 2


def test_a_node_group_with_workload_off_is_not_counted_while_the_others_are(tmp_path: Path) -> None:
    policy = '[[groups]]\nname = "inference"\nselector = "pool=inference"\n[groups.workload]\nenabled = false\n'
    scenario = with_pods(*refused(1, HOUR, HOUR + 60, HOUR + 120), *refused(2, HOUR, HOUR + 60, HOUR + 120))
    write_scrapes(scenario, tmp_path / "scrapes")
    nodes = node_list(scenario)["items"]
    nodes[1]["metadata"]["labels"]["pool"] = "inference"  # type: ignore[index]

    result = replay(load_scrapes(tmp_path / "scrapes"), loads_policy(policy, "groups"), nodes)  # type: ignore[arg-type]

    assert moves(result) == [(HOUR + 120, "node-2", "healthy", "cordoned", KIND_WORKLOAD)]
    assert [f.node for f in result.workload_findings] == ["node-2"] and result.unacted == []
