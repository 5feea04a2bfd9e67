"""A condition that turns to a fault is acted on from the Node watch, not on the next cycle (issue 48): the detect
loop's thread checks the nodes that arrived within CONDITION_WINDOW_S as one batch, so a storm of conditions is
counted by the breaker together, before any of them is cordoned."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

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
from gpuremediate.vocab import states
from gpuremediate.vocab.record import record_from_node
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "gpuremediate-system"
NAMES = [f"gpu-{i}" for i in range(10)]
POLICY = """
[breaker]
threshold_percent = 30
min_nodes = 3
[[conditions.rules]]
type = "KernelDeadlock"
status = "True"
action = "cordon"
"""


class Healthy:
    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=n, source="exporter", status=SOURCE_OK,
                             gpus=(GpuReading(node=n, gpu="0", uuid=f"GPU-{n}"),)) for n in NAMES]


@pytest.fixture
def world() -> Iterator[tuple[KubeClient, Controller]]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": NS}})
    for name in NAMES:
        client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}})
    controller = Controller(Settings(namespace=NS, scrape_interval_s=3600), loads_policy(POLICY), client=client,
                            source=Healthy())
    assert controller.start_caches(timeout=20)
    try:
        yield client, controller
    finally:
        controller.stop()
        srv.stop()


def fault(client: KubeClient, node: str, ctype: str = "KernelDeadlock", status: str = "True") -> None:
    cond = build_condition(None, ctype, status, "Hung", "task blocked (test)", time.time())
    client.patch(NODES, node, conditions_patch([cond]), patch_type="strategic", subresource="status")


def cached(controller: Controller, node: str) -> dict[str, Any]:
    found = controller.ctx.nodes.get(node)
    assert found is not None
    return found


def state(client: KubeClient, node: str) -> str | None:
    record = record_from_node(client.get(NODES, node))
    assert not isinstance(record, Exception)
    return None if record is None else record.state


def test_a_condition_turning_to_a_fault_is_cordoned_with_its_record_without_a_cycle(
        world: tuple[KubeClient, Controller]) -> None:
    client, controller = world
    controller.start_loops()
    wait_for(lambda: controller.detect.cycles >= 1, timeout=20, describe="the first cycle")
    fault(client, "gpu-3")
    wait_for(lambda: state(client, "gpu-3") == states.CORDONED, timeout=20, describe="gpu-3 cordoned")
    node = client.get(NODES, "gpu-3")
    assert node["spec"].get("unschedulable") is True
    record = record_from_node(node)
    assert record is not None and not isinstance(record, Exception)
    assert record.fault is not None and record.fault.code == "KernelDeadlock"  # the record says why
    assert controller.detect.cycles == 1  # the next cycle is an hour away: the watch did it


def test_a_storm_of_conditions_within_the_window_opens_the_breaker_before_any_cordon(
        world: tuple[KubeClient, Controller]) -> None:
    client, controller = world
    storm = NAMES[:5]  # half the fleet: past 30 %
    for name in storm:
        before = copy.deepcopy(cached(controller, name))
        fault(client, name)
        wait_for(lambda n=name: c.conditions_of(cached(controller, n)), timeout=10, describe=f"{name} cached")
        assert controller.detect.condition_arrived(before, cached(controller, name))
    assert controller.detect.check_arrivals() == storm  # one batch
    assert controller.ctx.breakers.latest().is_open
    assert all(state(client, n) in (None, states.HEALTHY) for n in storm)  # held: blocked by the breaker
    assert all(not client.get(NODES, n)["spec"].get("unschedulable") for n in storm)


def test_only_a_change_to_a_fault_arrives(world: tuple[KubeClient, Controller]) -> None:
    client, controller = world
    detect = controller.detect
    before = copy.deepcopy(cached(controller, "gpu-7"))
    fault(client, "gpu-7", status="False")  # no rule acts on KernelDeadlock=False
    wait_for(lambda: c.conditions_of(cached(controller, "gpu-7")), timeout=10, describe="cached")
    assert not detect.condition_arrived(before, cached(controller, "gpu-7"))
    healthy = copy.deepcopy(cached(controller, "gpu-7"))
    fault(client, "gpu-7")
    wait_for(lambda: c.conditions_of(cached(controller, "gpu-7"))[0]["status"] == "True", timeout=10,
             describe="cached")
    faulty = copy.deepcopy(cached(controller, "gpu-7"))
    assert detect.condition_arrived(healthy, faulty)
    assert not detect.condition_arrived(faulty, faulty)  # the same fault again (a heartbeat): nothing new
    assert detect.check_arrivals() == ["gpu-7"]
    assert state(client, "gpu-7") == states.CORDONED


class SlowRead(Healthy):
    """A read that lasts until the test lets it end (a 5,000-node read takes seconds)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.reading = threading.Event()

    def read(self) -> list[NodeReadings]:
        self.reading.set()
        self.release.wait(30)
        return super().read()


def test_a_condition_turning_to_a_fault_during_a_long_read_is_cordoned_before_the_read_ends() -> None:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": NS}})
    for name in NAMES:
        client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}})
    source = SlowRead()
    controller = Controller(Settings(namespace=NS, scrape_interval_s=3600), loads_policy(POLICY), client=client,
                            source=source)
    try:
        assert controller.start_caches(timeout=20)
        controller.start_loops()
        assert source.reading.wait(20), "the first read began"
        fault(client, "gpu-4")
        wait_for(lambda: state(client, "gpu-4") == states.CORDONED, timeout=20,
                 describe="gpu-4 cordoned while the read runs")
        assert controller.detect.cycles == 0 and not source.release.is_set()  # the read still runs
    finally:
        source.release.set()
        controller.stop()
        srv.stop()
