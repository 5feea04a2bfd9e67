"""Validation on MIG nodes and on nodes whose device plugin holds GPUs back (issue 13): the busy wait counts
MIG pods, the Job asks for every GPU slice from capacity, and a node whose allocatable stays short of its
capacity fails validation naming the missing GPUs instead of leaving a Job Pending forever."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from gpuremediate.actions.jobs import ActionJobs
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import JOBS, NAMESPACES, PODS
from gpuremediate.loops.validate import ValidateLoop
from gpuremediate.policy.config import PolicyFile, loads_policy
from gpuremediate.state.decide import Decision
from gpuremediate.vocab import states
from gpuremediate.vocab.record import BLOCK_GPU_PODS, BLOCK_GPU_UNAVAILABLE, NodeRecord
from sim.kubeapi import KubeAPIServer

JOBS_NS = "gpuremediate-jobs"
NODE = "mig-node"
MIXED = {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4"}


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    for name in (JOBS_NS, "w"):
        client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield client
    client.close()
    srv.stop()


class Writes:
    """The node writer's part the loop uses: records written, decisions applied, Events."""

    def __init__(self) -> None:
        self.dry_run = False
        self.records: list[NodeRecord] = []
        self.decisions: list[Decision] = []
        self.events: list[tuple[str, str]] = []

    def write(self, node: dict[str, Any], record: NodeRecord, **_: Any) -> dict[str, Any]:
        self.records.append(record)
        return node

    def apply(self, node: dict[str, Any], decision: Decision) -> dict[str, Any]:
        self.decisions.append(decision)
        return node

    def node_event(self, node: str, reason: str, message: str, *_: Any, **__: Any) -> None:
        self.events.append((reason, message))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def loop_for(kube: KubeClient, writes: Writes, clock: Clock, policy: PolicyFile | None = None) -> ValidateLoop:
    loop = ValidateLoop.__new__(ValidateLoop)
    chosen = policy or PolicyFile()
    loop.ctx = SimpleNamespace(  # type: ignore[assignment]
        client=kube, writer=writes, events=writes, clock=clock, policy=chosen, readings={},
        jobs=ActionJobs(kube, JOBS_NS),
        policy_for=lambda node: chosen.for_node(node["metadata"].get("labels") or {}),
        settings=SimpleNamespace(resync_s=10.0, jobs_namespace=JOBS_NS),
        breakers=SimpleNamespace(holds_in_flight=lambda in_flight: ""))
    return loop


def node(capacity: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "2"}
    return {"metadata": {"name": NODE, "resourceVersion": "7", "labels": labels},
            "status": {"capacity": capacity, "allocatable": allocatable if allocatable is not None else capacity}}


def validating(since: float = 100.0) -> NodeRecord:
    return NodeRecord(state=states.VALIDATING, since=since, reason=states.REPAIR_COMPLETE, cordoned_by_us=True)


def mig_pod(kube: KubeClient, name: str, resource: str) -> None:
    kube.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "w"},
                       "spec": {"nodeName": NODE, "containers": [
                           {"name": "main", "image": "cuda", "resources": {"limits": {resource: "1"}}}]}}, "w")


def job_resources(kube: KubeClient) -> dict[str, Any]:
    jobs = kube.list(JOBS, JOBS_NS)["items"]
    assert len(jobs) == 1, jobs
    resources: dict[str, Any] = jobs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]
    return resources


def test_a_mig_pod_holds_validation_back(kube: KubeClient) -> None:
    writes, clock = Writes(), Clock(200.0)
    mig_pod(kube, "slice", "nvidia.com/mig-1g.10gb")
    loop_for(kube, writes, clock).reconcile(node(MIXED), validating())
    assert writes.records[-1].blocked is not None
    assert writes.records[-1].blocked.reason == BLOCK_GPU_PODS and "w/slice" in writes.records[-1].blocked.detail
    assert kube.list(JOBS, JOBS_NS)["items"] == []


