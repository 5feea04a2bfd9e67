"""MaintenanceRequest scenarios (issue 6): a request walks its node through the pipeline.

The CRD comes from manifests/crds (loaded with gpuremediate.kube.miniyaml) and is created before the controller
starts: the controller enables its maintenance loop only when discovery shows the kind served.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import Cluster
from gpuremediate.kube import errors, miniyaml
from gpuremediate.kube.resources import CRDS, EVENTS, Resource
from gpuremediate.state.maintenance import CLAIM_ANNOTATION, FINALIZER, rfc3339

ROOT = Path(__file__).resolve().parent.parent
CRD_FILE = ROOT / "manifests" / "crds" / "gpuremediate.io_maintenancerequests.yaml"
MRS = Resource("gpuremediate.io", "v1alpha1", "maintenancerequests", "MaintenanceRequest", False)
# Maintenance scenarios: short lead, the budget respected (one node at a time, BASE_POLICY).
POLICY: dict[str, dict[str, Any]] = {"maintenance": {"prepare_lead_s": 1.0, "respect_budget": True}}


def install_crd(c: Cluster) -> None:
    crd = miniyaml.loads(CRD_FILE.read_text())
    with contextlib.suppress(errors.AlreadyExists):
        c.kube.create(CRDS, crd)
    c.wait(lambda: _served(c), 10, "the MaintenanceRequest CRD served")


def _served(c: Cluster) -> bool:
    try:
        c.kube.list(MRS)
    except errors.NotFound:
        return False
    return True


def request(name: str, node: str, action: str = "NONE", *, start: float | None = None,
            custom: str | None = None, healthy: bool = False) -> dict[str, Any]:
    event: dict[str, Any] = {"nodeName": node, "agent": "csp-health-monitor", "checkName": "CSPMaintenance",
                             "componentClass": "NODE", "isFatal": False, "isHealthy": healthy,
                             "message": f"planned maintenance ({action})", "recommendedAction": action}
    if custom is not None:
        event["customRecommendedAction"] = custom
    spec: dict[str, Any] = {"healthEvent": event}
    if start is not None:
        spec["startTime"] = rfc3339(start)
    return {"apiVersion": MRS.api_version, "kind": MRS.kind, "metadata": {"name": name}, "spec": spec}


def create(c: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    return c.kube.create(MRS, body)


def get(c: Cluster, name: str) -> dict[str, Any] | None:
    try:
        return c.kube.get(MRS, name)
    except errors.NotFound:
        return None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def phase(c: Cluster, name: str) -> str:
    return str(((get(c, name) or {}).get("status") or {}).get("phase", ""))


def wait_phase(c: Cluster, name: str, want: str, timeout: float = 20.0) -> dict[str, Any]:
    c.wait(lambda: phase(c, name) == want, timeout, f"request {name} in phase {want}",
           seen=lambda: (get(c, name) or {}).get("status"))
    obj = get(c, name)
    assert obj is not None
    return obj


def claim(c: Cluster, node: str) -> str:
    return str((c.node(node)["metadata"].get("annotations") or {}).get(CLAIM_ANNOTATION, ""))


def delete_and_wait_gone(c: Cluster, name: str, timeout: float = 20.0) -> None:
    c.kube.delete(MRS, name)
    c.wait(lambda: get(c, name) is None, timeout, f"request {name} gone (finalizer removed)",
           seen=lambda: get(c, name))


@pytest.fixture
def mc(cluster: Cluster) -> Cluster:
    install_crd(cluster)
    return cluster


def test_none_request_prepares_and_holds_then_delete_returns_the_node(mc: Cluster) -> None:
    node = mc.nodes[0]
    mc.workload("train-0", node)
    mc.workload("sidecar-0", node, gpus=0)  # scope gpu would leave it; the node is handed over, so it goes too
    mc.start_controller({**POLICY, "drain": {"scope": "gpu"}})
    created = create(mc, request("mr-hold", node))
    obj = wait_phase(mc, "mr-hold", "Prepared")
    assert FINALIZER in obj["metadata"]["finalizers"]
    assert claim(mc, node) == f"mr-hold/{created['metadata']['uid']}"
    assert condition(obj, "HealthEventEmitted")["reason"] == "Emitted"
    assert condition(obj, "NodePrepared")["reason"] == "DrainedBeforeStartTime"  # no startTime: "now"
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert mc.state(node) == "maintenance" and mc.unschedulable(node)
    assert {"workloads/train-0", "workloads/sidecar-0"} <= mc.evicted()
    mc.holds(lambda: mc.state(node) == "maintenance" and phase(mc, "mr-hold") == "Prepared", 1.0,
             "nothing moves while the request exists", seen=lambda: (mc.summary(node), get(mc, "mr-hold")))
    delete_and_wait_gone(mc, "mr-hold")
    mc.wait(lambda: mc.state(node) == "healthy" and not mc.unschedulable(node), 20,
            f"{node} validated and back in service", seen=lambda: mc.summary(node))
    assert mc.job_runs(node, "validate") >= 1 and claim(mc, node) == ""


def test_restart_bm_request_reboots_and_validates(mc: Cluster) -> None:
    node = mc.nodes[1]
    boot_before = mc.node(node)["status"]["nodeInfo"]["bootID"]
    mc.start_controller(POLICY)
    create(mc, request("mr-reboot", node, "RESTART_BM"))
    obj = wait_phase(mc, "mr-reboot", "Completed", timeout=30)
    assert condition(obj, "Remediated")["status"] == "True"
    assert condition(obj, "Validated")["reason"] == "Passed"
    if mc.simulated_nodes:  # a kind node cannot reboot: its bootID never changes there
        assert mc.node(node)["status"]["nodeInfo"]["bootID"] != boot_before
    assert mc.state(node) == "healthy" and not mc.unschedulable(node)
    assert claim(mc, node) == "", "a finished request releases its claim"
    delete_and_wait_gone(mc, "mr-reboot")
    assert mc.state(node) == "healthy"


def test_future_start_time_waits_then_prepares(mc: Cluster) -> None:
    node = mc.nodes[0]
    mc.start_controller(POLICY)
    start = math.ceil(time.time()) + 4.0  # a whole second: startTime is written to the second; preparation at -1 s
    create(mc, request("mr-later", node, start=start))
    obj = wait_phase(mc, "mr-later", "Pending")
    mc.wait(lambda: condition(get(mc, "mr-later"), "HealthEventEmitted").get("reason") == "WaitingForStartTime", 10,
            "the request waiting for its start time", seen=lambda: get(mc, "mr-later"))
    mc.holds(lambda: mc.state(node) == "healthy" and not mc.unschedulable(node), 1.0,
             "nothing happens before the lead time", seen=lambda: mc.summary(node))
    assert claim(mc, node).startswith("mr-later/"), "the node is claimed at once"
    obj = wait_phase(mc, "mr-later", "Prepared", timeout=20)
    assert time.time() >= start - 1.5
    assert condition(obj, "NodePrepared")["status"] == "True"
    delete_and_wait_gone(mc, "mr-later")


def test_second_request_for_the_same_node_is_blocked(mc: Cluster) -> None:
    node = mc.nodes[2]
    mc.start_controller(POLICY)
    create(mc, request("mr-first", node))
    wait_phase(mc, "mr-first", "Prepared")
    create(mc, request("mr-second", node, "RESTART_BM"))
    mc.wait(lambda: condition(get(mc, "mr-second"), "HealthEventEmitted").get("reason") == "Blocked", 10,
            "the second request Blocked", seen=lambda: get(mc, "mr-second"))
    assert "mr-first" in condition(get(mc, "mr-second"), "HealthEventEmitted")["message"]
    assert mc.job_runs(node, "reboot") == 0
    delete_and_wait_gone(mc, "mr-first")
    # Once the first is gone (and the node validated back), the second takes the node.
    wait_phase(mc, "mr-second", "Completed", timeout=40)
    assert mc.job_runs(node, "reboot") >= 1


def test_request_for_a_missing_node_is_invalid_until_the_node_appears(mc: Cluster) -> None:
    mc.start_controller(POLICY)
    create(mc, request("mr-ghost", "gpu-node-99"))
    mc.wait(lambda: condition(get(mc, "mr-ghost"), "HealthEventEmitted").get("reason") == "Invalid", 10,
            "the request Invalid (no such node)", seen=lambda: get(mc, "mr-ghost"))
    assert "gpu-node-99 does not exist" in condition(get(mc, "mr-ghost"), "HealthEventEmitted")["message"]
    mc.add_node("gpu-node-99", gpus=8)
    wait_phase(mc, "mr-ghost", "Prepared", timeout=20)
    assert mc.state("gpu-node-99") == "maintenance"
    delete_and_wait_gone(mc, "mr-ghost")


def test_request_deleted_mid_drain_returns_the_node_at_once(mc: Cluster) -> None:
    node = mc.nodes[3]
    mc.workload("stuck-0", node, labels={"app": "stuck"})
    mc.pdb("stuck", {"app": "stuck"}, min_available=1)  # the eviction is refused: the drain cannot end
    mc.start_controller(POLICY)
    create(mc, request("mr-drain", node, "RESTART_BM"))
    obj = mc.wait(lambda: _blocked_by_pdb(get(mc, "mr-drain")), 15, "the drain blocked by the PDB",
                  seen=lambda: get(mc, "mr-drain"))
    assert obj is not None and obj["status"]["phase"] == "Preparing" and mc.unschedulable(node)
    delete_and_wait_gone(mc, "mr-drain")
    assert mc.state(node) == "healthy" and not mc.unschedulable(node)
    assert mc.pod_exists("stuck-0") and mc.job_runs(node, "reboot") == 0 and claim(mc, node) == ""


def _blocked_by_pdb(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    return obj if condition(obj, "NodePrepared").get("reason") == "BlockedByPDB" else None


def test_budget_makes_a_request_wait(mc: Cluster) -> None:
    first, second = mc.nodes[0], mc.nodes[1]
    mc.start_controller(POLICY)  # max_unavailable 1
    create(mc, request("mr-a", first))
    wait_phase(mc, "mr-a", "Prepared")
    create(mc, request("mr-b", second))
    mc.wait(lambda: condition(get(mc, "mr-b"), "NodePrepared").get("reason") == "WaitingForBudget", 15,
            "the second request waiting for the budget", seen=lambda: get(mc, "mr-b"))
    mc.holds(lambda: phase(mc, "mr-b") == "Preparing" and mc.state(second) == "draining", 0.8,
             "the second request held at Preparing, its node draining", seen=lambda: get(mc, "mr-b"))
    delete_and_wait_gone(mc, "mr-a")
    wait_phase(mc, "mr-b", "Prepared", timeout=30)
    delete_and_wait_gone(mc, "mr-b")


def test_recreated_request_never_adopts_its_predecessors_work(mc: Cluster) -> None:
    node = mc.nodes[0]
    mc.start_controller(POLICY)
    old_uid = create(mc, request("mr-same", node))["metadata"]["uid"]
    wait_phase(mc, "mr-same", "Prepared")
    delete_and_wait_gone(mc, "mr-same")
    new_uid = create(mc, request("mr-same", node))["metadata"]["uid"]
    wait_phase(mc, "mr-same", "Prepared", timeout=30)
    record = mc.record(node)
    assert record is not None and record.fault is not None
    assert record.fault.fingerprint == f"maintenance/mr-same/{new_uid}" != f"maintenance/mr-same/{old_uid}"
    assert f"maintenance/mr-same/{old_uid}" in record.handled
    delete_and_wait_gone(mc, "mr-same")


def test_bad_request_gets_a_condition_and_the_loop_goes_on(mc: Cluster) -> None:
    mc.start_controller(POLICY)
    create(mc, request("mr-bad", mc.nodes[0], "RUN_FIELDDIAG"))
    create(mc, request("mr-good", mc.nodes[1]))
    obj = wait_phase(mc, "mr-bad", "Rejected")
    assert "recommendedAction" in condition(obj, "HealthEventEmitted")["message"]
    wait_phase(mc, "mr-good", "Prepared")
    delete_and_wait_gone(mc, "mr-bad")
    delete_and_wait_gone(mc, "mr-good")


def test_cel_immutable_health_event(mc: Cluster) -> None:
    """``self == oldSelf`` on spec.healthEvent: the emulator implements this rule, so it runs everywhere."""
    create(mc, request("mr-frozen", mc.nodes[0], start=time.time() + 3600))
    with pytest.raises(errors.Invalid, match="immutable"):
        c_patch(mc, "mr-frozen", {"spec": {"healthEvent": {"message": "edited"}}})
    c_patch(mc, "mr-frozen", {"spec": {"startTime": rfc3339(time.time() + 7200)}})  # the rest of spec may change


def c_patch(c: Cluster, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    return c.kube.patch(MRS, name, patch)


def test_cel_rejects_an_opening_event_that_is_healthy(mc: Cluster) -> None:
    with pytest.raises(errors.Invalid, match="isHealthy"):
        create(mc, request("mr-healthy", mc.nodes[0], healthy=True))


def test_forgotten_request_is_surfaced_by_metric_and_event(mc: Cluster) -> None:
    mc.start_controller({**POLICY, "maintenance": {"prepare_lead_s": 1.0, "warn_age_s": 1.0}})
    create(mc, request("mr-old", mc.nodes[0], start=time.time() + 3600))
    mc.wait(lambda: (_age(mc, "mr-old") or 0.0) > 1.0, 15, "the request's age in the metric",
            seen=lambda: _age(mc, "mr-old"))
    mc.wait(lambda: _forgotten_events(mc, "mr-old"), 15, "a MaintenanceRequestForgotten Event")
    delete_and_wait_gone(mc, "mr-old")
    mc.wait(lambda: _age(mc, "mr-old") is None, 10, "the deleted request gone from the age metric")


def _age(c: Cluster, request_name: str) -> float | None:
    """The age metric's sample for a request (its label is called ``name``), None when absent."""
    for sample in c.metrics().samples:
        if sample.name == "gpuremediate_maintenance_request_age_seconds" and sample.label("name") == request_name:
            return float(sample.value)
    return None


