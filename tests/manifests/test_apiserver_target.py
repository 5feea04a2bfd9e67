"""e2e.harness.ApiserverCluster (GPUREMEDIATE_E2E_TARGET=apiserver) against an emulator started on its own
with a kubeconfig, as a bare control plane would be: the harness installs what the cluster needs, cleans
what a scenario left on a server that outlives it, and runs scenarios there (two in a row, one subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness import CLAIM_ANNOTATION, EXCLUDE_LABEL, RECORD_ANNOTATION, STATE_LABEL, ApiserverCluster, make_cluster
from e2e.proxy import RecordingProxy
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import (
    CONFIGMAPS,
    DAEMONSETS,
    EVENTS,
    JOBS,
    LEASES,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    SECRETS,
    SERVICEACCOUNTS,
)
from sim.cluster import DEPLOY_LABEL, STUCK_FINALIZER, daemonset
from sim.kubeapi import KubeAPIServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[KubeAPIServer, str]]:
    srv = KubeAPIServer().start()
    yield srv, srv.write_kubeconfig(tmp_path / "kubeconfig")
    srv.stop()


def _leftovers(kube: KubeClient, node: str) -> None:
    """What a scenario leaves behind when it ends (a cordoned node with its record, a stuck Job pod...)."""
    kube.patch(NODES, node, {"metadata": {"annotations": {RECORD_ANNOTATION: "{}", CLAIM_ANNOTATION: "mr/1"},
                                          "labels": {STATE_LABEL: "draining", EXCLUDE_LABEL: "true"}},
                             "spec": {"unschedulable": True}})
    kube.create(PODS, {"metadata": {"name": "left", "namespace": "workloads"},
                       "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}, "workloads")
    kube.create(PDBS, {"metadata": {"name": "left", "namespace": "workloads"},
                       "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "left"}}}}, "workloads")
    kube.create(JOBS, {"metadata": {"name": "left", "namespace": "gpuremediate-jobs"}, "spec": {"template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}, "gpuremediate-jobs")
    kube.create(CONFIGMAPS, {"metadata": {"name": "gpuremediate-breaker", "namespace": "gpuremediate-system"},
                             "data": {"state": "open"}}, "gpuremediate-system")
    kube.create(LEASES, {"metadata": {"name": "gpuremediate", "namespace": "gpuremediate-system"},
                         "spec": {"holderIdentity": "a-killed-controller", "leaseDurationSeconds": 15}},
                "gpuremediate-system")
    kube.create(LEASES, {"metadata": {"name": "gpuremediate-shard-2", "namespace": "gpuremediate-system"},
                         "spec": {"leaseDurationSeconds": 3}}, "gpuremediate-system")  # a --shards 3 replica's
    kube.create(CONFIGMAPS, {"metadata": {"name": "gpuremediate-budget", "namespace": "gpuremediate-system"},
                             "data": {"admitted": "{}"}}, "gpuremediate-system")
    kube.create(SECRETS, {"metadata": {"name": "gpuremediate-notifications", "namespace": "gpuremediate-system"},
                          "data": {"url": "aHR0cDovL3g="}}, "gpuremediate-system")


def test_a_second_start_on_the_same_server_begins_clean(server: tuple[KubeAPIServer, str], tmp_path: Path) -> None:
    _, kubeconfig = server
    first = ApiserverCluster(tmp_path / "one", kubeconfig)
    (tmp_path / "one").mkdir()
    first.start()
    node = first.nodes[0]
    _leftovers(first.kube, node)
    first.stop()

    second = ApiserverCluster(tmp_path / "two", kubeconfig)
    (tmp_path / "two").mkdir()
    second.start()
    try:
        kube = second.kube
        meta = kube.get(NODES, node)["metadata"]
        assert RECORD_ANNOTATION not in (meta.get("annotations") or {})
        assert CLAIM_ANNOTATION not in (meta.get("annotations") or {})
        assert STATE_LABEL not in meta["labels"] and EXCLUDE_LABEL not in meta["labels"]
        assert not second.unschedulable(node)
        assert kube.list(PODS, "workloads")["items"] == []
        assert kube.list(PDBS, "workloads")["items"] == [] and kube.list(JOBS, "gpuremediate-jobs")["items"] == []
        with pytest.raises(errors.NotFound):
            kube.get(CONFIGMAPS, "gpuremediate-breaker", "gpuremediate-system")
        with pytest.raises(errors.NotFound):
            kube.get(LEASES, "gpuremediate", "gpuremediate-system")
        assert kube.list(LEASES, "gpuremediate-system")["items"] == []
        with pytest.raises(errors.NotFound):
            kube.get(CONFIGMAPS, "gpuremediate-budget", "gpuremediate-system")
        with pytest.raises(errors.NotFound):
            kube.get(SECRETS, "gpuremediate-notifications", "gpuremediate-system")
        assert kube.get(SERVICEACCOUNTS, "gpuremediate-job", "gpuremediate-jobs")
        exporters = kube.list(PODS, "gpu-operator", label_selector="app=nvidia-dcgm-exporter")["items"]
        assert sorted(p["spec"]["nodeName"] for p in exporters) == second.nodes, "one exporter per node, kept"
        assert {p["status"]["podIP"] for p in exporters} == {second.sim.gpusim.node(n).ip for n in second.nodes}
    finally:
        second.stop()


def test_a_second_start_resets_what_simulated_hardware_left(server: tuple[KubeAPIServer, str],
                                                            tmp_path: Path) -> None:
    """A GPU Operator cluster's DaemonSets, a stuck operand pod, deploy and MIG labels, MIG slices, a taint
    and a node a scenario added: none outlives the scenario on a shared server."""
    _, kubeconfig = server
    (tmp_path / "one").mkdir()
    first = ApiserverCluster(tmp_path / "one", kubeconfig).start()
    node = first.nodes[0]
    kube = first.kube
    first.add_node("gpu-node-99")
    kube.patch(NODES, node, {"metadata": {"labels": {DEPLOY_LABEL + "dcgm": "false", "nvidia.com/mig.config": "x"}},
                             "spec": {"taints": [{"key": "gpuremediate.io/unhealthy", "effect": "NoSchedule"}]}})
    kube.patch(NODES, node, {"status": {"capacity": {"nvidia.com/mig-1g.10gb": "7"},
                                        "allocatable": {"nvidia.com/mig-1g.10gb": "7"}}}, subresource="status")
    uid = kube.create(DAEMONSETS, daemonset("nvidia-dcgm", "gpu-operator", {"app": "nvidia-dcgm"}),
                      "gpu-operator")["metadata"]["uid"]
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-dcgm", "uid": uid, "controller": True}
    kube.create(PODS, {"metadata": {"name": "nvidia-dcgm-x", "namespace": "gpu-operator",
                                    "labels": {"app": "nvidia-dcgm"}, "finalizers": [STUCK_FINALIZER],
                                    "ownerReferences": [owner]},
                       "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}, "gpu-operator")
    first.stop()
    with pytest.raises(errors.NotFound):  # the added node goes with its scenario
        KubeClient(load_config(kubeconfig)).get(NODES, "gpu-node-99")

    (tmp_path / "two").mkdir()
    second = ApiserverCluster(tmp_path / "two", kubeconfig).start()
    try:
        got = second.kube.get(NODES, node)
        assert not [k for k in got["metadata"]["labels"] if k.startswith(DEPLOY_LABEL) or "mig" in k]
        assert not [k for k in got["status"]["capacity"] if "mig" in k]
        assert not got["spec"].get("taints")
        with pytest.raises(errors.NotFound):
            second.kube.get(DAEMONSETS, "nvidia-dcgm", "gpu-operator")
        assert [p["metadata"]["name"] for p in second.kube.list(PODS, "gpu-operator")["items"]
                if p["metadata"]["name"].startswith("nvidia-dcgm-x")] == []
    finally:
        second.stop()


def test_the_recording_proxy_records_the_requests_as_the_emulator_audits_them(
        server: tuple[KubeAPIServer, str], tmp_path: Path) -> None:
    """The apiserver target's audit of the controller's requests: what passed through the proxy, parsed as
    kube-apiserver's RequestInfo parses a path, is what the emulator's own audit says of the same requests
    (a watch streamed through included)."""
    srv, kubeconfig = server
    proxy = RecordingProxy(load_config(kubeconfig)).start()
    client = KubeClient(load_config(str(proxy.write_kubeconfig(tmp_path / "proxy.kubeconfig"))))
    try:
        mark = len(srv.requests)
        client.create(NAMESPACES, {"metadata": {"name": "audited"}})
        client.create(CONFIGMAPS, {"metadata": {"name": "c", "namespace": "audited"}, "data": {"a": "1"}}, "audited")
        client.patch(CONFIGMAPS, "c", {"data": {"a": "2"}}, "audited")
        listed = client.list(CONFIGMAPS, "audited", field_selector="metadata.name=c")
        stream = client.watch(CONFIGMAPS, "audited", resource_version=listed["metadata"]["resourceVersion"],
                              timeout_seconds=5)
        client.patch(CONFIGMAPS, "c", {"data": {"a": "3"}}, "audited")
        event = next(iter(stream))
        assert event.type == "MODIFIED" and event.object["data"] == {"a": "3"}
        stream.close()
        client.create(PODS, {"metadata": {"name": "p", "namespace": "audited"},
                             "spec": {"containers": [{"name": "c", "image": "x"}]}}, "audited")
        client.evict("p", "audited", dry_run=True)
        client.create(NODES, {"metadata": {"name": "n"}})
        client.patch(NODES, "n", {"status": {"capacity": {"cpu": "1"}}}, subresource="status")
        client.delete(NODES, "n")
        client.delete(CONFIGMAPS, "c", "audited")
        emulator = [r[1:] for r in srv.requests[mark:]]
        assert [r[1:] for r in proxy.requests] == emulator
        assert ("create", "", "pods", "eviction", "audited", "p") in emulator
    finally:
        client.close()
        proxy.stop()


def test_only_the_controllers_events_are_read(server: tuple[KubeAPIServer, str], tmp_path: Path) -> None:
    _, kubeconfig = server
    cluster = ApiserverCluster(tmp_path, kubeconfig).start()
    try:
        node = cluster.nodes[0]
        for reason, component in (("RegisteredNode", "node-controller"), ("GPUNodeDraining", "gpuremediate")):
            cluster.kube.create(EVENTS, {
                "metadata": {"name": f"{node}.{reason.lower()}", "namespace": "default"},
                "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"}, "reason": reason,
                "message": "m", "type": "Normal", "source": {"component": component}}, "default")
        assert cluster.event_reasons(node) == ["GPUNodeDraining"]
    finally:
        cluster.stop()


def test_the_target_needs_a_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUREMEDIATE_E2E_TARGET", "apiserver")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(AssertionError, match="needs KUBECONFIG"):
        make_cluster(tmp_path)


def test_two_scenarios_in_a_row_pass_on_it(server: tuple[KubeAPIServer, str]) -> None:
    _, kubeconfig = server
    env = {**os.environ, "GPUREMEDIATE_E2E_TARGET": "apiserver", "KUBECONFIG": kubeconfig,
           "PYTHONDONTWRITEBYTECODE": "1"}
    scenarios = "test_xid79_reboot_validate_healthy or test_validation_failure_quarantined"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "e2e/test_pipeline.py",
                           "-k", scenarios], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-2000:]
