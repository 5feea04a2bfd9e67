"""Events written off the detect loop's thread: a bounded queue that drops (and counts) instead of blocking.

Writing an Event is an API call at the client's rate limit; a storm of them (every node going unknown
when the metrics source fails) must never delay the next detect cycle. ``node_event`` only enqueues;
one worker thread writes. A full queue, or a rate-limited kind of Event over its budget, is dropped and
counted in ``gpuremediate_events_dropped_total``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

log = logging.getLogger(__name__)

COMPONENT = "gpuremediate"  # the source component of every Event we write

Write = Callable[[], None]


class NodeEvents(Protocol):
    def node_event(self, node: str, reason: str, message: str, type_: str = ..., uid: str = "") -> None: ...


class DropCounter(Protocol):
    def inc(self, amount: float = 1.0, **labels: str) -> None: ...


class TokenBucket:
    """``burst`` at once, then ``per_s`` a second."""

    def __init__(self, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s, self.burst, self.clock = per_s, burst, clock
        self.tokens = float(burst)
        self.last = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.per_s)
        self.last = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class EventQueue:
    """Wraps an EventRecorder: the same ``node_event`` call, answered at once, written by a worker."""

    def __init__(
        self,
        recorder: NodeEvents | None,
        dropped: DropCounter | None = None,
        *,
        maxsize: int = 1000,
        limited_per_s: float = 1.0,
        limited_burst: int = 20,
        priority: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        name: str = "event-writer",
    ) -> None:
        """``priority``: the context the worker writes in (``KubeClient.background``: after the actions)."""
        self.recorder = recorder
        self.dropped = dropped
        self.priority = priority
        self.name = name
        self._queue: queue.Queue[Write | None] = queue.Queue(maxsize=maxsize)
        self._limit = TokenBucket(limited_per_s, limited_burst)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._latest: dict[str, Write] = {}  # submit_latest: key -> the write queued for it, not yet run
        self._abandoned = False  # stop() ran out of time: what is left is dropped, not sent

    def node_event(self, node: str, reason: str, message: str, type_: str = "Normal", uid: str = "",
                   *, limited: bool = False) -> bool:
        """Queue an Event on a Node; False when it was dropped. ``limited``: subject to the rate budget."""
        recorder = self.recorder
        assert recorder is not None, "a queue without a recorder takes submit() only"
        return self.submit(lambda: recorder.node_event(node, reason, message, type_, uid), limited=limited)

    def submit_latest(self, key: str, write: Write) -> bool:
        """Queue ``write`` for ``key``, replacing one queued for it that has not run yet (it keeps its place):
        what only the latest of matters, such as a node's condition. False when the queue is full."""
        with self._lock:
            if key in self._latest:
                self._latest[key] = write
                return True
            self._latest[key] = write
        if self.submit(lambda: self._run_latest(key)):
            return True
        with self._lock:
            self._latest.pop(key, None)
        return False

    def _run_latest(self, key: str) -> None:
        with self._lock:
            write = self._latest.pop(key, None)
        if write is not None:
            write()

    def submit(self, write: Write, *, limited: bool = False) -> bool:
        if limited and not self._limit.take():
            self._drop("rate-limited")
            return False
        self._ensure_worker()
        try:
            self._queue.put_nowait(write)
        except queue.Full:
            self._drop("queue-full")
            return False
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued Event is written (tests, shutdown); False on timeout."""
        done = threading.Event()
        if not self.submit(done.set):
            return False
        return done.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued within ``timeout``; past it the rest is dropped (counted, said in one line): the
        controller's write fence refuses it once the leases are released, one warning a write, 1,000 of them
        after a burst."""
        thread = self._thread
        if thread is None:
            return
        deadline = time.monotonic() + timeout
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            self._abandoned = True
            log.warning("stopping: reports still queued are not written", extra={"queue": self.name,
                                                                                  "queued": self._queue.qsize()})

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                # Started before it is published: stop() (another thread, no lock) must never join an unstarted one.
                worker = threading.Thread(target=self._work, name=self.name, daemon=True)
                worker.start()
                self._thread = worker

    def _work(self) -> None:
        with self.priority():
            while (write := self._queue.get()) is not None:
                if self._abandoned:
                    self._drop("stopped")
                    continue
                try:
                    write()
                except Exception:  # the recorder logs API errors itself; anything else must not kill the writer
                    log.exception("event write failed")

    def _drop(self, why: str) -> None:
        if self.dropped is not None:
            self.dropped.inc(reason=why)
        log.debug("event dropped", extra={"why": why})


def own_pod() -> tuple[str, str] | None:
    """(namespace, name) of the controller's own Pod, from the downward API env; None outside a Pod."""
    name, namespace = os.environ.get("POD_NAME", ""), os.environ.get("POD_NAMESPACE", "")
    return (namespace, name) if name and namespace else None


def pod_event_body(namespace: str, pod: str, reason: str, message: str, type_: str, now: float) -> dict[str, Any]:
    """A core/v1 Event about the controller's own Pod (it lives in the Pod's namespace, as a Pod's must)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod}.{secrets.token_hex(8)}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod},
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": COMPONENT, "host": pod},
        "reportingComponent": COMPONENT,
        "reportingInstance": pod,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
