"""Pure drain gates (kured's): what must hold before a new drain starts, beyond the budget and the breaker.

- **Blocking alerts**: no drain starts while a named Prometheus alert fires (the alerts come from
  :mod:`gpuremediate.signals.alerts`; an unreadable alerts API blocks too: the safe side).
- **Blocking pods**: no drain of a node on which a pod matching one of the selectors runs (a job that
  must not be interrupted, a backup, ...).
- **Settle delay**: after one node returned to service (validated healthy), the next drain waits
  ``settle_s`` so the fleet can take load back before more capacity goes.

Each gate answers a reason string ("" when it lets the drain start), kept in the record's ``blocked``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from gpuremediate.policy.selector import Selector
from gpuremediate.vocab.record import OUTCOME_REPAIRED, HistoryEntry

BLOCKING_PODS = "blocking pods running"  # how blocking_pods' reason starts


def blocking_alerts(firing: Collection[str] | None, names: Collection[str], problem: str = "") -> str:
    """Why the alerts gate holds: one of ``names`` fires, or the alerts could not be read."""
    if not names:
        return ""
    if firing is None:
        return f"blocking alerts unknown ({problem or 'alerts not read'}): waiting"
    hits = sorted(set(firing) & set(names))
    return f"blocking alert firing: {', '.join(hits)}" if hits else ""


def blocking_pods(pods: Iterable[Mapping[str, Any]], selectors: Sequence[tuple[str, Selector]]) -> str:
    """Why the pods gate holds: running pods that match a blocking selector (``(text, parsed)``)."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        for text, selector in selectors:
            if selector.matches(labels):
                found.append(f"{meta.get('namespace', '')}/{meta.get('name', '')} ({text})")
                break
    return f"{BLOCKING_PODS}: {', '.join(sorted(found))}" if found else ""


def last_return(histories: Iterable[Sequence[HistoryEntry]]) -> float | None:
    """When a node last came back repaired, over every node's history."""
    times = [entry.at for history in histories for entry in history if entry.outcome == OUTCOME_REPAIRED]
    return max(times) if times else None


def settle_remaining(returned_at: float | None, now: float, settle_s: float) -> float:
    """Seconds still to wait after the last node returned (0 when settled or the gate is off)."""
    if settle_s <= 0 or returned_at is None:
        return 0.0
    return max(0.0, returned_at + settle_s - now)


def settle_reason(remaining: float, settle_s: float) -> str:
    return f"settling: a node returned less than {settle_s:g}s ago ({remaining:.0f}s left)" if remaining > 0 else ""
