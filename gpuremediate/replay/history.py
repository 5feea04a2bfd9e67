"""A fleet's GPU metrics over time, as change points: per node, the readings from a time on.

A month of 200 nodes scraped every 30 s is 17 million node scrapes, nearly all identical to the one
before. The history keeps only the changes; the engine visits a healthy, quiet node only when its
readings change. Two inputs fill it: a folder of saved scrapes (this module) and a Prometheus range
query (``replay.prometheus``).

Saved scrapes folder layout (timestamps are unix seconds or RFC 3339, e.g. ``2026-11-01T00:00:00Z``):

- ``<folder>/<node>/<ts>.prom`` (or ``.txt``, ``.om``): one dcgm-exporter scrape of that node;
- ``<folder>/<node>/<ts>.unknown``: the node's exporter could not be read from ``ts`` on (the file's
  text is the reason);
- ``<folder>/<ts>.prom``: a scrape of the whole fleet (series carry a node label, as in a Prometheus
  federation dump); a node seen before but absent from it is unknown from ``ts`` on.

A scrape holds until the node's next file: write one when something changes, not every interval.

Failed pods (the workload signal's input, ``[workload]``): ``<folder>/pods.jsonl`` (or ``--pods FILE`` for any
history), one Pod object a line as the API server serves it (``kubectl get pods -A --field-selector
status.phase=Failed -o json | jq -c '.items[]'``), or ``pods.json``, a PodList. Each is reduced at once by the
signal's own ``reduce`` and dated as the controller dates it (its status' times, or its creation): the replay feeds
it to the signal at that time (one before the range at the start, as a controller's first list would; one after
the end never).
Node conditions (the agent's, such as ``GPUNetworkHealthy``, issue 45): ``<folder>/conditions.jsonl`` (or
``--conditions FILE``), one change a line, ``{"time": ..., "node": ..., "type": ..., "status": "True"|"False"|
"Unknown", "reason": ..., "message": ...}`` (from the Node's ``status.conditions`` history or the agent's Events).
Each holds on its Node from its time (one before the range at the start; one after the end never) until the next
line of its node and type, kept fresh (``lastHeartbeatTime``) as a running agent keeps it.
node_exporter's InfiniBand series (``[network] prometheus``, issue 45): ``<folder>/node_exporter/`` laid out as the
dcgm-exporter scrapes are: ``node_exporter/<node>/<ts>.prom`` one node_exporter scrape of that node (only its
``node_infiniband_*`` series are read), ``node_exporter/<node>/<ts>.unknown`` its node_exporter unreadable from
``ts`` on, ``node_exporter/<ts>.prom`` a fleet-wide dump (each series placed as the Prometheus source places it: a
node label, else ``instance`` less its port). A scrape holds until the node's next file. ``node_exporter`` cannot
be a node's name (an underscore is not allowed in one).
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuremediate.policy.network import DEFAULT_ERROR_COUNTERS, LINK_DOWNED
from gpuremediate.signals import dcgm, prom_nic
from gpuremediate.signals.exposition import ParseError, ParseResult, Sample, parse
from gpuremediate.signals.model import SOURCE_UNKNOWN, NodeReadings
from gpuremediate.signals.nic import NetworkReadings
from gpuremediate.signals.workload import Failure, failure_of, reduce

SCRAPE_SUFFIXES = (".prom", ".txt", ".om")
UNKNOWN_SUFFIX = ".unknown"
PODS_FILES = ("pods.jsonl", "pods.json")  # a saved-scrapes folder's failed pods (module docstring)
SOURCE = "replay"
CONDITIONS_FILE = "conditions.jsonl"  # a saved-scrapes folder's Node conditions (module docstring)
CONDITION_STATUSES = ("True", "False", "Unknown")
NODE_EXPORTER_DIR = "node_exporter"  # a saved-scrapes folder's node_exporter scrapes (module docstring)
DEFAULT_NIC_COUNTERS = (LINK_DOWNED, *DEFAULT_ERROR_COUNTERS)  # read when no policy names any
_NODE_KEY = "__replay_node__"  # a per-node scrape's series are placed on its folder's node by this label


class HistoryError(ValueError):
    """Input that cannot become a history; the message names the file or value."""


@dataclass(frozen=True)
class Change:
    """From ``at`` on, the node reads ``readings`` (status ``unknown`` when its metrics were unreadable)."""

    at: float
    readings: NodeReadings


@dataclass(frozen=True)
class FailedPod:
    """A Failed pod as the workload signal's watch keeps it (``signals.workload.reduce``), fed at ``at``."""

    at: float  # when it failed (its GPU failure's time; the history's start for one naming no GPU)
    reduced: Mapping[str, Any]

    @property
    def failure(self) -> Failure | None:
        """Its GPU failure as the signal counts it (None when it names no GPU: the signal does not count it)."""
        return failure_of(self.reduced)

    @property
    def node(self) -> str:
        """The node its GPU failure names ("" when none)."""
        failure = self.failure
        return failure.node if failure is not None else ""


