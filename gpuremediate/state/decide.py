"""Pure decisions for the control loops: given a record and what was observed, what happens next.

Every function takes the current :class:`NodeRecord` (``None`` = a node we never touched) and
``now`` (unix seconds) and returns a :class:`Decision` (or a record, for ``release``). Nothing here
does I/O. A loop applies a Decision in this order:

1. if ``decision.changed``: write ``node_patch(decision.record, unschedulable=..., resource_version=...)``
   (put ``unschedulable=True`` in that same patch when ``decision.cordon``); a 409 means re-read
   the node and decide again;
2. then the side effects: ``decision.uncordon`` → set ``spec.unschedulable=false``;
   ``decision.cancel`` → delete that object (a person took the node back); an Event and the
   ``transitions_total`` metric for ``decision.transition``; an Event per ``decision.notices``.

Detect loop (nodes in healthy / cordoned), per scrape of a node whose readings are ``ok``::

    if person_uncordoned(record, unschedulable): apply(on_person_uncordoned(record, now))
    record = prune_handled(record, findings)            # only with a successful read!
    apply(on_findings(record, findings, unschedulable, now, opts))

Other loops: ``complete_drain``, ``drain_failed``, ``complete_repair``, ``complete_validation``,
``thermal_cleared``, ``release`` (CLI), ``enter_maintenance`` / ``start_maintenance`` /
``end_maintenance``. A node whose record cannot be read goes through ``on_malformed``: we never
uncordon a node on a guess.

Dedupe: level-triggered findings (a sticky XID gauge) repeat every scrape. ``new_findings`` drops
those whose fingerprint is the open fault's or in ``record.handled``; the handled list is part of
the record on the Node, so the dedupe survives a controller restart. ``prune_handled`` forgets a
fingerprint once its finding disappears (the exporter restarted), so the same XID later is new.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuremediate.policy import safety
from gpuremediate.policy.conditions import KIND_CONDITION
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import (
    ACTION_CORDON,
    ACTION_DRAIN,
    ACTION_NONE,
    ACTION_QUARANTINE,
    ACTION_REBOOT,
    ACTION_RESET_GPU,
    Finding,
    severity,
)
from gpuremediate.vocab.findings import worst as worst_finding
from gpuremediate.vocab.record import (
    BLOCK_BREAKER,
    BLOCK_BUDGET,
    EFFECT_UNHEALTHY,
    OUTCOME_ESCALATED,
    OUTCOME_REPAIR_FAILED,
    OUTCOME_REPAIRED,
    OUTCOME_STOPPED,
    SCOPE_GPU,
    SCOPE_NODE,
    ActionInProgress,
    Fault,
    HistoryEntry,
    Isolation,
    NodeRecord,
    RecordError,
    add_handled,
    add_history,
    block,
    isolated_at_gpu,
    transition,
)

DETECT_STATES = frozenset({states.HEALTHY, states.CORDONED})
ISOLATE_GPU = "isolate-gpu"  # Escalation.from_action of a GPU-level isolation gone node-level


@dataclass(frozen=True)
class DecideOptions:
    """What the detect loop knows beyond the node: policy knobs and the fleet's safety state."""

    repeat_count: int = safety.DEFAULT_REPEAT_COUNT
    repeat_window_s: float = safety.DEFAULT_REPEAT_WINDOW_S
    budget_full: bool = False  # safety.budget_check said no for this node
    budget_detail: str = ""  # its reason, kept in record.blocked.detail
    breaker_open: bool = False  # start no new work (not even a cordon)
    # ``[isolation] scope = "gpu"``: why a finding that opens a repair is node-level ("" = its GPU alone is taken
    # out, policy.isolation.node_level_reason); None: node-level, nothing recorded (scope "node").
    isolation: Callable[[Finding], str] | None = None


@dataclass(frozen=True)
class Transition:
    from_state: str
    to_state: str
    reason: str
    message: str


@dataclass(frozen=True)
class Escalation:
    """A ladder rung's attempts all failed: the flow goes on with the next rung's action."""

    from_action: str
    to_action: str
    to_rung: int  # 0-based index of the rung now current
    message: str


