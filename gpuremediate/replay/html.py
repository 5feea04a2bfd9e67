"""A replay result as one self-contained HTML page: the totals, an SVG timeline (one row per affected
node, a bar per state, hover titles, a legend), the waits and what was not acted on. No script, no
external file: it opens from disk, from a mail attachment, anywhere."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from gpuremediate.replay.history import format_time
from gpuremediate.replay.result import UNACTED_CATEGORIES, UNKNOWN, ReplayResult
from gpuremediate.replay.text import COMPARED, duration
from gpuremediate.state import states

COLORS = {
    states.CORDONED: "#e6b400", states.DRAINING: "#c45ab3", states.REPAIRING: "#2f8fd8",
    states.VALIDATING: "#22a39f", states.QUARANTINED: "#d1342f", states.MAINTENANCE: "#8c7b5a",
}
WAIT_COLOR = "#555555"
UNKNOWN_COLOR = "#bbbbbb"
TRIP_COLOR = "#d1342f"
LABEL_W, ROW_H, BAR_H, AXIS_H = 170, 22, 14, 28

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.legend span { display: inline-block; margin-right: 14px; } .legend i { display: inline-block; width: 14px;
 height: 10px; margin-right: 4px; vertical-align: middle; }
.panes { display: flex; gap: 24px; flex-wrap: wrap; } .pane { flex: 1 1 600px; min-width: 0; }
svg text { font: 11px system-ui, sans-serif; } .small { color: #555; font-size: 12px; }
"""


def _x(result: ReplayResult, at: float, width: float) -> float:
    span = max(1.0, result.end - result.start)
    return LABEL_W + (at - result.start) / span * (width - LABEL_W - 10)


