"""The node agent end to end (issue 12): gpu-sim plays each node's kernel log and nvidia-smi, an agent per
node publishes its NodeConditions, and the real controller acts on them beside the exporter's metrics.

Run: ``python -m pytest e2e/test_agent.py -q``. The agents run in process, one per simulated node
(``make_cluster(agents=True)``: SimCluster's agents), writing the conditions of the target's Nodes: the emulator's
or, on the ``apiserver`` target, the real server's; the controller is the harness's subprocess. Not on the
``kubeconfig`` target (its agents would be the DaemonSet's). Busy cluster on unless GPUREMEDIATE_SIM_BUSY=0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import EmulatorCluster, add_taint, make_cluster
from gpuremediate.actions.node_status import (
    REMEDIATION_CONDITION,
    build_condition,
    conditions_patch,
    find_condition,
)
from gpuremediate.kube.resources import NODES
from gpuremediate.policy import conditions as c
from gpuremediate.policy.taint import DEFAULT_TAINT_KEY
from gpuremediate.signals.nvidiasmi import normalise_bus_id
from gpuremediate.vocab import states

POLICY: dict[str, dict[str, Any]] = {
    "budget": {"max_unavailable": "100%"},
    "breaker": {"enabled": False},
    "repeat_offender": {"count": 10},
    "taint": {"enabled": True},
    "conditions": {"rules": [{"type": "KernelDeadlock", "status": "True", "action": "reboot"}]},
}
TIMEOUT_S = 30.0  # generous: a loaded 2-core machine; each scenario normally takes a few seconds
OTHERS_TAINT = {"key": "example.com/rack-maintenance", "value": "r7", "effect": "PreferNoSchedule"}


class World:
    """The target's cluster with an agent per node, the controller started with POLICY."""

    def __init__(self, cluster: EmulatorCluster) -> None:
        self.cluster = cluster
        self.gpusim = cluster.sim.gpusim

    def node(self, name: str) -> dict[str, Any]:
        return self.cluster.node(name)

    def state(self, name: str) -> str:
        return self.cluster.state(name)

    def jobs(self, name: str, kind: str) -> int:
        return self.cluster.job_runs(name, kind)

    def condition(self, name: str, ctype: str) -> dict[str, Any] | None:
        found = find_condition(self.node(name), ctype)
        return None if found is None else dict(found)

    def wait(self, what: str, predicate: Any, name: str) -> None:
        self.cluster.wait(predicate, TIMEOUT_S, what, seen=lambda: self.summary(name))

    def summary(self, name: str) -> str:
        conds = {k: (v or {}).get("status") for k in (*c.AGENT_CONDITIONS, REMEDIATION_CONDITION)
                 for v in [self.condition(name, k)]}
        return f"{self.cluster.summary(name)} conditions={conds}"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    cluster = make_cluster(tmp_path, agents=True)
    assert isinstance(cluster, EmulatorCluster), cluster  # the agents run in process
    cluster.start()
    try:
        world = World(cluster)
        for name in cluster.nodes:
            world.wait("the agent's conditions", lambda n=name: world.condition(n, c.GPU_HEALTHY) is not None, name)
        cluster.start_controller(POLICY)
        yield world
        cluster.stop_controller()
        assert cluster.log_problems() == []
    finally:
        cluster.stop()


def test_a_repeated_xid_of_the_same_code_is_acted_on_again_after_repair(world: World) -> None:
    node = world.cluster.nodes[0]
    world.gpusim.kernel_xid(node, 2, 79)
    world.wait("the first reboot, then healthy", lambda: world.jobs(node, "reboot") == 1
               and world.state(node) == states.HEALTHY, node)
    world.wait("the agent healthy after the reboot", lambda: (world.condition(node, c.GPU_HEALTHY) or {}).get(
        "status") == "True", node)
    world.gpusim.kernel_xid(node, 2, 79)  # the same code again: a new kernel-log line
    world.wait("a second reboot", lambda: world.jobs(node, "reboot") == 2 and world.state(node) == states.HEALTHY,
               node)