@dataclass(frozen=True)
class Decision:
    record: NodeRecord  # the record to write (equal to the input when nothing changed)
    changed: bool  # the record differs from the stored one: write it
    transition: Transition | None = None
    cordon: bool = False  # set spec.unschedulable=true (in the same patch as the record)
    uncordon: bool = False  # set spec.unschedulable=false after the record is written
    cancel: ActionInProgress | None = None  # the running action to clean up (person took over)
    notices: tuple[Finding, ...] = ()  # action-none findings: an Event each, nothing else
    kept_cordoned: bool = False  # an uncordon the writer left out: a person said keep it cordoned
    # complete_repair moved to the next ladder rung (an Event, a metric); or on_findings made a GPU-level isolation
    # node-level (from_action ISOLATE_GPU: an Event)
    escalation: Escalation | None = None
    untaint: str = ""  # a taint key taken off the node in the same patch (a new node's startup taint, validated)


def fresh_record(now: float) -> NodeRecord:
    """The record of a node we never touched."""
    return NodeRecord(state=states.HEALTHY, since=now)


def _decide(before: NodeRecord | None, after: NodeRecord, *, moved: bool = False, **fields: object) -> Decision:
    """A Decision; ``moved``: ``after`` came out of ``transition`` (report it)."""
    base = before if before is not None else fresh_record(after.since)
    move = Transition(base.state, after.state, after.reason, after.message) if moved else None
    return Decision(record=after, changed=after != base, transition=move, **fields)  # type: ignore[arg-type]


def _moved(before: NodeRecord | None, after: NodeRecord, **fields: object) -> Decision:
    return _decide(before, after, moved=True, **fields)


# ---- dedupe -------------------------------------------------------------------------------------


def new_findings(record: NodeRecord | None, findings: Sequence[Finding]) -> list[Finding]:
    """Findings not yet dealt with: not the open fault, not handled, each fingerprint once."""
    seen: set[str] = set()
    if record is not None:
        seen.update(record.handled)
        if record.fault is not None:
            seen.add(record.fault.fingerprint)
    fresh = []
    for finding in findings:
        if finding.fingerprint not in seen:
            seen.add(finding.fingerprint)
            fresh.append(finding)
    return fresh


def keep_metric_fingerprints(fingerprint: str) -> bool:
    """``prune_handled``'s ``keep`` while the metrics are unknown: every fingerprint but a condition's."""
    return not fingerprint.startswith(f"{KIND_CONDITION}:")


def prune_handled(
    record: NodeRecord, findings: Sequence[Finding], keep: Callable[[str], bool] | None = None
) -> NodeRecord:
    """Forget handled fingerprints no longer reported, so the same fault later counts as new.

    Call it only with the findings of a successful read: an unreachable exporter reports nothing, and
    pruning then would turn the stale value into a new fault when it returns. When only some sources
    are current (the conditions, with the metrics unknown), ``keep`` keeps the other sources' ones.
    A MaintenanceRequest's fingerprint is never a finding: it stays (the maintenance loop reads it to
    report the request Completed and release the claim; the request's uid makes it unique).
    """
    present = {f.fingerprint for f in findings}
    kept = tuple(fp for fp in record.handled if fp in present or fp.startswith(f"{MAINTENANCE_KIND}/")
                 or (keep is not None and keep(fp)))
    return record if kept == record.handled else dataclasses.replace(record, handled=kept)


# ---- detect loop --------------------------------------------------------------------------------

def worst(findings: Sequence[Finding]) -> Finding:
    """The finding that decides: the most drastic action, urgent first, then by fingerprint."""
    found = worst_finding(findings)
    if found is None:
        raise ValueError("worst() of no findings")
    return found


def fault_from_finding(finding: Finding, now: float) -> Fault:
    return Fault(
        kind=finding.kind,
        code=finding.code,
        gpus=tuple(finding.gpus),
        fingerprint=finding.fingerprint,
        action=finding.action,
        first_seen=now,
        last_seen=now,
        message=finding.message,
        urgent=finding.urgent,
    )


