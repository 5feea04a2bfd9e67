"""`kubectl gpuremediate status|explain|pause|release`: the package installs a `kubectl-gpuremediate` entry point
that runs the same CLI (kubectl finds it on PATH and hands it the arguments after `kubectl gpuremediate`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from gpuremediate import cli
from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_QUARANTINE, KIND_ROW_REMAP_FAILURE
from gpuremediate.vocab.record import Fault, NodeRecord, node_patch, record_from_node
from sim.kubeapi import KubeAPIServer

NS = "gpuremediate-system"
ENTRY_POINT = "kubectl-gpuremediate"


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[KubeClient, str]]:
    srv = KubeAPIServer().start()
    kubeconfig = str(srv.write_kubeconfig(tmp_path / "kubeconfig"))
    client = KubeClient(load_config(kubeconfig))
    client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    fault = Fault(KIND_ROW_REMAP_FAILURE, "", ("GPU-1",), "row-remap-failure:GPU-1", ACTION_QUARANTINE, 1.0, 1.0,
                  "row remapping failed")
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-q"},
                          "spec": {"unschedulable": True}, "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    client.patch(NODES, "gpu-q", node_patch(NodeRecord(state=states.QUARANTINED, since=1.0, reason="row-remap-failure",
                                                       message="row remapping failed", fault=fault,
                                                       cordoned_by_us=True)))
    try:
        yield client, kubeconfig
    finally:
        client.close()
        srv.stop()


def _entry_point() -> metadata.EntryPoint:
    found = metadata.entry_points(group="console_scripts", name=ENTRY_POINT)
    assert found, f"no console_scripts entry point {ENTRY_POINT} installed (setup.cfg; `pip install -e .` again)"
    (entry,) = found
    return entry


def test_the_package_installs_a_kubectl_plugin_entry_point_running_the_cli() -> None:
    entry = _entry_point()
    assert entry.value == "gpuremediate.cli:kubectl_main"
    assert entry.load() is cli.kubectl_main


def test_the_plugin_runs_status_explain_pause_and_release(api: tuple[KubeClient, str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    plugin = _entry_point().load()
    flags = ["--kubeconfig", kubeconfig]
    assert plugin(["status", *flags]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:2] == ["NODE", "STATE"] and "gpu-q" in table and "quarantined *" in table
    assert plugin(["explain", "gpu-q", *flags, "-n", NS]) == 0
    assert "gpu-q: quarantined" in capsys.readouterr().out
    assert plugin(["pause", "--reason", "upgrade", "--by", "alice", *flags, "-n", NS]) == 0
    assert "paused by alice: upgrade" in capsys.readouterr().out
    assert BreakerStore(client, NS).latest_pause().paused
    assert plugin(["status", *flags, "-n", NS, "-o", "json"]) == 0  # the same object as `gpuremediate status`
    shown = json.loads(capsys.readouterr().out)
    assert cli.main(["status", *flags, "-n", NS, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == shown and shown["kind"] == "FleetStatus"
    assert shown["fleet"]["paused"]["by"] == "alice" and shown["nodes"][0]["state"] == "quarantined"
    assert plugin(["release", "gpu-q", "--by", "alice", *flags]) == 0
    assert "gpu-q: validating" in capsys.readouterr().out
    record = record_from_node(client.get(NODES, "gpu-q"))
    assert isinstance(record, NodeRecord) and record.state == states.VALIDATING
    with pytest.raises(SystemExit):
        plugin(["status", "--help"])
    assert capsys.readouterr().out.startswith("usage: kubectl gpuremediate status")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_finds_the_plugin_on_path_and_hands_it_the_arguments(api: tuple[KubeClient, str]) -> None:
    script = Path(sys.executable).parent / ENTRY_POINT
    if not script.exists():
        pytest.skip(f"{ENTRY_POINT} is not installed beside {sys.executable}")
    _, kubeconfig = api
    env = {**os.environ, "PATH": f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["kubectl", "gpuremediate", "status", "--kubeconfig", kubeconfig, "-o", "wide"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[:2]
    assert header.split()[:3] == ["NODE", "STATE", "GPUS"] and row.split()[:4] == ["gpu-q", "quarantined", "*", "8"]
    listed = subprocess.run(["kubectl", "plugin", "list"], env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    assert str(script) in listed.stdout, listed.stdout + listed.stderr
