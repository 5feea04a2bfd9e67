"""A history from Prometheus: range queries of the policy's series, in chunks of time.

Memory stays bounded for a month of 1,000 nodes: one query answers one metric over one chunk
(``chunk_s``, at most 10,000 steps: Prometheus refuses more than 11,000 points per series), and
only the change points of each series are kept (a value that differs from the step before, a
series that appears or goes missing). A node's readings are rebuilt, with the controller's own
``dcgm.readings_from_samples``, only at the instants one of its series changed.

With ``network_counters`` (a policy with ``[network] prometheus``), node_exporter's ``node_infiniband_*`` series
too, the same series the controller's network query reads (``signals.prom_nic``: state, physical state, rate and
the policy's counters, each ``max by`` node, instance, device and port), one range query per series and chunk;
a node's NIC readings are rebuilt with the controller's own ``prom_nic.network_readings`` at their change points.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.replay.history import History, HistoryError, network_metrics, unknown_readings
from gpuremediate.signals import dcgm, prom_nic, trends
from gpuremediate.signals import degradation_fields as degradation
from gpuremediate.signals.exposition import Sample
from gpuremediate.signals.promapi import api_data
from gpuremediate.signals.sources import MIB, POLICY_METRICS, FetchError, fetch

MAX_POINTS = 10_000
SOURCE = "prometheus"
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # (metric name, sorted labels without __name__)
Fetcher = Callable[[str], bytes]


@dataclass
class _Series:
    node: str
    last_at: float
    value: float


# What the [degradation] detector reads besides the policy's series (a replay whose policy enables it asks for these
# too): load, clocks and their event reasons, link error counters, the trend counters.
DEGRADATION_METRICS = (degradation.GPU_UTIL, *degradation.ACTIVITY_FIELDS, degradation.SM_CLOCK,
                       *degradation.REASON_FIELDS, degradation.PCIE_REPLAYS, *degradation.NVLINK_ERRORS,
                       trends.SBE_TOTAL, trends.REMAPPED_ROWS, trends.RETIRED_PENDING)
TEMPERATURES = frozenset({"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"})


@dataclass
class _Changes:
    """Per node, the change points of its series: (at, series, value or None when it went missing).

    Temperatures move every scrape; with ``thresholds`` (every thermal threshold of the policies
    replayed) a new temperature is a change only when it lands on another side of one of them: the
    thermal rule compares readings with its thresholds and nothing else, so the replay decides the
    same, and a month of fluctuating temperatures keeps a few points per series instead of all."""

    step: float
    thresholds: tuple[float, ...] = ()
    series: dict[SeriesKey, _Series] = field(default_factory=dict)
    events: dict[str, list[tuple[float, SeriesKey, float | None]]] = field(default_factory=dict)

    def point(self, key: SeriesKey, node: str, at: float, value: float) -> None:
        known = self.series.get(key)
        if known is not None and at - known.last_at > self.step * 1.5:  # a gap: missing in between
            self.events[node].append((known.last_at + self.step, key, None))
            known = None
        if known is not None and self._same(key[0], known.value, value):
            value = known.value  # the run keeps its first value
        else:
            self.events.setdefault(node, []).append((at, key, value))
        self.series[key] = _Series(node, at, value)

    def _same(self, metric: str, a: float, b: float) -> bool:
        if _same(a, b):
            return True
        if metric not in TEMPERATURES or not self.thresholds or a != a or b != b:
            return False
        return all((a >= c) == (b >= c) and (a <= c) == (b <= c) for c in self.thresholds)

    def finish(self, end: float) -> None:
        for key, known in self.series.items():
            if known.last_at < end - self.step * 0.5:
                self.events[known.node].append((known.last_at + self.step, key, None))


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN == NaN here: no change


class PrometheusHistory:
    def __init__(self, url: str, *, token: str | None = None, ca_file: str | None = None,
                 node_label: str | None = None, timeout_s: float = 60.0, max_bytes: int = 256 * MIB,
                 metrics: Sequence[str] = POLICY_METRICS, fetcher: Fetcher | None = None,
                 network_counters: Sequence[str] | None = None) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise HistoryError(f"--prometheus must be http(s)://host[:port][/prefix], got {url!r}")
        self.url = url.rstrip("/")
        self.headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.node_labels = tuple(dict.fromkeys([*([node_label] if node_label else []), *dcgm.NODE_LABEL_CANDIDATES]))
        self.timeout_s, self.max_bytes, self.metrics = timeout_s, max_bytes, tuple(metrics)
        self.fetcher = fetcher or self._fetch
        self.network_counters = None if network_counters is None else tuple(network_counters)
        self.queries = 0

    def load(self, start: float, end: float, step: float, chunk_s: float = 3600.0,
             thresholds: Sequence[float] = ()) -> History:
        if end <= start:
            raise HistoryError("the range is empty: --to must be after --from")
        if step <= 0:
            raise HistoryError(f"--step must be > 0, got {step}")
        chunk_s = min(max(chunk_s, step), step * MAX_POINTS)
        changes = _Changes(step, tuple(sorted(set(thresholds))))
        for metric in self.metrics:
            self._chunks(changes, metric, metric, start, end, step, chunk_s, self._gpu_node)
        changes.finish(end)
        history = self._history(changes, start, end)
        if self.network_counters is not None:
            nics = _Changes(step)
            by = ", ".join((*self.node_labels, prom_nic.INSTANCE, *prom_nic.PORT_LABELS))
            for metric in network_metrics(self.network_counters):
                self._chunks(nics, f"max by ({by}) ({metric})", metric, start, end, step, chunk_s, self._nic_node)
            nics.finish(end)
            self._network(history, nics)
        return history

    def _chunks(self, changes: _Changes, query: str, metric: str, start: float, end: float, step: float,
                chunk_s: float, place: Callable[[dict[str, str]], str | None]) -> None:
        at = start
        while at <= end:
            last = min(end, at + chunk_s - step)
            self._chunk(changes, query, metric, at, last, step, place)
            at = last + step

    def _gpu_node(self, labels: dict[str, str]) -> str | None:
        return next((labels[n] for n in self.node_labels if labels.get(n)), None)

    def _nic_node(self, labels: dict[str, str]) -> str | None:
        """As the controller places node_exporter's series: a node label, else ``instance`` less its port."""
        sample = Sample("", tuple(sorted(labels.items())), 0.0)
        return prom_nic.node_of(sample, self.node_labels, lambda _name: True)

    def _chunk(self, changes: _Changes, query: str, metric: str, start: float, end: float, step: float,
               place: Callable[[dict[str, str]], str | None]) -> None:
        encoded = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                          "step": f"{step:g}"})
        self.queries += 1
        for item in parse_matrix(self.fetcher(f"{self.url}/api/v1/query_range?{encoded}")):
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            name = labels.pop("__name__", metric)
            node = place(labels)
            if node is None:
                continue  # a series no node label places (dcgm.readings_from_samples drops those too)
            key: SeriesKey = (name, tuple(sorted(labels.items())))
            for at, value in item["values"]:
                changes.point(key, node, float(at), float(value))

    def _network(self, history: History, changes: _Changes) -> None:
        """Each node's NIC readings at the instants one of its node_exporter series changed (None: no series)."""
        for node, at, current in _instants(changes):
            samples = [Sample(name, labels, v) for (name, labels), v in sorted(current.items())]
            found = prom_nic.network_readings(samples, self.node_labels, lambda _name: True)
            history.add_network(node, at, found.get(node))

    def _fetch(self, url: str) -> bytes:
        try:
            body, _ = fetch(url, self.timeout_s, self.max_bytes, self.headers, self.context)
        except FetchError as exc:
            raise HistoryError(f"Prometheus range query to {self.url} failed: {exc} (a smaller --chunk helps "
                               "when the answer is too large)") from None
        return body

    def _history(self, changes: _Changes, start: float, end: float) -> History:
        history = History(start=start, end=end)
        for node, at, current in _instants(changes):
            if not current:
                history.add(node, at, unknown_readings(node, "no series for this node in Prometheus"))
                continue
            samples = [Sample(name, labels, v) for (name, labels), v in sorted(current.items())]
            for readings in dcgm.readings_from_samples(samples, node=node, source=SOURCE, observed_at=at):
                history.add(node, at, readings)
        return history


def parse_matrix(body: bytes) -> list[dict[str, Any]]:
    """The matrix result of a range query; HistoryError naming what Prometheus said otherwise."""
    data = api_data(body, HistoryError, "Prometheus range query")
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise HistoryError(f"expected a matrix result, got {data.get('resultType')!r}")
    return [item for item in data["result"]
            if isinstance(item, dict) and isinstance(item.get("metric"), dict) and isinstance(item.get("values"), list)]


def _instants(changes: _Changes) -> Iterator[tuple[str, float, dict[SeriesKey, float]]]:
    """Each node's series values at each instant one of them changed (every change of an instant applied first)."""
    for node in sorted(changes.events):
        current: dict[SeriesKey, float] = {}
        events = sorted(changes.events[node], key=lambda e: e[0])
        for i, (at, key, value) in enumerate(events):
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
            if i + 1 < len(events) and events[i + 1][0] == at:
                continue
            yield node, at, current
