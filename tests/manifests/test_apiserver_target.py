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
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CONFIGMAPS, EVENTS, JOBS, LEASES, NODES, PDBS, PODS, SERVICEACCOUNTS
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
        assert kube.get(SERVICEACCOUNTS, "gpuremediate-job", "gpuremediate-jobs")
        exporters = kube.list(PODS, "gpu-operator", label_selector="app=nvidia-dcgm-exporter")["items"]
        assert sorted(p["spec"]["nodeName"] for p in exporters) == second.nodes, "one exporter per node, kept"
        assert {p["status"]["podIP"] for p in exporters} == {second.sim.gpusim.node(n).ip for n in second.nodes}
    finally:
        second.stop()


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
