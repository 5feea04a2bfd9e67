"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection package does it.

A leader considers itself leader only while its last successful renewal is younger than the renew deadline,
by its own clock (CLOCK_BOOTTIME, else monotonic). client-go gives up when a renewal round (started
RetryPeriod after the last success, its request cancelled by the round's context) exceeds RenewDeadline;
it does no fencing (its doc.go says so). Here the deadline counts from the send time of the last success,
which also holds when the renewal thread is stuck inside a request, and the same rule fences every write.
Other replicas wait the whole lease duration (> renew deadline) after the last change they saw, so the gap
between the two is the safety margin. ``fence`` applies that rule to every write: installed as the client's
``write_fence``, it refuses any request but the elector's own Lease calls once the deadline has passed — a
process paused (SIGSTOP, a long GC, a suspended machine) past it sends nothing when it resumes. The clock is
CLOCK_BOOTTIME where the OS has one (Linux): unlike CLOCK_MONOTONIC it keeps counting while the machine is
suspended, so a resumed machine sees its deadline passed. A VM frozen by its hypervisor without the guest
knowing may not advance either clock: the fence cannot see that pause.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import LEASES

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2  # client-go's JitterFactor for acquire retries
MAX_TOLERABLE_EXPIRED_S = 20.0  # as kube-controller-manager passes to its leader-election healthz adaptor


def micro_time(moment: datetime | None = None) -> str:
    """MicroTime as the API server wants it: always six fractional digits (no fraction → 422)."""
    return (moment or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def duration_of(spec: dict[str, Any]) -> float:
    """The holder's leaseDurationSeconds: expiry is judged by the holder's promise (client-go's isLeaseValid)."""
    try:
        return max(0.0, float(spec.get("leaseDurationSeconds") or 0))
    except (TypeError, ValueError):
        return 0.0


def lease_clock() -> float:
    """Seconds on CLOCK_BOOTTIME (counts through a suspend), else the monotonic clock."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def _without_annotations(obj: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    metadata = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k not in names}
    metadata["annotations"] = annotations
    return metadata


class LeaseLock:
    """One coordination.k8s.io/v1 Lease held by ``identity``: one acquire-or-renew attempt at a time, the
    holder's expiry judged on our own clock, and a clean release. The leader elector and the shard set both
    hold their Leases through it (client-go's resourcelock plus tryAcquireOrRenew)."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float,
        renew_deadline: float,
        clock: Callable[[], float] | None = None,
        on_new_holder: Callable[[str], None] | None = None,
        takeover_drops: tuple[str, ...] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """``takeover_drops``: annotations removed when we take the Lease from another holder (or a free one);
        ``annotations``: set on every acquire and renewal (what the holder promises beside the spec)."""
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.on_new_holder = on_new_holder
        self.takeover_drops = takeover_drops
        self.annotations = dict(annotations or {})
        self.observed: dict[str, Any] | None = None  # the last Lease read or written
        self.observed_spec: dict[str, Any] = {}
        self.observed_at = 0.0  # clock time the holder's record last changed
        self.renewed_at: float | None = None  # clock time a successful acquire/renew was sent
        self.reported_holder = ""
        self.clock = clock or lease_clock  # it keeps counting while the process is stopped
        self.path = LEASES.path(namespace, name)

    def valid_for_me(self) -> bool:
        """The last successful acquire/renew of ours is younger than the renew deadline by the local clock."""
        renewed = self.renewed_at
        return renewed is not None and self.clock() - renewed < self.renew_deadline

    def holder(self) -> str:
        """Who held the Lease when we last read it ("" when free or released)."""
        return str(self.observed_spec.get("holderIdentity") or "")

    def held_by_other(self) -> bool:
        """Another identity holds it and its promise (leaseDurationSeconds since we saw it change) still runs."""
        holder = self.holder()
        return bool(holder) and holder != self.identity and \
            self.observed_at + duration_of(self.observed_spec) > self.clock()

    def read(self) -> bool:
        """GET the Lease and note who holds it; False when it does not exist or cannot be read."""
        try:
            lease = self.client.get(LEASES, self.name, self.namespace)
        except errors.NotFound:
            self._observe(None, {})
            return False
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("reading lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        self._observe(lease, dict(lease.get("spec") or {}))
        return True

    def try_acquire_or_renew(self) -> bool:
        sent_at = self.clock()  # the lease is valid from when the write was sent, not when it returned
        try:
            lease = self.client.get(LEASES, self.name, self.namespace)
        except errors.NotFound:
            lease = None
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("reading lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        return self.acquire_or_renew_from(lease, sent_at)

    def acquire_or_renew_from(self, lease: dict[str, Any] | None, sent_at: float | None = None) -> bool:
        """The write half of an attempt, from the Lease as just read (None: it does not exist); a stale read
        only costs a 409."""
        sent_at = self.clock() if sent_at is None else sent_at
        now = datetime.now(UTC)
        if lease is None:
            return self._renewed(sent_at, self._create(now))
        spec = dict(lease.get("spec") or {})
        self._observe(lease, spec)
        if self.held_by_other():
            return False
        i_held_it = self.holder() == self.identity
        new_spec = self._spec(now, acquired=spec.get("acquireTime") if i_held_it else None)
        new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (0 if i_held_it else 1)
        body = {**lease, "spec": new_spec}
        if not i_held_it and self.takeover_drops:
            body["metadata"] = _without_annotations(lease, self.takeover_drops)
        if self.annotations:
            metadata = dict(body.get("metadata") or {})
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **self.annotations}
            body["metadata"] = metadata
        try:
            updated = self.client.replace(LEASES, self.name, body, self.namespace)
        except (errors.ApiError, errors.TransportError) as exc:
            log.debug("updating lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        self._observe(updated, new_spec)
        return self._renewed(sent_at, True)

    def release(self) -> None:
        """Hand the lease back at once: empty holder and a 1 s duration, as client-go's ReleaseOnCancel does."""
        self.renewed_at = None
        if self.observed is None or self.holder() != self.identity:
            return
        now = micro_time()
        spec = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": int(self.observed_spec.get("leaseTransitions") or 0),
        }
        try:
            released = self.client.replace(LEASES, self.name, {**self.observed, "spec": spec}, self.namespace)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("releasing lease %s/%s failed: %s", self.namespace, self.name, exc)
            return
        self._observe(released, spec)

    def _renewed(self, sent_at: float, ok: bool) -> bool:
        if ok:
            self.renewed_at = sent_at
        return ok

    def _create(self, now: datetime) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace,
                         **({"annotations": dict(self.annotations)} if self.annotations else {})},
            "spec": {**self._spec(now, acquired=None), "leaseTransitions": 0},
        }
        try:
            created = self.client.create(LEASES, body, self.namespace)
        except (errors.ApiError, errors.TransportError) as exc:
            log.debug("creating lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        self._observe(created, dict(created.get("spec") or {}))
        return True

    def _spec(self, now: datetime, acquired: str | None) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "acquireTime": acquired or micro_time(now),
            "renewTime": micro_time(now),
        }

    def observe(self, lease: dict[str, Any] | None) -> None:
        """Note a Lease read elsewhere (a LIST of the namespace's Leases); None: it does not exist."""
        self._observe(lease, dict((lease or {}).get("spec") or {}))

    def _observe(self, lease: dict[str, Any] | None, spec: dict[str, Any]) -> None:
        record = {k: spec.get(k) for k in ("holderIdentity", "renewTime", "acquireTime", "leaseTransitions")}
        if record != {k: self.observed_spec.get(k) for k in record}:
            self.observed_at = self.clock()
        self.observed, self.observed_spec = lease, spec
        holder = self.holder()
        if holder and holder != self.reported_holder:
            self.reported_holder = holder
            if self.on_new_holder:
                self.on_new_holder(holder)


class ModeGuard(Protocol):
    """What the elector asks before it takes or keeps the Lease (``handover.ModeGuard``)."""

    def observe(self, leases: Iterable[Mapping[str, Any]]) -> None: ...

    def must_wait(self) -> str: ...


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15,
        renew_deadline: float = 10,
        retry_period: float = 2,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        clock: Callable[[], float] | None = None,
        guard: ModeGuard | None = None,
        annotations: Mapping[str, str] | None = None,
        on_conflict: Callable[[str], None] | None = None,
    ) -> None:
        """``guard``: replicas of another mode (--shards) may act instead; each round then LISTs the
        namespace's Leases (in place of the GET), takes the Lease only when the guard says nobody else acts,
        leads from the round after it took it, and stands down when the guard says so. ``on_conflict(why)``:
        we started ("": stopped) waiting for another mode."""
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        if not lease_duration > renew_deadline > retry_period * JITTER_FACTOR > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period * 1.2 > 0 (client-go's rule)")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self._stop = threading.Event()
        self._done = threading.Event()
        self._leading = threading.Event()
        self._clock = clock or lease_clock  # it keeps counting while the process is stopped
        self.lock = LeaseLock(client, namespace, name, identity, lease_duration, renew_deadline, self._clock,
                              on_new_holder=on_new_leader, annotations=annotations)
        self.guard = guard
        self.on_conflict = on_conflict
        self.waiting_for = ""  # why another mode's replicas act instead of us ("" when none do)
        self.refused_writes = 0
        self._refused_lock = threading.Lock()
        self._lease_paths = (LEASES.path(namespace), LEASES.path(namespace, name))

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    def holds_valid_lease(self) -> bool:
        """Leading, and the last successful renewal is younger than the renew deadline by the local clock."""
        return self._leading.is_set() and self.lock.valid_for_me()

    def check(self, max_tolerable_expired: float = MAX_TOLERABLE_EXPIRED_S) -> str:
        """client-go's HealthzAdaptor Check: "" when healthy; a reason when we lead but have not renewed
        for longer than the lease duration plus ``max_tolerable_expired`` (the process should be restarted)."""
        renewed = self.lock.renewed_at
        if not self._leading.is_set() or renewed is None:
            return ""
        age = self._clock() - renewed
        if age > self.lease_duration + max_tolerable_expired:
            return f"leader lease {self.namespace}/{self.name} not renewed for {age:.0f}s"
        return ""

    def fence(self, method: str, path: str) -> None:
        """A KubeClient write fence: refuse (errors.NotLeader) every write but our own Lease's unless we lead."""
        if path in self._lease_paths or self.holds_valid_lease():
            return
        with self._refused_lock:
            self.refused_writes += 1
        renewed = self.lock.renewed_at
        if renewed is None or not self._leading.is_set():
            why = f"{self.identity} does not hold lease {self.namespace}/{self.name}"
        else:
            age = self._clock() - renewed
            why = (f"{self.identity}'s lease {self.namespace}/{self.name} was last renewed {age:.1f}s ago, "
                   f"past the {self.renew_deadline:g}s renew deadline: another replica may lead")
        raise errors.NotLeader(method, path, why)

    def run(self) -> None:
        """Block: acquire, lead (renewing) until the lease is lost or stop() is called; then release."""
        self._done.clear()
        try:
            if not self._acquire():
                return
            self._leading.set()
            if self.on_started_leading:
                threading.Thread(target=self.on_started_leading, name="leader-started", daemon=True).start()
            self._renew_until_lost()
        finally:
            was_leading = self._leading.is_set()
            if was_leading and self._stop.is_set():
                self.lock.release()
            self._leading.clear()
            self._done.set()
            if was_leading and self.on_stopped_leading:
                self.on_stopped_leading()

    def stop(self, timeout: float | None = None) -> None:
        """Stop leading (or trying to) and release the lease; waits for run() to finish."""
        self._stop.set()
        self._done.wait(self.renew_deadline if timeout is None else timeout)

    # ---- loops -------------------------------------------------------------------------------------------

    def _acquire(self) -> bool:
        while not self._stop.is_set():
            if self._try_acquire_or_renew() and self._settled():
                log.info("%s acquired lease %s/%s", self.identity, self.namespace, self.name)
                return True
            self._stop.wait(self.retry_period * (1 + random.random() * JITTER_FACTOR))
        return False

    def _settled(self) -> bool:
        """With a guard, the Lease taken is led from the next round, whose read shows whether a replica of
        another mode took its own Lease meanwhile (the two reads crossed); else at once."""
        if self.guard is None:
            return True
        self._stop.wait(self.retry_period)
        if not self._stop.is_set() and self._try_acquire_or_renew():
            return True
        if self.waiting_for:
            self.lock.release()
        return False

    def _renew_until_lost(self) -> None:
        while not self._stop.is_set():
            while not self._try_acquire_or_renew():
                if self._stop.is_set():
                    return
                if self.waiting_for:
                    log.warning("%s stands down from lease %s/%s: %s", self.identity, self.namespace, self.name,
                                self.waiting_for)
                    self.lock.release()
                    return
                # Counted from the last success, as the fence counts: past it we are no leader any more.
                deadline = (self.lock.renewed_at or 0.0) + self.renew_deadline
                if self._clock() + self.retry_period > deadline:
                    log.warning("%s failed to renew lease %s/%s: leadership lost", self.identity,
                                self.namespace, self.name)
                    return
                self._stop.wait(self.retry_period)
            self._stop.wait(self.retry_period)

    def _try_acquire_or_renew(self) -> bool:
        if self.guard is None:
            return self.lock.try_acquire_or_renew()
        sent_at = self._clock()
        try:
            leases = self.client.list(LEASES, self.namespace).get("items") or []
        except errors.Forbidden as exc:  # an older Role (get/update of our Lease only): elect without the guard
            log.error("cannot list leases in %s (%s): a rollout to or from --shards is not handed over; grant "
                      "list on leases (manifests/base/rbac.yaml)", self.namespace, exc.message)
            self.guard = None
            return self.lock.try_acquire_or_renew()
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("listing leases in %s failed: %s", self.namespace, exc)
            return False
        self.guard.observe(leases)
        self._note_waiting(self.guard.must_wait())
        if self.waiting_for:
            return False
        ours = next((lease for lease in leases if (lease.get("metadata") or {}).get("name") == self.name), None)
        return self.lock.acquire_or_renew_from(ours, sent_at)

    def _note_waiting(self, why: str) -> None:
        if why == self.waiting_for:
            return
        self.waiting_for = why
        if why:
            log.warning("%s waits for another mode: %s", self.identity, why)
        else:
            log.info("%s: no other mode acts any more", self.identity)
        if self.on_conflict is not None:
            self.on_conflict(why)