def test_the_job_of_a_mixed_node_asks_for_every_mig_slice(kube: KubeClient) -> None:
    writes, clock = Writes(), Clock(200.0)
    loop_for(kube, writes, clock).reconcile(node({**MIXED, "cpu": "64"}), validating())
    wanted = {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4"}
    assert job_resources(kube) == {"limits": wanted, "requests": wanted}


def test_allocatable_short_of_capacity_waits_then_fails_naming_the_gpus(kube: KubeClient) -> None:
    writes, clock = Writes(), Clock(200.0)
    policy = loads_policy("[gpu_resources]\nallocatable_wait_s = 120\n")
    short = node({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "7"})
    loop = loop_for(kube, writes, clock, policy)
    assert loop.reconcile(short, validating()) == 10.0
    waiting = writes.records[-1]
    assert waiting.blocked is not None and waiting.blocked.reason == BLOCK_GPU_UNAVAILABLE
    assert "nvidia.com/gpu 7 of 8 allocatable" in waiting.blocked.detail
    assert kube.list(JOBS, JOBS_NS)["items"] == []  # the kubelet would never admit it (OutOfnvidia.com/gpu)

    clock.now = 300.0  # 100 s into the wait: still waiting, the same block (its since kept)
    loop.reconcile(short, waiting)
    assert writes.decisions == [] and len(writes.records) == 1  # nothing new to write

    clock.now = 321.0
    loop.reconcile(short, waiting)
    [decision] = writes.decisions
    assert decision.record.state == states.QUARANTINED and decision.record.reason == states.VALIDATION_FAILED
    assert "validation cannot hold every GPU: nvidia.com/gpu 7 of 8 allocatable" in decision.record.message
    assert "1 GPU device(s) as unhealthy" in decision.record.message
    assert kube.list(JOBS, JOBS_NS)["items"] == []


def test_a_device_plugin_that_catches_up_in_time_gets_its_job(kube: KubeClient) -> None:
    writes, clock = Writes(), Clock(200.0)
    loop = loop_for(kube, writes, clock)
    loop.reconcile(node(MIXED, {**MIXED, "nvidia.com/mig-3g.40gb": "0"}), validating())
    blocked = writes.records[-1]
    assert blocked.blocked is not None and "nvidia.com/mig-3g.40gb 0 of 4" in blocked.blocked.detail
    clock.now = 230.0
    loop.reconcile(node(MIXED), blocked)
    assert writes.decisions == []
    assert job_resources(kube)["requests"] == {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4"}


def test_no_gpu_capacity_at_all_is_no_job_asking_for_nothing(kube: KubeClient) -> None:
    writes, clock = Writes(), Clock(200.0)
    loop_for(kube, writes, clock).reconcile(node({"cpu": "64"}), validating())
    assert writes.records[-1].blocked is not None
    assert "no GPU resource in its capacity" in writes.records[-1].blocked.detail
    assert kube.list(JOBS, JOBS_NS)["items"] == []


def test_the_allocatable_wait_keeps_its_start_while_the_counts_change(kube: KubeClient) -> None:
    writes, clock = Writes(), Clock(200.0)
    policy = loads_policy("[gpu_resources]\nallocatable_wait_s = 120\n")
    loop = loop_for(kube, writes, clock, policy)
    loop.reconcile(node({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "7"}), validating())
    waiting = writes.records[-1]
    clock.now = 300.0  # the device plugin flaps: 6 of 8 now, another text
    loop.reconcile(node({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "6"}), waiting)
    flapped = writes.records[-1]
    assert flapped.blocked is not None and "6 of 8" in flapped.blocked.detail and flapped.blocked.since == 200.0
    clock.now = 321.0  # 121 s since the first wait: over, whatever the counts said since
    loop.reconcile(node({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "7"}), flapped)
    [decision] = writes.decisions
    assert decision.record.state == states.QUARANTINED
