"""A fresh emulator and an admin KubeClient for the Kubernetes-semantics review tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES
from sim.kubeapi import KubeAPIServer

NS = "sem"


@pytest.fixture
def srv() -> Iterator[KubeAPIServer]:
    server = KubeAPIServer(bookmark_interval_s=0.3).start()
    yield server
    server.stop()


@pytest.fixture
def client(srv: KubeAPIServer) -> Iterator[KubeClient]:
    made = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500.0,
                      burst=500, backoff_base=0.01, backoff_cap=0.05, max_retries=2)
    made.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    yield made
    made.close()
