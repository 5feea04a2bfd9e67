"""A reboot Job's pod dies with the node it reboots: after the reboot the kubelet marks it Failed (restartPolicy
Never), so the Job fails even though the reboot happened. With reboot_wait_for_boot_id the bootID decides."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpuremediate.actions.jobs import FAILED
from gpuremediate.loops.jobs import TIMED_OUT
from gpuremediate.loops.remediate import RemediateLoop
from gpuremediate.policy.config import PolicyFile
from gpuremediate.policy.workflow import RemediationPolicy
from gpuremediate.state.decide import Decision
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_REBOOT
from gpuremediate.vocab.record import ActionInProgress, Fault, NodeRecord

NOW = 1000.0


def _node(boot: str, ready: bool) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "resourceVersion": "5"},
            "status": {"nodeInfo": {"bootID": boot},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _record() -> NodeRecord:
    fault = Fault(kind="xid", code="79", gpus=("n1/gpu0",), fingerprint="xid-79/gpu0", action=ACTION_REBOOT,
                  first_seen=900.0, last_seen=900.0, message="")
    action = ActionInProgress(kind=ACTION_REBOOT, name="gpur-reboot-n1-1", attempt=1, started=950.0,
                              deadline=NOW + 600, detail="boot-before")
    return NodeRecord(state=states.REPAIRING, since=950.0, fault=fault, action=action, cordoned_by_us=True)


def _loop(written: list[Decision], outcome: str = FAILED) -> RemediateLoop:
    loop = RemediateLoop.__new__(RemediateLoop)
    def apply(node: dict[str, Any], decision: Decision) -> dict[str, Any]:
        written.append(decision)
        return node

    writer = SimpleNamespace(dry_run=False, apply=apply)
    metrics = SimpleNamespace(remediation_seconds=SimpleNamespace(observe=lambda *a, **k: None))
    loop.ctx = SimpleNamespace(  # type: ignore[assignment]
        clock=lambda: NOW, writer=writer, metrics=metrics, events=SimpleNamespace(node_event=lambda *a, **k: None),
        policy_for=lambda node: SimpleNamespace(remediation=RemediationPolicy()), policy=PolicyFile(),
        breakers=SimpleNamespace(holds_in_flight=lambda in_flight: ""))  # never paused here
    loop.attempt_outcome = lambda action, recreate, note_created=None: outcome  # type: ignore[method-assign]
    return loop


def test_failed_reboot_job_after_the_node_rebooted_waits_for_ready() -> None:
    written: list[Decision] = []
    loop = _loop(written)
    assert loop.reconcile(_node("boot-after", ready=False), _record()) == 1.0
    assert written == []  # not a failed attempt: the node did reboot
    loop.reconcile(_node("boot-after", ready=True), _record())
    assert [d.record.state for d in written] == [states.VALIDATING]


def test_failed_reboot_job_on_a_node_that_never_went_down_is_a_failure() -> None:
    written: list[Decision] = []
    _loop(written).reconcile(_node("boot-before", ready=True), _record())
    assert len(written) == 1 and written[0].record.action is not None and written[0].record.action.attempt == 2


def test_reboot_job_past_its_active_deadline_while_the_node_is_down_waits() -> None:
    """The node stays down longer than the Job's activeDeadlineSeconds: the record's deadline (which adds
    reboot_ready_timeout_s) still decides."""
    written: list[Decision] = []
    assert _loop(written, TIMED_OUT).reconcile(_node("boot-before", ready=False), _record()) == 1.0
    assert written == []
