"""tests/charts: the Helm chart through real Helm (helm-sdkpy) on the API emulator; chart_support says how."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chart_support import NAMESPACE, Cluster, helm

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NAMESPACES


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    module = helm()
    from sim.kubeapi import KubeAPIServer

    server = KubeAPIServer(tls=True).start()
    try:
        kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        kube = KubeClient(load_config(kubeconfig))
        kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        try:
            yield Cluster(kubeconfig, kube, module)
        finally:
            kube.close()
    finally:
        server.stop()
