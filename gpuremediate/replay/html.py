"""A replay result as one self-contained HTML page: a headline (GPU-hours out of service, nodes needing a
person, breaker openings), an SVG timeline (one row per affected node, a bar per state at least
MIN_BAR_PX wide, markers where faults were seen but not acted on, hover titles, a legend), zoomed
timelines of each day (or hour, or week) with something in it, the per-node GPU-hours, the totals, the
waits and what was not acted on. No external file: it opens from disk, from a mail attachment, anywhere.
The fixed zooms are CSS ``:target`` (``replay.html#zoom-20261105T0000-20261106T0000`` shows that day, no
script needed); any range (``replay.html#from=2026-11-01&to=2026-11-03``) is drawn by one small inline
script (RANGE_SCRIPT) from the whole timeline. Either link can be shared; without JavaScript the page shows
everything but the free range."""

from __future__ import annotations

import math
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from gpuremediate.replay.history import format_time
from gpuremediate.replay.result import (
    BELOW_THRESHOLD,
    BREAKER_HELD,
    DEGRADATION_KINDS,
    EXCLUDED,
    NOTICE,
    UNACTED_CATEGORIES,
    UNKNOWN,
    ReplayResult,
)
from gpuremediate.replay.text import COMPARED, duration, outcome
from gpuremediate.vocab import states

COLORS = {
    states.CORDONED: "#e6b400", states.DRAINING: "#c45ab3", states.REPAIRING: "#2f8fd8",
    states.VALIDATING: "#22a39f", states.QUARANTINED: "#d1342f", states.MAINTENANCE: "#8c7b5a",
}
WAIT_COLOR = "#555555"
UNKNOWN_COLOR = "#bbbbbb"
TRIP_COLOR = "#d1342f"
UNACTED_COLORS = {EXCLUDED: "#7a4fd1", NOTICE: "#1f77b4", BELOW_THRESHOLD: "#8a8a8a", BREAKER_HELD: "#d1342f"}
LABEL_W, ROW_H, BAR_H, AXIS_H = 170, 22, 14, 28
MIN_BAR_PX = 4.0  # a 30-minute repair on a 30-day axis is well under a pixel: drawn this wide, it is seen
ZOOM_UNITS = (3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0)  # the first giving at most MAX_ZOOMS windows
MAX_ZOOMS = 62
# The axis steps in one of these (seconds), the smallest that fits its width, at multiples of it in UTC (weeks from a
# Monday); a tick is labelled in the unit it steps in: MM-DD for days and weeks, hh:mm for minutes and hours (with
# the date on the first tick and at each midnight), so no two ticks read the same.
TICK_STEPS = (60, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400,
              7 * 86400, 14 * 86400, 28 * 86400)
