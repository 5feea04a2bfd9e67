"""SIGTERM is honoured: ``python -m gpuremediate run`` exits 0 within a bound wherever the signal lands.

The controller runs as a subprocess against the emulator (as in production: signals go to the process).
A CPU hog runs beside it, as on a busy node. Points: startup (modules importing, the cache syncing,
the lease being acquired), acting on new faults, and mid-drain (a drain held by a PodDisruptionBudget).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate.kube.resources import NODES
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.cluster import SimCluster
from sim.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
EXIT_BOUND_S = 12.0  # loops stop together within 6 s, the lease release gets 2 s: 12 s leaves room on a busy box
DRAIN_NODE_INDEX = -1


class Child:
    """The controller process; its output collected so a failure can show it."""

    def __init__(self, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
        self.output: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuremediate", "run", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip("\n"))

    def handles_sigterm(self) -> bool:
        """Its SIGTERM handler is installed (Linux: the SigCgt mask in /proc)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return False
        caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
        return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))

    def terminate(self) -> tuple[int | None, float]:
        """SIGTERM, then the exit code and how long it took (None: it did not exit within the bound)."""
        sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            code = None
            self.proc.kill()
            self.proc.wait(5)
        took = time.monotonic() - sent
        self._reader.join(5)
        return code, took

    def log_tail(self) -> str:
        return "\n".join(self.output[-25:])


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux /proc to see when the SIGTERM handler is installed")
    with SimCluster(nodes=4) as sim:
        yield sim


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait(5)


POLICY = """
[budget]
max_unavailable = "100%"
[breaker]
enabled = false
"""


def _args(cluster: SimCluster, leader_elect: bool) -> list[str]:
    policy = Path(cluster.kubeconfig).with_name("shutdown-policy.toml")
    policy.write_text(POLICY)  # no budget or breaker wait: every fault is acted on at once
    args = [*cluster.controller_args(), "--policy", str(policy), "--metrics-addr", "127.0.0.1:0",
            "--scrape-interval", "0.3s",
            "--resync", "0.3s", "--scrape-timeout", "2s", "--log-format", "json"]
    if leader_elect:
        args += ["--leader-elect", "--leader-elect-lease-duration", "3s", "--leader-elect-renew-deadline", "2s",
                 "--leader-elect-retry-period", "0.5s"]
    return args


def _start(cluster: SimCluster, leader_elect: bool) -> Child:
    child = Child(_args(cluster, leader_elect))
    wait_for(child.handles_sigterm, timeout=30, describe="the controller to install its SIGTERM handler",
             seen=child.log_tail)
    return child


def _wait_for_line(child: Child, text: str, describe: str) -> None:
    wait_for(lambda: any(text in line for line in child.output), timeout=30, describe=describe, seen=child.log_tail)


def _check_exit(child: Child, where: str) -> None:
    code, took = child.terminate()
    assert code == 0, (f"SIGTERM {where}: exit code {code} after {took:.1f}s (bound {EXIT_BOUND_S}s); "
                       f"log tail:\n{child.log_tail()}")
    tracebacks = [line for line in child.output if line.startswith("Traceback") or '"exc": ' in line]
    assert not tracebacks, f"SIGTERM {where}: tracebacks in the log:\n" + "\n".join(tracebacks[:5])


def test_sigterm_while_the_node_cache_cannot_sync_exits_at_once(cluster: SimCluster) -> None:
    cluster.api.inject("GET", r"^/api/v1/nodes", count=10**6, status=500)
    try:
        child = _start(cluster, leader_elect=False)
        _wait_for_line(child, "observability port open", "the controller to open its port")
        time.sleep(0.5)  # it sits in the cache sync (the API answers every node list with 500)
        _check_exit(child, "while the node cache cannot sync")
    finally:
        cluster.api.faults.clear()


def _draining(cluster: SimCluster, node: str) -> bool:
    record = record_from_node(cluster.kube.get(NODES, node))
    return isinstance(record, NodeRecord) and record.state == "draining" and record.fault is not None


def test_sigterm_at_random_points_under_load_exits_0_within_the_bound(cluster: SimCluster, cpu_hog: None) -> None:
    rng = random.Random(1017)
    drain_node = cluster.node_names[DRAIN_NODE_INDEX]
    cluster.workload("held", drain_node, labels={"app": "held"})
    cluster.pdb("held", {"app": "held"}, min_available=1)  # its drain can never finish: always mid-drain
    acting_nodes = [n for n in cluster.node_names if n != drain_node]
    plan = ["startup"] * 4 + ["mid-drain"] * 3 + ["acting"] * 4
    for run, where in enumerate(plan):
        leader_elect = run % 2 == 1
        child = _start(cluster, leader_elect)
        if where == "startup":
            time.sleep(rng.uniform(0.0, 1.5))
        elif where == "acting":
            _wait_for_line(child, "starting loops", "the controller to start acting")
            cluster.gpusim.inject(rng.choice(acting_nodes), rng.randrange(8), "xid", rng.choice([48, 79, 95]))
            time.sleep(rng.uniform(0.0, 1.0))
        else:
            if run == plan.index("mid-drain"):
                cluster.gpusim.inject(drain_node, 0, "xid", 48)
            wait_for(lambda: _draining(cluster, drain_node), timeout=30, describe=f"{drain_node} draining",
                     seen=child.log_tail)
            time.sleep(rng.uniform(0.0, 1.0))
        _check_exit(child, f"{where} (run {run}, leader election {'on' if leader_elect else 'off'})")
