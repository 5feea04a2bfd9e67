"""A storm in one read (issue 30): the detect cycle counts the new faults of the whole read before acting on
any, so a storm past the breaker's threshold opens it with nothing cordoned, and one below it is acted on in
full; one write of the breaker state per read; with --shards, a storm split across the replicas opens it in
each before either acts; the fleet gauges follow a long cycle as it goes; a source's first wave is acted on
while a straggler's exporter still hangs."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from gpuremediate.actions.breaker import BREAKER_CONFIGMAP
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import CONFIGMAPS, EVENTS, NAMESPACES, NODES
from gpuremediate.kube.shards import preferred_shard
from gpuremediate.loops import detect
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.vocab.record import BLOCK_BREAKER, NodeRecord, record_from_node
from sim.kubeapi import KubeAPIServer

NAMESPACE = "gpuremediate-system"
# look_s = 0: one read's count alone (the arrival rate's look has its tests in test_detect_look.py)
POLICY = loads_policy('[budget]\nmax_unavailable = "100%"\n[breaker]\nthreshold_percent = 30\nmin_nodes = 3\n'
                      'look_s = 0\n')


def readings(node: str, faulty: bool) -> NodeReadings:
    return NodeReadings(node=node, source="prometheus", status=SOURCE_OK,
                        gpus=(GpuReading(node=node, gpu="0", uuid=f"GPU-{node}", xid=79 if faulty else None),))


class FleetSource:
    """One read of the whole fleet, as a Prometheus query answers: an XID 79 on ``faulty``."""

    def __init__(self, nodes: list[str], faulty: set[str]) -> None:
        self.nodes, self.faulty = nodes, faulty

    def read(self) -> list[NodeReadings]:
        return [readings(n, n in self.faulty) for n in self.nodes]


class World:
    def __init__(self, count: int) -> None:
        self.srv = KubeAPIServer().start()
        self.client = KubeClient(ClusterConfig(server=self.srv.url, token_source=StaticToken(self.srv.admin_token)),
                                 qps=1000, burst=1000)
        self.client.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        self.names = [f"gpu-{i:02d}" for i in range(count)]
        for name in self.names:
            self.client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                                       "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        self.controllers: list[Controller] = []

    def controller(self, source: object, **settings: object) -> Controller:
        made = Controller(Settings(namespace=NAMESPACE, **settings), POLICY, client=self.client,  # type: ignore[arg-type]
                          source=source)  # type: ignore[arg-type]
        self.controllers.append(made)
        return made

    def cordoned(self) -> set[str]:
        return {n for n in self.names if self.client.get(NODES, n).get("spec", {}).get("unschedulable")}

    def breaker_writes(self) -> int:
        return sum(1 for _u, verb, _g, resource, _s, _ns, name in self.srv.requests
                   if resource == "configmaps" and name in (BREAKER_CONFIGMAP, None)
                   and verb in ("create", "update", "patch"))

    def breaker_open(self) -> bool:
        data = self.client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NAMESPACE).get("data") or {}
        return bool(json.loads(data.get("state", "{}")).get("open"))

    def events(self, reason: str) -> list[str]:
        return [e["message"] for e in self.client.list(EVENTS, "default")["items"] if e["reason"] == reason]

    def close(self) -> None:
        for controller in self.controllers:
            controller.stop()
        self.client.close()
        self.srv.stop()


@pytest.fixture
def world() -> Iterator[World]:
    made = World(20)
    yield made
    made.close()


def _cycle(controller: Controller) -> None:
    assert controller.start_caches(timeout=20)
    controller.ctx.breakers.start()
    controller.detect.cycle()
    controller.detect.events.flush(10)
    controller.reports.flush(10)


def test_a_storm_past_the_threshold_in_one_read_opens_the_breaker_with_nothing_cordoned(world: World) -> None:
    faulty = set(world.names[:12])  # 60 % of the fleet in the same scrape
    controller = world.controller(FleetSource(world.names, faulty))
    _cycle(controller)
    assert world.cordoned() == set()
    assert world.breaker_open()
    assert world.breaker_writes() == 1, world.srv.requests
    held = [r for n in sorted(faulty) if isinstance(r := record_from_node(world.client.get(NODES, n)), NodeRecord)]
    assert len(held) == 12 and all(r.blocked is not None and r.blocked.reason == BLOCK_BREAKER for r in held)
    assert all(r.held is not None and (r.held.kind, r.held.code) == ("xid", "79") for r in held)  # shown, not lost
    opened = world.events("GPURemediationBreakerOpen")
    assert len(opened) == 1 and "12 of 20 GPU nodes faulted" in opened[0], opened


def test_a_fault_wave_below_the_threshold_is_acted_on_in_full(world: World) -> None:
    faulty = set(world.names[:4])  # 20 %
    controller = world.controller(FleetSource(world.names, faulty))
    _cycle(controller)
    assert world.cordoned() == faulty
    assert not world.breaker_open() and world.breaker_writes() == 1


def test_the_fleet_gauges_follow_a_long_cycle(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "GAUGES_EVERY_S", 0.0)
    faulty = set(world.names[:5])
    controller = world.controller(FleetSource(world.names, faulty))
    seen: list[float] = []
    gauge = controller.metrics.nodes
    real = gauge.replace_all

    def replace_all(values: object) -> None:
        real(values)  # type: ignore[arg-type]
        seen.append(gauge.value(state="draining"))

    gauge.replace_all = replace_all  # type: ignore[method-assign]
    _cycle(controller)
    assert any(0 < value < len(faulty) for value in seen), seen  # shown while the cycle still ran
    assert seen[-1] == len(faulty)


def _sharded_pair(world: World, faulty: set[str]) -> list[Controller]:
    names = [next(f"replica-{i}" for i in range(100) if preferred_shard(f"replica-{i}", 2) == s) for s in (0, 1)]
    made = [world.controller(FleetSource(world.names, faulty), shards=2, identity=name) for name in names]
    for _ in range(3):  # each replica holds its preferred shard: its own set of leases' rounds
        for controller in made:
            assert controller.shards is not None
            controller.shards.round()
    for controller in made:
        assert controller.shards is not None and len(controller.shards.owned()) == 1
    return made


@pytest.fixture
def wide_world() -> Iterator[World]:
    made = World(48)  # two shards of about 24: each replica's nodes are a sample of the fleet
    yield made
    made.close()


def test_a_storm_split_across_two_shards_opens_the_breaker_in_each_before_either_acts(wide_world: World) -> None:
    world = wide_world
    faulty = set(world.names[::5]) | set(world.names[1::5]) | set(world.names[2::5])  # 60 %, all shards
    for controller in _sharded_pair(world, faulty):
        _cycle(controller)
    assert world.cordoned() == set()
    assert world.breaker_open()


def test_a_fault_wave_below_the_threshold_split_across_two_shards_is_acted_on_in_full(wide_world: World) -> None:
    world = wide_world
    faulty = set(world.names[::5])  # 20 %
    for controller in _sharded_pair(world, faulty):
        _cycle(controller)
    assert world.cordoned() == faulty
    assert not world.breaker_open()


class HungStraggler:
    """A source in waves: every node but the last at once, the last only when the test lets it answer (an
    exporter that hangs until its scrape times out)."""

    def __init__(self, nodes: list[str], faulty: set[str]) -> None:
        self.nodes, self.faulty = nodes, faulty
        self.release = threading.Event()

    def read(self) -> list[NodeReadings]:
        return [r for wave in self.read_waves() for r in wave]

    def read_waves(self) -> Iterator[list[NodeReadings]]:
        yield [readings(n, n in self.faulty) for n in self.nodes[:-1]]
        assert self.release.wait(30), "the test never let the straggler answer"
        yield [readings(self.nodes[-1], False)]


def test_a_fault_is_acted_on_while_another_node_s_exporter_still_hangs(world: World) -> None:
    source = HungStraggler(world.names, {world.names[0]})
    controller = world.controller(source)
    assert controller.start_caches(timeout=20)
    controller.ctx.breakers.start()
    cycle = threading.Thread(target=controller.detect.cycle, daemon=True)
    cycle.start()
    try:
        from sim.waiting import wait_for
        wait_for(lambda: world.cordoned() == {world.names[0]}, 20, "the faulty node cordoned before the straggler")
        assert cycle.is_alive(), "the cycle ended: the straggler was not waited for at all"
    finally:
        source.release.set()
        cycle.join(20)
    assert not cycle.is_alive()


def test_a_storm_in_one_domain_opens_its_breaker_before_any_of_its_nodes_is_cordoned(world: World) -> None:
    """5 of 20 nodes in rack a: 3 of them fault in one read (60 % of the rack, 15 % of the fleet): the domain
    breaker opens for rack a with none of them cordoned; a fault in rack b still takes its ordinary path."""
    rack_a, rack_b = world.names[:5], world.names[5:10]
    for name in world.names:
        rack = "a" if name in rack_a else "b" if name in rack_b else "c"
        world.client.patch(NODES, name, {"metadata": {"labels": {"example.com/rack": rack}}})
    policy = loads_policy('[budget]\nmax_unavailable = "100%"\n[breaker]\ndomain_labels = ["example.com/rack"]\n'
                          'look_s = 0\n')  # 4 of 20 at once would be held for a look (test_detect_look.py)
    faulty = {*rack_a[:3], rack_b[0]}
    controller = Controller(Settings(namespace=NAMESPACE), policy, client=world.client,
                            source=FleetSource(world.names, faulty))  # type: ignore[arg-type]
    world.controllers.append(controller)
    _cycle(controller)
    assert world.cordoned() == {rack_b[0]}
    state = json.loads(world.client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NAMESPACE)["data"]["state"])
    assert [(d["label"], d["value"]) for d in state["domains"]] == [("example.com/rack", "a")], state
