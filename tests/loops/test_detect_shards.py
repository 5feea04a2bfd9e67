"""With --shards the detect loop decides only for the nodes of the shards it holds: a fault on another
shard's node is that shard's replica's to act on (whatever the source answered about it, as Prometheus
answers for the whole fleet)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.kube.shards import ShardSet, preferred_shard, shard_of
from gpuremediate.policy import safety
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.loops.drain import DRAIN_ACTION, DrainLoop
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.kubeapi import KubeAPIServer

NAMESPACE = "gpuremediate-system"
NAMES = [f"gpu-{i}" for i in range(12)]


class EveryNodeFaulty:
    """An answer about the whole fleet, as a Prometheus query gives: an XID 79 on every node."""

    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=n, source="prometheus", status=SOURCE_OK,
                             gpus=(GpuReading(node=n, gpu="0", uuid=f"GPU-{n}", xid=79),)) for n in NAMES]


@pytest.fixture
def kube() -> Iterator[tuple[KubeAPIServer, KubeClient]]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
    for name in NAMES:
        client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                              "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    yield srv, client
    client.close()
    srv.stop()


def _one_cycle_holding_shard_0(client: KubeClient, policy_text: str, source: object = None,
                               source_for: Any = None) -> Controller:
    """A controller of --shards 2 holding shard 0 (another replica holds 1) after one detect cycle, stopped."""
    mine = next(f"replica-{i}" for i in range(100) if preferred_shard(f"replica-{i}", 2) == 0)
    theirs = next(f"replica-{i}" for i in range(100) if preferred_shard(f"replica-{i}", 2) == 1)
    controller = Controller(Settings(namespace=NAMESPACE, shards=2, identity=mine), loads_policy(policy_text),
                            client=client, source=source)  # type: ignore[arg-type]
    if source_for is not None:
        controller.detect.source = source_for(controller)
    other = ShardSet(client, NAMESPACE, theirs, 2)
    assert controller.shards is not None
    for _ in range(3):
        controller.shards.round()
        other.round()
    assert controller.shards.owned() == frozenset({0})
    assert controller.start_caches(timeout=20)
    try:
        controller.detect.cycle()
    finally:
        controller.stop()
    return controller


def test_only_the_held_shard_s_nodes_are_decided(kube: tuple[KubeAPIServer, KubeClient]) -> None:
    _srv, client = kube
    controller = _one_cycle_holding_shard_0(client, '[budget]\nmax_unavailable = "100%"\n[breaker]\nenabled = false\n',
                                            source=EveryNodeFaulty())
    acted = {n for n in NAMES if record_from_node(client.get(NODES, n)) is not None}
    assert acted == {n for n in NAMES if shard_of(n, 2) == 0} and acted
    assert controller.metrics.shard_nodes.value(shard="0") == len(acted)


class HandsTheShardAwayDuringTheRead:
    """A read during which the replica's only shard goes to another (a full read at 20,000 nodes takes 30-40 s);
    the answer has nothing for that shard's nodes, as the Prometheus source makes readings only for its own."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def read(self) -> list[NodeReadings]:
        assert self.controller.shards is not None
        self.controller.shards.owned = frozenset  # type: ignore[method-assign]  # held by another from now on
        return []


def test_a_shard_given_up_during_the_read_is_not_called_unknown(kube: tuple[KubeAPIServer, KubeClient]) -> None:
    _srv, client = kube
    controller = _one_cycle_holding_shard_0(client, "[breaker]\nenabled = false\n",
                                            source_for=HandsTheShardAwayDuringTheRead)
    assert controller.detect.unknown == {}  # before: every node of shard 0, "the source returned nothing"
    assert controller.metrics.fleet_unknown.value() == 0


class CountingReads:
    """The Node informer's reads, counted: a walk of the fleet's cache (``list``) and the Nodes looked up by name."""

    def __init__(self, controller: Controller) -> None:
        informer = controller.informer
        self.lists, self.got = 0, []  # type: tuple[int, list[str]]
        list_all, get_one = informer.list, informer.get

        def counted_list() -> list[dict[str, Any]]:
            self.lists += 1
            return list_all()

        def counted_get(name: str, namespace: str | None = None) -> dict[str, Any] | None:
            self.got.append(name)
            return get_one(name, namespace)

        informer.list = counted_list  # type: ignore[method-assign]
        informer.get = counted_get  # type: ignore[method-assign]


