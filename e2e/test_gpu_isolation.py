"""GPU-level isolation with DRA device taints (issue 26, ``[isolation] scope = "gpu"``): one bad GPU costs one GPU.

The nodes publish their GPUs in ResourceSlices as NVIDIA's DRA driver does (``make_cluster(tmp, dra=True)``:
NodeSim's ``dra=True``) and each workload pod holds one GPU through a ResourceClaim allocated as kube-scheduler
would (sim.dra_claims). An XID 48 on GPU 3 takes only GPU 3 out: a DeviceTaintRule (NoSchedule, then NoExecute),
the device-taint eviction controller deletes the pod holding it, the node is never cordoned, GPU 3 alone is
reset and validated, the rule goes. On the apiserver target the real kube-controller-manager's eviction
controller does the deleting; it needs the DRA device-taint gates (docs/dra.md), else the scenarios skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import JOBS_NS, EmulatorCluster, make_cluster
from gpuremediate.actions.device_taints import (
    EFFECT_NONE,
    DeviceTaints,
    DeviceTaintsNotServed,
    GpuDevice,
    TaintRule,
    rule_body,
)
from gpuremediate.actions.jobs import JOB_LABEL
from gpuremediate.kube import errors
from gpuremediate.kube.resources import EVENTS, JOBS, PODS, RESOURCE_CLAIMS
from gpuremediate.vocab.record import SCOPE_GPU, SCOPE_NODE
from sim.gpusim import gpu_uuid
from sim.nodesim_dra import DRIVER

# before_ga = "gpu": the emulator and the 1.36 control plane serve DeviceTaintRule at v1beta2 only, where the
# default is node-level (test_before_ga_the_default_is_node_level shows that default).
GPU_LEVEL: dict[str, dict[str, Any]] = {"isolation": {"scope": "gpu", "before_ga": "gpu"},
                                        "drain": {"retry_s": 0.3, "timeout_s": 30}}
GPUS = 8


@pytest.fixture
def dra(tmp_path: Path) -> Iterator[EmulatorCluster]:
    """A started DRA cluster of the target (controller not started), one pod per GPU on its first node."""
    c = make_cluster(tmp_path, dra=True)
    assert isinstance(c, EmulatorCluster), c  # NodeSim publishes the slices in process
    c.start()
    try:
        try:
            DeviceTaints(c.kube).api_version
        except DeviceTaintsNotServed as exc:
            pytest.skip(f"this API server serves no DeviceTaintRule (docs/dra.md: the 1.36 gates): {exc}")
        node = c.nodes[0]
        c.wait(lambda: c.sim.nodesim is not None and c.sim.nodesim.resource_slices(node), 10,
               f"{node}'s ResourceSlice")
        for gpu in range(GPUS):
            c.dra_workload(f"w{gpu}", node, gpu)
        yield c
    finally:
        tail = c.controller_log().splitlines()[-40:]
        c.stop()
        print("\n".join(tail))


def rules(c: EmulatorCluster) -> list[TaintRule]:
    return DeviceTaints(c.kube).owned(c.nodes[0])


def never_cordoned(c: EmulatorCluster) -> str | None:
    node = c.nodes[0]
    return f"{node} was cordoned" if c.unschedulable(node) else None


def gpu_ids(job: dict[str, Any]) -> str:
    env = job["spec"]["template"]["spec"]["containers"][0].get("env") or []
    return next((str(e.get("value", "")) for e in env if e.get("name") == "GPU_IDS"), "")


def isolate_gpu3(c: EmulatorCluster) -> str:
    """XID 48 on GPU 3 of the first node, its pod deleted by the eviction controller: the node's name."""
    node = c.nodes[0]
    c.inject(node, 3, "xid", 48)
    c.wait(lambda: "workloads/w3" in c.evicted(), 20, "the pod holding GPU 3 to be deleted")
    return node


