"""The API server's clock, from the ``Date`` header of its responses (RFC 7231: whole seconds, stamped when
the response was made).

Each response bounds the server's epoch minus our monotonic clock from below: the server's time when we
read the response is at least its Date. The largest of those bounds is the estimate (its error is at most
the round trip plus the part of a second the Date truncated; after a few dozen responses, typically well
under a second). It is used once, to anchor the controller's clock (``gpuremediate.clock``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime


class ServerTime:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._offset: float | None = None
        self.samples = 0
        self._lock = threading.Lock()

    def note(self, date_header: str | None) -> None:
        """One response's Date (absent or unreadable: ignored)."""
        if not date_header:
            return
        try:
            server = parsedate_to_datetime(date_header).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return
        bound = server - self._monotonic()
        with self._lock:
            self.samples += 1
            if self._offset is None or bound > self._offset:
                self._offset = bound

    def offset(self) -> float | None:
        """The server's epoch minus our monotonic clock (None: no Date seen yet)."""
        with self._lock:
            return self._offset
