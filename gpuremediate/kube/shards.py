"""Sharding on Kubernetes itself: ``--shards S`` replicas, each owning the GPU nodes of the shards whose
``coordination.k8s.io/v1`` Lease (``gpuremediate-shard-<i>``) it holds.

A node's shard is ``sha256(name) mod S`` (stable across processes and restarts; Python's ``hash()`` is salted), or
with ``--shard-hash=hashmod`` Prometheus' ``hashmod`` relabelling of the name (the last 8 bytes of its MD5, big-endian,
mod S), so that a scrape configuration can label each series with its node's shard and a replica asks Prometheus for
its own shards' series only (signals/sources.py, docs/sizing.md). The hash is part of the mode: its Leases say
``gpuremediate.io/shards: S/hashmod``, and a rollout that changes it hands over as one that changes S.
Each shard Lease is held with the leader Lease's rules (``leader.LeaseLock``: acquire/renew by our clock, the
holder's promise judged by its ``leaseDurationSeconds``, release on shutdown as client-go's ReleaseOnCancel).

Every retry period one round: one LIST of the namespace's Leases; renew what we hold from it (a shard not
renewed within the renew deadline is lost); take free shards up to a fair cap, ``ceil(S / live)``, live being
the distinct holders of unexpired shard Leases plus us; our preferred shard (``sha256(identity) mod S``)
first, and only that one in our first round. A dead replica's shards are free once its promise has run out,
so live replicas take them over: no consensus of our own.

A shard is acted on from the round after it was taken (that round's read is the check below), and no shard
at all while ``handover.ModeGuard`` says another mode acts: a live shard Lease of another ``--shards``
(annotation ``gpuremediate.io/shards``) or the ``--leader-elect`` Lease. Two modes map nodes differently, so
during a rollout that changes the mode or S the replicas of one mode wait, holding and asking for nothing.

A replica holding fewer than ``floor(S / live)`` shards while another holds more than that floor, or fewer
than the cap while another holds more than the cap (a replica that came back finds its shards taken over; the
last of replicas started one by one finds every free shard taken) says so on one of that holder's Leases
(annotation ``gpuremediate.io/shard-wanted-by``, rewritten while it wants); the holder releases that shard
while it holds more than the cap, or more than the floor while the asker holds less, and the waiting replica
takes it. The API server decides every change (resourceVersion).

``fence`` is the per-shard write fence: a write to a Node (its path names it), or any write made while
reconciling a node (``acting_for``), passes only while that node's shard is ours (as ``owned``); other writes
pass while we own at least one shard.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.handover import (
    HANDOVER_ANNOTATION,
    HANDOVER_VERSION,
    SHARD_HASHES,
    SHARD_LEASE_PREFIX,
    SHARDS_ANNOTATION,
    ModeGuard,
    shard_index_of,
    shards_mode,
    shards_value,
)
from gpuremediate.kube.leader import JITTER_FACTOR, LeaseLock, duration_of, lease_clock, micro_time
from gpuremediate.kube.resources import LEASES, NODES

log = logging.getLogger(__name__)

MAX_SHARDS = 256  # one Lease per shard, each renewed every retry period

WANTED_ANNOTATION = "gpuremediate.io/shard-wanted-by"
DEAF_FOR_LEASES = 10  # a replica handed a shard it did not take is not heard for this many lease durations

_acting_for: contextvars.ContextVar[str | None] = contextvars.ContextVar("gpuremediate_acting_for", default=None)


def _hash_mod(text: str, modulus: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % modulus


def prometheus_hashmod(text: str, modulus: int) -> int:
    """Prometheus' ``hashmod`` relabel action on one source label's value: the last 8 bytes of its MD5 digest as a
    big-endian unsigned integer, mod ``modulus`` (model/relabel/relabel.go: ``binary.BigEndian.Uint64(hash[8:]) %
    cfg.Modulus``; several source labels would be joined by the separator first: we hash the node name alone)."""
    return int.from_bytes(hashlib.md5(text.encode(), usedforsecurity=False).digest()[8:], "big") % modulus


def shard_of(node: str, shards: int, shard_hash: str = SHARD_HASHES[0]) -> int:
    """The shard of a node: ``sha256(name) mod shards`` (the same in every process, unlike ``hash()``), or with
    ``hashmod`` the shard Prometheus' hashmod relabelling gives the name."""
    if shard_hash == "hashmod":
        return prometheus_hashmod(node, shards)
    if shard_hash != SHARD_HASHES[0]:
        raise ValueError(f"shard hash: expected one of {', '.join(SHARD_HASHES)}, got {shard_hash!r}")
    return _hash_mod(node, shards)


