"""The conventions people expect of a kubectl-era CLI: `-o table|wide|json|yaml` (and `--json`) on status and
explain, `-n/--namespace` naming the controller's namespace on every command that has one, and every flag's
help saying what it does and its default."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate import cli, fleet
from gpuremediate.kube import miniyaml
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NODES
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_RESET_GPU, KIND_ECC_DBE
from gpuremediate.vocab.record import Fault, NodeRecord, node_patch

NS = "gpuremediate-system"
NOW = 1_700_000_000.0


def _node(client: KubeClient, name: str, record: NodeRecord | None = None, gpus: int = 8) -> None:
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                          "spec": {"unschedulable": record is not None},
                          "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                                     "allocatable": {"nvidia.com/gpu": str(gpus)}}})
    if record is not None:
        client.patch(NODES, name, node_patch(record, owner=client.get(NODES, name)))


def _draining_on_a_pdb() -> NodeRecord:
    fault = Fault(KIND_ECC_DBE, "ecc_dbe_volatile", ("GPU-1",), "ecc-dbe:GPU-1", ACTION_RESET_GPU, NOW, NOW,
                  "volatile double-bit ECC error")
    record = NodeRecord(state=states.DRAINING, since=NOW, reason="ecc-dbe", message="volatile double-bit ECC error",
                        fault=fault, cordoned_by_us=True, handled=("ecc-dbe:GPU-1",))
    record = r.start_action(record, "drain", "", 1, NOW, 3600.0)
    return r.block(record, r.BLOCK_PDB, "work/pdb-llm", NOW)


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


# -- status -------------------------------------------------------------------------------------


def test_status_prints_the_same_rows_as_json_yaml_and_the_json_alias(api: tuple[KubeClient, str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", _draining_on_a_pdb())
    _node(client, "gpu-b", gpus=4)
    flags = ["--kubeconfig", kubeconfig, "-n", NS]
    as_json = json.loads(_out(capsys, ["status", *flags, "-o", "json"]))
    assert json.loads(_out(capsys, ["status", *flags, "--json"])) == as_json  # --json is -o json
    yaml_text = _out(capsys, ["status", *flags, "--output", "yaml"])
    assert miniyaml.loads(yaml_text) == as_json, yaml_text
    try:
        import yaml  # type: ignore[import-untyped]  # never a dependency: only when it happens to be here
    except ImportError:
        pass
    else:
        assert yaml.safe_load(yaml_text) == as_json
    rows = {row["name"]: row for row in as_json["nodes"]}
    assert rows["gpu-a"]["state"] == "draining" and rows["gpu-a"]["blocked"]["detail"] == "work/pdb-llm"
    assert rows["gpu-a"]["gpus"] == 8 and rows["gpu-a"]["reason"] == "ecc-dbe"
    assert rows["gpu-a"]["heldBy"] == "work/pdb-llm" and rows["gpu-a"]["dryRun"] is False
    assert rows["gpu-b"] == {**rows["gpu-b"], "state": "healthy", "gpus": 4, "heldBy": None}
    assert "  - name: gpu-a\n" in yaml_text and "    state: draining\n" in yaml_text


def test_status_wide_adds_gpus_reason_and_who_holds_the_wait(api: tuple[KubeClient, str],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", _draining_on_a_pdb())
    _node(client, "gpu-b", gpus=4)
    table = _out(capsys, ["status", "--kubeconfig", kubeconfig, "-n", NS])
    wide = _out(capsys, ["status", "--kubeconfig", kubeconfig, "-n", NS, "-o", "wide"])
    assert table.splitlines()[0].split() == ["NODE", "STATE", "SINCE", "FAULT", "ACTION", "BLOCKED"]
    header = wide.splitlines()[0]
    assert header.split() == ["NODE", "STATE", "GPUS", "SINCE", "FAULT", "REASON", "ACTION", "BLOCKED", "HELD",
                              "BY"]
    lines = {line.split()[0]: line for line in wide.splitlines()[1:] if line.startswith("gpu-")}
    cells = lines["gpu-a"].split()
    assert cells[:3] == ["gpu-a", "draining", "*"] and cells[3] == "8"
    assert "ecc-dbe" in cells and cells[-1] == "work/pdb-llm"
    assert lines["gpu-b"].split()[:3] == ["gpu-b", "healthy", "4"]
    assert lines["gpu-a"].rindex("work/pdb-llm") == header.index("HELD BY")  # in its column


@pytest.mark.parametrize(("blocked", "held_by"), [
    (r.Blocked(r.BLOCK_PAUSED, "paused by alice: k8s upgrade (in_flight = hold)", NOW), "alice"),
    (r.Blocked(r.BLOCK_PDB, "work/trainer-0: 500 two PDBs", NOW), "work/trainer-0"),
    (r.Blocked(r.BLOCK_BUDGET, "budget full: 2 of 2 out of service (gpu-c: quarantined, needs a person; gpu-d: "
                               "draining)", NOW), "gpu-c,gpu-d"),
    (r.Blocked(r.BLOCK_BUDGET, "budget full: 2 of 2 out of service (gpu-c: quarantined since 2026-11-01T12:00:00Z, "
                               "needs a person; gpu-d: draining since 2026-11-01T12:05:00Z)", NOW), "gpu-c,gpu-d"),
    (r.Blocked(r.BLOCK_BUDGET, "domain budget full: rack=r1: 1 of 1 out of service (gpu-e)", NOW), "gpu-e"),
    (r.Blocked(r.BLOCK_GPU_PODS, "validation needs every GPU; still held by work/a, work/b (drain them: kubectl "
                                 "drain)", NOW), "work/a, work/b"),
    (r.Blocked(r.BLOCK_BREAKER, "circuit breaker open: no new work", NOW), "circuit breaker"),
    (r.Blocked(r.BLOCK_BREAKER, "domain breaker open for rack=r1: 3 of 4 faulted", NOW), "domain rack=r1"),
    (r.Blocked(r.BLOCK_GATE, "alert KubeNodeNotReady firing", NOW), "-"),
])
def test_held_by_names_who_or_what_holds_each_wait(blocked: r.Blocked, held_by: str) -> None:
    assert fleet.holder(blocked) == held_by


# -- explain ------------------------------------------------------------------------------------


def test_explain_prints_its_record_as_json_yaml_and_wide(api: tuple[KubeClient, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", _draining_on_a_pdb())
    _node(client, "gpu-b")
    flags = ["--kubeconfig", kubeconfig, "--namespace", NS]
    text = _out(capsys, ["explain", "gpu-a", *flags])
    as_json = json.loads(_out(capsys, ["explain", "gpu-a", *flags, "-o", "json"]))
    assert json.loads(_out(capsys, ["explain", "gpu-a", *flags, "--json"])) == as_json
    assert miniyaml.loads(_out(capsys, ["explain", "gpu-a", *flags, "-o", "yaml"])) == as_json
    node = as_json["node"]
    assert node["name"] == "gpu-a" and node["state"] == "draining" and node["gpus"] == 8
    assert node["heldBy"] == "work/pdb-llm" and as_json["dryRun"] is False and node["error"] is None
    assert as_json["record"]["fault"]["kind"] == KIND_ECC_DBE and as_json["record"]["blocked"]["reason"] == "pdb"
    assert as_json["explanation"] == text.splitlines()
    wide = _out(capsys, ["explain", "gpu-a", *flags, "-o", "wide"])
    assert wide.startswith(text)
    assert "  GPUs: 8.\n" in wide and "  Held by: work/pdb-llm (pdb).\n" in wide
    assert "  Record: written on gpu-a (uid " in wide and "1 handled fault fingerprint(s): ecc-dbe:GPU-1." in wide
    healthy = json.loads(_out(capsys, ["explain", "gpu-b", *flags, "-o", "json"]))
    assert healthy["node"]["state"] == "healthy" and healthy["record"] is None and healthy["node"]["heldBy"] is None


# -- -n/--namespace, the drain-window plugin's --request-namespace ------------------------------


@pytest.mark.parametrize("argv", [["run"], ["status"], ["explain", "n1"], ["breaker", "status"],
                                  ["pause", "--reason", "x"], ["resume"]])
def test_dash_n_is_the_controllers_namespace_on_every_command(argv: list[str]) -> None:
    parser = cli.build_parser()
    for flag in ("-n", "--namespace"):
        assert parser.parse_args([*argv, flag, "ops"]).namespace == "ops"
        action = next(a for a in parser.commands[argv[0]]._actions if a.dest == "namespace")
        assert action.option_strings == ["-n", "--namespace"]
        assert "the controller's namespace" in (action.help or "")


def test_drain_window_names_its_request_namespace_apart_and_keeps_the_old_spelling(
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["plugin", "drain-window", "--request-namespace", "work"]).request_namespace == "work"
    assert parser.parse_args(["plugin", "drain-window"]).request_namespace == ""
    assert capsys.readouterr().err == ""
    assert parser.parse_args(["plugin", "drain-window", "--namespace", "old"]).request_namespace == "old"
    assert "--namespace is deprecated: use --request-namespace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["plugin", "drain-window", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--namespace NS deprecated: the old spelling of --request-namespace" in shown
    with pytest.raises(SystemExit):
        parser.parse_args(["plugin", "drain-window", "-n", "x"])  # -n is never the requests' namespace
    capsys.readouterr()


# -- help: every flag says what it does and its default -----------------------------------------


def _parsers(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _shown(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The action's lines in ``parser --help``, as its own formatter writes them."""
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


def _meaningful(default: Any) -> bool:
    return default is not None and default is not False and default != "" and default is not argparse.SUPPRESS


def test_every_flag_of_every_command_has_help_and_shows_its_default() -> None:
    seen = 0
    for path, parser in _parsers(cli.build_parser(), "gpuremediate"):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            seen += 1
            name = "/".join(action.option_strings) or action.dest
            assert action.help, f"`{path} --help`: {name} has no help text"
            shown = _shown(parser, action)
            if action.option_strings and _meaningful(action.default) and action.nargs != 0:
                assert "default" in shown.lower(), f"`{path} --help`: {name} does not show its default: {shown}"
    assert seen > 100


def test_status_help_shows_the_output_choices_and_their_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["status", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "-o {table,wide,json,yaml}, --output {table,wide,json,yaml}" in shown
    assert "(default: table)" in shown and "--json the same as -o json" in shown
    assert "-n NAMESPACE, --namespace NAMESPACE the controller's namespace" in shown
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--exporter-port EXPORTER_PORT the exporter pods' metrics port (default: 9400)" in shown
    assert "--log-level {debug,info,warning,error} the least severe log lines written (default: info)" in shown