@dataclass(frozen=True)
class ConditionChange:
    """From ``at`` on, ``node`` carries ``condition`` (type, status, reason, message) until the next of its type."""

    at: float
    node: str
    condition: Mapping[str, str]


@dataclass
class History:
    start: float
    end: float
    changes: dict[str, list[Change]] = field(default_factory=dict)  # node -> changes, oldest first
    pods: list[FailedPod] = field(default_factory=list)  # failed pods, by time (``add_pods``)
    conditions: list[ConditionChange] = field(default_factory=list)  # by time (``add_conditions``)
    # node -> (from, node_exporter's InfiniBand readings or None: nothing read), oldest first (``add_network``)
    network: dict[str, list[tuple[float, NetworkReadings | None]]] = field(default_factory=dict)

    def add(self, node: str, at: float, readings: NodeReadings) -> None:
        """Append a change (in time order per node); a repeat of the current readings is dropped."""
        readings = dataclasses.replace(readings, node=node, observed_at=0.0)
        changes = self.changes.setdefault(node, [])
        if changes and changes[-1].readings == readings:
            return
        if changes and at < changes[-1].at:
            raise HistoryError(f"node {node}: change at {at} is older than the one at {changes[-1].at}")
        if changes and at == changes[-1].at:
            changes[-1] = Change(at, readings)
            return
        changes.append(Change(at, readings))

    def add_network(self, node: str, at: float, readings: NetworkReadings | None) -> None:
        """From ``at`` on, the node's NIC readings from node_exporter (None: none read, its findings stay as they
        were); in time order per node, a repeat dropped."""
        changes = self.network.setdefault(node, [])
        if changes and changes[-1][1] == readings:
            return
        if changes and at < changes[-1][0]:
            raise HistoryError(f"node {node}: NIC readings at {at} are older than those at {changes[-1][0]}")
        if changes and at == changes[-1][0]:
            changes.pop()
        changes.append((at, readings))

    @property
    def nodes(self) -> list[str]:
        return sorted(self.changes)

    def gpus_seen(self, node: str) -> int:
        return max((len({g.gpu for g in c.readings.gpus}) for c in self.changes.get(node, [])), default=0)

    def change_count(self) -> int:
        return sum(len(c) for c in self.changes.values())

    def add_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Failed Pod objects: each reduced as the watch reduces it, dated by its failure (the range's start at the
        earliest: the controller's first list sees the older ones then); one failing after the end is dropped."""
        for pod in pods:
            reduced = reduce(pod)
            failure = failure_of(reduced)
            at = max(self.start, failure.at) if failure is not None else self.start
            if at <= self.end:
                self.pods.append(FailedPod(at, reduced))
        self.pods.sort(key=lambda p: p.at)


    def add_conditions(self, changes: Iterable[ConditionChange]) -> None:
        """Condition changes, each from its time (the range's start at the earliest); one after the end is
        dropped."""
        for change in changes:
            if change.at <= self.end:
                self.conditions.append(dataclasses.replace(change, at=max(self.start, change.at)))
        self.conditions.sort(key=lambda c: c.at)


def unknown_readings(node: str, reason: str) -> NodeReadings:
    return NodeReadings(node=node, source=SOURCE, status=SOURCE_UNKNOWN, reason=reason)


class Cursor:
    """Walks a history forward in time: which nodes changed, and what each node reads now."""

    def __init__(self, history: History) -> None:
        self.history = history
        self._events = sorted((c.at, node, i) for node, cs in history.changes.items() for i, c in enumerate(cs))
        self._times = [e[0] for e in self._events]
        self._next = 0
        self._current: dict[str, NodeReadings] = {}

    def advance(self, now: float) -> set[str]:
        """Apply every change at or before ``now``; the nodes whose readings changed."""
        changed = set()
        while self._next < len(self._events) and self._events[self._next][0] <= now:
            _, node, index = self._events[self._next]
            self._current[node] = self.history.changes[node][index].readings
            changed.add(node)
            self._next += 1
        return changed

    def readings(self, node: str) -> NodeReadings | None:
        """The node's readings now; None before its first scrape (no metrics for it yet)."""
        return self._current.get(node)

    def next_change(self) -> float | None:
        return self._times[self._next] if self._next < len(self._times) else None

    def changes_until(self, end: float) -> int:
        return bisect.bisect_right(self._times, end) - self._next


# ---- saved scrapes --------------------------------------------------------------------------------


def parse_time(text: str, what: str = "time") -> float:
    """Unix seconds, or an RFC 3339 / ISO 8601 time (``Z`` or an offset; none means UTC)."""
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise HistoryError(f"{what} {text!r} is neither unix seconds nor an RFC 3339 time") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.UTC)
        return parsed.timestamp()
    if not math.isfinite(value):
        raise HistoryError(f"{what} {text!r} is not a finite time")
    return value


