"""Shard Leases (kube.shards): the node → shard hash, fair split, takeover of a dead replica's shards after
its lease duration, hand-back to a replica that returns, release on shutdown, and the per-shard write fence.

Rounds are driven by the test on a clock it moves, so nothing depends on the machine's speed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CONFIGMAPS, LEASES, NODES
from gpuremediate.kube.shards import (
    WANTED_ANNOTATION,
    ShardSet,
    acting_for,
    fair_cap,
    list_shard_leases,
    node_of_path,
    shard_lease_name,
    shard_of,
    shard_status_lines,
)
from sim.waiting import wait_for
from tests.kube.conftest import KubeTarget


class FakeClock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _shard_set(target: KubeTarget, identity: str, clock: FakeClock, shards: int = 4) -> tuple[ShardSet, KubeClient]:
    client = target.client()
    return ShardSet(client, target.namespace, identity, shards, lease_duration=15, renew_deadline=10,
                    retry_period=2, clock=clock), client


def _rounds(*sets: ShardSet, count: int = 3, clock: FakeClock | None = None) -> None:
    for _ in range(count):
        for shard_set in sets:
            shard_set.round()
        if clock is not None:
            clock.now += 2.0


def _holders(target: KubeTarget) -> list[str]:
    return [lease.holder for lease in list_shard_leases(target.client(), target.namespace)]


def test_a_node_s_shard_is_sha256_of_its_name_the_same_in_every_process() -> None:
    # `printf %s gpu-node-1 | sha256sum`: 4e7f7f2ddaabf1b1..., its first 8 bytes big-endian mod 4 and mod 3
    assert (shard_of("gpu-node-1", 4), shard_of("gpu-node-1", 3)) == (1, 2)
    assert (shard_of("gpu-node-2", 4), shard_of("gpu-node-2", 3)) == (2, 0)
    assert shard_of("gpu-node-0", 1) == 0
    counts = [0] * 4
    for index in range(2000):
        counts[shard_of(f"gpu-node-{index}", 4)] += 1
    assert all(400 < count < 600 for count in counts), counts


def test_with_hashmod_a_node_s_shard_is_prometheus_hashmod_of_its_name() -> None:
    # `printf %s gpu-node-7 | md5sum`: ...e80b7c1b34dd5e52 (its last 8 bytes) mod 4 is 2, mod 20 18; what
    # Prometheus 2.42's hashmod relabel wrote for these names (tests/signals/test_prometheus_shards_real.py checks)
    assert [shard_of(n, 4, "hashmod") for n in ("gpu-node-0", "gpu-node-7", "a100-rack7-u12",
                                                "h100.pool-b.example.com")] == [0, 2, 2, 0]
    assert shard_of("gpu-node-7", 20, "hashmod") == 18 and shard_of("gpu-node-7", 20) != 18
    with pytest.raises(ValueError, match="shard hash: expected one of sha256, hashmod"):
        shard_of("gpu-node-7", 4, "md5")


def test_the_fair_cap_is_the_ceiling_of_shards_over_live_replicas() -> None:
    assert [fair_cap(4, live) for live in (1, 2, 3, 4, 5)] == [4, 2, 2, 1, 1]


def test_node_paths_name_their_node() -> None:
    assert node_of_path(NODES.path(None, "gpu-a")) == "gpu-a"
    assert node_of_path(NODES.path(None, "gpu-a", "status")) == "gpu-a"
    assert node_of_path(NODES.path()) is None
    assert node_of_path(CONFIGMAPS.path("ns", "x")) is None


def test_two_replicas_split_four_shards_two_each(kube_target: KubeTarget, clock: FakeClock) -> None:
    first, _ = _shard_set(kube_target, "replica-a", clock)
    second, _ = _shard_set(kube_target, "replica-b", clock)
    _rounds(first, second, count=6, clock=clock)
    assert len(first.owned()) == 2 and len(second.owned()) == 2
    assert first.owned().isdisjoint(second.owned())
    assert sorted(_holders(kube_target)) == ["replica-a", "replica-a", "replica-b", "replica-b"]
    line, = shard_status_lines(kube_target.client(), kube_target.namespace, time.time())
    assert line.startswith("shards (4): 0 replica-") and "renewed 0s ago" in line and "EXPIRED" not in line


def test_a_lone_replica_holds_every_shard(kube_target: KubeTarget, clock: FakeClock) -> None:
    alone, _ = _shard_set(kube_target, "replica-a", clock)
    _rounds(alone, count=3, clock=clock)
    assert alone.owned() == frozenset(range(4))


def test_a_dead_replica_s_shards_are_taken_over_after_its_lease_duration_and_not_before(
        kube_target: KubeTarget, clock: FakeClock) -> None:
    survivor, _ = _shard_set(kube_target, "replica-a", clock)
    dead, _ = _shard_set(kube_target, "replica-b", clock)
    _rounds(survivor, dead, count=6, clock=clock)
    orphaned = dead.owned()
    assert len(orphaned) == 2
    # replica-b stops renewing (killed: no release). Within its lease duration nothing is taken.
    for _ in range(6):  # at most 12 s since the survivor saw its last renewal: less than its 15 s promise
        survivor.round()
        clock.now += 2.0
    assert survivor.owned().isdisjoint(orphaned)
    assert dead.owned() == frozenset()  # by its own clock it is past its renew deadline: it may not write
    # 15 s after the survivor last saw them renewed they are free: taken, and acted on from the round after
    # (whose read saw no conflicting Lease)
    for _ in range(4):
        survivor.round()
        clock.now += 2.0
    assert survivor.owned() == frozenset(range(4))
    leases = {i: kube_target.client().get(LEASES, shard_lease_name(i), kube_target.namespace)["spec"]
              for i in orphaned}
    assert all(spec["holderIdentity"] == "replica-a" and spec["leaseTransitions"] >= 1 for spec in leases.values())


def test_a_replica_that_comes_back_is_handed_its_share(kube_target: KubeTarget, clock: FakeClock) -> None:
    holder, _ = _shard_set(kube_target, "replica-a", clock)
    _rounds(holder, count=3, clock=clock)
    assert len(holder.owned()) == 4
    returning, _ = _shard_set(kube_target, "replica-b", clock)
    _rounds(holder, returning, count=8, clock=clock)
    assert len(holder.owned()) == 2 and len(returning.owned()) == 2
    assert holder.owned().isdisjoint(returning.owned())
    annotations = [(kube_target.client().get(LEASES, shard_lease_name(i), kube_target.namespace)["metadata"]
                    .get("annotations") or {}) for i in returning.owned()]
    assert all(WANTED_ANNOTATION not in a for a in annotations)  # the taker drops its request


@pytest.mark.parametrize(("shards", "replicas", "split"), [(4, 3, [1, 1, 2]), (4, 4, [1, 1, 1, 1]),
                                                         (8, 3, [2, 3, 3]), (5, 2, [2, 3])])
def test_replicas_started_one_by_one_end_with_a_fair_split(kube_target: KubeTarget, clock: FakeClock, shards: int,
                                                           replicas: int, split: list[int]) -> None:
    # a rollout: each replica starts once the last one holds its shards (4 shards, 3 replicas was stuck at
    # 2, 2, 0: the first two within the cap of 2, the third below its floor of 1 and asking no one)
    started: list[ShardSet] = []
    for index in range(replicas):
        started.append(_shard_set(kube_target, f"replica-{index}", clock, shards=shards)[0])
        _rounds(*started, count=12, clock=clock)
    assert sorted(len(replica.owned()) for replica in started) == split
    owned = [replica.owned() for replica in started]
    assert frozenset().union(*owned) == frozenset(range(shards)) and sum(map(len, owned)) == shards
    _rounds(*started, count=12, clock=clock)  # and it stays so: nobody hands back and forth
    assert [replica.owned() for replica in started] == owned


def test_shutdown_releases_every_shard_at_once(kube_target: KubeTarget, clock: FakeClock) -> None:
    leaving, _ = _shard_set(kube_target, "replica-a", clock)
    staying, _ = _shard_set(kube_target, "replica-b", clock)
    _rounds(leaving, staying, count=6, clock=clock)
    released = leaving.owned()
    runner = threading.Thread(target=leaving.run, daemon=True)
    runner.start()
    leaving.stop(timeout=5)
    runner.join(5)
    assert not runner.is_alive()
    for index in released:
        spec = kube_target.client().get(LEASES, shard_lease_name(index), kube_target.namespace)["spec"]
        assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    _rounds(staying, count=2)  # the same clock instant: released, so free without waiting out a lease duration
    assert staying.owned() == frozenset(range(4))


@pytest.fixture
def fenced(kube_target: KubeTarget, clock: FakeClock) -> Iterator[tuple[ShardSet, KubeClient]]:
    shard_set, client = _shard_set(kube_target, "replica-a", clock, shards=2)
    other, _ = _shard_set(kube_target, "replica-b", clock, shards=2)
    admin = kube_target.client()
    for name in _two_nodes():
        admin.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    _rounds(shard_set, other, count=3)  # one shard each
    client.write_fence = shard_set.fence
    yield shard_set, client
    for name in _two_nodes():
        admin.delete(NODES, name)


def _two_nodes() -> tuple[str, str]:
    """A node of shard 0 and one of shard 1 (of 2)."""
    names = [f"shard-fence-{i}" for i in range(20)]
    return next(n for n in names if shard_of(n, 2) == 0), next(n for n in names if shard_of(n, 2) == 1)


def _label(client: KubeClient, name: str) -> dict[str, Any]:
    return client.patch(NODES, name, {"metadata": {"labels": {"touched": "yes"}}})


def test_the_fence_refuses_writes_to_nodes_of_shards_not_held(
        fenced: tuple[ShardSet, KubeClient], kube_target: KubeTarget) -> None:
    shard_set, client = fenced
    assert len(shard_set.owned()) == 1
    (held,) = shard_set.owned()
    mine, theirs = _two_nodes()[held], _two_nodes()[1 - held]
    assert _label(client, mine)["metadata"]["labels"]["touched"] == "yes"
    with pytest.raises(errors.NotLeader, match=f"node {theirs} is in shard"):
        _label(client, theirs)
    with acting_for(theirs), pytest.raises(errors.NotLeader):  # any write made for that node
        client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "for-theirs"}},
                      kube_target.namespace)
    client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fleet-wide"}},
                  kube_target.namespace)  # no node: passes while a shard is held
    assert shard_set.refused_writes == 2


def test_past_the_renew_deadline_the_fence_refuses_even_our_own_shard(
        fenced: tuple[ShardSet, KubeClient], clock: FakeClock) -> None:
    shard_set, client = fenced
    (held,) = shard_set.owned()
    mine = _two_nodes()[held]
    clock.now += 10.0  # no renewal since: the renew deadline has passed by our clock
    with pytest.raises(errors.NotLeader, match="renew deadline"):
        _label(client, mine)
    wait_for(lambda: shard_set.owned() == frozenset(), describe="nothing owned")


def test_replicas_of_another_shard_count_never_act_at_once(kube_target: KubeTarget, clock: FakeClock) -> None:
    """A rollout changing --shards: node -> shard differs, so a replica acts on nothing while a live shard
    Lease of another count exists (it takes none either); once the old one is gone, the new one acts."""
    old, _ = _shard_set(kube_target, "old-replica", clock, shards=2)
    _rounds(old, count=3, clock=clock)
    assert old.owned() == frozenset({0, 1})
    new, _ = _shard_set(kube_target, "new-replica", clock, shards=4)
    _rounds(old, new, count=3, clock=clock)
    assert new.owned() == frozenset() and "(--shards=2)" in new.conflict and "ours is --shards=4" in new.conflict
    assert _holders(kube_target) == ["old-replica", "old-replica"]  # shards 2 and 3 were not taken either
    runner = threading.Thread(target=old.run, daemon=True)
    runner.start()
    old.stop(timeout=5)
    runner.join(5)
    _rounds(new, count=3, clock=clock)
    assert new.owned() == frozenset(range(4)) and new.conflict == ""


def test_a_replica_sees_a_larger_shard_count_beyond_its_own_leases(kube_target: KubeTarget,
                                                                   clock: FakeClock) -> None:
    wide, _ = _shard_set(kube_target, "wide", clock, shards=4)
    _rounds(wide, count=3, clock=clock)
    assert wide.owned() == frozenset(range(4))
    narrow, _ = _shard_set(kube_target, "narrow", clock, shards=2)
    _rounds(wide, narrow, count=2, clock=clock)
    assert narrow.owned() == frozenset() and "gpuremediate-shard-" in narrow.conflict


def test_a_failing_round_does_not_stop_the_renewals(kube_target: KubeTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    shard_set = ShardSet(kube_target.client(), kube_target.namespace, "replica-a", 2, lease_duration=3,
                         renew_deadline=2, retry_period=0.2)
    real = shard_set.guard.must_wait
    calls = []

    def fails_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in one round")
        return real()

    monkeypatch.setattr(shard_set.guard, "must_wait", fails_once)
    runner = threading.Thread(target=shard_set.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: shard_set.owned() == frozenset({0, 1}), describe="both shards held after the failed round")
    finally:
        shard_set.stop(timeout=5)
        runner.join(5)
    assert len(calls) > 1


def test_only_the_exact_shard_lease_name_counts_as_its_lease() -> None:
    from gpuremediate.kube.shards import _index_of

    def lease(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}}

    assert _index_of(lease("gpuremediate-shard-1")) == 1
    assert _index_of(lease("gpuremediate-shard-0")) == 0
    for other in ("gpuremediate-shard-01", "gpuremediate-shard-+1", "gpuremediate-shard-", "gpuremediate-leader"):
        assert _index_of(lease(other)) is None, other  # "-01" must not stand in for shard 1's Lease


def test_a_shard_is_told_held_in_the_round_that_took_it_before_it_is_acted_on(kube_target: KubeTarget,
                                                                             clock: FakeClock) -> None:
    """``on_held`` is what makes a shard's nodes ready (the node cache unpacks them): it runs in the round that took
    or lost a shard, while that shard is not yet ours to act on, and never again for a round that changed nothing."""
    first, _ = _shard_set(kube_target, "replica-a", clock)
    heard: list[tuple[frozenset[int], frozenset[int]]] = []  # (held, owned) as on_held saw them
    first.on_held = lambda held: heard.append((held, first.owned()))
    _rounds(first, count=4, clock=clock)
    assert first.owned() == frozenset(range(4))
    before: frozenset[int] = frozenset()
    for held, owned in heard:
        taken = held - before
        assert taken and not taken & owned, (held, owned)  # each shard taken was told before it was acted on
        before = held
    assert heard[-1][0] == frozenset(range(4))
    count = len(heard)
    _rounds(first, count=2, clock=clock)
    assert len(heard) == count  # nothing changed: not told again
    second, _ = _shard_set(kube_target, "replica-b", clock)
    _rounds(first, second, count=6, clock=clock)
    assert len(first.held()) == 2 and heard[-1][0] == first.held()  # handed two back: told what it holds now