def on_findings(
    record: NodeRecord | None,
    findings: Sequence[Finding],
    node_unschedulable: bool,
    now: float,
    opts: DecideOptions | None = None,
) -> Decision:
    """The detect loop's decision for a node in healthy or cordoned (other states: no change).

    - ``quarantine`` → quarantined; ``reset-gpu``/``reboot``/custom → draining (or quarantined with
      reason ``repeat-offender``); ``cordon`` → cordoned; ``none`` → a notice, marked handled.
    - cordoned + a repair finding → draining (escalation); cordoned + another cordon finding: no change.
    - the cordon happens at once (``decision.cordon``) unless the node already is unschedulable;
      a full budget only records ``blocked`` (the drain loop waits); an open breaker starts nothing
      and records ``blocked=breaker`` (the finding stays new, so it is acted on after the reset).
    """
    opts = opts or DecideOptions()
    base = record if record is not None else fresh_record(now)
    isolated = isolated_at_gpu(base) and base.state in states.ACTIVE_STATES
    if base.state not in DETECT_STATES and not isolated:
        return _decide(record, base)
    fresh = new_findings(base, findings)
    notices = tuple(f for f in fresh if f.action == ACTION_NONE)
    after = add_handled(base, *(f.fingerprint for f in notices))
    actionable = [f for f in fresh if f.action != ACTION_NONE]
    if isolated:
        return _escalate_isolation(record, after, actionable, node_unschedulable, now, notices)
    if base.state == states.CORDONED:
        actionable = [f for f in actionable if f.action != ACTION_CORDON]
    if not actionable:
        if after.blocked is not None and after.blocked.reason == BLOCK_BREAKER:
            after = dataclasses.replace(after, blocked=None)
        if after.held is not None:
            after = dataclasses.replace(after, held=None)  # the held fault is gone
        return _decide(record, after, notices=notices)
    if opts.breaker_open:
        chosen = worst(actionable)
        kept = after.held is not None and chosen is not None and after.held.fingerprint == chosen.fingerprint
        held = after.held if kept or chosen is None else fault_from_finding(chosen, now)
        after = block(dataclasses.replace(after, held=held), BLOCK_BREAKER, "circuit breaker open: no new work", now)
        return _decide(record, after, notices=notices)
    chosen = worst(actionable)
    covered = (f.fingerprint for f in actionable if f is not chosen and covers(chosen, f))
    return _open_fault(record, add_handled(after, *covered), chosen, node_unschedulable, now, opts, notices)


def on_domain_action(record: NodeRecord | None, finding: Finding, node_unschedulable: bool, now: float) -> Decision:
    """The tray's NVLink domain passed its domain breaker's threshold and ``[fabric] domain_action`` handles the
    domain as one unit: the tray's record gets the domain fault (``finding``: the same fingerprint on every tray),
    so the ordinary flow drains it and then runs the domain action (quarantine: a person; a custom action and its
    ladder). Taken once per tray: a record that has the fault open or handled is left alone.

    - healthy / cordoned: draining with the domain fault (cordoned at once when first touched); a soft fault's
      fingerprint becomes handled (superseded), a held per-tray fault is dropped (the domain action covers it);
    - draining (its own fault waited for the budget or the breaker, or its drain runs): the fault is replaced in
      place, the tray's own fault handled: what follows the drain is the domain action, not the tray's repair; a
      drain under way starts again as the domain's (admitted with its trays, every pod in scope);
    - repairing, validating, quarantined, maintenance: no change (a repair under way cannot be recalled; the tray
      is taken into the domain action once it is back in healthy; a quarantined tray already waits for a person).
    """
    base = record if record is not None else fresh_record(now)
    fp = finding.fingerprint
    if fp in base.handled or (base.fault is not None and base.fault.fingerprint == fp):
        return _decide(record, base)
    if base.state not in (*DETECT_STATES, states.DRAINING):
        return _decide(record, base)
    superseded = (base.fault.fingerprint,) if base.fault is not None else ()
    held = (base.held.fingerprint,) if base.held is not None else ()
    after = add_handled(base, *superseded, *held)
    fault = fault_from_finding(finding, now)
    if base.state == states.DRAINING:
        cordon = not node_unschedulable and not base.cordoned_by_us
        isolation = base.isolation
        if isolation is not None and isolation.at_gpu:
            isolation = dataclasses.replace(isolation, scope=SCOPE_NODE, why="its NVLink domain's domain action")
        changes: dict[str, object] = {"fault": fault, "held": None, "blocked": None, "message": finding.message,
                                      "isolation": isolation, "stopped": False, "action": None}
        if cordon:
            changes.update(cordoned_by_us=True)
        return _decide(record, dataclasses.replace(after, **changes), cordon=cordon)  # type: ignore[arg-type]
    first_touch = base.state == states.HEALTHY
    cordon = first_touch and not node_unschedulable
    opened: dict[str, object] = {"fault": fault, "action": None, "stopped": False, "held": None, "isolation": None}
    if first_touch:
        opened.update(cordoned_by_us=cordon, was_unschedulable=node_unschedulable)
    moved = transition(after, states.DRAINING, states.fault_reason(finding.kind, finding.code), now,
                       finding.message, **opened)
    return _moved(record, moved, cordon=cordon)


