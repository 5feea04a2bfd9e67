"""Failing trends (issue 29, part 2): error counters climbing before a GPU fails, in a bounded state per GPU.

A counter's increase over a window comes from a ring of ``BUCKETS`` increments (each a ``window / BUCKETS``
slice of time), never from a list of samples: a GPU holds three small rings whatever the fleet's history.
A counter that goes down (a driver reload) is a new base, never an increase.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuremediate.signals.model import plausible_count
from gpuremediate.vocab.degradation import DegradationPolicy

SBE_TOTAL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
REMAPPED_ROWS = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
RETIRED_PENDING = "DCGM_FI_DEV_RETIRED_PENDING"
CODE_SBE, CODE_ROWS, CODE_PENDING = "sbe-rate", "remapped-rows", "retired-pending"
BUCKETS = 12


class Window:
    """A counter's increase over the last ``window_s``, in BUCKETS slices."""

    __slots__ = ("at", "since", "slices", "sum", "total")

    def __init__(self, total: float, now: float) -> None:
        self.total = total
        self.slices = [0.0] * BUCKETS
        self.at = 0  # the index (time // slice) of the newest slice
        self.since = now  # first seen: the window is whole once window_s has passed since
        self.sum = 0.0  # of the slices

    def step(self, total: float, now: float, window_s: float) -> float:
        """Take the counter's total now; its increase over the window."""
        index = int(now // (window_s / BUCKETS))
        if index > self.at:
            for skipped in range(self.at + 1, min(index, self.at + BUCKETS) + 1):
                self.sum -= self.slices[skipped % BUCKETS]
                self.slices[skipped % BUCKETS] = 0.0
            self.at = index
        if total > self.total:
            self.slices[self.at % BUCKETS] += total - self.total
            self.sum += total - self.total
        self.total = total
        return self.sum


class Trends:
    """One GPU's trend windows, and which trends it shows now (code → since when)."""

    __slots__ = ("found", "pending", "rows", "sbe")

    def __init__(self) -> None:
        self.sbe: Window | None = None
        self.rows: Window | None = None
        self.pending = 0.0
        self.found: dict[str, float] = {}

    def step(self, extra: Mapping[str, float], policy: DegradationPolicy, now: float) -> None:
        sbe = plausible_count(extra.get(SBE_TOTAL))
        if sbe is not None:
            self.sbe = self._rise(self.sbe, sbe, now, policy.sbe_window_s, policy.sbe_min, CODE_SBE)
        rows = plausible_count(extra.get(REMAPPED_ROWS))
        if rows is not None:
            self.rows = self._rise(self.rows, rows, now, policy.rows_window_s, policy.rows_new_min, CODE_ROWS)
        pending = plausible_count(extra.get(RETIRED_PENDING))
        if pending is not None:
            self.pending = pending
            self._mark(CODE_PENDING, pending > 0, now)

    def _rise(self, window: Window | None, total: float, now: float, window_s: float, minimum: int,
              code: str) -> Window:
        if window is None:
            return Window(total, now)
        increase = window.step(total, now, window_s)
        self._mark(code, bool(minimum) and increase >= minimum, now)
        return window

    def _mark(self, code: str, shows: bool, now: float) -> None:
        if shows == (code in self.found):
            return
        if shows:
            self.found[code] = now
        else:
            del self.found[code]

    def whole(self, policy: DegradationPolicy, now: float) -> bool:
        """Every window it has read has been watched for its whole length (after a restart, not at once)."""
        return all(w is None or now - w.since >= span for w, span in ((self.sbe, policy.sbe_window_s),
                                                                     (self.rows, policy.rows_window_s)))
