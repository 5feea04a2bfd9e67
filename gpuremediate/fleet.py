"""The fleet at a glance for people: ``status`` (a table), ``explain NODE`` (the record in words),
``release NODE`` (a person clears ``quarantined``: back through validation)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuremediate.actions.nodes import (
    KEEP_CORDONED_ANNOTATION,
    is_excluded,
    is_gpu_node,
    keeps_cordoned,
    labels_of,
    name_of,
    node_unschedulable_of,
)
from gpuremediate.actions.pods import list_node_pods, skipped_by_namespace
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NODES
from gpuremediate.loops.custom_drain import FALLBACK
from gpuremediate.loops.diagnostics import DIAGNOSTICS, describe
from gpuremediate.loops.drain_scope import DETAIL_PREFIX
from gpuremediate.policy.config import PolicyFile
from gpuremediate.policy.safety import CircuitBreaker, Pause
from gpuremediate.policy.workflow import Rung
from gpuremediate.state import decide, states
from gpuremediate.state.record import NodeRecord, RecordError, node_patch, record_from_node


class FleetError(RuntimeError):
    """A request a person made that cannot be done; the message says why."""


@dataclass(frozen=True)
class StatusRow:
    node: str
    state: str
    since: float | None
    fault: str
    action: str
    blocked: str
    schedulable: bool
    excluded: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _ago(ts: float | None, now: float) -> str:
    if not ts:
        return "-"
    seconds = max(0, int(now - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def row_for(node: Mapping[str, Any]) -> StatusRow:
    record = record_from_node(node)
    name, schedulable, excluded = name_of(node), not node_unschedulable_of(node), is_excluded(node)
    if record is None:
        return StatusRow(name, states.HEALTHY, None, "-", "-", "-", schedulable, excluded)
    if isinstance(record, RecordError):
        return StatusRow(name, "unreadable", None, str(record), "-", "-", schedulable, excluded)
    fault = f"{record.fault.kind} {record.fault.code}".strip() if record.fault else "-"
    action = "-"
    if record.action:
        a = record.action
        action = f"{a.kind}#{a.attempt}" + (f" {a.name}" if a.name else "")
    blocked = f"{record.blocked.reason}: {record.blocked.detail}" if record.blocked else "-"
    return StatusRow(name, record.state, record.since, fault, action, blocked, schedulable, excluded)


def status_rows(client: KubeClient) -> list[StatusRow]:
    nodes = client.list(NODES).get("items", [])
    return [row_for(n) for n in sorted(nodes, key=name_of) if is_gpu_node(n)]


def safety_lines(pause: Pause, breaker: CircuitBreaker, now: float | None = None) -> list[str]:
    """What stops new work fleet-wide or per domain, one line each (none when nothing does)."""
    now = time.time() if now is None else now
    lines = []
    if pause.paused:
        since = f" {_ago(pause.at, now)} ago" if pause.at else ""
        lines.append(f"PAUSED by {pause.by or '?'}{since}: {pause.reason or '-'} (no new work; `gpuremediate resume`)")
    if breaker.is_open:
        lines.append(f"CIRCUIT BREAKER OPEN: {breaker.reason} (`gpuremediate breaker reset`)")
    lines += [f"DOMAIN BREAKER OPEN for {t.label}={t.value}: {t.reason}" for t in breaker.domains]
    return lines


def render_status(rows: Iterable[StatusRow], now: float | None = None, header_lines: Iterable[str] = ()) -> str:
    now = time.time() if now is None else now
    header = ("NODE", "STATE", "SINCE", "FAULT", "ACTION", "BLOCKED")
    table = [header]
    for r in rows:
        state = r.state + (" (excluded)" if r.excluded else "") + ("" if r.schedulable else " *")
        table.append((r.node, state, _ago(r.since, now), r.fault, r.action, r.blocked))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    return "".join(line + "\n" for line in header_lines) + "\n".join(lines) + "\n* unschedulable\n"


def rung_line(record: NodeRecord, ladder: Sequence[Rung] = ()) -> str | None:
    """``rung 2/3 reboot, attempt 1/1`` for a repair attempt; ``ladder``: the fault's rungs with their attempts
    resolved (without it, from the record alone: ``rung 2 reboot, attempt 1``)."""
    action = record.action
    if record.state != states.REPAIRING or action is None or action.kind == DIAGNOSTICS:
        return None
    if not ladder:
        return f"rung {action.rung + 1} {action.kind}, attempt {action.attempt}"
    index = min(action.rung, len(ladder) - 1)
    attempts = f"/{ladder[index].attempts}" if ladder[index].attempts else ""
    return f"rung {index + 1}/{len(ladder)} {action.kind}, attempt {action.attempt}{attempts}"


def explain(record: NodeRecord | RecordError | None, node: str, now: float | None = None, *,
            keep_cordoned: bool = False, skipped: Mapping[str, int] | None = None,
            ladder: Sequence[Rung] = ()) -> str:
    now = time.time() if now is None else now
    if record is None:
        return f"{node}: healthy. gpuremediate has never acted on this node.\n"
    if isinstance(record, RecordError):
        return f"{node}: the record annotation cannot be read ({record}). Nothing will be undone automatically.\n"
    lines = [f"{node}: {record.state} for {_ago(record.since, now)} (reason {record.reason or '-'})."]
    if record.message:
        lines.append(f"  Why: {record.message}")
    if record.fault:
        f = record.fault
        gpus = ", ".join(f.gpus) or "-"
        lines.append(f"  Open fault: {f.kind} {f.code} on GPU(s) {gpus}; recommended action {f.action}; "
                     f"first seen {_ago(f.first_seen, now)} ago.")
    if record.action:
        a = record.action
        deadline = f", deadline in {_ago(now, a.deadline)}" if a.deadline and a.deadline > now else ""
        lines.append(f"  In progress: {a.kind} attempt {a.attempt} {a.name or '(not created yet)'}, "
                     f"started {_ago(a.started, now)} ago{deadline}.")
        if a.created_at is not None:  # plugin deadlines count from the object's creation, not from the start
            lines.append(f"  Waited {_ago(a.created_at, now)} since its object was created"
                         + (f" (timeout after {_ago(a.created_at, a.deadline)})." if a.deadline else "."))
        if a.kind == "drain" and a.detail.startswith(DETAIL_PREFIX):  # widened for the repair that follows
            lines.append(f"  Drain {a.detail}.")
        elif a.kind == "drain" and a.detail == FALLBACK:
            lines.append("  Drain: the drain plugin gave up (customDrain.onTimeout = builtin); the built-in drain "
                         "took over.")
        if a.step:  # the GPU Operator reset sequence: operands-gone, reset, operands-back, failed
            since = f" for {_ago(a.step_since, now)}" if a.step_since is not None else ""
            lines.append(f"  Step: {a.step}{since}" + (f" ({a.detail})." if a.step == "failed" and a.detail else "."))
        if a.gpu_ids:  # chosen when the operands went off
            lines.append(f"  Resets GPU(s) {', '.join(a.gpu_ids)}" + (f" ({', '.join(a.gpu_uuids)})." if a.gpu_uuids
                                                                     and a.gpu_uuids != a.gpu_ids else "."))
        rung = rung_line(record, ladder)
        if rung:
            lines.append(f"  Escalation ladder: {rung}.")
    if record.fault and record.fault.diagnostics:
        lines.append(f"  Diagnostics: {describe(record.fault.diagnostics, node)}.")
    if record.blocked:
        lines.append(f"  Waiting: {record.blocked.reason} ({record.blocked.detail}) "
                     f"since {_ago(record.blocked.since, now)} ago.")
    if skipped:
        counts = ", ".join(f"{n} pods in {ns}" for ns, n in sorted(skipped.items()))
        lines.append(f"  Drain skipped: {counts} (drain.skip_namespaces: neither evicted nor waited for).")
    if keep_cordoned:
        lines.append(f"  A person set {KEEP_CORDONED_ANNOTATION}: gpuremediate will not uncordon this node.")
    elif record.was_unschedulable:
        lines.append("  The node was unschedulable before gpuremediate touched it: it will never uncordon it.")
    elif record.cordoned_by_us:
        lines.append("  gpuremediate cordoned this node and will uncordon it once validation passes.")
    if record.stopped:
        lines.append("  A person uncordoned the node mid-flow: gpuremediate stopped working on that fault.")
    if record.state == states.QUARANTINED:
        lines.append(f"  Needs a person. When fixed: gpuremediate release {node}")
    if record.history:
        lines.append("  Repair history (newest last):")
        lines += [f"    {_ago(h.at, now)} ago: {h.kind} {h.code} → {h.action}: {h.outcome}" for h in record.history]
    return "\n".join(lines) + "\n"


def explain_node(client: KubeClient, node: str, policy: PolicyFile | None = None) -> str:
    """With the ``policy``, a draining node's pods in its drain.skip_namespaces are counted."""
    try:
        obj = client.get(NODES, node)
    except errors.NotFound:
        raise FleetError(f"node {node!r} not found") from None
    record = record_from_node(obj)
    skipped: dict[str, int] = {}
    skip = policy.for_node(labels_of(obj)).drain.skip_namespaces if policy is not None else ()
    if skip and isinstance(record, NodeRecord) and record.state == states.DRAINING:
        skipped = skipped_by_namespace(list_node_pods(client, node), skip)
    return explain(record, node, keep_cordoned=keeps_cordoned(obj), skipped=skipped,
                   ladder=_ladder(policy, obj, record))


