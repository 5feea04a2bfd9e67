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

from e2e.harness import (
    CLAIM_ANNOTATION,
    EXCLUDE_LABEL,
    JOB_LABEL,
    RECORD_ANNOTATION,
    STATE_LABEL,
    ApiserverCluster,
    EmulatorCluster,
    make_cluster,
)
from e2e.ledger import LEDGER_ENV
from e2e.proxy import RecordingProxy
from gpuremediate.actions.custom import MANAGED_BY, MANAGED_BY_LABEL
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
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    SERVICEACCOUNTS,
    Resource,
)
from gpuremediate.state.maintenance import FINALIZER as MAINTENANCE_FINALIZER
from sim.cluster import DEPLOY_LABEL, STUCK_FINALIZER, daemonset
from sim.dra_claims import claim_body
from sim.kube_dra_claims import FINALIZER as CLAIM_FINALIZER
from sim.kubeapi import KubeAPIServer
from sim.nodesim_dra import DRIVER

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
    first = ApiserverCluster(tmp_path / "one", kubeconfig, ledger=tmp_path / "ledger")
    (tmp_path / "one").mkdir()
    first.start()
    node = first.nodes[0]
    _leftovers(first.kube, node)
    first.stop()

    second = ApiserverCluster(tmp_path / "two", kubeconfig, ledger=tmp_path / "ledger")
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
    first = ApiserverCluster(tmp_path / "one", kubeconfig, ledger=tmp_path / "ledger").start()
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
    second = ApiserverCluster(tmp_path / "two", kubeconfig, ledger=tmp_path / "ledger").start()
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
    cluster = ApiserverCluster(tmp_path, kubeconfig, ledger=tmp_path / "ledger").start()
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


def test_two_scenarios_in_a_row_pass_on_it(server: tuple[KubeAPIServer, str], tmp_path: Path) -> None:
    _, kubeconfig = server
    env = {**os.environ, "GPUREMEDIATE_E2E_TARGET": "apiserver", "KUBECONFIG": kubeconfig,
           "PYTHONDONTWRITEBYTECODE": "1", LEDGER_ENV: str(tmp_path / "ledger")}
    scenarios = "test_xid79_reboot_validate_healthy or test_validation_failure_quarantined"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "e2e/test_pipeline.py",
                           "-k", scenarios], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-2000:]


# ---- issue 43: the world a scenario made, of every kind, is gone before the next starts -------------------------

MRS = Resource("gpuremediate.io", "v1alpha1", "maintenancerequests", "MaintenanceRequest", False)
RULES = Resource("resource.k8s.io", "v1beta2", "devicetaintrules", "DeviceTaintRule", False)


