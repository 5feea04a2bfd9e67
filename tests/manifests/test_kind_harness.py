"""e2e.harness.KubeconfigCluster (the target `make e2e-kind` runs the scenarios on) against a stand-in
for the kind cluster (kind_world.py): the emulator, nodesim, gpu-sim and the controllers of the kind
overlay's Deployment and DaemonSet. What it checks: the harness's calls and paths work against an
API server, a scenario starts from a clean world, the controller is driven through its Deployment,
and faults reach gpu-sim through the pod proxy with the bodies gpu-sim accepts."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kind_world import EXPORTER_NS, JOBS_NS, SYSTEM_NS, KindWorld, live, ready

from e2e.harness import KubeconfigCluster
from e2e.plugins.remediation import API_VERSION, KIND, drain_request_crd, install_crd, remediation_crd
from gpuremediate.kube import errors, miniyaml
from gpuremediate.kube.resources import CONFIGMAPS, CRDS, DEPLOYMENTS, EVENTS, JOBS, NODES, PDBS, PODS, Resource
from gpuremediate.policy.config import PolicyError, loads_policy
from gpuremediate.state.maintenance import CLAIM_ANNOTATION, FINALIZER
from sim.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
MRS = Resource("gpuremediate.io", "v1alpha1", "maintenancerequests", "MaintenanceRequest", False)
DRAINS = Resource("nvsentinel.nvidia.com", "v1alpha1", "drainrequests", "DrainRequest", True)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindWorld]:
    w = KindWorld(tmp_path_factory.mktemp("kind"))
    crd = miniyaml.loads((ROOT / "manifests/crds/gpuremediate.io_maintenancerequests.yaml").read_text())
    w.client.create(CRDS, crd)
    install_crd(w.client, remediation_crd(), API_VERSION, KIND)
    install_crd(w.client, drain_request_crd(), "nvsentinel.nvidia.com/v1alpha1", "DrainRequest")
    yield w
    w.stop()


@pytest.fixture
def cluster(world: KindWorld) -> Iterator[KubeconfigCluster]:
    c = KubeconfigCluster(world.kubeconfig)
    c.slow = 2.0  # everything here settles within a second; a broken wait fails fast
    yield c.start()
    c.stop()


def pods(world: KindWorld, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
    return live(world.client.list(PODS, namespace, label_selector=selector)["items"])


def controller_pods(world: KindWorld) -> list[dict[str, Any]]:
    return pods(world, SYSTEM_NS, "app.kubernetes.io/name=gpuremediate")


def replicas(world: KindWorld) -> int:
    return int(world.client.get(DEPLOYMENTS, "gpuremediate", SYSTEM_NS)["spec"]["replicas"])


def wait_until(check: Any, what: str, timeout: float = 5.0) -> None:
    wait_for(check, timeout, what)


def node_event(world: KindWorld, node: str, reason: str, component: str) -> None:
    world.client.create(EVENTS, {
        "metadata": {"name": f"{node}.{reason.lower()}.{component}", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
        "reason": reason, "message": reason, "type": "Normal", "source": {"component": component},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1,
    }, "default")


def leave_a_mess(world: KindWorld, node: str) -> None:
    """What a failed scenario may leave behind on a real cluster (nothing starts afresh there)."""
    world.client.patch(NODES, node, {
        "metadata": {"annotations": {"gpuremediate.io/record": "{}", CLAIM_ANNOTATION: "mr-x/uid"},
                     "labels": {"gpuremediate.io/state": "quarantined", "gpuremediate.io/exclude": "true"}},
        "spec": {"unschedulable": True}})
    world.client.create(PODS, {"metadata": {"name": "left", "namespace": "workloads"},
                               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}, "workloads")
    world.client.create(PDBS, {"metadata": {"name": "left", "namespace": "workloads"},
                               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"a": "b"}}}}, "workloads")
    world.client.create(JOBS, {"metadata": {"name": "gpur-validate-left", "namespace": JOBS_NS,
                                            "labels": {"gpuremediate.io/job": "validate"}},
                               "spec": {"template": {"spec": {"nodeName": node, "restartPolicy": "Never",
                                                              "containers": [{"name": "c", "image": "x"}]}}}},
                       JOBS_NS)
    world.client.create(CONFIGMAPS, {"metadata": {"name": "gpuremediate-breaker", "namespace": SYSTEM_NS}},
                        SYSTEM_NS)
    world.client.create(MRS, {"apiVersion": MRS.api_version, "kind": MRS.kind,
                              "metadata": {"name": "mr-frozen", "finalizers": [FINALIZER]},
                              "spec": {"healthEvent": {"nodeName": node, "recommendedAction": "NONE"}}})
    world.client.create(DRAINS, {"apiVersion": DRAINS.api_version, "kind": DRAINS.kind,
                                 "metadata": {"name": "drain-left", "namespace": SYSTEM_NS},
                                 "spec": {"nodeName": node}}, SYSTEM_NS)
    res = world.client.resolve(API_VERSION, KIND)
    world.client.create(res, {"apiVersion": API_VERSION, "kind": KIND,
                              "metadata": {"name": "rr-left", "namespace": SYSTEM_NS}, "spec": {}}, SYSTEM_NS)
    node_event(world, node, "GPUNodeQuarantined", "gpuremediate")
    node_event(world, node, "NodeNotSchedulable", "kubelet")


def test_start_stops_the_deployed_controller_and_leaves_a_clean_world(world: KindWorld) -> None:
    node = world.nodes[2]
    world.client.patch(DEPLOYMENTS, "gpuremediate", {"spec": {"replicas": 2}}, SYSTEM_NS)
    wait_until(lambda: len([p for p in controller_pods(world) if ready(p)]) == 2, "the overlay's two replicas")
    world.gpusim.inject(node, 1, "row-remap-failure")
    leave_a_mess(world, node)
    old_gpusims = {p["metadata"]["uid"] for p in pods(world, EXPORTER_NS)}

    c = KubeconfigCluster(world.kubeconfig)
    c.slow = 2.0
    c.start()
    try:
        assert c.nodes == sorted(world.nodes)
        assert replicas(world) == 0 and world.client.list(PODS, SYSTEM_NS)["items"] == []
        got = world.client.get(NODES, node)
        assert "gpuremediate.io/record" not in (got["metadata"].get("annotations") or {})
        assert CLAIM_ANNOTATION not in (got["metadata"].get("annotations") or {})
        assert not {"gpuremediate.io/state", "gpuremediate.io/exclude"} & set(got["metadata"]["labels"])
        assert not got["spec"].get("unschedulable")
        assert c.state(node) == "healthy"
        assert world.client.list(PODS, "workloads")["items"] == []
        assert world.client.list(PDBS, "workloads")["items"] == []
        assert world.client.list(JOBS, JOBS_NS)["items"] == []
        with pytest.raises(errors.NotFound):
            world.client.get(CONFIGMAPS, "gpuremediate-breaker", SYSTEM_NS)
        assert world.client.list(MRS)["items"] == [], "a request with a finalizer and no controller was left"
        assert world.client.list(DRAINS)["items"] == []
        assert world.client.list(world.client.resolve(API_VERSION, KIND))["items"] == []
        reasons = [e["reason"] for e in world.client.list(EVENTS, "default")["items"]]
        assert "GPUNodeQuarantined" not in reasons and "NodeNotSchedulable" in reasons  # only the controller's go
        fresh = pods(world, EXPORTER_NS)
        assert {p["spec"]["nodeName"] for p in fresh} == set(world.nodes) and all(ready(p) for p in fresh)
        assert not old_gpusims & {p["metadata"]["uid"] for p in fresh}, "gpu-sim pods not replaced"
        assert c.log_problems() == []
        assert "log of gpuremediate-" in c.controller_log(), "the stopped replicas' logs were not kept"
    finally:
        c.stop()


def test_start_controller_writes_a_loadable_policy_and_runs_one_replica(
        world: KindWorld, cluster: KubeconfigCluster) -> None:
    cluster.start_controller({"drain": {"mode": "AllowCompletion"}, "budget": {"max_unavailable": "2"}})
    assert replicas(world) == 1
    (pod,) = controller_pods(world)
    assert ready(pod)
    text = world.client.get(CONFIGMAPS, "gpuremediate-policy", SYSTEM_NS)["data"]["policy.toml"]
    policy = loads_policy(text).defaults
    assert policy.drain.mode == "AllowCompletion" and policy.drain.retry_s == 0.3  # scenario over BASE_POLICY
    assert policy.remediation.reset_gpu.image == "gpu-sim:dev" and not policy.remediation.reset_gpu.privileged
    assert policy.remediation.reset_gpu.command.startswith("python /app/gpusim.py reset --url=http://gpu-sim.")
    assert policy.remediation.reboot_wait_for_boot_id is False
    m = cluster.metrics()
    assert m.value("gpuremediate_leader") == 1
    assert ("GET", "/api/v1/namespaces/gpuremediate-system/services/gpuremediate-metrics:metrics/proxy/metrics") \
        in world.api.proxied


def test_a_bad_scenario_policy_fails_before_the_pod_starts(world: KindWorld, cluster: KubeconfigCluster) -> None:
    with pytest.raises(PolicyError, match=r"drain\.mode"):
        cluster.start_controller({"drain": {"mode": "Sideways"}})
    assert replicas(world) == 0


def test_kill_restart_and_stop_drive_the_deployment(world: KindWorld, cluster: KubeconfigCluster) -> None:
    cluster.start_controller()
    (first,) = controller_pods(world)
    cluster.restart_controller()
    (second,) = controller_pods(world)
    assert second["metadata"]["name"] != first["metadata"]["name"] and ready(second)
    assert f"log of {first['metadata']['name']}" in cluster.controller_log()
    cluster.kill_controller()
    assert replicas(world) == 0 and world.client.list(PODS, SYSTEM_NS)["items"] == []
    cluster.start_controller()
    (third,) = controller_pods(world)
    world.client.patch(PODS, third["metadata"]["name"], {"status": {"containerStatuses": [
        {"name": "main", "restartCount": 2, "ready": True, "image": "fake:dev", "imageID": "",
         "state": {"running": {}}}]}}, SYSTEM_NS, patch_type="strategic", subresource="status")
    cluster.stop_controller()
    cluster.stop_controller()  # twice (a scenario's fixture, then the cluster's stop): harmless
    assert replicas(world) == 0 and world.client.list(PODS, SYSTEM_NS)["items"] == []
    assert cluster.log_problems() == [f"controller pod {third['metadata']['name']} restarted 2 time(s)"]
    assert f"log of {third['metadata']['name']} (previous)" in cluster.controller_log()


def metrics_status(world: KindWorld, node: str) -> int:
    try:
        with urllib.request.urlopen(world.gpusim.url_for(node), timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_faults_reach_gpu_sim_through_the_pod_proxy(world: KindWorld, cluster: KubeconfigCluster) -> None:
    node = world.nodes[1]
    cluster.inject(node, 3, "xid", 79)
    cluster.inject(node, 5, "temp", 93)
    assert world.gpusim.problems(node) == ["GPU 3: XID 79"]
    assert world.gpusim.node(node).gpu(5).gpu_temp == 93
    (gpusim_pod,) = [p for p in pods(world, EXPORTER_NS) if p["spec"]["nodeName"] == node]
    assert ("POST", f"/api/v1/namespaces/gpu-operator/pods/{gpusim_pod['metadata']['name']}:9400/proxy/inject") \
        in world.api.proxied
    cluster.reset_gpu(node, 3)
    assert world.gpusim.problems(node) == []
    cluster.exporter_down(node, "500")
    assert metrics_status(world, node) == 500
    cluster.exporter_up(node)
    assert metrics_status(world, node) == 200
    with pytest.raises(errors.ApiError, match="no GPU 9"):
        cluster.inject(node, 9, "xid", 79)


def test_an_exporter_that_refuses_cannot_come_back_so_the_scenario_is_skipped(cluster: KubeconfigCluster) -> None:
    with pytest.raises(pytest.skip.Exception, match="refuses connections"):
        cluster.exporter_down(cluster.nodes[0], "refuse")


def test_workloads_ask_for_gpus_and_are_running_before_the_scenario_goes_on(
        world: KindWorld, cluster: KubeconfigCluster) -> None:
    cluster.workload("train", world.nodes[0], gpus=2)
    pod = world.client.get(PODS, "train", "workloads")
    (container,) = pod["spec"]["containers"]
    assert ready(pod)
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}  # the patched-on capacity is real on kind
    assert container["image"] == "gpu-sim:dev" and container["command"] == ["sleep", "infinity"]


def test_events_are_the_controllers_only(world: KindWorld, cluster: KubeconfigCluster) -> None:
    node = world.nodes[3]
    node_event(world, node, "NodeNotSchedulable", "kubelet")
    node_event(world, node, "GPUNodeDraining", "gpuremediate")
    assert cluster.event_reasons(node) == ["GPUNodeDraining"]


def test_without_the_deployment_start_says_what_to_apply(world: KindWorld) -> None:
    world.client.delete(DEPLOYMENTS, "gpuremediate", SYSTEM_NS)
    try:
        with pytest.raises(AssertionError, match="apply manifests/overlays/kind"):
            KubeconfigCluster(world.kubeconfig).start()
    finally:
        world.client.create(DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment",
                                          "metadata": {"name": "gpuremediate", "namespace": SYSTEM_NS},
                                          "spec": {"replicas": 0}}, SYSTEM_NS)
