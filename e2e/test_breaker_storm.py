"""A storm in one scrape (issue 30): the controller counts the new faults of the whole read before it acts on
any. Past the breaker's threshold it opens with nothing cordoned and says how many; below it every fault is
acted on; split across two shards (each replica scrapes only its own), each replica's share of the storm opens
it before either acts. Faults are injected before the controller starts, so its first read has them all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness import Cluster, EmulatorCluster, make_cluster, policy_toml
from e2e.test_shards import Replica, _holders
from gpuremediate.state import states

BUDGET_ALL = {"max_unavailable": "100%"}
BREAKER = {"threshold_percent": 30, "min_nodes": 3}


def _storm(cluster: Cluster, nodes: list[str]) -> None:
    for node in nodes:
        cluster.inject(node, 0, "xid", 79)


def _breaker_held(cluster: Cluster, node: str) -> bool:
    rec = cluster.record(node)
    return rec is not None and rec.blocked is not None and rec.blocked.reason == "breaker"


def test_a_storm_in_one_scrape_opens_the_breaker_with_nothing_cordoned(cluster: Cluster) -> None:
    stormed = cluster.nodes[:3]  # 3 of 4: past 30 %
    _storm(cluster, stormed)
    cluster.start_controller({"budget": BUDGET_ALL, "breaker": BREAKER})
    for node in stormed:
        cluster.wait(lambda n=node: _breaker_held(cluster, n), 20, f"{node}'s fault held by the breaker",
                     seen=lambda n=node: cluster.summary(n))
    event = cluster.wait_event(stormed[0], "GPURemediationBreakerOpen", "3 of 4 GPU nodes faulted", timeout=10)
    assert "3 new in one read" in event["message"], event["message"]
    assert not any(cluster.unschedulable(n) for n in cluster.nodes), [cluster.summary(n) for n in cluster.nodes]
    assert all(cluster.state(n) == states.HEALTHY for n in cluster.nodes)


def test_faults_below_the_threshold_in_one_scrape_are_all_acted_on(cluster: Cluster) -> None:
    stormed = cluster.nodes[:1]  # 1 of 4: 25 %, under 30 %
    _storm(cluster, stormed)
    cluster.start_controller({"budget": BUDGET_ALL, "breaker": BREAKER})
    for node in stormed:
        cluster.wait(lambda n=node: cluster.unschedulable(n) and cluster.state(n) != states.HEALTHY, 20,
                     f"{node} cordoned", seen=lambda n=node: cluster.summary(n))
    assert cluster.metrics().value("gpuremediate_circuit_breaker_open") == 0


WIDE = 48  # two shards of about 24 nodes: each replica's own nodes are a sample of the fleet


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[tuple[EmulatorCluster, list[Replica]]]:
    """The target's cluster with WIDE nodes (the emulator, or NodeSim's nodes on the apiserver target's server)."""
    cluster = make_cluster(tmp_path, nodes=WIDE)
    if not isinstance(cluster, EmulatorCluster):
        pytest.skip("48 simulated GPU nodes (a kubeconfig cluster's nodes are its own)")
    cluster.start()
    replicas: list[Replica] = []
    try:
        yield cluster, replicas
    finally:
        for replica in replicas:
            replica.proc.terminate()
        cluster.stop()


def _sharded(cluster: EmulatorCluster, replicas: list[Replica], tmp: Path, stormed: list[str]) -> None:
    _storm(cluster, stormed)
    path = tmp / "policy.toml"
    path.write_text(policy_toml({"budget": BUDGET_ALL, "breaker": BREAKER}))
    replicas.extend(Replica(cluster, name, path) for name in ("replica-a", "replica-b"))
    cluster.wait(lambda: _holders(cluster) == {"replica-a", "replica-b"}, 30, "each replica holding a shard")


def test_a_storm_split_across_two_shards_opens_the_breaker_with_nothing_cordoned(
        wide: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = wide
    stormed = [n for i, n in enumerate(cluster.nodes) if i % 5 < 3]  # 60 %, in both shards
    _sharded(cluster, replicas, tmp_path, stormed)
    cluster.wait(lambda: all(_breaker_held(cluster, n) for n in stormed), 60,
                 "every stormed node held by the breaker",
                 seen=lambda: [n for n in stormed if not _breaker_held(cluster, n)])
    assert not any(cluster.unschedulable(n) for n in cluster.nodes)
    for replica in replicas:
        assert replica.problems() == [], replica.problems()


def test_faults_below_the_threshold_split_across_two_shards_are_all_acted_on(
        wide: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = wide
    stormed = cluster.nodes[::5]  # 20 %
    _sharded(cluster, replicas, tmp_path, stormed)
    cluster.wait(lambda: all(cluster.unschedulable(n) for n in stormed), 60, "every faulted node cordoned",
                 seen=lambda: [n for n in stormed if not cluster.unschedulable(n)])
    assert sum(r.metrics().value("gpuremediate_circuit_breaker_open") for r in replicas) == 0