def covers(chosen: Finding, other: Finding) -> bool:
    """Whether the flow ``chosen`` opens repairs ``other`` too, so ``other`` is handled with it (as the fault's
    own fingerprint is): the agent's NodeCondition restating the same XID, or a second XID a reboot clears.
    A sticky value of such a finding after the repair is then not a second repair. A finding on a GPU the
    repair does not touch, one needing more than the chosen action, or one a repair does not cure (a hot GPU's
    cordon) stays new: its own flow."""
    repairs = (ACTION_REBOOT, ACTION_RESET_GPU)
    if chosen.action not in repairs or other.action not in repairs or severity(other)[0] > severity(chosen)[0]:
        return False
    if chosen.action == ACTION_REBOOT or not chosen.gpus:  # a reboot, or a reset of every GPU
        return True
    return bool(other.gpus) and set(other.gpus) <= set(chosen.gpus)


def _open_fault(
    record: NodeRecord | None,
    base: NodeRecord,
    finding: Finding,
    node_unschedulable: bool,
    now: float,
    opts: DecideOptions,
    notices: tuple[Finding, ...],
) -> Decision:
    first_touch = base.state == states.HEALTHY
    to, reason = _target(base, finding, now, opts)
    isolation = _isolation_for(base, finding, opts) if to == states.DRAINING else None
    cordon = first_touch and not node_unschedulable and not (isolation is not None and isolation.at_gpu)
    if base.fault is not None:  # escalation: the soft fault is superseded by this one
        base = add_handled(base, base.fault.fingerprint)
    changes: dict[str, object] = {"fault": fault_from_finding(finding, now), "action": None, "stopped": False,
                                  "held": None, "isolation": isolation}
    if first_touch:
        changes.update(cordoned_by_us=cordon, was_unschedulable=node_unschedulable)
    message = finding.message
    if isolation is not None:
        message += f"; GPU {isolation.uuid} isolated alone" if isolation.at_gpu else f"; node-level: {isolation.why}"
    after = transition(base, to, reason, now, message, **changes)
    if to == states.DRAINING and opts.budget_full:
        after = block(after, BLOCK_BUDGET, opts.budget_detail or "disruption budget full", now)
    return _moved(record, after, cordon=cordon, notices=notices)


def _isolation_for(base: NodeRecord, finding: Finding, opts: DecideOptions) -> Isolation | None:
    """How the flow ``finding`` opens takes GPUs out (None: scope "node", nothing to record)."""
    if opts.isolation is None:
        return None
    why = opts.isolation(finding) if base.state == states.HEALTHY else "the node is cordoned already (a soft fault)"
    return Isolation(SCOPE_NODE, why=why) if why else Isolation(SCOPE_GPU, uuid=finding.gpus[0])


def _within_isolation(isolation: Isolation, finding: Finding) -> bool:
    """A finding the isolated GPU's own reset repairs (a second XID of that GPU): handled with the fault."""
    return finding.action == ACTION_RESET_GPU and bool(finding.gpus) and set(finding.gpus) <= {isolation.uuid}


