"""The leader's write fence: past its renew deadline by the local clock, no write leaves the process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.leader import LeaderElector
from gpuremediate.kube.resources import CONFIGMAPS, LEASES
from sim.waiting import wait_for
from tests.kube.conftest import KubeTarget

LEASE = "fence-test"


class FakeClock:
    """A monotonic clock the test moves; the elector reads it for renewals and for the fence."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


def _writes_by(target: KubeTarget, user: str) -> list[tuple[Any, ...]]:
    emulator = target.require_emulator("reads the emulator's request audit")
    return [r for r in emulator.requests if r[0] == user and r[1] not in ("get", "list", "watch")]


@pytest.fixture
def leading(kube_target: KubeTarget) -> Iterator[tuple[LeaderElector, KubeClient, FakeClock]]:
    """An elector that leads, renewing every 30 real seconds (so the test alone moves its clock)."""
    clock = FakeClock()
    client = kube_target.client()
    elector = LeaderElector(client, kube_target.namespace, LEASE, "me", lease_duration=60, renew_deadline=40,
                            retry_period=30, clock=clock)
    client.write_fence = elector.fence
    runner = threading.Thread(target=elector.run, daemon=True)
    runner.start()
    wait_for(lambda: elector.is_leader, describe="the elector to lead")
    yield elector, client, clock
    elector.stop(timeout=5)
    runner.join(5)


def test_writes_pass_while_the_lease_is_within_its_renew_deadline(
        leading: tuple[LeaderElector, KubeClient, FakeClock], kube_target: KubeTarget) -> None:
    elector, client, clock = leading
    clock.now += 39.0
    client.create(CONFIGMAPS, _configmap("within"), kube_target.namespace)
    client.patch(CONFIGMAPS, "within", {"data": {"k": "w"}}, kube_target.namespace)
    client.delete(CONFIGMAPS, "within", kube_target.namespace)
    assert elector.refused_writes == 0


def test_no_write_leaves_the_process_past_the_renew_deadline(
        leading: tuple[LeaderElector, KubeClient, FakeClock], kube_target: KubeTarget) -> None:
    elector, client, clock = leading
    user = "kubernetes-admin"  # the emulator's admin token, which every client of kube_target uses
    client.create(CONFIGMAPS, _configmap("existing"), kube_target.namespace)
    before = len(_writes_by(kube_target, user))
    clock.now += 40.0  # the process was paused: the last renewal is now as old as the renew deadline
    attempts = [
        lambda: client.create(CONFIGMAPS, _configmap("late"), kube_target.namespace),
        lambda: client.patch(CONFIGMAPS, "existing", {"data": {"k": "late"}}, kube_target.namespace),
        lambda: client.replace(CONFIGMAPS, "existing", _configmap("existing"), kube_target.namespace),
        lambda: client.delete(CONFIGMAPS, "existing", kube_target.namespace),
        lambda: client.evict("some-pod", kube_target.namespace),
    ]
    for attempt in attempts:
        with pytest.raises(errors.NotLeader) as refused:
            attempt()
        assert isinstance(refused.value, errors.ApiError) and refused.value.reason == "NotLeader"
        assert "renew deadline" in refused.value.message
    assert len(_writes_by(kube_target, user)) == before, "a write reached the server past the renew deadline"
    assert elector.refused_writes == len(attempts)
    assert client.get(CONFIGMAPS, "existing", kube_target.namespace)["data"] == {"k": "v"}  # reads still work


def test_a_replica_that_does_not_lead_writes_nothing_but_its_lease(kube_target: KubeTarget) -> None:
    holder = kube_target.client()
    holder.create(LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": LEASE}, "spec": {"holderIdentity": "other",
                                                                 "leaseDurationSeconds": 3600}},
                  kube_target.namespace)
    client = kube_target.client()
    elector = LeaderElector(client, kube_target.namespace, LEASE, "standby", lease_duration=3, renew_deadline=2,
                            retry_period=0.2)
    client.write_fence = elector.fence
    with pytest.raises(errors.NotLeader, match="does not hold lease"):
        client.create(CONFIGMAPS, _configmap("standby"), kube_target.namespace)
    assert not elector._try_acquire_or_renew()  # its own Lease calls pass the fence (and find a valid holder)
    with pytest.raises(errors.NotFound):
        client.get(CONFIGMAPS, "standby", kube_target.namespace)


def test_a_leader_that_cannot_renew_long_past_its_lease_turns_unhealthy(
        leading: tuple[LeaderElector, KubeClient, FakeClock]) -> None:
    elector, _client, clock = leading
    clock.now += 60 + 19  # lease duration 60 s, plus less than the 20 s tolerance
    assert elector.check() == ""
    clock.now += 2
    assert elector.check() == f"leader lease {elector.namespace}/{LEASE} not renewed for 81s"


def test_the_lease_clock_counts_through_a_suspend_where_the_os_can() -> None:
    import sys
    import time

    from gpuremediate.kube.leader import lease_clock

    if sys.platform.startswith("linux"):
        boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        assert abs(lease_clock() - boot) < 1.0  # CLOCK_BOOTTIME, not CLOCK_MONOTONIC (stops while suspended)
        assert lease_clock() >= time.monotonic() - 1.0
