"""MaintenanceRequests, the pure part: reading a request, the fault it opens, and its status.

A request is identified by name AND uid: the fault it puts on the node has the fingerprint
``maintenance/<name>/<uid>`` (so Job names and every other idempotency key derived from the
fingerprint include the uid), and the node's claim annotation is ``<name>/<uid>``. A request
deleted and created again under the same name has a new uid and never adopts its predecessor's work.

No I/O here; ``gpuremediate.loops.maintenance`` reads and writes the objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuremediate.state.decide import MAINTENANCE_KIND, is_maintenance_held
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_NONE, ACTION_QUARANTINE, ACTION_REBOOT, ACTION_RESET_GPU
from gpuremediate.vocab.record import (
    BLOCK_BREAKER,
    BLOCK_BUDGET,
    BLOCK_PDB,
    BLOCK_WINDOW,
    Fault,
    NodeRecord,
)

VERSION = "v1alpha1"
KIND = "MaintenanceRequest"
FINALIZER = "gpuremediate.io/maintenance-cleanup"
CLAIM_ANNOTATION = "gpuremediate.io/maintenance-request"

# NVSentinel's recommendedAction -> our action. CUSTOM takes customRecommendedAction's name.
ACTIONS: Mapping[str, str] = {
    "NONE": ACTION_NONE,
    "COMPONENT_RESET": ACTION_RESET_GPU,
    "RESTART_VM": ACTION_REBOOT,
    "RESTART_BM": ACTION_REBOOT,
    "REPLACE_VM": ACTION_QUARANTINE,
    "CONTACT_SUPPORT": ACTION_QUARANTINE,
}
CUSTOM = "CUSTOM"

# Phases (the CRD's status.phase enum).
PENDING = "Pending"
PREPARING = "Preparing"
PREPARED = "Prepared"
REMEDIATING = "Remediating"
VALIDATING = "Validating"
COMPLETED = "Completed"
FAILED = "Failed"
REJECTED = "Rejected"
TERMINAL_PHASES = frozenset({COMPLETED, FAILED})

# Condition types.
EMITTED = "HealthEventEmitted"  # NVSentinel's; reasons Initializing / Emitted / Blocked (+ ours below)
PREPARED_COND = "NodePrepared"
REMEDIATED = "Remediated"
VALIDATED = "Validated"
CONDITION_ORDER = (EMITTED, PREPARED_COND, REMEDIATED, VALIDATED)

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


class RequestError(ValueError):
    """A request the controller cannot act on; the message names the field and what is wrong."""


@dataclass(frozen=True)
class Request:
    name: str
    uid: str
    generation: int
    created: float  # unix seconds (metadata.creationTimestamp)
    node: str
    recommended: str  # NVSentinel's recommendedAction
    action: str  # ours: none / reset-gpu / reboot / quarantine / a custom action name
    start: float | None  # spec.startTime, unix seconds; None = now
    gpus: tuple[str, ...]  # entitiesImpacted of type GPU (index or UUID), as given
    message: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.name, self.uid)

    @property
    def claim(self) -> str:
        return claim_value(self.name, self.uid)

    def prepare_at(self, lead_s: float) -> float | None:
        """When preparation starts; None: at once."""
        return None if self.start is None else self.start - lead_s

    def starts_before(self, other: Request) -> bool:
        """This request asks for its node earlier than ``other``: its startTime, or (none: now) its creation,
        is earlier. Never both ways, so a claim handed over by it is never handed back."""
        return _asks_at(self) < _asks_at(other)


def _asks_at(request: Request) -> float:
    return request.start if request.start is not None else request.created


def fingerprint(name: str, uid: str) -> str:
    return f"{MAINTENANCE_KIND}/{name}/{uid}"


def claim_value(name: str, uid: str) -> str:
    return f"{name}/{uid}"


def parse_claim(value: str) -> tuple[str, str] | None:
    name, sep, uid = value.partition("/")
    return (name, uid) if sep and name and uid else None


def parse_time(text: object, path: str) -> float:
    """RFC 3339 date-time → unix seconds; raises RequestError naming ``path``."""
    if not isinstance(text, str):
        raise RequestError(f"{path}: expected an RFC 3339 date-time string, got {type(text).__name__}")
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise RequestError(f"{path}: not an RFC 3339 date-time: {text!r}") from None
    if parsed.tzinfo is None:
        raise RequestError(f"{path}: a date-time needs a time zone (Z or +HH:MM): {text!r}")
    return parsed.timestamp()


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("name", "")), str(meta.get("uid", ""))


def node_name_of(obj: Mapping[str, Any]) -> str:
    """The node a request names, or "" (never raises: used to index requests by node)."""
    event = (obj.get("spec") or {}).get("healthEvent")
    node = event.get("nodeName") if isinstance(event, Mapping) else None
    return node if isinstance(node, str) else ""


def parse_request(obj: Mapping[str, Any]) -> Request:
    """The request's spec, checked; raises RequestError for what CEL does not (or could not) reject."""
    name, uid = identity(obj)
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise RequestError("spec: missing")
    event = spec.get("healthEvent")
    if not isinstance(event, Mapping):
        raise RequestError("spec.healthEvent: missing")
    node = event.get("nodeName")
    if not isinstance(node, str) or not node:
        raise RequestError("spec.healthEvent.nodeName: required")
    if event.get("isHealthy") is True:
        raise RequestError("spec.healthEvent.isHealthy: must be false (an opening event raises a fault)")
    if event.get("processingStrategy") == "STORE_ONLY":
        raise RequestError("spec.healthEvent.processingStrategy: STORE_ONLY asks for no action; nothing to do")
    recommended = event.get("recommendedAction") or "NONE"
    action = _action(recommended, event.get("customRecommendedAction"))
    start = spec.get("startTime")
    created = meta.get("creationTimestamp")
    return Request(
        name=name,
        uid=uid,
        generation=int(meta.get("generation") or 0),
        created=parse_time(created, "metadata.creationTimestamp") if created else 0.0,
        node=node,
        recommended=str(recommended),
        action=action,
        start=None if start is None else parse_time(start, "spec.startTime"),
        gpus=_gpu_entities(event.get("entitiesImpacted")),
        message=str(event.get("message") or f"maintenance requested ({recommended})"),
    )


