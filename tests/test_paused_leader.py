"""Two controllers with leader election on the emulator; the leader's renewals stall (as in a SIGSTOP).

Its loops keep running and try to act on a new fault; the other replica takes over after the lease
duration. Every write the stalled leader attempts after its renew deadline is refused inside the process:
the API server sees none of them, the replica that took over does the work, and the stalled one exits 1
as soon as its renewal thread runs again and sees the new holder.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.controller import Controller
from gpuremediate.kube.config import load_config
from gpuremediate.shutdown import Shutdown
from sim.cluster import SimCluster
from sim.waiting import wait_for
from tests.reliability.harness import StallableClient, reliability_policy, reliability_settings

MUTATING = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclasses.dataclass
class Replica:
    user: str
    client: StallableClient
    controller: Controller
    shutdown: Shutdown
    thread: threading.Thread
    exit_code: list[int]


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    with SimCluster(nodes=2) as sim:
        yield sim


def _replica(cluster: SimCluster, tmp: Path, name: str) -> Replica:
    user = f"gpuremediate-{name}"
    cluster.api.add_token(f"token-{name}", user)
    kubeconfig = cluster.api.write_kubeconfig(tmp / f"kubeconfig-{name}", token=f"token-{name}")
    client = StallableClient(load_config(kubeconfig), qps=500, burst=1000, timeout=10.0)
    settings = dataclasses.replace(reliability_settings(cluster, leader_elect=True), identity=name)
    controller = Controller(settings, reliability_policy(1), client=client)
    shutdown = Shutdown()
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(controller.run(shutdown)), name=f"replica-{name}",
                              daemon=True)
    thread.start()
    return Replica(user, client, controller, shutdown, thread, exit_code)


def _writes_after(cluster: SimCluster, user: str, mark: int) -> list[tuple[Any, ...]]:
    return [r for r in cluster.api.requests[mark:] if r[0] == user and r[1] in MUTATING and r[3] != "leases"]


def test_a_stalled_leader_sends_no_write_after_its_renew_deadline(cluster: SimCluster, tmp_path: Path) -> None:
    replicas = [_replica(cluster, tmp_path, "one"), _replica(cluster, tmp_path, "two")]
    try:
        wait_for(lambda: any(r.controller.acting for r in replicas), timeout=20, describe="one replica to lead")
        leader = next(r for r in replicas if r.controller.acting)
        follower = next(r for r in replicas if r is not leader)
        elector = leader.controller.elector
        assert elector is not None
        leader.client.stall()  # from now on its renewal thread hangs in the next Lease call
        wait_for(lambda: not elector.holds_valid_lease(), timeout=10,
                 describe="the stalled leader's renew deadline to pass")
        mark = len(cluster.api.requests)
        node = cluster.node_names[0]
        cluster.gpusim.inject(node, 0, "xid", 79)  # fatal: cordon at once

        wait_for(lambda: follower.controller.acting, timeout=20, describe="the other replica to take over")
        def acted() -> bool:
            new = any(r[3] == "nodes" and r[6] == node for r in _writes_after(cluster, follower.user, mark))
            return new or bool(_writes_after(cluster, leader.user, mark))

        wait_for(acted, timeout=20, describe=f"a replica to write {node} (its cordon and record)")
        assert _writes_after(cluster, leader.user, mark) == [], "the stalled leader wrote past its renew deadline"
        wait_for(lambda: leader.controller.metrics.fenced_writes.value() > 0, timeout=20,
                 describe="the stalled leader to have tried to act on the fault (refused in the process)")

        leader.client.resume()  # its renewal thread runs again: it sees the new holder and stops
        wait_for(lambda: leader.exit_code, timeout=20, describe="the old leader to exit")
        assert leader.exit_code == [1] and leader.controller.lost_lease
        assert _writes_after(cluster, leader.user, mark) == []
    finally:
        for replica in replicas:
            replica.client.resume()
            replica.shutdown.request()
        for replica in replicas:
            replica.thread.join(20)