def test_xid48_on_gpu3_moves_only_its_pod_resets_validates_and_returns_it(dra: EmulatorCluster) -> None:
    c, node = dra, dra.nodes[0]
    assert c.sim.nodesim is not None
    c.sim.nodesim.set_job_outcome(node, succeed=True, duration_s=2.0)  # long enough to look at it while it runs
    c.start_controller(GPU_LEVEL)
    with c.invariant(lambda: never_cordoned(c), "the node stays schedulable"):
        isolate_gpu3(c)
        record = c.wait_state(node, "repairing", timeout=20)
        assert record.isolation is not None and record.isolation.scope == SCOPE_GPU
        assert record.isolation.uuid == gpu_uuid(node, 3) and record.isolation.device == "gpu-3"
        assert [(r.name, r.effect, r.device) for r in rules(c)] == [(record.isolation.rule, "NoExecute", "gpu-3")]
        status = c.cli("status")
        assert f"{GPUS - 1}/{GPUS} GPUs" in status.stdout, status.stdout + status.stderr
        explained = c.cli("explain", node).stdout
        assert record.isolation.rule in explained and gpu_uuid(node, 3) in explained, explained
        c.wait_metric("gpuremediate_isolated_gpus", 1)
        # What the claim shows while the validation runs: kube-controller-manager deallocates it once the Job's
        # pod is done (sim.kube_dra_claims), so it is read now, not after.
        running = c.wait(lambda: _validation_claim_in_use(c, node), 20, "the validation claim allocated and reserved",
                         seen=lambda: c.summary(node))
        c.wait_state(node, "healthy", timeout=30)
    assert c.evicted() == {"workloads/w3"}, "only the pod on GPU 3 moved"
    assert all(c.pod_exists(f"w{gpu}") for gpu in range(GPUS) if gpu != 3)
    told = c.kube.list(EVENTS, "workloads", field_selector="reason=GPUFault")["items"]
    assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in told] == [("Pod", "w3")]
    assert "device taint eviction controller" in told[0]["message"] and gpu_uuid(node, 3) in told[0]["message"]
    resets = c.jobs(node, "reset-gpu")
    assert [gpu_ids(j) for j in resets] == ["3"], "GPU 3 alone is reset"
    [validation] = c.jobs(node, "validate")
    assert gpu_ids(validation) == "3", "GPU 3 alone is validated"
    assert_took_gpu3_through_its_claim(c, validation, running)
    assert rules(c) == [], "the rule is removed once GPU 3 is validated"
    assert "GPUIsolated" in c.event_reasons(node) and "GPUReturned" in c.event_reasons(node)
    c.stop_controller()
    assert c.log_problems() == []


def _validation_claim_in_use(c: EmulatorCluster, node: str) -> dict[str, Any] | None:
    """The validation Job's claim while it is allocated and reserved for the Job's pod, else None."""
    job = next(iter(c.jobs(node, "validate")), None)
    claim = None if job is None else _claim(c, job["metadata"]["name"])
    status = (claim or {}).get("status") or {}
    return claim if status.get("allocation") and status.get("reservedFor") else None


def assert_took_gpu3_through_its_claim(c: EmulatorCluster, job: dict[str, Any], running: dict[str, Any] | None
                                       ) -> None:
    """``[isolation] validation = "claim"``: the Job's pod was placed by the scheduler (no nodeName) and took GPU 3
    through a claim tolerating our taint, owned by the Job (``running``: the claim as read while the pod ran). Once
    the pod is done, kube-controller-manager's resourceclaim controller deallocates the claim and drops the
    scheduler's finalizer (sim.kube_dra_claims: the real rule)."""
    name = job["metadata"]["name"]
    pod_spec = job["spec"]["template"]["spec"]
    assert "nodeName" not in pod_spec and pod_spec["resourceClaims"][0]["resourceClaimName"] == name
    assert running is not None and running["metadata"]["name"] == name
    assert [r["device"] for r in running["status"]["allocation"]["devices"]["results"]] == ["gpu-3"]
    assert running["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"], "the scheduler's"
    assert {t["effect"] for t in running["spec"]["devices"]["requests"][0]["exactly"]["tolerations"]} == \
        {"NoSchedule", "NoExecute"}
    assert running["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    [pod] = [p for p in c.kube.list(PODS, JOBS_NS, label_selector=JOB_LABEL)["items"]
             if p["metadata"]["name"].startswith(name)]
    assert pod["spec"]["nodeName"] == c.nodes[0] and pod["status"]["phase"] == "Succeeded"
    assert [r["uid"] for r in running["status"]["reservedFor"]] == [pod["metadata"]["uid"]]

    def released() -> bool:
        claim = _claim(c, name)
        return claim is None or (not (claim.get("status") or {}).get("allocation")
                                 and not claim["metadata"].get("finalizers"))
    c.wait(released, 10, f"the claim {name} deallocated once the Job's pod is done",
           seen=lambda: (_claim(c, name) or {}).get("status"))


