"""nodesim through the real KubeClient against the emulator: pods run, Job pods end, deletions finish."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.errors import NotFound
from gpuremediate.kube.resources import JOBS, LEASES, NAMESPACES, NODES, PODS
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim
from sim.waiting import wait_for


def wait(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    return wait_for(predicate, timeout, "the node simulator to reach the state")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[KubeAPIServer, KubeClient, NodeSim]]:
    srv = KubeAPIServer().start()
    client = KubeClient(load_config(srv.write_kubeconfig(tmp_path / "kubeconfig")))
    client.create(NAMESPACES, {"metadata": {"name": "work"}})
    sim = NodeSim(client, grace_cap_s=0.3, tick_s=0.05)
    yield srv, client, sim
    sim.stop()
    client.close()
    srv.stop()


def _pod(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}


def test_add_node_registers_a_ready_gpu_node(env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    _, client, sim = env
    sim.add_node("gpu-1", gpus=4)
    node = client.get(NODES, "gpu-1")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-1"
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True" and node["status"]["nodeInfo"]["bootID"]


def test_bound_pod_runs_and_unknown_node_stays_pending(env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    _, client, sim = env
    sim.add_node("gpu-1")
    sim.set_pod_ip("work", "exporter-", "127.0.0.11")
    client.create(PODS, _pod("exporter-abc", "gpu-1"), "work")
    client.create(PODS, _pod("lost", "no-such-node"), "work")
    sim.start()
    pod = wait(lambda: (p := client.get(PODS, "exporter-abc", "work"))["status"]["phase"] == "Running" and p)
    assert pod["status"]["podIP"] == "127.0.0.11"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"])
    assert client.get(PODS, "lost", "work")["status"]["phase"] == "Pending"


def test_graceful_delete_finishes_after_the_capped_grace(env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    _, client, sim = env
    sim.add_node("gpu-1")
    client.create(PODS, _pod("p", "gpu-1"), "work")
    sim.start()
    wait(lambda: client.get(PODS, "p", "work")["status"]["phase"] == "Running")
    deleted = client.delete(PODS, "p", "work")
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 30
    start = time.monotonic()

    def gone() -> bool:
        try:
            client.get(PODS, "p", "work")
        except NotFound:
            return True
        return False
    wait(gone)
    assert time.monotonic() - start >= 0.25


@pytest.mark.parametrize(("succeed", "condition"), [(True, "Complete"), (False, "Failed")])
def test_job_runs_to_its_outcome(env: tuple[KubeAPIServer, KubeClient, NodeSim], succeed: bool,
                                 condition: str) -> None:
    _, client, sim = env
    sim.add_node("gpu-1")
    sim.set_job_outcome("gpu-1", succeed=succeed, duration_s=0.2)
    job = {"metadata": {"name": "validate"}, "spec": {"backoffLimit": 0, "template": {"spec": {
        "nodeName": "gpu-1", "restartPolicy": "Never", "containers": [{"name": "dcgm", "image": "dcgm"}]}}}}
    client.create(JOBS, job, "work")
    sim.start()

    def finished() -> dict[str, Any] | None:
        status = client.get(JOBS, "validate", "work").get("status", {})
        done = [c for c in status.get("conditions", []) if c["type"] == condition and c["status"] == "True"]
        return status if done else None
    status = wait(finished)
    assert status.get("succeeded" if succeed else "failed") == 1
    pods = client.list(PODS, "work", label_selector="job-name=validate")["items"]
    assert pods and all("finalizers" not in p["metadata"] for p in pods)


def test_reboot_takes_the_node_down_and_brings_a_new_boot_id(
        env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    _, client, sim = env
    sim.add_node("gpu-1")
    before = client.get(NODES, "gpu-1")["status"]["nodeInfo"]["bootID"]
    sim.start()
    sim.reboot("gpu-1", down_s=0.3)

    def ready() -> str:
        node = client.get(NODES, "gpu-1")
        cond = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        return node["status"]["nodeInfo"]["bootID"] if cond["status"] == "True" else ""
    assert next(c for c in client.get(NODES, "gpu-1")["status"]["conditions"]
                if c["type"] == "Ready")["status"] == "False"
    assert wait(ready) != before


def test_pod_ips_go_to_their_own_node_with_ten_nodes_or_more(
        env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    """gpu-node-1's exporter name is a prefix of gpu-node-10's: each exporter still gets its own node's IP."""
    _, client, sim = env
    nodes = [f"gpu-node-{i}" for i in range(1, 13)]
    for i, node in enumerate(nodes, start=1):
        sim.add_node(node, gpus=1)
        sim.set_pod_ip("work", f"exporter-{node}", f"127.0.1.{i}")
        client.create(PODS, _pod(f"exporter-{node}", node), "work")
    sim.start()

    def ips() -> dict[str, str] | None:
        pods = client.list(PODS, "work")["items"]
        got = {p["spec"]["nodeName"]: (p.get("status") or {}).get("podIP") for p in pods}
        return got if all(got.values()) else None
    assert wait(ips) == {node: f"127.0.1.{i}" for i, node in enumerate(nodes, start=1)}


