"""The node states, the reasons a node moves, and the one transition table (design §3).

A state is a plain string (it is also the value of the ``gpuremediate.io/state`` label).
Every move between states has a *reason*: a short machine word. Two kinds exist:

- lifecycle reasons, the named constants below (``drain-complete``, ``validation-failed``, ...);
- fault reasons, derived from a finding by :func:`fault_reason` (``xid-79``, ``ecc-dbe``,
  ``thermal``, ...). In :data:`TRANSITIONS` the marker :data:`FAULT` stands for "any fault reason".

:func:`check_transition` raises :class:`IllegalTransition` for any move the table does not allow;
``gpuremediate.vocab.record.transition`` uses it, so no record can reach an unlisted state.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

HEALTHY = "healthy"  # no open fault
CORDONED = "cordoned"  # soft fault (thermal): unschedulable, workloads stay
DRAINING = "draining"  # fault needs repair; evicting (or waiting for the budget)
REPAIRING = "repairing"  # remediation action running
VALIDATING = "validating"  # validation Job on all the node's GPUs
QUARANTINED = "quarantined"  # needs a person
MAINTENANCE = "maintenance"  # held for a MaintenanceRequest

STATES = (HEALTHY, CORDONED, DRAINING, REPAIRING, VALIDATING, QUARANTINED, MAINTENANCE)
# States in which the node is taken out of service by our own work (they hold a budget slot).
ACTIVE_STATES = frozenset({DRAINING, REPAIRING, VALIDATING})

# Lifecycle reasons.
DRAIN_COMPLETE = "drain-complete"
DRAIN_FAILED = "drain-failed"
REPAIR_COMPLETE = "repair-complete"
REPAIR_FAILED = "repair-failed"
VALIDATION_PASSED = "validation-passed"
VALIDATION_FAILED = "validation-failed"
REPEAT_OFFENDER = "repeat-offender"
RELEASED = "released"  # a person ran `gpuremediate release NODE`
THERMAL_CLEARED = "thermal-cleared"
DEGRADATION_CLEARED = "degradation-cleared"  # [degradation]: the slow GPU or degraded link recovered
PERSON_UNCORDONED = "person-uncordoned"  # a person uncordoned the node mid-flow: we stop
MAINTENANCE_REQUESTED = "maintenance-requested"
MAINTENANCE_START = "maintenance-start"
MAINTENANCE_CANCELLED = "maintenance-cancelled"  # the MaintenanceRequest was deleted: fault cleared
MAINTENANCE_COMPLETE = "maintenance-complete"
RECORD_MALFORMED = "record-malformed"  # the record could not be read; a person decides
NEW_NODE = "new-node"  # a node joined carrying the startup taint: validated before it takes work

LIFECYCLE_REASONS = frozenset(
    {
        DRAIN_COMPLETE,
        DRAIN_FAILED,
        REPAIR_COMPLETE,
        REPAIR_FAILED,
        VALIDATION_PASSED,
        VALIDATION_FAILED,
        REPEAT_OFFENDER,
        RELEASED,
        THERMAL_CLEARED,
        DEGRADATION_CLEARED,
        PERSON_UNCORDONED,
        MAINTENANCE_REQUESTED,
        MAINTENANCE_START,
        MAINTENANCE_CANCELLED,
        MAINTENANCE_COMPLETE,
        RECORD_MALFORMED,
        NEW_NODE,
    }
)

FAULT = "<fault>"  # table marker: any fault reason (see is_fault_reason)

_MACHINE_WORD = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")


def _edges(**targets: tuple[str, ...]) -> Mapping[str, frozenset[str]]:
    return MappingProxyType({to: frozenset(reasons) for to, reasons in targets.items()})


# from -> {to -> reasons allowed}. The only place that says which moves exist.
TRANSITIONS: Mapping[str, Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        HEALTHY: _edges(
            cordoned=(FAULT,),
            draining=(FAULT,),
            quarantined=(FAULT, REPEAT_OFFENDER, RECORD_MALFORMED),
            maintenance=(MAINTENANCE_REQUESTED,),
            validating=(NEW_NODE,),
        ),
        CORDONED: _edges(
            healthy=(THERMAL_CLEARED, DEGRADATION_CLEARED, PERSON_UNCORDONED),
            draining=(FAULT,),
            quarantined=(FAULT, REPEAT_OFFENDER),
        ),
        DRAINING: _edges(
            repairing=(DRAIN_COMPLETE,),
            quarantined=(DRAIN_FAILED, FAULT),
            healthy=(PERSON_UNCORDONED, MAINTENANCE_CANCELLED),
            validating=(DRAIN_COMPLETE,),  # maintenance with no repair
            maintenance=(DRAIN_COMPLETE,),  # a MaintenanceRequest with action none: drained, then held
        ),
        REPAIRING: _edges(
            validating=(REPAIR_COMPLETE,),
            quarantined=(REPAIR_FAILED,),
            draining=(FAULT,),  # a GPU-level isolation escalated to node-level (another GPU failed)
        ),
        VALIDATING: _edges(
            healthy=(VALIDATION_PASSED, PERSON_UNCORDONED),
            quarantined=(VALIDATION_FAILED,),
            draining=(FAULT,),  # a GPU-level isolation escalated to node-level (another GPU failed)
        ),
        QUARANTINED: _edges(
            validating=(RELEASED,),
            healthy=(RELEASED, PERSON_UNCORDONED),
        ),
        MAINTENANCE: _edges(
            draining=(MAINTENANCE_START,),
            healthy=(MAINTENANCE_CANCELLED, PERSON_UNCORDONED),
            validating=(MAINTENANCE_COMPLETE,),
        ),
    }
)


class IllegalTransition(ValueError):
    """A move the transition table does not allow; names from, to and reason."""

    def __init__(self, from_state: str, to_state: str, reason: str, why: str) -> None:
        super().__init__(f"illegal transition {from_state} -> {to_state} (reason {reason!r}): {why}")
        self.from_state = from_state
        self.to_state = to_state
        self.reason = reason


def fault_reason(kind: str, code: str) -> str:
    """The transition reason for a fault: ``xid-<code>`` for an XID, else the finding kind.

    Always a fault reason (see :func:`is_fault_reason`): other characters become ``-``, a kind
    that would read as a lifecycle reason or is empty becomes ``fault-<kind>`` / ``fault``.
    """
    raw = f"xid-{code}" if kind == "xid" and code else kind
    word = re.sub(r"[^a-z0-9.-]+", "-", raw.lower()).strip("-.")[:63].rstrip("-.")
    if not word:
        return "fault"
    return word if is_fault_reason(word) else f"fault-{word}"[:63]


def is_fault_reason(reason: str) -> bool:
    """A machine word that is not a lifecycle reason (``xid-79``, ``ecc-dbe``, ``thermal``, ...)."""
    return bool(_MACHINE_WORD.fullmatch(reason)) and reason not in LIFECYCLE_REASONS


def reason_allowed(allowed: frozenset[str], reason: str) -> bool:
    return reason in allowed or (FAULT in allowed and is_fault_reason(reason))


def check_transition(from_state: str, to_state: str, reason: str) -> None:
    """Raise :class:`IllegalTransition` unless the table allows ``from_state -> to_state`` for ``reason``."""
    edges = TRANSITIONS.get(from_state)
    if edges is None:
        raise IllegalTransition(from_state, to_state, reason, f"unknown state {from_state!r}")
    if to_state not in edges:
        allowed = ", ".join(sorted(edges))
        raise IllegalTransition(from_state, to_state, reason, f"{from_state} leaves only to {allowed}")
    if not reason_allowed(edges[to_state], reason):
        reasons = ", ".join(sorted(edges[to_state]))
        raise IllegalTransition(from_state, to_state, reason, f"allowed reasons: {reasons}")


def is_allowed(from_state: str, to_state: str, reason: str) -> bool:
    try:
        check_transition(from_state, to_state, reason)
    except IllegalTransition:
        return False
    return True
