"""GPU-level isolation with DRA device taints (actions/device_taints), against an API server: the emulator by
default, a real cluster with GPUREMEDIATE_TEST_KUBECONFIG (Kubernetes 1.36 with DRADeviceTaintRules on
kube-apiserver and kube-controller-manager and resource.k8s.io/v1beta2 served, or 1.37).

On a real cluster each test makes its own namespace, Nodes (no kubelet: NodeSim registers them and publishes
their ResourceSlices, its loop is not run) and rules, and removes them afterwards; the pods' claims are allocated
by writing their status as kube-scheduler would (sim.dra_claims.allocate). A pod "goes" when it is marked for
deletion: without a kubelet a real pod stays Terminating. Tests that need the emulator (an API not served, an
injected conflict) skip on a real cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuremediate.actions.custom import MANAGED_BY, MANAGED_BY_LABEL
from gpuremediate.actions.device_taints import (
    DRY_RUN_ANNOTATION,
    EFFECT_NO_EXECUTE,
    EFFECT_NO_SCHEDULE,
    EFFECT_NONE,
    FAULT_ANNOTATION,
    FINGERPRINT_ANNOTATION,
    GPU_UUID_LABEL,
    NODE_LABEL,
    TAINT_KEY,
    DeviceTaints,
    DeviceTaintsNotServed,
    ForeignRule,
    GpuDevice,
    RuleConflict,
    RuleInvalid,
    TaintRule,
    claimable,
    find_gpu_device,
    rule_name,
    validation_claim,
)
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken, load_config
from gpuremediate.kube.resources import (
    DEVICE_CLASSES,
    DEVICE_TAINT_RULE_API_VERSIONS,
    EVENTS,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    RESOURCE_SLICES,
    SERVICEACCOUNTS,
    Resource,
)
from sim.dra_claims import ensure_device_class, run_on_gpu
from sim.gpusim import gpu_uuid
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim
from sim.waiting import wait_for

REAL_KUBECONFIG = os.environ.get("GPUREMEDIATE_TEST_KUBECONFIG")
# A real kube-controller-manager rewrites a rule's status at most every 10 s; the emulator's is made quicker.
STATUS_WAIT_S = 45.0 if REAL_KUBECONFIG else 15.0
EVICTION_WAIT_S = 30.0 if REAL_KUBECONFIG else 10.0
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass
class DraTarget:
    client: KubeClient
    namespace: str
    token: str
    emulator: KubeAPIServer | None = None
    nodes: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # rules a test made without our label

    @property
    def device_class(self) -> str:
        return f"dt-{self.token}.gpu.nvidia.com"

    def run_on_gpu(self, name: str, node: str, device: str, **options: Any) -> dict[str, Any]:
        """A pod bound to ``node`` whose claim is allocated ``device`` (as kube-scheduler would write it)."""
        pod, _ = run_on_gpu(self.client, name, self.namespace, node, device, device_class_name=self.device_class,
                            **options)
        return pod

    def require_emulator(self, why: str) -> KubeAPIServer:
        if self.emulator is None:
            pytest.skip(f"needs the emulator: {why}")
        return self.emulator

    def node(self, suffix: str, gpus: int = 8) -> str:
        """A registered Node with its gpu.nvidia.com ResourceSlice (devices gpu-0.., gpu-sim's UUIDs)."""
        name = f"dt-{self.token}-{suffix}"
        NodeSim(self.client, dra=True).add_node(name, gpus=gpus)
        self.nodes.append(name)
        return name


def _wait_for_default_service_account(client: KubeClient, namespace: str) -> None:
    wait_for(lambda: _exists(client, SERVICEACCOUNTS, "default", namespace), 30,
             f"the default ServiceAccount of {namespace}")


def _exists(client: KubeClient, res: Resource, name: str, namespace: str | None = None) -> bool:
    try:
        client.get(res, name, namespace)
    except errors.NotFound:
        return False
    return True


@pytest.fixture
def dra() -> Iterator[DraTarget]:
    token = uuidlib.uuid4().hex[:6]
    emulator = None
    if REAL_KUBECONFIG:
        client = KubeClient(load_config(REAL_KUBECONFIG), qps=200, burst=200)
    else:
        emulator = KubeAPIServer(device_taint_status_period_s=1.0).start()
        client = KubeClient(ClusterConfig(server=emulator.url, token_source=StaticToken(emulator.admin_token)),
                            qps=500, burst=500)
    target = DraTarget(client, f"dt-{token}", token, emulator)
    client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": target.namespace}})
    try:
        _wait_for_default_service_account(client, target.namespace)
        ensure_device_class(client, target.device_class)
        yield target
    finally:
        _clean_up(target)
        client.close()
        if emulator is not None:
            emulator.stop()


def _clean_up(target: DraTarget) -> None:
    """What the test made, and only that: our rules on its nodes, its foreign rules, its nodes' slices, its
    pods (at once: no kubelet finishes them), its namespace and Nodes."""
    client = target.client
    with contextlib.suppress(DeviceTaintsNotServed):
        taints = DeviceTaints(client)
        for node in target.nodes:
            for rule in taints.owned(node):
                with contextlib.suppress(errors.NotFound, DeviceTaintsNotServed):
                    taints.release_rule(rule.name)
        for name in target.foreign:
            with contextlib.suppress(errors.NotFound):
                client.delete(taints.resource, name)
    for pod in client.list(PODS, target.namespace)["items"]:
        with contextlib.suppress(errors.NotFound):
            client.delete(PODS, pod["metadata"]["name"], target.namespace, grace_period_seconds=0)
    with contextlib.suppress(errors.NotFound):
        client.delete(NAMESPACES, target.namespace)
    with contextlib.suppress(errors.NotFound):
        client.delete(DEVICE_CLASSES, target.device_class)
    for node in target.nodes:
        for slice_ in client.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")["items"]:
            with contextlib.suppress(errors.NotFound):
                client.delete(RESOURCE_SLICES, slice_["metadata"]["name"])
        with contextlib.suppress(errors.NotFound):
            client.delete(NODES, node)


def gpu(target: DraTarget, node: str, index: int) -> GpuDevice:
    found = find_gpu_device(target.client, node, gpu_uuid(node, index))
    assert found is not None, f"GPU {index} of {node} is in no ResourceSlice"
    return found


def marked_for_deletion(client: KubeClient, pod: dict[str, Any]) -> bool:
    """Deleted, or being deleted (a real pod without a kubelet stays Terminating)."""
    meta = pod["metadata"]
    try:
        current = client.get(PODS, meta["name"], meta["namespace"])
    except errors.NotFound:
        return True
    return current["metadata"]["uid"] != meta["uid"] or bool(current["metadata"].get("deletionTimestamp"))


def condition(taints: DeviceTaints, gpu_device: GpuDevice) -> dict[str, Any] | None:
    rule = taints.get(gpu_device)
    if rule is None or rule.eviction is None or rule.eviction.get("observedGeneration") != rule.generation:
        return None
    return dict(rule.eviction)


def updates_of(target: DraTarget, rule: str) -> int:
    """PUTs and PATCHes of the rule itself seen by the emulator (0 on a real cluster: not observable)."""
    if target.emulator is None:
        return 0
    return sum(1 for r in list(target.emulator.requests)
               if r[1] in ("update", "patch") and r[3] == "devicetaintrules" and r[4] == "" and r[6] == rule)


def eviction_done(taints: DeviceTaints, gpu_device: GpuDevice) -> TaintRule | None:
    rule = taints.get(gpu_device)
    return rule if rule is not None and rule.eviction_done else None


def events_about(client: KubeClient, pod: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={pod['metadata']['name']},reason={reason}"
    return list(client.list(EVENTS, pod["metadata"]["namespace"], field_selector=selector)["items"])


# --- finding a GPU -----------------------------------------------------------------------------------

def test_a_gpu_is_found_by_its_uuid_in_its_nodes_slices(dra: DraTarget) -> None:
    node, other = dra.node("a"), dra.node("b", gpus=2)
    found = find_gpu_device(dra.client, node, gpu_uuid(node, 3))
    assert found is not None
    assert (found.node, found.driver, found.pool, found.device) == (node, "gpu.nvidia.com", node, "gpu-3")
    assert found.uuid == gpu_uuid(node, 3) and found.slice_name.startswith(f"00000-gpu.nvidia.com-{node}-")
    assert find_gpu_device(dra.client, node, gpu_uuid(node, 3).lower()) == found  # NVML prints upper case
    assert find_gpu_device(dra.client, node, "GPU-00000000-0000-0000-0000-000000000000") is None
    assert find_gpu_device(dra.client, other, gpu_uuid(node, 3)) is None  # another node's GPU
    assert find_gpu_device(dra.client, node, gpu_uuid(node, 3), driver="other.example.com") is None


def test_every_page_of_the_nodes_slices_is_read(dra: DraTarget) -> None:
    node = dra.node("a", gpus=1)
    for i in range(3):  # other drivers' slices on the node, listed before the GPU's (names sort first)
        dra.client.create(RESOURCE_SLICES, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"0-{node}-nic-{i}"},
            "spec": {"driver": f"nic{i}.example.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "nic-0", "attributes": {"uuid": {"string": f"NIC-{i}"}}}]}})
    found = find_gpu_device(dra.client, node, gpu_uuid(node, 0), page_size=1)
    assert found is not None and found.device == "gpu-0"
    assert find_gpu_device(dra.client, node, "NIC-2", driver=None, page_size=1) is not None


# --- isolating one GPU -------------------------------------------------------------------------------

def test_no_schedule_then_no_execute_moves_only_the_pod_on_that_gpu(dra: DraTarget) -> None:
    node = dra.node("a")
    stays = dra.run_on_gpu("on-gpu-0", node, "gpu-0", labels={"app": "train"})
    goes = dra.run_on_gpu("on-gpu-3", node, "gpu-3", labels={"app": "train"})
    dra.client.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                             "metadata": {"name": "train", "namespace": dra.namespace},
                             "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "train"}}}})
    taints, bad = DeviceTaints(dra.client), gpu(dra, node, 3)

    rule = taints.isolate(bad, EFFECT_NO_SCHEDULE, fault="xid-48", fingerprint="fp-1")
    assert rule.name == rule_name(node, bad.uuid, "gpu-3") and rule.effect == EFFECT_NO_SCHEDULE
    obj = rule.obj
    assert obj["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY, NODE_LABEL: node, GPU_UUID_LABEL: bad.uuid}
    assert obj["metadata"]["annotations"] == {FAULT_ANNOTATION: "xid-48", FINGERPRINT_ANNOTATION: "fp-1"}
    assert obj["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-3"}
    assert obj["spec"]["taint"]["key"] == TAINT_KEY and obj["spec"]["taint"]["value"] == "xid-48"
    assert obj["spec"]["taint"]["timeAdded"]  # the server's default
    again = taints.isolate(bad, EFFECT_NO_SCHEDULE, fault="xid-48", fingerprint="fp-1")  # the same: no write
    assert again.generation == rule.generation and again.obj["spec"] == obj["spec"]
    assert updates_of(dra, rule.name) == 0
    seen = wait_for(lambda: condition(taints, bad), STATUS_WAIT_S, "the eviction controller's look at NoSchedule")
    assert seen is not None
    assert (seen["status"], seen["reason"]) == ("False", "OtherEffect")
    assert not marked_for_deletion(dra.client, stays) and not marked_for_deletion(dra.client, goes)

    escalated = taints.isolate(bad, EFFECT_NO_EXECUTE, fault="xid-48", fingerprint="fp-1")
    assert escalated.name == rule.name and escalated.effect == EFFECT_NO_EXECUTE
    assert escalated.generation == rule.generation + 1 and escalated.obj["metadata"]["uid"] == obj["metadata"]["uid"]
    wait_for(lambda: marked_for_deletion(dra.client, goes), EVICTION_WAIT_S, "the pod on gpu-3 deleted")
    assert not marked_for_deletion(dra.client, stays)  # gpu-0 of the same node: untouched
    events = wait_for(lambda: events_about(dra.client, goes, "DeviceTaintManagerEviction"), EVICTION_WAIT_S,
                      "the eviction Event")
    assert events[0]["message"] == "Marking for deletion"
    assert events[0]["source"]["component"] == "device-taint-eviction-controller"
    assert events_about(dra.client, stays, "DeviceTaintManagerEviction") == []
    done = wait_for(lambda: eviction_done(taints, bad), STATUS_WAIT_S, "EvictionInProgress False")
    assert done is not None
    assert done.eviction is not None and done.eviction["reason"] == "Completed"
    assert done.eviction["message"] == "1 pod evicted since starting the controller."
    assert not marked_for_deletion(dra.client, stays)


def test_a_dry_run_taints_with_effect_none_and_moves_nothing(dra: DraTarget) -> None:
    node = dra.node("a")
    pod = dra.run_on_gpu("on-gpu-1", node, "gpu-1")
    taints, bad = DeviceTaints(dra.client, dry_run=True), gpu(dra, node, 1)
    rule = taints.isolate(bad, EFFECT_NO_EXECUTE, fault="xid-79")
    assert rule.effect == EFFECT_NONE and rule.obj["spec"]["taint"]["effect"] == "None"
    assert rule.obj["metadata"]["annotations"][DRY_RUN_ANNOTATION] == EFFECT_NO_EXECUTE
    seen = wait_for(lambda: condition(taints, bad), STATUS_WAIT_S, "the eviction controller's dry-run report")
    assert seen is not None
    assert (seen["status"], seen["reason"]) == ("False", "NoEffect")
    assert "1 pod would be evicted in 1 namespace if the effect was NoExecute" in seen["message"]
    assert not marked_for_deletion(dra.client, pod)
    assert events_about(dra.client, pod, "DeviceTaintManagerEviction") == []


def test_a_claim_that_tolerates_our_taint_keeps_its_pod(dra: DraTarget) -> None:
    """How a validation Job asks for the isolated GPU: its claim tolerates gpuremediate.io/unhealthy."""
    node = dra.node("a")
    toleration = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
    validator = dra.run_on_gpu("validate-gpu-2", node, "gpu-2", tolerations=[toleration])
    taints, bad = DeviceTaints(dra.client), gpu(dra, node, 2)
    taints.isolate(bad, EFFECT_NO_EXECUTE)
    seen = wait_for(lambda: condition(taints, bad), STATUS_WAIT_S, "the eviction controller's look")
    assert seen is not None
    assert (seen["status"], seen["reason"]) == ("False", "NotStarted")
    assert not marked_for_deletion(dra.client, validator)


# --- a restart, validation, foreign rules ---------------------------------------------------------------

def test_a_restarted_controller_finds_its_rules_by_label(dra: DraTarget) -> None:
    a, b = dra.node("a"), dra.node("b")
    first = DeviceTaints(dra.client)
    names = {first.isolate(gpu(dra, a, i), EFFECT_NO_SCHEDULE).name for i in (1, 5)}
    other = first.isolate(gpu(dra, b, 0), EFFECT_NO_SCHEDULE).name
    foreign = rule_name(a, gpu_uuid(a, 6), "gpu-6")
    dra.client.create(first.resource, _foreign_rule(first, foreign, a, "gpu-6"))
    dra.foreign.append(foreign)

    restarted = DeviceTaints(KubeClient(dra.client.config))
    try:
        assert {r.name for r in restarted.owned(a)} == names  # not the foreign one, not node b's
        assert {r.name for r in restarted.owned(b)} == {other}
        assert [r.device for r in restarted.owned(a, uuid=gpu_uuid(a, 5))] == ["gpu-5"]
        assert {r.node for r in restarted.owned(a)} == {a}
    finally:
        restarted.client.close()


def test_a_validated_gpu_gets_its_rule_removed(dra: DraTarget) -> None:
    node = dra.node("a")
    taints, bad = DeviceTaints(dra.client), gpu(dra, node, 4)
    rule = taints.isolate(bad, EFFECT_NO_EXECUTE)
    assert taints.release(node, bad.uuid) == [rule.name]
    assert taints.get(bad) is None
    assert taints.release(node, bad.uuid) == []
    assert taints.release_rule(rule.name) is False


def _foreign_rule(taints: DeviceTaints, name: str, node: str, device: str) -> dict[str, Any]:
    return {"apiVersion": taints.api_version, "kind": "DeviceTaintRule",
            "metadata": {"name": name, "labels": {"team": "ops"}},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": device},
                     "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}}


def test_a_foreign_rule_of_our_name_is_never_written(dra: DraTarget) -> None:
    node = dra.node("a")
    taints, bad = DeviceTaints(dra.client), gpu(dra, node, 7)
    name = rule_name(node, bad.uuid, bad.device)
    before = dra.client.create(taints.resource, _foreign_rule(taints, name, node, bad.device))
    dra.foreign.append(name)
    with pytest.raises(ForeignRule, match="not managed by gpuremediate"):
        taints.isolate(bad, EFFECT_NO_EXECUTE)
    with pytest.raises(ForeignRule):
        taints.get(bad)
    with pytest.raises(ForeignRule):
        taints.release_rule(name)
    assert taints.release(node, bad.uuid) == []
    after = dra.client.get(taints.resource, name)  # its status is the eviction controller's: that may move
    assert after["spec"] == before["spec"] and after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["metadata"]["labels"] == {"team": "ops"} and "annotations" not in after["metadata"]


# --- the server's answers --------------------------------------------------------------------------------

def test_the_version_in_use_is_discovered(dra: DraTarget) -> None:
    assert DeviceTaints(dra.client).api_version in DEVICE_TAINT_RULE_API_VERSIONS
    if REAL_KUBECONFIG:
        return
    for served, expected in ((("v1beta2",), "resource.k8s.io/v1beta2"), (("v1", "v1beta2"), "resource.k8s.io/v1"),
                             (("v1alpha3",), "resource.k8s.io/v1alpha3")):
        srv = KubeAPIServer(device_taint_rule_versions=served).start()
        client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
        try:
            assert DeviceTaints(client).api_version == expected
        finally:
            client.close()
            srv.stop()


def test_no_device_taint_rules_served_is_a_clear_error(dra: DraTarget) -> None:
    dra.require_emulator("a real cluster's DeviceTaintRule cannot be switched off for one test")
    for make in (lambda: KubeAPIServer(device_taint_rule_versions=()), lambda: KubeAPIServer(dra=False)):
        srv = make().start()  # a 1.36 cluster without the DRADeviceTaintRules gate; one without DRA at all
        client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
        try:
            where = GpuDevice("n", "GPU-1", "gpu.nvidia.com", "n", "gpu-0")
            with pytest.raises(DeviceTaintsNotServed, match=r"DRADeviceTaintRules=true.*GA and on by default in 1\.37"):
                DeviceTaints(client).isolate(where, EFFECT_NO_SCHEDULE)
            with pytest.raises(DeviceTaintsNotServed):
                DeviceTaints(client).owned()
        finally:
            client.close()
            srv.stop()


def test_a_conflict_on_update_is_read_again_once(dra: DraTarget) -> None:
    srv = dra.require_emulator("a 409 is injected")
    node = dra.node("a")
    taints, bad = DeviceTaints(dra.client), gpu(dra, node, 2)
    taints.isolate(bad, EFFECT_NO_SCHEDULE)
    srv.inject("PUT", r"/devicetaintrules/", count=1, status=409)
    assert taints.isolate(bad, EFFECT_NO_EXECUTE).effect == EFFECT_NO_EXECUTE
    srv.inject("PUT", r"/devicetaintrules/", count=2, status=409)
    with pytest.raises(RuleConflict):
        taints.isolate(bad, EFFECT_NO_SCHEDULE)
    assert (taints.get(bad) or pytest.fail("no rule")).effect == EFFECT_NO_EXECUTE


def test_an_invalid_rule_carries_the_servers_message(dra: DraTarget) -> None:
    node = dra.node("a")
    taints, bad = DeviceTaints(dra.client, taint_key="bad key!"), gpu(dra, node, 0)
    with pytest.raises(RuleInvalid, match=r'spec\.taint\.key: Invalid value: "bad key!"') as refused:
        taints.isolate(bad, EFFECT_NO_SCHEDULE)
    assert refused.value.causes[0]["field"] == "spec.taint.key"
    assert taints.get(bad) is None


# --- names -----------------------------------------------------------------------------------------------

_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)


@given(st.lists(_LABEL, min_size=1, max_size=6).map(".".join).filter(lambda n: len(n) <= 253),
       st.integers(min_value=0, max_value=63), st.uuids())
def test_rule_names_are_valid_stable_and_differ_per_gpu(node: str, index: int, gpu_id: uuidlib.UUID) -> None:
    uuid, device = f"GPU-{gpu_id}", f"gpu-{index}"
    name = rule_name(node, uuid, device)
    assert len(name) <= 253 and DNS_SUBDOMAIN.match(name), name
    assert name == rule_name(node, uuid, device)
    assert name != rule_name(node, f"GPU-{uuidlib.uuid4()}", device)  # a swapped GPU: another rule
    assert name.startswith("gpur-")


def test_the_validation_claim_selects_the_gpu_by_uuid_tolerates_our_taint_and_is_owned_by_the_job() -> None:
    gpu = GpuDevice("node-1", "GPU-0a1b", "gpu.nvidia.com", "node-1", "gpu-3")
    job = {"metadata": {"name": "gpur-validate-node-1-x-1", "uid": "job-uid"}}
    body = validation_claim("gpur-validate-node-1-x-1", "jobs", gpu, job, device_class="gpu.nvidia.com")

    [request] = body["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert request["exactly"]["selectors"] == [{"cel": {"expression": 'device.driver == "gpu.nvidia.com" && '
                                                                      'device.attributes["gpu.nvidia.com"].uuid == '
                                                                      '"GPU-0a1b"'}}]
    assert {(t["key"], t["operator"], t["effect"]) for t in request["exactly"]["tolerations"]} == {
        ("gpuremediate.io/unhealthy", "Exists", "NoSchedule"), ("gpuremediate.io/unhealthy", "Exists", "NoExecute")}
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"][
        "name"], "uid": "job-uid", "blockOwnerDeletion": False}]
    assert body["metadata"]["namespace"] == "jobs"
    hostile = GpuDevice("node-1", 'GPU-1" || true || "', "gpu.nvidia.com", "node-1", "gpu-3")
    assert not claimable(hostile)
    with pytest.raises(ValueError, match="CEL"):
        validation_claim("c", "jobs", hostile, job, device_class="gpu.nvidia.com")
