"""The emulator's device-taint-eviction-controller (sim.kube_dra_eviction), as v1.36.2's behaved on /work/cp:
which pods a NoExecute taint deletes, which tolerations count, the Events, and the rule's EvictionInProgress."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import EVENTS, NAMESPACES, PDBS, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, Resource
from sim.dra_claims import allocate, claim_body, pod_body, run_on_gpu
from sim.kube_dra_eviction import DeviceTaintEviction
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

RULES = Resource("resource.k8s.io", "v1beta2", "devicetaintrules", "DeviceTaintRule", False)
NS = "work"
NODE = "node-a"
UNHEALTHY = "gpuremediate.io/unhealthy"


@dataclass
class World:
    srv: KubeAPIServer
    client: KubeClient

    @property
    def controller(self) -> DeviceTaintEviction:
        return self.srv.controllers.device_taints

    def pod_on(self, device: str, name: str | None = None, **options: Any) -> dict[str, Any]:
        pod, _ = run_on_gpu(self.client, name or f"on-{device}", NS, NODE, device, **options)
        return pod

    def rule(self, effect: str, name: str = "r", **selector: str) -> dict[str, Any]:
        chosen = selector or {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-1"}
        return self.client.create(RULES, {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
                                          "metadata": {"name": name},
                                          "spec": {"deviceSelector": chosen,
                                                   "taint": {"key": UNHEALTHY, "effect": effect}}})

    def set_effect(self, effect: str, name: str = "r") -> None:
        body = self.client.get(RULES, name)
        body["metadata"].pop("resourceVersion")
        body["spec"]["taint"]["effect"] = effect
        self.client.replace(RULES, name, body)

    def condition(self, name: str = "r") -> dict[str, Any] | None:
        obj = self.client.get(RULES, name)
        found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "EvictionInProgress"]
        if not found or found[0]["observedGeneration"] != obj["metadata"]["generation"]:
            return None
        return dict(found[0])

    def gone(self, pod: dict[str, Any]) -> bool:
        try:
            current = self.client.get(PODS, pod["metadata"]["name"], NS)
        except errors.NotFound:
            return True
        return bool(current["metadata"].get("deletionTimestamp"))

    def settled(self) -> None:
        """The controller has looked at everything written so far: a whole pass began after this call."""
        for _ in range(2):
            self._one_more_pass()

    def _one_more_pass(self) -> None:
        before = self.controller.passes
        self.controller.dirty = True
        wait_for(lambda: self.controller.passes > before, 10, "a pass of the eviction controller")

    def events(self, pod: dict[str, Any]) -> list[str]:
        selector = f"involvedObject.name={pod['metadata']['name']},reason=DeviceTaintManagerEviction"
        return [e["message"] for e in self.client.list(EVENTS, NS, field_selector=selector)["items"]]


@pytest.fixture
def world() -> Iterator[World]:
    srv = KubeAPIServer(device_taint_status_period_s=0.5).start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    client.create(NAMESPACES, {"metadata": {"name": NS}})
    wait_for(lambda: srv.store.get("/serviceaccounts", NS, "default"), 10, "the default ServiceAccount")
    try:
        yield World(srv, client)
    finally:
        client.close()
        srv.stop()


def test_no_execute_deletes_only_the_pod_on_the_tainted_device(world: World) -> None:
    stays, goes = world.pod_on("gpu-0"), world.pod_on("gpu-1")
    world.rule("NoExecute")
    wait_for(lambda: world.gone(goes), 10, "the pod on gpu-1 deleted")
    world.settled()
    assert not world.gone(stays)
    deleted = world.client.get(PODS, goes["metadata"]["name"], NS)
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 30  # a DELETE with the pod's own grace period
    target = [c for c in deleted["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert target == [{"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                       "lastTransitionTime": target[0]["lastTransitionTime"], "reason": "DeletionByDeviceTaintManager",
                       "message": "Device Taint manager: deleting due to NoExecute taint"}]
    assert world.events(goes) == ["Marking for deletion"] and world.events(stays) == []
    event = world.client.list(EVENTS, NS, field_selector="reason=DeviceTaintManagerEviction")["items"][0]
    assert event["source"] == {"component": "device-taint-eviction-controller"} and event["type"] == "Normal"


def test_a_pod_disruption_budget_is_not_consulted(world: World) -> None:
    goes = world.pod_on("gpu-1", labels={"app": "a"})
    world.client.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                               "metadata": {"name": "a", "namespace": NS},
                               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}}})
    with pytest.raises(errors.TooManyRequests):  # the Eviction API would refuse
        world.client.evict(goes["metadata"]["name"], NS, dry_run=True)
    world.rule("NoExecute")
    wait_for(lambda: world.gone(goes), 10, "the pod deleted in spite of its PDB")


def test_the_rules_status_reads_pending_then_completed(world: World) -> None:
    world.controller.status_period_s = 3600.0  # hold the first condition
    world.pod_on("gpu-1")
    world.rule("NoExecute")
    first = wait_for(world.condition, 10, "the first condition")
    assert first is not None
    assert (first["status"], first["reason"], first["message"]) == (
        "True", "PodsPendingEviction", "1 pod needs to be evicted in 1 namespace.")
    world.controller.status_period_s = 0.2
    world.controller.dirty = True
    done = wait_for(lambda: (c := world.condition()) is not None and c["status"] == "False" and c, 10,
                    "the eviction done")
    assert done
    assert (done["reason"], done["message"]) == ("Completed", "1 pod evicted since starting the controller.")


def test_none_and_no_schedule_evict_nothing_and_say_so(world: World) -> None:
    pod = world.pod_on("gpu-1")
    world.rule("None")
    none = wait_for(world.condition, 10, "the dry-run report")
    assert none is not None
    assert (none["status"], none["reason"], none["message"]) == ("False", "NoEffect", (
        "0 published devices selected. 1 allocated device selected. 1 pod would be evicted in 1 namespace if the "
        "effect was NoExecute. This information will not be updated again. Recreate the DeviceTaintRule to "
        "trigger an update."))
    world.set_effect("NoSchedule")
    other = wait_for(world.condition, 10, "the NoSchedule report")
    assert other is not None
    assert (other["status"], other["reason"], other["message"]) == (
        "False", "OtherEffect", "Eviction only happens for the NoExecute effect.")
    world.settled()
    assert not world.gone(pod) and world.events(pod) == []


@pytest.mark.parametrize(("request_tolerations", "evicted"), [
    (None, True),
    # only the copy in the allocation result counts (sim.dra_claims.allocate copies the request's, as the scheduler)
    ([{"key": UNHEALTHY, "operator": "Exists", "effect": "NoExecute"}], False),
    ([{"key": UNHEALTHY, "operator": "Exists"}], True),  # an empty effect does not stop an eviction (v1.36.2)
    ([{"key": UNHEALTHY, "operator": "Equal", "value": "other", "effect": "NoExecute"}], True),
    ([{"operator": "Exists", "effect": "NoExecute"}], False),  # every key
])
def test_which_tolerations_keep_a_pod(world: World, request_tolerations: list[dict[str, Any]] | None,
                                      evicted: bool) -> None:
    pod = world.pod_on("gpu-1", tolerations=request_tolerations)
    world.rule("NoExecute")
    wait_for(world.condition, 10, "the controller's report")
    world.settled()
    assert world.gone(pod) is evicted


def test_tolerations_in_the_request_only_do_not_count(world: World) -> None:
    """The controller reads the tolerations the scheduler copied into the allocation result, not the request's: a
    claim allocated without that copy is evicted although its request tolerates the taint (as upstream)."""
    toleration = {"key": UNHEALTHY, "operator": "Exists", "effect": "NoExecute"}
    claim = world.client.create(RESOURCE_CLAIMS, claim_body("c", NS, tolerations=[toleration]), NS)
    pod = world.client.create(PODS, pod_body("p", NS, NODE, "c"), NS)
    without_copy = {**claim, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}}}
    allocated = allocate(world.client, without_copy, pod, node=NODE, device="gpu-1")
    assert "tolerations" not in allocated["status"]["allocation"]["devices"]["results"][0]
    assert allocated["spec"]["devices"]["requests"][0]["exactly"]["tolerations"][0]["key"] == UNHEALTHY
    world.rule("NoExecute")
    wait_for(lambda: world.gone(pod), 10, "the pod whose claim tolerates in its request only")


def test_toleration_seconds_delay_the_deletion_and_a_lifted_taint_cancels_it(world: World) -> None:
    toleration = {"key": UNHEALTHY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600}
    later, cancelled = world.pod_on("gpu-1", "later", tolerations=[toleration]), world.pod_on(
        "gpu-2", "cancelled", tolerations=[toleration])
    world.rule("NoExecute", "r1", driver="gpu.nvidia.com", pool=NODE, device="gpu-1")
    world.rule("NoExecute", "r2", driver="gpu.nvidia.com", pool=NODE, device="gpu-2")
    pending = wait_for(lambda: world.condition("r1"), 10, "r1's report")
    assert pending is not None and pending["reason"] == "PodsPendingEviction"
    world.settled()
    assert not world.gone(later) and not world.gone(cancelled)
    world.client.delete(RULES, "r2")
    wait_for(lambda: world.events(cancelled) == ["Cancelling deletion"], 10, "the cancelled deletion's Event")
    world.controller.clock = lambda: time.time() + 601  # ten minutes on
    world.controller.dirty = True
    wait_for(lambda: world.gone(later), 10, "the deletion once the toleration ran out")
    world.settled()
    assert not world.gone(cancelled)


def test_a_drivers_own_no_execute_taint_evicts_without_any_rule() -> None:
    srv = KubeAPIServer(device_taint_rule_versions=()).start()  # DRADeviceTaints is on by default in 1.36
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    try:
        client.create(NAMESPACES, {"metadata": {"name": NS}})
        wait_for(lambda: srv.store.get("/serviceaccounts", NS, "default"), 10, "the default ServiceAccount")
        world = World(srv, client)
        stays, goes = world.pod_on("gpu-0"), world.pod_on("gpu-1")
        devices: list[dict[str, Any]] = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}}
                                         for i in range(2)]
        devices[1]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoExecute"}]
        client.create(RESOURCE_SLICES, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                        "metadata": {"name": "s"},
                                        "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE, "devices": devices,
                                                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}}})
        wait_for(lambda: world.gone(goes), 10, "the pod on the driver-tainted device deleted")
        world.settled()
        assert not world.gone(stays)
    finally:
        client.close()
        srv.stop()


def test_only_pods_the_claim_is_reserved_for_and_bound_ones_go(world: World) -> None:
    bound = world.pod_on("gpu-1")
    unbound = world.client.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unbound"},
                                         "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                                  "resourceClaims": [{"name": "gpu",
                                                                      "resourceClaimName": "on-gpu-1"}]}}, NS)
    # Bound and naming the allocated claim, not in its reservedFor: the resourceclaim controller reserves the claim
    # for it (sim.kube_dra_claims, as kube-controller-manager's syncPod), so it goes too.
    unreserved = world.client.create(PODS, {**bound, "metadata": {"name": "unreserved", "namespace": NS}}, NS)
    world.rule("NoExecute")
    wait_for(lambda: world.gone(bound), 10, "the reserved, bound pod deleted")
    wait_for(lambda: world.gone(unreserved), 10, "the bound pod the claim controller reserved the claim for, deleted")
    world.settled()
    assert not world.gone(unbound), "never bound: never reserved, never deleted"


def test_a_claim_from_a_template_is_found_through_the_pods_status(world: World) -> None:
    claim = world.client.create(RESOURCE_CLAIMS, claim_body("from-template-gpu-x1", NS), NS)
    pod = world.client.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "from-template"},
                                     "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}],
                                              "resourceClaims": [{"name": "gpu",
                                                                  "resourceClaimTemplateName": "one-gpu"}]}}, NS)
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "from-template-gpu-x1"}]}
    pod = world.client.replace(PODS, "from-template", pod, NS, subresource="status")
    allocate(world.client, claim, pod, node=NODE, device="gpu-1")
    world.rule("NoExecute")
    wait_for(lambda: world.gone(pod), 10, "the templated claim's pod deleted")


@pytest.mark.parametrize(("selector", "gone"), [
    ({"pool": NODE}, {"on-gpu-0", "on-gpu-1"}),  # every device of the node
    ({"driver": "gpu.nvidia.com", "pool": "node-b"}, set()),
    ({"driver": "other.example.com", "device": "gpu-1"}, set()),
])
def test_the_selector_matches_on_every_field_it_sets(world: World, selector: dict[str, str], gone: set[str]) -> None:
    pods = [world.pod_on("gpu-0"), world.pod_on("gpu-1")]
    world.rule("NoExecute", **selector)
    wait_for(world.condition, 10, "the controller's report")
    world.settled()
    if gone:
        wait_for(lambda: all(world.gone(p) for p in pods if p["metadata"]["name"] in gone), 10, "the deletions")
    assert {p["metadata"]["name"] for p in pods if world.gone(p)} == gone
