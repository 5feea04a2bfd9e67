"""`kube_target`: the API server the kube client tests run against.

By default a fresh in-process emulator (sim.kubeapi.KubeAPIServer). With GPUREMEDIATE_TEST_KUBECONFIG set,
a real cluster: each test gets its own namespace, deleted afterwards. The test bodies are the same.

The emulator's namespace holds what a real one does: the ``kube-root-ca.crt`` ConfigMap that
kube-controller-manager's root-ca-cert-publisher puts in every namespace (on a real cluster it may appear
a moment after the namespace, so tests select their own objects by the ``TEST_LABEL`` their objects carry).
A test starts once the namespace's ``default`` ServiceAccount exists: until kube-controller-manager's
serviceaccount controller made it, a pod in the namespace is refused (403 Forbidden, the ServiceAccount
admission plugin: ``serviceaccount "default" not found``)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, load_config
from gpuremediate.kube.resources import CONFIGMAPS, NAMESPACES, SERVICEACCOUNTS

REAL_KUBECONFIG = os.environ.get("GPUREMEDIATE_TEST_KUBECONFIG")
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
SERVICE_ACCOUNT_WAIT_S = 30.0


@dataclass
class KubeTarget:
    config: ClusterConfig
    namespace: str
    emulator: Any = None  # sim.kubeapi.KubeAPIServer when not on a real cluster
    clients: list[KubeClient] = field(default_factory=list)

    def client(self, **options: Any) -> KubeClient:
        options = {"qps": 500.0, "burst": 500, "backoff_base": 0.02, "backoff_cap": 0.2, "retry_after_cap": 0.5,
                   **options}
        made = KubeClient(self.config, **options)
        self.clients.append(made)
        return made

    def require_emulator(self, why: str) -> Any:
        if self.emulator is None:
            pytest.skip(f"needs the emulator: {why}")
        return self.emulator


def _emulator_target() -> Iterator[KubeTarget]:
    try:
        from sim.kubeapi import KubeAPIServer
    except ImportError as exc:  # the emulator is built by another part of the project
        pytest.skip(f"sim.kubeapi is not importable: {exc}")
    server = KubeAPIServer(watch_history=20).start()
    config = ClusterConfig(server=server.url, token_source=_Token(server.admin_token))
    target = KubeTarget(config, "kube-test", emulator=server)
    admin = target.client()
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-test"}})
    admin.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": "kube-test"},
                              "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\n(emulated)\n"}}, "kube-test")
    wait_for_default_service_account(admin, "kube-test")
    try:
        yield target
    finally:
        for c in target.clients:
            c.close()
        server.stop()


def _real_target(path: str) -> Iterator[KubeTarget]:
    config = load_config(path)
    namespace = f"gpuremediate-test-{uuid.uuid4().hex[:8]}"
    target = KubeTarget(config, namespace)
    admin = target.client()
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        wait_for_default_service_account(admin, namespace)
        yield target
    finally:
        with contextlib.suppress(errors.NotFound):
            admin.delete(NAMESPACES, namespace)
        for c in target.clients:
            c.close()


def wait_for_default_service_account(client: KubeClient, namespace: str) -> None:
    """The namespace's ``default`` ServiceAccount exists (a controller makes it after the namespace)."""
    deadline = time.monotonic() + SERVICE_ACCOUNT_WAIT_S
    while True:
        try:
            client.get(SERVICEACCOUNTS, "default", namespace)
            return
        except errors.NotFound:
            if time.monotonic() > deadline:
                raise AssertionError(f"no default ServiceAccount in namespace {namespace} after "
                                     f"{SERVICE_ACCOUNT_WAIT_S:g}s: is kube-controller-manager running?") from None
            time.sleep(0.05)


class _Token:
    def __init__(self, value: str) -> None:
        self.value = value

    def token(self) -> str | None:
        return self.value

    def invalidate(self) -> None:
        """Static."""


@pytest.fixture()
def kube_target() -> Iterator[KubeTarget]:
    if REAL_KUBECONFIG:
        yield from _real_target(REAL_KUBECONFIG)
    else:
        yield from _emulator_target()
