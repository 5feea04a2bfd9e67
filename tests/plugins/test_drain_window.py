"""The drain-window plugin's reconcile against the API emulator, with a controlled clock."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.plugins.remediation import drain_request_crd, install_crd
from gpuremediate.actions.custom import condition
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NAMESPACES, PDBS, PODS, Resource
from gpuremediate.plugins.drain_window import DrainWindowPlugin, PluginSettings
from gpuremediate.vocab.window import Window
from sim.kubeapi import KubeAPIServer

MONDAY_NOON = 1718020800.0  # 2024-06-10T12:00:00Z
SATURDAY_NOON = MONDAY_NOON + 5 * 86400


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubeAPIServer, KubeClient, Resource]]:
    srv = KubeAPIServer().start()
    client = KubeClient(load_config(srv.write_kubeconfig(str(tmp_path / "kc"))), qps=500, burst=1000)
    for ns in ("work", "plugins"):
        client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    res = install_crd(client, drain_request_crd(), "nvsentinel.nvidia.com/v1alpha1", "DrainRequest")
    yield srv, client, res
    client.close()
    srv.stop()


def pod(client: KubeClient, name: str, node: str, labels: dict[str, str] | None = None) -> None:
    client.create(PODS, {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": name, "namespace": "work", "labels": labels or {"app": name}},
                         "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}, "work")


def request(client: KubeClient, res: Resource, pods: dict[str, list[str]]) -> dict[str, Any]:
    return client.create(res, {"apiVersion": res.api_version, "kind": "DrainRequest",
                               "metadata": {"name": "drain-n1-abc", "namespace": "plugins"},
                               "spec": {"nodeName": "n1", "podsToDrain": pods}}, "plugins")


def pods_left(client: KubeClient) -> set[str]:
    items = client.list(PODS, "work")["items"]
    return {p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")}


def kubelet(client: KubeClient) -> None:
    """What the kubelet does once a pod is told to go: it goes."""
    for p in client.list(PODS, "work")["items"]:
        if p["metadata"].get("deletionTimestamp"):
            with contextlib.suppress(errors.NotFound):
                client.delete(PODS, p["metadata"]["name"], "work", grace_period_seconds=0)


def status_writes(srv: KubeAPIServer) -> int:
    return sum(1 for r in srv.requests if r[1] in ("update", "patch") and r[4] == "status")


def test_outside_the_window_defers_and_touches_no_pod(api: tuple[KubeAPIServer, KubeClient, Resource]) -> None:
    srv, client, res = api
    pod(client, "a", "n1")
    request(client, res, {"work": ["a"]})
    window = Window.parse("Mon-Fri", "22:00-06:00", "UTC")
    capped = DrainWindowPlugin(client, window, clock=Clock(MONDAY_NOON))
    assert capped.reconcile("plugins/drain-n1-abc") == 3600.0  # looked at again at least hourly
    plugin = DrainWindowPlugin(client, window, PluginSettings(max_defer_s=86400), clock=Clock(MONDAY_NOON))
    before = len(srv.requests)
    wait = plugin.reconcile("plugins/drain-n1-abc")
    assert wait == 10 * 3600 + 0.5  # opens Monday 22:00
    touched = [r for r in srv.requests[before:] if r[3] == "pods"]
    assert touched == [], touched
    obj = client.get(res, "drain-n1-abc", "plugins")
    deferred = condition(obj, "DrainDeferred")
    assert deferred is not None and deferred["status"] == "True" and deferred["reason"] == "OutsideDrainWindow"
    assert "2024-06-10T22:00:00Z" in deferred["message"]
    assert deferred["observedGeneration"] == obj["metadata"]["generation"]
    assert condition(obj, "DrainComplete") is None
    writes = status_writes(srv)
    plugin.reconcile("plugins/drain-n1-abc")
    assert status_writes(srv) == writes, "an unchanged status is not written again"


def test_inside_the_window_evicts_exactly_the_listed_pods_honouring_pdbs(
        api: tuple[KubeAPIServer, KubeClient, Resource]) -> None:
    srv, client, res = api
    pod(client, "a", "n1", {"app": "guarded"})
    pod(client, "b", "n1")
    pod(client, "not-listed", "n1")
    pod(client, "elsewhere", "n2")  # listed, but a pod of that name on another node is not ours
    client.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                         "metadata": {"name": "guard", "namespace": "work"},
                         "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}, "work")
    request(client, res, {"work": ["a", "b", "elsewhere", "gone-already"]})
    clock = Clock(SATURDAY_NOON)
    plugin = DrainWindowPlugin(client, Window.parse("Sat,Sun", "00:00-24:00", "UTC"),
                               PluginSettings(retry_s=0.2), clock=clock)
    deadline = time.monotonic() + 5
    while "b" in pods_left(client) and time.monotonic() < deadline:
        assert plugin.reconcile("plugins/drain-n1-abc") == 0.2
        time.sleep(0.05)
    obj = client.get(res, "drain-n1-abc", "plugins")
    assert condition(obj, "DrainComplete") is None, "not complete while a listed pod is present"
    progress = condition(obj, "DrainDeferred")
    assert progress is not None and progress["status"] == "False" and progress["reason"] == "EvictionBlocked"
    assert "PodDisruptionBudget guard" in progress["message"]
    assert pods_left(client) == {"a", "not-listed", "elsewhere"}

    client.delete(PDBS, "guard", "work")  # the budget is lifted
    deadline = time.monotonic() + 5
    result: float | None = 0.0
    while result is not None and time.monotonic() < deadline:
        result = plugin.reconcile("plugins/drain-n1-abc")
        kubelet(client)
        time.sleep(0.05)
    assert result is None, client.get(res, "drain-n1-abc", "plugins")["status"]
    obj = client.get(res, "drain-n1-abc", "plugins")
    done = condition(obj, "DrainComplete")
    assert done is not None and done["status"] == "True" and "drained 4 pod(s) from n1" in done["message"]
    assert pods_left(client) == {"not-listed", "elsewhere"}
    before = len(srv.requests)
    assert plugin.reconcile("plugins/drain-n1-abc") is None
    assert [r for r in srv.requests[before:] if r[1] != "get"] == [], "a complete request is a no-op"


def test_a_deleted_request_is_forgotten(api: tuple[KubeAPIServer, KubeClient, Resource]) -> None:
    _, client, _ = api
    plugin = DrainWindowPlugin(client, Window.parse("Mon", "00:00-24:00", "UTC"), clock=Clock(MONDAY_NOON))
    assert plugin.reconcile("plugins/missing") is None
    with pytest.raises(errors.NotFound):
        DrainWindowPlugin(client, Window.parse("Mon", "00:00-24:00", "UTC"),
                          PluginSettings(kind="NoSuchKind")).reconcile("plugins/x")
