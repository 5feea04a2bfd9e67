"""The fleet at a glance for people: ``status`` (a table), ``explain NODE`` (the record in words),
``release NODE`` (a person clears ``quarantined``: back through validation)."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuremediate import structured
from gpuremediate.actions.breaker import SOURCE_NEVER_READ, SourceProblem
from gpuremediate.actions.dry_run_journal import Journal
from gpuremediate.actions.nodes import (
    KEEP_CORDONED_ANNOTATION,
    gpu_count,
    is_excluded,
    is_gpu_node,
    keeps_cordoned,
    labels_of,
    name_of,
    node_unschedulable_of,
)
from gpuremediate.actions.pods import list_node_pods, skipped_by_namespace
from gpuremediate.actions.replaced import DELETED, Entry, HistoryError, ReplacedHistory
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NODES
from gpuremediate.loops.custom_drain import FALLBACK
from gpuremediate.loops.diagnostics import DIAGNOSTICS, describe
from gpuremediate.loops.drain_device_taint import DETAIL_PREFIX as ISOLATION_DETAIL
from gpuremediate.loops.drain_scope import DETAIL_PREFIX
from gpuremediate.policy.conditions import nic_said
from gpuremediate.policy.config import PolicyFile
from gpuremediate.policy.fabric import KIND_DOMAIN
from gpuremediate.policy.network import NIC_TAINT_KEY
from gpuremediate.policy.preflight import last_preflight
from gpuremediate.policy.safety import CircuitBreaker, Pause
from gpuremediate.policy.workflow import Rung
from gpuremediate.signals.fabric import CLIQUE_LABEL
from gpuremediate.state import decide
from gpuremediate.structured import or_none, rfc3339
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import (
    ACTION_REPLACE,
    KIND_LINK_DEGRADED,
    KIND_SLOW_GPU,
    KIND_THERMAL,
    KIND_TREND,
    NETWORK_KINDS,
)
from gpuremediate.vocab.preflight import KIND_PREFLIGHT
from gpuremediate.vocab.record import (
    BLOCK_BREAKER,
    BLOCK_BUDGET,
    BLOCK_GPU_PODS,
    BLOCK_PAUSED,
    BLOCK_PDB,
    EFFECT_UNHEALTHY,
    Blocked,
    Isolation,
    NodeRecord,
    RecordError,
    gpu_held_out,
    node_patch,
    record_from_node,
    to_dict,
)


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
    gpus: int = 0  # the node's GPUs (its GPU resources' capacity)
    reason: str = ""  # the record's reason: the fault or the lifecycle step that put it in its state
    holder: str = "-"  # who or what holds its wait (holder()): the pauser, the PDB, the nodes filling the budget
    isolated: tuple[str, ...] = ()  # the GPUs (UUIDs) a DeviceTaintRule of ours takes out alone
    domain: str = ""  # its NVLink domain (GPU Feature Discovery's nvidia.com/gpu.clique); "" in none
    record: NodeRecord | RecordError | None = None  # what the row was said from (None: never acted on)
    would: bool = False  # the record is the one a running dry run would have written

    @property
    def gpus_in_service(self) -> str:
        """``7/8 GPUs`` for a node with an isolated GPU ("" for any other node)."""
        return f"{max(0, self.gpus - len(self.isolated))}/{self.gpus} GPUs" if self.isolated else ""

    def as_dict(self) -> dict[str, Any]:
        """The row as ``-o json|yaml`` print it: the schema's Node (gpuremediate/structured.py), said from the
        record rather than from the table's cells (no ``-``, times RFC 3339, an absent value null)."""
        record = self.record
        known = record if isinstance(record, NodeRecord) else None
        fault = None
        if known is not None and (known.fault or known.held) is not None:
            f = known.fault or known.held
            assert f is not None
            fault = {"kind": f.kind, "code": or_none(f.code), "gpus": list(f.gpus), "action": or_none(f.action),
                     "message": or_none(f.message), "held": known.fault is None, "firstSeen": rfc3339(f.first_seen),
                     "lastSeen": rfc3339(f.last_seen)}
        action = None
        if known is not None and known.action is not None:
            a = known.action
            action = {"kind": a.kind, "attempt": a.attempt, "rung": a.rung, "name": or_none(a.name),
                      "started": rfc3339(a.started), "deadline": rfc3339(a.deadline), "step": or_none(a.step)}
        blocked = None
        if known is not None and known.blocked is not None:
            b = known.blocked
            blocked = {"reason": b.reason, "detail": or_none(b.detail), "since": rfc3339(b.since)}
        watching = [{"gpu": gpu, "hotSince": rfc3339(hot), "cordonAt": rfc3339(known.thermal_hold_ends.get(gpu))}
                    for gpu, hot in sorted(_hot_since(known).items())] if known is not None else []
        held_by = holder(known.blocked) if known is not None else "-"
        return {
            "name": self.node,
            "state": "unreadable" if isinstance(record, RecordError) else known.state if known else states.HEALTHY,
            "stateText": self.state, "dryRun": self.would, "since": rfc3339(self.since),
            "schedulable": self.schedulable, "excluded": self.excluded, "gpus": self.gpus,
            "gpusInService": max(0, self.gpus - len(self.isolated)), "isolatedGPUs": list(self.isolated),
            "domain": or_none(self.domain), "reason": or_none(known.reason) if known else None,
            "message": or_none(known.message) if known else None, "fault": fault, "watching": watching,
            "action": action, "blocked": blocked, "heldBy": None if held_by == "-" else held_by,
            "error": str(record) if isinstance(record, RecordError) else None,
        }