def _escalate_isolation(record: NodeRecord | None, base: NodeRecord, actionable: Sequence[Finding],
                        node_unschedulable: bool, now: float, notices: tuple[Finding, ...]) -> Decision:
    """A node whose one GPU is isolated reports a new fault: on that GPU and repaired by its reset, it is handled
    with it; anything else (another GPU, a reboot, a quarantine) makes the flow node-level at once: cordoned,
    drained again by the drain loop (admission, budget and breaker as for any drain), the fault widened to both
    GPUs where both are reset, the GPU's rule kept until the node is validated. A soft (cordon) finding waits
    for the flow's end. The running attempt's Job is cancelled."""
    isolation, fault = base.isolation, base.fault
    assert isolation is not None
    repairs = [f for f in actionable if f.action != ACTION_CORDON]
    inside = [f for f in repairs if _within_isolation(isolation, f)]
    after = add_handled(base, *(f.fingerprint for f in inside))
    beyond = [f for f in repairs if f not in inside]
    if not beyond or fault is None:
        return _decide(record, after, notices=notices)
    chosen = worst(beyond)
    widened = chosen.action == ACTION_RESET_GPU and bool(chosen.gpus)
    gpus = tuple(sorted({*fault.gpus, *chosen.gpus})) if widened else chosen.gpus
    escalated = _with_history(add_handled(after, fault.fingerprint), now, OUTCOME_ESCALATED)
    why = f"{chosen.message} while GPU {isolation.uuid} is isolated: node-level"
    cordon = not node_unschedulable
    changes = {"fault": dataclasses.replace(fault_from_finding(chosen, now), gpus=gpus), "action": None, "held": None,
               "isolation": dataclasses.replace(isolation, scope=SCOPE_NODE, why=why), "cordoned_by_us": cordon,
               "was_unschedulable": node_unschedulable}
    move = Escalation(from_action=ISOLATE_GPU, to_action=chosen.action, to_rung=0, message=why)
    action = base.action
    cancel = action if action is not None and action.name else None
    if base.state == states.DRAINING:  # no move: the drain is admitted again, node-level (a state is no transition)
        after = dataclasses.replace(escalated, message=why, **changes)  # type: ignore[arg-type]
        return _decide(record, after, cordon=cordon, notices=notices, escalation=move)
    moved = transition(escalated, states.DRAINING, states.fault_reason(chosen.kind, chosen.code), now, why,
                       **changes)
    return _moved(record, moved, cordon=cordon, notices=notices, cancel=cancel, escalation=move)


def _target(base: NodeRecord, finding: Finding, now: float, opts: DecideOptions) -> tuple[str, str]:
    reason = states.fault_reason(finding.kind, finding.code)
    if finding.action == ACTION_QUARANTINE:
        return states.QUARANTINED, reason
    if finding.action == ACTION_CORDON:
        return states.CORDONED, reason
    if safety.repeat_offender(base.history, now, opts.repeat_count, opts.repeat_window_s):
        return states.QUARANTINED, states.REPEAT_OFFENDER
    return states.DRAINING, reason


# ---- people -------------------------------------------------------------------------------------


def should_uncordon(record: NodeRecord) -> bool:
    """Only undo our own cordon, and never on a node that was unschedulable before we came."""
    return record.cordoned_by_us and not record.was_unschedulable


def person_uncordoned(record: NodeRecord | None, node_unschedulable: bool) -> bool:
    """The node is schedulable although our record holds it unschedulable: a person uncordoned it."""
    if record is None or record.state == states.HEALTHY or node_unschedulable:
        return False
    return record.cordoned_by_us or record.was_unschedulable