def preferred_shard(identity: str, shards: int) -> int:
    return _hash_mod(identity, shards)


def shard_lease_name(index: int) -> str:
    return f"{SHARD_LEASE_PREFIX}{index}"


def fair_cap(shards: int, live: int) -> int:
    """The most shards one replica takes while ``live`` replicas (itself included) hold Leases."""
    return math.ceil(shards / max(1, live))


def fair_floor(shards: int, live: int) -> int:
    """Fewer shards than this and a replica asks a holder over its cap for one."""
    return shards // max(1, live)


@contextlib.contextmanager
def acting_for(node: str) -> Iterator[None]:
    """Every write of this thread inside the block is for ``node``: the shard fence checks its shard."""
    token = _acting_for.set(node)
    try:
        yield
    finally:
        _acting_for.reset(token)


def node_of_path(path: str) -> str | None:
    """The Node a request path addresses (``/api/v1/nodes/<name>[/status]``), else None."""
    prefix = NODES.path() + "/"
    if not path.startswith(prefix):
        return None
    return path[len(prefix):].split("/", 1)[0] or None


class ShardSet:
    """The shard Leases this replica holds, kept by one thread (``run``) until ``stop``."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        identity: str,
        shards: int,
        lease_duration: float = 15,
        renew_deadline: float = 10,
        retry_period: float = 2,
        clock: Callable[[], float] | None = None,
        on_change: Callable[[frozenset[int]], None] | None = None,
        leader_lease: str = "gpuremediate",
        on_conflict: Callable[[str], None] | None = None,
        shard_hash: str = SHARD_HASHES[0],
        on_held: Callable[[frozenset[int]], None] | None = None,
    ) -> None:
        """``on_change(owned)``: the shards ours to act on changed; ``on_conflict(why)``: we started ("" :
        stopped) waiting for replicas of another mode (``leader_lease``: the --leader-elect Lease's name);
        ``shard_hash``: how a node's name picks its shard (``sha256`` or Prometheus' ``hashmod``); ``on_held(held)``:
        the shards held changed, called in the round that changed them, before the next round can settle a shard
        taken (a shard is held a round before it is ours to act on: what must be ready first is made ready here)."""
        if not identity:
            raise ValueError("shard leases need a non-empty identity")
        if not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards: expected 1 to {MAX_SHARDS}, got {shards}")
        if not lease_duration > renew_deadline > retry_period * JITTER_FACTOR > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period * 1.2 > 0 (client-go's rule)")
        if shard_hash not in SHARD_HASHES:
            raise ValueError(f"shard hash: expected one of {', '.join(SHARD_HASHES)}, got {shard_hash!r}")
        self.shard_hash = shard_hash
        self.client = client
        self.namespace = namespace
        self.identity = identity
        self.shards = shards
        self.retry_period = retry_period
        self.renew_deadline = renew_deadline
        self.lease_duration = lease_duration
        self.on_change = on_change
        self.on_conflict = on_conflict
        self.on_held = on_held
        self._clock = clock or lease_clock
        self.locks = [self._lock_for(i) for i in range(shards)]
        self.guard = ModeGuard(namespace, identity, shards_mode(shards_value(shards, shard_hash)), leader_lease,
                               self._watcher)
        self.preferred = preferred_shard(identity, shards)
        self._held: set[int] = set()  # acquired and not yet given up or lost
        self._settled: set[int] = set()  # held since before the last round's read: ours to act on
        self.conflict = ""  # another mode acts (handover.ModeGuard): we hold and act on nothing while it lasts
        self._handed: dict[int, tuple[str, float]] = {}  # shard -> (to whom we handed it, when)
        self._deaf: dict[str, float] = {}  # identity -> until when its wishes are not heard
        self._wishes: dict[int, tuple[str, float]] = {}  # shard -> (wanted-by value, clock time it changed)
        self._wished_at: dict[int, float] = {}  # shard -> when we last wrote our own wish on it
        self._lease_paths = {LEASES.path(namespace)} | {lock.path for lock in self.locks}
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.refused_writes = 0
        self.rounds = 0

    # ---- what we own now ---------------------------------------------------------------------------------

    def owned(self) -> frozenset[int]:
        """Shards ours to act on now: held since before the last round's read (which saw no live shard Lease of
        another --shards), and renewed within the renew deadline by our clock."""
        with self._lock:
            settled = set() if self.conflict else self._held & self._settled
        return frozenset(i for i in settled if self.locks[i].valid_for_me())

    def owns(self, node: str) -> bool:
        return self.shard_index(node) in self.owned()

    def held(self) -> frozenset[int]:
        """Shards whose Lease we hold, acted on yet or not (``owned`` is a part of these)."""
        with self._lock:
            return frozenset(self._held)

    def holds_node(self, node: str) -> bool:
        return self.shard_index(node) in self.held()

    def shard_index(self, node: str) -> int:
        return shard_of(node, self.shards, self.shard_hash)

    def fence(self, method: str, path: str) -> None:
        """A KubeClient write fence: refuse (errors.NotLeader) a write for a node whose shard is not ours now."""
        if path in self._lease_paths:
            return
        node = node_of_path(path) or _acting_for.get()
        owned = self.owned()
        if node is None and owned:
            return
        if node is not None and self.shard_index(node) in owned:
            return
        with self._lock:
            self.refused_writes += 1
        if self.conflict:
            why = f"{self.identity} acts on no shard: {self.conflict}"
        elif node is None:
            why = f"{self.identity} holds no shard lease (of {self.shards}) within its renew deadline"
        else:
            index = self.shard_index(node)
            why = (f"node {node} is in shard {index}: {self.identity} does not hold lease "
                   f"{self.namespace}/{shard_lease_name(index)} within its {self.renew_deadline:g}s renew deadline")
        raise errors.NotLeader(method, path, why)

    # ---- the thread ----------------------------------------------------------------------------------------

    def run(self) -> None:
        """Block: a round every retry period until stop(); then release every shard held."""
        self._done.clear()
        try:
            while not self._stop.is_set():
                try:
                    self.round()
                except Exception:  # a bug in one round must not stop the renewals: the next round tries again
                    log.exception("shard lease round failed")
                self._stop.wait(self.retry_period)
        finally:
            self._release_all()
            self._done.set()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._done.wait(self.renew_deadline if timeout is None else timeout)

    def round(self) -> None:
        """Renew, read the others, hand back what a waiting replica wants, take free shards up to the cap."""
        before, held_before = self.owned(), self.held()
        listed = self._list()
        if listed is not None:
            self.guard.observe(listed.values())
        conflict = self.guard.must_wait() if listed is not None else self.conflict
        if conflict:
            self._release_all()  # the incumbent mode may need these very names (another --shards)
        shards = None if listed is None else {i: lease for name, lease in listed.items()
                                              if (i := shard_index_of(name)) is not None}
        self._renew_held(shards)
        if shards is not None:
            self._observe_others(shards)
        self._note_conflict(conflict)
        with self._lock:
            if shards is not None:  # settling needs this round's read (it is what shows another mode)
                self._settled = set(self._held)  # what we held before this read is ours from now on
        if not conflict:
            live = self._live()
            self._hand_back(live)
            if shards is not None:
                self._acquire_free(live, shards)
            self._ask_if_short(live)
        self.rounds += 1
        held = self.held()
        if held != held_before and self.on_held is not None:
            try:
                self.on_held(held)
            except Exception:  # what it readies is a cost, never a decision: the round goes on to on_change
                log.exception("readying the shards held failed", extra={"shards": sorted(held)})
        after = self.owned()
        if after != before:
            log.info("shards held", extra={"identity": self.identity, "shards": sorted(after)})
            if self.on_change is not None:
                self.on_change(after)

    # ---- one round's parts ---------------------------------------------------------------------------------

    def _list(self) -> dict[str, dict[str, Any]] | None:
        """One LIST of the namespace's Leases, by name (None: it failed)."""
        try:
            leases = self.client.list(LEASES, self.namespace).get("items") or []
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("listing shard leases in %s failed: %s", self.namespace, exc)
            return None
        return {str((lease.get("metadata") or {}).get("name")): lease for lease in leases}

    def _note_conflict(self, conflict: str) -> None:
        """Said once when waiting for another mode starts and once when it ends (not every round)."""
        with self._lock:
            changed, self.conflict = conflict != self.conflict, conflict
        if not changed:
            return
        if conflict:
            log.warning("not acting on any shard", extra={"identity": self.identity, "reason": conflict})
        else:
            log.info("no other mode acts any more: taking shards", extra={"identity": self.identity})
        if self.on_conflict is not None:
            self.on_conflict(conflict)

    def _renew_held(self, listed: dict[int, dict[str, Any]] | None) -> None:
        """Renew each held shard from the Lease as listed (no GET; a GET each when the LIST failed)."""
        for index in sorted(self._held):
            lock = self.locks[index]
            renewed = lock.try_acquire_or_renew() if listed is None else lock.acquire_or_renew_from(listed.get(index))
            if renewed:
                self._note_wish(index)
                continue
            deadline = (lock.renewed_at or 0.0) + self.renew_deadline
            if self._clock() + self.retry_period > deadline:  # as the leader elector gives up
                log.warning("%s failed to renew lease %s/%s: shard %d lost", self.identity, self.namespace,
                            lock.name, index)
                with self._lock:
                    self._held.discard(index)
                lock.renewed_at = None

    def _observe_others(self, listed: dict[int, dict[str, Any]]) -> None:
        for index in range(self.shards):
            if index in self._held:
                continue  # renewed just now: our own write is the latest
            self.locks[index].observe(listed.get(index))
            self._note_wish(index)
        self._note_ignored_hand_backs()

    def _lock_for(self, index: int) -> LeaseLock:
        return LeaseLock(self.client, self.namespace, shard_lease_name(index), self.identity, self.lease_duration,
                         self.renew_deadline, self._clock, takeover_drops=(WANTED_ANNOTATION,),
                         annotations={SHARDS_ANNOTATION: shards_value(self.shards, self.shard_hash),
                                      HANDOVER_ANNOTATION: HANDOVER_VERSION})

    def _watcher(self, name: str) -> LeaseLock:
        """An observe-only lock for the mode guard (it never writes)."""
        return LeaseLock(self.client, self.namespace, name, self.identity, self.lease_duration, self.renew_deadline,
                         self._clock)

    def _live(self) -> set[str]:
        return {lock.holder() for lock in self.locks if lock.held_by_other()} | {self.identity} | {
            who for who, _ in self._fresh_wishes().values()}

    def _acquire_free(self, live: set[str], listed: dict[int, dict[str, Any]]) -> None:
        # The first round takes only the preferred shard: replicas started together each get theirs first.
        cap = fair_cap(self.shards, len(live)) if self.rounds else 1
        for index in self._preference():
            if len(self._held) >= cap or self._stop.is_set():
                return
            lock = self.locks[index]
            if index in self._held or lock.held_by_other() or self._wanted_by_other(index):
                continue
            if lock.acquire_or_renew_from(listed.get(index)):
                log.info("%s acquired lease %s/%s", self.identity, self.namespace, lock.name)
                with self._lock:
                    self._held.add(index)

    def _hand_back(self, live: set[str]) -> None:
        """A live replica asks for one of ours: release that shard (it takes it next) while we hold more than the
        cap, or more than the floor while the asker holds less than it (4 shards, 3 replicas started one by one:
        2, 2, 0 is under every cap; the third asks and is handed one)."""
        cap = fair_cap(self.shards, len(live))
        floor = fair_floor(self.shards, len(live))
        for index, (who, _) in sorted(self._fresh_wishes().items()):
            held = len(self._held)
            if held <= floor:
                return
            if held <= cap and self._holds(who) >= floor:
                continue  # the asker has its share: ours is within the cap
            if index in self._held and who != self.identity:
                log.info("%s hands shard %d to %s", self.identity, index, who)
                with self._lock:
                    self._held.discard(index)
                self.locks[index].release()
                self._handed[index] = (who, self._clock())

    def _ask_if_short(self, live: set[str]) -> None:
        """Fewer than the floor while another holder has more than it, or fewer than the cap while another has
        more than the cap: ask for one of its shards (the holder gives it up keeping the floor, or the cap, itself,
        so neither side crosses the line it moved toward: no handing back and forth)."""
        floor, cap = fair_floor(self.shards, len(live)), fair_cap(self.shards, len(live))
        held = len(self._held)
        if held >= cap:
            return
        line = floor if held < floor else cap
        for index in self._preference():
            lock = self.locks[index]
            if lock.held_by_other() and self._holds(lock.holder()) > line:
                self._wish(index)
                return

    def _holds(self, identity: str) -> int:
        """How many shard Leases ``identity`` holds, by this round's read (ours: what we hold)."""
        if identity == self.identity:
            return len(self._held)
        return sum(1 for lock in self.locks if lock.held_by_other() and lock.holder() == identity)

    # ---- wishes (the hand-back annotation) -----------------------------------------------------------------

    def _note_wish(self, index: int) -> None:
        value = _annotation(self.locks[index], WANTED_ANNOTATION)
        seen = self._wishes.get(index)
        if not value:
            self._wishes.pop(index, None)
        elif seen is None or seen[0] != value:
            self._wishes[index] = (value, self._clock())

    def _fresh_wishes(self) -> dict[int, tuple[str, float]]:
        """Wishes rewritten within one lease duration, as (who, when we saw it change); not those of a replica
        that did not take what it was handed (an older controller of another --shards asks, and cannot take)."""
        now = self._clock()
        fresh = {i: (value.split(" ", 1)[0], at) for i, (value, at) in self._wishes.items()
                 if now - at < self.lease_duration}
        return {i: wish for i, wish in fresh.items() if self._deaf.get(wish[0], -math.inf) <= now}

    def _note_ignored_hand_backs(self) -> None:
        """A shard handed back and not taken by the asker within a lease duration: the asker is not heard for
        a while (taking it back at once and handing it over again would leave the shard's nodes unhandled)."""
        now = self._clock()
        for index, (who, at) in list(self._handed.items()):
            if self.locks[index].holder() == who:
                self._handed.pop(index)
            elif now - at >= self.lease_duration:
                self._handed.pop(index)
                self._deaf[who] = now + DEAF_FOR_LEASES * self.lease_duration
                log.warning("%s did not take shard %d it asked for: not heard for %gs", who, index,
                            DEAF_FOR_LEASES * self.lease_duration)

    def _wanted_by_other(self, index: int) -> bool:
        wish = self._fresh_wishes().get(index)
        return wish is not None and wish[0] != self.identity and self.locks[index].holder() == ""

    def _wish(self, index: int) -> None:
        """Write our wish on the Lease (rewritten every third of a lease duration while we want it)."""
        now = self._clock()
        if now - self._wished_at.get(index, -math.inf) < self.lease_duration / 3:
            return
        lock = self.locks[index]
        lease = lock.observed
        if lease is None:
            return
        metadata = dict(lease.get("metadata") or {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}),
                                   WANTED_ANNOTATION: f"{self.identity} {micro_time()}"}
        try:
            updated = self.client.replace(LEASES, lock.name, {**lease, "metadata": metadata}, self.namespace)
        except (errors.ApiError, errors.TransportError) as exc:
            log.debug("asking for shard lease %s/%s failed: %s", self.namespace, lock.name, exc)
            return
        self._wished_at[index] = now
        lock.observed = updated

    def _preference(self) -> list[int]:
        return [(self.preferred + step) % self.shards for step in range(self.shards)]

    def _release_all(self) -> None:
        with self._lock:
            held, self._held = sorted(self._held), set()
        for index in held:
            self.locks[index].release()