def _scenario_world(c: ApiserverCluster, controller: KubeClient) -> None:
    """What a scenario makes through the harness (``c.kube``: noted in the ledger) and what its controller makes
    through its own client (not noted: swept by its labels), one of each kind, in more than one namespace."""
    node = c.nodes[0]
    kube = c.kube
    c.workload("w", node)
    c.pdb("w", {"app": "w"})
    c.dra_workload("held", node, 3)  # a claim with the scheduler's finalizer, reserved for a running pod
    kube.create(MRS, {"apiVersion": MRS.api_version, "kind": MRS.kind,
                      "metadata": {"name": "mr-left", "finalizers": [MAINTENANCE_FINALIZER]},
                      "spec": {"healthEvent": {"nodeName": node, "recommendedAction": "NONE"}}})
    kube.create(EVENTS, {"metadata": {"name": "w.scenario", "namespace": "workloads"},
                         "involvedObject": {"kind": "Pod", "name": "w", "namespace": "workloads"},
                         "reason": "Scenario", "message": "m", "type": "Normal"}, "workloads")
    kube.create(SECRETS, {"metadata": {"name": "gpuremediate-notifications", "namespace": "gpuremediate-system"},
                          "data": {"url": "aHR0cDovL3g="}}, "gpuremediate-system")
    # The controller's, through a client the ledger does not see:
    job = controller.create(JOBS, {"metadata": {"name": "gpur-validate-x", "namespace": "gpuremediate-jobs",
                                                "labels": {JOB_LABEL: "validate"}},
                                   "spec": {"template": {"metadata": {"labels": {JOB_LABEL: "validate"}}, "spec": {
                                       "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}},
                            "gpuremediate-jobs")
    controller.create(PODS, {"metadata": {"name": "gpur-validate-x-abcde", "namespace": "gpuremediate-jobs",
                                          "labels": {JOB_LABEL: "validate"}},
                             "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}},
                      "gpuremediate-jobs")
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "gpur-validate-x", "uid": job["metadata"]["uid"]}
    claim = claim_body("gpur-validate-x", "gpuremediate-jobs")
    claim["metadata"] |= {"labels": {MANAGED_BY_LABEL: MANAGED_BY}, "ownerReferences": [owner],
                          "finalizers": [CLAIM_FINALIZER]}
    controller.create(RESOURCE_CLAIMS, claim, "gpuremediate-jobs")
    controller.create(RULES, {"apiVersion": RULES.api_version, "kind": RULES.kind,
                              "metadata": {"name": "gpuremediate-x", "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
                              "spec": {"deviceSelector": {"driver": DRIVER, "pool": node, "device": "gpu-3"},
                                       "taint": {"key": "gpuremediate.io/unhealthy", "effect": "NoExecute"}}})
    for namespace, kind, name in (("workloads", "Pod", "w"), ("default", "Node", node)):
        controller.create(EVENTS, {"metadata": {"name": f"{name}.gpuremediate", "namespace": namespace},
                                   "involvedObject": {"kind": kind, "name": name, "namespace": namespace},
                                   "reason": "GPUFault", "message": "m", "type": "Warning",
                                   "source": {"component": "gpuremediate"}}, namespace)
    for lease in ("gpuremediate", "gpuremediate-shard-1"):
        controller.create(LEASES, {"metadata": {"name": lease, "namespace": "gpuremediate-system"},
                                   "spec": {"holderIdentity": "killed", "leaseDurationSeconds": 15}},
                          "gpuremediate-system")
    for configmap in ("gpuremediate-breaker", "gpuremediate-dry-run"):
        controller.create(CONFIGMAPS, {"metadata": {"name": configmap, "namespace": "gpuremediate-system"},
                                       "data": {"state": "open"}}, "gpuremediate-system")


def _world_left(kube: KubeClient, trays: list[str]) -> list[str]:
    """Whatever of ``_scenario_world`` (and the trays) is still on the server."""
    left = [f"node {n}" for n in trays if kube.list(NODES, field_selector=f"metadata.name={n}")["items"]]
    left += [f"lease {n}" for n in trays if kube.list(LEASES, "kube-node-lease",
                                                      field_selector=f"metadata.name={n}")["items"]]
    for res, namespace in ((PODS, "workloads"), (PDBS, "workloads"), (RESOURCE_CLAIMS, "workloads"),
                           (JOBS, "gpuremediate-jobs"), (PODS, "gpuremediate-jobs"),
                           (RESOURCE_CLAIMS, "gpuremediate-jobs"), (LEASES, "gpuremediate-system"),
                           (MRS, None), (RULES, None)):
        left += [f"{res.kind} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
                 for o in kube.list(res, namespace)["items"]]
    # The scenario's Events and the controller's (the cluster's own, RegisteredNode..., are not the scenario's)
    left += [f"Event {e['metadata']['namespace']}/{e['metadata']['name']}" for e in kube.list(EVENTS)["items"]
             if e.get("reason") == "Scenario" or (e.get("source") or {}).get("component") == "gpuremediate"]
    for res, namespace, name in ((CONFIGMAPS, "gpuremediate-system", "gpuremediate-breaker"),
                                 (CONFIGMAPS, "gpuremediate-system", "gpuremediate-dry-run"),
                                 (SECRETS, "gpuremediate-system", "gpuremediate-notifications")):
        left += [f"{res.kind} {name}" for o in kube.list(res, namespace)["items"] if o["metadata"]["name"] == name]
    left += [f"ResourceSlice of {s['spec']['nodeName']}" for s in kube.list(RESOURCE_SLICES)["items"]]
    left += [f"pod {p['metadata']['namespace']}/{p['metadata']['name']} on {p['spec']['nodeName']}"
             for p in kube.list(PODS, "gpu-operator")["items"] if p["spec"].get("nodeName") in trays]
    return left


def test_what_a_scenario_made_of_each_kind_is_gone_when_it_ends_and_at_the_next_start(
        server: tuple[KubeAPIServer, str], tmp_path: Path) -> None:
    """An NVL72 scenario's tray nodes (names no pattern knows), its DRA workload's claim (with the scheduler's
    finalizer), a PDB, a MaintenanceRequest with a finalizer, Events in workloads and default, a Secret, and what
    its controller made (a Job and its pod, a claim, a DeviceTaintRule, Leases, the breaker): gone once the
    scenario ends; the next scenario (the default four nodes) starts with its nodes registered and none of it."""
    _, kubeconfig = server
    controller = KubeClient(load_config(kubeconfig))
    (tmp_path / "one").mkdir()
    first = ApiserverCluster(tmp_path / "one", kubeconfig, ledger=tmp_path / "ledger", nodes=1, nvl72=(3,),
                             dra=True).start()
    trays = [n for n in first.nodes if n.startswith("rack-")]
    assert trays == ["rack-1-tray-1", "rack-1-tray-2", "rack-1-tray-3"]
    try:
        _scenario_world(first, controller)
        assert len(_world_left(controller, trays)) >= 20, _world_left(controller, trays)
    finally:
        first.stop()
    assert first.leftovers == []
    assert _world_left(controller, trays) == [], "gone when the scenario ended"

    (tmp_path / "two").mkdir()
    second = ApiserverCluster(tmp_path / "two", kubeconfig, ledger=tmp_path / "ledger").start()
    try:
        assert _world_left(second.kube, trays) == []
        names = sorted(n["metadata"]["name"] for n in second.kube.list(NODES)["items"])
        assert names == second.nodes == ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"]
    finally:
        second.stop()
        controller.close()


def test_a_run_killed_mid_scenario_is_cleaned_at_the_next_start_from_its_ledger(
        server: tuple[KubeAPIServer, str], tmp_path: Path) -> None:
    """A run killed before its scenario's teardown: what it made is in the ledger's file, and the next start
    (another process: a new ApiserverCluster reading that file) removes it."""
    _, kubeconfig = server
    controller = KubeClient(load_config(kubeconfig))
    (tmp_path / "one").mkdir()
    killed = ApiserverCluster(tmp_path / "one", kubeconfig, ledger=tmp_path / "ledger", nodes=1, nvl72=(2,),
                              dra=True).start()
    trays = [n for n in killed.nodes if n.startswith("rack-")]
    _scenario_world(killed, controller)
    EmulatorCluster.stop(killed)  # its threads end; nothing of ApiserverCluster.stop's cleaning runs
    assert killed.proxy is not None
    killed.proxy.stop()
    assert len(_world_left(controller, trays)) >= 20

    (tmp_path / "two").mkdir()
    second = ApiserverCluster(tmp_path / "two", kubeconfig, ledger=tmp_path / "ledger").start()
    try:
        assert _world_left(second.kube, trays) == []
    finally:
        second.stop()
        controller.close()