def on_person_uncordoned(record: NodeRecord, now: float) -> Decision:
    """A person uncordoned the node mid-flow: stop working on it for this fault, back to healthy.

    The open fault's fingerprint becomes handled (we will not act on it again) and ``stopped`` is
    set. In ``repairing`` the repair cannot be recalled: the flow continues to validation, but
    the node is no longer ours to uncordon. A ``quarantined`` node stays quarantined (it still
    needs a person), but is no longer ours to uncordon either.
    """
    if record.state == states.HEALTHY:
        return _decide(record, record)
    if record.state in (states.REPAIRING, states.QUARANTINED):
        # A repair cannot be recalled, and a quarantined node stays flagged for a person (a broken GPU must
        # not look healthy because someone uncordoned it): the state stays, but the node is no longer ours
        # to uncordon, ever, in this flow.
        after = dataclasses.replace(record, cordoned_by_us=False, was_unschedulable=False)
        return _decide(record, after)
    after = _close_flow(record, states.PERSON_UNCORDONED, now, "a person uncordoned the node", OUTCOME_STOPPED)
    return _moved(record, dataclasses.replace(after, stopped=True), cancel=record.action)


def new_node(record: NodeRecord | None, taint: str, now: float) -> Decision:
    """A node joined carrying the startup taint ``taint``: validated before it takes work (its record keeps what
    a healthy record of the same name held: nothing, for a new Node)."""
    base = record if record is not None else fresh_record(now)
    message = f"a new node (startup taint {taint}): validated before it takes work"
    return _moved(record, transition(base, states.VALIDATING, states.NEW_NODE, now, message, action=None))


def release(record: NodeRecord, now: float, by: str) -> NodeRecord:
    """A person released a quarantined node (``gpuremediate release NODE``): validate it again."""
    message = f"released by {by}" if by else "released"
    return transition(record, states.VALIDATING, states.RELEASED, now, message, action=None)


# ---- flow steps ---------------------------------------------------------------------------------


def _history_entry(record: NodeRecord, now: float, outcome: str, action: str = "") -> HistoryEntry | None:
    """``action``: the repair that ended so (a ladder rung's); the fault's recommended action by default."""
    fault = record.fault
    if fault is None:
        return None
    isolation = record.isolation
    scope = isolation.scope if isolation is not None else ""
    if isolation is not None and isolation.by_device_plugin and isolation.effect == EFFECT_UNHEALTHY:
        scope = SCOPE_GPU  # the device plugin took the GPU out alone (node-level later, for its validation at most)
    return HistoryEntry(at=now, kind=fault.kind, code=fault.code, action=action or fault.action, outcome=outcome,
                        gpus=fault.gpus, scope=scope)


def _close_flow(record: NodeRecord, reason: str, now: float, message: str, outcome: str | None) -> NodeRecord:
    """Back to healthy: the fault handled (and in history), nothing of ours left on the node."""
    closed = record
    if record.fault is not None:
        closed = add_handled(closed, record.fault.fingerprint)
        entry = _history_entry(record, now, outcome) if outcome else None
        closed = add_history(closed, entry) if entry else closed
    return transition(
        closed,
        states.HEALTHY,
        reason,
        now,
        message,
        fault=None,
        action=None,
        cordoned_by_us=False,
        was_unschedulable=False,
        isolation=None,
    )


def _needs_repair(fault: Fault | None) -> bool:
    return fault is not None and fault.action not in (ACTION_NONE, ACTION_CORDON, ACTION_DRAIN, ACTION_QUARANTINE)


def complete_drain(record: NodeRecord, now: float) -> Decision:
    """Drain done: repairing when the fault needs a repair; a MaintenanceRequest with action none
    is held in maintenance (cordoned and drained) until the request is deleted; else validating."""
    fault = record.fault
    message = "drain complete"
    if is_maintenance_fault(fault) and fault is not None and fault.action == ACTION_NONE:
        held = transition(record, states.MAINTENANCE, states.DRAIN_COMPLETE, now, "drained; held for maintenance",
                          action=None)
        return _moved(record, held)
    if fault is not None and fault.action == ACTION_QUARANTINE:
        reason = states.fault_reason(fault.kind, fault.code)
        return _moved(record, transition(record, states.QUARANTINED, reason, now, fault.message, action=None))
    to = states.REPAIRING if _needs_repair(fault) else states.VALIDATING
    return _moved(record, transition(record, to, states.DRAIN_COMPLETE, now, message, action=None))


def drain_failed(record: NodeRecord, now: float, detail: str) -> Decision:
    """The drain could not finish and policy says stop: quarantined (the cordon stays)."""
    return _moved(record, transition(record, states.QUARANTINED, states.DRAIN_FAILED, now, detail, action=None))