def _action(recommended: object, custom: object) -> str:
    if recommended == CUSTOM:
        if not isinstance(custom, str) or not custom:
            raise RequestError("spec.healthEvent.customRecommendedAction: required with recommendedAction CUSTOM")
        return custom
    if not isinstance(recommended, str) or recommended not in ACTIONS:
        known = ", ".join([*ACTIONS, CUSTOM])
        raise RequestError(f"spec.healthEvent.recommendedAction: {recommended!r} is not supported (use {known})")
    return ACTIONS[recommended]


def _gpu_entities(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        return ()
    out = []
    for entity in raw:
        if isinstance(entity, Mapping) and str(entity.get("entityType", "")).upper().startswith("GPU"):
            out.append(str(entity.get("entityValue", "")))
    return tuple(v for v in out if v)


def fault_for(request: Request, gpus: tuple[str, ...], now: float) -> Fault:
    return Fault(
        kind=MAINTENANCE_KIND,
        code=request.recommended,
        gpus=gpus,
        fingerprint=request.fingerprint,
        action=request.action,
        first_seen=now,
        last_seen=now,
        message=f"MaintenanceRequest {request.name}: {request.message}"[:1024],
    )


# ---- status ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Progress:
    """What the controller observed about a request this round; becomes ``status``."""

    phase: str
    message: str
    conditions: tuple[Condition, ...]
    prepared_at: float | None = None
    started_at: float | None = None

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


def waiting(reason: str, message: str, *, phase: str = PENDING) -> Progress:
    """Not in the pipeline (yet): blocked, invalid, waiting for its time or for a busy node."""
    status = UNKNOWN if reason in ("Initializing", "WaitingForStartTime", "NodeBusy") else FALSE
    return Progress(phase, message, (Condition(EMITTED, status, reason, message),))


def rejected(error: RequestError) -> Progress:
    return waiting("Invalid", str(error), phase=REJECTED)


def observe(request: Request, record: NodeRecord, prepared_at: float | None, started_at: float | None) -> Progress:
    """The request's progress from the node record carrying its fault (or, once done, its fingerprint)."""
    emitted = Condition(EMITTED, TRUE, "Emitted", f"fault entered the pipeline of node {request.node}")
    phase, message, rest = _by_state(request, record, prepared_at)
    return Progress(phase, message, (emitted, *rest), prepared_at=prepared_at, started_at=started_at)


def drained_states(request: Request, record: NodeRecord) -> bool:
    """The node has been cordoned and drained for this request (it is past its drain)."""
    if record.fault is None or record.fault.fingerprint != request.fingerprint:
        return False
    if record.state == states.QUARANTINED:
        return record.reason == states.fault_reason(MAINTENANCE_KIND, request.recommended)
    return is_maintenance_held(record) or record.state in (states.REPAIRING, states.VALIDATING)


def _prepared(request: Request, prepared_at: float | None) -> Condition:
    if prepared_at is None:
        return Condition(PREPARED_COND, TRUE, "Drained", "the node is cordoned and drained")
    when = rfc3339(prepared_at)
    if request.start is None or prepared_at <= request.start:
        return Condition(PREPARED_COND, TRUE, "DrainedBeforeStartTime", f"cordoned and drained at {when}")
    late = int(prepared_at - request.start)
    return Condition(PREPARED_COND, TRUE, "DrainedAfterStartTime",
                     f"cordoned and drained at {when}, {late}s after startTime")


_BLOCK_REASONS = {BLOCK_BUDGET: "WaitingForBudget", BLOCK_PDB: "BlockedByPDB", BLOCK_BREAKER: "CircuitBreakerOpen",
                  BLOCK_WINDOW: "WaitingForDrainWindow"}


def _by_state(
    request: Request, record: NodeRecord, prepared_at: float | None
) -> tuple[str, str, tuple[Condition, ...]]:
    repairs = request.action not in (ACTION_NONE, ACTION_QUARANTINE)
    prepared = _prepared(request, prepared_at)
    state = record.state
    if state == states.MAINTENANCE and not is_maintenance_held(record):
        return PREPARING, "preparation starting", (Condition(PREPARED_COND, UNKNOWN, "Starting", "cordoning"),)
    if state == states.DRAINING:
        blocked = record.blocked
        reason = _BLOCK_REASONS.get(blocked.reason, "Draining") if blocked else "Draining"
        detail = f"{blocked.reason}: {blocked.detail}" if blocked else "evicting the node's pods"
        return PREPARING, detail, (Condition(PREPARED_COND, FALSE, reason, detail),)
    if state == states.MAINTENANCE:
        wait = Condition(VALIDATED, UNKNOWN, "WaitingForRequestDeletion",
                         "the node is held; delete the request to validate it and return it to service")
        return PREPARED, "node held for maintenance", (prepared, wait)
    if state == states.REPAIRING:
        doing = Condition(REMEDIATED, UNKNOWN, "InProgress", f"{request.action} running")
        return REMEDIATING, f"{request.action} running", (prepared, doing)
    if state == states.VALIDATING:
        done = (Condition(REMEDIATED, TRUE, "Succeeded", f"{request.action} done"),) if repairs else ()
        check = Condition(VALIDATED, UNKNOWN, "InProgress", "validation Job running")
        return VALIDATING, "validating the node", (prepared, *done, check)
    if state == states.QUARANTINED:
        return _quarantined(request, record, prepared)
    return _finished(request, record, repairs)


def _quarantined(request: Request, record: NodeRecord, prepared: Condition) -> tuple[str, str, tuple[Condition, ...]]:
    if record.reason == states.fault_reason(MAINTENANCE_KIND, request.recommended):
        wait = Condition(REMEDIATED, FALSE, "AwaitingPerson",
                         f"{request.recommended}: the node is quarantined for a person; delete the request when done")
        return PREPARED, "node quarantined for a person", (prepared, wait)
    if record.reason == states.DRAIN_FAILED:
        failed = Condition(PREPARED_COND, FALSE, "DrainFailed", record.message or "drain failed")
        return FAILED, failed.message, (failed,)
    if record.reason == states.REPAIR_FAILED:
        failed = Condition(REMEDIATED, FALSE, "Failed", record.message or "remediation failed")
        return FAILED, failed.message, (prepared, failed)
    failed = Condition(VALIDATED, FALSE, "Failed", record.message or f"quarantined ({record.reason})")
    return FAILED, failed.message, (prepared, failed)


def _finished(request: Request, record: NodeRecord, repairs: bool) -> tuple[str, str, tuple[Condition, ...]]:
    if record.stopped and record.reason == states.PERSON_UNCORDONED:
        stop = Condition(PREPARED_COND, FALSE, "StoppedByPerson", "a person uncordoned the node; the flow stopped")
        return FAILED, stop.message, (stop,)
    done = (Condition(REMEDIATED, TRUE, "Succeeded", f"{request.action} done"),) if repairs else ()
    passed = Condition(VALIDATED, TRUE, "Passed", "validation passed; the node is back in service")
    return COMPLETED, "maintenance done; the node is back in service", (
        Condition(PREPARED_COND, TRUE, "Drained", "the node was cordoned and drained"), *done, passed)


def status_body(progress: Progress, old: Mapping[str, Any], generation: int, now: float) -> dict[str, Any]:
    """The new ``status``: conditions keep their lastTransitionTime while their status is unchanged."""
    previous = {c.get("type"): c for c in old.get("conditions") or [] if isinstance(c, Mapping)}
    conditions = []
    for cond in sorted(progress.conditions, key=lambda c: CONDITION_ORDER.index(c.type)):
        before = previous.get(cond.type) or {}
        since = before.get("lastTransitionTime") if before.get("status") == cond.status else None
        conditions.append({"type": cond.type, "status": cond.status, "reason": cond.reason,
                           "message": cond.message[:32768], "lastTransitionTime": since or rfc3339(now),
                           "observedGeneration": generation})
    body: dict[str, Any] = {"phase": progress.phase, "message": progress.message[:4096],
                            "observedGeneration": generation, "conditions": conditions}
    for key, value in (("startedAt", progress.started_at), ("preparedAt", progress.prepared_at)):
        if value is not None:
            body[key] = rfc3339(value)
        elif old.get(key):
            body[key] = old[key]
    if progress.phase in TERMINAL_PHASES:
        body["completedAt"] = old.get("completedAt") or rfc3339(now)
    return body
