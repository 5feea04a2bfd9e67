"""The GPU-level drain without DRA (``loops.drain_device_plugin``, ``[isolation] without_dra = "device-plugin"``):
a cluster serving no DeviceTaintRule hands the GPU to the device plugin instead of going node-level; the node stays
schedulable once its allocatable shows the GPU gone, and goes node-level (said) when it does not within
``device_plugin_wait_s``, or when the GPU comes back mid-drain; the drain scope narrows to that GPU's pods; the
history of such a flow counts as GPU-level (the same GPU failing again is node-level)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.pods import SCOPE_ALL, SCOPE_IMPACTED
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NODES
from gpuremediate.loops import drainers
from gpuremediate.loops.drain_device_plugin import DevicePluginDrain, gpus_offered
from gpuremediate.loops.drain_device_taint import DeviceTaintDrain
from gpuremediate.loops.drain_scope import drain_scope
from gpuremediate.loops.step import InProgress
from gpuremediate.policy.config import Policy, default_policy, loads_policy
from gpuremediate.policy.isolation import IsolationPolicy
from gpuremediate.policy.workflow import DrainPolicy
from gpuremediate.state import decide
from gpuremediate.vocab.record import (
    EFFECT_UNHEALTHY,
    SCOPE_GPU,
    SCOPE_NODE,
    VIA_DEVICE_PLUGIN,
    Isolation,
    NodeRecord,
    decode,
    encode,
)
from gpuremediate.vocab.schema import PolicyError
from tests.loops.test_drain_device_taint import NODE, UUID, Ctx, record, served

WAIT_S = 60.0


@pytest.fixture
def no_rules() -> Iterator[KubeClient]:
    yield from served(())


def policy(without_dra: str = "device-plugin", scope: str = "all") -> Policy:
    return Policy(drain=DrainPolicy(mode="Immediate", scope=scope),
                  isolation=IsolationPolicy(scope="gpu", without_dra=without_dra, device_plugin_wait_s=WAIT_S))


def plugin_record(effect: str = "", since: float = 1000.0) -> NodeRecord:
    isolation = Isolation(SCOPE_GPU, UUID, why="no DRA", via=VIA_DEVICE_PLUGIN, effect=effect, effect_since=since)
    return record(isolation)


def gpu_node(allocatable: int | None, capacity: int | None = 8) -> dict[str, Any]:
    status: dict[str, Any] = {"capacity": {}, "allocatable": {}}
    if capacity is not None:
        status["capacity"]["nvidia.com/gpu"] = str(capacity)
    if allocatable is not None:
        status["allocatable"]["nvidia.com/gpu"] = str(allocatable)
    return {"metadata": {"name": NODE}, "spec": {}, "status": status}


def last(ctx: Ctx) -> tuple[NodeRecord, bool]:
    return ctx.writer.records[-1]


def test_the_setting_defaults_to_node_and_is_checked() -> None:
    isolation = default_policy().defaults.isolation
    assert (isolation.without_dra, isolation.device_plugin_wait_s) == ("node", 120.0)
    loaded = loads_policy('[isolation]\nscope = "gpu"\nwithout_dra = "device-plugin"\ndevice_plugin_wait_s = 30\n')
    assert loaded.defaults.isolation.by_device_plugin and loaded.defaults.isolation.device_plugin_wait_s == 30
    with pytest.raises(PolicyError, match=r"isolation\.without_dra: expected one of node, device-plugin, got 'dp'"):
        loads_policy('[isolation]\nwithout_dra = "dp"\n')
    with pytest.raises(PolicyError, match=r"isolation\.device_plugin_wait_s: must be between 1 and "):
        loads_policy('[isolation]\ndevice_plugin_wait_s = 0\n')


def test_no_device_taint_rules_hands_the_gpu_to_the_device_plugin(no_rules: KubeClient) -> None:
    ctx = Ctx(no_rules, policy())
    result = DeviceTaintDrain().step(ctx, no_rules.get(NODES, NODE), record())  # type: ignore[arg-type]
    assert isinstance(result, InProgress)
    rec, cordon = last(ctx)
    assert not cordon, "the node is not cordoned"
    assert rec.isolation is not None and rec.isolation.at_gpu and rec.isolation.by_device_plugin
    assert rec.isolation.effect == "" and rec.isolation.effect_since == ctx.now
    assert "by the device plugin" in rec.isolation.why and "by the device plugin" in rec.message
    assert drainers.select(ctx.policy, rec).kind == "device-plugin"
    assert ctx.writer.events == [], "nothing is isolated yet"


def test_the_default_stays_node_level_without_dra(no_rules: KubeClient) -> None:
    ctx = Ctx(no_rules, policy(without_dra="node"))
    DeviceTaintDrain().step(ctx, no_rules.get(NODES, NODE), record())  # type: ignore[arg-type]
    rec, cordon = last(ctx)
    assert cordon and rec.isolation is not None and rec.isolation.scope == SCOPE_NODE
    assert not rec.isolation.by_device_plugin


def test_allocatable_down_isolates_the_gpu_and_says_so() -> None:
    ctx, drain = Ctx(None, policy()), DevicePluginDrain()  # type: ignore[arg-type]
    result = drain.before_admission(ctx, gpu_node(7), plugin_record())  # type: ignore[arg-type]
    assert isinstance(result, InProgress)
    rec, cordon = last(ctx)
    assert not cordon and rec.isolation is not None and rec.isolation.effect == EFFECT_UNHEALTHY
    assert rec.isolation.at_gpu
    reason, message = ctx.writer.events[-1]
    assert reason == "GPUIsolated" and "allocatable nvidia.com/gpu 7 of 8" in message and "schedulable" in message


def test_allocatable_still_full_waits_within_the_bound() -> None:
    ctx, drain = Ctx(None, policy()), DevicePluginDrain()  # type: ignore[arg-type]
    ctx.now = 1000.0 + WAIT_S - 1
    assert drain.before_admission(ctx, gpu_node(8), plugin_record()) is None  # type: ignore[arg-type]
    assert ctx.writer.records == []
    result = drain.step(ctx, gpu_node(8), plugin_record())  # type: ignore[arg-type]
    assert isinstance(result, InProgress) and result.requeue_s is not None and result.requeue_s <= 1.0
    rec, cordon = last(ctx)
    assert not cordon and rec.action is not None and "waiting for the device plugin" in rec.action.detail


def test_allocatable_that_never_drops_goes_node_level_and_says_so() -> None:
    ctx, drain = Ctx(None, policy()), DevicePluginDrain()  # type: ignore[arg-type]
    ctx.now = 1000.0 + WAIT_S
    result = drain.step(ctx, gpu_node(8), plugin_record())  # type: ignore[arg-type]
    assert isinstance(result, InProgress)
    rec, cordon = last(ctx)
    assert cordon and rec.isolation is not None and rec.isolation.scope == SCOPE_NODE
    assert "stayed 8 of 8" in rec.isolation.why and "node-level" in rec.message
    reason, message = ctx.writer.events[-1]
    assert reason == "GPUIsolationNodeLevel" and "did not mark" in message and "cordoned" in message
    assert drainers.select(ctx.policy, rec).kind == "eviction"


def test_a_node_without_nvidia_gpu_resources_goes_node_level_at_once() -> None:
    ctx = Ctx(None, policy())  # type: ignore[arg-type]
    DevicePluginDrain().before_admission(ctx, gpu_node(None, None), plugin_record())  # type: ignore[arg-type]
    rec, cordon = last(ctx)
    assert cordon and rec.isolation is not None and "offers no nvidia.com/gpu" in rec.isolation.why


def test_the_gpu_offered_again_mid_drain_goes_node_level() -> None:
    ctx = Ctx(None, policy())  # type: ignore[arg-type]
    DevicePluginDrain().step(ctx, gpu_node(8), plugin_record(EFFECT_UNHEALTHY))  # type: ignore[arg-type]
    rec, cordon = last(ctx)
    assert cordon and rec.isolation is not None and "offers GPU" in rec.isolation.why


def test_gpus_offered_reads_the_kubelets_counts() -> None:
    assert gpus_offered(gpu_node(7)) == (7, 8)
    assert gpus_offered(gpu_node(None)) == (8, 8)
    assert gpus_offered(gpu_node(None, None)) is None


def test_the_drain_scope_narrows_to_the_gpus_pods() -> None:
    scope = drain_scope(policy(scope="all"), gpu_node(7), plugin_record(EFFECT_UNHEALTHY))
    assert scope.scope == SCOPE_IMPACTED and "GPU" in scope.why
    dra = record(Isolation(SCOPE_GPU, UUID, rule="r"))
    assert drain_scope(policy(scope="all"), gpu_node(7), dra).scope == SCOPE_ALL


def test_the_record_round_trips_how_the_gpu_is_isolated() -> None:
    rec = plugin_record(EFFECT_UNHEALTHY)
    back = decode(encode(rec))
    assert back.isolation is not None and back.isolation.via == VIA_DEVICE_PLUGIN and back.isolation == rec.isolation


def test_its_history_is_gpu_level_once_the_device_plugin_held_the_gpu_out() -> None:
    """Gone node-level after the device plugin held the GPU out (it came back mid-drain): the repair's history
    entry still says GPU-level, so the same GPU failing again is node-level; never held out: node-level."""
    isolation = Isolation(SCOPE_NODE, UUID, why="offered again", via=VIA_DEVICE_PLUGIN, effect=EFFECT_UNHEALTHY)
    repairing = dataclasses.replace(record(isolation), state="repairing", action=None)
    repaired = decide.complete_repair(repairing, True, 1500.0, 1).record
    assert repaired.history[-1].scope == SCOPE_GPU and repaired.history[-1].gpus == (UUID,)
    never = dataclasses.replace(repairing, isolation=dataclasses.replace(isolation, effect=""))
    assert decide.complete_repair(never, True, 1500.0, 1).record.history[-1].scope == SCOPE_NODE


@pytest.fixture
def beta() -> Iterator[KubeClient]:
    yield from served(("v1beta2",))


def test_before_ga_a_gpu_in_no_slice_still_goes_to_the_device_plugin(beta: KubeClient) -> None:
    """A 1.36 cluster (DeviceTaintRule at v1beta2, ``before_ga = "node"``) whose GPU no DRA driver publishes: the
    slice decides, not the rule's version (a GPU in a slice there is node-level: test_drain_device_taint)."""
    other = "GPU-00000000-0000-0000-0000-000000000099"
    ctx = Ctx(beta, policy())
    rec = record(Isolation(SCOPE_GPU, other))
    DeviceTaintDrain().step(ctx, beta.get(NODES, NODE), rec)  # type: ignore[arg-type]
    after, cordon = last(ctx)
    assert not cordon and after.isolation is not None and after.isolation.by_device_plugin
    assert "in no ResourceSlice" in after.isolation.why
