"""The replay page a person reads (`gpuremediate replay --html`), parsed as a browser would read its structure:
the headline comes first, a 35-minute repair on a 30-day axis is drawn wide enough to see, every day with
something in it can be zoomed into from a link (and from the address: #zoom-...), rows whose faults were
seen but not acted on are marked, and the per-node GPU-hours are the text output's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from itertools import pairwise
from pathlib import Path

import pytest

from gpuremediate.replay.html import (
    MIN_BAR_PX,
    RANGE_SCRIPT,
    UNACTED_COLORS,
    Axis,
    render_html,
    tick_label,
    ticks,
    zoom_id,
    zoom_windows,
)
from gpuremediate.replay.result import BREAKER_HELD, EXCLUDED, ReplayResult
from gpuremediate.replay.text import out_of_service
from tests.replay.helpers import HOUR, T0, fleet, run, xid

DAY = 24 * HOUR


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parents: list[Element]
    text: str = ""
    children: list[Element] = field(default_factory=list)

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)

    def within(self, predicate: object) -> Element | None:
        return next((p for p in reversed(self.parents) if callable(predicate) and predicate(p)), None)


class Page(HTMLParser):
    """Every element in document order, with its parents and its text."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self.stack: list[Element] = []
        self.style = ""
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, list(self.stack))
        if self.stack:
            self.stack[-1].children.append(element)
        self.elements.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.stack:
            self.stack[-1].text += data
            if self.stack[-1].tag == "style":
                self.style += data

    def find(self, tag: str, cls: str = "", **attrs: str) -> list[Element]:
        return [e for e in self.elements if e.tag == tag and (not cls or cls in e.classes())
                and all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())]


@pytest.fixture(scope="module")
def month(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReplayResult, Page]:
    scenario = fleet(count=12, hours=30 * 24, faults=[
        xid(0, 3 * DAY, 3 * DAY + 600),  # XID 79: drain, reboot, validate: 35 minutes out of service
        xid(2, 14 * DAY, None, code=9999),  # not in NVIDIA's catalog: quarantined, needs a person
        *(xid(n, 20 * DAY + 30 * n, 20 * DAY + 600) for n in range(3, 8)),  # a storm: the breaker opens
        xid(9, 25 * DAY, 25 * DAY + 600),  # an excluded node: seen, not acted on
    ], down=[("node-11", T0 + 5 * DAY, T0 + 6 * DAY)], excluded=["node-9"])
    result = run(tmp_path_factory.mktemp("month"), scenario)
    return result, Page(render_html([result]))


def _row_of(element: Element) -> str:
    """The node whose timeline row holds a bar or marker (its title starts with the node's name)."""
    title = next((c for c in element.children if c.tag == "title"), None)
    assert title is not None, element
    return title.text.split(":", 1)[0]


def _in_zoom(element: Element) -> str:
    zoom = element.within(lambda p: p.tag == "section" and "zoom" in p.classes())
    return zoom.attrs["id"] if zoom else ""


def test_the_headline_comes_first_with_cost_people_and_breaker(month: tuple[ReplayResult, Page]) -> None:
    result, page = month
    body = page.find("body")[0]
    # the range and zoom views come before it, unseen unless the address asks for one (hidden, :target)
    first_blocks = [c for c in body.children if c.tag != "h1" and not ({"range", "zoom"} & c.classes())]
    assert "headline" in first_blocks[0].classes(), [c.tag for c in body.children]
    figures = {f.attrs["data-figure"]: f for f in page.find("div", "figure")}
    assert figures["gpu-hours"].children[0].text == f"{result.gpu_hours():,.1f}"
    assert "GPU-hours out of service" in figures["gpu-hours"].all_text()
    assert figures["needs-a-person"].children[0].text == "1" and "node-2" in figures["needs-a-person"].all_text()
    assert figures["breaker-openings"].children[0].text == str(len(result.trips)) == "1"
    assert "alarm" in figures["needs-a-person"].classes() and "alarm" in figures["breaker-openings"].classes()


