"""WorkQueue: a deduplicating, rate-limited queue of keys, with client-go workqueue semantics."""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

from gpuremediate.kube import errors

log = logging.getLogger(__name__)


class WorkQueue:
    """A key is queued at most once; a key being processed that is added again is handed out again only
    after done(key); add_rate_limited backs off per key exponentially until forget(key)."""

    def __init__(self, base_delay: float = 0.005, max_delay: float = 300.0) -> None:
        if base_delay <= 0 or max_delay < base_delay:
            raise ValueError(f"need 0 < base_delay <= max_delay, got {base_delay}, {max_delay}")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._queue: deque[Hashable] = deque()
        self._dirty: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._delayed: list[tuple[float, int, Hashable]] = []
        self._sequence = 0
        self._failures: dict[Hashable, int] = {}
        self._shutting_down = False
        self._cond = threading.Condition()

    def add(self, key: Hashable) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: Hashable) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: Hashable, seconds: float) -> None:
        if seconds <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutting_down:
                return
            self._sequence += 1
            heapq.heappush(self._delayed, (time.monotonic() + seconds, self._sequence, key))
            self._cond.notify_all()  # a getter may need to wake earlier than it planned

    def add_rate_limited(self, key: Hashable) -> None:
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        self.add_after(key, min(self.max_delay, self.base_delay * (2**failures)))

    def forget(self, key: Hashable) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def num_requeues(self, key: Hashable) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def get(self, timeout: float | None = None) -> Hashable | None:
        """The next key, blocking; None after shutdown() (once drained) or when `timeout` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._promote_due()
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if self._shutting_down:
                    return None
                wait = self._wait_time(deadline)
                if wait is not None and wait <= 0:
                    return None
                self._cond.wait(wait)

    def _wait_time(self, deadline: float | None) -> float | None:
        now = time.monotonic()
        waits = [] if deadline is None else [deadline - now]
        if self._delayed:
            waits.append(max(0.0005, self._delayed[0][0] - now))
        return min(waits) if waits else None

    def _promote_due(self) -> None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            self._add_locked(key)

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutting_down = True
            self._delayed.clear()
            self._cond.notify_all()

    @property
    def shutting_down(self) -> bool:
        with self._cond:
            return self._shutting_down

    def len(self) -> int:
        """Keys ready to be handed out (delayed keys not yet due are not counted)."""
        with self._cond:
            self._promote_due()
            return len(self._queue)

    def __len__(self) -> int:
        return self.len()


Reconcile = Callable[[str], "float | None"]

REPEAT_WINDOW_S = 60.0  # a failure with the same cause is logged once per this window, with how often it came


class FailureLog:
    """Reconcile failures said once per cause (worker and error text), not once per retry: a Jobs namespace deleted
    under the controller fails every node's step with the same 404 until it is back (36 lines in 15 s for one
    node before). A cause repeated past ``REPEAT_WINDOW_S`` is said again with its count and keys meanwhile."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], tuple[float, int, set[str]]] = {}  # cause -> (told at, count, keys)

    def failed(self, what: str, key: str, error: str) -> None:
        cause, now = (what, error), self.clock()
        with self._lock:
            told, count, keys = self._seen.get(cause, (-math.inf, 0, set()))
            if now - told < self.window_s:
                keys.add(key)
                self._seen[cause] = (told, count + 1, keys)
                return
            self._seen = {c: v for c, v in self._seen.items() if now - v[0] < self.window_s}
            self._seen[cause] = (now, 0, set())
        extra: dict[str, object] = {"worker": what, "key": key, "error": error}
        if count:
            extra.update(repeated=count, keys=len(keys))
        log.warning("reconcile failed; retrying", extra=extra)



def process_next(queue: WorkQueue, key: Hashable, reconcile: Reconcile, *, what: str,
                 on_api_error: Callable[[errors.KubeError], None] | None = None,
                 failures: FailureLog | None = None) -> None:
    """Run ``reconcile(key)`` the controller way: on success forget the key's backoff and requeue it after
    the seconds returned (None: not at all); on an API or transport error (or a crash) log it and requeue
    with per-key backoff. Nothing a reconcile raises stops the worker."""
    try:
        requeue = reconcile(str(key))
    except (errors.ApiError, errors.TransportError) as exc:
        if on_api_error is not None:
            on_api_error(exc)
        (failures or FailureLog()).failed(what, str(key), str(exc))
        queue.add_rate_limited(key)
    except Exception:
        log.exception("reconcile crashed; retrying", extra={"worker": what, "key": str(key)})
        queue.add_rate_limited(key)
    else:
        queue.forget(key)
        if requeue is not None:
            queue.add_after(key, requeue)
    finally:
        queue.done(key)


def run_worker(
    queue: WorkQueue,
    reconcile: Reconcile,
    stop: threading.Event,
    *,
    what: str,
    resync: Callable[[], None] | None = None,
    resync_s: float = 10.0,
    on_api_error: Callable[[errors.KubeError], None] | None = None,
) -> None:
    """A worker thread's loop: every ``resync_s`` call ``resync`` (which re-queues what may need a step;
    its errors are logged), hand each queued key to ``process_next``; until ``stop`` or queue shutdown."""
    next_resync = 0.0
    failures = FailureLog()  # this worker's: said once per cause
    while not stop.is_set():
        if resync is not None and time.monotonic() >= next_resync:
            try:
                resync()
            except Exception:
                log.exception("resync failed; the next one retries", extra={"worker": what})
            next_resync = time.monotonic() + resync_s
        wait = max(0.05, next_resync - time.monotonic()) if resync is not None else 0.5
        key = queue.get(timeout=wait)
        if key is None:
            if queue.shutting_down:
                return
            continue
        process_next(queue, key, reconcile, what=what, on_api_error=on_api_error, failures=failures)
