"""What a dry run would have done, where the CLI can read it: ConfigMap ``gpuremediate-dry-run`` in the
controller's namespace. A dry run writes no Node, so without it ``status``, ``explain`` and ``breaker status``
showed a quiet fleet while the controller had decided to drain half of it (docs/operations.md, "First
rollout: dry-run").

The controller keeps, in memory, the record it would have written on each node, the breaker it would have,
and its last decisions in order (each transition); a thread writes them to the ConfigMap at most every
``every_s`` when they changed, in one update (a resourceVersion-guarded replace; a 409 re-reads). It stays
bounded: records of nodes it would leave healthy (nothing waited for, no GPU watched) are dropped, the
decisions are the last DECISIONS_KEPT, and past MAX_BYTES the oldest records go first (the ConfigMap says
how many were left out). ``updated`` is the heartbeat the CLI judges it by: a journal not updated for STALE_S
belongs to a dry run that was killed; one that stopped says so (``ended``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CONFIGMAPS
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, RecordError, decode, encode

log = logging.getLogger(__name__)

JOURNAL_CONFIGMAP = "gpuremediate-dry-run"
DECISIONS_KEPT = 200
MAX_BYTES = 800 * 1024  # of a ConfigMap's 1 MiB
STALE_S = 120.0  # the controller rewrites the heartbeat at least this often while it runs (HEARTBEAT_S)
HEARTBEAT_S = 30.0


@dataclass(frozen=True)
class Decision:
    """One would-be transition, in the order the dry run decided it."""

    at: float
    node: str
    from_state: str
    to_state: str
    reason: str
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "node": self.node, "from": self.from_state, "to": self.to_state,
                "reason": self.reason, "message": self.message[:300]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return cls(float(data["at"]), str(data["node"]), str(data["from"]), str(data["to"]), str(data["reason"]),
                   str(data.get("message", "")))


@dataclass
class Journal:
    """The journal as written (and as the CLI reads it back)."""

    identity: str = ""
    started: float = 0.0
    updated: float = 0.0
    records: dict[str, NodeRecord] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    breaker: dict[str, Any] = field(default_factory=dict)
    left_out: int = 0
    ended: bool = False  # the dry run stopped (its last write says so; a killed one goes stale instead)

    def live(self, now: float) -> bool:
        return not self.ended and now - self.updated < STALE_S

    def to_data(self) -> dict[str, str]:
        records = sorted(self.records.items(), key=lambda item: -item[1].since)  # newest first: kept first
        kept: dict[str, str] = {}
        size, left_out = 0, 0
        for name, record in records:
            text = encode(record)
            if size + len(text) > MAX_BYTES:
                left_out += 1
                continue
            kept[name] = text
            size += len(text) + len(name)
        return {"identity": self.identity, "started": repr(self.started), "updated": repr(self.updated),
                "records": json.dumps(kept, sort_keys=True),
                "decisions": json.dumps([d.to_dict() for d in self.decisions[-DECISIONS_KEPT:]]),
                "breaker": json.dumps(self.breaker, sort_keys=True), "left_out": str(left_out + self.left_out),
                "ended": "true" if self.ended else "false"}

    @classmethod
    def from_data(cls, data: Mapping[str, str]) -> Journal:
        """Raises ValueError naming what is unreadable."""
        try:
            records: dict[str, NodeRecord] = {}
            for name, text in json.loads(data.get("records") or "{}").items():
                try:
                    records[str(name)] = decode(text)
                except RecordError:
                    continue  # one unreadable would-be record costs that node's line, not the journal
            return cls(identity=data.get("identity", ""), started=float(data.get("started") or 0),
                       updated=float(data.get("updated") or 0), records=records,
                       decisions=[Decision.from_dict(d) for d in json.loads(data.get("decisions") or "[]")],
                       breaker=dict(json.loads(data.get("breaker") or "{}")),
                       left_out=int(data.get("left_out") or 0), ended=data.get("ended") == "true")
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"ConfigMap {JOURNAL_CONFIGMAP} unreadable: {exc}") from exc


def read_journal(client: KubeClient, namespace: str) -> Journal | None:
    """The dry run's journal, or None when there is none (the controller acts, or never ran in dry-run)."""
    try:
        cm = client.get(CONFIGMAPS, JOURNAL_CONFIGMAP, namespace)
    except errors.NotFound:
        return None
    return Journal.from_data(cm.get("data") or {})


