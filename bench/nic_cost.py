"""The NIC watch's cost and speed (issue 45): ``make bench-nic``.

    .venv/bin/python bench/nic_cost.py                       # all three parts, small sizes
    .venv/bin/python bench/nic_cost.py --reads 2000 --seconds 60 --trials 5

1. per read: CPU seconds of one NIC read + judge (``agent.network.NetworkWatch.cycle``) of sim/nic_sysfs.py's DGX
   tree (8 InfiniBand NICs x 1 port, 8 GPUs on their PCIe switches), in this process, averaged over ``--reads``;
2. the agent process (bench/agent_cost.py, a fake nvidia-smi replaying a real H200 capture: its GPU reads) with
   ``--sysfs`` on that tree, then on an empty tree (no RDMA device): CPU and RSS of each, side by side;
3. on the API emulator with the real controller and in-process agents (e2e's EmulatorCluster, agent interval
   ``AgentOptions.interval_s``): a port taken down in the node's sysfs tree -> GPUNetworkHealthy=False written ->
   the node cordoned with its NIC taint, ``--trials`` times (each port brought back and the node lifted between).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import agent_cost  # noqa: E402
from gpuremediate.agent.network import NetworkWatch  # noqa: E402
from gpuremediate.policy.network import NetworkPolicy  # noqa: E402
from sim.nic_sysfs import NicTree  # noqa: E402


def per_read(reads: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="nic-cost-"))
    tree = NicTree(root)
    ports = sum(len(n.ports) for n in tree.nics)
    watch, policy = NetworkWatch("gpu-node-1", str(root)), NetworkPolicy()
    watch.cycle(policy, 0.0, None)  # the first read (nothing cached)
    started = time.process_time()
    for i in range(reads):
        result = watch.cycle(policy, 30.0 * (i + 1), None)
    cpu = (time.process_time() - started) / reads
    assert result is not None and result.condition.reason == "PortsHealthy", result
    print(f"[1] one NIC read + judge of {len(tree.nics)} NICs x {ports // len(tree.nics)} port(s): "
          f"{cpu * 1e3:.2f} ms CPU (mean of {reads} reads; {100 * cpu / 30:.4f} % of a core at a 30 s interval)")


def agent_process(interval: str, seconds: float) -> None:
    tree_root = Path(tempfile.mkdtemp(prefix="nic-agent-"))
    NicTree(tree_root)
    empty = Path(tempfile.mkdtemp(prefix="nic-none-"))
    for label, root in (("8 NICs x 1 port", tree_root), ("no RDMA device", empty)):
        print(f"[2] agent process, --sysfs = {label}:")
        agent_cost.main(["--interval", interval, "--seconds", str(seconds), "--sysfs", str(root)])


def port_down_to_cordon(trials: int) -> None:
    from e2e.harness import EmulatorCluster
    from gpuremediate.actions.node_status import find_condition, taints_of
    from gpuremediate.policy import conditions as c
    from gpuremediate.policy.network import NIC_TAINT_KEY
    from gpuremediate.vocab import states
    from sim.cluster import AgentOptions

    agents = AgentOptions(policy={"network": {"clear_after_s": 1.0}})
    cluster = EmulatorCluster(Path(tempfile.mkdtemp(prefix="nic-e2e-")), agents=agents)
    cluster.start()
    to_condition: list[float] = []
    to_cordon: list[float] = []
    try:
        name = cluster.nodes[0]
        tree = cluster.sim.gpusim.add_nics(name)

        def reason() -> str:
            return str((find_condition(cluster.node(name), c.GPU_NETWORK_HEALTHY) or {}).get("reason", ""))

        def tainted() -> bool:
            return any(t.get("key") == NIC_TAINT_KEY for t in taints_of(cluster.node(name)))

        cluster.wait(lambda: reason() == "PortsHealthy", 30, "the ports seen up")
        cluster.start_controller({"budget": {"max_unavailable": "100%"}, "breaker": {"enabled": False},
                                  "repeat_offender": {"count": 100}})
        device = tree.nics[0].device
        for _ in range(trials):
            start = time.monotonic()
            tree.port_down(device)
            condition_at = cordon_at = None
            while cordon_at is None and time.monotonic() - start < 60:
                now = time.monotonic()
                if condition_at is None and reason().startswith("NicDown:"):
                    condition_at = now
                if cluster.state(name) == states.CORDONED and tainted():
                    cordon_at = now
                    condition_at = condition_at if condition_at is not None else now
                time.sleep(0.02)
            assert condition_at is not None and cordon_at is not None, cluster.summary(name)
            to_condition.append(condition_at - start)
            to_cordon.append(cordon_at - start)
            tree.port_up(device)
            cluster.wait(lambda: cluster.state(name) == states.HEALTHY and not tainted(), 60, "lifted")
        cluster.stop_controller()
    finally:
        cluster.stop()

    def said(values: list[float]) -> str:
        return (f"median {statistics.median(values):.2f} s, max {max(values):.2f} s "
                f"({', '.join(f'{v:.2f}' for v in values)})")

    print(f"[3] port down -> GPUNetworkHealthy=False on the Node ({trials} trials, agent interval "
          f"{agents.interval_s:g} s): {said(to_condition)}")
    print(f"[3] port down -> cordoned with {NIC_TAINT_KEY}: {said(to_cordon)}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reads", type=int, default=500)
    ap.add_argument("--interval", default="2s", help="the agent process's --interval in part 2")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long part 2 measures each agent")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--parts", default="123")
    opts = ap.parse_args()
    if "1" in opts.parts:
        per_read(opts.reads)
    if "2" in opts.parts:
        agent_process(opts.interval, opts.seconds)
    if "3" in opts.parts:
        port_down_to_cordon(opts.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
