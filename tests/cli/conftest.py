"""The CLI tests' API server: the emulator, a kubeconfig for it, and the controller's namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NAMESPACES
from sim.kubeapi import KubeAPIServer

NS = "gpuremediate-system"


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[KubeClient, str]]:
    """A client of a fresh emulator with the controller's namespace, and the path of its kubeconfig."""
    srv = KubeAPIServer().start()
    kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    client = KubeClient(load_config(kubeconfig))
    client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    try:
        yield client, str(kubeconfig)
    finally:
        client.close()
        srv.stop()
