"""The emulator's RBAC with namespaced Roles: a Role's rules allow requests inside its namespace only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import CONFIGMAPS, NODES
from sim.kubeapi import KubeAPIServer

CM_RULES = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "list"]}]


@pytest.fixture
def server() -> Iterator[KubeAPIServer]:
    srv = KubeAPIServer().start()
    yield srv
    srv.stop()


def _client(srv: KubeAPIServer, tmp: Path, token: str | None) -> KubeClient:
    return KubeClient(load_config(srv.write_kubeconfig(tmp / f"kc-{token}", token)))


def test_role_rules_apply_only_in_their_namespace(server: KubeAPIServer, tmp_path: Path) -> None:
    server.add_token("tok", "alice")
    server.enforce_rbac("alice", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
                        namespaced={"kube-public": CM_RULES})
    alice = _client(server, tmp_path, "tok")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}
    alice.create(CONFIGMAPS, body, "kube-public")
    assert alice.get(CONFIGMAPS, "c", "kube-public")["metadata"]["name"] == "c"
    with pytest.raises(errors.Forbidden):
        alice.get(CONFIGMAPS, "c", "default")
    with pytest.raises(errors.Forbidden):
        alice.create(CONFIGMAPS, body, "default")
    with pytest.raises(errors.Forbidden):  # all namespaces: a Role never grants that
        alice.list(CONFIGMAPS)
    assert alice.list(NODES)["items"] == []


def test_enforcing_again_replaces_the_namespaced_rules(server: KubeAPIServer, tmp_path: Path) -> None:
    server.add_token("tok", "bob")
    server.enforce_rbac("bob", [], namespaced={"kube-public": CM_RULES})
    bob = _client(server, tmp_path, "tok")
    assert bob.list(CONFIGMAPS, "kube-public")["items"] == []
    server.enforce_rbac("bob", [])
    with pytest.raises(errors.Forbidden):
        bob.list(CONFIGMAPS, "kube-public")