def holder(blocked: Blocked | None) -> str:
    """Who or what a wait waits on, read from its detail: the person who paused, the PodDisruptionBudget (or
    pod) refusing an eviction, the nodes filling the budget, the pods holding GPUs, the breaker; "-" else."""
    if blocked is None:
        return "-"
    detail = blocked.detail
    found: re.Match[str] | None = None
    if blocked.reason == BLOCK_PAUSED:
        found = re.match(r"paused by (.*?): ", detail)
    elif blocked.reason == BLOCK_PDB:
        return detail.split(": ", 1)[0] or "-"
    elif blocked.reason == BLOCK_BUDGET:
        found = re.search(r"out of service \((.*?)\)", detail)
        if found is None or found.group(1) == "none":
            return "-"
        inner = found.group(1)  # the fleet's "name: why; name: why", a domain's "name, name"
        return ",".join(part.split(":")[0].strip() for part in inner.split("; " if ": " in inner else ", "))
    elif blocked.reason == BLOCK_GPU_PODS:
        found = re.search(r"still held by (.*?) \(drain", detail)
    elif blocked.reason == BLOCK_BREAKER:
        domain = re.match(r"domain breaker open for (\S+?): ", detail)
        return f"domain {domain.group(1)}" if domain else "circuit breaker"
    return found.group(1) if found is not None else "-"


