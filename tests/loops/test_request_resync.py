"""A resync asked for from another thread (the shard Leases' on a change) runs on the loop's own thread."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from gpuremediate.loops.base import NodeLoop
from sim.waiting import wait_for


class Recording(NodeLoop):
    name = "recording"

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.resynced_on: list[str] = []

    def resync(self) -> None:
        self.resynced_on.append(threading.current_thread().name)


def test_a_requested_resync_runs_on_the_loop_s_thread_not_the_caller_s() -> None:
    stop = threading.Event()
    ctx = SimpleNamespace(stop=stop, settings=SimpleNamespace(resync_s=3600.0, loop_workers=1),
                          metrics=SimpleNamespace(count_api_error=lambda exc: None), owns=lambda name: True)
    loop = Recording(ctx)
    loop.start()
    try:
        wait_for(lambda: len(loop.resynced_on) == 1, 5, "the loop's first resync")
        caller = threading.Thread(target=loop.request_resync, name="shard-leases")
        caller.start()
        caller.join()
        wait_for(lambda: len(loop.resynced_on) == 2, 5, "the requested resync")
        assert loop.resynced_on == ["loop-recording", "loop-recording"]
    finally:
        stop.set()
        loop.stop()
