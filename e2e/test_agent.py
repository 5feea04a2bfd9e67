"""The node agent end to end (issue 12): gpu-sim plays each node's kernel log and nvidia-smi, an agent per
node publishes its NodeConditions, and the real controller acts on them beside the exporter's metrics.

Run: ``python -m pytest e2e/test_agent.py -q``. In-process (emulator, gpu-sim, node simulator, agents and
controller in this process: SimCluster(agents=True)), busy cluster on unless GPUREMEDIATE_SIM_BUSY=0. Each
scenario has a node of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuremediate.actions.node_status import (
    DEFAULT_TAINT_KEY,
    REMEDIATION_CONDITION,
    build_condition,
    conditions_patch,
    find_condition,
)
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.resources import NODES
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals import conditions as c
from gpuremediate.state import states
from gpuremediate.state.record import NodeRecord, record_from_node
from sim.cluster import SimCluster
from sim.waiting import wait_for

POLICY = """
[budget]
max_unavailable = "100%"

[breaker]
enabled = false

[repeat_offender]
count = 10

[taint]
enabled = true

[[conditions.rules]]
type = "KernelDeadlock"
status = "True"
action = "reboot"
"""
TIMEOUT_S = 30.0  # generous: a loaded 2-core machine; each scenario normally takes a few seconds
OTHERS_TAINT = {"key": "example.com/rack-maintenance", "value": "r7", "effect": "PreferNoSchedule"}


@dataclass
class World:
    cluster: SimCluster
    controller: Controller

    def node(self, name: str) -> dict[str, Any]:
        return self.cluster.kube.get(NODES, name)

    def record(self, name: str) -> NodeRecord | None:
        found = record_from_node(self.node(name))
        return found if isinstance(found, NodeRecord) else None

    def state(self, name: str) -> str:
        record = self.record(name)
        return states.HEALTHY if record is None else record.state

    def jobs(self, name: str, kind: str) -> int:
        return sum(1 for node, k, ok in self.cluster.job_log if node == name and k == kind and ok)

    def condition(self, name: str, ctype: str) -> dict[str, Any] | None:
        found = find_condition(self.node(name), ctype)
        return None if found is None else dict(found)

    def wait(self, what: str, predicate: Any, name: str) -> None:
        wait_for(predicate, timeout=TIMEOUT_S, describe=what, seen=lambda: self.summary(name))

    def summary(self, name: str) -> str:
        record = self.record(name)
        conds = {k: (v or {}).get("status") for k in (*c.AGENT_CONDITIONS, REMEDIATION_CONDITION)
                 for v in [self.condition(name, k)]}
        return f"{name}: {self.state(name)} fault={record.fault if record else None} conditions={conds} " \
               f"jobs={[j for j in self.cluster.job_log if j[0] == name]}"


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with SimCluster(nodes=5, gpus=4, agents=True) as cluster:
        policy = loads_policy(POLICY, "<agent e2e policy>")
        settings = Settings(kubeconfig=cluster.kubeconfig, exporter_port=cluster.exporter_port,
                            scrape_interval_s=0.3, resync_s=0.3, metrics_port=0)
        controller = Controller(settings, policy, client=cluster.kube)
        assert controller.start_caches(30), "the node cache did not sync"
        controller.start_loops()
        world = World(cluster, controller)
        for name in cluster.node_names:
            world.wait("the agent's conditions", lambda n=name: world.condition(n, c.GPU_HEALTHY) is not None, name)
        try:
            yield world
        finally:
            controller.stop()


def test_a_repeated_xid_of_the_same_code_is_acted_on_again_after_repair(world: World) -> None:
    node = "gpu-node-1"
    world.cluster.gpusim.kernel_xid(node, 2, 79)
    world.wait("the first reboot, then healthy", lambda: world.jobs(node, "reboot") == 1
               and world.state(node) == states.HEALTHY, node)
    world.wait("the agent healthy after the reboot", lambda: (world.condition(node, c.GPU_HEALTHY) or {}).get(
        "status") == "True", node)
    world.cluster.gpusim.kernel_xid(node, 2, 79)  # the same code again: a new kernel-log line
    world.wait("a second reboot", lambda: world.jobs(node, "reboot") == 2 and world.state(node) == states.HEALTHY,
               node)


def test_exporter_down_and_driver_hung_is_remediated_not_left_unknown(world: World) -> None:
    node = "gpu-node-2"
    world.cluster.gpusim.set_down(node, "refuse")
    world.cluster.gpusim.driver_hang(node)
    world.wait("the agent to say the driver hangs", lambda: (world.condition(node, c.GPU_DRIVER_RESPONSIVE)
                                                             or {}).get("status") == "False", node)
    world.wait("a reboot, then healthy with the exporter back", lambda: world.jobs(node, "reboot") >= 1
               and world.state(node) == states.HEALTHY and node not in world.controller.detect.unknown, node)


def test_a_missing_gpu_is_found(world: World) -> None:
    node = "gpu-node-3"
    codes: set[str] = set()

    def rebooted() -> bool:
        record = world.record(node)
        if record is not None and record.fault is not None:
            codes.add(record.fault.code)
        return world.jobs(node, "reboot") >= 1 and world.state(node) == states.HEALTHY

    world.cluster.gpusim.gpu_lost(node, 1, log_xid=False)  # only the count tells: no XID, no exporter series
    world.wait("the missing GPU rebooted away", rebooted, node)
    assert c.GPU_COUNT_MATCHES in codes
    assert len(world.cluster.gpusim.node(node).present) == 4


def test_a_node_problem_detector_condition_drives_an_action_through_the_policy_table(world: World) -> None:
    node = "gpu-node-4"
    deadlock = build_condition(None, "KernelDeadlock", "True", "DockerHung", "task docker:7 blocked", time.time())
    world.cluster.kube.patch(NODES, node, conditions_patch([deadlock]), patch_type="strategic", subresource="status")
    world.wait("the policy's reboot for KernelDeadlock", lambda: world.jobs(node, "reboot") >= 1
               and world.state(node) == states.HEALTHY, node)
    record = world.record(node)
    assert record is not None
    assert [(h.kind, h.code, h.action) for h in record.history] == [(c.KIND_CONDITION, "KernelDeadlock", "reboot")]
    assert world.jobs(node, "reboot") == 1  # the same condition staying is the same occurrence


def test_the_remediation_condition_and_taint_come_and_go_and_others_taints_stay(world: World) -> None:
    node = "gpu-node-5"
    taints = list((world.node(node).get("spec") or {}).get("taints") or [])
    world.cluster.kube.patch(NODES, node, {"metadata": {"resourceVersion": world.node(node)["metadata"][
        "resourceVersion"]}, "spec": {"taints": [*taints, OTHERS_TAINT]}})

    def keys() -> set[str]:
        return {t["key"] for t in (world.node(node).get("spec") or {}).get("taints") or []}

    world.cluster.gpusim.kernel_xid(node, 0, 79)
    world.wait("our taint and GPURemediation=True while held", lambda: DEFAULT_TAINT_KEY in keys()
               and (world.condition(node, REMEDIATION_CONDITION) or {}).get("status") == "True", node)
    world.wait("healthy, our taint gone, GPURemediation=False", lambda: world.state(node) == states.HEALTHY
               and DEFAULT_TAINT_KEY not in keys()
               and (world.condition(node, REMEDIATION_CONDITION) or {}).get("status") == "False", node)
    assert OTHERS_TAINT["key"] in keys()