def test_a_35_minute_repair_on_a_30_day_axis_is_drawn_wide_enough_to_see(month: tuple[ReplayResult, Page]) -> None:
    result, page = month
    bars = [r for r in page.find("rect") if "bar" in r.classes()]
    assert bars and all(float(r.attrs["width"]) >= MIN_BAR_PX for r in bars)
    flow = [r for r in bars if not _in_zoom(r) and _row_of(r) == "node-0"]
    assert len(flow) == 3  # draining, repairing, validating: each its own colour, side by side
    xs = [(float(r.attrs["x"]), float(r.attrs["width"])) for r in flow]
    assert all(x1 + w1 <= x2 + 0.01 for (x1, w1), (x2, _) in pairwise(xs))
    true_px = (result.node_hours("node-0") * 3600) / (result.end - result.start) * 920
    assert true_px < 1 and sum(w for _, w in xs) >= 3 * MIN_BAR_PX
    assert f"every bar at least {MIN_BAR_PX:g} px wide" in page.find("p", "legend")[0].all_text()


def test_every_day_where_something_happens_can_be_zoomed_into_from_a_link_or_the_address(
        month: tuple[ReplayResult, Page]) -> None:
    result, page = month
    assert re.search(r"\.zoom\s*\{\s*display:\s*none;", page.style)
    assert re.search(r"\.zoom:target\s*\{\s*display:\s*block;", page.style)
    links = [a.attrs["href"] for a in page.find("a") if a.within(lambda p: "zoomnav" in p.classes())]
    sections = {s.attrs["id"]: s for s in page.find("section", "zoom")}
    assert links and [f"#{i}" for i in sections] == links  # each link shows its section, and only those exist
    windows = zoom_windows(result.start, result.end)
    assert len(windows) == 30 and windows[0] == (T0, T0 + DAY)  # a 30-day range: one window a day
    storm_day = zoom_id((T0 + 20 * DAY, T0 + 21 * DAY))
    assert storm_day == "zoom-20261121T0000-20261122T0000" and f"#{storm_day}" in links
    assert zoom_id((T0 + 8 * DAY, T0 + 9 * DAY)) not in sections  # a day with nothing in it has no zoom
    zoomed = [r for r in page.find("rect") if "bar" in r.classes() and _in_zoom(r) == storm_day]
    assert {_row_of(r) for r in zoomed} >= {"node-3", "node-4", "node-5"}
    node3 = [float(r.attrs["width"]) for r in zoomed if _row_of(r) == "node-3"]
    assert sum(node3) > 20  # 35 minutes of a day: drawn as it lasted, not at the minimum


def test_rows_with_faults_seen_but_not_acted_on_are_marked(month: tuple[ReplayResult, Page]) -> None:
    _, page = month
    markers = [m for m in page.find("path", "unacted") if not _in_zoom(m)]
    by_row = {_row_of(m): m.children[0].text for m in markers}
    assert set(by_row) == {"node-5", "node-6", "node-7", "node-9"}  # breaker-held, and the excluded node
    assert "seen, not acted on (excluded)" in by_row["node-9"] and "(breaker-held)" in by_row["node-6"]
    labels = {t.text for t in page.find("text", "row")  # the node's name follows the flag's tspan
              if not _in_zoom(t) and any("unacted-row" in c.classes() for c in t.children)}
    assert labels == {"node-5", "node-6", "node-7", "node-9"}
    assert "node-0" not in labels and "node-11" not in labels  # acted on; unknown (drawn as its grey bar)


def test_the_per_node_gpu_hours_table_is_the_text_outputs(month: tuple[ReplayResult, Page]) -> None:
    result, page = month
    (table,) = page.find("table", "per-node")
    rows = [[td.all_text() for td in tr.children if td.tag == "td"] for tr in table.children if tr.tag == "tr"]
    rows = [r for r in rows if r]
    text = [line.split() for line in out_of_service(result)[3:]]
    assert rows == text, (rows, text)
    assert rows[-1] == ["total", f"{result.node_hours():.2f}", f"{result.gpu_hours():.2f}"]
    assert ["node-2", "384.00", "3072.00"] in rows  # quarantined on day 14 of 30, 8 GPUs: until the end


def test_one_inline_script_and_nothing_fetched(month: tuple[ReplayResult, Page]) -> None:
    _, page = month
    (script,) = page.find("script")
    assert "src" not in script.attrs and script.all_text() == RANGE_SCRIPT
    assert not page.find("link") and not page.find("img")
    assert not re.search(r"fetch\(|XMLHttpRequest|import\(|\bsrc\b", RANGE_SCRIPT)
    assert set(re.findall(r"https?://[^\s\"']+", RANGE_SCRIPT)) == {"http://www.w3.org/2000/svg"}  # a namespace


