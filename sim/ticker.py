"""A simulator that does its work in ``tick()`` every ``tick_s`` on a thread of its own (NodeSim, the node owners):
API errors a tick meets are kept in ``errors`` for the test to show, never raised on the thread."""

from __future__ import annotations

import threading
from typing import Self

from gpuremediate.kube import errors


class Ticker:
    thread_name = "ticker"

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except (errors.ApiError, errors.TransportError) as exc:
                self.errors.append(str(exc))