def format_time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stem_time(path: Path) -> float:
    return parse_time(path.name[: -len(path.suffix)], f"file {path}: timestamp")


def _read_scrape(path: Path, node: str | None, at: float, node_label: str | None) -> list[NodeReadings]:
    result = _parsed(path)
    return dcgm.readings_from_samples(result.samples, node=node, source=SOURCE, observed_at=at,
                                      malformed_lines=len(result.malformed), node_label=node_label)


def load_scrapes(folder: str | Path, *, start: float | None = None, end: float | None = None,
                 node_label: str | None = None, network_counters: Iterable[str] | None = None) -> History:
    """A history from a saved-scrapes folder (layout: module docstring); start/end default to the
    oldest and newest file. ``network_counters``: the sysfs counters of node_exporter's scrapes to read (default:
    ``[network]``'s defaults)."""
    root = Path(folder)
    if not root.is_dir():
        raise HistoryError(f"{root}: not a folder of saved scrapes")
    entries = sorted(_entries(root), key=lambda e: (e[0], e[1] or "", str(e[2])))
    if not entries:
        raise HistoryError(f"{root}: no scrapes (<node>/<ts>.prom or <ts>.prom files)")
    times = [e[0] for e in entries]
    history = History(start=min(times) if start is None else start, end=max(times) if end is None else end)
    if history.end <= history.start:
        raise HistoryError(f"the range is empty: --to {format_time(history.end)} is not after "
                           f"--from {format_time(history.start)}")
    seen: set[str] = set()
    for at, node, path in entries:
        if node is not None and path.suffix == UNKNOWN_SUFFIX:
            reason = path.read_text(encoding="utf-8", errors="replace").strip() or "exporter unreachable"
            history.add(node, at, unknown_readings(node, reason))
            continue
        found = _read_scrape(path, node, at, node_label)
        for readings in found:
            history.add(readings.node, at, readings)
        if node is None:  # a fleet-wide scrape: who is missing from it is unknown from now on
            present = {r.node for r in found}
            for gone in sorted(seen - present):
                history.add(gone, at, unknown_readings(gone, f"absent from the fleet scrape {path.name}"))
        seen.update(r.node for r in found)
    for name in PODS_FILES:
        if (root / name).is_file():
            history.add_pods(load_pods(root / name))
    if (root / CONDITIONS_FILE).is_file():
        history.add_conditions(load_conditions(root / CONDITIONS_FILE))
    if (root / NODE_EXPORTER_DIR).is_dir():
        load_node_exporter(root / NODE_EXPORTER_DIR, history, network_counters or DEFAULT_NIC_COUNTERS, node_label)
    return history


def network_metrics(counters: Iterable[str]) -> tuple[str, ...]:
    """node_exporter's series the network judge reads: state, physical state, rate and ``counters`` (sysfs names;
    one node_exporter does not write is left out). Byte and packet counters move every scrape and are never read."""
    return (prom_nic.STATE, prom_nic.PHYS_STATE, prom_nic.RATE,
            *(prom_nic.SYSFS_COUNTERS[c] for c in sorted(set(counters)) if c in prom_nic.SYSFS_COUNTERS))


