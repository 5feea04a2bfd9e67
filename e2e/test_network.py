"""The node's network end to end (issue 45): gpu-sim writes each node's RDMA sysfs tree (sim/nic_sysfs), the
node agent reads it and publishes GPUNetworkHealthy, and the real controller cordons the node with the NIC taint
``gpuremediate.io/nic-degraded=<nic>:NoSchedule`` and lifts both when the link is back.

Run: ``python -m pytest e2e/test_network.py -q``. Agents in process, as e2e/test_agent.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import EmulatorCluster, make_cluster
from gpuremediate.actions.node_status import find_condition, taints_of
from gpuremediate.policy import conditions as c
from gpuremediate.policy.network import NIC_TAINT_KEY
from gpuremediate.vocab import states
from sim.cluster import AgentOptions
from sim.nic_sysfs import NicTree

POLICY: dict[str, dict[str, Any]] = {
    "budget": {"max_unavailable": "100%"},
    "breaker": {"enabled": False},
    "repeat_offender": {"count": 10},
}
# The agents' [network]: a recovered link lifts after 1 s (the default 60 s would make the scenario a minute).
AGENTS = AgentOptions(policy={"network": {"clear_after_s": 1.0}})
TIMEOUT_S = 30.0


class World:
    def __init__(self, cluster: EmulatorCluster, trees: dict[str, NicTree]) -> None:
        self.cluster = cluster
        self.trees = trees

    def condition(self, name: str) -> dict[str, Any]:
        return dict(find_condition(self.cluster.node(name), c.GPU_NETWORK_HEALTHY) or {})

    def nic_taint(self, name: str) -> dict[str, Any] | None:
        return next((t for t in taints_of(self.cluster.node(name)) if t.get("key") == NIC_TAINT_KEY), None)

    def wait(self, what: str, predicate: Any, name: str) -> None:
        self.cluster.wait(predicate, TIMEOUT_S, what,
                          seen=lambda: f"{self.cluster.summary(name)} network={self.condition(name)} "
                                       f"taint={self.nic_taint(name)}")

    def held_for(self, name: str, kind: str, nic: str) -> bool:
        record = self.cluster.record(name)
        return (self.cluster.state(name) == states.CORDONED and self.cluster.unschedulable(name)
                and record is not None and record.fault is not None and record.fault.kind == kind
                and self.nic_taint(name) == {"key": NIC_TAINT_KEY, "value": nic, "effect": "NoSchedule"})

    def lifted(self, name: str) -> bool:
        return (self.cluster.state(name) == states.HEALTHY and not self.cluster.unschedulable(name)
                and self.nic_taint(name) is None)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    cluster = make_cluster(tmp_path, agents=AGENTS)
    assert isinstance(cluster, EmulatorCluster), cluster
    cluster.start()
    try:
        with_nics = cluster.nodes[:-1]  # the last node has no InfiniBand
        world = World(cluster, {name: cluster.sim.gpusim.add_nics(name) for name in with_nics})
        for name in with_nics:
            world.wait("the agent to see the ports up", lambda n=name: world.condition(n).get("reason")
                       == "PortsHealthy", name)
        cluster.start_controller(POLICY)
        yield world
        cluster.stop_controller()
        assert cluster.log_problems() == []
    finally:
        cluster.stop()


def test_port_down_cordons_with_the_nic_taint_and_link_back_lifts_it(world: World) -> None:
    node = world.cluster.nodes[0]
    world.trees[node].port_down("mlx5_2")
    world.wait("cordoned for nic-down with the NIC taint", lambda: world.held_for(node, "nic-down", "mlx5_2"), node)
    assert world.condition(node)["reason"] == "NicDown:mlx5_2"
    assert world.cluster.job_runs(node, "drain") == 0 and world.cluster.job_runs(node, "reboot") == 0
    world.trees[node].port_up("mlx5_2")
    world.wait("healthy again, uncordoned, the taint gone", lambda: world.lifted(node), node)


def test_a_flapping_port_is_cordoned(world: World) -> None:
    node = world.cluster.nodes[1]
    world.trees[node].flap("mlx5_5", times=3)  # down and up between two reads: only link_downed shows it
    world.wait("cordoned for nic-flapping", lambda: world.held_for(node, "nic-flapping", "mlx5_5"), node)


def test_a_downtrained_port_is_cordoned_and_lifted_once_retrained(world: World) -> None:
    node = world.cluster.nodes[2]
    world.trees[node].downtrain("mlx5_0", width=2)  # 400 Gb/s trained at 200
    world.wait("cordoned for nic-degraded", lambda: world.held_for(node, "nic-degraded", "mlx5_0"), node)
    world.trees[node].heal()
    world.wait("lifted once retrained", lambda: world.lifted(node), node)


def test_a_node_without_infiniband_stays_silent(world: World) -> None:
    node = world.cluster.nodes[-1]
    world.trees[world.cluster.nodes[0]].add_errors("mlx5_1", count=500)  # another node's fault, not this one's
    world.wait("the other node cordoned", lambda: world.held_for(world.cluster.nodes[0], "nic-errors", "mlx5_1"),
               node)
    assert (world.condition(node).get("status"), world.condition(node).get("reason")) == ("True", "NoRdmaDevice")
    assert world.lifted(node)
