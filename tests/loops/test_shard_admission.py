"""Drain admission with --shards 2 and a budget of 1: two replicas whose informers each show one free slot
(neither has seen the other's cordon yet) must not both start a drain. The nodes' own records never conflict,
so only the claim in ConfigMap gpuremediate-budget stops the second one (without it, both are admitted)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.budget_claims import ADMITTED_KEY, BUDGET_CONFIGMAP, Contended
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import CONFIGMAPS, NAMESPACES, NODES
from gpuremediate.kube.shards import preferred_shard, shard_of
from gpuremediate.loops.drain import DrainLoop
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import RECORD_ANNOTATION, Fault, NodeRecord, encode, record_from_node
from sim.kubeapi import KubeAPIServer

NAMESPACE = "gpuremediate-system"
POLICY = loads_policy('[budget]\nmax_unavailable = "1"\n[breaker]\nenabled = false\n')


class FrozenInformer:
    """A node cache that stopped at a moment: what a lagging informer shows."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}

    def get(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.nodes.get(name))

    def get_stored(self, name: str) -> dict[str, Any] | None:
        return self.get(name)

    def list(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(n) for n in self.nodes.values()]


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _waiting(name: str, first_seen: float) -> dict[str, Any]:
    """Cordoned by us for a fault, its drain not started (holds no budget slot yet)."""
    fault = Fault(kind="xid", code="48", gpus=("0",), fingerprint=f"xid/48/{name}", action="reboot",
                  first_seen=first_seen, last_seen=first_seen, message="XID 48")
    record = NodeRecord(state=states.DRAINING, since=first_seen, reason="fault", fault=fault, cordoned_by_us=True)
    node = _node(name)
    node["metadata"]["annotations"] = {RECORD_ANNOTATION: encode(record)}
    node["spec"] = {"unschedulable": True}
    return node


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    srv = KubeAPIServer().start()
    yield srv
    srv.stop()


def _client(srv: KubeAPIServer) -> KubeClient:
    return KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)


def _identity_for(shard: int) -> str:
    return next(f"replica-{i}" for i in range(100) if preferred_shard(f"replica-{i}", 2) == shard)


def _replicas(srv: KubeAPIServer, seen: dict[int, list[dict[str, Any]]], policy: Any = POLICY) -> list[DrainLoop]:
    """One controller per shard, each holding its shard and seeing ``seen[shard]`` in its node cache."""
    # Long leases: the rounds are driven by hand, and a machine stall past a 10 s renew deadline before the
    # reconcile would make owned() give the shard up.
    controllers = [Controller(Settings(namespace=NAMESPACE, shards=2, identity=_identity_for(shard),
                                       lease_duration_s=900, renew_deadline_s=600, retry_period_s=2), policy,
                              client=_client(srv), source=object())  # type: ignore[arg-type]
                   for shard in sorted(seen)]
    for _ in range(3):  # the first round takes the preferred shard; the next one acts on it
        for controller in controllers:
            assert controller.shards is not None
            controller.shards.round()
    loops = []
    for shard, controller in zip(sorted(seen), controllers, strict=True):
        assert controller.shards is not None and controller.shards.owned() == frozenset({shard})
        controller.ctx.nodes.informer = FrozenInformer(seen[shard])  # type: ignore[assignment]
        for node in seen[shard]:  # indexed as the frozen cache's events would have left them
            controller.ctx.nodes._indexed(node)
        loops.append(next(loop for loop in controller.node_loops if isinstance(loop, DrainLoop)))
    return loops


