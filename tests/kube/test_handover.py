"""One mode at a time (kube.handover): a rollout that turns --shards on or off, or changes its count, never has
two replicas acting on one node, and the handover converges: the incumbent mode keeps acting, the newcomer
holds and asks for nothing until it is gone; an older controller that does not hand over is always waited for.

Rounds are driven by the test on a clock it moves (as tests/kube/test_shards.py), so nothing depends on the
machine's speed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.handover import (
    HANDOVER_ANNOTATION,
    HANDOVER_VERSION,
    LEADER_MODE,
    SHARDS_ANNOTATION,
    ModeGuard,
)
from gpuremediate.kube.leader import LeaderElector, LeaseLock
from gpuremediate.kube.resources import LEASES
from gpuremediate.kube.shards import WANTED_ANNOTATION, ShardSet, list_shard_leases, shard_lease_name
from tests.kube.conftest import KubeTarget
from tests.kube.test_shards import FakeClock

LEADER_LEASE = "gpuremediate"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _shards(target: KubeTarget, identity: str, clock: FakeClock, shards: int,
            on_conflict: Callable[[str], None] | None = None, shard_hash: str = "sha256") -> ShardSet:
    return ShardSet(target.client(), target.namespace, identity, shards, lease_duration=15, renew_deadline=10,
                    retry_period=2, clock=clock, leader_lease=LEADER_LEASE, on_conflict=on_conflict,
                    shard_hash=shard_hash)


def _elector(target: KubeTarget, identity: str, clock: FakeClock) -> LeaderElector:
    client = target.client()

    def watcher(name: str) -> LeaseLock:
        return LeaseLock(client, target.namespace, name, identity, 15, 10, clock)

    return LeaderElector(client, target.namespace, LEADER_LEASE, identity, lease_duration=15, renew_deadline=10,
                         retry_period=2, clock=clock,
                         guard=ModeGuard(target.namespace, identity, LEADER_MODE, LEADER_LEASE, watcher),
                         annotations={HANDOVER_ANNOTATION: HANDOVER_VERSION})


def _old_leader(target: KubeTarget, identity: str, clock: FakeClock) -> LeaseLock:
    """The Lease as a controller from before the handover rule holds it: no annotation, no guard."""
    return LeaseLock(target.client(), target.namespace, LEADER_LEASE, identity, 15, 10, clock)


def _step(clock: FakeClock, *parts: Callable[[], object]) -> None:
    for part in parts:
        part()
    clock.now += 2.0


def _holders(target: KubeTarget) -> dict[int, str]:
    return {lease.index: lease.holder for lease in list_shard_leases(target.client(), target.namespace)}


def _leader_holder(client: KubeClient, target: KubeTarget) -> str:
    lease: dict[str, Any] = client.get(LEASES, LEADER_LEASE, target.namespace)
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def test_sharded_replicas_wait_for_the_leader_they_replace(kube_target: KubeTarget, clock: FakeClock) -> None:
    """--leader-elect → --shards 2 (a rolling update turning sharding on): the new replica takes no shard while
    the leader's Lease lives; once the leader releases it, the shards are taken and acted on."""
    leader = _elector(kube_target, "leader", clock)
    assert leader._try_acquire_or_renew() and leader._try_acquire_or_renew()  # took it, then settled
    said: list[str] = []
    sharded = _shards(kube_target, "sharded", clock, 2, on_conflict=said.append)
    for _ in range(4):
        _step(clock, leader._try_acquire_or_renew, sharded.round)
    assert sharded.owned() == frozenset() and _holders(kube_target) == {}
    assert leader.waiting_for == "" and "--leader-elect" in sharded.conflict
    assert len(said) == 1 and "held by leader" in said[0]  # said once, not every round
    leader.lock.release()
    for _ in range(3):
        _step(clock, sharded.round)
    assert sharded.owned() == frozenset({0, 1}) and sharded.conflict == "" and said[-1] == ""


