"""One mode at a time: replicas run with ``--leader-elect`` (the Lease ``gpuremediate``) or with ``--shards N``
(the Leases ``gpuremediate-shard-<i>``, annotated with N), and a rolling update that changes the mode or N puts
replicas of two modes side by side. Two modes map nodes to replicas differently, so replicas of two modes
must never act at once: one mode acts, the other waits (docs/internals.md, "Changing --shards").

Every Lease this version holds carries ``gpuremediate.io/handover`` (this rule's version). From each round's
LIST of the namespace's Leases, a replica finds the live Leases (held by another identity, its promise still
running) of another mode, and waits when

- one of them lacks the annotation: its holder is an older controller that does not hand over (it never
  waits for us), so we wait until it is released or expires — the old replicas of a rollout keep acting
  until they are gone, in either direction;
- or the other mode's oldest live Lease was acquired before our mode's oldest (ties: the mode's name): the
  incumbent keeps acting, the newcomer waits. Both sides read the same Leases, so they agree.

A replica that waits holds nothing (what it holds is released, so a shard Lease of the same name is free for
the incumbent) and asks for nothing (no hand-back wishes), until the conflict is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuremediate.kube.leader import LeaseLock

HANDOVER_ANNOTATION = "gpuremediate.io/handover"
HANDOVER_VERSION = "1"
SHARD_LEASE_PREFIX = "gpuremediate-shard-"
SHARDS_ANNOTATION = "gpuremediate.io/shards"  # the holder's --shards: its node -> shard mapping
LEADER_MODE = "leader"


SHARD_HASHES = ("sha256", "hashmod")  # how a node's name picks its shard (kube/shards.py); the first is the default


def shards_value(shards: int, shard_hash: str = SHARD_HASHES[0]) -> str:
    """The ``gpuremediate.io/shards`` annotation of a shard Lease: the holder's --shards, and its --shard-hash when
    that is not the default (``20/hashmod``). Two hashes map nodes differently: they are two modes."""
    return str(shards) if shard_hash == SHARD_HASHES[0] else f"{shards}/{shard_hash}"


def shards_mode(shards: int | str) -> str:
    return f"shards={shards}"


def shard_index_of(name: str) -> int | None:
    """The shard of a Lease named ``gpuremediate-shard-<i>`` (only that exact spelling), else None."""
    suffix = name[len(SHARD_LEASE_PREFIX):] if name.startswith(SHARD_LEASE_PREFIX) else ""
    if not (suffix.isascii() and suffix.isdigit() and len(suffix) < 6) or suffix != str(int(suffix)):
        return None  # "-01" is not shard 1's Lease: only the name shard_lease_name(1) is
    return int(suffix)


def _annotations(lease: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return ((lease or {}).get("metadata") or {}).get("annotations") or {}


def _stamp(value: object) -> float:
    """A Lease's acquireTime in epoch seconds; unreadable or absent: the newest possible."""
    try:
        return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return float("inf")


@dataclass(frozen=True)
class HeldLease:
    """A live Lease of one of the modes, as one round's LIST showed it."""

    name: str
    holder: str
    mode: str
    acquired: float
    aware: bool  # its holder hands over (the annotation): it waits for an incumbent of another mode


class ModeGuard:
    """The namespace's gpuremediate Leases, observed round by round, and whether ``mode`` must wait."""

    def __init__(self, namespace: str, identity: str, mode: str, leader_lease: str,
                 lock_for: Callable[[str], LeaseLock]) -> None:
        """``lock_for(name)``: an observe-only LeaseLock for a Lease (its expiry judged on our clock)."""
        self.namespace = namespace
        self.identity = identity
        self.mode = mode
        self.leader_lease = leader_lease
        self._lock_for = lock_for
        self._locks: dict[str, LeaseLock] = {}

    def mode_of(self, lease: Mapping[str, Any]) -> str | None:
        """``leader``, ``shards=N`` (``shards=?`` when unannotated), or None: not one of ours."""
        name = str((lease.get("metadata") or {}).get("name") or "")
        if name == self.leader_lease:
            return LEADER_MODE
        if shard_index_of(name) is not None:
            return shards_mode(str(_annotations(lease).get(SHARDS_ANNOTATION) or "?"))
        return None

    def observe(self, leases: Iterable[Mapping[str, Any]]) -> None:
        """Every Lease of the namespace, from one LIST (a Lease not listed is gone)."""
        listed: dict[str, Mapping[str, Any]] = {}
        for lease in leases:
            if self.mode_of(lease) is not None:
                listed[str((lease.get("metadata") or {}).get("name"))] = lease
        for name in set(self._locks) - set(listed):
            self._locks.pop(name).observe(None)
        for name, lease in listed.items():
            self._locks.setdefault(name, self._lock_for(name)).observe(dict(lease))

    def live(self) -> list[HeldLease]:
        """The live Leases: held by another identity within its promise, or by us."""
        found = []
        for name, lock in sorted(self._locks.items()):
            lease = lock.observed or {}
            holder = lock.holder()
            mode = self.mode_of(lease)
            if mode is None or not (lock.held_by_other() or holder == self.identity):
                continue
            found.append(HeldLease(name, holder, mode, _stamp(lock.observed_spec.get("acquireTime")),
                                   _annotations(lease).get(HANDOVER_ANNOTATION) == HANDOVER_VERSION))
        return found

    def must_wait(self) -> str:
        """Why this replica may not act now ("" when it may): a live Lease of another mode whose holder
        does not hand over, or another mode that was here first."""
        live = self.live()
        others = [lease for lease in live if lease.mode != self.mode and lease.holder != self.identity]
        if not others:
            return ""
        old = next((lease for lease in others if not lease.aware), None)
        if old is not None:
            return (f"lease {self.namespace}/{old.name} is held by {old.holder} ({describe(old.mode)}, a controller "
                    f"that does not hand over); ours is {describe(self.mode)}: waiting until it is released "
                    f"or expires")
        ours = [lease.acquired for lease in live if lease.mode == self.mode]
        first = min(others, key=lambda lease: (lease.acquired, lease.mode))
        if ours and (min(ours), self.mode) < (first.acquired, first.mode):
            return ""  # we were here first: the other mode waits for us
        return (f"lease {self.namespace}/{first.name} is held by {first.holder} ({describe(first.mode)}), which "
                f"acts since before us; ours is {describe(self.mode)}: waiting until it is released or expires")


def describe(mode: str) -> str:
    if mode == LEADER_MODE:
        return "--leader-elect"
    shards, _, shard_hash = mode.partition("/")
    return f"--{shards} --shard-hash={shard_hash}" if shard_hash else f"--{shards}"