def _whole(page: Page) -> list[Element]:
    return [e for e in page.elements if e.within(lambda p: p.tag == "svg" and "whole" in p.classes())]


def test_a_date_range_in_the_address_has_what_the_script_needs(month: tuple[ReplayResult, Page]) -> None:
    """#from=...&to=...: the script redraws a copy of the whole-range timeline from the times every bar,
    marker and breaker line carries, row by row, into the hidden section #range."""
    result, page = month
    assert "hashchange" in RANGE_SCRIPT and 'params.get("from")' in RANGE_SCRIPT and 'params.get("to")' in RANGE_SCRIPT
    (whole,) = page.find("svg", "whole")
    assert (float(whole.attrs["data-start"]), float(whole.attrs["data-end"])) == (result.start, result.end)
    assert float(whole.attrs["data-width"]) == 1100
    rows = [(int(g.attrs["data-row"]), g.attrs["data-node"]) for g in _whole(page)
            if g.tag == "g" and "node-row" in g.classes()]
    nodes = sorted(set(result.affected) | {u.node for u in result.unacted})
    assert rows == list(enumerate(nodes)), rows
    drawn = [e for e in _whole(page) if e.tag in ("rect", "path") and ("bar" in e.classes() or "unacted" in
                                                                        e.classes())]
    assert len(drawn) >= 20
    assert [e.tag for e in drawn if "data-t0" not in e.attrs or not e.within(lambda p: "node-row" in p.classes())
            or ("data-t1" if e.tag == "rect" else "data-x") not in e.attrs] == []  # a marker moves by its own x
    trips = [e for e in _whole(page) if e.tag == "line" and "trip" in e.classes()]
    assert [float(t.attrs["data-t0"]) for t in trips] == [t.at for t in result.trips]
    node0 = [(float(r.attrs["data-t0"]), float(r.attrs["data-t1"])) for r in drawn
             if r.tag == "rect" and "state" in r.classes() and _row_of(r) == "node-0"]
    assert node0 == [(s.start, s.end) for s in sorted(result.spans, key=lambda s: s.start) if s.node == "node-0"]
    assert "#from=YYYY-MM-DD&to=YYYY-MM-DD" in page.find("p", "rangenav")[0].all_text()


def test_without_javascript_the_page_shows_everything(month: tuple[ReplayResult, Page]) -> None:
    result, page = month
    (section,) = page.find("section", id="range")
    assert "hidden" in section.attrs and not section.all_text().replace("Range:", "").replace(
        "back to the whole range", "").strip()  # empty until the script draws a range into it
    assert [e.attrs.get("id") for e in page.elements if "hidden" in e.attrs] == ["range"]  # nothing else hidden
    assert not re.search(r"\.(timeline|node-row|whole)\b[^{]*\{[^}]*display:\s*none", page.style)
    states = [r for r in _whole(page) if r.tag == "rect" and "state" in r.classes()]
    assert len(states) == len(result.spans) and {_row_of(r) for r in states} == {s.node for s in result.spans}


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to run the page's script with")
def test_the_script_reads_the_range_and_places_times_as_the_page_does(tmp_path: Path) -> None:
    probe = tmp_path / "probe.js"
    axis = Axis(T0, T0 + 3 * DAY, 1100.0)
    probe.write_text(RANGE_SCRIPT + f"""
var r = globalThis.gpuremediateRange, x = r.axisX({T0}, {T0 + 3 * DAY}, 1100);
console.log(JSON.stringify({{
  days: r.parseRange("#from=2026-11-01&to=2026-11-03"),
  times: r.parseRange("#from=2026-11-05T06:00&to=2026-11-05T18:30:00Z"),
  open: r.parseRange("#to=2026-11-02"),
  fixed: r.parseRange("#zoom-20261105T0000-20261106T0000"),
  bad: r.parseRange("#from=yesterday"),
  xs: [x({T0 - 100}), x({T0 + DAY}), x({T0 + 5 * DAY})]
}}));
""", encoding="utf-8")
    ran = subprocess.run(["node", str(probe)], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout)
    assert T0 == 1793491200.0  # 2026-11-01T00:00:00Z: the helpers' start
    assert got["days"] == {"from": T0, "to": T0 + 3 * DAY}  # a date alone as "to" includes its day
    assert got["times"] == {"from": T0 + 4 * DAY + 6 * HOUR, "to": T0 + 4 * DAY + 18.5 * HOUR}
    assert got["open"] == {"from": None, "to": T0 + 2 * DAY} and got["fixed"] is None and got["bad"] is None
    assert got["xs"] == pytest.approx([axis.x(T0 - 100), axis.x(T0 + DAY), axis.x(T0 + 5 * DAY)])