def test_a_leader_waits_for_the_sharded_replicas_it_replaces(kube_target: KubeTarget, clock: FakeClock) -> None:
    """--shards 2 → --leader-elect: the new replica does not take the leader Lease while a shard Lease lives."""
    sharded = _shards(kube_target, "sharded", clock, 2)
    for _ in range(3):
        _step(clock, sharded.round)
    assert sharded.owned() == frozenset({0, 1})
    leader = _elector(kube_target, "leader", clock)
    for _ in range(4):
        _step(clock, sharded.round)
        assert not leader._try_acquire_or_renew()
    assert "--shards=2" in leader.waiting_for and sharded.owned() == frozenset({0, 1})
    client = kube_target.client()
    assert not any(lease["metadata"]["name"] == LEADER_LEASE
                   for lease in client.list(LEASES, kube_target.namespace)["items"])  # never even created
    sharded._release_all()
    assert leader._try_acquire_or_renew() and leader.waiting_for == ""
    assert _leader_holder(client, kube_target) == "leader"


def test_an_older_leader_that_does_not_hand_over_is_always_waited_for(kube_target: KubeTarget,
                                                                      clock: FakeClock) -> None:
    """A rollback from --shards to an older --leader-elect controller: it takes its Lease without looking, so
    the sharded replicas, here first, stand down (they release their shards) instead of acting beside it."""
    sharded = _shards(kube_target, "sharded", clock, 2)
    for _ in range(3):
        _step(clock, sharded.round)
    assert sharded.owned() == frozenset({0, 1})
    old = _old_leader(kube_target, "old-leader", clock)
    assert old.try_acquire_or_renew()
    _step(clock, sharded.round)
    assert sharded.owned() == frozenset() and "does not hand over" in sharded.conflict
    assert set(_holders(kube_target).values()) == {""}  # released: nothing held while it waits


def test_a_new_leader_stands_down_for_an_older_sharded_controller(kube_target: KubeTarget,
                                                                  clock: FakeClock) -> None:
    """The other way round: a leader of this version leading, then an older --shards controller (which does not
    look at the leader Lease) takes its shards: the leader stops leading and releases its Lease."""
    leader = _elector(kube_target, "leader", clock)
    assert leader._try_acquire_or_renew() and leader._try_acquire_or_renew()
    old = LeaseLock(kube_target.client(), kube_target.namespace, shard_lease_name(0), "old-sharded", 15, 10, clock,
                    annotations={"gpuremediate.io/shards": "2"})
    assert old.try_acquire_or_renew()
    leader._leading.set()
    clock.now += 2.0
    stopper = _stop_after(leader, rounds=3, clock=clock)
    leader._renew_until_lost()
    assert stopper.rounds <= 2, "stood down at its first renewal that saw the older controller"
    assert "does not hand over" in leader.waiting_for
    assert _leader_holder(kube_target.client(), kube_target) == ""


class _stop_after:
    """Stops the elector's renewal loop after ``rounds`` waits (the clock moves one retry period each)."""

    def __init__(self, elector: LeaderElector, rounds: int, clock: FakeClock) -> None:
        self.rounds = 0
        real_wait = elector._stop.wait

        def wait(timeout: float | None = None) -> bool:
            self.rounds += 1
            clock.now += 2.0
            if self.rounds >= rounds:
                elector._stop.set()
            return real_wait(0)

        elector._stop.wait = wait  # type: ignore[method-assign]


def test_replicas_of_two_shard_counts_converge_on_the_incumbent(kube_target: KubeTarget, clock: FakeClock) -> None:
    """--shards 3 beside --shards 2 (both this version): the incumbent keeps every shard, the newcomer neither
    takes nor asks (no hand-back, so no shard of the incumbent is ever left unheld)."""
    wide = _shards(kube_target, "wide", clock, 3)
    for _ in range(3):
        _step(clock, wide.round)
    assert wide.owned() == frozenset({0, 1, 2})
    narrow = _shards(kube_target, "narrow", clock, 2)
    seen: list[frozenset[int]] = []
    for _ in range(20):
        _step(clock, narrow.round, wide.round, lambda: seen.append(wide.owned()))
    assert all(owned == frozenset({0, 1, 2}) for owned in seen), seen
    assert narrow.owned() == frozenset() and "acts since before us" in narrow.conflict
    assert not any(WANTED_ANNOTATION in (lease["metadata"].get("annotations") or {})
                   for lease in kube_target.client().list(LEASES, kube_target.namespace)["items"])


