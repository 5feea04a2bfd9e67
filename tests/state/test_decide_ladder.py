"""decide.complete_repair with an escalation ladder: retry within a rung, escalate to the next rung, quarantine
after the last, and the history that the repeat-offender rule reads."""

from __future__ import annotations

from gpuremediate.policy import safety
from gpuremediate.state import decide as d
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states as s

FAULT = r.Fault("xid", "79", ("GPU-1",), "xid-79/GPU-1", "reset-gpu", 1.0, 1.0, "XID 79")


def _repairing(kind: str = "reset-gpu", attempt: int = 1, rung: int = 0) -> r.NodeRecord:
    action = r.ActionInProgress(kind, f"job-{kind}-{attempt}", attempt, 5.0, rung=rung, created_at=5.0)
    return r.NodeRecord(state=s.REPAIRING, since=5.0, fault=FAULT, action=action, cordoned_by_us=True)


def test_a_failed_attempt_with_attempts_left_retries_on_the_same_rung() -> None:
    decision = d.complete_repair(_repairing(rung=1, kind="reboot"), False, 10.0, 2, "failed", next_action="rma")
    assert decision.escalation is None and decision.transition is None
    assert decision.record.action == r.ActionInProgress("reboot", "", 2, 10.0, rung=1)


def test_the_last_failed_attempt_of_a_rung_escalates_to_the_next_rung() -> None:
    decision = d.complete_repair(_repairing(attempt=2), False, 10.0, 2, "reset-gpu Job failed", next_action="reboot")
    assert decision.record.state == s.REPAIRING and decision.transition is None and decision.changed
    assert decision.record.action == r.ActionInProgress("reboot", "", 1, 10.0, rung=1)
    assert decision.escalation == d.Escalation("reset-gpu", "reboot", 1, decision.record.message)
    assert "escalating to reboot (rung 2)" in decision.record.message
    assert [(h.action, h.outcome) for h in decision.record.history] == [("reset-gpu", r.OUTCOME_ESCALATED)]


def test_the_last_rung_spent_quarantines_with_every_rung_in_history() -> None:
    rec = _repairing()
    rec = d.complete_repair(rec, False, 10.0, 1, next_action="reboot").record
    rec = r.start_action(rec, "reboot", "job-reboot-1", 1, 11.0)
    rec = d.complete_repair(rec, False, 20.0, 1, next_action="rma").record
    rec = r.start_action(rec, "rma", "rma-1", 1, 21.0)
    last = d.complete_repair(rec, False, 30.0, 1, "rma failed", next_action=None)
    assert last.record.state == s.QUARANTINED and last.transition is not None
    assert last.transition.reason == s.REPAIR_FAILED and last.escalation is None
    assert [(h.action, h.outcome) for h in last.record.history] == [
        ("reset-gpu", r.OUTCOME_ESCALATED), ("reboot", r.OUTCOME_ESCALATED), ("rma", r.OUTCOME_REPAIR_FAILED)]


def test_a_repair_on_a_later_rung_is_in_history_under_that_rung() -> None:
    rec = d.complete_repair(_repairing(), False, 10.0, 1, next_action="reboot").record
    ok = d.complete_repair(r.start_action(rec, "reboot", "job-reboot-1", 1, 11.0), True, 20.0, 1, "done")
    assert ok.record.state == s.VALIDATING
    assert [(h.action, h.outcome) for h in ok.record.history] == [
        ("reset-gpu", r.OUTCOME_ESCALATED), ("reboot", r.OUTCOME_REPAIRED)]


def test_one_escalated_flow_counts_once_for_the_repeat_offender_rule() -> None:
    """An escalation is a step of one flow, not a repair of its own: only the flow's end counts."""
    rec = d.complete_repair(_repairing(), False, 10.0, 1, next_action="reboot").record
    rec = d.complete_repair(r.start_action(rec, "reboot", "j", 1, 11.0), True, 20.0, 1).record
    assert not safety.repeat_offender(rec.history, 30.0, count=2, window_s=3600.0)
    assert safety.repeat_offender(rec.history, 30.0, count=1, window_s=3600.0)


def test_without_a_next_rung_it_behaves_as_before_ladders() -> None:
    first = d.complete_repair(_repairing(), False, 10.0, 2)
    assert first.record.action == r.ActionInProgress("reset-gpu", "", 2, 10.0)
    second = d.complete_repair(r.start_action(first.record, "reset-gpu", "j2", 2, 11.0), False, 20.0, 2)
    assert second.record.state == s.QUARANTINED and second.escalation is None
    assert [h.outcome for h in second.record.history] == [r.OUTCOME_REPAIR_FAILED]
