"""Sharding scenarios (issue 16): two controllers with ``--shards 2`` on one simulated cluster, each acting on
the nodes of the shard Lease it holds; faults in both shards repaired, each by its shard's replica; a budget
of 1 holds across both replicas; a killed replica's shard taken over after its lease duration and its node's
repair finished by the survivor.

Emulator target only (two controller subprocesses beside the harness's). Run:
``python -m pytest e2e/test_shards.py -x -q``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import SYSTEM_NS, Cluster, ControllerProcess, EmulatorCluster, Metrics, policy_toml
from gpuremediate.kube.shards import list_shard_leases, shard_of
from gpuremediate.vocab import states

SHARDS = 2
LEASE_ARGS = ["--leader-elect-lease-duration", "3s", "--leader-elect-renew-deadline", "2s",
              "--leader-elect-retry-period", "0.5s"]
NO_BREAKER = {"enabled": False}  # two faults in four nodes would open it; not what these scenarios test


class Replica:
    """One ``gpuremediate run --shards 2 --identity NAME`` subprocess (``mode``: other flags than --shards 2),
    its JSON log kept apart."""

    def __init__(self, cluster: EmulatorCluster, identity: str, policy: Path,
                 mode: tuple[str, ...] = ("--shards", str(SHARDS))) -> None:
        interval = f"{cluster.INTERVAL_S}s"
        self.identity = identity
        self.log: list[str] = []
        args = [*cluster.controller_args(), "--policy", str(policy), "--metrics-addr", "127.0.0.1:0",
                "--log-format", "json", "--scrape-interval", interval, "--resync", interval, "--scrape-timeout", "2s",
                "--namespace", SYSTEM_NS, *mode, "--identity", identity, *LEASE_ARGS]
        self.proc = ControllerProcess(args, self.log)
        self.proc.wait_port(20)

    def drained(self) -> set[str]:
        """Nodes whose drain this replica started."""
        found = set()
        for line in self.log:
            if '"drain started"' in line:
                try:
                    found.add(str(json.loads(line)["node"]))
                except (ValueError, KeyError):
                    continue
        return found

    def metrics(self) -> Metrics:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.proc.port}/metrics", timeout=5) as resp:
            return Metrics(resp.read().decode())

    def problems(self) -> list[str]:
        return [line[:300] for line in self.log if '"exc": ' in line or line.startswith("Traceback")]


@pytest.fixture
def sharded(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[EmulatorCluster, list[Replica]]]:
    if not isinstance(cluster, EmulatorCluster):
        pytest.skip("runs two controller subprocesses beside the simulated cluster (emulator target)")
    replicas: list[Replica] = []
    yield cluster, replicas
    for replica in replicas:
        code = replica.proc.terminate()
        cluster.log.append(f"---- replica {replica.identity} (exit code {code})")
        cluster.log.extend(replica.log[-30:])
        assert code in (0, -9), f"{replica.identity} exited {code} on SIGTERM"
        assert replica.problems() == [], replica.problems()


def _start(cluster: EmulatorCluster, replicas: list[Replica], tmp: Path, policy: dict[str, Any],
           *names: str) -> None:
    path = tmp / "policy.toml"
    path.write_text(policy_toml(policy))
    replicas.extend(Replica(cluster, name, path) for name in names)
    cluster.wait(lambda: _holders(cluster) == set(names), 20, f"the {SHARDS} shard Leases held by {names}",
                 seen=lambda: _leases(cluster))


def _leases(cluster: Cluster) -> dict[int, str]:
    return {lease.index: lease.holder for lease in list_shard_leases(cluster.kube, SYSTEM_NS)}


def _holders(cluster: Cluster) -> set[str]:
    leases = _leases(cluster)
    return set(leases.values()) if len(leases) == SHARDS and all(leases.values()) else set()


def _node_of(cluster: Cluster, holder: str) -> str:
    """A node of the shard ``holder`` holds now."""
    leases = _leases(cluster)
    return next(n for n in cluster.nodes if leases.get(shard_of(n, SHARDS)) == holder)


def _repaired(cluster: Cluster, node: str, timeout: float = 40) -> None:
    def back() -> bool:
        rec = cluster.record(node)
        return rec is not None and rec.state == states.HEALTHY and any(h.outcome == "repaired" for h in rec.history)

    cluster.wait(back, timeout, f"{node} repaired and healthy", seen=lambda: cluster.summary(node))


def _in_service_count_by_us(cluster: Cluster) -> int:
    """Nodes holding a budget slot by our admission: a drain started, or repairing / validating."""
    count = 0
    for node in cluster.nodes:
        rec = cluster.record(node)
        if rec is not None and (rec.state in (states.REPAIRING, states.VALIDATING) or rec.action is not None):
            count += 1
    return count


def test_each_replica_repairs_the_faults_of_its_own_shard(
        sharded: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = sharded
    _start(cluster, replicas, tmp_path, {"budget": {"max_unavailable": "2"}, "breaker": NO_BREAKER},
           "replica-a", "replica-b")
    first, second = replicas
    node_a, node_b = _node_of(cluster, first.identity), _node_of(cluster, second.identity)
    cluster.inject(node_a, 0, "dbe", 1)
    cluster.inject(node_b, 1, "dbe", 1)
    _repaired(cluster, node_a)
    _repaired(cluster, node_b)
    cluster.wait(lambda: node_a in first.drained() and node_b in second.drained(), 5,
                 "each replica's log says it drained its own shard's node")
    assert node_a not in second.drained() and node_b not in first.drained()
    for replica in replicas:  # each acts on one shard; together on every GPU node
        cluster.wait(lambda r=replica: r.metrics().value("gpuremediate_shards_held") == 1, 10,
                     f"{replica.identity} reports one shard held")
    cluster.wait(lambda: sum(r.metrics().value("gpuremediate_shard_nodes") for r in replicas) == len(cluster.nodes),
                 10, "the replicas' shard_nodes adding up to every GPU node",
                 seen=lambda: [r.metrics().value("gpuremediate_shard_nodes") for r in replicas])
    status = cluster.cli("status", "--namespace", SYSTEM_NS)
    assert status.returncode == 0, status.stderr
    assert "shards (2): 0 replica-" in status.stdout and "replica-a" in status.stdout \
        and "replica-b" in status.stdout, status.stdout


def test_a_budget_of_one_holds_across_shards(
        sharded: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    """Each replica counts every shard's nodes against the one budget (a replica counting only its own shard
    breaks this at once). The millisecond race of two informers that both miss the other's cordon is forced
    in tests/loops/test_shard_admission.py."""
    cluster, replicas = sharded
    _start(cluster, replicas, tmp_path, {"budget": {"max_unavailable": "1"}, "breaker": NO_BREAKER},
           "replica-a", "replica-b")
    node_a, node_b = _node_of(cluster, "replica-a"), _node_of(cluster, "replica-b")
    with cluster.invariant(lambda: None if _in_service_count_by_us(cluster) <= 1 else
                           "two nodes admitted under a budget of 1: " +
                           "; ".join(cluster.summary(n) for n in (node_a, node_b)),
                           "at most one node out of service by our admission"):
        cluster.inject(node_a, 0, "dbe", 1)  # both at once: each replica sees one free slot
        cluster.inject(node_b, 0, "dbe", 1)
        _repaired(cluster, node_a, timeout=60)
        _repaired(cluster, node_b, timeout=60)


def test_a_killed_replica_s_shard_is_taken_over_and_its_repair_finished(
        sharded: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = sharded
    _start(cluster, replicas, tmp_path, {"budget": {"max_unavailable": "2"}, "breaker": NO_BREAKER},
           "replica-a", "replica-b")
    survivor, doomed = replicas
    node = _node_of(cluster, doomed.identity)
    cluster.workload("held", node, labels={"app": "held"})
    cluster.pdb("held", {"app": "held"}, min_available=1)  # its drain waits on the PDB: mid-repair
    cluster.inject(node, 0, "dbe", 1)
    cluster.wait(lambda: (rec := cluster.record(node)) is not None and rec.blocked is not None
                 and rec.blocked.reason == "pdb", 15, f"{node} draining, held by its PDB",
                 seen=lambda: cluster.summary(node))
    cluster.wait(lambda: node in doomed.drained(), 5, f"{doomed.identity}'s log says it started {node}'s drain")
    doomed.proc.kill()  # SIGKILL: no release; the survivor waits out the 3 s lease duration
    cluster.wait(lambda: _holders(cluster) == {survivor.identity}, 20, "both shards held by the survivor",
                 seen=lambda: _leases(cluster))
    cluster.set_pdb_min_available("held", 0)
    _repaired(cluster, node)
    assert survivor.drained().isdisjoint({node}), "the drain went on from where it was, not started again"
    assert any(f'"node": "{node}"' in line for line in survivor.log), "the survivor acted on the node"


def test_maintenance_requests_are_handled_by_their_node_s_shard(
        sharded: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    from e2e.test_maintenance import create, install_crd, request, wait_phase

    cluster, replicas = sharded
    install_crd(cluster)  # before the replicas start: each enables its maintenance loop when the kind is served
    _start(cluster, replicas, tmp_path, {"budget": {"max_unavailable": "2"}, "breaker": NO_BREAKER,
                                         "maintenance": {"prepare_lead_s": 1.0, "respect_budget": True}},
           "replica-a", "replica-b")
    node_a, node_b = _node_of(cluster, "replica-a"), _node_of(cluster, "replica-b")
    create(cluster, request("mr-a", node_a, "RESTART_BM"))
    create(cluster, request("mr-b", node_b, "RESTART_BM"))
    wait_phase(cluster, "mr-a", "Completed", timeout=40)
    wait_phase(cluster, "mr-b", "Completed", timeout=40)
    for replica in replicas:  # neither replica tried to write a node of the other's shard
        assert not any("refusing writes" in line or "NotLeader" in line for line in replica.log), replica.identity


LEADER_ELECT = ("--leader-elect",)


def _leader(cluster: Cluster) -> str:
    from gpuremediate.kube.errors import NotFound
    from gpuremediate.kube.resources import LEASES
    try:
        lease = cluster.kube.get(LEASES, "gpuremediate", SYSTEM_NS)
    except NotFound:
        return ""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _repairs(cluster: Cluster, node: str) -> int:
    rec = cluster.record(node)
    return 0 if rec is None else sum(1 for h in rec.history if h.outcome == "repaired")


def _repair_all(cluster: EmulatorCluster, nodes: list[str], gpu: int) -> None:
    """A double-bit ECC error on ``gpu`` of every node, each repaired (one more repair in its history)."""
    before = {node: _repairs(cluster, node) for node in nodes}
    for node in nodes:
        cluster.inject(node, gpu, "dbe", 1)
    for node in nodes:
        cluster.wait(lambda n=node: _repairs(cluster, n) > before[n] and
                     (rec := cluster.record(n)) is not None and rec.state == states.HEALTHY, 90,
                     f"{node} repaired again and healthy", seen=lambda n=node: cluster.summary(n))


def _handover(cluster: EmulatorCluster, replicas: list[Replica], tmp: Path, old_mode: tuple[str, ...],
              new_mode: tuple[str, ...], old_acts: Any, new_acts: Any) -> None:
    """A rolling update from ``old_mode`` to ``new_mode``: the new replica starts beside the old one, which
    alone acts on every node until it is terminated; then the new one acts on every node."""
    path = tmp / "policy.toml"
    path.write_text(policy_toml({"budget": {"max_unavailable": "100%"}, "breaker": NO_BREAKER}))
    old = Replica(cluster, "old", path, old_mode)
    replicas.append(old)
    cluster.wait(lambda: old_acts(cluster, "old"), 20, "the old replica acting", seen=lambda: _leases(cluster))
    new = Replica(cluster, "new", path, new_mode)
    replicas.append(new)
    cluster.wait(lambda: new.metrics().value("gpuremediate_mode_handover_waiting") == 1, 20,
                 "the new replica waiting for the old mode")
    nodes = list(cluster.nodes)
    _repair_all(cluster, nodes, gpu=0)
    assert old.drained() == set(nodes) and new.drained() == set(), (old.drained(), new.drained())
    assert not new_acts(cluster, "new"), "the new replica took its Leases while the old mode acted"
    code = old.proc.terminate()  # the rollout ends the old pod: its Leases are released
    assert code == 0, f"old replica exited {code}"
    cluster.wait(lambda: new_acts(cluster, "new"), 20, "the new replica acting once the old one is gone",
                 seen=lambda: _leases(cluster))
    cluster.wait(lambda: new.metrics().value("gpuremediate_mode_handover_waiting") == 0, 10,
                 "the new replica no longer waiting")
    _repair_all(cluster, nodes, gpu=1)
    assert new.drained() == set(nodes), new.drained()
    replicas.remove(old)
    assert old.problems() == [], old.problems()


def _leads(cluster: Cluster, identity: str) -> bool:
    return _leader(cluster) == identity


def _holds_shards(count: int) -> Any:
    def holds(cluster: Cluster, identity: str) -> bool:
        leases = _leases(cluster)
        return all(leases.get(i) == identity for i in range(count))
    return holds


def test_a_rollout_from_leader_election_to_shards_hands_over_without_two_acting(
        sharded: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = sharded
    _handover(cluster, replicas, tmp_path, LEADER_ELECT, ("--shards", str(SHARDS)), _leads, _holds_shards(SHARDS))


def test_a_rollout_from_shards_to_leader_election_hands_over_without_two_acting(
        sharded: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = sharded
    _handover(cluster, replicas, tmp_path, ("--shards", str(SHARDS)), LEADER_ELECT, _holds_shards(SHARDS), _leads)


def test_a_rollout_between_shard_counts_hands_over_without_two_acting(
        sharded: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = sharded
    _handover(cluster, replicas, tmp_path, ("--shards", "3"), ("--shards", str(SHARDS)), _holds_shards(3),
              _holds_shards(SHARDS))
