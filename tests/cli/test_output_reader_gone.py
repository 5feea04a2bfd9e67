"""A command whose reader stops early (``gpuremediate status --json | head``) ends quietly: no BrokenPipeError
traceback, and its own exit code (issue 22 item 7). The real entry point, ``python -m gpuremediate``, writes into
a pipe the test closes: after one line, or before the command writes anything."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NAMESPACES, NODES
from sim.kubeapi import KubeAPIServer

ROOT = Path(__file__).resolve().parents[2]
NODES_N = 400  # `status --json` then writes far more than a pipe holds: it meets the closed pipe mid-output


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    srv = KubeAPIServer().start()
    path = srv.write_kubeconfig(tmp_path_factory.mktemp("reader") / "kubeconfig")
    client = KubeClient(load_config(path), qps=1000, burst=1000)
    client.create(NAMESPACES, {"metadata": {"name": "gpuremediate-system"}})
    for i in range(NODES_N):
        client.create(NODES, {"metadata": {"name": f"gpu-node-{i:04d}", "labels": {"nvidia.com/gpu.present": "true"}},
                              "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    try:
        yield str(path)
    finally:
        client.close()
        srv.stop()


def _run(argv: list[str], lines: int) -> tuple[int, list[str], str]:
    """Run the command into a pipe; read ``lines`` lines (0: none), close the pipe; wait for the command."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuremediate", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    read = [proc.stdout.readline() for _ in range(lines)]
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=60), read, err


@pytest.mark.parametrize(("argv", "lines"), [(["status", "--json"], 1), (["status"], 0)], ids=["json", "table"])
def test_status_into_a_reader_that_leaves_early(argv: list[str], lines: int, kubeconfig: str) -> None:
    """After one line of JSON (far more follows), or before the table is written."""
    code, read, err = _run([*argv, "--kubeconfig", kubeconfig], lines)
    assert all(line.strip() for line in read), "the command wrote nothing"
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert err == "" and code == 0, (code, err)


def test_check_keeps_its_verdict_when_its_reader_is_gone(tmp_path: Path) -> None:
    """check's exit code is its verdict; a cut output does not change it (no nvidia-smi here: 3)."""
    code, _, err = _run(["check", "--json", "--kernel-log", "no", "--nvidia-smi", str(tmp_path / "none")], lines=0)
    assert "Traceback" not in err and err == "", err
    assert code == 3
