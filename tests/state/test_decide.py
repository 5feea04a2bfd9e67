"""Decisions: detect, dedupe (also across a restart), people, flow steps, malformed records."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.state import decide as d
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states as s
from gpuremediate.vocab.findings import Finding

DAY = 86400.0


def finding(
    action: str = "reboot", fp: str = "fp-79", kind: str = "xid", code: str = "79", urgent: bool = True
) -> Finding:
    return Finding("gpu-1", kind, code, ("GPU-aaa",), action, fp, f"{kind} {code}: {action}", urgent)


def restart(record: r.NodeRecord) -> r.NodeRecord:
    """What a freshly started controller reads back from the Node."""
    return r.decode(r.encode(record))


# ---- on_findings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "state", "reason"),
    [
        ("quarantine", s.QUARANTINED, "xid-79"),
        ("reboot", s.DRAINING, "xid-79"),
        ("reset-gpu", s.DRAINING, "xid-79"),
        ("my-vendor-fix", s.DRAINING, "xid-79"),
        ("cordon", s.CORDONED, "xid-79"),
    ],
)
def test_healthy_node_moves_and_is_cordoned_at_once(action: str, state: str, reason: str) -> None:
    decision = d.on_findings(None, [finding(action)], False, 100.0)
    assert decision.transition == d.Transition(s.HEALTHY, state, reason, f"xid 79: {action}")
    assert decision.cordon and decision.changed
    rec = decision.record
    assert (rec.state, rec.since, rec.cordoned_by_us, rec.was_unschedulable) == (state, 100.0, True, False)
    assert rec.fault is not None and rec.fault.fingerprint == "fp-79" and rec.fault.first_seen == 100.0


def test_action_none_is_a_notice_marked_handled_without_transition() -> None:
    f = finding("none", fp="fp-31", code="31")
    decision = d.on_findings(None, [f], False, 5.0)
    assert decision.transition is None and not decision.cordon
    assert decision.notices == (f,)
    assert decision.record.state == s.HEALTHY and decision.record.handled == ("fp-31",)
    again = d.on_findings(decision.record, [f], False, 6.0)
    assert again.notices == () and not again.changed


def test_no_findings_no_record_nothing_to_write() -> None:
    decision = d.on_findings(None, [], False, 5.0)
    assert not decision.changed and decision.transition is None


def test_node_a_person_cordoned_is_not_cordoned_again_and_remembered() -> None:
    decision = d.on_findings(None, [finding("reboot")], True, 100.0)
    assert not decision.cordon
    assert decision.record.was_unschedulable and not decision.record.cordoned_by_us
    assert not d.should_uncordon(decision.record)


def test_most_drastic_finding_wins() -> None:
    findings = [
        finding("cordon", fp="t", kind="thermal", code=""),
        finding("quarantine", fp="q", code="95"),
        finding("reset-gpu", fp="r", code="48"),
    ]
    decision = d.on_findings(None, findings, False, 1.0)
    assert decision.record.state == s.QUARANTINED and decision.record.fault.fingerprint == "q"  # type: ignore[union-attr]


def test_budget_full_records_blocked_but_still_cordons() -> None:
    opts = d.DecideOptions(budget_full=True, budget_detail="budget full: 2 of 2")
    decision = d.on_findings(None, [finding("reboot")], False, 7.0, opts)
    assert decision.cordon and decision.record.state == s.DRAINING
    assert decision.record.blocked == r.Blocked("budget", "budget full: 2 of 2", 7.0)


def test_open_breaker_starts_nothing_and_keeps_the_finding_new() -> None:
    opts = d.DecideOptions(breaker_open=True)
    decision = d.on_findings(None, [finding("reboot")], False, 7.0, opts)
    assert not decision.cordon and decision.transition is None
    blocked = decision.record.blocked
    assert decision.record.state == s.HEALTHY
    assert blocked is not None and (blocked.reason, blocked.since) == ("breaker", 7.0)
    assert "fp-79" not in decision.record.handled
    after_reset = d.on_findings(decision.record, [finding("reboot")], False, 9.0)
    assert after_reset.record.state == s.DRAINING and after_reset.record.blocked is None


def test_cordoned_escalates_to_draining_and_keeps_first_touch_facts() -> None:
    thermal = finding("cordon", fp="hot", kind="thermal", code="")
    cordoned = d.on_findings(None, [thermal], False, 1.0).record
    decision = d.on_findings(cordoned, [thermal, finding("reboot")], False, 2.0)
    assert decision.transition == d.Transition(s.CORDONED, s.DRAINING, "xid-79", "xid 79: reboot")
    assert not decision.cordon  # already ours
    assert decision.record.cordoned_by_us and not decision.record.was_unschedulable
    assert "hot" in decision.record.handled  # the superseded soft fault


def test_cordoned_ignores_another_cordon_finding() -> None:
    cordoned = d.on_findings(None, [finding("cordon", fp="a", kind="thermal", code="")], False, 1.0).record
    decision = d.on_findings(cordoned, [finding("cordon", fp="b", kind="thermal", code="")], False, 2.0)
    assert not decision.changed and decision.transition is None


@pytest.mark.parametrize("state", [s.DRAINING, s.REPAIRING, s.VALIDATING, s.QUARANTINED, s.MAINTENANCE])
def test_detect_does_not_act_on_nodes_owned_by_other_loops(state: str) -> None:
    record = r.NodeRecord(state=state, since=1.0)
    decision = d.on_findings(record, [finding("quarantine", fp="new")], False, 2.0)
    assert decision.record == record and not decision.changed


def _history(*ats: float) -> tuple[r.HistoryEntry, ...]:
    return tuple(r.HistoryEntry(at, "xid", "79", "reboot", r.OUTCOME_REPAIRED) for at in ats)


def test_repeat_offender_goes_to_quarantine_instead_of_draining() -> None:
    now = 10 * DAY
    record = r.NodeRecord(since=0.0, history=_history(now - 6 * DAY, now - DAY, now - 60))
    decision = d.on_findings(record, [finding("reboot")], False, now)
    assert decision.transition == d.Transition(s.HEALTHY, s.QUARANTINED, s.REPEAT_OFFENDER, "xid 79: reboot")
    assert decision.cordon


def test_old_repairs_do_not_make_a_repeat_offender() -> None:
    now = 10 * DAY
    record = r.NodeRecord(since=0.0, history=_history(now - 8 * DAY, now - DAY, now - 60))
    assert d.on_findings(record, [finding("reboot")], False, now).record.state == s.DRAINING


def test_repeat_offender_window_is_configurable() -> None:
    now = 10 * DAY
    record = r.NodeRecord(history=_history(now - 3, now - 2))
    opts = d.DecideOptions(repeat_count=2, repeat_window_s=60)
    assert d.on_findings(record, [finding("reboot")], False, now, opts).record.reason == s.REPEAT_OFFENDER


# ---- dedupe ---------------------------------------------------------------------------------


def test_new_findings_drops_handled_open_and_duplicates() -> None:
    record = r.NodeRecord(state=s.CORDONED, handled=("old",), fault=d.fault_from_finding(finding(fp="open"), 1.0))
    fs = [finding(fp="old"), finding(fp="open"), finding(fp="new"), finding(fp="new")]
    assert [f.fingerprint for f in d.new_findings(record, fs)] == ["new"]
    assert [f.fingerprint for f in d.new_findings(None, fs)] == ["old", "open", "new"]


def test_prune_handled_forgets_vanished_fingerprints() -> None:
    record = r.NodeRecord(handled=("a", "b", "c"))
    assert d.prune_handled(record, [finding(fp="b")]).handled == ("b",)
    assert d.prune_handled(record, [finding(fp=x) for x in "abc"]) is record


def _full_repair(now: float) -> r.NodeRecord:
    """A node taken through draining → repairing → validating → healthy for fp-79."""
    rec = d.on_findings(None, [finding("reboot")], False, now).record
    rec = d.complete_drain(rec, now + 10).record
    rec = d.complete_repair(rec, True, now + 20, max_attempts=3).record
    return d.complete_validation(rec, True, now + 30).record


def test_sticky_stale_xid_after_repair_is_not_a_new_fault_even_after_restart() -> None:
    healthy = _full_repair(100.0)
    assert healthy.state == s.HEALTHY and "fp-79" in healthy.handled
    stale = [finding("reboot")]  # the exporter still shows the last XID
    for rec in (healthy, restart(healthy)):
        rec = d.prune_handled(rec, stale)
        decision = d.on_findings(rec, stale, False, 200.0)
        assert decision.transition is None and not decision.changed


def test_same_xid_after_the_stale_value_went_away_is_a_new_fault() -> None:
    healthy = restart(_full_repair(100.0))
    cleared = d.prune_handled(healthy, [])  # exporter restarted after the reboot
    decision = d.on_findings(cleared, [finding("reboot")], False, 300.0)
    assert decision.record.state == s.DRAINING


FINDING_SETS = st.lists(
    st.builds(
        finding,
        action=st.sampled_from(["none", "cordon", "reboot", "reset-gpu", "quarantine", "custom-x"]),
        fp=st.sampled_from(["f1", "f2", "f3", "f4"]),
        code=st.sampled_from(["79", "48", "13"]),
    ),
    max_size=4,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(FINDING_SETS, min_size=1, max_size=5), st.booleans())
def test_restart_at_any_point_gives_the_same_decisions(rounds: list[list[Finding]], unschedulable: bool) -> None:
    kept: r.NodeRecord | None = None
    restarted: r.NodeRecord | None = None
    for i, findings in enumerate(rounds):
        a = d.on_findings(kept, findings, unschedulable, float(i))
        b = d.on_findings(restarted, findings, unschedulable, float(i))
        assert a == b
        kept, restarted = a.record, restart(a.record)


# ---- people ---------------------------------------------------------------------------------


def test_person_uncordon_detection() -> None:
    ours = d.on_findings(None, [finding("reboot")], False, 1.0).record
    assert d.person_uncordoned(ours, node_unschedulable=False)
    assert not d.person_uncordoned(ours, node_unschedulable=True)
    assert not d.person_uncordoned(None, False)
    assert not d.person_uncordoned(r.NodeRecord(), False)


@pytest.mark.parametrize("state", [s.CORDONED, s.DRAINING, s.VALIDATING, s.MAINTENANCE])
def test_person_uncordon_mid_flow_stops_work_for_that_fault(state: str) -> None:
    fault = d.fault_from_finding(finding("reboot"), 1.0)
    action = r.ActionInProgress("drain", "n", 1, 2.0)
    record = r.NodeRecord(state=state, fault=fault, action=action, cordoned_by_us=True)
    decision = d.on_person_uncordoned(record, 50.0)
    rec = decision.record
    assert decision.transition == d.Transition(state, s.HEALTHY, s.PERSON_UNCORDONED, "a person uncordoned the node")
    assert rec.stopped and "fp-79" in rec.handled and rec.fault is None and rec.action is None
    assert not decision.uncordon and not decision.cordon and decision.cancel == action
    assert rec.history[-1].outcome == r.OUTCOME_STOPPED
    # the same stale finding later does not start the flow again (also after a restart)
    again = d.on_findings(restart(rec), [finding("reboot")], False, 60.0)
    assert again.transition is None


def test_person_uncordon_of_a_quarantined_node_keeps_it_flagged_but_never_ours_to_uncordon() -> None:
    record = r.NodeRecord(state=s.QUARANTINED, fault=d.fault_from_finding(finding(), 1.0), cordoned_by_us=True)
    decision = d.on_person_uncordoned(record, 5.0)
    assert decision.transition is None and decision.record.state == s.QUARANTINED and decision.changed
    assert not d.person_uncordoned(decision.record, False)  # noticed once
    released = d.release(decision.record, 6.0, "alice")
    assert not d.complete_validation(released, True, 7.0).uncordon  # a later cordon is the person's


def test_person_uncordon_during_repair_lets_the_repair_finish_but_never_uncordons() -> None:
    record = r.NodeRecord(state=s.REPAIRING, fault=d.fault_from_finding(finding(), 1.0), cordoned_by_us=True)
    decision = d.on_person_uncordoned(record, 5.0)
    assert decision.transition is None and decision.record.state == s.REPAIRING
    assert not d.person_uncordoned(decision.record, False)  # idempotent: noticed once
    rec = d.complete_repair(decision.record, True, 6.0, 3).record
    assert not d.complete_validation(rec, True, 7.0).uncordon


def test_person_uncordon_of_healthy_node_is_nothing() -> None:
    assert not d.on_person_uncordoned(r.NodeRecord(), 1.0).changed


@pytest.mark.parametrize(
    ("ours", "before", "expected"),
    [(True, False, True), (False, True, False), (True, True, False), (False, False, False)],
)
def test_should_uncordon(ours: bool, before: bool, expected: bool) -> None:
    assert d.should_uncordon(r.NodeRecord(cordoned_by_us=ours, was_unschedulable=before)) is expected


# ---- flow steps -----------------------------------------------------------------------------


def _draining(action: str = "reboot") -> r.NodeRecord:
    return d.on_findings(None, [finding(action)], False, 1.0).record


def test_complete_drain_goes_to_repairing_or_validating() -> None:
    assert d.complete_drain(_draining(), 5.0).record.state == s.REPAIRING
    no_repair = dataclasses.replace(_draining(), fault=dataclasses.replace(_draining().fault, action="none"))  # type: ignore[type-var]
    decision = d.complete_drain(no_repair, 5.0)
    assert decision.transition == d.Transition(s.DRAINING, s.VALIDATING, s.DRAIN_COMPLETE, "drain complete")


def test_drain_failed_quarantines() -> None:
    decision = d.drain_failed(_draining(), 5.0, "pdb ns/x blocked for 1h")
    assert decision.record.state == s.QUARANTINED and decision.record.message == "pdb ns/x blocked for 1h"
    assert not decision.uncordon


def test_complete_repair_retries_then_quarantines() -> None:
    rec = d.complete_drain(_draining(), 5.0).record
    rec = r.start_action(rec, "reboot", "job-1", 1, 6.0)
    first = d.complete_repair(rec, False, 10.0, max_attempts=2)
    assert first.transition is None and first.record.action == r.ActionInProgress("reboot", "", 2, 10.0)
    second = d.complete_repair(r.start_action(first.record, "reboot", "job-2", 2, 11.0), False, 20.0, max_attempts=2)
    assert second.transition is not None and second.transition.reason == s.REPAIR_FAILED
    assert second.record.state == s.QUARANTINED
    assert [e.outcome for e in second.record.history] == [r.OUTCOME_REPAIR_FAILED]


def test_complete_repair_ok_records_history_and_validates() -> None:
    rec = d.complete_drain(_draining(), 5.0).record
    decision = d.complete_repair(rec, True, 9.0, 3)
    assert decision.record.state == s.VALIDATING and decision.record.history[-1].at == 9.0
    assert decision.record.history[-1].outcome == r.OUTCOME_REPAIRED


def test_validation_pass_uncordons_only_our_cordon() -> None:
    ours = d.complete_repair(d.complete_drain(_draining(), 2.0).record, True, 3.0, 3).record
    passed = d.complete_validation(ours, True, 4.0)
    assert passed.uncordon and passed.record.state == s.HEALTHY
    assert not passed.record.cordoned_by_us and passed.record.fault is None
    persons = d.on_findings(None, [finding()], True, 1.0).record
    persons = d.complete_repair(d.complete_drain(persons, 2.0).record, True, 3.0, 3).record
    assert not d.complete_validation(persons, True, 4.0).uncordon


def test_validation_failure_quarantines_and_keeps_the_cordon() -> None:
    rec = d.complete_repair(d.complete_drain(_draining(), 2.0).record, True, 3.0, 3).record
    failed = d.complete_validation(rec, False, 4.0, "dcgmi diag failed")
    assert failed.record.state == s.QUARANTINED and failed.record.reason == s.VALIDATION_FAILED
    assert not failed.uncordon and failed.record.cordoned_by_us


def test_release_then_validation() -> None:
    rec = d.complete_validation(
        d.complete_repair(d.complete_drain(_draining(), 2.0).record, True, 3.0, 3).record, False, 4.0
    ).record
    released = d.release(rec, 10.0, by="alice")
    assert (released.state, released.reason, released.message) == (s.VALIDATING, s.RELEASED, "released by alice")
    assert d.complete_validation(released, True, 11.0).uncordon
    with pytest.raises(s.IllegalTransition):
        d.release(r.NodeRecord(state=s.DRAINING), 10.0, "alice")


def test_thermal_clear() -> None:
    cordoned = d.on_findings(None, [finding("cordon", fp="hot", kind="thermal", code="")], False, 1.0).record
    decision = d.thermal_cleared(cordoned, 100.0)
    assert decision.transition == d.Transition(s.CORDONED, s.HEALTHY, s.THERMAL_CLEARED, decision.record.message)
    assert decision.uncordon and "hot" in decision.record.handled
    persons = d.on_findings(None, [finding("cordon", fp="hot", kind="thermal", code="")], True, 1.0).record
    assert not d.thermal_cleared(persons, 100.0).uncordon


def mr_fault(action: str = "none", fp: str = "maintenance/mr-1/uid-1") -> r.Fault:
    return r.Fault(d.MAINTENANCE_KIND, "", (), fp, action, 1.0, 1.0, "planned")


def test_maintenance_flow() -> None:
    held = d.enter_maintenance(None, mr_fault(), False, 1.0)
    assert held.record.state == s.MAINTENANCE and not held.cordon
    assert not d.is_maintenance_held(held.record)  # entered, not drained yet
    started = d.start_maintenance(held.record, False, 5.0)
    assert started.cordon and started.record.state == s.DRAINING
    ended = d.end_maintenance(started.record, 7.0)
    assert ended.uncordon and ended.record.state == s.HEALTHY


def test_maintenance_none_is_held_after_its_drain_and_validated_after_the_request_ends() -> None:
    started = d.start_maintenance(d.enter_maintenance(None, mr_fault(), False, 1.0).record, False, 5.0).record
    drained = d.complete_drain(started, 6.0)
    assert drained.transition == d.Transition(s.DRAINING, s.MAINTENANCE, s.DRAIN_COMPLETE, drained.record.message)
    assert d.is_maintenance_held(drained.record) and drained.record.cordoned_by_us
    held = restart(drained.record)
    assert d.is_maintenance_held(held)
    ended = d.maintenance_request_deleted(held, "maintenance/mr-1/uid-1", 9.0)
    assert ended.record.state == s.VALIDATING and ended.record.reason == s.MAINTENANCE_COMPLETE
    assert not ended.uncordon  # validation uncordons, not the deletion
    passed = d.complete_validation(ended.record, True, 10.0)
    assert passed.uncordon and passed.record.state == s.HEALTHY
    assert "maintenance/mr-1/uid-1" in passed.record.handled


def test_a_fault_that_is_not_maintenance_still_validates_after_a_drain_without_repair() -> None:
    rec = r.NodeRecord(state=s.DRAINING, fault=dataclasses.replace(mr_fault(), kind="xid", code="13"))
    assert d.complete_drain(rec, 2.0).record.state == s.VALIDATING


@pytest.mark.parametrize(
    ("action", "after"), [("reboot", s.REPAIRING), ("reset-gpu", s.REPAIRING), ("vendor-fix", s.REPAIRING),
                          ("quarantine", s.QUARANTINED)]
)
def test_maintenance_with_a_repair_action_goes_on_after_its_drain(action: str, after: str) -> None:
    started = d.start_maintenance(d.enter_maintenance(None, mr_fault(action), False, 1.0).record, False, 5.0)
    assert d.complete_drain(started.record, 6.0).record.state == after


def test_request_deleted_before_or_during_the_drain_returns_the_node_at_once() -> None:
    entered = d.enter_maintenance(None, mr_fault("reboot"), False, 1.0).record
    assert d.maintenance_request_deleted(entered, "maintenance/mr-1/uid-1", 2.0).record.state == s.HEALTHY
    draining = d.start_maintenance(entered, False, 3.0).record
    draining = r.start_action(draining, "drain", "", 1, 3.5)
    ended = d.maintenance_request_deleted(draining, "maintenance/mr-1/uid-1", 4.0)
    assert ended.record.state == s.HEALTHY and ended.uncordon and ended.cancel == draining.action
    assert ended.record.reason == s.MAINTENANCE_CANCELLED


def test_request_deleted_on_a_node_a_person_cordoned_never_uncordons() -> None:
    entered = d.enter_maintenance(None, mr_fault(), True, 1.0).record
    draining = d.start_maintenance(entered, True, 3.0)
    assert not draining.cordon
    ended = d.maintenance_request_deleted(draining.record, "maintenance/mr-1/uid-1", 4.0)
    assert ended.record.state == s.HEALTHY and not ended.uncordon


@pytest.mark.parametrize("state", [s.REPAIRING, s.VALIDATING])
def test_request_deleted_mid_remediation_lets_it_finish(state: str) -> None:
    rec = r.NodeRecord(state=state, reason="x", fault=mr_fault("reboot"), cordoned_by_us=True)
    decision = d.maintenance_request_deleted(rec, "maintenance/mr-1/uid-1", 5.0)
    assert not decision.changed and decision.record == rec


def test_request_deleted_releases_only_its_own_quarantine() -> None:
    started = d.start_maintenance(d.enter_maintenance(None, mr_fault("quarantine"), False, 1.0).record, False, 2.0)
    quarantined = d.complete_drain(started.record, 3.0).record
    released = d.maintenance_request_deleted(quarantined, "maintenance/mr-1/uid-1", 4.0)
    assert released.record.state == s.VALIDATING and released.record.reason == s.RELEASED
    failed = r.NodeRecord(state=s.QUARANTINED, reason=s.VALIDATION_FAILED, fault=mr_fault("reboot"))
    assert not d.maintenance_request_deleted(failed, "maintenance/mr-1/uid-1", 4.0).changed


def test_a_recreated_request_never_touches_its_predecessors_work() -> None:
    started = d.start_maintenance(d.enter_maintenance(None, mr_fault(), False, 1.0).record, False, 2.0).record
    held = d.complete_drain(started, 3.0).record
    same_name_new_uid = "maintenance/mr-1/uid-2"
    assert not d.maintenance_request_deleted(held, same_name_new_uid, 4.0).changed


# ---- malformed records ----------------------------------------------------------------------


def test_malformed_record_on_unschedulable_node_is_held_never_uncordoned() -> None:
    decision = d.on_malformed(r.RecordError("bad"), node_unschedulable=True, now=5.0)
    rec = decision.record
    assert rec.state == s.QUARANTINED and rec.reason == s.RECORD_MALFORMED and rec.was_unschedulable
    assert not decision.uncordon and not d.should_uncordon(rec)
    released = d.release(rec, 6.0, "bob")
    assert not d.complete_validation(released, True, 7.0).uncordon  # a person uncordons it


def test_malformed_record_on_schedulable_node_starts_over_and_says_so() -> None:
    decision = d.on_malformed(r.RecordError("bad"), node_unschedulable=False, now=5.0)
    rec = decision.record
    assert rec.state == s.HEALTHY and rec.fault is None and rec.action is None and not rec.cordoned_by_us
    assert decision.changed and not decision.uncordon
    move = decision.transition  # the writer logs and Events it: the replacement is never silent
    assert move is not None and move.from_state == d.UNREADABLE and move.reason == s.RECORD_MALFORMED
    assert "bad" in move.message and "replaced" in move.message


def test_prune_keeps_a_maintenance_requests_fingerprint() -> None:
    """No source ever reports a MaintenanceRequest's fault: pruning it after the flow would hide the finished
    request from the maintenance loop (never Completed, the claim never released)."""
    rec = r.add_handled(r.NodeRecord(), "maintenance/mr-1/uid-1", "xid/gpu0/79")
    assert d.prune_handled(rec, []).handled == ("maintenance/mr-1/uid-1",)


def _through(opened: r.NodeRecord, now: float) -> r.NodeRecord:
    rec = d.complete_drain(opened, now + 10).record
    rec = d.complete_repair(rec, True, now + 20, max_attempts=3).record
    return d.complete_validation(rec, True, now + 30).record


def test_findings_the_repair_covers_are_handled_with_it_not_a_second_repair_after_it() -> None:
    """The agent's GPUHealthy=False for the same XID keeps its fingerprint while it stays False, and a second
    XID stays in the gauge: whichever finding opens the reboot, the others it repairs are handled with it, so
    the returned node does not drain again for them."""
    xid = finding("reboot", fp="xid/GPU-aaa/79")
    condition = Finding("gpu-1", "condition", "GPUHealthy", ("GPU-aaa",), "reboot",
                        "condition:GPUHealthy:False:NeedsReboot:2026-12-01T07:00:00Z", "GPUHealthy=False")
    other_gpu = Finding("gpu-1", "xid", "48", ("GPU-bbb",), "reset-gpu", "xid/GPU-bbb/48", "XID 48")
    found = [xid, condition, other_gpu]
    opened = d.on_findings(None, found, False, 100.0).record
    assert opened.fault is not None and opened.fault.action == "reboot"
    healthy = _through(opened, 100.0)
    assert d.new_findings(d.prune_handled(healthy, found), found) == []


def test_a_reset_of_one_gpu_leaves_another_gpus_fault_new() -> None:
    this_gpu = Finding("gpu-1", "xid", "48", ("GPU-aaa",), "reset-gpu", "xid/GPU-aaa/48", "XID 48")
    same_gpu = Finding("gpu-1", "ecc-dbe", "ecc_dbe_volatile", ("GPU-aaa",), "reset-gpu", "ecc/GPU-aaa", "DBE")
    other_gpu = Finding("gpu-1", "xid", "48", ("GPU-bbb",), "reset-gpu", "xid/GPU-bbb/48", "XID 48")
    worse = Finding("gpu-1", "row-remap-failure", "x", ("GPU-aaa",), "quarantine", "rr/GPU-aaa", "remap failed")
    found = [this_gpu, same_gpu, other_gpu]
    healthy = _through(d.on_findings(None, found, False, 100.0).record, 100.0)
    assert d.new_findings(d.prune_handled(healthy, found), found) == [other_gpu]
    assert not d.covers(this_gpu, worse)  # needing more than a reset: never handled by one
    hot = Finding("gpu-1", "thermal", "gpu_temp", ("GPU-aaa",), "cordon", "thermal/GPU-aaa", "too hot")
    reboot = Finding("gpu-1", "xid", "79", ("GPU-aaa",), "reboot", "xid/GPU-aaa/79", "XID 79")
    assert not d.covers(reboot, hot)  # a reboot does not cool a GPU: still hot after it, it is cordoned