def _ago(ts: float | None, now: float) -> str:
    if not ts:
        return "-"
    seconds = max(0, int(now - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


WOULD = {states.CORDONED: "would cordon", states.DRAINING: "would drain", states.VALIDATING: "would validate",
         states.QUARANTINED: "would be quarantined", states.MAINTENANCE: "would hold for maintenance"}


def would(record: NodeRecord) -> str:
    """A dry run's state in words: ``would drain``, ``would reboot`` (a repair says its action)."""
    if record.state == states.REPAIRING:
        return f"would {record.action.kind}" if record.action is not None else "would repair"
    if record.state == states.HEALTHY:
        return "would wait (healthy)" if record.blocked is not None else "healthy"
    waiting = " (waiting)" if _state_word(record) != record.state else ""
    return WOULD.get(record.state, f"would be {record.state}") + waiting


def dry_run_line(journal: Journal, now: float | None = None) -> str:
    now = time.time() if now is None else now
    left = f"; {journal.left_out} nodes left out (journal full)" if journal.left_out else ""
    return (f"DRY RUN: the controller ({journal.identity or '?'}, for {_ago(journal.started, now)}) writes nothing "
            f"to Nodes; the table shows what it would do (updated {_ago(journal.updated, now)} ago{left})")


def row_for(node: Mapping[str, Any], dry_run: Journal | None = None, now: float | None = None,
            domain_label: str = CLIQUE_LABEL) -> StatusRow:
    """The node's line, its NVLink domain from ``domain_label``; with a live dry-run journal, the record the dry
    run would have written."""
    row = _row_for(node, dry_run, now)
    return dataclasses.replace(row, domain=labels_of(node).get(domain_label, ""))


def _row_for(node: Mapping[str, Any], dry_run: Journal | None = None, now: float | None = None) -> StatusRow:
    name, now = name_of(node), time.time() if now is None else now
    if dry_run is not None and name in dry_run.records:
        return _dry_row(_row_for(node, now=now), dry_run.records[name], now)
    record = record_from_node(node)
    schedulable, excluded, gpus = not node_unschedulable_of(node), is_excluded(node), gpu_count(node)
    if record is None:
        return StatusRow(name, states.HEALTHY, None, "-", "-", "-", schedulable, excluded, gpus)
    if isinstance(record, RecordError):
        return StatusRow(name, "unreadable", None, str(record), "-", "-", schedulable, excluded, gpus, record=record)
    action = "-"
    if record.action:
        a = record.action
        action = f"{a.kind}#{a.attempt}" + (f" {a.name}" if a.name else "")
    blocked = f"{record.blocked.reason}: {record.blocked.detail}" if record.blocked else "-"
    return StatusRow(name, _state_word(record), record.since, _fault_word(record, now), action, blocked, schedulable,
                     excluded, gpus, record.reason, holder(record.blocked), isolated_gpus(record), record=record)


def isolated_gpus(record: NodeRecord) -> tuple[str, ...]:
    """The GPUs taken out alone, by a DeviceTaintRule of ours or the device plugin (the node stays in service)."""
    isolation = record.isolation
    return (isolation.uuid,) if isolation is not None and gpu_held_out(record) else ()


def _fault_word(record: NodeRecord, now: float) -> str:
    """The open fault, or the one a hold keeps from being acted on (``xid 48 (held)``), or a GPU hot within its
    thermal hold (``thermal (watched, cordon in 40s)``)."""
    if record.fault is not None and record.fault.kind in NETWORK_KINDS:  # explain names the GPUs
        rail = next((s.rail for s in nic_said(record.fault.message, record.fault.code) if s.rail), ())
        return f"{record.fault.kind} {record.fault.code}" + (f" ({len(rail)} GPUs on its rail)" if rail else "")
    if record.fault is not None:
        return f"{record.fault.kind} {record.fault.code}".strip()
    if record.held is not None:
        return f"{record.held.kind} {record.held.code} (held)".strip()
    watched = _hot_since(record)
    if not watched:
        return "-"
    ends = [record.thermal_hold_ends[key] for key in watched if key in record.thermal_hold_ends]
    return f"{KIND_THERMAL} (watched" + (f", cordon in {_ago(now, min(ends))})" if ends and min(ends) > now else ")")


def _state_word(record: NodeRecord) -> str:
    """The state, said as waiting when nothing happens yet: a drain not started (budget, breaker, a gate)."""
    if record.state == states.DRAINING and record.action is None and record.blocked is not None:
        return "draining (waiting)"
    return record.state


def _dry_row(real: StatusRow, record: NodeRecord, now: float) -> StatusRow:
    action = f"{record.action.kind}#{record.action.attempt}" if record.action else "-"
    blocked = f"{record.blocked.reason}: {record.blocked.detail}" if record.blocked else "-"
    return dataclasses.replace(real, state=would(record), since=record.since, fault=_fault_word(record, now),
                               action=action, blocked=blocked, reason=record.reason, holder=holder(record.blocked),
                               isolated=isolated_gpus(record), record=record, would=True)


def status_rows(client: KubeClient, dry_run: Journal | None = None,
                domain_label: str = CLIQUE_LABEL) -> list[StatusRow]:
    nodes, now = client.list(NODES).get("items", []), time.time()
    return [row_for(n, dry_run, now, domain_label) for n in sorted(nodes, key=name_of) if is_gpu_node(n)]


def safety_lines(pause: Pause, breaker: CircuitBreaker, now: float | None = None,
                 source: SourceProblem | None = None) -> list[str]:
    """What stops new work fleet-wide or per domain, one line each (none when nothing does); first, a GPU-health
    source the controller cannot read (no fault anywhere is seen while it has never been read)."""
    now = time.time() if now is None else now
    lines = []
    if source is not None:
        what = "NEVER READ" if source.problem == SOURCE_NEVER_READ else "TOO SLOW"
        by = f", {source.by}" if source.by else ""
        lines.append(f"GPU HEALTH SOURCE {what} (since {_ago(source.since, now)} ago{by}): {source.detail}")
    if pause.paused:
        since = f" {_ago(pause.at, now)} ago" if pause.at else ""
        lines.append(f"PAUSED by {pause.by or '?'}{since}: {pause.reason or '-'} (no new work; `gpuremediate resume`)")
    if breaker.is_open:
        lines.append(f"CIRCUIT BREAKER OPEN: {breaker.reason} (`gpuremediate breaker reset`)")
    lines += [f"DOMAIN BREAKER OPEN for {t.label}={t.value}: {t.reason}" for t in breaker.domains]
    look = breaker.looking
    if look is not None and not breaker.is_open:
        lines.append(f"STORM LOOK: {look.describe(now)} (`gpuremediate breaker status`)")
    return lines


def read_replaced(client: KubeClient, namespace: str) -> list[Entry]:
    """The replaced-node history (newest last); HistoryError when its ConfigMap cannot be read."""
    return ReplacedHistory(client, namespace).entries()


def replaced_lines(entries: Sequence[Entry], now: float | None = None) -> list[str]:
    """``status``'s lines about the replaced nodes (none when none was): how many lately, the newest few."""
    if not entries:
        return []
    now = time.time() if now is None else now
    view = structured.replaced_view(entries, now)
    lines = [f"REPLACED: {view['recent']} node(s) in the last 24h, {view['total']} in the history "
             f"(`gpuremediate explain NODE`)"]
    for e in list(reversed(entries))[:structured.REPLACED_SHOWN]:
        lines.append(f"  {e.node}  {e.provider}  {e.target}  {_utc(e.at)} ({_ago(e.at, now)} ago)  {e.state}")
    return lines


def replacement_line(entry: Entry, now: float) -> str:
    """One replacement in words, for ``explain``."""
    went = "deleted" if entry.state == DELETED else "being deleted (the delete was not confirmed sent)"
    parts = [f"{entry.target} {went} ({entry.provider}) {_utc(entry.at)} ({_ago(entry.at, now)} ago)"]
    if entry.fault:
        parts.append(f"for {entry.fault}")
    if entry.node_uid:
        parts.append(f"Node uid {entry.node_uid}")
    if entry.provider_id:
        parts.append(f"instance {entry.provider_id}")
    return ", ".join(parts)


def render_status(rows: Iterable[StatusRow], now: float | None = None, header_lines: Iterable[str] = (),
                  wide: bool = False, by_domain: bool = False) -> str:
    """The table; ``wide`` (``-o wide``) adds the node's GPUs, the record's reason and what holds its wait. A
    DOMAIN column when any node is in an NVLink domain; ``by_domain`` (``--by domain``) groups the rows by it,
    each group under a line counting its trays out of service."""
    now, rows = time.time() if now is None else now, list(rows)
    if not by_domain:
        return "".join(line + "\n" for line in header_lines) + _table(rows, now, wide) + "* unschedulable\n"
    groups: dict[str, list[StatusRow]] = {}
    for r in sorted(rows, key=lambda r: (r.domain == "", r.domain, r.node)):
        groups.setdefault(r.domain, []).append(r)
    parts = [line + "\n" for line in header_lines]
    for domain, members in groups.items():
        out = sum(1 for r in members if r.state != states.HEALTHY or not r.schedulable)
        parts.append(f"DOMAIN {domain or '(none)'}: {len(members)} node(s), {out} out of service\n")
        parts.append(_table([dataclasses.replace(r, domain="") for r in members], now, wide) + "\n")
    return "".join(parts) + "* unschedulable\n"


def _table(rows: Sequence[StatusRow], now: float, wide: bool) -> str:
    header: tuple[str, ...] = ("NODE", "STATE", "SINCE", "FAULT", "ACTION", "BLOCKED")
    if wide:
        header = (*header[:2], "GPUS", *header[2:4], "REASON", header[4], header[5], "HELD BY")
    domains = any(r.domain for r in rows)
    if domains:
        header = (header[0], "DOMAIN", *header[1:])
    table = [header]
    for r in rows:
        state = r.state + (" (excluded)" if r.excluded else "") + ("" if r.schedulable else " *")
        state += f" ({r.gpus_in_service})" if r.isolated else ""
        cells: tuple[str, ...] = (r.node, state, _ago(r.since, now), r.fault, r.action, r.blocked)
        if wide:
            in_service = r.gpus_in_service.removesuffix(" GPUs") or str(r.gpus)
            cells = (*cells[:2], in_service, *cells[2:4], r.reason or "-", cells[4], cells[5], r.holder)
        if domains:
            cells = (cells[0], r.domain or "-", *cells[1:])
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    return "\n".join(lines) + "\n"


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
            ladder: Sequence[Rung] = (), hold_s: float | None = None, dry_run: bool = False,
            unschedulable: bool = False) -> str:
    """``hold_s``: the node's [thermal].hold_s, when the policy is known (a watched GPU's time left, for a
    record without its thermal_hold_ends). ``dry_run``: the record is what a dry run would have written.
    ``unschedulable``: the Node's spec.unschedulable (a cordon that is not gpuremediate's is said as such)."""
    now = time.time() if now is None else now
    if record is None and unschedulable:
        return (f"{node}: healthy, but unschedulable: a person (or another tool) cordoned it. gpuremediate has "
                f"never acted on this node.\n  Ends: {PERSON_CORDON_ENDS}\n")
    if record is None:
        return f"{node}: healthy. gpuremediate has never acted on this node.\n"
    if isinstance(record, RecordError):
        return f"{node}: the record annotation cannot be read ({record}). Nothing will be undone automatically.\n"
    lines = [f"{node}: {record.state} for {_ago(record.since, now)} (reason {record.reason or '-'})."]
    if record.message:
        lines.append(f"  Why: {record.message}")
    if record.fault and record.fault.kind in NETWORK_KINDS:
        lines += _nic_lines(record, now)
    elif record.fault:
        f = record.fault
        gpus = ", ".join(f.gpus) or "-"
        lines.append(f"  Open fault: {f.kind} {f.code} on GPU(s) {gpus}; recommended action {f.action}; "
                     f"first seen {_ago(f.first_seen, now)} ago.")
        preflight = last_preflight(f.message) if f.kind == KIND_PREFLIGHT else None
        if preflight is not None:
            lines.append(f"  Failed preflight: pod {preflight.pod} at {preflight.at}, GPU(s) "
                         f"{', '.join(preflight.gpus) or '-'} ({preflight.check or '?'}; {preflight.count} pod(s) in "
                         f"the window): {preflight.line}")
        if f.kind == KIND_DOMAIN:
            domain = f.fingerprint.partition(":")[2].rpartition("@")[0]
            lines.append(f"  Held by the domain decision for {domain}: the NVLink domain is handled as one unit "
                         f"(every tray drained, then {f.action}); this tray's own repairs wait for it.")
    if record.held:
        h = record.held
        lines.append(f"  Held fault: {h.kind} {h.code} on GPU(s) {', '.join(h.gpus) or '-'} ({h.message}); first seen "
                     f"{_ago(h.first_seen, now)} ago. Not acted on while the hold below lasts: {h.action} once it "
                     f"ends.")
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
    lines += _isolation_lines(record, now)
    if record.fault and record.fault.diagnostics:
        lines.append(f"  Diagnostics: {describe(record.fault.diagnostics, node)}.")
    if record.blocked:
        lines.append(f"  Waiting: {record.blocked.reason} ({record.blocked.detail}) "
                     f"since {_ago(record.blocked.since, now)} ago.")
    lines += _watching_lines(record, now, hold_s)
    if skipped:
        counts = ", ".join(f"{n} pods in {ns}" for ns, n in sorted(skipped.items()))
        lines.append(f"  Drain skipped: {counts} (drain.skip_namespaces: neither evicted nor waited for).")
    if keep_cordoned:
        lines.append(f"  A person set {KEEP_CORDONED_ANNOTATION}: gpuremediate will not uncordon this node.")
    elif record.was_unschedulable:
        lines.append("  The node was unschedulable before gpuremediate touched it: it will never uncordon it.")
    elif record.cordoned_by_us and _replacing(record):
        lines.append(f"  gpuremediate {'would cordon' if dry_run else 'cordoned'} this node and will not uncordon it: "
                     "a new Node takes its place (validated first where [remediation.replace] startup_taint asks).")
    elif record.cordoned_by_us and dry_run:
        lines.append(f"  gpuremediate would cordon this node, and uncordon it {_uncordon_when(record)}.")
    elif record.cordoned_by_us:
        lines.append(f"  gpuremediate cordoned this node and will uncordon it {_uncordon_when(record)}.")
    if record.stopped:
        lines.append("  A person uncordoned the node mid-flow: gpuremediate stopped working on that fault.")
    ends = _ends(record) or (PERSON_CORDON_ENDS if unschedulable and not record.cordoned_by_us else "")
    if ends:
        lines.append(f"  Ends: {ends}")
    if record.state == states.QUARANTINED:
        lines.append(f"  Needs a person. When fixed: gpuremediate release {node}")
    if record.history:
        lines.append("  Repair history (newest last):")
        last = len(record.history) - 1
        lines += [f"    {_ago(h.at, now)} ago: {h.kind} {h.code} → {h.action}: "
                  f"{_outcome_words(h.outcome, i == last and record.reason == states.VALIDATION_FAILED)}"
                  for i, h in enumerate(record.history)]
    return "\n".join(lines) + "\n"


def _nic_lines(record: NodeRecord, now: float) -> list[str]:
    """A NIC fault: the NIC, each of its ports' findings with the GPUs on its rail, and the taint beside the cordon."""
    assert record.fault is not None
    f = record.fault
    said = nic_said(f.message, f.code)
    rail = next((s.rail for s in said if s.rail), f.gpus)
    lines = [f"  Open fault: {f.kind} on NIC {f.code}; GPUs on its rail: {', '.join(rail) or 'not known'}; "
             f"recommended action {f.action}; first seen {_ago(f.first_seen, now)} ago."]
    lines += [f"    {s.kind} {s.port}: {s.detail}" for s in said]
    if record.state != states.HEALTHY:
        lines.append(f"  Tainted {NIC_TAINT_KEY}={f.code}:NoSchedule beside the cordon while held for it: running "
                     "pods stay; new pods land only if they tolerate the key (single-node work); taken off with "
                     "the cordon.")
    return lines


def _isolation_lines(record: NodeRecord, now: float) -> list[str]:
    """``[isolation] scope = "gpu"``: which GPU is out, by which rule, and what the flow waits for; or why the
    flow is node-level."""
    isolation = record.isolation
    if isolation is None:
        return []
    kept = f" (DeviceTaintRule {isolation.rule} stays until the node is validated)" if isolation.rule else ""
    if not isolation.at_gpu:
        return [f"  Isolation: node-level: {isolation.why}{kept}."]
    if isolation.by_device_plugin:
        return _device_plugin_lines(record, isolation, now)
    if not isolation.rule:
        return [f"  Isolation: GPU {isolation.uuid} alone; its DeviceTaintRule is not written yet (the node is not "
                "cordoned)."]
    since = f" for {_ago(isolation.effect_since, now)}" if isolation.effect_since is not None else ""
    lines = [f"  Isolation: GPU {isolation.uuid} ({isolation.driver}/{isolation.pool}/{isolation.device}) taken out "
             f"alone by DeviceTaintRule {isolation.rule}, effect {isolation.effect}{since}; the node stays "
             "schedulable."]
    action = record.action
    if action is not None and action.kind == "drain" and action.detail.startswith(ISOLATION_DETAIL):
        lines.append(f"  Drain: {action.detail.removeprefix(ISOLATION_DETAIL)}.")
    elif record.state == states.DRAINING and isolation.effect != "NoExecute":
        lines.append("  Next: NoExecute, then the eviction controller deletes the pods holding that GPU.")
    elif record.state == states.REPAIRING:
        lines.append(f"  Next: the reset of GPU {isolation.uuid} only, then its validation; the rule goes after.")
    elif record.state == states.VALIDATING:
        lines.append("  Next: once the validation of that GPU passes, the rule is deleted and the GPU returns.")
    return lines


def _device_plugin_lines(record: NodeRecord, isolation: Isolation, now: float) -> list[str]:
    """A GPU isolated by the device plugin (no DRA): whether allocatable shows it gone yet, what comes next."""
    since = f" for {_ago(isolation.effect_since, now)}" if isolation.effect_since is not None else ""
    if isolation.effect != EFFECT_UNHEALTHY:
        lines = [f"  Isolation: GPU {isolation.uuid} alone, by the device plugin (no DRA device taint); waiting{since} "
                 "for the node's allocatable nvidia.com/gpu to show it gone (else node-level at "
                 "[isolation] device_plugin_wait_s). The node is not cordoned."]
    else:
        lines = [f"  Isolation: GPU {isolation.uuid} taken out alone by the device plugin (unhealthy: out of the "
                 f"node's allocatable nvidia.com/gpu){since}; only its pods are evicted, the node stays schedulable."]
    action = record.action
    if action is not None and action.kind == "drain" and action.detail.startswith(ISOLATION_DETAIL):
        lines.append(f"  Drain: {action.detail.removeprefix(ISOLATION_DETAIL)}.")
    elif record.state == states.REPAIRING:
        lines.append(f"  Next: the reset of GPU {isolation.uuid} only, then the node's validation (node-level: "
                     "cordoned for it, unless [isolation] validation = \"privileged\").")
    return lines


def _watching_lines(record: NodeRecord, now: float, hold_s: float | None) -> list[str]:
    """A GPU running hot within its thermal hold: watched, cordoned when the hold is over (when: the record's
    thermal_hold_ends, else hot_since + the policy's hold_s, else unknown)."""
    lines = []
    for key, hot in sorted(_hot_since(record).items()):
        until = record.thermal_hold_ends.get(key, hot + hold_s if hold_s is not None else None)
        lines.append(f"  Watching: GPU {key} hot for {_ago(hot, now)}{_hold_left(hot, until, now)}.")
    return lines


def _hot_since(record: NodeRecord) -> dict[str, float]:
    """The GPUs hot within their thermal hold (not cordoned yet), from the record's policy memory."""
    timers = record.policy_memory.get("thermal") if isinstance(record.policy_memory, Mapping) else None
    hot = {}
    for key, timer in timers.items() if isinstance(timers, Mapping) else ():
        since = timer.get("hot_since") if isinstance(timer, Mapping) else None
        if isinstance(since, int | float) and not isinstance(since, bool) and timer.get("cordoned_since") is None:
            hot[str(key)] = float(since)
    return hot


def _hold_left(hot: float, until: float | None, now: float) -> str:
    if until is None:
        return " (cordoned when [thermal].hold_s is over)"
    hold = f" of its {round(until - hot, 3):g} s hold"
    if until <= now:
        return f"{hold}, over at {_utc(until)}: cordoned at its next reading if it is still hot"
    return f"{hold}: cordoned in {_ago(now, until)} (at {_utc(until)}) if it stays hot"


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


PERSON_CORDON_ENDS = ("a person uncordoning it (`kubectl uncordon`); until then it counts against [budget] "
                      "max_unavailable.")


def _thermal(record: NodeRecord) -> bool:
    return record.state == states.CORDONED and record.fault is not None and record.fault.kind == KIND_THERMAL


def _degraded(record: NodeRecord) -> bool:
    return record.state == states.CORDONED and record.fault is not None and record.fault.kind in (
        KIND_SLOW_GPU, KIND_LINK_DEGRADED, KIND_TREND)


def _nic_cordon(record: NodeRecord) -> bool:
    return record.state == states.CORDONED and record.fault is not None and record.fault.kind in NETWORK_KINDS


def _uncordon_when(record: NodeRecord) -> str:
    if _nic_cordon(record):
        return ("once the NIC's port is healthy again for [network] clear_after_s (the agent's GPUNetworkHealthy "
                "True, or node_exporter's series), the taint with it (no repair, no validation)")
    if _thermal(record):
        return "once its GPUs have stayed cool for the policy's [thermal].clear_hold_s (no repair, no validation)"
    if _degraded(record):
        return ("once the GPU is no longer degraded for the policy's [degradation] clear hold (clear_hold_s, "
                "link_clear_s; no repair, no validation)")
    if record.state == states.CORDONED:
        return "only if a worse fault takes it through a repair and its validation passes (else a person does)"
    if record.state == states.QUARANTINED:
        return "only after a person releases it and validation passes"
    return "once validation passes"


def _replacing(record: NodeRecord) -> bool:
    return record.state == states.REPAIRING and record.action is not None and record.action.kind == ACTION_REPLACE


def _ends(record: NodeRecord) -> str:
    """What ends the node's state, in words (every state says it)."""
    if _thermal(record):
        return "the GPU cooling down (then healthy again, by itself)."
    if _nic_cordon(record):
        return ("the NIC's port healthy again (then healthy again, by itself), or a worse fault (a port down past "
                "[network] stuck_down_after_s: its reboot).")
    if _degraded(record):
        return ("the GPU no longer degraded: keeping up with its peers, its link quiet, its error counters steady "
                "(then healthy again, by itself).")
    if _replacing(record):
        return ("the Node going away: its owner deleted, the provider drains and removes it (the flow then ends "
                "with GPUNodeReplaced); past [remediation.replace] timeout_s, quarantined.")
    return {
        states.CORDONED: "a person uncordoning it (a cordon-only fault gets no repair and is not lifted by "
                         "gpuremediate), or a worse fault (then it drains, or is quarantined).",
        states.DRAINING: "its pods gone (evicted, PodDisruptionBudgets honoured); then the repair starts.",
        states.REPAIRING: "the repair's Job or resource finishing; then validation (a failure climbs the ladder).",
        states.VALIDATING: "the validation Job: passed, the node is healthy and uncordoned; failed, quarantined.",
        states.QUARANTINED: "a person: `gpuremediate release` sends it through validation again.",
        states.MAINTENANCE: "the MaintenanceRequest completing, or being deleted.",
    }.get(record.state, "")


def _outcome_words(outcome: str, validation_failed: bool = False) -> str:
    """A history entry's outcome as words; the last repair of a node whose validation then failed says so."""
    if outcome == "repaired" and validation_failed:
        return "repaired, then its validation failed (quarantined)"
    return outcome


@dataclass(frozen=True)
class Explained:
    """``explain NODE``'s answer: the words, and what they were said from (``-o json|yaml`` print it)."""

    node: str
    text: str
    record: NodeRecord | RecordError | None
    gpus: int = 0
    dry_run: bool = False
    row: StatusRow | None = None  # the node's line in ``status`` (its Node entry in -o json)
    replaced: tuple[Entry, ...] = ()  # Nodes of this name replaced, newest first (the history's entries)
    gone: bool = False  # no Node of this name exists: it was replaced (``replaced`` says how)

    @property
    def state(self) -> str:
        if isinstance(self.record, RecordError):
            return "unreadable"
        return self.record.state if self.record is not None else states.HEALTHY

    @property
    def holder(self) -> str:
        return holder(self.record.blocked) if isinstance(self.record, NodeRecord) else "-"

    def as_dict(self) -> dict[str, Any]:
        """The schema's NodeExplanation (gpuremediate/structured.py): the node's status entry, its record in
        full, the words."""
        record, row = self.record, self.row
        if row is None:
            row = StatusRow(self.node, self.state, None, "-", "-", "-", True, False, self.gpus, record=record)
        return structured.frame(structured.KIND_NODE_EXPLANATION, {
            "dryRun": self.dry_run, "node": None if self.gone else row.as_dict(),
            "record": structured.record_view(to_dict(record)) if isinstance(record, NodeRecord) else None,
            "explanation": self.text.splitlines(),
            "replaced": [structured.replacement_view(e) for e in self.replaced]})

    def wide(self) -> str:
        """The words and, after them, what ``-o wide`` adds: the GPUs, who holds the wait, the record's stamps."""
        if self.gone:
            return self.text
        lines = [f"  GPUs: {self.gpus}."]
        record = self.record
        if isinstance(record, NodeRecord):
            if record.blocked is not None:
                lines.append(f"  Held by: {self.holder} ({record.blocked.reason}).")
            stamp = f" on {record.node}" + (f" (uid {record.node_uid})" if record.node_uid else "") if record.node \
                else ""
            lines.append(f"  Record: written{stamp}; reason {record.reason or '-'}; {len(record.handled)} handled "
                         f"fault fingerprint(s)" + (f": {', '.join(record.handled)}" if record.handled else "") + ".")
        return self.text + "\n".join(lines) + "\n"


def explain_node(client: KubeClient, node: str, policy: PolicyFile | None = None,
                 dry_run: Journal | None = None) -> str:
    """``explain_view(...).text``: the node's record in words."""
    return explain_view(client, node, policy, dry_run).text


def explain_view(client: KubeClient, node: str, policy: PolicyFile | None = None,
                 dry_run: Journal | None = None, namespace: str | None = None) -> Explained:
    """With the ``policy``, a draining node's pods in its drain.skip_namespaces are counted; with a live
    dry-run ``journal``, the record the dry run would have written is explained (and said to be). With the
    controller's ``namespace``, the replaced-node history is read: a Node of this name replaced is said (one that
    no longer exists is explained from it alone)."""
    replaced = _replaced_of(client, namespace, node) if namespace else ()
    try:
        obj = client.get(NODES, node)
    except errors.NotFound:
        if replaced:
            return _explain_replaced(node, replaced)
        raise FleetError(f"node {node!r} not found") from None
    explained = _explain_view(client, obj, node, policy, dry_run)
    if not replaced:
        return explained
    now = time.time()
    words = [f"  Replaced before (an earlier Node of this name): {replacement_line(e, now)}." for e in replaced]
    return dataclasses.replace(explained, text=explained.text + "\n".join(words) + "\n", replaced=replaced)


def _replaced_of(client: KubeClient, namespace: str, node: str) -> tuple[Entry, ...]:
    """The history's entries for Nodes named ``node``, newest first; () when it cannot be read (a reader who may
    not read it still gets the Node explained, and a Node that is gone is "not found", as before)."""
    try:
        entries = read_replaced(client, namespace)
    except HistoryError:
        return ()
    return tuple(e for e in reversed(entries) if e.node == node)


def _explain_replaced(node: str, replaced: Sequence[Entry]) -> Explained:
    now, last = time.time(), replaced[0]
    lines = [f"{node}: replaced. No Node of this name exists now: gpuremediate's [remediation.replace] deleted its "
             f"owner, which makes a new node (under this name or another).",
             f"  Replaced: {replacement_line(last, now)}."]
    lines += [f"  Replaced before: {replacement_line(e, now)}." for e in replaced[1:]]
    lines.append("  Its record went with the Node; the history is ConfigMap gpuremediate-replaced.")
    return Explained(node, "\n".join(lines) + "\n", None, replaced=tuple(replaced), gone=True)


def _explain_view(client: KubeClient, obj: Mapping[str, Any], node: str, policy: PolicyFile | None,
                  dry_run: Journal | None) -> Explained:
    gpus = gpu_count(obj)
    label = policy.for_node(labels_of(obj)).fabric.domain_label if policy is not None else CLIQUE_LABEL
    row = row_for(obj, dry_run, domain_label=label)
    if dry_run is not None and node in dry_run.records:
        would_be = dry_run.records[node]
        text = (f"DRY RUN: gpuremediate writes nothing to {node}; it {would(would_be)} "
                f"({_ago(would_be.since, time.time())} ago):\n"
                + explain(would_be, node, keep_cordoned=keeps_cordoned(obj), ladder=_ladder(policy, obj, would_be),
                          dry_run=True))
        return Explained(node, text, would_be, gpus, dry_run=True, row=row)
    if dry_run is not None:
        decided = [d for d in dry_run.decisions if d.node == node]
        if not decided:
            record = record_from_node(obj)
            return Explained(node, f"DRY RUN: gpuremediate writes nothing to {node}, and would not act on it now.\n"
                             + explain(record, node, unschedulable=node_unschedulable_of(obj)), record, gpus,
                             dry_run=True, row=row)
    record = record_from_node(obj)
    skipped: dict[str, int] = {}
    skip = policy.for_node(labels_of(obj)).drain.skip_namespaces if policy is not None else ()
    if skip and isinstance(record, NodeRecord) and record.state == states.DRAINING:
        skipped = skipped_by_namespace(list_node_pods(client, node), skip)
    hold = policy.for_node(labels_of(obj)).thermal.hold_s if policy is not None else None
    text = explain(record, node, keep_cordoned=keeps_cordoned(obj), skipped=skipped,
                   ladder=_ladder(policy, obj, record), hold_s=hold, unschedulable=node_unschedulable_of(obj))
    return Explained(node, text + domain_line(client, obj, label), record, gpus, dry_run=dry_run is not None,
                     row=row)


def domain_line(client: KubeClient, node: Mapping[str, Any], label: str = CLIQUE_LABEL) -> str:
    """``  NVLink domain: <clique>: 18 node(s), 2 out of service (...)`` for a node in one; "" otherwise. A domain
    breaker holding it is named in its BLOCKED line."""
    value = labels_of(node).get(label, "")
    if not value:
        return ""
    try:
        members = client.list(NODES, label_selector=f"{label}={value}").get("items", [])
    except (errors.ApiError, errors.TransportError) as exc:
        return f"  NVLink domain: {label}={value} (its nodes cannot be listed: {exc})\n"
    rows = [row_for(m) for m in members if is_gpu_node(m)]
    out = sorted(r.node for r in rows if r.state != states.HEALTHY or not r.schedulable)
    shown = f" ({', '.join(out[:5])}{', ...' if len(out) > 5 else ''})" if out else ""
    return f"  NVLink domain: {label}={value}: {len(rows)} node(s), {len(out)} out of service{shown}\n"


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
    client.patch(NODES, node, node_patch(released, resource_version=rv, owner=obj))  # a 409: read again, decide again
    return released
