"""The saved-scrapes folder: per-node files, fleet-wide files, unknown markers, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuremediate.replay.history import Cursor, HistoryError, load_scrapes, parse_time
from sim.history import scrape_text
from tests.replay.helpers import HOUR, T0, fleet, xid


def test_per_node_scrapes_become_change_points(tmp_path: Path) -> None:
    scenario = fleet(count=2, faults=[xid(1, 600, HOUR)])
    for at in (T0, T0 + 300, T0 + 600, T0 + HOUR):  # a repeat at +300 changes nothing
        for node in scenario.nodes:
            (tmp_path / node).mkdir(exist_ok=True)
            (tmp_path / node / f"{at:.0f}.prom").write_text(scrape_text(scenario, node, at))
    (tmp_path / "node-0" / "2026-11-01T00:20:00Z.unknown").write_text("timeout after 5 s\n")

    history = load_scrapes(tmp_path)

    assert (history.start, history.end) == (T0, T0 + HOUR)
    assert [c.at - T0 for c in history.changes["node-1"]] == [0, 600, HOUR]
    assert [(c.at - T0, c.readings.status, c.readings.reason) for c in history.changes["node-0"]] == [
        (0, "ok", ""), (1200, "unknown", "timeout after 5 s"), (HOUR, "ok", "")]
    assert history.changes["node-1"][1].readings.gpus[0].xid == 79


def test_a_fleet_wide_scrape_places_series_by_node_label_and_misses_are_unknown(tmp_path: Path) -> None:
    scenario = fleet(count=3)
    both = "".join(scrape_text(scenario, n, T0) for n in scenario.nodes)
    (tmp_path / f"{T0:.0f}.prom").write_text(both)
    (tmp_path / f"{T0 + 60:.0f}.prom").write_text(scrape_text(scenario, "node-0", T0 + 60))

    history = load_scrapes(tmp_path, end=T0 + HOUR)

    assert history.nodes == ["node-0", "node-1", "node-2"]
    assert history.changes["node-2"][-1].readings.status == "unknown"
    assert "absent from the fleet scrape" in history.changes["node-2"][-1].readings.reason
    assert history.gpus_seen("node-0") == 8


def test_the_cursor_walks_forward(tmp_path: Path) -> None:
    scenario = fleet(count=1, faults=[xid(0, 600, HOUR)])
    for at in (T0, T0 + 600, T0 + HOUR):
        (tmp_path / "node-0").mkdir(exist_ok=True)
        (tmp_path / "node-0" / f"{at:.0f}.prom").write_text(scrape_text(scenario, "node-0", at))
    cursor = Cursor(load_scrapes(tmp_path))

    assert cursor.readings("node-0") is None
    assert cursor.advance(T0 + 599) == {"node-0"} and cursor.next_change() == T0 + 600
    assert cursor.advance(T0 + 599) == set()
    assert cursor.advance(T0 + 600) == {"node-0"}
    readings = cursor.readings("node-0")
    assert readings is not None and readings.gpus[0].xid == 79


def test_times_are_unix_seconds_or_rfc3339() -> None:
    assert parse_time("1793491200") == T0
    assert parse_time("2026-11-01T00:00:00Z") == T0
    assert parse_time("2026-11-01T01:00:00+01:00") == T0
    assert parse_time("2026-11-01T00:00:00") == T0  # no offset: UTC
    with pytest.raises(HistoryError, match="neither unix seconds"):
        parse_time("last tuesday")


def test_bad_folders_are_named(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="no scrapes"):
        load_scrapes(tmp_path)
    (tmp_path / "node-0").mkdir()
    (tmp_path / "node-0" / "soon.prom").write_text("")
    with pytest.raises(HistoryError, match=r"node-0/soon.prom: timestamp 'soon'"):
        load_scrapes(tmp_path)
    (tmp_path / "node-0" / "soon.prom").unlink()
    (tmp_path / "node-0" / f"{T0:.0f}.prom").write_text("")
    with pytest.raises(HistoryError, match="the range is empty"):
        load_scrapes(tmp_path)
