"""A replay result as text (a timeline per node, then the totals) and as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gpuremediate.replay.history import format_time
from gpuremediate.replay.result import DEGRADATION_KINDS, UNACTED_CATEGORIES, ReplayResult, Sighting


def duration(seconds: float) -> str:
    """``1d 2h``, ``3h 05m``, ``12m``, ``40s``."""
    seconds = max(0.0, seconds)
    days, rest = divmod(round(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m" if minutes else f"{secs}s"


def header(result: ReplayResult) -> list[str]:
    return [
        f"policy {result.policy}: {format_time(result.start)} → {format_time(result.end)} "
        f"({duration(result.end - result.start)}), scrape every {result.step_s:g}s, "
        f"{len(result.gpus)} GPU nodes ({sum(result.gpus.values())} GPUs)",
        f"history: {result.changes} change points; engine: {result.steps} simulated instants in {result.seconds:.2f}s",
    ]


def timeline(result: ReplayResult) -> list[str]:
    lines = ["", "Timeline (every transition, per node)"]
    nodes = sorted({m.node for m in result.moves})
    if not nodes:
        lines.append("  (no node changed state)")
    for node in nodes:
        lines.append(f"  {node}")
        for m in (m for m in result.moves if m.node == node):
            text = f"    {format_time(m.at)}  {m.from_state} → {m.to_state} ({m.reason})"
            lines.append(text + (f": {m.message}" if m.message else ""))
    return lines


def safety(result: ReplayResult) -> list[str]:
    lines = ["", "Circuit breaker trips"]
    lines += [f"  {format_time(t.at)}  opened at {t.node}: {t.reason}" for t in result.trips] or ["  none"]
    lines += ["", "Waits (the node's record said blocked)"]
    lines += [f"  {format_time(w.start)}  {w.node}  {w.reason} for {duration(w.end - w.start)}: {w.detail}"
              for w in result.waits] or ["  none"]
    return lines


def out_of_service(result: ReplayResult) -> list[str]:
    lines = ["", "Out of service (any state but healthy; quarantined counts until the end of the range)",
             f"  {'node':<32} {'node-hours':>11} {'GPU-hours':>11}"]
    for node in sorted({s.node for s in result.spans}):
        lines.append(f"  {node:<32} {result.node_hours(node):>11.2f} {result.gpu_hours(node):>11.2f}")
    lines.append(f"  {'total':<32} {result.node_hours():>11.2f} {result.gpu_hours():>11.2f}")
    return lines


def by_fault(result: ReplayResult) -> list[str]:
    found = result.gpu_hours_by_fault()
    if not found:
        return []
    lines = ["", "GPU-hours by fault (a GPU-level flow counts its one GPU)"]
    lines += [f"  {fault or '-':<32} {hours:>11.2f}" for fault, hours in found.items()]
    if result.gpu_level_flows():
        lines.append(f"  GPU-level flows: {result.gpu_level_flows()}")
    return lines


def replacements(result: ReplayResult) -> list[str]:
    """The nodes the controller replaced in the range (its history ConfigMap): gone from the fleet from then on."""
    if not result.replaced:
        return []
    lines = ["", f"Replaced (from the controller's history, {len(result.replaced)})"]
    for r in result.replaced:
        sent = "" if r.state == "deleted" else f" [{r.state}: the delete may not have gone]"
        lines.append(f"  {format_time(r.at)}  {r.node}: replaced through {r.target} ({r.provider}); "
                     f"fault: {r.fault or 'unknown'}; instance {r.provider_id or 'unknown'}{sent}")
    return lines


def unacted(result: ReplayResult) -> list[str]:
    lines = ["", "Seen but not acted on"]
    for category in UNACTED_CATEGORIES:
        found = [u for u in result.unacted if u.category == category]
        if not found:
            continue
        lines.append(f"  {category} ({len(found)})")
        for u in found:
            span = format_time(u.start) if u.end == u.start else \
                f"{format_time(u.start)} for {duration(u.end - u.start)}"
            lines.append(f"    {span}  {u.node}: {u.detail}")
    if len(lines) == 2:
        lines.append("  nothing")
    return lines


def outcome(result: ReplayResult, finding: Sighting) -> str:
    """What the node did for the finding: its transitions for the finding's kind, from its start on (a cordon, a
    drain) and the lift once it cleared."""
    done = []
    for m in result.moves:
        if m.node != finding.node or m.at < finding.start:
            continue
        if m.reason == finding.kind:
            done.append(f"{m.to_state} {format_time(m.at)}")
        elif m.reason == "degradation-cleared" and done:
            done.append(f"lifted {format_time(m.at)}")
            break
    for r in result.maintenances:
        if r.node == finding.node and any(fp.split(":")[1] == finding.code for fp in r.trends) \
                and finding.start <= r.at <= finding.end:
            done.append(f"would file MaintenanceRequest {r.name}, drain at {format_time(r.drain_at)}")
    if done:
        return "; ".join(done)
    if finding.action == "none":
        return "reported only"
    before = [m for m in result.moves if m.node == finding.node and m.at <= finding.start]
    state = before[-1].to_state if before else "healthy"
    return f"the node was {state} already ({before[-1].reason})" if before and state != "healthy" else "not acted on"


def degradation(result: ReplayResult) -> list[str]:
    """The [degradation] findings by kind, each with its GPU, stretch and what the node did; the maintenances
    trends would have had filed. Nothing when the replay found none (the policy's default: off)."""
    if not result.findings and not result.maintenances:
        return []
    counts = result.findings_by_kind()
    lines = ["", "Degradation findings ([degradation]: " + ", ".join(f"{k} {counts[k]}" for k in DEGRADATION_KINDS)
             + ")"]
    for kind in DEGRADATION_KINDS:
        found = [f for f in result.findings if f.kind == kind]
        if not found:
            continue
        lines.append(f"  {kind} ({len(found)})")
        for f in found:
            lasted = "until the end" if f.ongoing else f"for {duration(f.end - f.start)}"
            lines.append(f"    {format_time(f.start)} {lasted}  {f.node} {', '.join(f.gpus)} ({f.code}, action "
                         f"{f.action}): {outcome(result, f)}")
    if result.maintenances:
        lines.append(f"  maintenances the trends would schedule ({len(result.maintenances)})")
        lines += [f"    {format_time(r.at)}  {r.node}: would schedule a maintenance at {format_time(r.drain_at)} "
                  f"(MaintenanceRequest {r.name})" for r in result.maintenances]
    return lines


def workload(result: ReplayResult) -> list[str]:
    """The [workload] findings (pods failing on a node with GPU errors), each with its stretch, what the node did
    and the signal's last word; nothing when the history had no failed pods."""
    if not result.failed_pods and not result.workload_findings:
        return []
    lines = ["", f"Workload findings ([workload]: {len(result.workload_findings)}; {result.failed_pods} failed "
             f"pod(s) in the history, {result.gpu_failed_pods} with a GPU error)"]
    for f in result.workload_findings:
        lasted = "until the end" if f.ongoing else f"for {duration(f.end - f.start)}"
        lines.append(f"    {format_time(f.start)} {lasted}  {f.node} ({f.code}, action {f.action}): "
                     f"{outcome(result, f)}")
        lines.append(f"      {f.message}")
    if not result.workload_findings:
        lines.append("  none")
    return lines


def render_text(result: ReplayResult) -> str:
    lines = [*header(result), *timeline(result), *replacements(result), *safety(result), *out_of_service(result),
             *by_fault(result), *degradation(result), *workload(result), *unacted(result)]
    if result.notes:
        lines += ["", "Notes", *(f"  {n}" for n in result.notes)]
    return "\n".join(lines) + "\n"


COMPARED = ("nodes_acted_on", "transitions", "drains", "repairs", "quarantines", "cordons", "breaker_trips",
            "budget_waits", "node_hours_out_of_service", "gpu_hours_out_of_service", "gpu_level_flows")


def render_compare(results: Sequence[ReplayResult]) -> str:
    """Two (or more) policies on the same history: the totals side by side, per-node differences, then each
    replay in full."""
    names = [r.policy for r in results]
    width = max(14, *(len(n) for n in names))
    lines = [f"Compare on the same history ({format_time(results[0].start)} → {format_time(results[0].end)}, "
             f"{len(results[0].gpus)} GPU nodes)", "",
             f"  {'':<28}" + "".join(f" {n:>{width}}" for n in names)]
    summaries = [r.summary() for r in results]
    for key in COMPARED:
        lines.append(f"  {key:<28}" + "".join(f" {s[key]!s:>{width}}" for s in summaries))
    for category in UNACTED_CATEGORIES:
        lines.append(f"  {'not acted on: ' + category:<28}" + "".join(f" {s['unacted'][category]!s:>{width}}"
                                                                   for s in summaries))
    for kind in DEGRADATION_KINDS:
        lines.append(f"  {'findings: ' + kind:<28}" + "".join(f" {s['degradation_findings'][kind]!s:>{width}}"
                                                              for s in summaries))
    lines.append(f"  {'maintenances_scheduled':<28}" + "".join(f" {s['maintenances_scheduled']!s:>{width}}"
                                                              for s in summaries))
    lines.append(f"  {'findings: workload':<28}" + "".join(f" {s['workload_findings']!s:>{width}}"
                                                          for s in summaries))
    lines += ["", "Nodes treated differently (final state, node-hours out of service)"]
    nodes = sorted(set().union(*({m.node for m in r.moves} for r in results)))
    differing = [n for n in nodes if len({(r.final_states().get(n, "healthy"), round(r.node_hours(n), 2))
                                         for r in results}) > 1]
    for node in differing:
        cells = "".join(f" {r.final_states().get(node, 'healthy') + f' {r.node_hours(node):.1f}h':>{width}}"
                        for r in results)
        lines.append(f"  {node:<28}{cells}")
    if not differing:
        lines.append("  none")
    for result in results:
        lines += ["", "=" * 100, render_text(result).rstrip("\n")]
    return "\n".join(lines) + "\n"


def render_json(results: Sequence[ReplayResult]) -> str:
    if len(results) == 1:
        return json.dumps(results[0].to_dict(), indent=2) + "\n"
    return json.dumps({"compare": [r.to_dict() for r in results]}, indent=2) + "\n"
