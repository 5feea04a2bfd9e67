"""The maintenance window: days, hours (across midnight, 24:00), time zones, DST, bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.vocab.window import Window, WindowError, parse_days


def ts(text: str, zone: str = "UTC") -> float:
    from zoneinfo import ZoneInfo

    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


def test_days_lists_and_ranges() -> None:
    assert parse_days("Mon,Wed") == {0, 2}
    assert parse_days("fri-mon") == {4, 5, 6, 0}
    with pytest.raises(WindowError, match="--days: 'Funday' is not a weekday"):
        parse_days("Mon,Funday")


@pytest.mark.parametrize(("hours", "error"), [
    ("22:00", "not a range"), ("25:00-01:00", "not a time of day"), ("10:00-10:00", "empty"),
    ("24:00-02:00", "cannot start at 24:00"), ("9-10", "not HH:MM"), ("10:60-11:00", "not a time of day"),
])
def test_bad_hours_name_the_flag(hours: str, error: str) -> None:
    with pytest.raises(WindowError, match=f"--hours: .*{error}"):
        Window.parse("Mon", hours, "UTC")


def test_unknown_zone_is_rejected() -> None:
    with pytest.raises(WindowError, match="--timezone: unknown time zone 'Mars/Olympus'"):
        Window.parse("Mon", "00:00-24:00", "Mars/Olympus")


def test_window_crossing_midnight_belongs_to_the_day_it_starts() -> None:
    w = Window.parse("Fri", "22:00-06:00", "UTC")  # 2024-06-07 is a Friday
    assert not w.is_open(ts("2024-06-07T21:59:59"))
    assert w.is_open(ts("2024-06-07T22:00:00"))
    assert w.is_open(ts("2024-06-08T05:59:00"))  # Saturday morning: still Friday's window
    assert not w.is_open(ts("2024-06-08T06:00:00"))
    assert not w.is_open(ts("2024-06-08T23:00:00"))  # Saturday night is not allowed
    assert w.next_opening(ts("2024-06-08T06:00:00")) == ts("2024-06-14T22:00:00")


def test_whole_day_and_time_zone() -> None:
    w = Window.parse("Mon", "00:00-24:00", "America/New_York")  # 2024-06-10 is a Monday
    assert w.is_open(ts("2024-06-10T00:00:00", "America/New_York"))
    assert w.is_open(ts("2024-06-10T23:59:00", "America/New_York"))
    assert not w.is_open(ts("2024-06-10T00:30:00"))  # Sunday evening in New York
    assert w.next_opening(ts("2024-06-10T00:30:00")) == ts("2024-06-10T04:00:00")


def test_dst_spring_forward_keeps_wall_clock_hours() -> None:
    w = Window.parse("Sun", "01:00-04:00", "Europe/Berlin")  # 2024-03-31: 02:00 -> 03:00
    assert w.next_opening(ts("2024-03-30T12:00:00")) == ts("2024-03-31T00:00:00")  # 01:00 CET
    assert w.is_open(ts("2024-03-31T01:30:00"))  # 03:30 CEST
    assert not w.is_open(ts("2024-03-31T02:00:00"))  # 04:00 CEST


@settings(max_examples=60, deadline=None)
@given(days=st.sets(st.integers(0, 6), min_size=1), start=st.integers(0, 1439), length=st.integers(1, 1440),
       now=st.integers(1_600_000_000, 1_900_000_000))
def test_next_opening_is_open_and_nothing_before_it_is(days: set[int], start: int, length: int, now: int) -> None:
    end = (start + length) % 1440 or 1440
    if end == start:
        return
    names = ",".join(("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[d] for d in sorted(days))
    w = Window.parse(names, f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}", "UTC")
    opens = w.next_opening(now)
    assert opens >= now and w.is_open(opens)
    assert opens - now < 8 * 86400
    step = max(60.0, (opens - now) / 50)
    probe = float(now)
    while probe < opens - 1:
        assert not w.is_open(probe), datetime.fromtimestamp(probe, UTC)
        probe += step
    assert timedelta(seconds=opens - now) >= timedelta(0)