def complete_repair(record: NodeRecord, ok: bool, now: float, max_attempts: int, detail: str = "",
                    next_action: str | None = None) -> Decision:
    """A repair attempt finished. ``max_attempts``: the current ladder rung's attempts; ``next_action``: the
    next rung's action (None: the rung is the ladder's last, or there is no ladder).

    - ok: validating (history: the rung's action repaired);
    - failed with attempts left on the rung: the next attempt (attempt + 1, name "" = not created yet);
    - failed, the rung's attempts spent, a next rung: that rung's first attempt (history: ``escalated``,
      which the repeat-offender rule does not count; ``decision.escalation`` says from what to what);
    - failed on the last rung: quarantined (history: ``repair-failed``).
    """
    current = record.action
    kind = current.kind if current else (record.fault.action if record.fault else "")
    rung = current.rung if current else 0
    if ok:
        after = _with_history(record, now, OUTCOME_REPAIRED, kind)
        return _moved(record, transition(after, states.VALIDATING, states.REPAIR_COMPLETE, now, detail, action=None))
    attempt = current.attempt if current else 1
    if attempt < max_attempts:
        retry = ActionInProgress(kind=kind, name="", attempt=attempt + 1, started=now, rung=rung)
        return _decide(record, dataclasses.replace(record, action=retry, message=detail or record.message))
    if next_action:
        message = f"{kind} failed {attempt} time(s); escalating to {next_action} (rung {rung + 2})" + (
            f": {detail}" if detail else "")
        after = _with_history(record, now, OUTCOME_ESCALATED, kind)
        escalated = ActionInProgress(kind=next_action, name="", attempt=1, started=now, rung=rung + 1)
        move = Escalation(from_action=kind, to_action=next_action, to_rung=rung + 1, message=message)
        return _decide(record, dataclasses.replace(after, action=escalated, message=message), escalation=move)
    after = _with_history(record, now, OUTCOME_REPAIR_FAILED, kind)
    message = detail or f"repair failed after {attempt} attempt(s)"
    return _moved(record, transition(after, states.QUARANTINED, states.REPAIR_FAILED, now, message, action=None))


def _with_history(record: NodeRecord, now: float, outcome: str, action: str = "") -> NodeRecord:
    entry = _history_entry(record, now, outcome, action)
    return add_history(record, entry) if entry else record


def complete_validation(record: NodeRecord, ok: bool, now: float, detail: str = "") -> Decision:
    """Validation passed: healthy, and uncordon if (and only if) we cordoned; failed: quarantined."""
    if not ok:
        message = detail or "validation failed"
        return _moved(
            record, transition(record, states.QUARANTINED, states.VALIDATION_FAILED, now, message, action=None)
        )
    after = _close_flow(record, states.VALIDATION_PASSED, now, detail or "validation passed", None)
    return _moved(record, after, uncordon=should_uncordon(record))


def thermal_cleared(record: NodeRecord, now: float,
                    message: str = "temperature back below the clear threshold") -> Decision:
    """The soft fault cleared (reading below the clear threshold for the hold time; a fabric state good again):
    healthy."""
    after = _close_flow(record, states.THERMAL_CLEARED, now, message, None)
    return _moved(record, after, uncordon=should_uncordon(record))


def degradation_cleared(record: NodeRecord, now: float) -> Decision:
    """A slow GPU or degraded link recovered (not found again for its clear hold): healthy."""
    after = _close_flow(record, states.DEGRADATION_CLEARED, now, "the GPU no longer degraded against its peers", None)
    return _moved(record, after, uncordon=should_uncordon(record))


# ---- maintenance --------------------------------------------------------------------------------

MAINTENANCE_KIND = "maintenance"  # Fault.kind of a MaintenanceRequest's fault


def is_maintenance_fault(fault: Fault | None) -> bool:
    return fault is not None and fault.kind == MAINTENANCE_KIND


def is_maintenance_held(record: NodeRecord) -> bool:
    """In maintenance after its drain (action none): cordoned, drained, waiting for the request's end."""
    return record.state == states.MAINTENANCE and record.reason == states.DRAIN_COMPLETE


