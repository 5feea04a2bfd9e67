"""The detect loop over both sources: metrics and NodeConditions (issue 12). A node whose exporter is down
but whose agent says the driver hangs is acted on, not left unknown; a node-problem-detector condition
acts through the policy's [conditions] table; while the metrics are unknown their handled fingerprints
stay (a stale XID does not come back as new)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest

from gpuremediate.actions.node_status import build_condition, conditions_patch
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.policy import conditions as c
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.signals.sources import unknown
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, node_patch, record_from_node
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

POD_NS = "gpuremediate-system"
NAMES = [f"gpu-{i}" for i in range(6)]
POLICY = """
[[conditions.rules]]
type = "KernelDeadlock"
status = "True"
action = "cordon"
"""


class ScriptedSource:
    def __init__(self) -> None:
        self.down: set[str] = set()
        self.xid: set[str] = set()
        self.observed: dict[str, float] = {}  # node -> when its reading's scrape began (0: unsaid)

    def read(self) -> list[NodeReadings]:
        out = []
        for node in NAMES:
            if node in self.down:
                out.append(unknown(node, "exporter", "scrape failed: timed out", 1.0))
                continue
            gpu = GpuReading(node=node, gpu="0", uuid=f"GPU-{node}", xid=79 if node in self.xid else None)
            out.append(NodeReadings(node=node, source="exporter", status=SOURCE_OK, gpus=(gpu,),
                                    observed_at=self.observed.get(node, 0.0)))
        return out


@dataclasses.dataclass
class World:
    client: KubeClient
    controller: Controller
    source: ScriptedSource

    def condition(self, node: str, ctype: str, status: str, reason: str) -> None:
        cond = build_condition(None, ctype, status, reason, f"{ctype} {status} (test)", time.time())
        self.client.patch(NODES, node, conditions_patch([cond]), patch_type="strategic", subresource="status")
        wait_for(lambda: any(x.get("type") == ctype for x in self._cached(node).get("status", {}).get(
            "conditions", [])), timeout=10, describe=f"{ctype} in the node cache")

    def _cached(self, node: str) -> dict:  # type: ignore[type-arg]
        return next(n for n in self.controller.ctx.nodes.gpu_nodes() if n["metadata"]["name"] == node)

    def record(self, node: str) -> NodeRecord | None:
        found = record_from_node(self.client.get(NODES, node))
        assert not isinstance(found, Exception)
        return found

    def cycle(self) -> None:
        self.controller.detect.cycle()


@pytest.fixture
def world() -> Iterator[World]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": POD_NS}})
    for name in NAMES:
        client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}})
    source = ScriptedSource()
    controller = Controller(Settings(namespace=POD_NS, scrape_interval_s=0.05), loads_policy(POLICY), client=client,
                            source=source)
    assert controller.start_caches(timeout=20)
    try:
        yield World(client, controller, source)
    finally:
        controller.stop()
        srv.stop()


def test_exporter_down_and_driver_hung_is_acted_on_not_unknown(world: World) -> None:
    world.source.down.add("gpu-1")
    world.cycle()
    assert "gpu-1" in world.controller.detect.unknown
    world.condition("gpu-1", c.GPU_DRIVER_RESPONSIVE, "False", "NvidiaSmiTimeout")
    world.cycle()
    record = world.record("gpu-1")
    assert record is not None and record.state != states.HEALTHY
    assert record.fault is not None and record.fault.kind == c.KIND_CONDITION
    assert record.fault.code == c.GPU_DRIVER_RESPONSIVE
    assert "gpu-1" not in world.controller.detect.unknown


def test_exporter_down_without_an_actionable_condition_stays_unknown(world: World) -> None:
    world.source.down.add("gpu-2")
    world.condition("gpu-2", c.GPU_HEALTHY, "True", "NoGPUFault")
    world.cycle()
    assert world.record("gpu-2") is None and "gpu-2" in world.controller.detect.unknown


def test_a_node_problem_detector_condition_acts_through_the_policy_table(world: World) -> None:
    world.condition("gpu-3", "KernelDeadlock", "True", "DockerHung")
    world.cycle()
    record = world.record("gpu-3")
    assert record is not None and record.state == states.CORDONED
    assert record.fault is not None and record.fault.code == "KernelDeadlock"


def test_metric_fingerprints_stay_handled_while_only_the_conditions_are_known(world: World) -> None:
    handled = ("xid/GPU-gpu-4/79", "condition:GPUHealthy:False:NeedsReboot:2026-12-01T00:00:00Z")
    world.client.patch(NODES, "gpu-4", node_patch(NodeRecord(handled=handled)))
    world.source.down.add("gpu-4")
    world.condition("gpu-4", "KernelDeadlock", "False", "KernelHasNoDeadlock")
    wait_for(lambda: record_from_node(world._cached("gpu-4")) is not None, timeout=10, describe="record cached")
    world.condition("gpu-4", c.GPU_DRIVER_RESPONSIVE, "False", "NvidiaSmiTimeout")
    world.cycle()
    record = world.record("gpu-4")
    assert record is not None
    assert "xid/GPU-gpu-4/79" in record.handled  # the exporter cannot say it is gone
    assert handled[1] not in record.handled  # the conditions are current: that one is gone


def test_a_read_begun_before_the_node_came_back_does_not_open_a_second_flow(world: World) -> None:
    """A node repaired faster than one read (the agent's condition path, issue 48) comes back healthy while a scrape
    begun before its reboot is still answering with the XID the reboot cleared: that reading shows the node before
    its repair, never a new fault. A read begun after its return with the XID is one."""
    node = "gpu-2"
    back = world.controller.ctx.clock()
    world.client.patch(NODES, node, node_patch(NodeRecord(state=states.HEALTHY, since=back),
                                               owner=world.client.get(NODES, node)))
    wait_for(lambda: record_from_node(world._cached(node)) is not None, 10, "the record in the node cache")
    world.source.xid.add(node)
    world.source.observed[node] = back - 2.0
    world.cycle()
    record = world.record(node)
    assert record is not None and record.state == states.HEALTHY and record.fault is None
    assert not world.client.get(NODES, node).get("spec", {}).get("unschedulable")
    world.source.observed[node] = back + 1.0
    world.cycle()
    record = world.record(node)
    assert record is not None and record.state != states.HEALTHY
    assert record.fault is not None and record.fault.code == "79"


def test_nic_findings_are_counted_per_kind_from_the_agents_condition(world: World) -> None:
    metrics = world.controller.ctx.metrics
    world.condition("gpu-1", c.GPU_NETWORK_HEALTHY, "False", "NicDown:mlx5_0")
    world.condition("gpu-2", c.GPU_NETWORK_HEALTHY, "False", "NicStuckDown:mlx5_3")
    world.condition("gpu-3", c.GPU_NETWORK_HEALTHY, "False", "NicFlapping:mlx5_1")
    world.condition("gpu-4", c.GPU_NETWORK_HEALTHY, "True", "PortsHealthy")
    world.cycle()
    assert metrics.nic_nodes.value(kind="nic-down") == 2
    assert metrics.nic_nodes.value(kind="nic-flapping") == 1
    assert metrics.nic_nodes.value(kind="nic-errors") == 0
    world.condition("gpu-1", c.GPU_NETWORK_HEALTHY, "True", "PortsHealthy")
    wait_for(lambda: world._cached("gpu-1")["status"]["conditions"][0].get("status") == "True", timeout=10,
             describe="the recovered condition in the node cache")
    world.cycle()
    assert metrics.nic_nodes.value(kind="nic-down") == 1
