"""Evictions go out together across the nodes being drained, not one round trip after another (issue 27).

kubectl drain sends one eviction per pod at once. The built-in drain sends each due pod's eviction into a pool
shared by every node draining (``EVICTIONS_IN_FLIGHT`` at once) and returns; the answers are recorded by the
node's next step, which each answer queues. Each eviction is still fenced for its node (the shard fence reads
the node from the sending thread's context), a PDB's refusal still names the PDB in the record, and an eviction
in flight is never sent again.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube import shards as shard_fence
from gpuremediate.kube.shards import acting_for
from gpuremediate.loops.drain_evict import EVICTIONS_IN_FLIGHT, EvictionDrain
from gpuremediate.loops.step import InProgress
from gpuremediate.policy.config import Policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import BLOCK_PDB, NodeRecord, start_action
from sim.waiting import wait_for

PDB_429 = (b'{"kind":"Status","code":429,"reason":"TooManyRequests","message":"Cannot evict pod as it would '
           b'violate the pod\'s disruption budget.","details":{"causes":[{"reason":"DisruptionBudget","message":'
           b'"The disruption budget train-pdb needs 2 healthy pods and has 2 currently"}]}}')


class SlowEvictions:
    """A client whose evictions each wait until ``release`` is set, recording how many were in flight at once,
    for which node each was sent, and how often each pod was asked."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.refuse = refuse
        self.release = threading.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.acting_for: Counter[str | None] = Counter()
        self.asked: Counter[str] = Counter()
        self._lock = threading.Lock()

    def watch(self, *_: Any, **__: Any) -> None:  # a client that can watch: a real API server's
        raise AssertionError("the eviction drain does not watch")

    def evict(self, name: str, namespace: str, **_: Any) -> None:
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.acting_for[shard_fence._acting_for.get()] += 1
            self.asked[name] += 1
        try:
            self.release.wait(10)
            if name in self.refuse:
                raise errors.api_error(429, PDB_429)
        finally:
            with self._lock:
                self.in_flight -= 1


class Context:
    """The drain context a step sees: its node's pods, a writer that keeps the last record, the requeues."""

    def __init__(self, client: SlowEvictions, pods: dict[str, list[dict[str, Any]]]) -> None:
        self.client = client
        self.pods = pods
        self.written: dict[str, NodeRecord] = {}
        self.requeued: Counter[str] = Counter()
        self.writer = SimpleNamespace(dry_run=False, write=self._write)
        self.metrics = SimpleNamespace(evictions=SimpleNamespace(inc=lambda **_: None),
                                       count_api_error=lambda _e: None)
        self.policy = Policy()
        self.told: list[str] = []  # the workload notices (GPUFault Events): "Kind namespace/name"
        self.events = SimpleNamespace(dry_run=False, object_event=lambda ref, *_: self.told.append(
            f"{ref.kind} {ref.namespace}/{ref.name}"))

    def _write(self, node: dict[str, Any], record: NodeRecord) -> dict[str, Any]:
        self.written[node["metadata"]["name"]] = record
        return node

    def clock(self) -> float:
        return 100.0

    def targets(self, node: dict[str, Any], record: NodeRecord, confirm: bool = False) -> list[dict[str, Any]]:
        return self.pods[node["metadata"]["name"]]

    def stop_watching(self, node: str) -> None:
        pass

    def requeue(self, node: str) -> None:
        self.requeued[node] += 1


def pods_of(node: str, count: int) -> list[dict[str, Any]]:
    return [{"metadata": {"name": f"{node}-train-{i}", "namespace": "team-a", "uid": f"{node}-{i}"}}
            for i in range(count)]


def draining() -> NodeRecord:
    return start_action(NodeRecord(state=states.DRAINING, since=1.0, cordoned_by_us=True), "drain", "", 1, 1.0,
                        3600.0)


def step(drain: EvictionDrain, ctx: Context, name: str, record: NodeRecord) -> object:
    with acting_for(name):
        return drain.step(ctx, {"metadata": {"name": name}}, record)  # type: ignore[arg-type]


def test_evictions_of_several_nodes_are_in_flight_together_each_fenced_for_its_node() -> None:
    client = SlowEvictions()
    nodes = [f"gpu-{i}" for i in range(5)]
    ctx = Context(client, {n: pods_of(n, 10) for n in nodes})
    drain = EvictionDrain()
    try:
        started = time.monotonic()
        for name in nodes:  # each step sends and returns at once: no step waits for an answer
            assert isinstance(step(drain, ctx, name, draining()), InProgress)
        assert time.monotonic() - started < 5.0
        assert wait_for(lambda: client.in_flight == EVICTIONS_IN_FLIGHT, 5.0)  # 32 of the 50 at once, no more
        for name in nodes:  # a step while its evictions are in flight sends none of them again
            step(drain, ctx, name, draining())
        client.release.set()
        assert wait_for(lambda: sum(client.asked.values()) == 50 and client.in_flight == 0, 10.0)
        assert client.most_in_flight == EVICTIONS_IN_FLIGHT
        assert set(client.asked.values()) == {1}
        assert client.acting_for == Counter({n: 10 for n in nodes})
        assert wait_for(lambda: all(ctx.requeued[n] >= 10 for n in nodes), 5.0)  # each answer queued its node
    finally:
        drain.close()


def test_a_pdb_refusal_is_recorded_by_the_step_after_its_answer() -> None:
    client = SlowEvictions(refuse=frozenset({"gpu-0-train-3"}))
    client.release.set()
    ctx = Context(client, {"gpu-0": pods_of("gpu-0", 5)})
    drain = EvictionDrain()
    try:
        step(drain, ctx, "gpu-0", draining())
        assert wait_for(lambda: sum(client.asked.values()) == 5 and client.in_flight == 0, 5.0)
        step(drain, ctx, "gpu-0", draining())
        blocked = ctx.written["gpu-0"].blocked
        assert blocked is not None and blocked.reason == BLOCK_PDB and blocked.detail == "team-a/train-pdb"
        assert client.asked["gpu-0-train-3"] == 1  # not asked again before the drain's retry_s
        assert len(ctx.told) == len(set(ctx.told)) == 5, "each evicted pod told why once"
    finally:
        drain.close()


def test_after_close_nothing_is_sent() -> None:
    client = SlowEvictions()
    client.release.set()
    ctx = Context(client, {"gpu-0": pods_of("gpu-0", 3)})
    drain = EvictionDrain()
    drain.close()
    step(drain, ctx, "gpu-0", draining())
    assert not client.asked


class ReplayEvictions:
    """Replay's cluster: no watch, and a clock only the replay moves: each eviction is asked in the step."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def evict(self, name: str, namespace: str, **_: Any) -> None:
        self.asked.append(name)
        if name == "gpu-0-train-1":
            raise errors.api_error(429, PDB_429)


def test_a_client_that_cannot_watch_is_asked_in_the_step_and_its_answers_recorded_at_once() -> None:
    client = ReplayEvictions()
    ctx = Context(client, {"gpu-0": pods_of("gpu-0", 3)})  # type: ignore[arg-type]
    drain = EvictionDrain()
    step(drain, ctx, "gpu-0", draining())
    assert client.asked == ["gpu-0-train-0", "gpu-0-train-1", "gpu-0-train-2"]
    blocked = ctx.written["gpu-0"].blocked  # the same step, no answer left for a later one
    assert blocked is not None and blocked.detail == "team-a/train-pdb"
    assert not ctx.requeued
