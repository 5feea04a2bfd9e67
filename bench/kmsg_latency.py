"""From the kernel's Xid line to the node cordoned (issue 48): the agent's kmsg follower, its condition write, the
controller's Node watch and its cordon, measured end to end.

    .venv/bin/python bench/kmsg_latency.py                   # the three runs below
    .venv/bin/python bench/kmsg_latency.py --only single --nodes 1000 --singles 20

The API emulator runs in its own process (``python -m sim.kubeapi``, as bench/burst.py's), and so do the agents
(this script with ``--agents-child``): gpu-sim in process plays their hosts (a kmsg file each, an in-process
nvidia-smi), one ``Agent`` (its interval loop and its kmsg follower, two threads) per faulting node only: 5,000
agents' 10,000 threads do not fit beside the emulator and the controller on 2 cores, and a node without a fault
writes nothing between its heartbeats. The controller runs in this process with an in-memory source that reads
every node healthy (the default --scrape-interval, 15 s): only the agents' conditions carry the faults. "Written"
is when gpu-sim appended the Xid 79 line to the node's kmsg (the agents' process' clock, the same machine's);
"cordoned" is when a Node watch here saw ``spec.unschedulable`` (bench/burst.py's watch_cordons).

Runs:
  single   5,000 nodes, ``--singles`` nodes faulting one at a time, ``--gap`` s apart, the fleet otherwise quiet:
           P50 / P99 (goal 0.5 s / 2 s). The breaker raised (its storm look off), as bench/burst.py's burst.
  burst    the same fleet, 750 other nodes' Xids within 10 s, the breaker raised: every one cordoned once, P90
           (goal 5 s).
  storm    1,500 nodes, 750 Xids within 10 s (50 %, past the default breaker's 30 %), the default breaker (its
           storm look on): cordons made (goal 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.burst import BurstSource, Emulator, count_requests, node_body, percentile, watch_cordons  # noqa: E402
from gpuremediate.config import Settings  # noqa: E402
from gpuremediate.controller import Controller  # noqa: E402
from gpuremediate.kube import errors  # noqa: E402
from gpuremediate.kube.client import KubeClient  # noqa: E402
from gpuremediate.kube.config import load_config  # noqa: E402
from gpuremediate.kube.resources import NAMESPACES, NODES  # noqa: E402
from gpuremediate.policy.config import loads_policy  # noqa: E402

NAMESPACE = "gpuremediate-system"
RAISED = "threshold_percent = 99\nlook_s = 0\n"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the agents' process -------------------------------------------------------------------------------------


def agents_child(kubeconfig: str, names: list[str], workdir: str) -> int:
    """gpu-sim and one Agent per node; stdin ``xid NODE`` appends an Xid 79 line to NODE's kmsg and answers
    ``wrote NODE TIME``; ``ready`` is printed once every agent's first cycle is done."""
    from gpuremediate.agent.run import Agent, AgentSettings
    from gpuremediate.policy.config import default_policy
    from gpuremediate.signals.nvidiasmi import NvidiaSmiSource
    from sim.gpusim import GpuSim

    sim = GpuSim(files_dir=workdir)
    client = KubeClient(load_config(kubeconfig), qps=5000, burst=5000)
    policy = default_policy().for_node({})
    stop = threading.Event()
    agents: list[Agent] = []
    for i, name in enumerate(names):
        sim.add_node(name, ip=f"127.9.{i // 250}.{i % 250 + 1}")  # never served: only its files are used
        host = Path(sim.host_dir(name))
        settings = AgentSettings(node_name=name, kmsg_path=str(host / "kmsg"), state_path=str(host / "state.json"),
                                 boot_id_path=str(host / "boot_id"), nvidia_smi=str(host / "nvidia-smi"))
        smi = NvidiaSmiSource(settings.nvidia_smi, name, settings.smi_timeout_s, runner=sim.nvidia_smi_runner(name))
        agent = Agent(settings, client, policy, smi=smi, kmsg_wait=sim.kmsg_waiter(name))
        agents.append(agent)
        threading.Thread(target=agent.run, args=(stop,), name=f"agent-{name}", daemon=True).start()
    while any(a.last_cycle == 0.0 for a in agents):
        time.sleep(0.2)
    print("ready", flush=True)
    for line in sys.stdin:
        verb, _, node = line.strip().partition(" ")
        if verb == "xid":
            sim.kernel_xid(node, 0, 79)
            print(f"wrote {node} {time.time():.6f}", flush=True)
    stop.set()
    return 0


