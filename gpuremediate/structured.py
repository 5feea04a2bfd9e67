"""What ``status``, ``explain NODE`` and ``breaker status`` print with ``-o json`` / ``-o yaml`` (``--json``): one
object each, framed as kubectl users expect (``apiVersion``, ``kind``), with the fleet's pause, breaker and dry
run beside the nodes, times in RFC 3339 (UTC) and an absent value ``null``, never a table's ``-``.

``SCHEMA`` says every kind's fields (type and meaning) in one place: ``validate`` checks a printed object against
it (the tests do, for every command), and ``markdown`` renders it for docs/output.md (a test checks the page
says the same, so the documentation cannot drift from what is printed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuremediate.actions.replaced import Entry

API_VERSION = "gpuremediate.io/v1"
KIND_FLEET_STATUS = "FleetStatus"
KIND_NODE_EXPLANATION = "NodeExplanation"
KIND_BREAKER_STATUS = "BreakerStatus"


def rfc3339(ts: float | None) -> str | None:
    """``2026-12-06T20:16:36Z`` (UTC, whole seconds); None for no time (None or 0: never set)."""
    if not ts:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def or_none(text: str | None) -> str | None:
    """A string field: "" and None are both "absent" (null), never "" or a table's "-"."""
    return text if text else None


# ---- the schema ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One key of an object: its type (``string``, ``integer``, ``boolean``, ``time`` (an RFC 3339 string),
    ``object`` (free-form), ``[T]`` (a list of T), or another object's name), whether it may be null, and what
    it says."""

    name: str
    type: str
    doc: str
    nullable: bool = False


SCHEMA: dict[str, tuple[Field, ...]] = {
    KIND_FLEET_STATUS: (
        Field("apiVersion", "string", f"`{API_VERSION}`"),
        Field("kind", "string", f"`{KIND_FLEET_STATUS}`"),
        Field("fleet", "Fleet", "what holds work fleet-wide: what the table's banner lines say"),
        Field("nodes", "[Node]", "the GPU nodes, by name"),
    ),
    "Fleet": (
        Field("dryRun", "DryRun", "a dry run runs now (its journal is live): the nodes with `dryRun: true` show "
                                  "what it would do; null: none", nullable=True),
        Field("paused", "Pause", "`gpuremediate pause`: no new work anywhere; null: not paused", nullable=True),
        Field("breaker", "Breaker", "the circuit breaker (in a dry run: the one the dry run would have); null: "
                                    "its ConfigMap cannot be read (`errors` says why)", nullable=True),
        Field("source", "SourceProblem", "the GPU-health source the controller cannot read (no fault is seen "
                                         "while it is never read); null: it reads it", nullable=True),
        Field("budget", "Budget", "the GPU nodes and how many are out of service (the policy's "
                                  "`[budget] max_unavailable` caps the ones gpuremediate takes out)"),
        Field("shards", "[Shard]", "who holds each shard Lease (`--shards`); empty when not sharded or the "
                                   "reader may not list Leases"),
        Field("replaced", "Replaced", "the nodes `[remediation.replace]` replaced (ConfigMap "
                                      "`gpuremediate-replaced`); null: that ConfigMap cannot be read (`errors` says "
                                      "why)", nullable=True),
        Field("errors", "[string]", "what could not be read (the ConfigMaps, the Leases), one line each"),
    ),
    "Replaced": (
        Field("recent", "integer", "replacements in the last 24 hours"),
        Field("total", "integer", "replacements in the history (its newest 200)"),
        Field("latest", "[Replacement]", "the newest few (5), newest first"),
    ),
    "Replacement": (
        Field("node", "string", "the Node replaced (it no longer exists; a new one may have its name)"),
        Field("nodeUID", "string", "its uid", nullable=True),
        Field("providerID", "string", "its `spec.providerID`: the instance it ran on", nullable=True),
        Field("provider", "string", "`cluster-api` or `karpenter`"),
        Field("target", "string", "the object deleted so its owner replaces the node: `Machine ns/name` or "
                                  "`NodeClaim name`"),
        Field("targetUID", "string", "that object's uid (the delete's precondition)", nullable=True),
        Field("fault", "string", "the fault it was replaced for", nullable=True),
        Field("at", "time", "when the replacement started (the entry was written before the delete)",
              nullable=True),
        Field("state", "string", "`deleting` (written before the delete, not yet confirmed sent) or `deleted`"),
    ),
    "DryRun": (
        Field("identity", "string", "the dry-running replica", nullable=True),
        Field("started", "time", "when the dry run started", nullable=True),
        Field("updated", "time", "its journal's last heartbeat", nullable=True),
        Field("leftOut", "integer", "nodes left out of the journal (it was full)"),
    ),
    "Pause": (
        Field("by", "string", "who paused", nullable=True),
        Field("reason", "string", "why (`--reason`)", nullable=True),
        Field("at", "time", "when", nullable=True),
    ),
    "Breaker": (
        Field("open", "boolean", "no new work starts anywhere (`gpuremediate breaker reset` closes it)"),
        Field("dryRun", "boolean", "this is the breaker a running dry run would have (the real one is not "
                                   "written)"),
        Field("reason", "string", "why it opened", nullable=True),
        Field("openedAt", "time", "when it opened", nullable=True),
        Field("resetBy", "string", "who closed it last", nullable=True),
        Field("resetAt", "time", "when", nullable=True),
        Field("resetRequested", "string", "a reset annotation waiting for the controller to apply it (its value)",
              nullable=True),
        Field("domains", "[DomainBreaker]", "failure domains whose breaker is open: no new work there only"),
        Field("look", "StormLook", "the latest storm look (faults arriving faster than `[breaker]`'s look rate "
                                   "wait to see whether they open the breaker); null: none yet", nullable=True),
    ),
    "StormLook": (
        Field("looking", "boolean", "under way: the new work of `nodes` waits until `until`"),
        Field("openedAt", "time", "when it opened", nullable=True),
        Field("until", "time", "when it ends at the latest", nullable=True),
        Field("reason", "string", "why it opened", nullable=True),
        Field("nodes", "[string]", "the nodes whose faults it holds (held: arrived since it opened)"),
        Field("endedAt", "time", "when it ended; null while under way", nullable=True),
        Field("outcome", "string", "how it ended: `released` (the faults went on) or `opened` (the breaker "
                                   "opened); null while under way", nullable=True),
    ),
    "DomainBreaker": (
        Field("label", "string", "the node label of the domain (`[breaker] domain_labels`)"),
        Field("value", "string", "its value"),
        Field("reason", "string", "why it opened", nullable=True),
        Field("openedAt", "time", "when", nullable=True),
    ),
    "SourceProblem": (
        Field("problem", "string", "`never-read` or `slow`"),
        Field("detail", "string", "what the controller said", nullable=True),
        Field("since", "time", "since when", nullable=True),
        Field("by", "string", "the replica that said it", nullable=True),
    ),
    "Budget": (
        Field("gpuNodes", "integer", "GPU nodes in `nodes`"),
        Field("outOfService", "integer", "of them, not healthy or unschedulable (the table's `out of service`)"),
    ),
    "Shard": (
        Field("index", "integer", "the shard (`gpuremediate-shard-<index>`)"),
        Field("holder", "string", "the replica holding it; null: free", nullable=True),
        Field("renewedAt", "time", "its last renewal", nullable=True),
        Field("expired", "boolean", "not renewed within its lease duration"),
    ),
    "Node": (
        Field("name", "string", "the Node"),
        Field("state", "string", "the record's state: healthy, cordoned, draining, repairing, validating, "
                                 "quarantined, maintenance; `unreadable`: its record annotation cannot be read"),
        Field("stateText", "string", "the table's STATE words: `draining (waiting)` (not started yet), a dry "
                                     "run's `would drain`"),
        Field("dryRun", "boolean", "this entry is the record a running dry run would have written"),
        Field("since", "time", "in `state` since", nullable=True),
        Field("schedulable", "boolean", "not cordoned (`spec.unschedulable` unset)"),
        Field("excluded", "boolean", "excluded from gpuremediate by its label"),
        Field("gpus", "integer", "the node's GPUs (its GPU resources' capacity)"),
        Field("gpusInService", "integer", "of them, not isolated alone (GPU-level isolation)"),
        Field("isolatedGPUs", "[string]", "the GPUs (UUIDs) taken out alone; the node stays in service"),
        Field("domain", "string", "its NVLink domain (`--domain-label`)", nullable=True),
        Field("reason", "string", "the record's reason: the fault or lifecycle step that put it in its state",
              nullable=True),
        Field("message", "string", "the record's message", nullable=True),
        Field("fault", "NodeFault", "the open fault, or one a hold keeps from being acted on (`held`)",
              nullable=True),
        Field("watching", "[Watch]", "GPUs running hot within their thermal hold (cordoned when it is over)"),
        Field("action", "Action", "the step under way (a drain, a repair Job, a validation)", nullable=True),
        Field("blocked", "Blocked", "why it waits", nullable=True),
        Field("heldBy", "string", "who or what holds the wait: the pauser, the PodDisruptionBudget, the nodes "
                                  "filling the budget, the pods holding GPUs, the breaker", nullable=True),
        Field("error", "string", "why the record cannot be read (`state: unreadable`)", nullable=True),
    ),
    "NodeFault": (
        Field("kind", "string", "the finding's kind (`xid`, `ecc-dbe`, `thermal`, ...)"),
        Field("code", "string", "its code (`48`, `ecc_dbe_volatile`)", nullable=True),
        Field("gpus", "[string]", "the GPUs it is about"),
        Field("action", "string", "the action the policy chose for it", nullable=True),
        Field("message", "string", "what was seen", nullable=True),
        Field("held", "boolean", "seen but not acted on while a hold lasts (the open breaker, a pause)"),
        Field("firstSeen", "time", "first seen", nullable=True),
        Field("lastSeen", "time", "last seen", nullable=True),
    ),
    "Watch": (
        Field("gpu", "string", "the GPU"),
        Field("hotSince", "time", "hot since", nullable=True),
        Field("cordonAt", "time", "when its hold ends (cordoned then if still hot); null: unknown", nullable=True),
    ),
    "Action": (
        Field("kind", "string", "`drain`, `reset-gpu`, `reboot`, `validate`, a custom action"),
        Field("attempt", "integer", "1-based, within its escalation rung"),
        Field("rung", "integer", "the escalation ladder rung, 0-based"),
        Field("name", "string", "the Job or resource's name; null: not created yet", nullable=True),
        Field("started", "time", "when it started", nullable=True),
        Field("deadline", "time", "when it times out", nullable=True),
        Field("step", "string", "a multi-step action's step (the GPU-operator reset sequence)", nullable=True),
    ),
    "Blocked": (
        Field("reason", "string", "`budget`, `breaker`, `paused`, `pdb`, `gate`, `gpu-pods`, ..."),
        Field("detail", "string", "the wait in words", nullable=True),
        Field("since", "time", "waiting since", nullable=True),
    ),
    KIND_NODE_EXPLANATION: (
        Field("apiVersion", "string", f"`{API_VERSION}`"),
        Field("kind", "string", f"`{KIND_NODE_EXPLANATION}`"),
        Field("dryRun", "boolean", "a dry run runs now: `record` is what it would have written (when it decided "
                                   "about this node)"),
        Field("node", "Node", "the node's entry, the same as `status` prints for it; null: no Node of that name "
                              "exists and it was replaced (`replaced` says when, through what)", nullable=True),
        Field("record", "object", "the record annotation in full (its keys in camelCase, its times RFC 3339); "
                                  "null: none (never acted on) or unreadable", nullable=True),
        Field("explanation", "[string]", "the words `explain` prints, one line each"),
        Field("replaced", "[Replacement]", "the Nodes of this name `[remediation.replace]` replaced, newest first "
                                           "(the history's entries); empty: none, or the history cannot be read"),
    ),
    KIND_BREAKER_STATUS: (
        Field("apiVersion", "string", f"`{API_VERSION}`"),
        Field("kind", "string", f"`{KIND_BREAKER_STATUS}`"),
        Field("breaker", "Breaker", "the circuit breaker (after a `reset`: as reset)"),
    ),
}

KINDS = (KIND_FLEET_STATUS, KIND_NODE_EXPLANATION, KIND_BREAKER_STATUS)


def validate(value: Any, type_name: str, where: str = "$") -> list[str]:
    """What in ``value`` differs from ``SCHEMA[type_name]`` (or a field type), one line each; [] when it
    matches: every key present, none unknown, each of its type (null only where nullable)."""
    if type_name.startswith("["):
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        return [p for i, item in enumerate(value) for p in validate(item, type_name[1:-1], f"{where}[{i}]")]
    scalar = _SCALARS.get(type_name)
    if scalar is not None:
        return [] if scalar(value) else [f"{where}: {value!r} is not a {type_name}"]
    if not isinstance(value, dict):
        return [f"{where}: {type(value).__name__}, not a {type_name} object"]
    fields = {f.name: f for f in SCHEMA[type_name]}
    problems = [f"{where}.{key}: not in {type_name}" for key in value if key not in fields]
    for name, spec in fields.items():
        if name not in value:
            problems.append(f"{where}.{name}: missing")
        elif value[name] is None:
            problems += [] if spec.nullable else [f"{where}.{name}: null, and {type_name}.{name} never is"]
        else:
            problems += validate(value[name], spec.type, f"{where}.{name}")
    return problems


_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\Z")
_SCALARS: dict[str, Any] = {
    "string": lambda v: isinstance(v, str) and v != "",
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "time": lambda v: isinstance(v, str) and _TIME.match(v) is not None,
    "object": lambda v: isinstance(v, dict),
}


def markdown() -> str:
    """The schema as Markdown: one table per object, the three kinds first (docs/output.md carries it)."""
    order = [*KINDS, *(name for name in SCHEMA if name not in KINDS)]
    parts = []
    for name in order:
        parts.append(f"#### `{name}`\n\n| field | type | meaning |\n|---|---|---|\n")
        for f in SCHEMA[name]:
            kind = f"`{f.type}`" + (" or `null`" if f.nullable else "")
            parts.append(f"| `{f.name}` | {kind} | {f.doc} |\n")
        parts.append("\n")
    return "".join(parts)


# ---- building the objects -----------------------------------------------------------------------------------


def frame(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, **body}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


TIME_KEYS = frozenset({"since", "at", "first_seen", "last_seen", "started", "deadline", "created_at", "step_since",
                       "effect_since", "opened_at", "reset_at"})
OPAQUE_KEYS = frozenset({"policy_memory"})  # the policy layer's own: as stored


def record_view(data: Mapping[str, Any]) -> dict[str, Any]:
    """A record's dict (``record.to_dict``) as printed: keys camelCase, its times RFC 3339 (the thermal holds'
    ends included), an empty string null, ``policy_memory`` as stored."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in OPAQUE_KEYS:
            out[camel(key)] = value
        elif key == "thermal_hold_ends" and isinstance(value, Mapping):
            out[camel(key)] = {str(k): rfc3339(v) for k, v in value.items()}
        elif key in TIME_KEYS and (value is None or isinstance(value, int | float)):
            out[camel(key)] = rfc3339(value)
        else:
            out[camel(key)] = _view(value)
    return out