def test_a_pod_ip_bound_to_a_node_is_not_given_to_a_pod_elsewhere(
        env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    _, client, sim = env
    sim.add_node("gpu-1")
    sim.add_node("gpu-2")
    sim.set_pod_ip("work", "exporter-", "127.0.0.11", node="gpu-1")
    client.create(PODS, _pod("exporter-a", "gpu-1"), "work")
    client.create(PODS, _pod("exporter-b", "gpu-2"), "work")
    sim.start()
    ip = wait(lambda: client.get(PODS, "exporter-b", "work")["status"].get("podIP"))
    assert ip != "127.0.0.11" and ip.startswith("10.244.")
    assert wait(lambda: client.get(PODS, "exporter-a", "work")["status"].get("podIP")) == "127.0.0.11"


def _lease(client: KubeClient, node: str) -> dict[str, Any]:
    return client.get(LEASES, node, "kube-node-lease")


def test_node_lease_is_created_the_kubelet_way_and_renewed(
        env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    _, client, _ = env
    sim = NodeSim(client, tick_s=0.05, lease_renew_s=0.1)
    try:
        sim.add_node("gpu-1")
        lease = _lease(client, "gpu-1")
        node = client.get(NODES, "gpu-1")
        assert lease["spec"]["holderIdentity"] == "gpu-1"
        assert lease["spec"]["leaseDurationSeconds"] == 40
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", lease["spec"]["renewTime"])
        assert lease["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": node["metadata"]["uid"]}]
        sim.start()
        first = lease["spec"]["renewTime"]
        wait(lambda: _lease(client, "gpu-1")["spec"]["renewTime"] > first)
    finally:
        sim.stop()


def test_a_rebooting_node_stops_renewing_its_lease_and_resumes_after(
        env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    _, client, _ = env
    sim = NodeSim(client, lease_renew_s=0.0)  # due at every tick; ticked by hand, no loop thread
    sim.add_node("gpu-1")
    sim.tick()
    up = _lease(client, "gpu-1")["spec"]["renewTime"]
    sim.reboot("gpu-1", down_s=60)
    for _ in range(3):
        sim.tick()
    assert _lease(client, "gpu-1")["spec"]["renewTime"] == up, "renewed while the node was down"
    sim.nodes["gpu-1"].down_until = time.monotonic()  # the reboot is over
    wait(lambda: sim.tick() or _lease(client, "gpu-1")["spec"]["renewTime"] > up)


def test_status_heartbeats_advance_without_a_transition(env: tuple[KubeAPIServer, KubeClient, NodeSim]) -> None:
    _, client, _ = env
    sim = NodeSim(client, tick_s=0.05, heartbeat_s=0.1)
    try:
        sim.add_node("gpu-1")

        def ready() -> dict[str, Any]:
            return next(c for c in client.get(NODES, "gpu-1")["status"]["conditions"] if c["type"] == "Ready")
        before = ready()
        sim.start()
        after = wait(lambda: (c := ready())["lastHeartbeatTime"] > before["lastHeartbeatTime"] and c, timeout=10)
        assert after["lastTransitionTime"] == before["lastTransitionTime"] and after["status"] == "True"
    finally:
        sim.stop()
