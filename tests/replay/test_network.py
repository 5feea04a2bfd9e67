"""The replay plays the node agent's NIC findings (GPUNetworkHealthy, issue 45) from the history's conditions.jsonl as
it plays GPU faults: cordon with the NIC taint, lifted when the link is back, the span naming the NIC."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.network import NIC_TAINT_KEY
from gpuremediate.replay.engine import Replay, ReplayOptions, replay
from gpuremediate.replay.history import HistoryError, load_conditions, load_scrapes
from gpuremediate.replay.result import ReplayResult
from sim.history import node_list, write_scrapes
from tests.replay.helpers import HOUR, T0, fleet, moves

RAIL = "GPU-00000000-0000-0000-0000-00000000000a"


def condition(at: float, node: str, status: str, reason: str, message: str = "") -> str:
    return json.dumps({"time": T0 + at, "node": node, "type": "GPUNetworkHealthy", "status": status,
                       "reason": reason, "message": message})


def replayed(tmp: Path, lines: list[str], policy: str = "") -> ReplayResult:
    scenario = fleet(4, hours=6.0)
    folder = tmp / "scrapes"
    write_scrapes(scenario, folder)
    (folder / "conditions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return replay(load_scrapes(folder), loads_policy(policy, "p"), node_list(scenario)["items"],
                  ReplayOptions(step_s=30.0))


def test_a_nic_down_is_cordoned_with_its_taint_and_lifted_when_the_link_is_back(tmp_path: Path) -> None:
    down = f"nic-down mlx5_3/1: state DOWN, phys_state Polling; GPUs on its rail: {RAIL} → cordon"
    result = replayed(tmp_path, [
        condition(0, "node-1", "True", "PortsHealthy", "8 ports"),
        condition(HOUR, "node-1", "False", "NicDown:mlx5_3", down),
        condition(2 * HOUR, "node-1", "True", "PortsHealthy", "8 ports"),
    ])
    got = moves(result, "node-1")
    assert [(at, to) for at, _, _, to, _ in got] == [(HOUR, "cordoned"), (2 * HOUR, "healthy")]
    [span] = [s for s in result.spans if s.node == "node-1"]
    assert (span.state, span.start - T0, span.end - T0, span.fault) == ("cordoned", HOUR, 2 * HOUR, "nic-down mlx5_3")
    assert not [m for m in result.moves if m.node != "node-1"]  # the others' agents said nothing wrong


def test_the_nic_taint_is_on_the_replayed_node_while_held(tmp_path: Path) -> None:
    scenario = fleet(2, hours=3.0)
    folder = tmp_path / "scrapes"
    write_scrapes(scenario, folder)
    (folder / "conditions.jsonl").write_text(condition(HOUR, "node-0", "False", "NicFlapping:mlx5_0",
                                                       "nic-flapping mlx5_0/1: the link went down 3 times → cordon"))
    engine = Replay(load_scrapes(folder), loads_policy("", "p"), node_list(scenario)["items"],
                    ReplayOptions(step_s=30.0))
    result = engine.run()
    assert [(m.at - T0, m.to_state) for m in result.moves] == [(HOUR, "cordoned")]
    taints = engine.cluster.nodes["node-0"]["spec"].get("taints") or []
    assert {"key": NIC_TAINT_KEY, "value": "mlx5_0", "effect": "NoSchedule"} in \
        [{k: t[k] for k in ("key", "value", "effect")} for t in taints]


def test_a_condition_for_a_node_not_replayed_is_a_note(tmp_path: Path) -> None:
    result = replayed(tmp_path, [condition(HOUR, "node-9", "False", "NicDown:mlx5_0", "nic-down mlx5_0/1: x → cordon")])
    assert result.moves == []
    assert any("node conditions for 1 node(s) not replayed" in n and "node-9" in n for n in result.notes)


@pytest.mark.parametrize(("line", "said"), [
    ("{", "not JSON"),
    ('{"time": 1, "node": "n", "type": "GPUNetworkHealthy"}', "'status' missing"),
    ('{"time": 1, "node": "n", "type": "GPUNetworkHealthy", "status": "false"}', "status 'false' is none of"),
    ('{"time": "yesterday", "node": "n", "type": "T", "status": "True"}', "neither unix seconds"),
])
def test_a_bad_line_is_named_with_its_file_and_line(tmp_path: Path, line: str, said: str) -> None:
    path = tmp_path / "conditions.jsonl"
    path.write_text("\n" + line + "\n", encoding="utf-8")
    with pytest.raises(HistoryError, match=said) as caught:
        load_conditions(path)
    assert f"{path}:2" in str(caught.value)


def test_the_command_reads_conditions_from_a_file(tmp_path: Path) -> None:
    from gpuremediate.replay.cli import entry

    scenario = fleet(2, hours=3.0)
    write_scrapes(scenario, tmp_path / "scrapes")
    (tmp_path / "nodes.json").write_text(json.dumps(node_list(scenario)), encoding="utf-8")
    (tmp_path / "c.jsonl").write_text(condition(HOUR, "node-0", "False", "NicDown:mlx5_0",
                                                "nic-down mlx5_0/1: state DOWN → cordon"))
    out = tmp_path / "out.json"
    assert entry(["--scrapes", str(tmp_path / "scrapes"), "--nodes", str(tmp_path / "nodes.json"),
                  "--conditions", str(tmp_path / "c.jsonl"), "--format", "json", "--json", str(out)]) == 0
    spans = json.loads(out.read_text())["out_of_service"]
    assert [(s["node"], s["fault"]) for s in spans] == [("node-0", "nic-down mlx5_0")]
