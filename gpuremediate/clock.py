"""The controller's clock: epoch seconds that never step.

Every timeout and age the controller measures (a repair Job's deadline, a drain's timeout, the thermal hold,
the breaker's window) is a difference of two readings of this clock, and many are kept in the node record
as epoch seconds. ``time.time()`` steps when NTP (or a person) sets the machine's clock: a step of +1 h times
out every running repair at once. So the clock is the monotonic clock (which never steps) plus an offset
fixed once: at first the machine's wall clock, then, when the controller starts acting, the API server's
(from the ``Date`` of its responses, ``kube.server_time``). Anchored to the server, every replica and every
successor reads the same time as the server's creationTimestamps, whatever its machine's clock says.

A step of the machine's clock afterwards changes nothing here; it is logged once with its size and
``offset_from_wall()`` (exported as ``gpuremediate_clock_offset_seconds``) shows how far the machine's clock
is from the controller's. A restart takes the server's time again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

STEP_S = 2.0  # the machine's clock moved this much against ours between two readings: a step, said once
OFF_SERVER_S = 5.0  # at anchoring, the machine's clock this far from the server's is said


class SteadyClock:
    """Callable like ``time.time``; monotonic once anchored."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 on_offset: Callable[[float], None] | None = None) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._offset = wall() - monotonic()
        self._seen_offset = 0.0  # wall minus us, as last said
        self._lock = threading.Lock()
        self.on_offset = on_offset
        self.anchored = ""  # "server" once anchored to the API server's time

    def __call__(self) -> float:
        now = self._monotonic() + self._offset
        self._watch_wall(now)
        return now

    def anchor(self, server_offset: float | None) -> None:
        """Take the API server's time (``server_offset``: server epoch minus our monotonic clock, or None when
        no response carried a Date yet: the machine's clock is kept). Called once, before the loops start."""
        if server_offset is None or self.anchored:
            return
        wall_off = self._wall() - (self._monotonic() + server_offset)
        with self._lock:
            self._offset = server_offset
            self._seen_offset = wall_off
            self.anchored = "server"
        if abs(wall_off) > OFF_SERVER_S:
            log.warning("this machine's clock is %+.1f s off the API server's: the controller keeps the server's "
                        "time", wall_off)
        if self.on_offset is not None:
            self.on_offset(wall_off)

    def offset_from_wall(self) -> float:
        """The machine's wall clock minus this clock (0 unless the machine's clock stepped or is off)."""
        return self._wall() - (self._monotonic() + self._offset)

    def _watch_wall(self, now: float) -> None:
        off = self._wall() - now
        with self._lock:
            moved = off - self._seen_offset
            if abs(moved) <= STEP_S:
                return
            self._seen_offset = off
        log.warning("the machine's clock stepped by %+.1f s: the controller's clock does not follow (timeouts and "
                    "ages are unaffected); it is now %+.1f s from the machine's", moved, off)
        if self.on_offset is not None:
            self.on_offset(off)