def load_node_exporter(folder: Path, history: History, counters: Iterable[str], node_label: str | None = None) -> None:
    """Saved node_exporter scrapes (``node_exporter/``, module docstring) into ``history.network``."""
    wanted = frozenset(network_metrics(counters))
    node_labels = tuple(dict.fromkeys([*([node_label] if node_label else []), *dcgm.NODE_LABEL_CANDIDATES]))
    entries = sorted(_entries(folder), key=lambda e: (e[0], e[1] or "", str(e[2])))
    seen: set[str] = set()
    for at, node, path in entries:
        if at > history.end:
            break
        at = max(at, history.start)
        if node is not None and path.suffix == UNKNOWN_SUFFIX:
            history.add_network(node, at, None)
            continue
        samples = [s for s in _parsed(path).samples if s.name in wanted]
        if node is not None:
            placed = [Sample(s.name, tuple(sorted((*s.labels, (_NODE_KEY, node)))), s.value) for s in samples]
            found = prom_nic.network_readings(placed, (_NODE_KEY,), lambda _name: True)
            history.add_network(node, at, found.get(node))
            continue
        found = prom_nic.network_readings(samples, node_labels, lambda _name: True)
        for name in sorted(found):
            history.add_network(name, at, found[name])
        for gone in sorted(seen - set(found)):  # absent from the fleet's dump: nothing read for it from now on
            history.add_network(gone, at, None)
        seen.update(found)


def _parsed(path: Path) -> ParseResult:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"{path}: cannot read: {exc}") from None
    try:
        return parse(text, strict=False)
    except ParseError as exc:
        raise HistoryError(f"{path}: not a metrics exposition: {exc}") from None


def load_conditions(path: str | Path) -> list[ConditionChange]:
    """Node condition changes from a file, one JSON object a line (module docstring); a bad line is an error
    naming its file and line."""
    found = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise HistoryError(f"{path}: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, start=1):
        if line.strip():
            found.append(_condition_change(line, f"{path}:{number}"))
    return found


def _condition_change(line: str, where: str) -> ConditionChange:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise HistoryError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise HistoryError(f"{where}: expected an object with time, node, type, status, got {line.strip()[:80]!r}")
    for key in ("time", "node", "type", "status"):
        if not isinstance(obj.get(key), str | int | float) or obj.get(key) in ("", None) or isinstance(obj[key], bool):
            raise HistoryError(f"{where}: {key!r} missing or not a string")
    if obj["status"] not in CONDITION_STATUSES:
        raise HistoryError(f"{where}: status {obj['status']!r} is none of {', '.join(CONDITION_STATUSES)}")
    at = parse_time(str(obj["time"]), f"{where}: time")
    condition = {"type": str(obj["type"]), "status": obj["status"], "reason": str(obj.get("reason") or ""),
                 "message": str(obj.get("message") or "")}
    return ConditionChange(at, str(obj["node"]), condition)


def load_pods(path: str | Path) -> list[dict[str, Any]]:
    """Pod objects from a file: one JSON object a line (``.jsonl``), or one JSON document, a PodList (``items``), a
    list of Pods or one Pod."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"{file}: cannot read: {exc}") from None
    try:
        if file.suffix == ".jsonl":
            docs: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            docs = json.loads(text)
    except ValueError as exc:
        raise HistoryError(f"{file}: not JSON: {exc}") from None
    if isinstance(docs, dict):
        docs = docs.get("items") if "items" in docs else [docs]
    if not isinstance(docs, list) or not all(isinstance(d, dict) and d.get("kind", "Pod") == "Pod" for d in docs):
        raise HistoryError(f"{file}: expected Pod objects (one a line, a list, or a PodList)")
    return docs


def _entries(root: Path) -> Iterable[tuple[float, str | None, Path]]:
    for path in root.iterdir():
        if path.is_file() and path.suffix in SCRAPE_SUFFIXES:
            yield _stem_time(path), None, path
        elif path.is_dir() and path.name != NODE_EXPORTER_DIR:
            for file in path.iterdir():
                if file.is_file() and file.suffix in (*SCRAPE_SUFFIXES, UNKNOWN_SUFFIX):
                    yield _stem_time(file), path.name, file


def node_gpus(history: History, capacities: Mapping[str, int]) -> dict[str, int]:
    """GPUs per node: the Node's capacity where known, else the GPUs its scrapes showed."""
    return {node: capacities.get(node) or history.gpus_seen(node) for node in history.nodes}
