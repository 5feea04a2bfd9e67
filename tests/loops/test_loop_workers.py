"""``--loop-workers``: a node loop steps several nodes at once (a slow API server's calls overlap instead of every
node waiting for all the others, issue 41), never one node by two workers at once."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from gpuremediate.loops.base import NodeLoop
from sim.waiting import wait_for


class _Recording(NodeLoop):
    """Each step of a node holds for a while and notes who else is stepping meanwhile."""

    name = "recording"

    def __init__(self, ctx: Any, hold_s: float) -> None:
        super().__init__(ctx)
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.stepping: list[str] = []
        self.most_at_once = 0
        self.same_node_at_once: list[str] = []
        self.steps: list[str] = []

    def reconcile_name(self, name: str) -> float | None:
        with self.lock:
            if name in self.stepping:
                self.same_node_at_once.append(name)
            self.stepping.append(name)
            self.most_at_once = max(self.most_at_once, len(self.stepping))
        time.sleep(self.hold_s)
        with self.lock:
            self.stepping.remove(name)
            self.steps.append(name)
        return None


def _ctx(workers: int) -> Any:
    return SimpleNamespace(settings=SimpleNamespace(loop_workers=workers, resync_s=60.0), stop=threading.Event(),
                           metrics=SimpleNamespace(count_api_error=lambda _error: None),
                           owned_gpu_nodes=list, owns=lambda _name: True)


def test_several_nodes_are_stepped_at_once_and_a_node_by_one_worker_at_a_time() -> None:
    loop = _Recording(_ctx(workers=4), hold_s=0.3)
    loop.start()
    try:
        for name in ("a", "b", "c", "d"):
            loop.queue.add(name)
        for _ in range(5):  # "a" asked for again and again while it is being stepped
            loop.queue.add("a")
            time.sleep(0.05)
        wait_for(lambda: len(loop.steps) >= 5, 10, "the steps")
    finally:
        loop.ctx.stop.set()
        loop.stop()
    assert loop.most_at_once == 4, loop.most_at_once
    assert loop.same_node_at_once == []
    assert loop.steps.count("a") == 2  # its step, then one more for every add while it ran (deduplicated)


def test_one_worker_steps_one_node_at_a_time() -> None:
    loop = _Recording(_ctx(workers=1), hold_s=0.1)
    loop.start()
    try:
        for name in ("a", "b", "c"):
            loop.queue.add(name)
        wait_for(lambda: len(loop.steps) == 3, 10, "the steps")
    finally:
        loop.ctx.stop.set()
        loop.stop()
    assert loop.most_at_once == 1