def _ladder(policy: PolicyFile | None, node: Mapping[str, Any], record: NodeRecord | RecordError | None
            ) -> tuple[Rung, ...]:
    """The open fault's escalation ladder under ``policy``, each rung's attempts resolved (() without either)."""
    if policy is None or not isinstance(record, NodeRecord) or record.fault is None:
        return ()
    remediation = policy.for_node(labels_of(node)).remediation
    return tuple(dataclasses.replace(r, attempts=remediation.attempts_of(r, policy.cluster.actions))
                 for r in remediation.ladder_for(record.fault.action))


RELEASE_ATTEMPTS = 5


def release(client: KubeClient, node: str, by: str, now: float | None = None) -> NodeRecord:
    """quarantined → validating (validation decides whether it is healthy), guarded by resourceVersion.

    Other writers change Nodes all the time on a real cluster (taints, heartbeats, labels): a 409 reads the
    node again and, if it is still quarantined, releases that version (a few times before giving up)."""
    for _ in range(RELEASE_ATTEMPTS - 1):
        try:
            return _release_once(client, node, by, now)
        except errors.Conflict:
            continue
    try:
        return _release_once(client, node, by, now)
    except errors.Conflict:
        raise FleetError(f"{node} kept changing while releasing it; run the command again") from None


def _release_once(client: KubeClient, node: str, by: str, now: float | None) -> NodeRecord:
    now = time.time() if now is None else now
    try:
        obj = client.get(NODES, node)
    except errors.NotFound:
        raise FleetError(f"node {node!r} not found") from None
    record = record_from_node(obj)
    if isinstance(record, RecordError):
        raise FleetError(f"{node}: record unreadable ({record}); fix or remove the annotation by hand") from None
    if record is None or record.state != states.QUARANTINED:
        state = record.state if record else states.HEALTHY
        raise FleetError(f"{node} is {state}, not quarantined: nothing to release")
    released = decide.release(record, now, by)
    rv = str(obj["metadata"].get("resourceVersion", ""))
    client.patch(NODES, node, node_patch(released, resource_version=rv))  # a 409: read again, decide again
    return released