def test_a_second_gpu_failing_while_one_is_isolated_goes_node_level(dra: EmulatorCluster) -> None:
    c, node = dra, dra.nodes[0]
    assert c.sim.nodesim is not None
    c.sim.nodesim.set_job_outcome(node, succeed=True, duration_s=3.0)
    c.start_controller(GPU_LEVEL)
    isolate_gpu3(c)
    c.wait_state(node, "repairing", timeout=20)
    c.inject(node, 5, "xid", 48)
    c.wait(lambda: c.unschedulable(node), 15, "the node cordoned: node-level now")
    record = c.record(node)
    assert record is not None and record.isolation is not None and record.isolation.scope == SCOPE_NODE
    assert record.fault is not None and set(record.fault.gpus) == {gpu_uuid(node, 3), gpu_uuid(node, 5)}
    c.wait_event(node, "GPUIsolationEscalated")
    c.sim.nodesim.set_job_outcome(node, succeed=True, duration_s=0.2)
    c.wait_state(node, "healthy", timeout=40)
    assert not c.unschedulable(node), "uncordoned: the cordon was ours"
    assert "3,5" in [gpu_ids(j) for j in c.jobs(node, "reset-gpu")], "both GPUs reset node-level"
    assert rules(c) == [], "the rule kept through the node-level flow goes at its end"


def test_dry_run_writes_an_effect_none_rule_and_deletes_nothing(dra: EmulatorCluster) -> None:
    c, node = dra, dra.nodes[0]
    c.start_controller(GPU_LEVEL, dry_run=True)
    with c.invariant(lambda: never_cordoned(c), "the node stays schedulable"):
        c.inject(node, 3, "xid", 48)
        c.wait(lambda: rules(c), 20, "the dry run's rule")
        c.holds(lambda: not c.evicted(), 3.0, "no pod is deleted")
    assert [(r.effect, r.device) for r in rules(c)] == [(EFFECT_NONE, "gpu-3")]
    assert c.kube.list(JOBS, JOBS_NS)["items"] == [], "a dry run creates no Job"


def test_a_controller_restarted_mid_flow_finds_its_rule_and_carries_on(dra: EmulatorCluster) -> None:
    c, node = dra, dra.nodes[0]
    c.start_controller({**GPU_LEVEL, "drain": {"retry_s": 0.3, "timeout_s": 60, "mode": "AllowCompletion"}})
    c.inject(node, 3, "xid", 48)
    c.wait(lambda: rules(c), 20, "the NoSchedule rule (AllowCompletion: w3 may finish first)")
    c.kill_controller()
    first = rules(c)
    assert [r.effect for r in first] == ["NoSchedule"]
    mark = c.audit_mark()
    c.restart_controller()

    uid = first[0].obj["metadata"]["uid"]

    def same_rule_no_create() -> bool:
        creates = [m for m in c.mutations_since(mark) if m[0] == "create" and m[2] == "devicetaintrules"]
        return not creates and [(r.name, r.obj["metadata"]["uid"]) for r in rules(c)] == [(first[0].name, uid)]
    c.holds(same_rule_no_create, 2.0, "the successor carrying on with its rule (AllowCompletion: w3 still runs)")
    record = c.record(node)
    assert record is not None and record.isolation is not None and record.isolation.rule == first[0].name
    assert record.action is not None and "w3" in record.action.detail, "it says what it waits for"
    c.kube.delete(*_pod("w3"))  # the workload finished by itself: the drain is done
    c.wait_state(node, "healthy", timeout=30)
    assert rules(c) == [] and not c.unschedulable(node)
    assert c.evicted() == {"workloads/w3"}