def _annotation(lock: LeaseLock, key: str) -> str:
    annotations = ((lock.observed or {}).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(key) or "")


def _index_of(lease: dict[str, Any]) -> int | None:
    return shard_index_of(str((lease.get("metadata") or {}).get("name") or ""))


@dataclass(frozen=True)
class ShardLease:
    """One shard Lease as stored (for ``status``)."""

    index: int
    holder: str
    renewed_at: float | None  # renewTime, epoch seconds
    duration_s: float

    def describe(self, now: float) -> str:
        if not self.holder:
            return f"{self.index} free"
        if self.renewed_at is None:
            return f"{self.index} {self.holder}"
        age = max(0.0, now - self.renewed_at)
        expired = " EXPIRED" if age > self.duration_s else ""
        return f"{self.index} {self.holder} (renewed {age:.0f}s ago{expired})"


def list_shard_leases(client: KubeClient, namespace: str) -> list[ShardLease]:
    """Every ``gpuremediate-shard-<i>`` Lease in the namespace, by shard (one LIST)."""
    found = []
    for lease in client.list(LEASES, namespace).get("items") or []:
        index = _index_of(lease)
        if index is None:
            continue
        spec = lease.get("spec") or {}
        found.append(ShardLease(index, str(spec.get("holderIdentity") or ""),
                                _epoch(spec.get("renewTime")), duration_of(spec)))
    return sorted(found, key=lambda lease: lease.index)


def shard_status_lines(client: KubeClient, namespace: str, now: float) -> list[str]:
    """``status``'s line naming who holds each shard ([] when the controller is not sharded)."""
    try:
        leases = list_shard_leases(client, namespace)
    except errors.Forbidden:
        return []  # a reader without access to Leases: whether the controller is sharded is not theirs to see
    except (errors.ApiError, errors.TransportError) as exc:
        return [f"shards unknown: Leases in {namespace} unreadable ({exc})"]
    if not leases:
        return []
    return [f"shards ({len(leases)}): " + ", ".join(lease.describe(now) for lease in leases)]


def _epoch(stamp: object) -> float | None:
    try:
        return datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