def test_two_shards_admitting_the_last_slot_at_once_start_one_drain(server: KubeAPIServer) -> None:
    admin = _client(server)
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    names = [f"gpu-{i}" for i in range(20)]
    node_0 = next(n for n in names if shard_of(n, 2) == 0)
    node_1 = next(n for n in names if shard_of(n, 2) == 1)
    quiet = [n for n in names if n not in (node_0, node_1)][:2]
    for i, name in enumerate([node_0, node_1, *quiet]):
        admin.create(NODES, _waiting(name, 100.0 + i) if name in (node_0, node_1) else _node(name))
    stored = {n: _as_settled(admin, n) for n in (node_0, node_1, *quiet)}

    def view_of(mine: str, theirs: str) -> list[dict[str, Any]]:
        """Our node as stored; the other shard's as it was before its cordon (our informer lags)."""
        before = copy.deepcopy(stored[theirs])
        before["metadata"]["annotations"] = {}
        before["spec"] = {}
        return [stored[mine], before, *(stored[n] for n in quiet)]

    first, second = _replicas(server, {0: view_of(node_0, node_1), 1: view_of(node_1, node_0)})
    first.reconcile_name(node_0)
    second.reconcile_name(node_1)

    started, records = _started(admin, node_0, node_1)
    assert started == [node_0], records
    held = records[node_1]
    assert isinstance(held, NodeRecord) and held.blocked is not None and held.blocked.reason == "budget"
    assert held.blocked.detail.startswith(f"budget full: 1 of 1 out of service ({node_0}: "), held.blocked


def _as_settled(admin: KubeClient, name: str) -> dict[str, Any]:
    """The node as stored once the emulator's node lifecycle has written its unschedulable taint. That write
    follows the create asynchronously: a frozen informer holding the node from before it would make every
    guarded write 409 and the decision start again from the same stale copy, so nothing would be admitted."""
    deadline = time.monotonic() + 30
    while True:
        node = admin.get(NODES, name)
        spec = node.get("spec") or {}
        tainted = any(t.get("key") == "node.kubernetes.io/unschedulable" for t in spec.get("taints") or [])
        cordoned = bool(spec.get("unschedulable"))
        if tainted or not cordoned or time.monotonic() > deadline:
            return node
        time.sleep(0.02)


def _started(admin: KubeClient, *names: str) -> tuple[list[str], dict[str, Any]]:
    """Which of the nodes started a drain, and every node's record, as the server has them."""
    records = {n: record_from_node(admin.get(NODES, n)) for n in names}
    return [n for n, r in records.items() if isinstance(r, NodeRecord) and r.action is not None], records


def _older_on_shard_1(server: KubeAPIServer) -> tuple[KubeClient, str, str]:
    """A node of each shard waiting for a drain, the older fault on shard 1's."""
    admin = _client(server)
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    names = [f"gpu-{i}" for i in range(20)]
    node_0 = next(n for n in names if shard_of(n, 2) == 0)
    node_1 = next(n for n in names if shard_of(n, 2) == 1)
    admin.create(NODES, _waiting(node_1, 100.0))
    admin.create(NODES, _waiting(node_0, 101.0))
    return admin, node_0, node_1


def test_a_node_that_holds_its_claim_starts_although_an_older_fault_waits(server: KubeAPIServer) -> None:
    """A claim whose node write failed (a 409: a real cluster's kube-controller-manager writes the Node right
    after a cordon) still holds its slot in the admitted set. Its node must use it even when its informer now
    shows an older fault waiting: that node's replica counts the claim and waits for it, so yielding to it
    would leave both waiting forever (seen on a real v1.36 control plane: e2e test_a_budget_of_one_holds_...)."""
    admin, node_0, node_1 = _older_on_shard_1(server)
    admin.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": BUDGET_CONFIGMAP, "namespace": NAMESPACE},
                              "data": {ADMITTED_KEY: json.dumps({node_0: 101.5})}}, NAMESPACE)
    stored = [_as_settled(admin, n) for n in (node_0, node_1)]

    first, second = _replicas(server, {0: stored, 1: stored})
    first.reconcile_name(node_0)
    second.reconcile_name(node_1)

    started, records = _started(admin, node_0, node_1)
    assert started == [node_0], records
    held = records[node_1]
    assert isinstance(held, NodeRecord) and held.blocked is not None
    assert held.blocked.detail.startswith(f"budget full: 1 of 1 out of service ({node_0}: "), held.blocked


