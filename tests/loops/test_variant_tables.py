"""The drain and repair tables (issue 25): which variant takes which step, first match wins."""

from __future__ import annotations

import dataclasses

from gpuremediate.loops import drainers, repairs
from gpuremediate.loops.custom_drain import FALLBACK
from gpuremediate.policy.config import Policy, PolicyFile
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_REBOOT, ACTION_RESET_GPU
from gpuremediate.vocab.record import ActionInProgress, Fault, NodeRecord

NODE = {"metadata": {"name": "n1", "labels": {}}}


def _policy(**changes: object) -> Policy:
    policy = PolicyFile().for_node({})
    return dataclasses.replace(policy, **changes) if changes else policy


def _record(action: ActionInProgress | None = None) -> NodeRecord:
    fault = Fault(kind="xid", code="79", gpus=("n1/gpu0",), fingerprint="xid-79/gpu0", action=ACTION_RESET_GPU,
                  first_seen=1.0, last_seen=1.0, message="")
    return NodeRecord(state=states.REPAIRING, since=1.0, fault=fault, action=action, cordoned_by_us=True)


def test_each_repair_kind_has_its_row_and_any_other_kind_is_a_custom_resource() -> None:
    policy, record = _policy(), _record()
    assert repairs.select(policy, NODE, record, ACTION_RESET_GPU).kind == ACTION_RESET_GPU
    assert repairs.select(policy, NODE, record, ACTION_REBOOT).kind == ACTION_REBOOT
    assert repairs.select(policy, NODE, record, "rma-ticket").kind == "custom-resource"


def test_diagnostics_come_before_the_rung_when_due() -> None:
    policy = _policy()
    on = dataclasses.replace(policy, remediation=dataclasses.replace(
        policy.remediation, diagnostics=dataclasses.replace(policy.remediation.diagnostics, enabled=True)))
    assert repairs.select(on, NODE, _record(), ACTION_REBOOT).kind == "diagnostics"
    assert repairs.select(policy, NODE, _record(), ACTION_REBOOT).kind == ACTION_REBOOT


def test_a_reset_sequence_under_way_keeps_its_row() -> None:
    action = ActionInProgress(kind=ACTION_RESET_GPU, name="j", attempt=1, started=1.0, step="reset")
    assert repairs.select(_policy(), NODE, _record(action), ACTION_RESET_GPU).kind == "gpu-operator-reset"


def test_a_drain_plugin_drains_until_it_fell_back() -> None:
    policy = _policy()
    custom = dataclasses.replace(policy, customDrain=dataclasses.replace(policy.customDrain, enabled=True))
    drain = ActionInProgress(kind="drain", name="", attempt=1, started=1.0)
    assert drainers.select(policy, _record(drain)).kind == "eviction"
    assert drainers.select(custom, _record(drain)).kind == "drain-request"
    assert drainers.select(custom, _record(dataclasses.replace(drain, detail=FALLBACK))).kind == "eviction"