def _view(value: Any) -> Any:
    if value == "":
        return None  # an absent value: null, as everywhere else
    if isinstance(value, Mapping):
        return record_view(value)
    if isinstance(value, list | tuple):
        return [_view(v) for v in value]
    return value


def breaker_view(breaker: Any, *, dry_run: bool = False, reset_requested: str | None = None) -> dict[str, Any]:
    """A ``policy.safety.CircuitBreaker`` as the schema's Breaker."""
    return {"open": bool(breaker.is_open), "dryRun": dry_run,
            "reason": or_none(breaker.reason) if breaker.is_open else None,
            "openedAt": rfc3339(breaker.opened_at) if breaker.is_open else None,
            "resetBy": or_none(breaker.reset_by), "resetAt": rfc3339(breaker.reset_at),
            "resetRequested": or_none(reset_requested),
            "domains": [{"label": t.label, "value": t.value, "reason": or_none(t.reason),
                         "openedAt": rfc3339(t.opened_at)} for t in breaker.domains],
            "look": _look_view(breaker.look)}


def _look_view(look: Any) -> dict[str, Any] | None:
    if look is None:
        return None
    return {"looking": bool(look.looking), "openedAt": rfc3339(look.opened_at), "until": rfc3339(look.until),
            "reason": or_none(look.reason), "nodes": list(look.nodes), "endedAt": rfc3339(look.ended_at),
            "outcome": or_none(look.outcome)}