def test_a_replica_walks_its_share_of_the_node_cache_not_the_fleet(kube: tuple[KubeAPIServer, KubeClient]) -> None:
    """Each loop's resync and a fault's check (the fast path's, an arrival's) look at the held shard's Nodes only:
    at 100,000 cached Nodes a walk of the fleet cost 0.3 CPU-s, six loops each resync, and held the interpreter
    while the fault poll waited (a single fault's cordon took 16-89 s)."""
    _srv, client = kube
    controller = _one_cycle_holding_shard_0(client, '[budget]\nmax_unavailable = "100%"\n[breaker]\nenabled = false\n')
    mine = {n for n in NAMES if shard_of(n, 2) == 0}
    faulty = sorted(mine)[0]
    reads = CountingReads(controller)
    for loop in controller.node_loops:
        loop.resync()
    assert reads.lists == 0 and set(reads.got) <= mine and reads.got
    reads.got.clear()
    node = controller.ctx.nodes.get(faulty)
    assert node is not None
    controller.detect.check_nodes([node], {r.node: r for r in EveryNodeFaulty().read() if r.node == faulty})
    assert reads.lists == 0 and set(reads.got) <= mine
    assert record_from_node(client.get(NODES, faulty)) is not None  # decided and written as before
    assert controller.ctx.nodes.gpu_count() == len(NAMES)  # the breaker's and the budget's fleet: every shard's
    reads.got.clear()
    drain = next(loop for loop in controller.node_loops if isinstance(loop, DrainLoop))
    for _ in range(50):  # its admission: the notable nodes and the fleet's size, not a view of each Node
        if drain.reconcile_name(faulty) != drain.retry_after_conflict():  # (our Node writes meet the emulator's)
            break
        time.sleep(0.1)
    controller.detect._gauges()  # the budget gauge the same
    assert reads.lists == 0 and set(reads.got) <= mine
    record = record_from_node(client.get(NODES, faulty))
    assert isinstance(record, NodeRecord) and record.action is not None and record.action.kind == DRAIN_ACTION
    assert controller.metrics.budget_limit.value() == len(NAMES)  # 100 % of the fleet, every shard's nodes
    walked = [safety.node_view(n) for n in controller.ctx.nodes.gpu_nodes()]  # what the gauge counted before
    assert controller.metrics.budget_in_use.value() == sum(v.share for v in walked if v.out_of_service)


def test_a_shard_gained_is_read_at_once_not_one_interval_on(kube: tuple[KubeAPIServer, KubeClient]) -> None:
    """The fault fast path compares with a full read: a replica whose first cycle came before its shards settled
    read nothing, and a single fault on its share waited for the next read (38 s at 20,000 nodes)."""
    _srv, client = kube
    controller = _one_cycle_holding_shard_0(client, "[breaker]\nenabled = false\n")
    swept: list[frozenset[int]] = []
    controller.node_gone.sweep = swept.append  # type: ignore[method-assign]
    controller.acting = True
    controller._shards_swept = frozenset()
    controller.detect._stopping.clear()  # stopped by the fixture: waiting again, as a running loop does
    controller._shards_changed(frozenset({0}))  # shard 0 gained
    assert controller.detect._read_now.is_set()
    controller.detect._between_cycles(time.monotonic() + 3600)  # returns at once: the next cycle now
    assert not controller.detect._read_now.is_set()  # taken by that cycle
    controller._shards_changed(frozenset({0}))  # nothing new: the next cycle at its interval
    assert not controller.detect._read_now.is_set()
    controller._shards_changed(frozenset({0, 1}))
    assert controller.detect._read_now.is_set()
    for thread in [t for t in threading.enumerate() if t.name == "node-gone-sweep"]:
        thread.join(10)
    assert swept == [frozenset({0}), frozenset({1})]


def test_a_replica_keeps_the_other_shards_nodes_packed_and_unpacks_a_shard_it_takes(
        kube: tuple[KubeAPIServer, KubeClient]) -> None:
    """The node cache holds the other shards' Nodes packed (issue 48: each replica cached every Node whole, 1 GB at
    100,000 realistic ones): a read of a packed Node gives it whole, the fleet still counts, and a shard taken over is
    whole in the cache in the round that takes it, before the replica acts on it (``ShardSet.on_held``)."""
    _srv, client = kube
    mine = next(f"replica-{i}" for i in range(100) if preferred_shard(f"replica-{i}", 2) == 0)
    theirs = next(f"replica-{i}" for i in range(100) if preferred_shard(f"replica-{i}", 2) == 1)
    controller = Controller(Settings(namespace=NAMESPACE, shards=2, identity=mine), loads_policy(""), client=client,
                            source=EveryNodeFaulty())  # type: ignore[arg-type]
    other = ShardSet(client, NAMESPACE, theirs, 2)
    shards, informer = controller.shards, controller.informer
    assert shards is not None
    for _ in range(3):
        shards.round()
        other.round()
    assert controller.start_caches(timeout=20)
    try:
        def whole() -> set[str]:  # a stored object is handed out as it is; a packed one is a new object each read
            return {n for n in NAMES if informer.get(n) is informer.get(n)}

        assert whole() == {n for n in NAMES if shard_of(n, 2) == 0} and whole()
        for name in NAMES:
            assert informer.get(name) == controller.ctx.nodes.get(name)
            assert informer.get(name)["metadata"]["labels"] == client.get(NODES, name)["metadata"]["labels"]  # type: ignore[index]
        assert controller.ctx.nodes.gpu_count() == len(NAMES)
        other._release_all()  # the other replica shuts down: its shard is free
        shards.round()
        assert shards.held() == frozenset({0, 1}) and shards.owned() == frozenset({0})
        assert whole() == set(NAMES)  # before the replica acts on shard 1
        shards.round()
        assert shards.owned() == frozenset({0, 1})
    finally:
        controller.stop()
