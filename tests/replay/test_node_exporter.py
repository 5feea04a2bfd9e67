"""The replay plays node_exporter's InfiniBand series (``[network] prometheus``, issue 45) as the controller reads
them: from saved node_exporter scrapes (``DIR/node_exporter/``) and from Prometheus range queries, judged by the
detect loop's own judge (cordon with the NIC taint, lifted once the link is back, the span naming the NIC)."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.network import NIC_TAINT_KEY
from gpuremediate.replay.engine import Replay, ReplayOptions, replay
from gpuremediate.replay.history import History, load_scrapes
from gpuremediate.replay.prometheus import PrometheusHistory
from gpuremediate.replay.result import ReplayResult
from gpuremediate.signals.sources import POLICY_METRICS
from sim.history import node_list, write_scrapes
from tests.replay.helpers import HOUR, T0, fleet, moves
from tests.replay.test_prometheus import _served

# node_exporter's own e2e output (tests/signals/data/prometheus-fixtures/README.md): mlx4_0 ports 1 and 2 and
# i40iw0 port 1, all ACTIVE / LinkUp, error counters 0.
REAL = (Path(__file__).parents[1] / "signals" / "data" / "prometheus-fixtures" /
        "node_exporter-e2e-output-infiniband.txt").read_text(encoding="utf-8")
ON = "[network]\nprometheus = true\n"
HELD = ON + "stuck_down_after_s = 86400\n"  # a port down an hour stays a cordon (not the stuck-down reboot)
STEP = 30.0


def edited(text: str = REAL, labels: str = "", **values: str) -> str:
    """The real output with ``series{device="mlx4_0",port="1"}`` set to the given values (name less prefix), and
    ``labels`` added to every sample (a fleet-wide dump's instance)."""
    for name, value in values.items():
        text, count = re.subn(rf'^(node_infiniband_{name}\{{device="mlx4_0",port="1"\}}) \S+$', rf"\g<1> {value}",
                              text, flags=re.M)
        assert count == 1, name
    if labels:
        text = re.sub(r'^(node_infiniband_\w+\{)', rf"\g<1>{labels},", text, flags=re.M)
    return text


def saved(tmp: Path, files: dict[str, str], hours: float = 6.0) -> tuple[Path, list[dict[str, object]]]:
    """A saved-scrapes folder of a 4-node fleet with ``files`` (path under node_exporter/ → text)."""
    scenario = fleet(4, hours=hours)
    folder = tmp / "scrapes"
    write_scrapes(scenario, folder)
    for path, text in files.items():
        (folder / "node_exporter" / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / "node_exporter" / path).write_text(text, encoding="utf-8")
    return folder, node_list(scenario)["items"]


def run(folder: Path, nodes: list[dict[str, object]], policy: str = ON) -> ReplayResult:
    return replay(load_scrapes(folder), loads_policy(policy, "p"), nodes, ReplayOptions(step_s=STEP))


DOWN = {"state_id": "1", "physical_state_id": "2"}  # DOWN, Polling: the cable pulled


def test_a_port_down_in_saved_scrapes_is_cordoned_with_its_taint_and_lifted_when_back(tmp_path: Path) -> None:
    folder, nodes = saved(tmp_path, {f"node-1/{T0:.0f}.prom": REAL, f"node-1/{T0 + HOUR:.0f}.prom": edited(**DOWN),
                                     f"node-1/{T0 + 2 * HOUR:.0f}.prom": REAL})
    engine = Replay(load_scrapes(folder), loads_policy(HELD, "p"), nodes, ReplayOptions(step_s=STEP))
    result = engine.run()
    # lifted once the link has been back for [network] clear_after_s (60 s)
    assert [(at, to) for at, _, _, to, _ in moves(result, "node-1")] == [(HOUR, "cordoned"), (2 * HOUR + 60, "healthy")]
    [span] = [s for s in result.spans if s.node == "node-1"]
    assert (span.state, span.start - T0, span.end - T0, span.fault) == ("cordoned", HOUR, 2 * HOUR + 60,
                                                                         "nic-down mlx4_0")
    assert "nic-down mlx4_0/1: state DOWN, phys_state Polling" in result.moves[0].message
    assert not [m for m in result.moves if m.node != "node-1"]
    taints = engine.cluster.nodes["node-1"]["spec"].get("taints") or []
    assert not [t for t in taints if t["key"] == NIC_TAINT_KEY]  # lifted with the cordon


def test_the_nic_taint_is_on_while_the_port_stays_down(tmp_path: Path) -> None:
    folder, nodes = saved(tmp_path, {f"node-0/{T0:.0f}.prom": REAL, f"node-0/{T0 + HOUR:.0f}.prom": edited(**DOWN)},
                          hours=1.1)  # ends before stuck_down_after_s (900 s) would make it a reboot
    engine = Replay(load_scrapes(folder), loads_policy(ON, "p"), nodes, ReplayOptions(step_s=STEP))
    result = engine.run()
    assert [(m.at - T0, m.to_state) for m in result.moves] == [(HOUR, "cordoned")]
    taints = engine.cluster.nodes["node-0"]["spec"].get("taints") or []
    assert {"key": NIC_TAINT_KEY, "value": "mlx4_0", "effect": "NoSchedule"} in \
        [{k: t[k] for k in ("key", "value", "effect")} for t in taints]


def test_flapping_lifts_when_the_downs_leave_the_window(tmp_path: Path) -> None:
    files = {f"node-2/{T0:.0f}.prom": REAL}
    for k, at in enumerate((HOUR, HOUR + 60, HOUR + 120), start=1):
        files[f"node-2/{T0 + at:.0f}.prom"] = edited(link_downed_total=str(k))
    result = run(*saved(tmp_path, files))
    # Three downs within window_s (600 s) by HOUR+120; at HOUR+600 the sample at or before the window's start is
    # HOUR's (1): a rise of 2, below flap_count; lifted clear_after_s (60 s) later. Only a judge called every
    # interval, as the controller's is, keeps that baseline.
    [span] = [s for s in result.spans if s.node == "node-2"]
    assert (span.start - T0, span.end - T0, span.fault) == (HOUR + 120, HOUR + 660, "nic-flapping mlx4_0")


def test_a_fleet_wide_dump_places_series_by_instance(tmp_path: Path) -> None:
    at = T0 + 2 * HOUR
    fleet_dump = "\n".join(edited(labels=f'instance="node-{i}:9100"') for i in range(4))
    down_dump = "\n".join(edited(labels=f'instance="node-{i}:9100"', **(DOWN if i == 3 else {})) for i in range(4))
    folder, nodes = saved(tmp_path, {f"{T0:.0f}.prom": fleet_dump, f"{at:.0f}.prom": down_dump})
    result = run(folder, nodes, HELD)
    assert [(m.node, m.at - T0, m.to_state) for m in result.moves] == [("node-3", 2 * HOUR, "cordoned")]


def test_node_exporter_is_not_a_node(tmp_path: Path) -> None:
    folder, _ = saved(tmp_path, {f"node-1/{T0:.0f}.prom": REAL})
    history = load_scrapes(folder)
    assert "node_exporter" not in history.nodes and list(history.network) == ["node-1"]
    [(_, readings)] = history.network["node-1"]
    assert readings is not None and [n.device for n in readings.nics] == ["i40iw0", "mlx4_0"]


def test_without_network_prometheus_the_readings_are_a_note(tmp_path: Path) -> None:
    folder, nodes = saved(tmp_path, {f"node-1/{T0:.0f}.prom": REAL, f"node-1/{T0 + HOUR:.0f}.prom": edited(**DOWN)})
    result = run(folder, nodes, policy="")
    assert result.moves == []
    assert any("node_exporter InfiniBand readings for 1 node(s) not judged" in n for n in result.notes)


def test_an_unreadable_node_exporter_keeps_the_finding(tmp_path: Path) -> None:
    """A gap in node_exporter is not a link back up (the controller keeps a node's NIC findings while nothing is
    read for it)."""
    folder, nodes = saved(tmp_path, {f"node-1/{T0:.0f}.prom": REAL, f"node-1/{T0 + HOUR:.0f}.prom": edited(**DOWN),
                                     f"node-1/{T0 + 2 * HOUR:.0f}.unknown": "connection refused",
                                     f"node-1/{T0 + 3 * HOUR:.0f}.prom": REAL}, hours=4.0)
    result = run(folder, nodes, policy=HELD)
    assert [(at, to) for at, _, _, to, _ in moves(result, "node-1")] == [(HOUR, "cordoned"), (3 * HOUR + 60, "healthy")]


# ---- from Prometheus ---------------------------------------------------------------------------------------------

NIC_QUERY = re.compile(r"max by \(([^)]*)\) \((node_infiniband_\w+)\)")


def _with_nics(gpus: Callable[[str], bytes], down: tuple[float, float]) -> Callable[[str], bytes]:
    """``gpus`` (the dcgm-exporter stand-in) plus node_exporter's series of the real output on every node, node-1's
    mlx4_0/1 DOWN within ``down``; each NIC query's answer as Prometheus gives one: ``max by`` drops the name."""
    real = {(m.group(1), m.group(2), m.group(3)): float(m.group(4)) for m in re.finditer(
        r'^(node_infiniband_\w+)\{device="(\w+)",port="(\d+)"\} (\S+)$', REAL, flags=re.M)}
    nic_calls: list[dict[str, str]] = []

    def fetch(url: str) -> bytes:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        match = NIC_QUERY.fullmatch(query["query"])
        if match is None:
            return gpus(url)
        nic_calls.append(query)
        assert match.group(1) == "Hostname, hostname, node, kubernetes_node, instance, device, port"
        metric, result = match.group(2), []
        start, end, step = float(query["start"]), float(query["end"]), float(query["step"])
        times = [start + k * step for k in range(int((end - start) // step) + 1)]
        for node in (f"node-{i}" for i in range(4)):
            for (name, device, port), value in real.items():
                if name != metric:
                    continue
                series = []
                for t in times:
                    is_down = node == "node-1" and (device, port) == ("mlx4_0", "1") and down[0] <= t < down[1]
                    got = {"node_infiniband_state_id": 1.0, "node_infiniband_physical_state_id": 2.0}.get(
                        name, value) if is_down else value
                    series.append([t, f"{got:g}"])
                result.append({"metric": {"instance": f"{node}:9100", "device": device, "port": port},
                               "values": series})
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()

    fetch.nic_calls = nic_calls  # type: ignore[attr-defined]
    return fetch


def test_range_queries_of_node_exporters_series_replay_as_the_saved_scrapes(tmp_path: Path) -> None:
    scenario = fleet(4, hours=6.0)
    fetch = _with_nics(_served(scenario, STEP), (T0 + HOUR, T0 + 2 * HOUR))
    source = PrometheusHistory("http://prometheus.test:9090", fetcher=fetch,
                               network_counters=("link_downed", "symbol_error"))
    history = source.load(T0, T0 + 6 * HOUR, STEP, chunk_s=HOUR)
    nic_queries = {q["query"] for q in fetch.nic_calls}  # type: ignore[attr-defined]
    assert {NIC_QUERY.fullmatch(q).group(2) for q in nic_queries} == {  # type: ignore[union-attr]
        "node_infiniband_state_id", "node_infiniband_physical_state_id", "node_infiniband_rate_bytes_per_second",
        "node_infiniband_link_downed_total", "node_infiniband_symbol_error_total"}
    assert source.queries == (len(POLICY_METRICS) + 5) * 7  # every series in the replay's chunks
    assert [at - T0 for at, _ in history.network["node-1"]] == [0, HOUR, 2 * HOUR]
    assert len(history.network["node-0"]) == 1

    from_prometheus = replay(history, loads_policy(HELD, "p"), node_list(scenario)["items"],
                             ReplayOptions(step_s=STEP))
    folder, nodes = saved(tmp_path, {f"node-1/{T0:.0f}.prom": REAL, f"node-1/{T0 + HOUR:.0f}.prom": edited(**DOWN),
                                     f"node-1/{T0 + 2 * HOUR:.0f}.prom": REAL})
    from_scrapes = run(folder, nodes, HELD)
    assert moves(from_prometheus) == moves(from_scrapes) and len(from_prometheus.moves) == 2
    assert [s.fault for s in from_prometheus.spans] == ["nic-down mlx4_0"]


def test_no_nic_query_without_network_prometheus() -> None:
    scenario = fleet(2, hours=1.0)
    fetch = _with_nics(_served(scenario, STEP), (0, 0))
    history = PrometheusHistory("http://p:9090", fetcher=fetch).load(T0, T0 + HOUR, STEP)
    assert fetch.nic_calls == [] and history.network == {}  # type: ignore[attr-defined]
    assert isinstance(history, History)


def test_a_port_down_past_the_hold_escalates_to_the_stuck_down_action(tmp_path: Path) -> None:
    folder, nodes = saved(tmp_path, {f"node-1/{T0:.0f}.prom": REAL, f"node-1/{T0 + HOUR:.0f}.prom": edited(**DOWN)},
                          hours=3.0)
    result = run(folder, nodes)  # stuck_down_after_s 900, stuck_down_action reboot
    states = [to for _, _, _, to, _ in moves(result, "node-1")]
    # cordoned, then straight to the drain: the escalated finding is no clearing (it once uncordoned the node for
    # an interval, as "thermal-cleared", before the drain)
    assert states[:3] == ["cordoned", "draining", "repairing"], moves(result, "node-1")
    assert {s.fault for s in result.spans} == {"nic-down mlx4_0"}


def test_the_command_reads_node_exporter_scrapes_under_the_policy(tmp_path: Path) -> None:
    from gpuremediate.replay.cli import entry

    folder, nodes = saved(tmp_path, {f"node-1/{T0:.0f}.prom": REAL, f"node-1/{T0 + HOUR:.0f}.prom": edited(**DOWN)},
                          hours=2.0)
    (tmp_path / "nodes.json").write_text(json.dumps({"kind": "NodeList", "items": nodes}), encoding="utf-8")
    (tmp_path / "policy.toml").write_text(HELD, encoding="utf-8")
    out = tmp_path / "out.json"
    assert entry(["--scrapes", str(folder), "--nodes", str(tmp_path / "nodes.json"), "--policy",
                  str(tmp_path / "policy.toml"), "--format", "json", "--json", str(out)]) == 0
    spans = json.loads(out.read_text())["out_of_service"]
    assert [(s["node"], s["fault"]) for s in spans] == [("node-1", "nic-down mlx4_0")]
