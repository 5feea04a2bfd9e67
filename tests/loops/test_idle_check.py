"""Idle-node checks (issue 46): an idle GPU node gets one preflight Job per interval, a busy, cordoned or
remediated node none, at most ``idle_check_max_jobs`` at once; a check whose pod failed a GPU is counted failed
and becomes the node's ``preflight-failed`` finding (the failed-pod watch's path); a passed one is counted and its
Job deleted; a check on a node that leaves service is deleted at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from gpuremediate.actions.jobs import JOB_LABEL, ActionJobs
from gpuremediate.actions.nodes import name_of
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import JOBS, NAMESPACES, NODES, PODS, SERVICEACCOUNTS
from gpuremediate.loops.idle_check import IdleCheckLoop
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.policy.config import PolicyFile, loads_policy
from gpuremediate.policy.preflight import PreflightJudge
from gpuremediate.signals.workload import WorkloadSignal, reduce
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_RESET_GPU
from gpuremediate.vocab.preflight import CONTAINER_NAME, KIND_PREFLIGHT
from gpuremediate.vocab.record import RECORD_ANNOTATION, NodeRecord, encode
from gpuremediate.vocab.schema import PolicyError
from sim.kubeapi import KubeAPIServer

JOBS_NS = "gpuremediate-jobs"
HOUR = 3600.0
FAILED_LINE = "preflight failed: GPU GPU-0bad: ecc-dbe: GPU GPU-0bad has 2 volatile double-bit ECC error(s)"


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    for name in (JOBS_NS, "w"):
        client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        client.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": {"name": "gpuremediate-job"}}, name)
    yield client
    client.close()
    srv.stop()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Nodes:
    """The Node cache's part the loop reads, from the API server each time."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            node: dict[str, Any] = self.client.get(NODES, name)
            return node
        except errors.NotFound:
            return None

    def gpu_nodes(self) -> list[dict[str, Any]]:
        return list(self.client.list(NODES).get("items") or [])


def policy(interval: float = HOUR, cap: int = 2) -> PolicyFile:
    return loads_policy(f"[preflight]\nidle_check_interval_s = {interval}\nidle_check_max_jobs = {cap}\n")


def loop_for(kube: KubeClient, clock: Clock, chosen: PolicyFile, signal: WorkloadSignal) -> IdleCheckLoop:
    nodes = Nodes(kube)
    ctx = SimpleNamespace(
        client=kube, clock=clock, policy=chosen, metrics=ControllerMetrics(), nodes=nodes,
        jobs=ActionJobs(kube, JOBS_NS), owned_gpu_nodes=nodes.gpu_nodes,
        policy_for=lambda node: chosen.for_node(node["metadata"].get("labels") or {}),
        settings=SimpleNamespace(resync_s=10.0, jobs_namespace=JOBS_NS, preflight_image="gpuremediate:test",
                                 dry_run=False))
    loop = IdleCheckLoop.__new__(IdleCheckLoop)
    IdleCheckLoop.__init__(loop, ctx, signal)  # type: ignore[arg-type]
    return loop


def add_node(kube: KubeClient, name: str, *, gpus: int = 8, unschedulable: bool = False) -> None:
    resources = {"nvidia.com/gpu": str(gpus), "cpu": "64"}
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                        "spec": {"unschedulable": unschedulable},
                        "status": {"capacity": resources, "allocatable": resources,
                                   "conditions": [{"type": "Ready", "status": "True"}]}})
    # A new Node registers tainted not-ready (admission) until the node lifecycle controller sees it Ready and
    # lifts the taint, a moment later: until then it is out of service, and its quiet time would start late.
    wait_for(lambda: not any(t.get("key") == "node.kubernetes.io/not-ready"
                             for t in (kube.get(NODES, name).get("spec") or {}).get("taints") or []))