def test_exporter_down_and_driver_hung_is_remediated_not_left_unknown(world: World) -> None:
    node = world.cluster.nodes[1]
    world.cluster.exporter_down(node, "refuse")
    world.gpusim.driver_hang(node)
    world.wait("the agent to say the driver hangs", lambda: (world.condition(node, c.GPU_DRIVER_RESPONSIVE)
                                                             or {}).get("status") == "False", node)
    world.wait("a reboot, then healthy with the exporter back", lambda: world.jobs(node, "reboot") >= 1
               and world.state(node) == states.HEALTHY
               and world.cluster.metrics().value("gpuremediate_nodes_unknown") == 0, node)


def test_a_missing_gpu_is_found(world: World) -> None:
    node = world.cluster.nodes[2]
    codes: set[str] = set()

    def rebooted() -> bool:
        record = world.cluster.record(node)
        if record is not None and record.fault is not None:
            codes.add(record.fault.code)
        return world.jobs(node, "reboot") >= 1 and world.state(node) == states.HEALTHY

    world.gpusim.gpu_lost(node, 1, log_xid=False)  # only the count tells: no XID, no exporter series
    world.wait("the missing GPU rebooted away", rebooted, node)
    assert c.GPU_COUNT_MATCHES in codes
    assert len(world.gpusim.node(node).present) == world.cluster.sim.gpus


def test_a_node_problem_detector_condition_drives_an_action_through_the_policy_table(world: World) -> None:
    node = world.cluster.nodes[3]
    deadlock = build_condition(None, "KernelDeadlock", "True", "DockerHung", "task docker:7 blocked", time.time())
    world.cluster.kube.patch(NODES, node, conditions_patch([deadlock]), patch_type="strategic",
                             subresource="status")
    world.wait("the policy's reboot for KernelDeadlock", lambda: world.jobs(node, "reboot") >= 1
               and world.state(node) == states.HEALTHY, node)
    record = world.cluster.record(node)
    assert record is not None
    assert [(h.kind, h.code, h.action) for h in record.history] == [(c.KIND_CONDITION, "KernelDeadlock", "reboot")]
    assert world.jobs(node, "reboot") == 1  # the same condition staying is the same occurrence


def test_the_remediation_condition_and_taint_come_and_go_and_others_taints_stay(world: World) -> None:
    node = world.cluster.nodes[0]
    add_taint(world.cluster.kube, node, OTHERS_TAINT)  # read once, guarded, again on a 409 (the taint manager's)

    def keys() -> set[str]:
        return {t["key"] for t in (world.node(node).get("spec") or {}).get("taints") or []}

    world.gpusim.kernel_xid(node, 0, 79)
    world.wait("our taint and GPURemediation=True while held", lambda: DEFAULT_TAINT_KEY in keys()
               and (world.condition(node, REMEDIATION_CONDITION) or {}).get("status") == "True", node)
    world.wait("healthy, our taint gone, GPURemediation=False", lambda: world.state(node) == states.HEALTHY
               and DEFAULT_TAINT_KEY not in keys()
               and (world.condition(node, REMEDIATION_CONDITION) or {}).get("status") == "False", node)
    assert OTHERS_TAINT["key"] in keys()


def test_an_xid_flood_is_a_few_status_writes(world: World) -> None:
    """The agent follows the kernel log (issue 48): a GPU printing 200 Xid lines at once is every line counted and
    a handful of status writes (one carries what arrived meanwhile), not 200."""
    node = world.cluster.nodes[1]
    agent = world.cluster.sim.agents[node].agent
    writes_before = agent.metrics.status_writes.value(result="ok")
    for _ in range(200):
        world.gpusim.kernel_xid(node, 3, 79)
    world.wait("a reboot, then healthy", lambda: world.jobs(node, "reboot") >= 1
               and world.state(node) == states.HEALTHY
               and (world.condition(node, c.GPU_HEALTHY) or {}).get("status") == "True", node)
    bus = normalise_bus_id(world.gpusim.node(node).gpus[3].pci_bus_id)
    assert agent.metrics.xid.value(pci_bus_id=bus, xid="79") == 200  # every line counted
    # the fault (the flood coalesced), healthy again after the reboot, and little else: not 200
    assert agent.metrics.status_writes.value(result="ok") - writes_before <= 6
    assert world.jobs(node, "reboot") == 1  # a read begun before the reboot says nothing of the node after it