TICK_EDGE_PX = 30  # a label this close to an end of the axis is anchored there (not centred over the edge)

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.headline { display: flex; gap: 16px; flex-wrap: wrap; margin: 8px 0 4px; }
.headline .figure { border: 1px solid #ddd; border-radius: 6px; padding: 8px 16px; min-width: 180px; }
.headline .figure b { display: block; font-size: 28px; line-height: 1.2; }
.headline .figure.alarm b { color: #d1342f; } .headline .names { color: #555; font-size: 12px; }
.zoomnav a { margin-right: 6px; white-space: nowrap; } .zoom { display: none; } .zoom:target { display: block; }
.zoom, .range { border-bottom: 2px solid #2f8fd8; margin: 0 0 24px; scroll-margin-top: 24px; }
.zoom h2, .range h2 { margin-top: 0; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.legend span { display: inline-block; margin-right: 14px; } .legend i { display: inline-block; width: 14px;
 height: 10px; margin-right: 4px; vertical-align: middle; }
.panes { display: flex; gap: 24px; flex-wrap: wrap; } .pane { flex: 1 1 600px; min-width: 0; }
svg text { font: 11px system-ui, sans-serif; } .small { color: #555; font-size: 12px; }
"""


# The date range in the URL (replay.html#from=2026-11-01&to=2026-11-03): a copy of each whole-range timeline,
# redrawn for that range (bars, markers and breaker lines moved by their data-t0/data-t1, rows with nothing in
# it left out, the axis drawn again). Without JavaScript the page is as it is: every timeline, the fixed zooms.
RANGE_SCRIPT = string.Template("""
(function () {
  "use strict";
  var LABEL_W = $label_w, ROW_H = $row_h, AXIS_H = $axis_h, MIN_BAR = $min_bar, DAY = 86400;
  var TICK_STEPS = [$tick_steps], EDGE = $edge;
  var SVG = "http://www.w3.org/2000/svg";
  function parseTime(text, isEnd) {
    var m = /^(\\d{4})-(\\d{2})-(\\d{2})(?:[T ](\\d{2}):(\\d{2})(?::(\\d{2}))?Z?)?$$/.exec(text || "");
    if (!m) return null;
    var t = Date.UTC(+m[1], +m[2] - 1, +m[3], +(m[4] || 0), +(m[5] || 0), +(m[6] || 0)) / 1000;
    return m[4] === undefined && isEnd ? t + DAY : t;  // a date alone as "to" includes its day
  }
  function parseRange(hash) {
    var params = new URLSearchParams(String(hash || "").replace(/^#/, ""));
    var from = parseTime(params.get("from"), false), to = parseTime(params.get("to"), true);
    if (from === null && to === null) return null;
    return {from: from, to: to};
  }
  function axisX(from, to, width) {
    var span = Math.max(1, to - from);
    return function (t) {
      t = Math.min(Math.max(t, from), to);
      return LABEL_W + (t - from) / span * (width - LABEL_W - 10);
    };
  }
  function stamp(t) { return new Date(t * 1000).toISOString().slice(0, 19) + "Z"; }
  function node(tag, attrs, text) {
    var el = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { el.setAttribute(k, attrs[k]); });
    if (text) el.textContent = text;
    return el;
  }
  function ticks(from, to, most) {  // as the page's own axes (html.py ticks): the unit, then its multiples
    for (var i = 0; i < TICK_STEPS.length; i++) {
      var found = aligned(from, to, TICK_STEPS[i]);
      if (found.length <= most) return {step: TICK_STEPS[i], at: found};
    }
    var step = Math.ceil((to - from) / most / DAY) * DAY;
    return {step: step, at: aligned(from, to, step)};
  }
  function aligned(from, to, step) {
    var offset = step % (7 * DAY) === 0 ? 4 * DAY : 0, out = [];  // weeks from a Monday (1970-01-05)
    for (var t = Math.ceil((from - offset) / step) * step + offset; t <= to; t += step) out.push(t);
    return out;
  }
  function tickLabel(t, step, first) {
    var iso = stamp(t);
    if (step >= DAY) return iso.slice(5, 10);
    var hhmm = iso.slice(11, 16);
    return first || hhmm === "00:00" ? iso.slice(5, 10) + " " + hhmm : hhmm;
  }
  function drawAxis(group, from, to, width, height, x) {
    while (group.firstChild) group.removeChild(group.firstChild);
    var most = Math.max(2, Math.min(8, Math.floor((width - LABEL_W) / 110))), found = ticks(from, to, most);
    found.at.forEach(function (at, i) {
      var px = x(at), iso = stamp(at);
      group.appendChild(node("line", {x1: px.toFixed(1), y1: AXIS_H - 6, x2: px.toFixed(1), y2: height,
                                      stroke: "#eee"}));
      var anchor = px - LABEL_W < EDGE ? "start" : width - 10 - px < EDGE ? "end" : "middle";
      var text = node("text", {x: px.toFixed(1), y: AXIS_H - 10, "text-anchor": anchor},
                      tickLabel(at, found.step, i === 0));
      text.appendChild(node("title", {}, iso));
      group.appendChild(text);
    });
  }
  function place(el, x, width, after) {
    var t0 = +el.getAttribute("data-t0"), t1 = +(el.getAttribute("data-t1") || t0);
    if (el.tagName.toLowerCase() === "rect") {
      var state = el.classList.contains("state"), x1 = state ? Math.max(x(t0), after) : x(t0);
      var w = Math.max(MIN_BAR, x(t1) - x1);
      x1 = Math.min(x1, width - 10 - w);
      el.setAttribute("x", x1.toFixed(1));
      el.setAttribute("width", w.toFixed(1));
      return state ? x1 + w : after;
    }
    el.setAttribute("transform", "translate(" + (x(t0) - +el.getAttribute("data-x")).toFixed(1) + ",0)");
    return after;
  }
  function rescale(svg, from, to) {
    var width = +svg.getAttribute("data-width"), x = axisX(from, to, width), kept = 0;
    svg.querySelectorAll("g.node-row").forEach(function (row) {
      var shown = 0, after = 0;
      row.querySelectorAll("[data-t0]").forEach(function (el) {
        var t0 = +el.getAttribute("data-t0"), t1 = +(el.getAttribute("data-t1") || t0);
        var inside = t0 <= to && t1 >= from;
        el.style.display = inside ? "" : "none";
        if (inside) { shown += 1; after = place(el, x, width, after); }
      });
      row.style.display = shown ? "" : "none";
      if (shown) {
        row.setAttribute("transform", "translate(0," + (kept - +row.getAttribute("data-row")) * ROW_H + ")");
        kept += 1;
      }
    });
    var height = AXIS_H + ROW_H * Math.max(1, kept) + 6;
    svg.querySelectorAll("line.trip").forEach(function (line) {
      var t = +line.getAttribute("data-t0"), px = x(t).toFixed(1);
      line.style.display = t >= from && t <= to ? "" : "none";
      line.setAttribute("x1", px); line.setAttribute("x2", px); line.setAttribute("y2", height);
    });
    drawAxis(svg.querySelector("g.axis"), from, to, width, height, x);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    return kept;
  }
  function show() {
    var section = document.getElementById("range"), range = parseRange(location.hash);
    if (!section) return;
    section.hidden = range === null;
    if (range === null) return;
    var panes = section.querySelector(".panes"), said = "";
    while (panes.firstChild) panes.removeChild(panes.firstChild);
    document.querySelectorAll("svg.timeline.whole").forEach(function (whole) {
      var from = range.from === null ? +whole.getAttribute("data-start") : range.from;
      var to = range.to === null ? +whole.getAttribute("data-end") : range.to;
      var copy = whole.cloneNode(true), pane = document.createElement("div");
      copy.classList.remove("whole");
      var rows = rescale(copy, from, to);
      pane.className = "pane";
      pane.appendChild(copy);
      panes.appendChild(pane);
      said = stamp(from) + " \\u2192 " + stamp(to) + " (" + rows + " node(s))";
    });
    section.querySelector(".what").textContent = said;
    section.scrollIntoView();
  }
  var api = {parseTime: parseTime, parseRange: parseRange, axisX: axisX, ticks: ticks, tickLabel: tickLabel};
  if (typeof globalThis !== "undefined") globalThis.gpuremediateRange = api;
  if (typeof document === "undefined") return;
  window.addEventListener("hashchange", show);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", show); else show();
})();
""").substitute(label_w=LABEL_W, row_h=ROW_H, axis_h=AXIS_H, min_bar=repr(MIN_BAR_PX),
               tick_steps=", ".join(str(step) for step in TICK_STEPS), edge=TICK_EDGE_PX)


@dataclass(frozen=True)
class Axis:
    """The time range a timeline shows, and its width in pixels."""

    start: float
    end: float
    width: float

    def x(self, at: float) -> float:
        span = max(1.0, self.end - self.start)
        at = min(max(at, self.start), self.end)  # a bar running past a zoomed range is cut at its edge
        return LABEL_W + (at - self.start) / span * (self.width - LABEL_W - 10)

    def shows(self, start: float, end: float) -> bool:
        return start <= self.end and end >= self.start


def ticks(start: float, end: float, most: int) -> tuple[float, list[float]]:
    """The axis's step (the smallest of TICK_STEPS giving at most ``most`` ticks) and its ticks: the multiples of
    the step within [start, end] (weeks counted from a Monday)."""
    for step in TICK_STEPS:
        found = _aligned(start, end, float(step))
        if len(found) <= most:
            return float(step), found
    days = math.ceil((end - start) / most / 86400) * 86400.0
    return days, _aligned(start, end, days)


def _aligned(start: float, end: float, step: float) -> list[float]:
    offset = 4 * 86400.0 if step % (7 * 86400) == 0 else 0.0  # 1970-01-05, a Monday
    at = math.ceil((start - offset) / step) * step + offset
    out = []
    while at <= end:
        out.append(at)
        at += step
    return out


def tick_label(at: float, step: float, first: bool) -> str:
    """``11-09`` for a tick of a day or week axis; ``06:00`` for one of an hour axis, ``11-09 00:00`` on its first
    tick and at midnight (UTC)."""
    stamp = format_time(at)
    if step >= 86400:
        return stamp[5:10]
    hhmm = stamp[11:16]
    return f"{stamp[5:10]} {hhmm}" if first or hhmm == "00:00" else hhmm


def _axis(axis: Axis, height: float) -> list[str]:
    parts = []
    width = axis.width
    most = max(2, min(8, int((width - LABEL_W) // 110)))
    step, found = ticks(axis.start, axis.end, most)
    for i, at in enumerate(found):
        x = axis.x(at)
        parts.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 6}" x2="{x:.1f}" y2="{height}" stroke="#eee"/>')
        anchor = "start" if x - LABEL_W < TICK_EDGE_PX else "end" if width - 10 - x < TICK_EDGE_PX else "middle"
        parts.append(f'<text x="{x:.1f}" y="{AXIS_H - 10}" text-anchor="{anchor}">'
                     f"{escape(tick_label(at, step, i == 0))}<title>{escape(format_time(at))}</title></text>")
    return parts


def _bar(axis: Axis, start: float, end: float, y: float, h: float, color: str, title: str,
         css: str = "bar", after: float = 0.0) -> tuple[str, float]:
    """A bar from ``start`` to ``end``, at least MIN_BAR_PX wide, starting no left of ``after`` (the end of
    the row's previous bar: a flow of short states is drawn as its states side by side, each seen) and kept
    inside the axis; the bar and where it ends."""
    x1, x2 = max(axis.x(start), after), axis.x(end)
    w = max(MIN_BAR_PX, x2 - x1)
    x1 = min(x1, axis.width - 10 - w)
    return (f'<rect class="{css}" x="{x1:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" fill="{color}" '
            f'data-t0="{start:.3f}" data-t1="{end:.3f}"><title>{escape(title)}</title></rect>'), x1 + w


def _marker(axis: Axis, at: float, y: float, color: str, title: str) -> str:
    """A fault seen but not acted on: a triangle pointing down at its row, at when it was seen."""
    x = axis.x(at)
    return (f'<path class="unacted" d="M{x - 5:.1f},{y:.1f} L{x + 5:.1f},{y:.1f} L{x:.1f},{y + 8:.1f} Z" '
            f'fill="{color}" stroke="#fff" stroke-width="0.8" data-t0="{at:.3f}" data-x="{x:.1f}">'
            f"<title>{escape(title)}</title></path>")


def svg_timeline(result: ReplayResult, nodes: Sequence[str], width: float = 1100.0,
                 window: tuple[float, float] | None = None) -> str:
    """One row per node over the whole replay, or over ``window`` (start, end) for a zoomed view. Every bar,
    marker and breaker line carries its times (``data-t0``/``data-t1``), each row is a ``g.node-row`` and the
    axis a ``g.axis``: the page's script redraws a copy of the whole range's timeline for a range in the URL."""
    axis = Axis(*(window or (result.start, result.end)), width)
    height = AXIS_H + ROW_H * max(1, len(nodes)) + 6
    whole = " whole" if window is None else ""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline{whole}" width="{width:.0f}" '
             f'height="{height}" viewBox="0 0 {width:.0f} {height}" role="img" aria-label="replay timeline" '
             f'data-start="{axis.start:.3f}" data-end="{axis.end:.3f}" data-width="{width:.0f}">',
             '<g class="axis">', *_axis(axis, height), "</g>"]
    for row, node in enumerate(nodes):
        y = AXIS_H + row * ROW_H
        parts.append(f'<g class="node-row" data-row="{row}" data-node="{escape(node)}">')
        unacted = [u for u in result.unacted if u.node == node and axis.shows(u.start, u.end)]
        causes = {u.category for u in unacted if u.category != UNKNOWN}  # one mark per cause, in its colour
        flag = "".join(f'<tspan class="unacted-row" data-category="{escape(c)}" fill="{UNACTED_COLORS.get(c, "#888")}">'
                       "\u25bc </tspan>" for c in sorted(causes, key=_cause_order))
        parts.append(f'<text class="row" x="4" y="{y + BAR_H - 2}">{flag}{escape(node[:24])}'
                     f"<title>{escape(node)}</title></text>")
        parts.append(f'<line x1="{LABEL_W}" y1="{y + BAR_H / 2}" x2="{width - 10}" y2="{y + BAR_H / 2}" '
                     'stroke="#9c9" stroke-width="1"/>')
        for u in (u for u in unacted if u.category == UNKNOWN):
            parts.append(_bar(axis, u.start, u.end, y + 3, BAR_H - 6, UNKNOWN_COLOR,
                              f"{node}: health unknown {format_time(u.start)} for {duration(u.end - u.start)}: "
                              f"{u.detail}", css="bar unknown")[0])
        after = 0.0
        for s in sorted((s for s in result.spans if s.node == node and axis.shows(s.start, s.end)),
                        key=lambda s: s.start):
            move = next((m for m in result.moves if m.node == node and m.at == s.start and m.to_state == s.state), None)
            why = f" ({move.reason}: {move.message})" if move else ""
            bar, after = _bar(axis, s.start, s.end, y, BAR_H, COLORS.get(s.state, "#888"),
                              f"{node}: {s.state} from {format_time(s.start)} for {duration(s.end - s.start)}{why}",
                              css="bar state", after=after)
            parts.append(bar)
        for w in (w for w in result.waits if w.node == node and axis.shows(w.start, w.end)):
            parts.append(_bar(axis, w.start, w.end, y + BAR_H + 1, 3, WAIT_COLOR,
                              f"{node}: waiting ({w.reason}) {duration(w.end - w.start)}: {w.detail}",
                              css="bar wait")[0])
        for u in (u for u in unacted if u.category != UNKNOWN):
            span = "" if u.end == u.start else f" for {duration(u.end - u.start)}"
            parts.append(_marker(axis, max(u.start, axis.start), y - 4, UNACTED_COLORS.get(u.category, "#888"),
                                 f"{node}: seen, not acted on ({u.category}) {format_time(u.start)}{span}: "
                                 f"{u.detail}"))
        parts.append("</g>")
    for t in (t for t in result.trips if axis.shows(t.at, t.at)):
        x = axis.x(t.at)
        title = escape(f"circuit breaker opened at {format_time(t.at)}: {t.reason}")
        parts.append(f'<line class="trip" x1="{x:.1f}" y1="{AXIS_H - 4}" x2="{x:.1f}" y2="{height}" '
                     f'stroke="{TRIP_COLOR}" stroke-width="2" stroke-dasharray="4 3" data-t0="{t.at:.3f}">'
                     f"<title>{title}</title></line>")
    if not nodes:
        parts.append(f'<text x="{LABEL_W}" y="{AXIS_H + 14}">no node was affected</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _cause_order(category: str) -> int:
    return list(UNACTED_COLORS).index(category) if category in UNACTED_COLORS else len(UNACTED_COLORS)


def _changes(result: ReplayResult, node: str, start: float, end: float) -> bool:
    """Something of ``node`` starts or changes between start and end (a transition, a wait beginning or ending, a
    fault seen and not acted on): a zoom is offered there, not on every day a long bar only spans."""
    def began(at: float) -> bool:
        return start <= at < end

    def ended(at: float) -> bool:  # an end at midnight is the day before's (a zoom would show nothing of it)
        return start < at <= end and at < result.end

    spans = [(s.start, s.end) for s in result.spans if s.node == node] + \
        [(w.start, w.end) for w in result.waits if w.node == node] + \
        [(u.start, u.end) for u in result.unacted if u.node == node]
    return any(began(a) or (b > a and ended(b)) for a, b in spans)


def _active(result: ReplayResult, node: str, start: float, end: float) -> bool:
    """Something of ``node`` to draw between start and end."""
    return (any(s.node == node and s.start < end and s.end > start for s in result.spans)
            or any(w.node == node and w.start < end and w.end > start for w in result.waits)
            or any(u.node == node and u.start < end and u.end >= start for u in result.unacted))


def zoom_windows(start: float, end: float) -> list[tuple[float, float]]:
    """The replay's range cut into the smallest of ZOOM_UNITS giving at most MAX_ZOOMS windows, aligned to UTC
    hours (days for a day or more); none for a range of two hours or less."""
    span = end - start
    if span <= 2 * 3600:
        return []
    unit = next((u for u in ZOOM_UNITS if span / u <= MAX_ZOOMS), ZOOM_UNITS[-1])
    if span / unit > MAX_ZOOMS:
        unit = span / MAX_ZOOMS
    align = min(unit, 86400.0)
    at = start - start % align
    windows = []
    while at < end:
        windows.append((max(at, start), min(at + unit, end)))
        at += unit
    return windows


def zoom_id(window: tuple[float, float]) -> str:
    """``zoom-20261105T0000-20261106T0000``: the range in the page's URL (replay.html#zoom-...)."""
    return "zoom-" + "-".join(time.strftime("%Y%m%dT%H%M", time.gmtime(t)) for t in window)


def _label(window: tuple[float, float]) -> str:
    first, last = (format_time(t) for t in window)
    if window[1] - window[0] >= 86400 and first[11:16] == "00:00" and last[11:16] == "00:00":
        return first[5:10] if window[1] - window[0] <= 86400 else f"{first[5:10]}..{last[5:10]}"
    return f"{first[5:10]} {first[11:16]}"


def _zooms(results: Sequence[ReplayResult], nodes: Sequence[str], width: float) -> tuple[str, str]:
    """The zoom links (only ranges where something starts or changes, or a breaker opens) and their panes, shown by
    :target; a zoom shows every row with something in its range."""
    first = results[0]
    links, panes = [], []
    for window in zoom_windows(first.start, first.end):
        if not any(_changes(r, n, *window) for r in results for n in nodes) and \
                not any(window[0] <= t.at < window[1] for r in results for t in r.trips):
            continue
        rows = [n for n in nodes if any(_active(r, n, *window) for r in results)]
        ident = zoom_id(window)
        links.append(f'<a href="#{ident}" title="{escape(format_time(window[0]))} → '
                     f'{escape(format_time(window[1]))}">{escape(_label(window))}</a>')
        inner = "".join(f'<div class="pane"><h3>{escape(r.policy)}</h3>{svg_timeline(r, rows, width, window)}</div>'
                        if len(results) > 1 else svg_timeline(r, rows, width, window) for r in results)
        panes.append(f'<section class="zoom" id="{ident}"><h2>Zoom: {escape(format_time(window[0]))} → '
                     f'{escape(format_time(window[1]))} ({len(rows)} node(s)) <a class="small" href="#timeline">'
                     f'back to the whole range</a></h2><div class="panes">{inner}</div></section>')
    nav = (f'<p class="zoomnav small">Zoom into: {"".join(links)} (or put #zoom-YYYYMMDDTHHMM-YYYYMMDDTHHMM in '
           "the address)</p>") if links else ""
    nav += ('<p class="rangenav small">Any range: put #from=YYYY-MM-DD&amp;to=YYYY-MM-DD in the address (UTC; '
            "a time as 2026-11-05T06:00; a date alone as to includes its day; drawn by the page's script)</p>")
    return nav, "".join(panes)


def _headline(results: Sequence[ReplayResult]) -> str:
    """What a reader needs first: the cost, who needs a person, whether the breaker opened."""
    blocks = []
    for r in results:
        summary = r.summary()
        people = summary["quarantined_at_end"]
        names = ", ".join(people[:10]) + (f" and {len(people) - 10} more" if len(people) > 10 else "")
        caption = f'<div class="small">{escape(r.policy)}</div>' if len(results) > 1 else ""
        blocks.append(
            f'<div class="headline" data-policy="{escape(r.policy)}">{caption}'
            f'<div class="figure" data-figure="gpu-hours"><b>{r.gpu_hours():,.1f}</b>GPU-hours out of service'
            f'<div class="names">{r.node_hours():,.1f} node-hours, {summary["nodes_acted_on"]} node(s) acted on'
            f"</div></div>"
            f'<div class="figure{" alarm" if people else ""}" data-figure="needs-a-person"><b>{len(people)}</b>'
            f'node(s) needing a person<div class="names">{escape(names) or "none quarantined at the end"}</div></div>'
            f'<div class="figure{" alarm" if r.trips else ""}" data-figure="breaker-openings"><b>{len(r.trips)}</b>'
            f'circuit breaker opening(s)<div class="names">'
            f'{escape(", ".join(format_time(t.at)[:16].replace("T", " ") for t in r.trips[:5])) or "never opened"}'
            f"</div></div></div>")
    return "".join(blocks)


def _per_node_table(results: Sequence[ReplayResult]) -> str:
    """The text output's "Out of service" table: node-hours and GPU-hours per node, then the total."""
    nodes = sorted(set().union(*({s.node for s in r.spans} for r in results)))
    named = len(results) > 1
    head = "".join(f"<th>node-hours{escape(' ' + r.policy) if named else ''}</th>"
                   f"<th>GPU-hours{escape(' ' + r.policy) if named else ''}</th>" for r in results)
    rows = [f"<tr><td>{escape(n)}</td>" + "".join(f"<td>{r.node_hours(n):.2f}</td><td>{r.gpu_hours(n):.2f}</td>"
                                                   for r in results) + "</tr>" for n in nodes]
    total = "<tr class=\"total\"><td>total</td>" + "".join(
        f"<td>{r.node_hours():.2f}</td><td>{r.gpu_hours():.2f}</td>" for r in results) + "</tr>"
    return f'<table class="per-node"><tr><th>node</th>{head}</tr>{"".join(rows)}{total}</table>'


def legend() -> str:
    items = [f'<span><i style="background:{c}"></i>{escape(s)}</span>' for s, c in COLORS.items()]
    items += [f'<span><i style="background:{UNKNOWN_COLOR}"></i>health unknown</span>',
              f'<span><i style="background:{WAIT_COLOR};height:3px"></i>waiting (budget, breaker)</span>',
              f'<span><i style="background:{TRIP_COLOR};width:3px"></i>breaker opened</span>',
              '<span><i style="background:#9c9;height:1px"></i>healthy</span>']
    items += [f'<span><b style="color:{c}">\u25bc</b> seen, not acted on: {escape(k)}</span>'
              for k, c in UNACTED_COLORS.items()]
    items.append(f'<span>(every bar at least {MIN_BAR_PX:g} px wide: short ones are drawn wider than they '
                 "lasted)</span>")
    return '<p class="legend">' + "".join(items) + "</p>"


def _summary_table(results: Sequence[ReplayResult]) -> str:
    summaries = [r.summary() for r in results]
    head = "".join(f"<th>{escape(r.policy)}</th>" for r in results)
    rows = [f"<tr><td>{escape(k.replace('_', ' '))}</td>" + "".join(f"<td>{s[k]}</td>" for s in summaries) + "</tr>"
            for k in ("nodes", "gpus", *COMPARED)]
    rows += [f"<tr><td>not acted on: {c}</td>" + "".join(f"<td>{s['unacted'][c]}</td>" for s in summaries) + "</tr>"
             for c in UNACTED_CATEGORIES]
    rows += [f"<tr><td>findings: {k}</td>" + "".join(f"<td>{s['degradation_findings'][k]}</td>" for s in summaries)
             + "</tr>" for k in DEGRADATION_KINDS]
    rows.append("<tr><td>maintenances scheduled</td>" + "".join(f"<td>{s['maintenances_scheduled']}</td>"
                                                              for s in summaries) + "</tr>")
    rows.append("<tr><td>findings: workload-gpu-errors</td>" + "".join(f"<td>{s['workload_findings']}</td>"
                                                                      for s in summaries) + "</tr>")
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
            f"</details>{_degradation(result)}{_workload(result)}")


def _degradation(result: ReplayResult) -> str:
    """The degradation findings by kind and the maintenances trends would schedule (none: nothing shown)."""
    if not result.findings and not result.maintenances:
        return ""
    counts = result.findings_by_kind()
    rows = ("<tr><th>found</th><th>node</th><th>kind</th><th>GPU</th><th>action</th><th>lasted</th>"
            "<th>what the node did</th></tr>")
    rows += "".join(f"<tr><td>{escape(format_time(f.start))}</td><td>{escape(f.node)}</td><td>{escape(f.kind)}</td>"
                   f"<td>{escape(', '.join(f.gpus))}</td><td>{escape(f.action)}</td><td>"
                   f"{'until the end' if f.ongoing else escape(duration(f.end - f.start))}</td>"
                   f"<td style='text-align:left'>{escape(outcome(result, f))}</td></tr>" for f in result.findings)
    rows += "".join(f"<tr><td>{escape(format_time(r.at))}</td><td>{escape(r.node)}</td><td>maintenance</td><td></td>"
                    f"<td></td><td></td><td style='text-align:left'>would schedule a maintenance at "
                    f"{escape(format_time(r.drain_at))} ({escape(r.name)})</td></tr>" for r in result.maintenances)
    kinds = ", ".join(f"{k} {counts[k]}" for k in DEGRADATION_KINDS)
    return (f'<details open class="degradation"><summary>degradation findings ({escape(kinds)}; '
            f"{len(result.maintenances)} maintenance(s))</summary><table>{rows}</table></details>")


def _workload(result: ReplayResult) -> str:
    """The workload-gpu-errors findings (pods failing on the node with GPU errors); nothing without failed pods."""
    if not result.failed_pods and not result.workload_findings:
        return ""
    rows = ("<tr><th>found</th><th>node</th><th>failures</th><th>action</th><th>lasted</th>"
            "<th>what the node did</th><th>the signal</th></tr>")
    rows += "".join(f"<tr><td>{escape(format_time(f.start))}</td><td>{escape(f.node)}</td><td>{escape(f.code)}</td>"
                    f"<td>{escape(f.action)}</td><td>"
                    f"{'until the end' if f.ongoing else escape(duration(f.end - f.start))}</td>"
                    f"<td style='text-align:left'>{escape(outcome(result, f))}</td>"
                    f"<td style='text-align:left'>{escape(f.message)}</td></tr>" for f in result.workload_findings)
    return (f'<details open class="workload"><summary>workload findings ({len(result.workload_findings)}; '
            f"{result.failed_pods} failed pod(s) in the history, {result.gpu_failed_pods} with a GPU error)"
            f"</summary><table>{rows}</table></details>")


def render_html(results: Sequence[ReplayResult]) -> str:
    first = results[0]
    nodes = sorted(set().union(*(r.affected for r in results), *({u.node for u in r.unacted} for r in results)))
    width = 1100.0 if len(results) == 1 else 640.0
    panes = "".join(
        f'<div class="pane"><h2>{escape(r.policy)}</h2>{svg_timeline(r, nodes, width)}{_details(r)}</div>'
        for r in results)
    title = "gpuremediate replay" + (": " + " vs ".join(r.policy for r in results) if len(results) > 1 else "")
    notes = "".join(f"<li>{escape(n)}</li>" for r in results for n in r.notes)
    nav, zooms = _zooms(results, nodes, width)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<section id="range" class="range" hidden><h2>Range: <span class="what"></span> <a class="small"
href="#timeline">back to the whole range</a></h2><div class="panes"></div></section>
{zooms}
<h1>{escape(title)}</h1>
{_headline(results)}
<p class="small">{escape(format_time(first.start))} → {escape(format_time(first.end))}
({escape(duration(first.end - first.start))}), scrape every {first.step_s:g}s, {len(first.gpus)} GPU nodes,
{sum(first.gpus.values())} GPUs. What the controller would have done: the same code as the controller,
on a simulated clock. Hover a bar for details.</p>
<h2 id="timeline">Timeline: {len(nodes)} node(s) acted on, waiting, or with faults not acted on (times UTC)</h2>
{legend()}
{nav}
<div class="panes">{panes}</div>
<h2>Out of service per node (quarantined counts until the end of the range)</h2>
{_per_node_table(results)}
<h2>Totals</h2>
{_summary_table(results)}
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
<script>{RANGE_SCRIPT}</script>
</body></html>
"""
