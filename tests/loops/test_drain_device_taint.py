"""The GPU-level drain's steps against the emulator (``loops.drain_device_taint``): NoSchedule, then NoExecute when
the drain is due (AllowCompletion waits), done once no claim holds the device; node-level when the cluster serves
no DeviceTaintRule (said once); a rule of ours the record does not name is adopted, not created again."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.device_taints import DeviceTaints, GpuDevice
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, NODES, PODS
from gpuremediate.loops.drain_device_taint import DeviceTaintDrain
from gpuremediate.loops.step import Done, Failed, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.isolation import IsolationPolicy
from gpuremediate.policy.workflow import DrainPolicy
from gpuremediate.vocab.record import SCOPE_GPU, SCOPE_NODE, ActionInProgress, Fault, Isolation, NodeRecord
from sim.dra_claims import ensure_device_class, run_on_gpu
from sim.gpusim import gpu_uuid
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim
from sim.nodesim_dra import DRIVER

NODE = "dt-node"
UUID = gpu_uuid(NODE, 3)


class Writes:
    dry_run = False

    def __init__(self) -> None:
        self.records: list[tuple[NodeRecord, bool]] = []
        self.events: list[tuple[str, str]] = []
        self.told: list[tuple[str, str]] = []  # the workload notices: (Kind/namespace/name, reason)

    def write(self, node: dict[str, Any], record: NodeRecord, *, cordon: bool = False, **_: Any) -> dict[str, Any]:
        self.records.append((record, cordon))
        return node

    def node_event(self, node: str, reason: str, message: str, *_: Any, **__: Any) -> None:
        self.events.append((reason, message))

    def object_event(self, ref: Any, reason: str, message: str, *_: Any) -> None:
        self.told.append((f"{ref.kind}/{ref.namespace}/{ref.name}", reason))


@dataclasses.dataclass
class Ctx:
    client: KubeClient
    policy: Policy
    writer: Writes = dataclasses.field(default_factory=Writes)
    now: float = 1000.0

    @property
    def events(self) -> Writes:
        return self.writer

    def clock(self) -> float:
        return self.now


def served(versions: tuple[str, ...]) -> Iterator[KubeClient]:
    srv = KubeAPIServer(device_taint_rule_versions=versions).start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}})
    NodeSim(client, dra=True).add_node(NODE, gpus=8)
    ensure_device_class(client)
    yield client
    client.close()
    srv.stop()


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    """A 1.37 cluster: DeviceTaintRule GA at resource.k8s.io/v1 (and the scheduler honours it)."""
    yield from served(("v1",))


@pytest.fixture
def beta() -> Iterator[KubeClient]:
    """A 1.36 cluster with the gate: DeviceTaintRule at v1beta2 only, its scheduler blind to the rules."""
    yield from served(("v1beta2",))


@pytest.fixture
def no_rules() -> Iterator[KubeClient]:
    yield from served(())


def record(isolation: Isolation | None = None) -> NodeRecord:
    fault = Fault("xid", "48", (UUID,), "xid:48", "reset-gpu", 900.0, 900.0, "XID 48")
    return NodeRecord(state="draining", since=900.0, fault=fault, isolation=isolation or Isolation(SCOPE_GPU, UUID),
                      action=ActionInProgress("drain", "", 1, 950.0, deadline=2000.0))


def step(ctx: Ctx, client: KubeClient, rec: NodeRecord, drain: DeviceTaintDrain) -> tuple[StepResult, NodeRecord]:
    result = drain.step(ctx, client.get(NODES, NODE), rec)  # type: ignore[arg-type]
    return result, ctx.writer.records[-1][0] if ctx.writer.records else rec


def policy(mode: str, before_ga: str = "node") -> Policy:
    return Policy(drain=DrainPolicy(mode=mode), isolation=IsolationPolicy(scope="gpu", before_ga=before_ga))


def test_allow_completion_waits_under_no_schedule_then_no_execute_then_done(kube: KubeClient) -> None:
    run_on_gpu(kube, "w3", "w", NODE, "gpu-3")
    ctx, drain = Ctx(kube, policy("AllowCompletion")), DeviceTaintDrain()
    result, rec = step(ctx, kube, record(), drain)
    assert isinstance(result, InProgress) and rec.isolation is not None
    assert (rec.isolation.effect, rec.isolation.device, rec.isolation.pool) == ("NoSchedule", "gpu-3", NODE)
    assert ctx.writer.records[-1][1] is False, "no cordon"
    assert [e[0] for e in ctx.writer.events] == ["GPUIsolated"]
    result, rec = step(ctx, kube, rec, drain)
    assert isinstance(result, InProgress) and rec.action is not None and "w/w3" in rec.action.detail
    assert rec.isolation is not None and rec.isolation.effect == "NoSchedule", "AllowCompletion: w3 may finish"
    kube.delete(PODS, "w3", "w", grace_period_seconds=0)
    result, rec = step(ctx, kube, rec, drain)
    assert rec.isolation is not None and rec.isolation.effect == "NoExecute"
    result, rec = step(ctx, kube, rec, drain)
    assert isinstance(result, Done), result


def test_allow_completion_past_the_timeout_fails_the_drain(kube: KubeClient) -> None:
    run_on_gpu(kube, "w3", "w", NODE, "gpu-3")
    ctx, drain = Ctx(kube, policy("AllowCompletion")), DeviceTaintDrain()
    _, rec = step(ctx, kube, record(), drain)
    ctx.now = 2001.0
    result, _ = step(ctx, kube, rec, drain)
    assert isinstance(result, Failed) and "w/w3" in result.reason


def test_immediate_goes_no_execute_at_once_and_waits_for_the_holder(kube: KubeClient) -> None:
    run_on_gpu(kube, "w3", "w", NODE, "gpu-3")
    run_on_gpu(kube, "w4", "w", NODE, "gpu-4")
    ctx, drain = Ctx(kube, policy("Immediate")), DeviceTaintDrain()
    _, rec = step(ctx, kube, record(), drain)
    _, rec = step(ctx, kube, rec, drain)
    assert rec.isolation is not None and rec.isolation.effect == "NoExecute"
    result, rec = step(ctx, kube, rec, drain)
    assert isinstance(result, InProgress), "w3 still holds gpu-3 (the eviction controller deletes it)"
    assert rec.action is not None and "w/w3" in rec.action.detail and "w4" not in rec.action.detail
    assert ctx.writer.told == [("Pod/w/w3", "GPUFault")], "the pod the NoExecute rule deletes is told why, once"


def test_a_cluster_without_device_taint_rules_goes_node_level_once(no_rules: KubeClient) -> None:
    ctx, drain = Ctx(no_rules, policy("Immediate")), DeviceTaintDrain()
    result, rec = step(ctx, no_rules, record(), drain)
    assert isinstance(result, InProgress)
    assert rec.isolation is not None and rec.isolation.scope == SCOPE_NODE and "not served" in rec.isolation.why
    assert ctx.writer.records[-1][1] is True and rec.cordoned_by_us, "cordoned: node-level"
    assert [e[0] for e in ctx.writer.events] == ["GPUIsolationNodeLevel"]


def test_before_ga_the_default_is_node_level_and_says_why(beta: KubeClient) -> None:
    ctx, drain = Ctx(beta, policy("Immediate")), DeviceTaintDrain()
    result, rec = step(ctx, beta, record(), drain)
    assert isinstance(result, InProgress)
    assert rec.isolation is not None and rec.isolation.scope == SCOPE_NODE
    assert "resource.k8s.io/v1beta2, before GA" in rec.isolation.why and "before_ga" in rec.isolation.why
    assert ctx.writer.records[-1][1] is True, "cordoned: node-level"
    assert DeviceTaints(beta).owned(NODE) == [], "no rule written"
    assert [e[0] for e in ctx.writer.events] == ["GPUIsolationNodeLevel"]


def test_before_ga_an_operator_may_still_isolate_the_gpu(beta: KubeClient) -> None:
    ctx, drain = Ctx(beta, policy("Immediate", before_ga="gpu")), DeviceTaintDrain()
    _, rec = step(ctx, beta, record(), drain)
    assert rec.isolation is not None and rec.isolation.scope == SCOPE_GPU and rec.isolation.effect == "NoSchedule"
    taints = DeviceTaints(beta)
    assert taints.api_version == "resource.k8s.io/v1beta2" and [r.name for r in taints.owned(NODE)] == [rec.isolation.rule]


def test_a_gpu_in_no_slice_goes_node_level(kube: KubeClient) -> None:
    ctx, drain = Ctx(kube, policy("Immediate")), DeviceTaintDrain()
    _, rec = step(ctx, kube, record(Isolation(SCOPE_GPU, "GPU-not-here")), drain)
    assert rec.isolation is not None and rec.isolation.scope == SCOPE_NODE and "no ResourceSlice" in rec.isolation.why


def test_a_rule_the_record_does_not_name_is_adopted(kube: KubeClient) -> None:
    existing = DeviceTaints(kube).isolate(GpuDevice(NODE, UUID, DRIVER, NODE, "gpu-3"), "NoExecute")
    ctx, drain = Ctx(kube, policy("Immediate")), DeviceTaintDrain()
    _, rec = step(ctx, kube, record(), drain)
    assert rec.isolation is not None and (rec.isolation.rule, rec.isolation.effect) == (existing.name, "NoExecute")
    rules = DeviceTaints(kube).owned(NODE)
    assert [(r.name, r.obj["metadata"]["uid"]) for r in rules] == [(existing.name, existing.obj["metadata"]["uid"])]


def test_before_admission_places_no_schedule_once(kube: KubeClient) -> None:
    ctx, drain = Ctx(kube, policy("Immediate")), DeviceTaintDrain()
    waiting = dataclasses.replace(record(), action=None)
    node = kube.get(NODES, NODE)
    assert isinstance(drain.before_admission(ctx, node, waiting), InProgress)  # type: ignore[arg-type]
    placed = ctx.writer.records[-1][0]
    assert placed.isolation is not None and placed.isolation.effect == "NoSchedule" and placed.action is None
    assert drain.before_admission(ctx, node, placed) is None, "placed: admission goes on"  # type: ignore[arg-type]
