"""`gpuremediate replay` end to end on saved scrapes: text, JSON, HTML, --compare, bad input."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuremediate.replay import cli
from gpuremediate.replay.html import COLORS
from gpuremediate.vocab import states
from sim.history import node_list, write_scrapes
from tests.replay.helpers import HOUR, T0, fleet, xid

STRICT = '[budget]\nmax_unavailable = "1"\n'


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    scenario = fleet(count=8, faults=[xid(0, 600, 2 * HOUR), xid(1, 660, 2 * HOUR)],
                     down=[("node-5", T0 + HOUR, T0 + 2 * HOUR)])
    write_scrapes(scenario, tmp_path / "scrapes")
    (tmp_path / "nodes.json").write_text(json.dumps(node_list(scenario)))
    (tmp_path / "strict.toml").write_text(STRICT)
    return tmp_path


def replay_cli(*argv: str) -> int:
    return cli.entry(list(argv))


def test_text_shows_the_timeline_and_the_totals(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay_cli("--scrapes", str(saved / "scrapes"), "--nodes", str(saved / "nodes.json")) == 0
    out = capsys.readouterr().out

    assert "8 GPU nodes (64 GPUs)" in out
    assert "2026-11-01T00:10:00Z  healthy → draining (xid-79)" in out
    assert "2026-11-01T00:45:00Z  validating → healthy (validation-passed)" in out
    assert re.search(r"node-5: exporter unreachable", out)
    assert re.search(r"total\s+1\.17\s+9\.33", out)  # two nodes, 35 min each, 8 GPUs


def test_compare_puts_two_policies_side_by_side(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--scrapes", str(saved / "scrapes"), "--nodes", str(saved / "nodes.json"),
            "--compare", str(saved / "strict.toml")]
    assert replay_cli(*args, "--format", "json") == 0
    default, strict = json.loads(capsys.readouterr().out)["compare"]

    assert default["policy"] == "<defaults>" and strict["policy"].endswith("strict.toml")
    assert default["summary"]["budget_waits"] == 0 and strict["summary"]["budget_waits"] == 1
    assert strict["summary"]["node_hours_out_of_service"] > default["summary"]["node_hours_out_of_service"]

    assert replay_cli(*args) == 0
    text = capsys.readouterr().out
    assert text.startswith("Compare on the same history")
    assert re.search(r"budget_waits\s+0\s+1", text)
    assert "node-1" in text.split("Nodes treated differently")[1].split("====")[0]


def test_the_html_page_is_self_contained_with_one_row_per_affected_node(saved: Path) -> None:
    page = saved / "replay.html"
    assert replay_cli("--scrapes", str(saved / "scrapes"), "--nodes", str(saved / "nodes.json"),
                      "--compare", str(saved / "strict.toml"), "--html", str(page)) == 0
    html = page.read_text()

    assert html.count("<script") == 1 and "<script src" not in html  # the inline range script, nothing fetched
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "").replace(
        '"http://www.w3.org/2000/svg"', "")
    timeline = html.split('<h2 id="timeline">', 1)[1]  # the zoomed views (hidden until chosen) come before it
    svgs = [ET.fromstring(s) for s in re.findall(r"<svg.*?</svg>", timeline, re.S)]
    assert len(svgs) == 2  # one pane per policy, same rows
    ns = "{http://www.w3.org/2000/svg}"
    for svg in svgs:
        rows = [t.text for t in svg.iter(f"{ns}text") if t.text and t.text.startswith("node-")]
        assert rows == ["node-0", "node-1", "node-5"]  # node-5: its unknown stretch is drawn
        bars = [r for r in svg.iter(f"{ns}rect")]
        assert all(r.find(f"{ns}title") is not None for r in bars)
        assert {r.get("fill") for r in bars} >= {COLORS[states.DRAINING], COLORS[states.REPAIRING],
                                                 COLORS[states.VALIDATING]}
    for state in (states.DRAINING, states.REPAIRING, states.VALIDATING, states.QUARANTINED):
        assert f"</i>{state}</span>" in html  # the legend


def test_json_file_and_stdout_agree(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = saved / "r.json"
    assert replay_cli("--scrapes", str(saved / "scrapes"), "--format", "json", "--json", str(out)) == 0
    printed = json.loads(capsys.readouterr().out)

    assert printed == json.loads(out.read_text())
    assert [t["to_state"] for t in printed["transitions"] if t["node"] == "node-0"] == [
        "draining", "repairing", "validating", "healthy"]
    assert printed["summary"]["unacted"]["unknown"] == 1


@pytest.mark.parametrize(("argv", "message"), [
    ([], "exactly one of --prometheus URL or --scrapes DIR"),
    (["--scrapes", "/nonexistent/replay"], "not a folder of saved scrapes"),
    (["--prometheus", "http://127.0.0.1:9"], "--prometheus needs --from and --to"),
    (["--prometheus", "ftp://x", "--from", "0", "--to", "60"], "must be http(s)://"),
    (["--scrapes", "SCRAPES", "--from", "yesterday"], "neither unix seconds nor an RFC 3339 time"),
    (["--scrapes", "SCRAPES", "--policy", "BADPOLICY"], "unknown key"),
    (["--scrapes", "SCRAPES", "--nodes", "BADNODES"], "expected `kubectl get nodes -o json` output"),
])
def test_bad_input_is_one_clear_line_and_exit_2(saved: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                                message: str) -> None:
    (saved / "bad.toml").write_text("[nonsense]\nx = 1\n")
    (saved / "bad.json").write_text(json.dumps({"kind": "PodList", "items": [{"kind": "Pod"}]}))
    subst = {"SCRAPES": str(saved / "scrapes"), "BADPOLICY": str(saved / "bad.toml"),
             "BADNODES": str(saved / "bad.json")}
    assert replay_cli(*[subst.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuremediate replay: ") and message in err


def test_add_parser_wires_the_subcommand() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="gpuremediate")
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    args = parser.parse_args(["replay", "--scrapes", "d", "--step", "1m", "--drain-time", "2h"])

    assert (args.command, args.scrapes, args.step, args.drain_time) == ("replay", "d", 60.0, 7200.0)


def test_the_node_list_from_a_cluster_gives_groups_and_exclusions(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from gpuremediate.kube.client import KubeClient
    from gpuremediate.kube.config import load_config
    from gpuremediate.kube.resources import NODES
    from sim.kubeapi import KubeAPIServer

    scenario = fleet(count=3, faults=[xid(0, 600, HOUR), xid(1, 600, HOUR), xid(2, 600, HOUR)])
    write_scrapes(scenario, tmp_path / "scrapes")
    (tmp_path / "groups.toml").write_text('[[groups]]\nname = "inference"\nselector = "pool=inference"\n'
                                          '[groups.xid.overrides]\n79 = "cordon"\n')
    srv = KubeAPIServer().start()
    try:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        client = KubeClient(load_config(kubeconfig))
        for name, labels in (("node-0", {}), ("node-1", {"pool": "inference"}),
                             ("node-2", {"gpuremediate.io/exclude": "true"})):
            client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                                  "status": {"capacity": {"nvidia.com/gpu": "4"}}})
        client.close()
        assert replay_cli("--scrapes", str(tmp_path / "scrapes"), "--kubeconfig", str(kubeconfig),
                          "--policy", str(tmp_path / "groups.toml"), "--format", "json") == 0
    finally:
        srv.stop()
    result = json.loads(capsys.readouterr().out)

    firsts = {t["node"]: t["to_state"] for t in reversed(result["transitions"])}
    assert firsts == {"node-0": "draining", "node-1": "cordoned"}  # the group's override; node-2 excluded
    assert [u["node"] for u in result["not_acted_on"] if u["category"] == "excluded"] == ["node-2"]
    assert result["summary"]["gpus"] == 12  # the Nodes' capacity, not the 8 GPUs in the scrapes
