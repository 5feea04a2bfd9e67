"""The domain breaker's count of one fault (issue 48): it makes the views of the faulted nodes' domains, from the
Node view's label index, not a view of every GPU node of the fleet per fault (at 100,000 cached Nodes that walk
was most of the fault fast path's check of one node); the domains it opens are the ones a full walk opens."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.policy import safety
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.fabric import CLIQUE_LABEL
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from sim.kubeapi import KubeAPIServer

NAMESPACE = "gpuremediate-system"
POLICY = loads_policy("[breaker]\nlook_s = 0\n")  # the fabric's clique label is a breaker domain by default
NODES_N, CLIQUE = 40, 4


class QuietSource:
    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=f"gpu-{i:02d}", source="prometheus", status=SOURCE_OK,
                             gpus=(GpuReading(node=f"gpu-{i:02d}", gpu="0", uuid=f"GPU-{i}"),))
                for i in range(NODES_N)]


@pytest.fixture
def controller() -> Iterator[Controller]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=1000, burst=1000)
    client.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
    for i in range(NODES_N):
        client.create(NODES, {"metadata": {"name": f"gpu-{i:02d}", "labels": {
            "nvidia.com/gpu.present": "true", CLIQUE_LABEL: f"c{i // CLIQUE}"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    made = Controller(Settings(namespace=NAMESPACE), POLICY, client=client, source=QuietSource())  # type: ignore[arg-type]
    assert made.start_caches(timeout=20)
    made.ctx.breakers.start()
    yield made
    made.stop()
    client.close()
    srv.stop()


def test_a_fault_s_domain_count_views_its_domain_not_the_fleet(controller: Controller,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    viewed: list[str] = []
    real_view, caller = safety.node_view, threading.get_ident()

    def counted(node: Any) -> safety.NodeView:
        if threading.get_ident() == caller:  # (the informer's thread views a Node it indexes: not the count's)
            viewed.append(node["metadata"]["name"])
        return real_view(node)

    monkeypatch.setattr(safety, "node_view", counted)
    walks: list[int] = []
    real_list = controller.informer.list
    detect, owned = controller.detect, controller.ctx.owned_gpu_nodes()  # the detect cycle's own walk, unsharded
    monkeypatch.setattr(controller.informer, "list", lambda: walks.append(1) or real_list())
    for i, name in enumerate(["gpu-00", "gpu-01", "gpu-02"]):  # 3 of clique c0's 4 nodes
        viewed.clear()
        detect._trip_breaker([name], NODES_N, owned, controller.ctx.clock())
        # c0's members only, and of those only the notable ones' Nodes (the others' views are the index's)
        assert set(viewed) <= {"gpu-00", "gpu-01", "gpu-02", "gpu-03"}, (i, viewed)
        assert [v.name for v in detect._domain_views([CLIQUE_LABEL], {name})] == ["gpu-00", "gpu-01", "gpu-02",
                                                                                   "gpu-03"]
    assert walks == []  # the cache was never walked
    trips = BreakerStore(controller.client, NAMESPACE).load().domains
    assert [(t.label, t.value) for t in trips] == [(CLIQUE_LABEL, "c0")]  # 3 of 4 > 50 %: c0 holds, alone
    assert "3 of 4 nodes" in trips[0].reason
    assert not BreakerStore(controller.client, NAMESPACE).load().is_open  # 3 of 40: the fleet's breaker stays shut