def _axis(result: ReplayResult, width: float, height: float) -> list[str]:
    parts = []
    ticks = max(2, min(8, int((width - LABEL_W) // 110)))
    long_range = result.end - result.start >= 2 * 86400
    for i in range(ticks + 1):
        at = result.start + (result.end - result.start) * i / ticks
        x = _x(result, at, width)
        parts.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 6}" x2="{x:.1f}" y2="{height}" stroke="#eee"/>')
        anchor = "start" if i == 0 else "end" if i == ticks else "middle"
        stamp = format_time(at)
        label = stamp[5:10] if long_range else stamp[5:16].replace("T", " ")  # MM-DD or MM-DD hh:mm (UTC)
        parts.append(f'<text x="{x:.1f}" y="{AXIS_H - 10}" text-anchor="{anchor}">{escape(label)}'
                     f"<title>{escape(stamp)}</title></text>")
    return parts


def _bar(x1: float, x2: float, y: float, h: float, color: str, title: str) -> str:
    w = max(2.0, x2 - x1)
    return (f'<rect x="{x1:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" fill="{color}" rx="2">'
            f"<title>{escape(title)}</title></rect>")


def svg_timeline(result: ReplayResult, nodes: Sequence[str], width: float = 1100.0) -> str:
    height = AXIS_H + ROW_H * max(1, len(nodes)) + 6
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
             f'viewBox="0 0 {width:.0f} {height}" role="img" aria-label="replay timeline">',
             *_axis(result, width, height)]
    for row, node in enumerate(nodes):
        y = AXIS_H + row * ROW_H
        parts.append(f'<text x="4" y="{y + BAR_H - 2}">{escape(node[:26])}<title>{escape(node)}</title></text>')
        parts.append(f'<line x1="{LABEL_W}" y1="{y + BAR_H / 2}" x2="{width - 10}" y2="{y + BAR_H / 2}" '
                     'stroke="#9c9" stroke-width="1"/>')
        for u in (u for u in result.unacted if u.node == node and u.category == UNKNOWN):
            parts.append(_bar(_x(result, u.start, width), _x(result, u.end, width), y + 3, BAR_H - 6, UNKNOWN_COLOR,
                              f"{node}: health unknown {format_time(u.start)} for {duration(u.end - u.start)}: "
                              f"{u.detail}"))
        for s in (s for s in result.spans if s.node == node):
            move = next((m for m in result.moves if m.node == node and m.at == s.start and m.to_state == s.state), None)
            why = f" ({move.reason}: {move.message})" if move else ""
            parts.append(_bar(_x(result, s.start, width), _x(result, s.end, width), y, BAR_H,
                              COLORS.get(s.state, "#888"),
                              f"{node}: {s.state} from {format_time(s.start)} for {duration(s.end - s.start)}{why}"))
        for w in (w for w in result.waits if w.node == node):
            parts.append(_bar(_x(result, w.start, width), _x(result, w.end, width), y + BAR_H + 1, 3, WAIT_COLOR,
                              f"{node}: waiting ({w.reason}) {duration(w.end - w.start)}: {w.detail}"))
    for t in result.trips:
        x = _x(result, t.at, width)
        title = escape(f"circuit breaker opened at {format_time(t.at)}: {t.reason}")
        parts.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 4}" x2="{x:.1f}" y2="{height}" stroke="{TRIP_COLOR}" '
                     f'stroke-width="2" stroke-dasharray="4 3"><title>{title}</title></line>')
    if not nodes:
        parts.append(f'<text x="{LABEL_W}" y="{AXIS_H + 14}">no node was affected</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def legend() -> str:
    items = [f'<span><i style="background:{c}"></i>{escape(s)}</span>' for s, c in COLORS.items()]
    items += [f'<span><i style="background:{UNKNOWN_COLOR}"></i>health unknown</span>',
              f'<span><i style="background:{WAIT_COLOR};height:3px"></i>waiting (budget, breaker)</span>',
              f'<span><i style="background:{TRIP_COLOR};width:3px"></i>breaker opened</span>',
              '<span><i style="background:#9c9;height:1px"></i>healthy</span>']
    return '<p class="legend">' + "".join(items) + "</p>"


def _summary_table(results: Sequence[ReplayResult]) -> str:
    summaries = [r.summary() for r in results]
    head = "".join(f"<th>{escape(r.policy)}</th>" for r in results)
    rows = [f"<tr><td>{escape(k.replace('_', ' '))}</td>" + "".join(f"<td>{s[k]}</td>" for s in summaries) + "</tr>"
            for k in ("nodes", "gpus", *COMPARED)]
    rows += [f"<tr><td>not acted on: {c}</td>" + "".join(f"<td>{s['unacted'][c]}</td>" for s in summaries) + "</tr>"
             for c in UNACTED_CATEGORIES]
    return f"<table><tr><th></th>{head}</tr>{''.join(rows)}</table>"


def _details(result: ReplayResult) -> str:
    moves = "".join(f"<tr><td>{escape(format_time(m.at))}</td><td>{escape(m.node)}</td><td>{escape(m.from_state)} → "
                    f"{escape(m.to_state)}</td><td>{escape(m.reason)}</td><td style='text-align:left'>"
                    f"{escape(m.message)}</td></tr>" for m in result.moves)
    unacted = "".join(f"<tr><td>{escape(format_time(u.start))}</td><td>{escape(u.node)}</td><td>{escape(u.category)}"
                      f"</td><td>{escape(duration(u.end - u.start))}</td><td style='text-align:left'>"
                      f"{escape(u.detail)}</td></tr>" for u in result.unacted)
    return (f"<details><summary>every transition ({len(result.moves)})</summary><table>{moves}</table></details>"
            f"<details><summary>seen but not acted on ({len(result.unacted)})</summary><table>{unacted}</table>"
            "</details>")


def render_html(results: Sequence[ReplayResult]) -> str:
    first = results[0]
    nodes = sorted(set().union(*(r.affected for r in results), *({u.node for u in r.unacted} for r in results)))
    width = 1100.0 if len(results) == 1 else 640.0
    panes = "".join(
        f'<div class="pane"><h2>{escape(r.policy)}</h2>{svg_timeline(r, nodes, width)}{_details(r)}</div>'
        for r in results)
    title = "gpuremediate replay" + (": " + " vs ".join(r.policy for r in results) if len(results) > 1 else "")
    notes = "".join(f"<li>{escape(n)}</li>" for r in results for n in r.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="small">{escape(format_time(first.start))} → {escape(format_time(first.end))}
({escape(duration(first.end - first.start))}), scrape every {first.step_s:g}s, {len(first.gpus)} GPU nodes,
{sum(first.gpus.values())} GPUs. What the controller would have done: the same code as the controller,
on a simulated clock. Hover a bar for details.</p>
<h2>Timeline: {len(nodes)} node(s) acted on, waiting, or with faults not acted on (times UTC)</h2>
{legend()}
<div class="panes">{panes}</div>
<h2>Totals</h2>
{_summary_table(results)}
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
</body></html>
"""
