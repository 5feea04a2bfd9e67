"""Reports of actions after the actions (issue 27): Events and the GPURemediation condition are written by one
worker at background priority on the controller's one rate limit, so a burst of cordons is not paced by its
own reports; a node's condition is written once for its latest record; the view keeps the version the
deferred status patch made until the informer shows a newer one."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpuremediate.actions.nodes import NodeView
from gpuremediate.kube.transport import RateLimiter
from gpuremediate.obs.event_queue import EventQueue
from sim.waiting import wait_for


def test_a_background_request_waits_while_a_foreground_one_waits() -> None:
    limiter = RateLimiter(qps=2, burst=1)  # a token every 0.5 s: room for a loaded machine's thread starts
    limiter.acquire()  # the bucket is empty
    order: list[str] = []
    lock = threading.Lock()

    def request(kind: str) -> None:
        limiter.acquire(background=kind == "background")
        with lock:
            order.append(kind)

    threads = [threading.Thread(target=request, args=("background",))]
    threads[0].start()  # asks first
    threads += [threading.Thread(target=request, args=("foreground",)) for _ in range(3)]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == ["foreground"] * 3 + ["background"]


def test_a_background_request_goes_when_nothing_else_waits() -> None:
    limiter = RateLimiter(qps=100, burst=5)
    began = time.monotonic()
    for _ in range(5):
        limiter.acquire(background=True)
    assert time.monotonic() - began < 1.0, "the saved-up burst serves background requests at once"


def test_only_the_latest_write_for_a_key_runs_and_keeps_its_place() -> None:
    gate = threading.Event()
    ran: list[str] = []
    lane = EventQueue(None, name="test-lane")
    try:
        assert lane.submit(lambda: gate.wait(10))  # holds the worker while the rest is queued
        assert lane.submit_latest("condition/a", lambda: ran.append("a1"))
        assert lane.submit(lambda: ran.append("event"))
        assert lane.submit_latest("condition/a", lambda: ran.append("a2"))
        assert lane.submit_latest("condition/b", lambda: ran.append("b1"))
        gate.set()
        assert lane.flush(10)
        assert ran == ["a2", "event", "b1"]
        assert lane.submit_latest("condition/a", lambda: ran.append("a3")) and lane.flush(10)
        assert ran[-1] == "a3", "a key is taken again once its write ran"
    finally:
        lane.stop()


def test_the_lane_writes_at_the_priority_it_was_given() -> None:
    inside: list[bool] = []
    flag = threading.local()

    class Priority:
        def __enter__(self) -> None:
            flag.on = True

        def __exit__(self, *_: Any) -> None:
            flag.on = False

    lane = EventQueue(None, priority=Priority, name="test-lane")
    try:
        lane.submit(lambda: inside.append(getattr(flag, "on", False)))
        assert lane.flush(10) and inside == [True]
    finally:
        lane.stop()


class Informer:
    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node

    def get(self, name: str) -> dict[str, Any] | None:
        return self.node

    def list(self) -> list[dict[str, Any]]:
        return [self.node]


def _node(rv: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "resourceVersion": rv, **extra}}


def test_the_view_keeps_the_version_of_a_deferred_status_patch_over_our_own_write() -> None:
    informer = Informer(_node("1"))
    view = NodeView(informer, node_filter=lambda _: True)  # type: ignore[arg-type]
    view.remember_write("1", _node("2"))  # our record patch; the informer still shows 1
    seen = view.get("n1")
    assert seen is not None and seen["metadata"]["resourceVersion"] == "2"
    view.replace_written("2", _node("3"))  # the deferred condition patch over it
    got = view.get("n1")
    assert got is not None and got["metadata"]["resourceVersion"] == "3", "informer at 1: ours (3) is the truth"
    informer.node = _node("3")
    got = view.get("n1")
    assert got is not None and got["metadata"]["resourceVersion"] == "3"
    informer.node = _node("4")
    got = view.get("n1")
    assert got is not None and got["metadata"]["resourceVersion"] == "4", "the informer moved on: it is the truth"


def test_the_view_takes_a_status_patch_over_a_node_it_had_from_the_informer() -> None:
    informer = Informer(_node("5"))
    view = NodeView(informer, node_filter=lambda _: True)  # type: ignore[arg-type]
    view.replace_written("5", _node("6"))
    got = view.get("n1")
    assert got is not None and got["metadata"]["resourceVersion"] == "6"


def test_reports_left_when_the_stop_bound_runs_out_are_dropped_and_counted_not_sent() -> None:
    """Past its stop bound the lane sends nothing more: the leases are released next, and each write the fence
    then refused was a warning of its own (about 1,100 at a sharded replica's SIGTERM after a burst)."""
    drops: list[str] = []

    class Counter:
        def inc(self, amount: float = 1.0, **labels: str) -> None:
            drops.append(labels["reason"])

    lane = EventQueue(None, Counter(), name="test-lane")
    sent: list[int] = []
    release, started = threading.Event(), threading.Event()
    lane.submit(lambda: started.set() or release.wait(5))  # a write in flight, slower than the bound
    assert started.wait(5)  # taken by the worker before the stop (a loaded machine may start it late)
    for index in range(50):
        lane.submit(lambda index=index: sent.append(index))  # type: ignore[misc]
    lane.stop(timeout=0.2)
    release.set()
    wait_for(lambda: len(drops) == 50, 5, "the queued reports to be dropped")
    assert sent == [] and set(drops) == {"stopped"}