# ---- issue 50: the axis, the rows' marks, where zooms are offered, the views at the top ------------------------

def _axis_labels(svg: Element) -> list[str]:
    axis = next(c for c in svg.children if c.tag == "g" and "axis" in c.classes())
    return [t.text for t in axis.children if t.tag == "text"]


def test_axis_ticks_are_labelled_by_the_unit_they_step_in(month: tuple[ReplayResult, Page]) -> None:
    """`#from=2026-11-09&to=2026-11-12` read `11-09 11-09 11-10 11-10 ...`: a tick every 12 h labelled by its date.
    Ticks fall on multiples of their step and say it: a date for days and weeks, a time for hours (with the date
    at the first tick and at midnight); no two read the same."""
    _, page = month
    svgs = page.find("svg")
    assert svgs and all(len(set(_axis_labels(svg))) == len(_axis_labels(svg)) >= 2 for svg in svgs), \
        [_axis_labels(svg) for svg in svgs]
    (whole,) = page.find("svg", "whole")
    assert _axis_labels(whole) == ["11-02", "11-09", "11-16", "11-23", "11-30"]  # weekly, on Mondays
    day = next(s for s in page.find("section", "zoom") if s.attrs["id"] == zoom_id((T0 + 3 * DAY, T0 + 4 * DAY)))
    (zoomed,) = [e for e in page.elements if e.tag == "svg" and day in e.parents]
    assert _axis_labels(zoomed) == ["11-04 00:00", "06:00", "12:00", "18:00", "11-05 00:00"]
    step, found = ticks(T0 + 8 * DAY, T0 + 12 * DAY, 8)  # what the range asks for (a date alone as "to")
    assert [tick_label(t, step, i == 0) for i, t in enumerate(found)] == ["11-09", "11-10", "11-11", "11-12",
                                                                          "11-13"]
    step, found = ticks(T0 + 8 * DAY + 6 * HOUR, T0 + 8 * DAY + 12 * HOUR, 8)
    assert [tick_label(t, step, i == 0) for i, t in enumerate(found)] == [
        "11-09 06:00", "07:00", "08:00", "09:00", "10:00", "11:00", "12:00"]


def test_each_rows_mark_takes_the_colour_of_its_cause(month: tuple[ReplayResult, Page]) -> None:
    """Every "not acted on" row carried a red ▼ (the legend's breaker-held) whatever its cause: node-9's was
    excluded (purple)."""
    _, page = month
    marks = {}
    for text in page.find("text", "row"):
        if not _in_zoom(text):
            marks[text.text] = [(c.attrs["data-category"], c.attrs["fill"]) for c in text.children
                                if "unacted-row" in c.classes()]
    assert marks["node-9"] == [(EXCLUDED, UNACTED_COLORS[EXCLUDED])]
    assert all(marks[n] == [(BREAKER_HELD, UNACTED_COLORS[BREAKER_HELD])] for n in ("node-5", "node-6", "node-7"))
    legend = page.find("p", "legend")[0].all_text()
    for category in UNACTED_COLORS:
        assert f"seen, not acted on: {category}" in legend
    legend_colors = {b.attrs["style"] for b in page.elements if b.tag == "b" and b.within(
        lambda p: "legend" in p.classes())}
    assert {f"color:{c}" for c in UNACTED_COLORS.values()} == legend_colors


def test_zooms_are_offered_where_something_starts_or_changes(month: tuple[ReplayResult, Page]) -> None:
    """node-2 is quarantined from day 14 to the end: its bar spans 16 days, and only the day it started gets a zoom
    (22 of 30 days had one when every day a bar spans did)."""
    result, page = month
    linked = {a.attrs["href"][1:] for a in page.find("a") if a.within(lambda p: "zoomnav" in p.classes())}
    days = {zoom_id((T0 + d * DAY, T0 + (d + 1) * DAY)): d for d in range(30)}
    assert {days[z] for z in linked} == {3, 5, 14, 20, 25}, sorted(days[z] for z in linked)
    started = [s for s in result.spans if s.node == "node-2"]
    assert started and max(s.end for s in started) == result.end  # the bar runs on to the end, unlinked