def gpu_pod(kube: KubeClient, node: str, name: str = "train") -> None:
    kube.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"nodeName": node, "containers": [{
                           "name": "main", "image": "x",
                           "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, "w")


def checks(kube: KubeClient) -> list[dict[str, Any]]:
    return [j for j in kube.list(JOBS, JOBS_NS).get("items") or []
            if j["metadata"]["labels"].get(JOB_LABEL) == "idle-check" and not j["metadata"].get("deletionTimestamp")]


def wait_for(what: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("not within the timeout")


def test_an_idle_node_gets_one_check_per_interval_and_never_before(kube: KubeClient) -> None:
    add_node(kube, "idle")
    clock = Clock(1_000_000.0)
    loop = loop_for(kube, clock, policy(), WorkloadSignal())
    loop.resync()
    assert checks(kube) == []  # first seen now: quiet for no interval yet
    clock.now += HOUR - 1
    loop.resync()
    assert checks(kube) == []
    clock.now += 1
    loop.resync()
    loop.resync()
    (job,) = checks(kube)
    spec = job["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "gpuremediate-idle-check"
    assert "nodeName" not in spec  # placed by the scheduler: preemptible
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["idle"]
    (container,) = spec["containers"]
    assert container["name"] == CONTAINER_NAME
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["args"][:3] == ["preflight", "--on-unknown", "exit"]
    assert "--expect-gpus" in container["args"]
    assert job["spec"]["backoffLimit"] == 0


def test_a_busy_cordoned_or_remediated_node_gets_none(kube: KubeClient) -> None:
    add_node(kube, "busy")
    add_node(kube, "cordoned", unschedulable=True)
    add_node(kube, "draining")
    record = NodeRecord(state=states.DRAINING, node="draining")
    kube.patch(NODES, "draining", {"metadata": {"annotations": {RECORD_ANNOTATION: encode(record)}}})
    gpu_pod(kube, "busy")
    clock = Clock(1_000_000.0)
    loop = loop_for(kube, clock, policy(), WorkloadSignal())
    loop.resync()
    clock.now += 2 * HOUR
    loop.resync()
    assert checks(kube) == []


def test_off_by_default(kube: KubeClient) -> None:
    add_node(kube, "idle")
    clock = Clock(1_000_000.0)
    loop = loop_for(kube, clock, PolicyFile(), WorkloadSignal())
    loop.resync()
    clock.now += 30 * 24 * HOUR
    loop.resync()
    assert checks(kube) == []


def test_the_cap_is_honoured_fleet_wide(kube: KubeClient) -> None:
    for name in ("a", "b", "c"):
        add_node(kube, name)
    clock = Clock(1_000_000.0)
    loop = loop_for(kube, clock, policy(cap=2), WorkloadSignal())
    loop.resync()
    clock.now += HOUR
    loop.resync()
    assert len(checks(kube)) == 2
    loop.resync()
    assert len(checks(kube)) == 2


def end_pod(kube: KubeClient, job: str, code: int, message: str) -> dict[str, Any]:
    """The check's pod ends as the kubelet would write it (the emulator's Job controller then ends the Job)."""
    pod = wait_for(lambda: [p for p in kube.list(PODS, JOBS_NS).get("items") or []
                            if p["metadata"]["name"].startswith(f"{job}-")])[0]
    # kube-scheduler binds it to the one node its affinity allows (the emulator binds only pods with claims)
    node = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
    kube.patch(PODS, pod["metadata"]["name"], {"spec": {"nodeName": node}}, JOBS_NS)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"phase": "Failed" if code else "Succeeded", "containerStatuses": [{
        "name": CONTAINER_NAME, "ready": False, "restartCount": 0, "image": "", "imageID": "",
        "state": {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed",
                                 "message": message, "startedAt": now, "finishedAt": now}}}]}
    ended: dict[str, Any] = kube.patch(PODS, pod["metadata"]["name"], {"status": status}, JOBS_NS,
                                       patch_type="strategic", subresource="status")
    return ended


def ended(loop: IdleCheckLoop, job: str, count: str) -> None:
    """The Job ended, as the loop's Jobs watch shows it."""
    wait_for(lambda: [j for j in loop.ctx.jobs.all() if j["metadata"]["name"] == job
                      and (j.get("status") or {}).get(count)])


def test_a_failing_check_is_counted_and_becomes_the_nodes_finding(kube: KubeClient) -> None:
    add_node(kube, "quiet")
    signal = WorkloadSignal()
    clock = Clock(time.time() - HOUR)  # the pod ends (its real time) right after the check started
    loop = loop_for(kube, clock, policy(), signal)
    loop.resync()
    clock.now += HOUR
    loop.resync()
    (job,) = checks(kube)
    name = job["metadata"]["name"]
    pod = end_pod(kube, name, 1, FAILED_LINE)
    ended(loop, name, "failed")
    signal.seen(reduce(pod))  # what the failed-pod watch does with it
    loop.resync()
    assert loop.ctx.metrics.idle_checks.value(result="failed") == 1
    assert checks(kube) == []  # counted, then deleted
    (finding,) = PreflightJudge(signal).findings("quiet", clock.now, loop.ctx.policy.defaults.preflight)
    assert finding.kind == KIND_PREFLIGHT and finding.code == "ecc-dbe"
    assert finding.gpus == ("GPU-0bad",) and finding.action == ACTION_RESET_GPU
    clock.now += HOUR - 1
    loop.resync()
    assert checks(kube) == []  # the next check an interval after this one


def test_a_passed_check_and_one_that_could_not_tell(kube: KubeClient) -> None:
    add_node(kube, "n1")
    clock = Clock(time.time())
    loop = loop_for(kube, clock, policy(cap=1), WorkloadSignal())  # a pod ending now ends before the next check
    loop.resync()
    clock.now += HOUR
    loop.resync()
    (job,) = checks(kube)
    end_pod(kube, job["metadata"]["name"], 0, "")
    ended(loop, job["metadata"]["name"], "succeeded")
    loop.resync()
    loop.resync()  # the Jobs watch may still show the Job just deleted: counted once
    assert loop.ctx.metrics.idle_checks.value(result="passed") == 1
    clock.now += HOUR
    loop.resync()
    (again,) = checks(kube)
    end_pod(kube, again["metadata"]["name"], 3, "preflight unknown: nvidia-smi timed out")
    ended(loop, again["metadata"]["name"], "failed")
    loop.resync()
    assert loop.ctx.metrics.idle_checks.value(result="unknown") == 0  # its pod's line awaited a while
    clock.now += 61
    loop.resync()
    assert loop.ctx.metrics.idle_checks.value(result="unknown") == 1
    assert loop.ctx.metrics.idle_checks.value(result="failed") == 0


def test_a_check_on_a_node_that_leaves_service_is_deleted_at_once(kube: KubeClient) -> None:
    add_node(kube, "n1")
    clock = Clock(1_000_000.0)
    loop = loop_for(kube, clock, policy(), WorkloadSignal())
    loop.resync()
    clock.now += HOUR
    loop.resync()
    assert len(checks(kube)) == 1
    kube.patch(NODES, "n1", {"spec": {"unschedulable": True}})
    loop.resync()
    assert checks(kube) == []
    assert loop.ctx.metrics.idle_checks.value(result="unknown") == 1
    assert name_of(loop.ctx.nodes.get("n1") or {}) == "n1"


def test_a_bad_interval_is_refused_naming_the_key() -> None:
    with pytest.raises(PolicyError, match=r"preflight\.idle_check_interval_s: must be between 300"):
        loads_policy("[preflight]\nidle_check_interval_s = 60\n")
    assert loads_policy("[preflight]\nidle_check_interval_s = 0\n").defaults.preflight.idle_check_interval_s == 0
