"""Waiting for a condition, for tests, scenarios and the demo: one poll loop with a clear failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from gpuremediate.kube import errors

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not come true in time; says what was awaited and what was seen last."""


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    describe: str = "a condition",
    *,
    seen: Callable[[], object] | None = None,
    interval: float = 0.05,
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); else raise WaitTimeout naming what
    was awaited and what was seen last (``seen()`` if given, else the predicate's last value or error).
    API and connection errors while polling count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except (errors.KubeError, OSError, KeyError) as exc:
            last = exc
        else:
            last = value
            if value:
                return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    observed = seen() if seen is not None else last
    raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {describe}; last seen: {observed!r}")
