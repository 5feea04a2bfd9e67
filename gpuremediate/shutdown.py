"""SIGTERM/SIGINT as a flag the main thread polls, so a shutdown request is always seen.

The handler only stores the signal number. It must not take a lock: a handler runs in the main thread
between two bytecodes, and ``Event.set()`` from it deadlocks when the signal lands while the main thread
holds that Event's condition lock (on its way in or out of ``Event.wait()``). The main thread instead
sleeps in short slices (``wait``); a sleep interrupted by a signal runs the handler and resumes, so a
request is seen within one slice.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

POLL_S = 0.2


class Shutdown:
    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self.signum: int | None = None
        self._requested = False  # also set from other threads (a lost lease); a plain bool needs no lock

    def install(self) -> Shutdown:
        """Handle SIGTERM and SIGINT from now on (main thread only, as the signal module requires)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum
        self._requested = True

    def request(self) -> None:
        self._requested = True

    @property
    def requested(self) -> bool:
        return self._requested

    def wait(self, timeout: float | None = None, until: threading.Event | None = None) -> bool:
        """Sleep in slices until shutdown is requested (True), ``until`` is set, or ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._requested and not (until is not None and until.is_set()):
            left = self.poll_s if deadline is None else min(self.poll_s, deadline - time.monotonic())
            if left <= 0:
                break
            time.sleep(left)
        return self._requested
