"""GPU-level isolation in the pure decisions: the record's ``isolation``, no cordon, escalation to node-level,
the return, the history's scope, and the codec (old records parse)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpuremediate.state import decide
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_CORDON, ACTION_REBOOT, ACTION_RESET_GPU, Finding
from gpuremediate.vocab.record import (
    SCOPE_GPU,
    SCOPE_NODE,
    ActionInProgress,
    Isolation,
    NodeRecord,
    RecordError,
    decode,
    encode,
    isolated_at_gpu,
)

GPU3, GPU5 = "GPU-3", "GPU-5"
GPU_LEVEL = decide.DecideOptions(isolation=lambda f: "")


def finding(gpu: str, action: str = ACTION_RESET_GPU, code: str = "48") -> Finding:
    return Finding("n1", "xid", code, (gpu,), action, f"xid:{code}:{gpu}", f"XID {code} on {gpu}")


def isolated(state: str = states.REPAIRING) -> NodeRecord:
    opened = decide.on_findings(None, [finding(GPU3)], False, 100.0, GPU_LEVEL).record
    placed = dataclasses.replace(opened.isolation, rule="gpur-n1-gpu-3-abc", device="gpu-3", effect="NoExecute")
    action = ActionInProgress(kind=ACTION_RESET_GPU, name="reset-n1-1", attempt=1, started=110.0)
    return dataclasses.replace(opened, state=state, isolation=placed, action=action)


def test_scope_node_is_unchanged_no_isolation_recorded() -> None:
    d = decide.on_findings(None, [finding(GPU3)], False, 100.0)
    assert d.record.state == states.DRAINING and d.cordon and d.record.isolation is None


def test_a_one_gpu_reset_is_isolated_without_a_cordon() -> None:
    d = decide.on_findings(None, [finding(GPU3)], False, 100.0, GPU_LEVEL)
    assert d.record.state == states.DRAINING and not d.cordon and not d.record.cordoned_by_us
    assert d.record.isolation == Isolation(SCOPE_GPU, uuid=GPU3)
    assert "GPU GPU-3 isolated alone" in d.record.message


def test_a_node_level_verdict_cordons_and_says_why() -> None:
    opts = decide.DecideOptions(isolation=lambda f: "the node has MIG GPUs")
    d = decide.on_findings(None, [finding(GPU3)], False, 100.0, opts)
    assert d.cordon and d.record.isolation == Isolation(SCOPE_NODE, why="the node has MIG GPUs")
    assert d.record.message.endswith("node-level: the node has MIG GPUs")


def test_a_cordoned_node_goes_node_level() -> None:
    hot = decide.on_findings(None, [finding(GPU5, ACTION_CORDON, "temp")], False, 100.0, GPU_LEVEL).record
    d = decide.on_findings(hot, [finding(GPU3)], True, 200.0, GPU_LEVEL)
    assert d.record.isolation is not None and not d.record.isolation.at_gpu
    assert "cordoned already" in d.record.isolation.why


def test_another_gpu_failing_while_one_is_isolated_goes_node_level() -> None:
    record = isolated()
    d = decide.on_findings(record, [finding(GPU5)], False, 200.0, GPU_LEVEL)
    assert d.record.state == states.DRAINING and d.transition is not None and d.transition.from_state == "repairing"
    assert d.cordon and d.record.cordoned_by_us and d.record.action is None
    assert d.record.fault is not None and d.record.fault.gpus == (GPU3, GPU5), "both GPUs reset, node-level"
    assert d.record.isolation is not None and d.record.isolation.scope == SCOPE_NODE
    assert d.record.isolation.rule == "gpur-n1-gpu-3-abc", "the rule stays until the node is validated"
    assert d.cancel == record.action, "the running reset Job goes"
    assert d.escalation is not None and d.escalation.from_action == decide.ISOLATE_GPU
    assert "xid:48:GPU-3" in d.record.handled
    assert d.record.history[-1].scope == SCOPE_GPU and d.record.history[-1].gpus == (GPU3,)


def test_escalation_while_draining_is_no_transition() -> None:
    record = dataclasses.replace(isolated(states.DRAINING), action=ActionInProgress("drain", "", 1, 110.0))
    d = decide.on_findings(record, [finding(GPU5, ACTION_REBOOT, "79")], False, 200.0, GPU_LEVEL)
    assert d.transition is None and d.changed and d.cordon and d.record.state == states.DRAINING
    assert d.record.action is None, "admitted again, node-level"
    assert d.record.fault is not None and d.record.fault.action == ACTION_REBOOT


def test_the_isolated_gpus_own_second_xid_is_handled_with_it() -> None:
    record = isolated()
    d = decide.on_findings(record, [finding(GPU3, code="63")], False, 200.0, GPU_LEVEL)
    assert not d.cordon and d.record.state == states.REPAIRING and isolated_at_gpu(d.record)
    assert "xid:63:GPU-3" in d.record.handled


def test_a_soft_finding_waits_for_the_flow_to_end() -> None:
    d = decide.on_findings(isolated(), [finding(GPU5, ACTION_CORDON, "temp")], False, 200.0, GPU_LEVEL)
    assert not d.changed and not d.cordon


def test_the_return_clears_the_isolation_and_keeps_the_scope_in_history() -> None:
    repaired = decide.complete_repair(isolated(), True, 200.0, 2).record
    assert repaired.history[-1].scope == SCOPE_GPU and repaired.history[-1].gpus == (GPU3,)
    done = decide.complete_validation(repaired, True, 300.0)
    assert done.record.state == states.HEALTHY and done.record.isolation is None and not done.uncordon


def test_the_record_round_trips_and_old_records_parse() -> None:
    record = isolated()
    assert decode(encode(record)) == record
    old = json.loads(encode(record))
    del old["isolation"]
    for entry in old["history"]:
        entry.pop("scope", None)
        entry.pop("gpus", None)
    assert decode(json.dumps(old)).isolation is None


def test_a_bad_isolation_scope_names_the_field() -> None:
    data = json.loads(encode(isolated()))
    data["isolation"]["scope"] = "rack"
    with pytest.raises(RecordError, match=r"record\.isolation\.scope must be node or gpu, got 'rack'"):
        decode(json.dumps(data))