def pause_view(pause: Any) -> dict[str, Any] | None:
    """A ``policy.safety.Pause`` as the schema's Pause; None when not paused."""
    if not pause.paused:
        return None
    return {"by": or_none(pause.by), "reason": or_none(pause.reason), "at": rfc3339(pause.at)}


def source_view(source: Any) -> dict[str, Any] | None:
    if source is None:
        return None
    return {"problem": source.problem, "detail": or_none(source.detail), "since": rfc3339(source.since),
            "by": or_none(source.by)}


def dry_run_view(journal: Any) -> dict[str, Any] | None:
    if journal is None:
        return None
    return {"identity": or_none(journal.identity), "started": rfc3339(journal.started),
            "updated": rfc3339(journal.updated), "leftOut": int(journal.left_out)}


REPLACED_RECENT_S = 24 * 3600.0  # `recent`: the last 24 hours
REPLACED_SHOWN = 5  # `latest`: the newest five


def replacement_view(entry: Entry) -> dict[str, Any]:
    """A history entry (``actions.replaced.Entry``) as the schema's Replacement."""
    return {"node": entry.node, "nodeUID": or_none(entry.node_uid), "providerID": or_none(entry.provider_id),
            "provider": entry.provider, "target": entry.target, "targetUID": or_none(entry.target_uid),
            "fault": or_none(entry.fault), "at": rfc3339(entry.at), "state": entry.state}


