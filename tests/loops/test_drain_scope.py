"""The drain scope a fault's repairs need (loops/drain_scope.py): ``[drain].scope`` widened to every pod a rung of
the fault's ladder ends — a reboot every pod, a reset of every GPU every GPU pod — never narrowed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpuremediate.fleet import explain
from gpuremediate.loops.custom_drain import FALLBACK
from gpuremediate.loops.drain_scope import DrainScope, drain_scope
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import ActionInProgress, Fault, NodeRecord

GPU = "GPU-265c9814-6156-355b-e589-ff2064894f16"
OPERATOR = {"nvidia.com/gpu.deploy.device-plugin": "true"}
RMA = '''
[actions.rma]
apiGroup = "remediation.example.com"
kind = "RemediationRequest"
'''


def node(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-node-1", "labels": dict(labels)}}


def record(action: str, gpus: tuple[str, ...] = (GPU,)) -> NodeRecord:
    fault = Fault(kind="xid", code="48", gpus=gpus, fingerprint="xid/48", action=action, first_seen=1.0,
                  last_seen=1.0, message="")
    return NodeRecord(state=states.DRAINING, since=2.0, reason="fault", fault=fault, cordoned_by_us=True)


def scope(policy_text: str, labels: dict[str, str], rec: NodeRecord) -> DrainScope:
    policy = loads_policy(policy_text)
    return drain_scope(policy.for_node(labels), node(**labels), rec)


@pytest.mark.parametrize("configured", ["impacted", "gpu", "all"])
def test_a_reboot_drains_every_pod(configured: str) -> None:
    got = scope(f'[drain]\nscope = "{configured}"\n', {}, record("reboot"))
    assert got.scope == "all"
    assert (got.why == "") == (configured == "all"), got  # said only when it is wider than configured
    if configured != "all":
        assert got.why == "a reboot ends every pod on the node"


def test_a_reset_of_the_faulty_gpu_alone_keeps_the_configured_scope() -> None:
    assert scope('[drain]\nscope = "impacted"\n', OPERATOR, record("reset-gpu")) == DrainScope("impacted")


def test_a_reset_of_every_gpu_drains_every_gpu_pod_not_the_others() -> None:
    named_none = scope('[drain]\nscope = "impacted"\n', {}, record("reset-gpu", gpus=()))
    assert named_none == DrainScope("gpu", "the fault names no GPU: reset-gpu resets every GPU")
    v100 = {**OPERATOR, "nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB"}
    together = scope('[drain]\nscope = "impacted"\n', v100, record("reset-gpu"))
    assert together.scope == "gpu" and together.why.startswith("Tesla-V100-SXM2-32GB's GPUs reset only together")
    assert scope('[drain]\nscope = "all"\n', v100, record("reset-gpu")) == DrainScope("all")


def test_a_v100_without_the_gpu_operator_keeps_the_scope() -> None:
    """The bare reset (no operand deployed) resets the faulty GPUs alone whatever the product."""
    v100 = {"nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB"}
    assert scope('[drain]\nscope = "impacted"\n', v100, record("reset-gpu")) == DrainScope("impacted")


def test_a_ladder_that_ends_in_a_reboot_drains_for_the_reboot_first() -> None:
    policy = ('[drain]\nscope = "impacted"\n[remediation.ladders]\n'
              'reset-gpu = [{action = "reset-gpu"}, {action = "reboot"}]\n')
    got = scope(policy, OPERATOR, record("reset-gpu"))
    assert got == DrainScope("all", "a reboot ends every pod on the node (rung 2 of the ladder for reset-gpu)")


def test_a_custom_action_keeps_the_configured_scope() -> None:
    assert scope('[drain]\nscope = "gpu"\n' + RMA, {}, record("rma")) == DrainScope("gpu")


def test_a_record_without_a_fault_keeps_the_configured_scope() -> None:
    bare = NodeRecord(state=states.DRAINING, since=2.0, reason="fault")
    assert scope('[drain]\nscope = "impacted"\n', {}, bare) == DrainScope("impacted")


def test_a_group_scope_is_widened_too() -> None:
    policy = '[[groups]]\nselector = "pool=a"\n[groups.drain]\nscope = "gpu"\n'
    assert scope(policy, {"pool": "a"}, record("reboot")).scope == "all"
    assert scope(policy, {"pool": "b"}, record("reboot")) == DrainScope("all")


def drain_record(detail: str) -> NodeRecord:
    action = ActionInProgress(kind="drain", name="", attempt=1, started=100.0, detail=detail)
    return dataclasses.replace(record("reboot"), action=action)


def test_explain_says_why_the_scope_was_widened_and_nothing_when_it_was_not() -> None:
    widened = drain_scope(loads_policy('[drain]\nscope = "gpu"\n').for_node({}), node(), record("reboot"))
    text = explain(drain_record(widened.detail), "gpu-node-1", now=130.0)
    assert "  Drain scope all: a reboot ends every pod on the node.\n" in text
    assert "Drain" not in explain(drain_record(""), "gpu-node-1", now=130.0).replace("draining", "")


def test_explain_of_a_custom_drain_that_fell_back_does_not_read_as_a_scope() -> None:
    text = explain(drain_record(FALLBACK), "gpu-node-1", now=130.0)
    assert "the drain plugin gave up" in text and "builtin-fallback" not in text


@pytest.mark.parametrize("action", ["none", "quarantine"])
def test_a_maintenance_hold_drains_every_pod(action: str) -> None:
    held = dataclasses.replace(record(action), fault=dataclasses.replace(record(action).fault,  # type: ignore[arg-type]
                                                                         kind="maintenance"))
    got = scope('[drain]\nscope = "gpu"\n', {}, held)
    assert got.scope == "all" and got.why.startswith("a MaintenanceRequest hands the node over"), got


def test_a_maintenance_reset_drains_as_a_fault_does() -> None:
    reset = dataclasses.replace(record("reset-gpu"), fault=dataclasses.replace(record("reset-gpu").fault,  # type: ignore[arg-type]
                                                                               kind="maintenance"))
    assert scope('[drain]\nscope = "gpu"\n', OPERATOR, reset) == DrainScope("gpu")