class Agents:
    """The agents' process, and when each Xid line was written."""

    def __init__(self, kubeconfig: str, names: list[str], workdir: Path) -> None:
        (workdir / "nodes").write_text("\n".join(names))
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--agents-child", kubeconfig, str(workdir / "nodes"),
             str(workdir / "hosts")], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.written: dict[str, float] = {}
        self.ready = threading.Event()
        threading.Thread(target=self._answers, daemon=True).start()

    def _answers(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if words == ["ready"]:
                self.ready.set()
            elif len(words) == 3 and words[0] == "wrote":
                self.written[words[1]] = float(words[2])

    def xid(self, node: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"xid {node}\n")
        self.proc.stdin.flush()

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---- one fleet -----------------------------------------------------------------------------------------------


class Fleet:
    """The emulator with ``nodes`` GPU nodes, the agents of ``agent_nodes``, the controller with ``breaker``."""

    def __init__(self, nodes: int, agent_count: int, breaker: str, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.server = Emulator(workdir)
        config = load_config(self.server.kubeconfig)
        self.admin = KubeClient(config, qps=5000, burst=5000)
        for ns in (NAMESPACE, "gpuremediate-jobs", "gpu-operator"):
            with contextlib.suppress(errors.AlreadyExists):
                self.admin.create(NAMESPACES, {"metadata": {"name": ns}})
        self.names = [f"gpu-{i:05d}" for i in range(nodes)]
        log(f"creating {nodes} nodes")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: self.admin.create(NODES, node_body(n)), self.names))
        step = max(1, nodes // agent_count)
        self.agent_nodes = self.names[::step][:agent_count]
        log(f"starting {len(self.agent_nodes)} agents in their own process")
        self.agents = Agents(self.server.kubeconfig, self.agent_nodes, workdir)
        if not self.agents.ready.wait(600):
            raise SystemExit("the agents did not finish their first cycle")
        policy = loads_policy(f'[budget]\nmax_unavailable = "0"\n[breaker]\n{breaker}', "kmsg-bench-policy")
        self.client = KubeClient(config, qps=Settings.qps, burst=Settings.burst)
        self.sent = count_requests(self.client)
        self.controller = Controller(Settings(namespace=NAMESPACE), policy, client=self.client,
                                     source=BurstSource(self.names, [], 0.0))
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        threading.Thread(target=watch_cordons, args=(self.admin, self.seen, self._stop), daemon=True).start()
        assert self.controller.start_caches(300), "node cache did not sync"
        self.controller.start_loops()
        time.sleep(2 * Settings.scrape_interval_s)  # a quiet cycle or two first

    def lags(self, names: list[str]) -> list[float]:
        return [self.seen[n] - self.agents.written[n] for n in names if n in self.seen and n in self.agents.written]

    def wait_cordoned(self, names: list[str], timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline and not all(n in self.seen for n in names):
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self.controller.stop()
        self.agents.stop()
        self.server.stop()


def figures(lags: list[float], total: int) -> dict[str, Any]:
    return {"faults": total, "cordoned": len(lags), "p50_s": round(percentile(lags, 50), 3),
            "p90_s": round(percentile(lags, 90), 3), "p99_s": round(percentile(lags, 99), 3),
            "max_s": round(max(lags), 3) if lags else None}


def single_and_burst(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fleet = Fleet(args.nodes, args.singles + args.burst, RAISED, workdir)
    out: dict[str, Any] = {"nodes": args.nodes, "agents": len(fleet.agent_nodes)}
    try:
        singles, burst = fleet.agent_nodes[:args.singles], fleet.agent_nodes[args.singles:]
        if args.only in ("all", "single"):
            log(f"single: {len(singles)} nodes one at a time, {args.gap:g} s apart")
            for name in singles:
                fleet.agents.xid(name)
                fleet.wait_cordoned([name], 10.0)
                time.sleep(args.gap)
            out["single"] = figures(fleet.lags(singles), len(singles))
        if args.only in ("all", "burst") and burst:
            log(f"burst: {len(burst)} nodes' Xids within {args.spread:g} s")
            cpu0, agents_cpu0, server_cpu0 = time.process_time(), fleet.agents.cpu_s(), fleet.server.cpu_s()
            t0 = time.time()
            for i, name in enumerate(burst):
                time.sleep(max(0.0, t0 + i * args.spread / len(burst) - time.time()))
                fleet.agents.xid(name)
            fleet.wait_cordoned(burst, args.spread + 120)
            wall = time.time() - t0
            out["burst"] = figures(fleet.lags(burst), len(burst)) | {
                "spread_s": args.spread, "controller_cpu_s": round(time.process_time() - cpu0, 1),
                "agents_cpu_s": round(fleet.agents.cpu_s() - agents_cpu0, 1),
                "emulator_cpu_s": round(fleet.server.cpu_s() - server_cpu0, 1), "wall_s": round(wall, 1),
                "controller_requests": dict(sorted(fleet.sent.items()))}
        return out
    finally:
        fleet.stop()


def storm(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fleet = Fleet(args.storm_nodes, args.burst, "", workdir)
    try:
        names = fleet.agent_nodes
        log(f"storm: {len(names)} of {args.storm_nodes} nodes' Xids within {args.spread:g} s, the default breaker")
        t0 = time.time()
        for i, name in enumerate(names):
            time.sleep(max(0.0, t0 + i * args.spread / len(names) - time.time()))
            fleet.agents.xid(name)
        opened: float | None = None
        while time.time() < t0 + args.spread + 30:
            if opened is None and fleet.controller.ctx.breakers.latest().is_open:
                opened = time.time()
            time.sleep(0.1)
        breaker = fleet.controller.ctx.breakers.latest()
        conditions_in = sum(1 for n in names if n in fleet.agents.written)
        return {"nodes": args.storm_nodes, "faults": len(names), "xids_written": conditions_in,
                "spread_s": args.spread, "cordoned": len(fleet.seen), "breaker_open": breaker.is_open,
                "breaker_open_after_s": round(opened - t0, 2) if opened is not None else None,
                "look": None if breaker.look is None else {"held": len(breaker.look.nodes),
                                                           "outcome": breaker.look.outcome or "looking"},
                "breaker_reason": breaker.reason}
    finally:
        fleet.stop()


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--agents-child":
        return agents_child(sys.argv[2], Path(sys.argv[3]).read_text().split(), sys.argv[4])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("all", "single", "burst", "storm"), default="all")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--singles", type=int, default=40, help="single: nodes faulting one at a time")
    ap.add_argument("--gap", type=float, default=1.0, help="single: seconds between one cordon and the next Xid")
    ap.add_argument("--burst", type=int, default=750, help="burst and storm: nodes whose Xids come together")
    ap.add_argument("--spread", type=float, default=10.0, help="burst and storm: within this many seconds")
    ap.add_argument("--storm-nodes", type=int, default=1500, help="storm: the fleet (750 of 1,500 is past 30 %)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kmsg-bench-"))
    result: dict[str, Any] = {}
    if args.only in ("all", "single", "burst"):
        result |= single_and_burst(argparse.Namespace(**{**vars(args), "burst": 0 if args.only == "single"
                                                         else args.burst}), workdir / "fleet")
    if args.only in ("all", "storm"):
        result["storm"] = storm(args, workdir / "storm")
    result["load"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