def replaced_view(entries: Sequence[Entry], now: float) -> dict[str, Any]:
    """The history (newest last) as the schema's Replaced."""
    recent = sum(1 for e in entries if e.at and now - e.at <= REPLACED_RECENT_S)
    return {"recent": recent, "total": len(entries),
            "latest": [replacement_view(e) for e in list(reversed(entries))[:REPLACED_SHOWN]]}


def fleet_status(nodes: Sequence[Mapping[str, Any]], *, dry_run: dict[str, Any] | None,
                 paused: dict[str, Any] | None, breaker: dict[str, Any] | None,
                 source: dict[str, Any] | None = None, shards: Sequence[Mapping[str, Any]] = (),
                 errors: Sequence[str] = (), replaced: dict[str, Any] | None = None) -> dict[str, Any]:
    """The FleetStatus object from its parts (each already in the schema's shape)."""
    out = sum(1 for n in nodes if n["state"] != "healthy" or not n["schedulable"])
    return frame(KIND_FLEET_STATUS, {
        "fleet": {"dryRun": dry_run, "paused": paused, "breaker": breaker, "source": source,
                  "budget": {"gpuNodes": len(nodes), "outOfService": out},
                  "shards": [dict(s) for s in shards], "replaced": replaced, "errors": list(errors)},
        "nodes": list(nodes)})


if __name__ == "__main__":  # `python -m gpuremediate.structured`: the schema's tables for docs/output.md
    print(markdown(), end="")