def _forgotten_events(c: Cluster, name: str) -> list[dict[str, Any]]:
    items = c.kube.list(EVENTS, "default")["items"]
    return [e for e in items if e.get("reason") == "MaintenanceRequestForgotten"
            and e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == "MaintenanceRequest"]


def test_request_whose_finalizer_a_person_removed_leaves_no_orphan(mc: Cluster) -> None:
    node = mc.nodes[1]
    mc.start_controller(POLICY)
    create(mc, request("mr-orphan", node))
    wait_phase(mc, "mr-orphan", "Prepared")
    # A person's `kubectl patch ... finalizers=null`, then the delete: the request vanishes without the controller's
    # cleanup. (Deleting first raced the controller, which finishes a deleted request and drops its finalizer in
    # milliseconds: the person's patch then met a 404 under load.)
    mc.kube.patch(MRS, "mr-orphan", {"metadata": {"finalizers": None}})
    with contextlib.suppress(errors.NotFound):
        mc.kube.delete(MRS, "mr-orphan")
    mc.wait(lambda: mc.state(node) == "healthy" and not mc.unschedulable(node) and claim(mc, node) == "", 20,
            f"{node} returned although its request vanished without cleanup", seen=lambda: mc.summary(node))


def test_without_the_crd_maintenance_requests_are_disabled(cluster: Cluster) -> None:
    cluster.uninstall_crd(f"{MRS.plural}.{MRS.group}")  # where the harness installs the CRDs
    cluster.start_controller(POLICY)  # no CRD installed: the controller still starts and is ready
    cluster.wait(lambda: "maintenance requests disabled" in cluster.controller_log(), 10,
                 "the controller to log that maintenance requests are disabled")
