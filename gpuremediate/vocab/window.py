"""A weekly maintenance window: allowed days, an hours range (may cross midnight), a time zone.

A window opens on each allowed day at ``start`` (wall-clock time in the zone) and lasts until
``end``; when ``end`` is not after ``start`` it closes on the next day (``22:00-06:00`` on Fri is
Fri 22:00 → Sat 06:00). ``00:00-24:00`` is the whole day. Pure: every function takes ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_DAY_INDEX = {name.lower(): i for i, name in enumerate(DAYS)}
_MINUTES_PER_DAY = 24 * 60


class WindowError(ValueError):
    """A window that cannot be parsed; the message names the flag and the bad part."""


def parse_days(text: str) -> frozenset[int]:
    """"Mon,Tue,Fri" → {0, 1, 4} (Monday = 0); also ranges "Mon-Fri"."""
    days: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            lo, hi = _DAY_INDEX[first.strip().lower()], _DAY_INDEX[(last or first).strip().lower()]
        except KeyError:
            raise WindowError(f"--days: {part!r} is not a weekday (use {','.join(DAYS)})") from None
        days.update(range(lo, hi + 1) if lo <= hi else [*range(lo, 7), *range(0, hi + 1)])
    if not days:
        raise WindowError(f"--days: no weekday in {text!r}")
    return frozenset(days)


def _minutes(text: str, flag: str) -> int:
    hours, sep, minutes = text.strip().partition(":")
    if not sep or not (hours + minutes).isascii() or not hours.isdigit() or not minutes.isdigit() \
            or len(minutes) != 2:
        raise WindowError(f"{flag}: {text!r} is not HH:MM")
    value = int(hours) * 60 + int(minutes)
    if int(minutes) > 59 or value > _MINUTES_PER_DAY:
        raise WindowError(f"{flag}: {text!r} is not a time of day (00:00 to 24:00)")
    return value


def parse_hours(text: str) -> tuple[int, int]:
    """"22:00-06:00" → (start, end) in minutes after midnight."""
    start_text, sep, end_text = text.partition("-")
    if not sep:
        raise WindowError(f"--hours: {text!r} is not a range HH:MM-HH:MM")
    start, end = _minutes(start_text, "--hours"), _minutes(end_text, "--hours")
    if start == _MINUTES_PER_DAY:
        raise WindowError("--hours: a window cannot start at 24:00")
    if start == end:
        raise WindowError(f"--hours: {text!r} is empty (use 00:00-24:00 for the whole day)")
    return start, end


def parse_zone(text: str) -> tzinfo:
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise WindowError(f"--timezone: unknown time zone {text!r} (an IANA name like Europe/Berlin)") from None


@dataclass(frozen=True)
class Window:
    days: frozenset[int]
    start: int  # minutes after midnight
    end: int
    zone: tzinfo
    text: str = ""

    @classmethod
    def parse(cls, days: str, hours: str, zone: str) -> Window:
        start, end = parse_hours(hours)
        return cls(parse_days(days), start, end, parse_zone(zone), f"{days} {hours} {zone}")

    @property
    def length(self) -> timedelta:
        minutes = self.end - self.start if self.end > self.start else self.end + _MINUTES_PER_DAY - self.start
        return timedelta(minutes=minutes)

    def _opening(self, day: datetime) -> tuple[float, float]:
        """(open, close) in unix seconds of the window that starts on ``day``'s local date."""
        # Wall-clock arithmetic on naive times, then placed in the zone (DST-safe), then to UTC.
        opens_wall = datetime(day.year, day.month, day.day) + timedelta(minutes=self.start)
        opens = opens_wall.replace(tzinfo=self.zone)
        closes = (opens_wall + self.length).replace(tzinfo=self.zone)
        return opens.astimezone(UTC).timestamp(), closes.astimezone(UTC).timestamp()

    def _candidates(self, now: float, back: int, ahead: int) -> list[tuple[float, float]]:
        today = datetime.fromtimestamp(now, self.zone)
        found = []
        for offset in range(-back, ahead + 1):
            day = today + timedelta(days=offset)
            if day.weekday() in self.days:
                found.append(self._opening(day))
        return found

    def is_open(self, now: float) -> bool:
        return any(opens <= now < closes for opens, closes in self._candidates(now, 1, 0))

    def next_opening(self, now: float) -> float:
        """When the window next opens (``now`` itself while it is open)."""
        if self.is_open(now):
            return now
        return min(opens for opens, _ in self._candidates(now, 0, 8) if opens > now)