def test_a_change_of_shard_hash_hands_over_as_a_change_of_shard_count(kube_target: KubeTarget,
                                                                        clock: FakeClock) -> None:
    """--shards 4 → --shards 4 --shard-hash=hashmod (per-shard Prometheus reads turned on): the same Lease names,
    another node -> shard mapping. The new replica waits while the old one's Leases live, then takes them, and its
    Leases say its hash (``4/hashmod``); the old replica, were it still there, would now wait for it."""
    old = _shards(kube_target, "old", clock, 4)
    for _ in range(4):
        _step(clock, old.round)
    assert old.owned() == frozenset({0, 1, 2, 3})
    new = _shards(kube_target, "new", clock, 4, shard_hash="hashmod")
    for _ in range(10):
        _step(clock, new.round, old.round)
        assert new.owned() == frozenset()
    assert "--shards=4, a controller" not in new.conflict and "(--shards=4)" in new.conflict
    assert "ours is --shards=4 --shard-hash=hashmod" in new.conflict
    old.stop(timeout=0)
    old.run()  # stopped: releases its Leases at once, as a terminated replica does
    for _ in range(4):
        _step(clock, new.round)
    assert new.owned() == frozenset({0, 1, 2, 3}) and new.conflict == ""
    leases = kube_target.client().list(LEASES, kube_target.namespace)["items"]
    assert {lease["metadata"]["annotations"][SHARDS_ANNOTATION] for lease in leases} == {"4/hashmod"}
    assert new.shard_index("gpu-node-7") == 2 and new.owns("gpu-node-7")  # Prometheus' hashmod of the name
    again = _shards(kube_target, "old-again", clock, 4)
    for _ in range(3):
        _step(clock, again.round, new.round)
    assert again.owned() == frozenset() and "--shard-hash=hashmod" in again.conflict


def test_two_modes_taking_their_leases_in_the_same_round_settle_on_the_first(kube_target: KubeTarget,
                                                                             clock: FakeClock) -> None:
    """Both read before either wrote: each took a Lease. The later acquireTime stands down and releases."""
    first = _shards(kube_target, "first", clock, 3)
    second = _shards(kube_target, "second", clock, 2)
    first.round()  # first takes its preferred shard
    clock.now += 0.001
    second.guard.observe([])  # second read nothing of it: simulate the crossing reads
    second._acquire_free({"second"}, {})
    assert second._held, "second took a shard too"
    for _ in range(4):
        _step(clock, first.round, second.round)
    assert second.owned() == frozenset() and not second._held
    assert first.owned() and first.conflict == ""


def test_a_replica_that_never_takes_what_it_asked_for_is_not_heard_again(kube_target: KubeTarget,
                                                                         clock: FakeClock) -> None:
    """An older controller of another --shards asks for a shard (it always did, even while it waited) and cannot
    take it: handed back once, taken back after a lease duration, and not handed over again."""
    owner = _shards(kube_target, "owner", clock, 2)
    for _ in range(3):
        _step(clock, owner.round)
    assert owner.owned() == frozenset({0, 1})
    client = kube_target.client()
    handed = 0
    for _ in range(40):
        lease = client.get(LEASES, shard_lease_name(1), kube_target.namespace)
        if (lease.get("spec") or {}).get("holderIdentity") == "owner":
            meta = lease["metadata"]
            meta["annotations"] = {**(meta.get("annotations") or {}),
                                   WANTED_ANNOTATION: f"asker {clock.now}"}
            client.replace(LEASES, shard_lease_name(1), lease, kube_target.namespace)
        before = 1 in owner._held
        # The asker's own Lease makes it live (the fair cap halves), as a waiting old replica's wishes do.
        _step(clock, owner.round)
        handed += before and 1 not in owner._held
    assert handed == 1 and owner.owned() == frozenset({0, 1})