class DryRunJournal:
    """Kept by the dry-running controller; ``start()`` the writer thread, ``stop()`` writes a last time."""

    def __init__(self, client: KubeClient, namespace: str, identity: str, clock: Callable[[], float] = time.time,
                 every_s: float = 2.0) -> None:
        self.client, self.namespace, self.clock, self.every_s = client, namespace, clock, every_s
        self.journal = Journal(identity=identity, started=clock())
        self._lock = threading.Lock()
        self._dirty = True
        self._rv = ""
        self._written_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def note_record(self, node: str, record: NodeRecord) -> None:
        with self._lock:
            if record.state == states.HEALTHY and record.blocked is None and not record.thermal_hold_ends:
                changed = self.journal.records.pop(node, None) is not None
            else:
                changed = self.journal.records.get(node) != record
                self.journal.records[node] = record
            self._dirty |= changed

    def note_transition(self, node: str, from_state: str, to_state: str, reason: str, message: str) -> None:
        with self._lock:
            self.journal.decisions.append(Decision(self.clock(), node, from_state, to_state, reason, message))
            del self.journal.decisions[:-DECISIONS_KEPT]
            self._dirty = True

    def note_breaker(self, state: Mapping[str, Any]) -> None:
        with self._lock:
            if self.journal.breaker != state:
                self.journal.breaker = dict(state)
                self._dirty = True

    def start(self) -> DryRunJournal:
        self._thread = threading.Thread(target=self._run, name="dry-run-journal", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        self.flush()  # at once: `status` says the controller runs in dry-run from its start, not every_s later
        while not self._stop.wait(self.every_s):
            self.flush()
        with self._lock:
            self.journal.ended = self._dirty = True
        self.flush()  # the CLI shows it no more

    def flush(self) -> None:
        """Write the journal if it changed (or its heartbeat is due); a failure is logged and retried."""
        now = self.clock()
        with self._lock:
            if not self._dirty and now - self._written_at < HEARTBEAT_S:
                return
            self.journal.updated = now
            data = self.journal.to_data()
            self._dirty = False
        try:
            self._write(data)
            self._written_at = now
        except (errors.ApiError, errors.TransportError) as exc:
            with self._lock:
                self._dirty = True
            log.warning("cannot write the dry-run journal ConfigMap", extra={"error": str(exc)})

    def _write(self, data: dict[str, str]) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": JOURNAL_CONFIGMAP, "namespace": self.namespace,
                                             "labels": {"app.kubernetes.io/name": "gpuremediate"}},
                                "data": data}
        if not self._rv:
            try:
                self._rv = self._rv_of(self.client.create(CONFIGMAPS, body, self.namespace))
                return
            except errors.AlreadyExists:  # an earlier dry run's: ours replaces it
                self._rv = self._rv_of(self.client.get(CONFIGMAPS, JOURNAL_CONFIGMAP, self.namespace))
        body["metadata"]["resourceVersion"] = self._rv
        try:
            self._rv = self._rv_of(self.client.replace(CONFIGMAPS, JOURNAL_CONFIGMAP, body, self.namespace))
        except (errors.Conflict, errors.NotFound):
            self._rv = ""  # someone changed or deleted it: the next flush starts again from what is there
            raise

    @staticmethod
    def _rv_of(cm: Mapping[str, Any]) -> str:
        return str((cm.get("metadata") or {}).get("resourceVersion", ""))