def test_zoom_and_range_views_open_at_the_top_of_the_page(month: tuple[ReplayResult, Page]) -> None:
    """They came after the headline: the browser scrolled ~200 px down to them (a blank band in a screenshot).
    Now they are the page's first blocks, with a scroll margin as tall as the page's own."""
    _, page = month
    body = page.find("body")[0]
    order = [c for c in body.children if c.tag in ("section", "h1")]
    first_h1 = next(i for i, c in enumerate(order) if c.tag == "h1")
    assert all(c.tag == "section" for c in order[:first_h1]) and order[0].attrs.get("id") == "range"
    assert not [c for c in order[first_h1:] if c.tag == "section"]
    assert re.search(r"\.zoom, \.range \{[^}]*scroll-margin-top: 24px", page.style)


# ---- the same in a browser: Debian's chromium, headless --------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(tmp: Path, url: str, *mode: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1400,900",
                           "--virtual-time-budget=3000", *mode, url],
                          capture_output=True, text=True, timeout=120, check=False)


def _png_rows(path: Path) -> list[bytes]:
    """The rows of an 8-bit RGB(A) PNG (what chromium's --screenshot writes), unfiltered, with the stdlib only."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks, header = 8, b"", b""
    while at < len(data):
        (length,), kind = struct.unpack(">I", data[at:at + 4]), data[at + 4:at + 8]
        body = data[at + 8:at + 8 + length]
        header = body if kind == b"IHDR" else header
        chunks += body if kind == b"IDAT" else b""
        at += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 4 if color == 6 else 3
    raw, stride, rows, prior = zlib.decompress(chunks), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = prior[i], prior[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line[j] for j in range(stride) if j % bpp < 3))
        prior = line
    return rows


@pytest.fixture(scope="module")
def month_page(month: tuple[ReplayResult, Page], tmp_path_factory: pytest.TempPathFactory) -> Path:
    result, _ = month
    path = tmp_path_factory.mktemp("page") / "replay.html"
    path.write_text(render_html([result]), encoding="utf-8")
    return path


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install -y chromium); the DOM checks above run")
def test_in_chromium_a_zoom_opens_at_the_top_with_no_blank_band(month_page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "zoom.png"
    url = f"{month_page.as_uri()}#{zoom_id((T0 + 20 * DAY, T0 + 21 * DAY))}"
    done = _chromium(tmp_path, url, f"--screenshot={shot}")
    assert shot.exists(), done.stderr[-2000:]
    rows = _png_rows(shot)
    inked = [y for y, row in enumerate(rows) if any(v < 200 for v in row)]
    assert inked and inked[0] < 60, f"the first ink is {inked[0] if inked else None} px down"  # was ~200


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install -y chromium); the DOM checks above run")
def test_in_chromium_a_range_in_the_address_is_drawn_with_its_own_ticks(month: tuple[ReplayResult, Page],
                                                                        month_page: Path, tmp_path: Path) -> None:
    """The issue's #from=2026-11-09&to=2026-11-12, drawn by the page's script: one tick a day, each its own date,
    the same ticks the page draws for that range itself; and the whole range redrawn reads as the page's axis."""
    _, page = month
    for query, expected in (("from=2026-11-09&to=2026-11-12", ["11-09", "11-10", "11-11", "11-12", "11-13"]),
                            ("from=2026-11-01&to=2026-11-30", _axis_labels(page.find("svg", "whole")[0])),
                            ("from=2026-11-21T06:00&to=2026-11-21T12:00",
                             ["11-21 06:00", "07:00", "08:00", "09:00", "10:00", "11:00", "12:00"])):
        done = _chromium(tmp_path, f"{month_page.as_uri()}#{query}", "--dump-dom")
        assert done.returncode == 0 and "</html>" in done.stdout, done.stderr[-2000:]
        drawn = Page(done.stdout)
        (section,) = drawn.find("section", id="range")
        assert "hidden" not in section.attrs
        svgs = [e for e in drawn.elements if e.tag == "svg" and section in e.parents]
        assert len(svgs) == 1 and _axis_labels(svgs[0]) == expected, (query, [_axis_labels(s) for s in svgs])
