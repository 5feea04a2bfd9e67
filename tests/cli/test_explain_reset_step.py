"""explain shows the reset sequence's step, how long it has lasted, and why a failed one failed."""

from __future__ import annotations

import dataclasses

from gpuremediate.fleet import explain
from gpuremediate.vocab.record import ActionInProgress, NodeRecord


def record(step: str, detail: str = "") -> NodeRecord:
    action = ActionInProgress(kind="reset-gpu", name="gpur-reset-gpu-n1-1", attempt=1, started=100.0,
                              deadline=400.0, detail=detail, step=step, step_since=110.0)
    return NodeRecord(state="repairing", since=100.0, action=action)


def test_explain_names_the_step_and_its_age() -> None:
    text = explain(record("operands-gone"), "n1", now=130.0)
    assert "  Step: operands-gone for 20s." in text
    assert "deadline in 4m" in text


def test_explain_says_why_the_step_failed() -> None:
    text = explain(record("failed", "operand pods still on the node after 300s: nvidia-dcgm-n1"), "n1", now=130.0)
    assert "Step: failed for 20s (operand pods still on the node after 300s: nvidia-dcgm-n1)." in text


def test_no_step_line_for_a_one_step_action() -> None:
    plain = NodeRecord(state="repairing", since=100.0,
                       action=ActionInProgress(kind="reboot", name="j", attempt=1, started=100.0))
    assert "Step:" not in explain(plain, "n1", now=130.0)


def test_explain_names_the_gpus_the_attempt_resets() -> None:
    chosen = record("reset")
    assert chosen.action is not None
    action = dataclasses.replace(chosen.action, gpu_ids=("1",), gpu_uuids=("GPU-81d866e6",))
    text = explain(dataclasses.replace(chosen, action=action), "n1", now=130.0)
    assert "  Resets GPU(s) 1 (GPU-81d866e6).\n" in text
    assert "Resets GPU" not in explain(record("reset"), "n1", now=130.0)