def maintenance_request_deleted(record: NodeRecord, fingerprint: str, now: float) -> Decision:
    """The MaintenanceRequest whose fault has ``fingerprint`` was deleted: clear its fault.

    - held (drained, action none) → validating, then healthy (uncordoned only if we cordoned);
    - not started or mid-drain (maintenance / draining) → healthy at once (``end_maintenance``);
    - quarantined by the request itself (REPLACE_VM / CONTACT_SUPPORT) → validating (released);
    - repairing / validating: the running remediation finishes on its own — no change;
    - quarantined after a failed repair or validation: a person decides — no change;
    - a record without this request's fault (another fault, a predecessor's uid): no change.
    """
    fault = record.fault
    if fault is None or fault.fingerprint != fingerprint:
        return _decide(record, record)
    if is_maintenance_held(record):
        after = transition(record, states.VALIDATING, states.MAINTENANCE_COMPLETE, now,
                           "maintenance request deleted; validating before service", action=None)
        return _moved(record, after)
    if record.state in (states.MAINTENANCE, states.DRAINING):
        return end_maintenance(record, now)
    if record.state == states.QUARANTINED and record.reason == states.fault_reason(fault.kind, fault.code):
        return _moved(record, release(record, now, "maintenance request deletion"))
    return _decide(record, record)



def enter_maintenance(record: NodeRecord | None, fault: Fault, node_unschedulable: bool, now: float) -> Decision:
    """A MaintenanceRequest claimed a healthy node: held (not cordoned) until its start time."""
    base = record if record is not None else fresh_record(now)
    after = transition(
        base,
        states.MAINTENANCE,
        states.MAINTENANCE_REQUESTED,
        now,
        fault.message,
        fault=fault,
        action=None,
        stopped=False,
        cordoned_by_us=False,
        was_unschedulable=node_unschedulable,
    )
    return _moved(record, after)


def start_maintenance(record: NodeRecord, node_unschedulable: bool, now: float) -> Decision:
    """Start time reached: draining (cordon unless the node already is unschedulable)."""
    cordon = not node_unschedulable
    after = transition(
        record, states.DRAINING, states.MAINTENANCE_START, now, "maintenance window started", cordoned_by_us=cordon
    )
    return _moved(record, after, cordon=cordon)


def end_maintenance(record: NodeRecord, now: float) -> Decision:
    """The MaintenanceRequest was deleted: the fault is cleared, the node goes back (maintenance or
    draining → healthy), uncordoned only if we cordoned it."""
    after = _close_flow(record, states.MAINTENANCE_CANCELLED, now, "maintenance request deleted", None)
    return _moved(record, after, uncordon=should_uncordon(record), cancel=record.action)


# ---- malformed records --------------------------------------------------------------------------


UNREADABLE = "unreadable"  # the from-state of a transition out of a record that could not be read


def on_malformed(error: RecordError, node_unschedulable: bool, now: float) -> Decision:
    """A record we cannot read. We cannot know whether we cordoned the node, so:

    - schedulable node: start over with a fresh healthy record (nothing of ours to undo);
    - unschedulable node: quarantined, ``was_unschedulable`` set, so nothing ever uncordons it
      automatically; a person looks at it and releases it.

    Either way the decision carries a transition from ``unreadable`` naming the error, so the writer
    logs and Events the replacement: a person learns that a hand-edited record was thrown away.
    """
    if not node_unschedulable:
        message = f"node record unreadable ({error}); replaced by a fresh one"
        fresh = dataclasses.replace(fresh_record(now), reason=states.RECORD_MALFORMED, message=message)
        move = Transition(UNREADABLE, states.HEALTHY, states.RECORD_MALFORMED, message)
        return Decision(record=fresh, changed=True, transition=move)
    message = f"node record unreadable ({error}); held for a person"
    held = transition(
        fresh_record(now), states.QUARANTINED, states.RECORD_MALFORMED, now, message, was_unschedulable=True
    )
    move = Transition(UNREADABLE, states.QUARANTINED, states.RECORD_MALFORMED, message)
    return Decision(record=held, changed=True, transition=move)
