"""With --shards, the exporter source scrapes only the exporter pods on nodes of the shards held now, and
expects readings only for those nodes (another replica reads the rest)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.config import Settings, SettingsError
from gpuremediate.controller import ShardExporterSource, build_source
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, PODS
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.signals.sources import PrometheusSource
from sim.kubeapi import KubeAPIServer

NODES = ("gpu-a", "gpu-b", "gpu-c")


class Nodes:
    """The GPU nodes as the loops' NodeView lists them."""

    def gpu_nodes(self) -> list[dict[str, Any]]:
        return [{"metadata": {"name": n, "labels": {}}} for n in (*NODES, "gpu-d")]  # gpu-d: no exporter pod

    def gpu_count(self) -> int:
        return len(self.gpu_nodes())


@pytest.fixture
def client() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    kube = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-operator"}})
    for node in NODES:  # Pending: no scrape is attempted, each yields an unknown reading naming its pod
        kube.create(PODS, {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": f"exporter-{node}", "namespace": "gpu-operator",
                                        "labels": {"app": "nvidia-dcgm-exporter"}},
                           "spec": {"nodeName": node, "containers": [{"name": "e", "image": "dcgm-exporter"}]}},
                    "gpu-operator")
    yield kube
    kube.close()
    srv.stop()


def test_only_owned_nodes_are_scraped_or_expected(client: KubeClient) -> None:
    owned = {"gpu-b", "gpu-d"}
    source = build_source(Settings(shards=2), client, ControllerMetrics(), Nodes(),  # type: ignore[arg-type]
                          owns=lambda node: node in owned)
    assert isinstance(source, ShardExporterSource)
    try:
        readings = {r.node: r.reason for r in source.read()}
    finally:
        source.stop()
    assert set(readings) == owned
    assert "exporter-gpu-b" in readings["gpu-b"] and "no exporter pod" in readings["gpu-d"]


def test_unsharded_every_node_is_read(client: KubeClient) -> None:
    source = build_source(Settings(), client, ControllerMetrics(), Nodes())  # type: ignore[arg-type]
    try:
        assert {r.node for r in source.read()} == {*NODES, "gpu-d"}
    finally:
        source.stop()


def test_per_shard_prometheus_reads_select_the_shards_held(client: KubeClient) -> None:
    """--prometheus-shard-label: every query of a read selects the held shards' series by that label."""
    settings = Settings(source="prometheus", prometheus_url="http://prometheus:9090", shards=4,
                        shard_hash="hashmod", prometheus_shard_label="gpuremediate_shard").validate()
    source = build_source(settings, client, ControllerMetrics(), Nodes(),  # type: ignore[arg-type]
                          owns=lambda _node: True, held=lambda: frozenset({3, 1}))
    assert isinstance(source, PrometheusSource) and source.shard_scope is not None
    asked: list[str] = []

    def answer(query: str, what: str, timeout: float | None = None, answered: Any = None) -> tuple[list[Any], float]:
        asked.append(query)
        return [], 0.0

    source._query = answer  # type: ignore[method-assign]
    source.read()
    source.reads = 1
    source.changed_nodes()
    assert asked and source.mode == "raw"  # the recording rules aggregate the shard label away: not looked for
    for query in asked:
        selectors = re.findall(r"\{[^}]*\}", query)
        assert selectors and all('gpuremediate_shard=~"1|3"' in s for s in selectors), query


@pytest.mark.parametrize(("flags", "error"), [
    ({"prometheus_shard_label": "gpuremediate_shard", "shards": 4}, "--prometheus-shard-label needs"),
    ({"prometheus_shard_label": "gpuremediate_shard", "shard_hash": "hashmod"}, "--prometheus-shard-label needs"),
    ({"prometheus_shard_label": "gpu-shard", "shards": 4, "shard_hash": "hashmod"}, "not a Prometheus label name"),
    ({"shard_hash": "md5", "shards": 4}, "--shard-hash: expected one of sha256, hashmod"),
])
def test_per_shard_flags_are_checked(flags: dict[str, Any], error: str) -> None:
    with pytest.raises(SettingsError, match=error):
        Settings(source="prometheus", prometheus_url="http://prometheus:9090", **flags).validate()
