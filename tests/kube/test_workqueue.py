from __future__ import annotations

import threading
import time

import pytest

from gpuremediate.kube.workqueue import FailureLog, WorkQueue


def test_duplicate_keys_are_queued_once() -> None:
    q = WorkQueue()
    for key in ("a", "b", "a", "a"):
        q.add(key)
    assert q.len() == 2
    assert [q.get(0), q.get(0), q.get(0)] == ["a", "b", None]


def test_key_added_while_processing_comes_back_after_done() -> None:
    q = WorkQueue()
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")
    assert q.get(0) is None  # not handed out twice at once
    q.done("a")
    assert q.get(0) == "a"
    q.done("a")
    assert q.get(0) is None


def test_add_after_delays_the_key() -> None:
    q = WorkQueue()
    start = time.monotonic()
    q.add_after("x", 0.1)
    assert q.len() == 0
    assert q.get(timeout=1.0) == "x"
    assert time.monotonic() - start >= 0.09


def test_add_rate_limited_backs_off_exponentially_until_forget() -> None:
    q = WorkQueue(base_delay=0.02, max_delay=0.05)
    delays = []
    for _ in range(3):
        start = time.monotonic()
        q.add_rate_limited("k")
        assert q.get(timeout=1.0) == "k"
        q.done("k")
        delays.append(time.monotonic() - start)
    assert q.num_requeues("k") == 3
    assert delays[0] >= 0.018 and delays[1] >= 0.038 and delays[2] >= 0.048  # 0.02, 0.04, capped 0.05
    q.forget("k")
    assert q.num_requeues("k") == 0


def test_shutdown_unblocks_a_waiting_get() -> None:
    q = WorkQueue()
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(q.get()))
    worker.start()
    time.sleep(0.05)
    q.shutdown()
    worker.join(2)
    assert not worker.is_alive() and got == [None]
    q.add("late")
    assert q.len() == 0


def test_shutdown_drains_queued_keys_first() -> None:
    q = WorkQueue()
    q.add("a")
    q.shutdown()
    assert q.get() == "a"
    assert q.get() is None


def test_get_timeout_returns_none() -> None:
    assert WorkQueue().get(timeout=0.02) is None


def test_bad_delays_rejected() -> None:
    with pytest.raises(ValueError, match="base_delay"):
        WorkQueue(base_delay=0)


def test_process_next_requeues_by_outcome() -> None:
    from gpuremediate.kube import errors
    from gpuremediate.kube.workqueue import process_next

    q = WorkQueue(base_delay=0.01, max_delay=0.05)
    seen: list[str] = []

    def fail_api(key: str) -> float | None:
        raise errors.Conflict(409, {"reason": "Conflict", "message": "stale"})

    def crash(key: str) -> float | None:
        raise RuntimeError("boom")

    for reconcile in (fail_api, crash):
        q.add("a")
        key = q.get(timeout=1)
        process_next(q, key, reconcile, what="test", on_api_error=lambda exc: seen.append(type(exc).__name__))
        assert q.get(timeout=1) == "a"  # retried with backoff, never dropped
        q.done("a")
    assert seen == ["Conflict"] and q.num_requeues("a") == 2

    q.add("a")
    key = q.get(timeout=1)
    process_next(q, key, lambda k: None, what="test")
    assert q.num_requeues("a") == 0 and q.get(timeout=0.1) is None  # success: forgotten, not requeued
    q.add("b")
    key = q.get(timeout=1)
    process_next(q, key, lambda k: 0.05, what="test")
    assert q.get(timeout=1) == "b"  # requeued after the seconds the reconcile asked for


def test_run_worker_resyncs_processes_and_survives_a_failing_resync() -> None:
    import threading
    import time as _time

    from gpuremediate.kube.workqueue import run_worker

    q = WorkQueue(base_delay=0.01, max_delay=0.05)
    stop = threading.Event()
    resyncs: list[float] = []
    done: list[str] = []

    def resync() -> None:
        resyncs.append(_time.monotonic())
        q.add("k")
        if len(resyncs) == 1:
            raise RuntimeError("the first resync fails")

    worker = threading.Thread(target=run_worker, args=(q, lambda key: done.append(key), stop),
                              kwargs={"what": "test", "resync": resync, "resync_s": 0.05})
    worker.start()
    deadline = _time.monotonic() + 5
    while len(resyncs) < 3 and _time.monotonic() < deadline:
        _time.sleep(0.01)
    stop.set()
    worker.join(2)
    assert not worker.is_alive(), "the worker did not stop"
    assert len(resyncs) >= 3, "resync is called again after it failed"
    assert "k" in done


def test_a_failure_is_said_once_per_cause_and_again_with_its_count(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 41: a Jobs namespace deleted under the controller failed each retry with the same 404, one warning
    line each (36 in 15 s for one node). One line per cause and window; the next window's line says how often and on
    how many keys it came meanwhile; another cause is said at once."""
    now = [0.0]
    failures = FailureLog(window_s=60.0, clock=lambda: now[0])
    gone = '404 NotFound: namespaces "gpuremediate-jobs" not found'
    with caplog.at_level("WARNING", logger="gpuremediate.kube.workqueue"):
        for second in range(30):
            now[0] = float(second)
            failures.failed("remediate", f"gpu-node-{second % 3}", gone)
        failures.failed("remediate", "gpu-node-1", "500 InternalError: etcd leader changed")
        now[0] = 61.0
        failures.failed("remediate", "gpu-node-1", gone)
    lines = [r for r in caplog.records if r.getMessage() == "reconcile failed; retrying"]
    assert [r.error for r in lines] == [gone, "500 InternalError: etcd leader changed", gone]  # type: ignore[attr-defined]
    assert lines[2].repeated == 29 and lines[2].keys == 3  # type: ignore[attr-defined]
