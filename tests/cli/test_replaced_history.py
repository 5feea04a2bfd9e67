"""`status` and `explain NODE` read the replaced-node history (ConfigMap `gpuremediate-replaced`, written by
`[remediation.replace]`): status counts the recent replacements and shows the newest; explain of a Node that is
gone because it was replaced says so (through what, when) instead of "not found"; the same in -o json/yaml."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest

from gpuremediate import cli, structured
from gpuremediate.actions.replaced import DELETED, DELETING, REPLACED_CONFIGMAP, REPLACED_KEY, Entry
from gpuremediate.kube import miniyaml
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CONFIGMAPS, NODES

NS = "gpuremediate-system"


def _entry(node: str, at: float, state: str = DELETED, **kw: Any) -> Entry:
    return Entry(node=node, node_uid=kw.get("uid", f"uid-{node}"), provider_id=f"aws:///us-east-1a/i-{node}",
                 provider=kw.get("provider", "cluster-api"), target=kw.get("target", f"Machine default/m-{node}"),
                 target_uid=f"m-uid-{node}", fault=kw.get("fault", "xid-79"), at=at, state=state)


def _history(client: KubeClient, entries: list[Entry], raw: str | None = None) -> None:
    """The ConfigMap as the controller writes it (newest last), or ``raw`` as the data key."""
    value = raw if raw is not None else json.dumps([dataclasses.asdict(e) for e in entries])
    client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": REPLACED_CONFIGMAP, "namespace": NS},
                               "data": {REPLACED_KEY: value}}, NS)


def _node(client: KubeClient, name: str) -> None:
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                          "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}})


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def _printed(capsys: pytest.CaptureFixture[str], argv: list[str], kind: str) -> dict[str, Any]:
    shown = json.loads(_out(capsys, [*argv, "-o", "json"]))
    assert miniyaml.loads(_out(capsys, [*argv, "-o", "yaml"])) == shown
    assert shown["kind"] == kind and structured.validate(shown, kind) == []
    return shown


def test_status_counts_the_recent_replacements_and_shows_the_newest(api: tuple[KubeClient, str],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    now = time.time()
    old = [_entry(f"gpu-old-{i}", now - 3 * 86400 + i) for i in range(3)]  # days ago: not recent
    new = [_entry(f"gpu-new-{i}", now - 3600 + i * 60) for i in range(5)]
    new[-1] = _entry("gpu-new-4", now - 60, DELETING, provider="karpenter", target="NodeClaim nc-4")
    _history(client, [*old, *new])
    _node(client, "gpu-a")
    argv = ["status", "--kubeconfig", kubeconfig, "-n", NS]
    table = _out(capsys, argv)
    assert "REPLACED: 5 node(s) in the last 24h, 8 in the history" in table
    shown_lines = [line for line in table.splitlines() if line.startswith("  gpu-")]
    assert [line.split()[0] for line in shown_lines] == [f"gpu-new-{i}" for i in (4, 3, 2, 1, 0)]
    assert "karpenter  NodeClaim nc-4" in shown_lines[0] and shown_lines[0].endswith("deleting")
    assert "cluster-api  Machine default/m-gpu-new-3" in shown_lines[1] and shown_lines[1].endswith("deleted")
    replaced = _printed(capsys, argv, structured.KIND_FLEET_STATUS)["fleet"]["replaced"]
    assert replaced["recent"] == 5 and replaced["total"] == 8
    assert [r["node"] for r in replaced["latest"]] == [f"gpu-new-{i}" for i in (4, 3, 2, 1, 0)]
    assert replaced["latest"][0] == {"node": "gpu-new-4", "nodeUID": "uid-gpu-new-4",
                                     "providerID": "aws:///us-east-1a/i-gpu-new-4", "provider": "karpenter",
                                     "target": "NodeClaim nc-4", "targetUID": "m-uid-gpu-new-4", "fault": "xid-79",
                                     "at": structured.rfc3339(now - 60), "state": "deleting"}


def test_status_without_a_history_says_nothing_and_counts_zero(api: tuple[KubeClient, str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a")
    argv = ["status", "--kubeconfig", kubeconfig, "-n", NS]
    assert "REPLACED" not in _out(capsys, argv) and "replaced" not in _out(capsys, argv)
    fleet = _printed(capsys, argv, structured.KIND_FLEET_STATUS)["fleet"]
    assert fleet["replaced"] == {"recent": 0, "total": 0, "latest": []} and fleet["errors"] == []


def test_a_history_that_cannot_be_read_is_said_and_status_still_prints(api: tuple[KubeClient, str],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _history(client, [], raw="{not a list")
    _node(client, "gpu-a")
    argv = ["status", "--kubeconfig", kubeconfig, "-n", NS]
    table = _out(capsys, argv)
    assert "replaced nodes unknown: ConfigMap gpuremediate-replaced key replaced" in table and "gpu-a" in table
    shown = _printed(capsys, argv, structured.KIND_FLEET_STATUS)
    assert shown["fleet"]["replaced"] is None and [n["name"] for n in shown["nodes"]] == ["gpu-a"]
    assert any(e.startswith("replaced nodes unknown: ") for e in shown["fleet"]["errors"])


def test_explain_of_a_replaced_node_that_is_gone_says_it_was_replaced(api: tuple[KubeClient, str],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    now = time.time()
    _history(client, [_entry("gpu-b", now - 7200, fault="xid-48"), _entry("gpu-c", now - 3600),
                      _entry("gpu-b", now - 600, uid="uid-b2", provider="karpenter", target="NodeClaim nc-b2")])
    argv = ["explain", "gpu-b", "--kubeconfig", kubeconfig, "-n", NS]
    text = _out(capsys, argv)
    lines = text.splitlines()
    assert lines[0].startswith("gpu-b: replaced. No Node of this name exists now")
    assert lines[1].startswith("  Replaced: NodeClaim nc-b2 deleted (karpenter) " + structured.rfc3339(now - 600))
    assert "Node uid uid-b2" in lines[1] and "instance aws:///us-east-1a/i-gpu-b" in lines[1]
    assert lines[2].startswith("  Replaced before: Machine default/m-gpu-b deleted (cluster-api)")
    assert "for xid-48" in lines[2] and "gpu-c" not in text
    assert _out(capsys, [*argv, "-o", "wide"]) == text
    shown = _printed(capsys, argv, structured.KIND_NODE_EXPLANATION)
    assert shown["node"] is None and shown["record"] is None and shown["explanation"] == lines
    assert [(r["target"], r["nodeUID"]) for r in shown["replaced"]] == [("NodeClaim nc-b2", "uid-b2"),
                                                                         ("Machine default/m-gpu-b", "uid-gpu-b")]


def test_explain_of_a_node_back_under_a_replaced_name_says_both(api: tuple[KubeClient, str],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    now = time.time()
    _history(client, [_entry("gpu-b", now - 600, DELETING)])
    _node(client, "gpu-b")
    argv = ["explain", "gpu-b", "--kubeconfig", kubeconfig, "-n", NS]
    text = _out(capsys, argv)
    assert text.startswith("gpu-b: healthy.")
    assert ("  Replaced before (an earlier Node of this name): Machine default/m-gpu-b being deleted (the delete "
            "was not confirmed sent) (cluster-api)") in text
    shown = _printed(capsys, argv, structured.KIND_NODE_EXPLANATION)
    assert shown["node"]["name"] == "gpu-b" and shown["node"]["state"] == "healthy"
    assert [r["state"] for r in shown["replaced"]] == ["deleting"]


def test_explain_of_a_name_never_seen_is_still_not_found(api: tuple[KubeClient, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _history(client, [_entry("gpu-b", time.time())])
    assert cli.main(["explain", "gpu-z", "--kubeconfig", kubeconfig, "-n", NS]) == cli.EXIT_ERROR
    assert "node 'gpu-z' not found" in capsys.readouterr().err
    healthy = _printed(capsys, ["explain", "gpu-b", "--kubeconfig", kubeconfig, "-n", NS],
                       structured.KIND_NODE_EXPLANATION)
    assert healthy["node"] is None  # gone, replaced
    _node(client, "gpu-y")
    shown = _printed(capsys, ["explain", "gpu-y", "--kubeconfig", kubeconfig, "-n", NS],
                     structured.KIND_NODE_EXPLANATION)
    assert shown["replaced"] == [] and shown["node"]["name"] == "gpu-y"