def test_without_a_claim_the_younger_fault_still_waits_for_the_older(server: KubeAPIServer) -> None:
    """The order is kept with --shards too: the claim's refusal puts older faults first."""
    admin, node_0, node_1 = _older_on_shard_1(server)
    stored = [_as_settled(admin, n) for n in (node_0, node_1)]

    first, second = _replicas(server, {0: stored, 1: stored})
    first.reconcile_name(node_0)  # the younger asks first
    second.reconcile_name(node_1)

    started, records = _started(admin, node_0, node_1)
    assert started == [node_1], records
    held = records[node_0]
    assert isinstance(held, NodeRecord) and held.blocked is not None
    assert held.blocked.detail.startswith("older faults go first"), held.blocked


def test_a_contended_claim_is_asked_again_at_once_and_leaves_no_block(server: KubeAPIServer,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write of the admitted set met another replica's: no 'budget claim failed' recorded on the node (it
    was, and the node then waited a resync), the drain asked again as after any conflict."""
    admin, node_0, node_1 = _older_on_shard_1(server)
    stored = [_as_settled(admin, n) for n in (node_0, node_1)]
    _, second = _replicas(server, {0: stored, 1: stored})
    before = admin.get(NODES, node_1)

    def contended(*_: Any) -> str:
        raise Contended("ConfigMap gpuremediate-system/gpuremediate-budget: 5 conflicting writes in a row")

    assert second.ctx.claims is not None
    monkeypatch.setattr(second.ctx.claims, "claim_ahead", contended)
    assert second.reconcile_name(node_1) == second.retry_after_conflict()
    after = admin.get(NODES, node_1)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # nothing written
    monkeypatch.undo()
    second.reconcile_name(node_1)
    assert _started(admin, node_1)[0] == [node_1]


def test_one_admission_claims_the_replica_s_other_waiting_nodes_in_its_write(server: KubeAPIServer) -> None:
    """A budget of 3 and four of shard 0's nodes waiting: the oldest's admission claims the next two in its one
    write of the admitted set and queues them; their own admissions start their drains with no write of it; the
    fourth waits, the budget full."""
    admin = _client(server)
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    mine = [n for n in (f"gpu-{i}" for i in range(40)) if shard_of(n, 2) == 0][:4]
    for i, name in enumerate(mine):
        admin.create(NODES, _waiting(name, 100.0 + i))
    stored = [_as_settled(admin, n) for n in mine]
    policy = loads_policy('[budget]\nmax_unavailable = "3"\n[breaker]\nenabled = false\n')
    drain, _ = _replicas(server, {0: stored, 1: stored}, policy)

    queued: list[str] = []
    drain.queue.add = queued.append  # type: ignore[method-assign]
    since = len(server.requests)
    drain.reconcile_name(mine[0])
    writes = [r for r in server.requests[since:] if r[3] == "configmaps" and r[1] in ("create", "update")]
    assert len(writes) == 1, writes
    configmap = admin.get(CONFIGMAPS, BUDGET_CONFIGMAP, NAMESPACE)
    assert set(json.loads(configmap["data"][ADMITTED_KEY])) == set(mine[:3])
    assert queued == mine[1:3]  # each asked at once, not at its next resync
    since = len(server.requests)
    for name in mine[1:]:
        drain.reconcile_name(name)
    writes = [r for r in server.requests[since:] if r[3] == "configmaps" and r[1] in ("create", "update")]
    assert writes == [], writes
    started, records = _started(admin, *mine)
    assert started == mine[:3], records
    held = records[mine[3]]
    assert isinstance(held, NodeRecord) and held.blocked is not None and held.blocked.reason == "budget"
