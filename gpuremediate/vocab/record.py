"""The node record: what the controller remembers about one node, and its annotation codec.

The record lives on the Node itself (design §1: no database):

- annotation ``gpuremediate.io/record``: :func:`encode` of a :class:`NodeRecord` (compact JSON,
  sorted keys, ``"v": 1``);
- label ``gpuremediate.io/state=<state>``: the record's state, for selectors and ``kubectl get -L``.

Reading: :func:`record_from_node` gives ``None`` (no record: a healthy node we never touched),
a :class:`NodeRecord`, or a :class:`RecordError` (malformed annotation; see
``gpuremediate.state.decide.on_malformed`` for the safe way to carry on). Writing:
:func:`node_patch` builds the JSON merge patch (record + label, optionally the cordon and the
resourceVersion precondition in the same patch).

Records are frozen. Change the state only with :func:`transition` (checked against the table in
``gpuremediate.vocab.states``); change other fields with ``dataclasses.replace`` or the small
helpers here (:func:`add_handled`, :func:`add_history`, :func:`block`, :func:`start_action`).
All times are unix seconds passed in by the caller.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.vocab import states

RECORD_ANNOTATION = "gpuremediate.io/record"
STATE_LABEL = "gpuremediate.io/state"
VERSION = 1
HISTORY_LIMIT = 20  # repair history entries kept (newest last)
HANDLED_LIMIT = 64  # handled fault fingerprints kept (newest last)
# Free text (messages, a block's detail: a plugin's status message may be any length) is cut to this when
# written, so the record stays small on a Node whose annotations other tools share (256 KiB in all).
TEXT_LIMIT = 1024
# Record times are unix seconds written by a controller: a hand-edited 1e308 is finite but overflows
# every computation on it (int(t * 1000) in a name). Anything outside 1970..2100 is garbage.
MAX_TIMESTAMP = 4102444800.0  # 2100-01-01T00:00:00Z

BLOCK_BUDGET = "budget"
BLOCK_PDB = "pdb"
BLOCK_BREAKER = "breaker"
BLOCK_WINDOW = "window"
BLOCK_MAINTENANCE_START = "maintenance-start"
BLOCK_GPU_PODS = "gpu-pods"  # validation needs every GPU, and pods still hold some
BLOCK_GPU_UNAVAILABLE = "gpu-unavailable"  # validation needs every GPU; the device plugin offers fewer
BLOCK_PERMISSION = "permission"  # RBAC refuses the controller a plugin kind (403): a person grants it
BLOCK_PAUSED = "paused"  # gpuremediate pause: no new work anywhere
BLOCK_GATE = "gate"  # blocking alerts, blocking pods, the settle delay
BLOCK_REASONS = (BLOCK_BUDGET, BLOCK_PDB, BLOCK_BREAKER, BLOCK_WINDOW, BLOCK_MAINTENANCE_START, BLOCK_GPU_PODS,
                 BLOCK_GPU_UNAVAILABLE, BLOCK_PERMISSION, BLOCK_PAUSED, BLOCK_GATE)

# Repair history outcomes.
OUTCOME_REPAIRED = "repaired"
OUTCOME_REPAIR_FAILED = "repair-failed"
OUTCOME_STOPPED = "stopped"  # a person took the node back mid-flow
OUTCOME_ESCALATED = "escalated"  # a ladder rung's attempts failed: the next rung runs (the flow goes on)

# Diagnostics outcomes (Fault.diagnostics.outcome).
DIAGNOSTICS_OK = "ok"
DIAGNOSTICS_FAILED = "failed"
DIAGNOSTICS_TIMED_OUT = "timed-out"
DIAGNOSTICS_SKIPPED = "skipped"  # the node was not Ready: no Job could run there


class RecordError(ValueError):
    """A record that cannot be read: malformed JSON, unknown version, wrong type, unknown state."""


@dataclass(frozen=True)
class Diagnostics:
    """The diagnostics Job run once for the open fault before its first repair (never blocks the repair)."""

    outcome: str  # DIAGNOSTICS_*
    job: str  # the Job's name
    location: str  # where the output lands on the node (the path the Job was told to write)
    at: float  # when it ended


@dataclass(frozen=True)
class Fault:
    """The open fault: the finding that took the node out of ``healthy``."""

    kind: str
    code: str
    gpus: tuple[str, ...]
    fingerprint: str
    action: str  # recommended action (vocab.findings ACTION_* or a custom action name)
    first_seen: float
    last_seen: float
    message: str
    urgent: bool = True
    diagnostics: Diagnostics | None = None  # set once the fault's diagnostics Job ended


@dataclass(frozen=True)
class ActionInProgress:
    """The side effect the owning loop is running (drain, repair Job or CR, validation Job)."""

    kind: str  # e.g. "drain", "reset-gpu", "reboot", "validate", or a custom action name
    name: str  # the object's name; "" while not created yet (e.g. the next repair attempt)
    attempt: int  # 1-based, within the ladder rung
    started: float
    deadline: float | None = None
    # What the action needs to recognise its own completion, e.g. the bootID before a reboot.
    detail: str = ""
    # When the object was created (its creationTimestamp; written after the create). Missing afterwards means
    # someone else deleted it — that attempt failed — whereas missing before means a kill between the record
    # write and the create. Plugin deadlines count from it (a first create can take seconds on a real server).
    created_at: float | None = None
    # A multi-step action's current step (the GPU-operator reset sequence: operands-gone, reset, operands-back,
    # failed) and since when; the step's own deadline is ``deadline``.
    step: str = ""
    step_since: float | None = None
    # The escalation ladder rung (0-based) this repair attempt belongs to; a record from before ladders has 0.
    rung: int = 0
    # The GPUs (indexes, UUIDs) the action works on, fixed when it started: the GPU Operator reset takes the
    # exporter away, so a controller restarted mid-sequence cannot read them again. Empty: decided at create.
    gpu_ids: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()

    @property
    def created(self) -> bool:
        return self.created_at is not None


@dataclass(frozen=True)
class HistoryEntry:
    """One finished repair flow (for the repeat-offender rule)."""

    at: float
    kind: str
    code: str
    action: str
    outcome: str  # OUTCOME_*
    # The GPUs the flow was about and whether it isolated them alone (SCOPE_GPU): the same GPU failing again
    # after a GPU-level return goes node-level. A record from before isolation has neither.
    gpus: tuple[str, ...] = ()
    scope: str = ""


SCOPE_NODE = "node"  # the whole node is taken out (cordon, drain)
SCOPE_GPU = "gpu"  # only the faulty GPU is (a DRA DeviceTaintRule); the node stays schedulable
VIA_DEVICE_PLUGIN = "device-plugin"  # Isolation.via: no DRA; the device plugin holds the GPU out of allocatable
EFFECT_UNHEALTHY = "unhealthy"  # Isolation.effect on that path: allocatable shows the GPU gone


@dataclass(frozen=True)
class Isolation:
    """How the open fault takes GPUs out (``[isolation] scope = "gpu"`` only; None: node-level as always).

    ``scope`` gpu: the GPU ``uuid`` is isolated by the DeviceTaintRule ``rule`` (DRA device ``driver``/``pool``/
    ``device``) with ``effect``, and the node is not cordoned. ``scope`` node: node-level after all, ``why``
    says why (not eligible, not a DRA cluster, escalated); a rule written before an escalation stays until
    the flow ends (``rule`` still names it).

    ``via`` says how the GPU is taken out: "" a DeviceTaintRule (DRA), ``device-plugin`` the device plugin's own
    health (``[isolation] without_dra = "device-plugin"``: no rule; ``effect`` is ``unhealthy`` once the node's
    allocatable shows the GPU gone, "" while that is waited for since ``effect_since``)."""

    scope: str
    uuid: str = ""
    why: str = ""
    rule: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    effect: str = ""
    effect_since: float | None = None  # when ``effect`` was written (NoExecute: the eviction clock)
    via: str = ""  # "" a DeviceTaintRule; VIA_DEVICE_PLUGIN: the device plugin took the GPU out of allocatable

    @property
    def by_device_plugin(self) -> bool:
        return self.via == VIA_DEVICE_PLUGIN

    @property
    def at_gpu(self) -> bool:
        return self.scope == SCOPE_GPU


@dataclass(frozen=True)
class Blocked:
    """Why the node waits: one of BLOCK_REASONS, a detail (e.g. the PDB's name), since when."""

    reason: str
    detail: str
    since: float

    def __post_init__(self) -> None:
        if self.reason not in BLOCK_REASONS:
            raise RecordError(f"blocked.reason {self.reason!r} is not one of {', '.join(BLOCK_REASONS)}")


@dataclass(frozen=True)
class NodeRecord:
    state: str = states.HEALTHY
    since: float = 0.0
    reason: str = ""
    message: str = ""
    fault: Fault | None = None
    action: ActionInProgress | None = None
    cordoned_by_us: bool = False  # we set spec.unschedulable (so we may undo it)
    was_unschedulable: bool = False  # unschedulable before we touched it: never uncordon
    tainted_by_us: bool = False  # we added the [taint] taint (so we may remove it; never one someone else set)
    # The autoscaler marks (actions/autoscaler_marks) we added while in remediation: only those are taken off.
    marked_by_us: tuple[str, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    handled: tuple[str, ...] = ()  # fingerprints of faults already dealt with
    blocked: Blocked | None = None
    # Owned by the policy layer (thermal timers...): JSON-serialisable; replace it, never mutate it.
    policy_memory: Mapping[str, Any] = field(default_factory=dict, hash=False)
    stopped: bool = False  # a person uncordoned mid-flow: we stopped working on the last fault
    # The Node the record was written on (stamped by node_patch's owner): a record copied onto another Node
    # (a restore, YAML re-applied, `kubectl annotate` from the wrong node) is not that node's own.
    node: str = ""
    node_uid: str = ""
    # A fault seen but not acted on while a hold lasts (the open breaker, a pause): shown, acted on once let go.
    held: Fault | None = None
    # The GPUs running hot within their thermal hold, each with when its hold ends (then cordoned, if still hot):
    # written by detect as a hold starts, for people (`explain` counts down without the policy file). The timers
    # themselves are the policy layer's, in policy_memory.
    thermal_hold_ends: Mapping[str, float] = field(default_factory=dict, hash=False)
    # GPU-level isolation of the open fault (issue 26); None: node-level (every record from before it).
    isolation: Isolation | None = None

    def __post_init__(self) -> None:
        if self.state not in states.STATES:
            raise RecordError(f"unknown state {self.state!r} (known: {', '.join(states.STATES)})")


def transition(record: NodeRecord, to: str, reason: str, now: float, message: str = "", **changes: Any) -> NodeRecord:
    """The record in state ``to``; raises ``IllegalTransition`` (naming from/to/reason) if not allowed.

    ``since`` becomes ``now``, ``blocked`` is cleared unless ``changes`` sets it, and any other
    field can be changed in the same step through ``changes``.
    """
    states.check_transition(record.state, to, reason)
    changes.setdefault("blocked", None)
    return dataclasses.replace(record, state=to, since=now, reason=reason, message=message, **changes)


def add_handled(record: NodeRecord, *fingerprints: str) -> NodeRecord:
    """Remember fingerprints as handled (deduplicated, newest last, at most HANDLED_LIMIT)."""
    fresh = [fp for fp in dict.fromkeys(fingerprints) if fp]
    kept = [fp for fp in record.handled if fp not in fresh]
    return dataclasses.replace(record, handled=tuple((kept + fresh)[-HANDLED_LIMIT:]))


def add_history(record: NodeRecord, entry: HistoryEntry) -> NodeRecord:
    """Append a history entry, keeping the last HISTORY_LIMIT."""
    return dataclasses.replace(record, history=(*record.history, entry)[-HISTORY_LIMIT:])


def block(record: NodeRecord, reason: str, detail: str, now: float) -> NodeRecord:
    """Mark the node as waiting; keeps the original ``since`` when the same block persists."""
    current = record.blocked
    if current is not None and current.reason == reason and current.detail == detail:
        return record
    return dataclasses.replace(record, blocked=Blocked(reason, detail, now))


def unblock(record: NodeRecord) -> NodeRecord:
    return record if record.blocked is None else dataclasses.replace(record, blocked=None)


def start_action(
    record: NodeRecord,
    kind: str,
    name: str,
    attempt: int,
    now: float,
    timeout_s: float | None = None,
    detail: str = "",
) -> NodeRecord:
    """Record the side effect about to start (write this before creating the object). The ladder rung of the
    action it replaces (the next attempt, not created yet) stays: only repair attempts have a rung above 0."""
    deadline = None if timeout_s is None else min(now + timeout_s, MAX_TIMESTAMP)  # a huge timeout: never
    rung = record.action.rung if record.action is not None else 0
    action = ActionInProgress(kind=kind, name=name, attempt=attempt, started=now, deadline=deadline, detail=detail,
                              rung=rung)
    return dataclasses.replace(record, action=action, blocked=None)


def mark_created(record: NodeRecord, at: float, timeout_s: float | None = None) -> NodeRecord:
    """The action's object exists since ``at`` (write this after the create); with ``timeout_s`` the deadline
    counts from then (never from before the action started: clocks differ, timestamps are whole seconds)."""
    action = record.action
    if action is None or action.created:
        return record
    deadline = action.deadline if timeout_s is None else min(max(at, action.started) + timeout_s, MAX_TIMESTAMP)
    return dataclasses.replace(record, action=dataclasses.replace(action, created_at=at, deadline=deadline))


def occurrence(record: NodeRecord) -> str:
    """The identity of the open fault's occurrence, for naming what is created for it (Jobs, custom
    resources, health event ids). A fingerprint can come back after a repair (the same XID again), so
    the time the fault was first seen is part of it: a new occurrence never finds the previous
    occurrence's finished objects under its names. Stable across restarts: both parts are in the record."""
    if record.fault is None:
        return f"since-{int(record.since * 1000)}"
    return f"{record.fault.fingerprint}@{int(record.fault.first_seen * 1000)}"


# ---- codec ---------------------------------------------------------------------------------


def to_dict(record: NodeRecord) -> dict[str, Any]:
    """The record as the JSON-ready dict written in the annotation."""
    data = dataclasses.asdict(record)
    data["policy_memory"] = dict(record.policy_memory)
    data["thermal_hold_ends"] = dict(record.thermal_hold_ends)
    data["v"] = VERSION
    return data


def encode(record: NodeRecord) -> str:
    """Compact JSON with sorted keys; raises RecordError when policy_memory is not JSON."""
    try:
        return json.dumps(to_dict(record), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"record cannot be encoded: {exc}") from exc


def _reject_constant(name: str) -> float:
    raise RecordError(f"non-finite number {name} in record")


def decode(text: str) -> NodeRecord:
    """Parse an annotation value; raises RecordError saying what is wrong.

    Unknown keys are ignored (a newer writer may add fields); missing optional keys take defaults;
    ``v`` and ``state`` are required. Oversized history / handled lists are cut to their limits.
    """
    if not isinstance(text, str):
        raise RecordError(f"record must be a string, not {type(text).__name__}")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecordError:
        raise
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"record is not valid JSON: {exc}") from exc
    return from_dict(data)


def from_dict(data: object) -> NodeRecord:
    obj = _Obj(data, "record")
    version = obj.get("v", int)
    if version != VERSION:
        raise RecordError(f"unknown record version {version!r} (this controller reads v{VERSION})")
    state = obj.get("state", str)
    if state not in states.STATES:
        raise RecordError(f"unknown state {state!r} in record")
    return NodeRecord(
        state=state,
        since=obj.timestamp("since", 0.0),
        reason=obj.opt("reason", str, ""),
        message=obj.opt("message", str, ""),
        fault=obj.nested("fault", _fault),
        action=obj.nested("action", _action),
        cordoned_by_us=obj.opt("cordoned_by_us", bool, False),
        was_unschedulable=obj.opt("was_unschedulable", bool, False),
        tainted_by_us=obj.opt("tainted_by_us", bool, False),
        marked_by_us=tuple(obj.strings("marked_by_us")),
        history=tuple(obj.items("history", _history))[-HISTORY_LIMIT:],
        handled=tuple(obj.strings("handled"))[-HANDLED_LIMIT:],
        blocked=obj.nested("blocked", _blocked),
        policy_memory=obj.opt("policy_memory", dict, {}),
        stopped=obj.opt("stopped", bool, False),
        node=obj.opt("node", str, ""),
        node_uid=obj.opt("node_uid", str, ""),
        held=obj.nested("held", _fault),
        thermal_hold_ends=_hold_ends(obj),
        isolation=obj.nested("isolation", _isolation),
    )


def isolated_at_gpu(record: NodeRecord | None) -> bool:
    """The open fault takes only its GPU out: the node is not cordoned and not drained."""
    return record is not None and record.isolation is not None and record.isolation.at_gpu


def gpu_held_out(record: NodeRecord | None) -> bool:
    """The open fault's one GPU is out of service alone now: its DeviceTaintRule written, or the device plugin seen
    to hold it out of allocatable (the node stays in service)."""
    if not isolated_at_gpu(record):
        return False
    assert record is not None and record.isolation is not None
    isolation = record.isolation
    return bool(isolation.rule) or (isolation.by_device_plugin and isolation.effect == EFFECT_UNHEALTHY)


def _isolation(obj: _Obj) -> Isolation:
    scope = obj.get("scope", str)
    if scope not in (SCOPE_NODE, SCOPE_GPU):
        raise RecordError(f"{obj.where}.scope must be {SCOPE_NODE} or {SCOPE_GPU}, got {scope!r}")
    return Isolation(
        scope=scope, uuid=obj.opt("uuid", str, ""), why=obj.opt("why", str, ""), rule=obj.opt("rule", str, ""),
        driver=obj.opt("driver", str, ""), pool=obj.opt("pool", str, ""), device=obj.opt("device", str, ""),
        effect=obj.opt("effect", str, ""), effect_since=obj.timestamp("effect_since", None),
        via=obj.opt("via", str, ""),
    )


def _hold_ends(obj: _Obj) -> dict[str, float]:
    """``thermal_hold_ends``: GPU key -> a plausible time (a record from before it has none)."""
    ends = _Obj(obj.opt("thermal_hold_ends", dict, {}), f"{obj.where}.thermal_hold_ends")
    return {str(key): at for key in ends.data if (at := ends.timestamp(key, None)) is not None}


def _fault(obj: _Obj) -> Fault:
    return Fault(
        kind=obj.get("kind", str),
        code=obj.opt("code", str, ""),
        gpus=tuple(obj.strings("gpus")),
        fingerprint=obj.get("fingerprint", str),
        action=obj.get("action", str),
        first_seen=obj.timestamp("first_seen", 0.0),
        last_seen=obj.timestamp("last_seen", 0.0),
        message=obj.opt("message", str, ""),
        urgent=obj.opt("urgent", bool, True),
        diagnostics=obj.nested("diagnostics", _diagnostics),
    )


def _diagnostics(obj: _Obj) -> Diagnostics:
    return Diagnostics(outcome=obj.get("outcome", str), job=obj.opt("job", str, ""),
                       location=obj.opt("location", str, ""), at=obj.timestamp("at", 0.0))


def _action(obj: _Obj) -> ActionInProgress:
    attempt = obj.get("attempt", int)
    if attempt < 1:
        raise RecordError(f"{obj.where}.attempt must be >= 1, got {attempt}")
    return ActionInProgress(
        kind=obj.get("kind", str),
        name=obj.opt("name", str, ""),
        attempt=attempt,
        started=obj.timestamp("started", 0.0),
        deadline=obj.timestamp("deadline", None),
        detail=obj.opt("detail", str, ""),
        created_at=obj.timestamp("created_at", None),
        step=obj.opt("step", str, ""),
        step_since=obj.timestamp("step_since", None),
        rung=_rung(obj),
        gpu_ids=tuple(obj.strings("gpu_ids")),
        gpu_uuids=tuple(obj.strings("gpu_uuids")),
    )


def _rung(obj: _Obj) -> int:
    rung = obj.opt("rung", int, 0)
    if rung < 0:
        raise RecordError(f"{obj.where}.rung must be >= 0, got {rung}")
    return int(rung)


def _history(obj: _Obj) -> HistoryEntry:
    return HistoryEntry(
        at=obj.timestamp("at", 0.0),
        kind=obj.opt("kind", str, ""),
        code=obj.opt("code", str, ""),
        action=obj.opt("action", str, ""),
        outcome=obj.opt("outcome", str, ""),
        gpus=tuple(obj.strings("gpus")),
        scope=obj.opt("scope", str, ""),
    )


def _blocked(obj: _Obj) -> Blocked:
    return Blocked(reason=obj.get("reason", str), detail=obj.opt("detail", str, ""), since=obj.timestamp("since", 0.0))


class _Obj:
    """Typed access to one JSON object, with errors naming the path of the bad field."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise RecordError(f"{where} must be a JSON object, not {_json_type(data)}")
        self.data: dict[str, Any] = data
        self.where = where

    def get(self, key: str, kind: type) -> Any:
        if key not in self.data:
            raise RecordError(f"{self.where}.{key} is missing")
        return self._typed(key, kind)

    def opt(self, key: str, kind: type, default: Any) -> Any:
        if self.data.get(key) is None:
            return default
        return self._typed(key, kind)

    def number(self, key: str, default: float | None) -> Any:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RecordError(f"{self.where}.{key} must be a number, not {_json_type(value)}")
        return float(value)

    def timestamp(self, key: str, default: float | None) -> Any:
        """A number of unix seconds between 1970 and 2100 (a plausible time for a record to hold)."""
        value = self.number(key, default)
        if value is not None and not 0.0 <= value <= MAX_TIMESTAMP:
            raise RecordError(f"{self.where}.{key} = {value!r} is not a plausible time (unix seconds, 1970..2100)")
        return value

    def strings(self, key: str) -> list[str]:
        values = self.opt(key, list, [])
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise RecordError(f"{self.where}.{key}[{i}] must be a string, not {_json_type(value)}")
        return list(values)

    def nested(self, key: str, build: Callable[[_Obj], Any]) -> Any:
        value = self.data.get(key)
        return None if value is None else build(_Obj(value, f"{self.where}.{key}"))

    def items(self, key: str, build: Callable[[_Obj], Any]) -> list[Any]:
        return [build(_Obj(v, f"{self.where}.{key}[{i}]")) for i, v in enumerate(self.opt(key, list, []))]

    def _typed(self, key: str, kind: type) -> Any:
        value = self.data[key]
        wrong_bool = isinstance(value, bool) and kind is not bool
        if wrong_bool or not isinstance(value, kind):
            raise RecordError(f"{self.where}.{key} must be {kind.__name__}, not {_json_type(value)}")
        return value


def _json_type(value: object) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# ---- the Node object ------------------------------------------------------------------------


def record_from_node(node: Mapping[str, Any]) -> NodeRecord | RecordError | None:
    """The node's record; None when it has none (healthy, untouched); RecordError when malformed.

    The annotation is authoritative; the state label is only a copy for selectors.
    """
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    text = annotations.get(RECORD_ANNOTATION)
    if text is None:
        return None
    try:
        record = decode(text)
    except RecordError as exc:
        return exc
    return foreign_record(record, metadata) or record


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT - 1] + "…"


def bounded(record: NodeRecord) -> NodeRecord:
    """The record with its free text cut to TEXT_LIMIT (lists are bounded where they grow)."""
    fault, blocked, held, isolation = record.fault, record.blocked, record.held, record.isolation
    return dataclasses.replace(
        record, message=_cut(record.message),
        isolation=None if isolation is None else dataclasses.replace(isolation, why=_cut(isolation.why)),
        fault=None if fault is None else dataclasses.replace(fault, message=_cut(fault.message)),
        held=None if held is None else dataclasses.replace(held, message=_cut(held.message)),
        blocked=None if blocked is None else dataclasses.replace(blocked, detail=_cut(blocked.detail)))


def foreign_record(record: NodeRecord, metadata: Mapping[str, Any]) -> RecordError | None:
    """Why the record is not this Node's own (written on another node, or on an earlier Node of this name),
    else None. A record from before owners were stamped proves nothing either way and is taken."""
    name, uid = str(metadata.get("name") or ""), str(metadata.get("uid") or "")
    if record.node and name and record.node != name:
        return RecordError(f"the record was written on node {record.node!r}, not on {name!r} (copied from another "
                           f"node?); it is not acted on")
    if record.node_uid and uid and record.node_uid != uid:
        return RecordError(f"the record was written on an earlier node {name!r} (uid {record.node_uid}, this one is "
                           f"{uid}: re-created); it is not acted on")
    return None


def node_patch(
    record: NodeRecord, *, unschedulable: bool | None = None, resource_version: str | None = None,
    owner: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON merge patch writing the record annotation and the state label.

    ``unschedulable`` also sets ``spec.unschedulable`` in the same (atomic) patch: the cordon and the
    record that explains it land together. ``resource_version`` makes the API server refuse the
    patch with 409 Conflict when the node changed since it was read (optimistic concurrency).
    ``owner``: the Node written to; its name and uid are stamped in the record (``foreign_record``).
    """
    if owner is not None:
        meta = owner.get("metadata") or {}
        record = dataclasses.replace(record, node=str(meta.get("name") or ""), node_uid=str(meta.get("uid") or ""))
    record = bounded(record)
    metadata: dict[str, Any] = {
        "annotations": {RECORD_ANNOTATION: encode(record)},
        "labels": {STATE_LABEL: record.state},
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    patch: dict[str, Any] = {"metadata": metadata}
    if unschedulable is not None:
        patch["spec"] = {"unschedulable": unschedulable}
    return patch


def node_unschedulable(node: Mapping[str, Any]) -> bool:
    """``spec.unschedulable`` of a Node object (absent means schedulable)."""
    return bool((node.get("spec") or {}).get("unschedulable", False))