def test_a_controller_restarted_while_validating_makes_the_claim_it_lacks(dra: EmulatorCluster) -> None:
    """A controller killed between the validation Job's create and its claim's: the successor makes the claim
    (here: deleted while the controller was down), so the Job's pod is not left without its GPU."""
    c, node = dra, dra.nodes[0]
    assert c.sim.nodesim is not None
    c.sim.nodesim.set_job_outcome(node, succeed=True, duration_s=60.0, kind="validate")  # still running
    c.start_controller(GPU_LEVEL)
    isolate_gpu3(c)
    c.wait_state(node, "validating", timeout=30)
    name = c.wait(lambda: next((j["metadata"]["name"] for j in c.jobs(node, "validate")), None), 10,
                  "the validation Job")
    c.wait(lambda: _claim(c, name), 10, "its claim")
    c.kill_controller()
    c.kube.delete(RESOURCE_CLAIMS, name, JOBS_NS)
    c.restart_controller()
    claim = c.wait(lambda: _claim(c, name), 15, "the claim made again by the successor")
    assert claim["metadata"]["ownerReferences"][0]["name"] == name


def _claim(c: EmulatorCluster, name: str) -> dict[str, Any] | None:
    try:
        return c.kube.get(RESOURCE_CLAIMS, name, JOBS_NS)
    except errors.NotFound:
        return None


def test_before_ga_the_default_is_node_level(dra: EmulatorCluster) -> None:
    """On a cluster whose DeviceTaintRule is not GA (1.36: v1beta2) the scheduler does not honour NoSchedule rules,
    so ``scope = "gpu"`` alone does not isolate: the node is cordoned and drained, and the Event says why."""
    c, node = dra, dra.nodes[0]
    if DeviceTaints(c.kube).served_ga:
        pytest.skip("this API server serves DeviceTaintRule at resource.k8s.io/v1 (GA): GPU-level is the default")
    c.start_controller({"isolation": {"scope": "gpu"}, "drain": {"retry_s": 0.3, "timeout_s": 30}})
    c.inject(node, 3, "xid", 48)
    c.wait(lambda: c.unschedulable(node), 15, "the node cordoned: node-level")
    event = c.wait_event(node, "GPUIsolationNodeLevel")
    assert "before GA" in str(event.get("message")), event
    assert rules(c) == [], "no DeviceTaintRule written"
    c.wait_state(node, "healthy", timeout=40)
    assert not c.unschedulable(node)


def test_without_a_resource_slice_for_the_gpu_it_goes_node_level_and_says_so(tmp_path: Path) -> None:
    c = make_cluster(tmp_path).start()  # no DRA driver publishes the GPUs
    try:
        node = c.nodes[0]
        c.start_controller(GPU_LEVEL)
        c.inject(node, 3, "xid", 48)
        c.wait(lambda: c.unschedulable(node), 15, "the node cordoned: node-level")
        event = c.wait_event(node, "GPUIsolationNodeLevel")
        assert "ResourceSlice" in str(event.get("message")) or "not served" in str(event.get("message"))
        c.wait_state(node, "healthy", timeout=30)
        assert not c.unschedulable(node)
    finally:
        c.stop()


def _pod(name: str) -> tuple[Any, str, str]:
    from e2e.harness import WORKLOAD_NS
    from gpuremediate.kube.resources import PODS

    return PODS, name, WORKLOAD_NS


def test_a_rule_of_ours_no_flow_holds_is_deleted(dra: EmulatorCluster) -> None:
    """A flow that ended without its release (a person deleted the record mid-flow) leaves a rule: it goes. A rule
    without our label is never touched."""
    c, node = dra, dra.nodes[0]
    gpu = GpuDevice(node, gpu_uuid(node, 2), DRIVER, node, "gpu-2")
    DeviceTaints(c.kube).isolate(gpu, "NoSchedule", fault="xid-48")
    foreign = rule_body(gpu, "NoSchedule", DeviceTaints(c.kube).api_version)
    foreign["metadata"] = {"name": "someone-elses", "labels": {}}
    resource = DeviceTaints(c.kube).resource
    c.kube.create(resource, foreign)
    try:
        c.start_controller(GPU_LEVEL)
        c.wait(lambda: not rules(c), 15, "the orphaned rule deleted")
        assert c.kube.get(resource, "someone-elses")["metadata"]["name"] == "someone-elses"
        assert c.state(node) == "healthy" and not c.unschedulable(node)
    finally:
        c.kube.delete(resource, "someone-elses")  # not ours: an API server that outlives the scenario keeps it
