"""Where readings come from: each node's dcgm-exporter pod, or one Prometheus query.

Every source has ``read() -> list[NodeReadings]``. A node whose metrics cannot be had (exporter
down, slow, oversized, pod not running or missing, series stale) is reported with
``status=unknown`` and a reason: unknown is never unhealthy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import io
import json
import logging
import math
import queue
import re
import socket
import ssl
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import PODS
from gpuremediate.kube.shards import prometheus_hashmod
from gpuremediate.signals import dcgm, exposition, prom_degradation, prom_nic
from gpuremediate.signals.degradation_fields import PeerStats
from gpuremediate.signals.exposition import Labels, Sample
from gpuremediate.signals.model import SOURCE_UNKNOWN, NodeReadings
from gpuremediate.signals.nic import NetworkReadings
from gpuremediate.signals.promapi import api_data

log = logging.getLogger(__name__)

MIB = 1024 * 1024
OVERRUN_GRACE_S = 1.0  # past its deadline (plus this), a scrape no longer holds up the cycle
# Once all scrapes but a few stragglers (a tenth, at least one) have answered, the others' readings are handed
# on after this long at most: a node's fault never waits for another node's hung or trickling exporter.
STRAGGLER_WAIT_S = 0.5
# The series the policy reads (design §4); Prometheus is asked for these and nothing else.
POLICY_METRICS = (
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION",  # [recovery_action]: 0 but while the driver asks for something
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",  # its name in older DCGM
)


class Source(Protocol):
    def read(self) -> list[NodeReadings]: ...


@runtime_checkable
class InWaves(Protocol):
    """A source whose read comes in waves: most nodes first, stragglers as they answer (the exporter source)."""

    def read_waves(self) -> Iterator[list[NodeReadings]]: ...


@runtime_checkable
class FaultFastPath(Protocol):
    """A source that can say cheaply which nodes' faults changed, and read only those (Prometheus)."""

    fault_poll_s: float

    def changed_nodes(self) -> set[str]: ...

    def read(self, nodes: Sequence[str] = ()) -> list[NodeReadings]: ...


class ScrapeObserver(Protocol):
    """Told about every scrape (metrics are wired to this by the controller)."""

    def scrape(self, node: str, seconds: float, ok: bool, reason: str) -> None: ...


class SourceError(RuntimeError):
    """The source as a whole failed (pods cannot be listed, Prometheus unusable); says why."""


def unknown(node: str, source: str, reason: str, observed_at: float) -> NodeReadings:
    return NodeReadings(node=node, source=source, status=SOURCE_UNKNOWN, reason=reason, observed_at=observed_at)


# ---------------------------------------------------------------- HTTP with a size cap and a deadline


class FetchError(Exception):
    """A scrape that did not give a usable body; the message is the reason in words."""


@dataclass
class Answered:
    """How long the peer took to begin its answer: from the request's first byte sent to its status line read.
    A peer such as Prometheus evaluates and encodes before it writes, so this is its own work and one round trip,
    apart from the body's transfer and the decoding here (which wait for this process's interpreter when it is
    busy)."""

    seconds: float = 0.0


def fetch(
    url: str, timeout_s: float, max_bytes: int, headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None, answered: Answered | None = None,
) -> tuple[bytes, str]:
    """GET ``url``: (body, content type); ``answered``, when given, is set to the peer's time to answer.

    The whole exchange (connect, TLS, status line, headers, body) must fit in ``timeout_s``: the time
    left is set on the socket before every read, so a peer trickling one byte at a time still ends at
    the deadline. Anything that goes wrong, whatever the peer sends, is a FetchError saying what.
    """
    deadline = time.monotonic() + timeout_s
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"not an http(s) URL: {url!r}")
    conn = _DeadlineConnection(parts, deadline, context)
    try:
        conn.connect()
        asked = time.monotonic()
        conn.request("GET", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")),
                     headers=dict(headers or {}))
        resp = conn.getresponse()
        if answered is not None:
            answered.seconds = time.monotonic() - asked
        body = _read_capped(resp, max_bytes)
        if not 200 <= resp.status < 300:
            raise FetchError(f"HTTP {resp.status} {resp.reason}" + _error_detail(body, resp))
        return _decoded(body, resp, max_bytes), resp.headers.get("Content-Type", "")
    except FetchError:
        raise
    except TimeoutError:
        raise FetchError(f"timed out after {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise FetchError(f"bad or broken HTTP exchange: {type(e).__name__}: {e}"[:300]) from None
    finally:
        conn.close()
        conn.close_socket()


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP(S) connection whose every socket operation gets the time left until one deadline."""

    def __init__(self, parts: urllib.parse.SplitResult, deadline: float, context: ssl.SSLContext | None) -> None:
        https = parts.scheme == "https"
        super().__init__(parts.hostname or "", parts.port or (443 if https else 80), timeout=_left(deadline))
        self.deadline = deadline
        self.tls = (context or ssl.create_default_context()) if https else None
        self.raw: socket.socket | None = None

    def connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), _left(self.deadline))
        except TimeoutError:
            raise
        except OSError as e:
            raise FetchError(f"cannot connect: {e}") from None
        if self.tls is not None:
            sock.settimeout(_left(self.deadline))
            sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        self.raw = sock
        self.sock = _DeadlineSocket(sock, self.deadline)

    def close_socket(self) -> None:
        """Close the socket itself (http.client hands it to the response and closes only its wrapper)."""
        if self.raw is not None:
            self.raw.close()
            self.raw = None


class _DeadlineSocket:
    """What http.client needs of a socket (sendall, makefile, close), each read bounded by the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(_left(self.deadline))
        self.sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self.sock, self.deadline))

    def settimeout(self, value: float | None) -> None:
        pass  # the deadline decides

    def close(self) -> None:
        pass  # the response may still be reading the body; fetch() closes the socket when done


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.sock.settimeout(_left(self.deadline))
        return self.sock.recv_into(buffer)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def _read_capped(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    declared = resp.headers.get("Content-Length")
    if declared is not None and declared.strip().isascii() and declared.strip().isdigit() \
            and int(declared) > max_bytes:
        raise FetchError(f"response of {int(declared)} bytes exceeds the {max_bytes} byte limit")
    chunks: list[bytes] = []
    size = 0
    while chunk := resp.read(min(65536, max_bytes + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise FetchError(f"response exceeds the {max_bytes} byte limit")
    return b"".join(chunks)


def _decoded(body: bytes, resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The body, gunzipped where the server compressed it; the size cap holds for the inflated body too."""
    if resp.headers.get("Content-Encoding", "").strip().lower() != "gzip":
        return body
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as e:
        raise FetchError(f"gzip body is corrupt: {e}") from None
    if len(out) > max_bytes:
        raise FetchError(f"response exceeds the {max_bytes} byte limit once decompressed")
    return out


def _error_detail(body: bytes, resp: http.client.HTTPResponse) -> str:
    """What the server said about its error (Prometheus: a JSON ``error``), in a few hundred characters."""
    try:
        text = _decoded(body, resp, 65536).decode("utf-8", "replace").strip()
    except FetchError:
        return ""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("error"):
        text = f"{doc.get('errorType', 'error')}: {doc['error']}"
    return f": {text[:300]}" if text else ""


# ---------------------------------------------------------------- exporter pods


@dataclass(frozen=True)
class ExporterTarget:
    node: str
    pod: str  # namespace/name
    url: str | None  # None: nothing to scrape (see reason)
    reason: str = ""


def _pod_url(pod: Mapping[str, Any], port: int, path: str) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{path}"


def _pod_rank(pod: Mapping[str, Any]) -> tuple[bool, bool, str]:
    """Prefer a Running pod that is not terminating, then the newest (a rolling update has two)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return (status.get("phase") == "Running", not meta.get("deletionTimestamp"), meta.get("creationTimestamp", ""))


def exporter_targets(pods: Iterable[Mapping[str, Any]], port: int, path: str) -> list[ExporterTarget]:
    """One target per node that has an exporter pod: the pod to scrape, or why there is none."""
    by_node: dict[str, Mapping[str, Any]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (node not in by_node or _pod_rank(pod) > _pod_rank(by_node[node])):
            by_node[node] = pod
    targets = []
    for node, pod in sorted(by_node.items()):
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ref = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        phase = status.get("phase") or "Unknown"
        url = _pod_url(pod, port, path)
        if phase != "Running":
            targets.append(ExporterTarget(node, ref, None, f"exporter pod {ref} is {phase}, not Running"))
        elif url is None:
            targets.append(ExporterTarget(node, ref, None, f"exporter pod {ref} has no pod IP yet"))
        else:
            targets.append(ExporterTarget(node, ref, url))
    return targets


class ExporterSource:
    """Scrapes every node's dcgm-exporter pod directly, concurrently, with a deadline and a size cap.

    The exporter pods come from an Informer on their namespace and label selector (owned here, started
    with the source): at steady state no LIST is sent, only the watch.
    """

    name = "exporter"

    def __init__(
        self,
        client: KubeClient,
        namespace: str = "gpu-operator",
        label_selector: str = "app=nvidia-dcgm-exporter",
        port: int = 9400,
        path: str = "/metrics",
        timeout_s: float = 5.0,
        max_bytes: int = 8 * MIB,
        workers: int = 16,
        stale_after_s: float = 120.0,
        observer: ScrapeObserver | None = None,
        expected_nodes: Callable[[], Iterable[str]] | None = None,
        clock: Callable[[], float] = time.time,
        sync_timeout_s: float = 10.0,
    ) -> None:
        if workers < 1 or timeout_s <= 0 or max_bytes < 1:
            raise ValueError(f"workers ({workers}), timeout_s ({timeout_s}), max_bytes ({max_bytes}) must be > 0")
        self.client = client
        self.namespace, self.label_selector = namespace, label_selector
        self.port, self.path = port, path
        self.timeout_s, self.max_bytes, self.workers = timeout_s, max_bytes, workers
        self.stale_after_s = stale_after_s
        self.observer = observer
        self.expected_nodes = expected_nodes  # GPU nodes that should have an exporter pod
        self.clock = clock
        self._in_flight: dict[str, float] = {}  # node -> monotonic start of its running scrape
        self._failed: set[str] = set()  # nodes unknown last cycle: scraped after the others
        self.sync_timeout_s = sync_timeout_s
        self._informer: Informer | None = None
        self._start_lock = threading.Lock()

    def read(self) -> list[NodeReadings]:
        return [reading for wave in self.read_waves() for reading in wave]

    def read_waves(self) -> Iterator[list[NodeReadings]]:
        """Every node's readings: a first wave once all but the stragglers answered (STRAGGLER_WAIT_S after that,
        or when all did), then each straggler's as it answers or times out."""
        targets = exporter_targets(self._pods(), self.port, self.path)
        missing = self._missing({t.node for t in targets})
        first = True
        for wave in self._scrape_all(targets):
            yield wave + missing if first else wave
            first = False
        if first:
            yield missing

    def _scrape_all(self, targets: Sequence[ExporterTarget]) -> Iterator[list[NodeReadings]]:
        """Every target's reading, never waiting on a scrape past its deadline, in waves (``read_waves``).

        Nodes that failed last cycle go last, so a few slow exporters do not hold the healthy ones in
        the queue. A scrape that overruns its deadline (a thread stuck outside a socket read) is left
        running on its own and reported unknown; its node is not scraped again until it ends.
        """
        ordered = sorted(targets, key=lambda t: t.node in self._failed)
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(ordered))),
                                  thread_name_prefix="scrape")
        pending: dict[Future[NodeReadings], ExporterTarget] = {}
        first: list[NodeReadings] = []
        failed: set[str] = set()
        try:
            for target in ordered:
                if target.node in self._in_flight:
                    first.append(self._still_running(target))
                else:
                    pending[pool.submit(self._scrape_once, target)] = target
            for wave in self._collect(pending, first, max(1, len(ordered) // 10)):
                failed |= {r.node for r in wave if r.status == SOURCE_UNKNOWN}
                yield wave
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self._failed = failed

    def _collect(self, pending: dict[Future[NodeReadings], ExporterTarget], results: list[NodeReadings],
                 stragglers: int) -> Iterator[list[NodeReadings]]:
        """Each scrape's reading as it ends (a queue its future puts itself on: waiting on thousands of futures at
        once costs each wait all of them), a scrape past its deadline reported unknown and left running."""
        ended: queue.SimpleQueue[Future[NodeReadings]] = queue.SimpleQueue()
        by_node = {target.node: future for future, target in pending.items()}
        for future in list(pending):
            future.add_done_callback(ended.put)
        handed_on_at: float | None = None  # when only ``stragglers`` were left: the first wave goes then
        while pending:
            with contextlib.suppress(queue.Empty):
                done = ended.get(timeout=0.05)
                while True:  # every scrape ended by now
                    if (target := pending.pop(done, None)) is not None:  # else: reported as overrun already
                        results.append(self._outcome(done, target))
                    done = ended.get_nowait()
            now = time.monotonic()
            results.extend(self._overruns(pending, by_node, now))
            if handed_on_at is None and 0 < len(pending) <= stragglers:
                handed_on_at = now + STRAGGLER_WAIT_S
            if pending and handed_on_at is not None and now >= handed_on_at and results:
                yield results  # the first wave, then each straggler as it answers
                results = []
        if results:
            yield results

    def _overruns(self, pending: dict[Future[NodeReadings], ExporterTarget],
                  by_node: Mapping[str, Future[NodeReadings]], now: float) -> list[NodeReadings]:
        """The scrapes running past their deadline (only those in flight can be: a few, not every pending one),
        taken out of ``pending`` and reported unknown."""
        late = []
        for node, started in list(self._in_flight.items()):
            future = by_node.get(node)
            if future is not None and future in pending and now - started > self.timeout_s + OVERRUN_GRACE_S:
                late.append(self._still_running(pending.pop(future)))
        return late

    def _outcome(self, future: Future[NodeReadings], target: ExporterTarget) -> NodeReadings:
        try:
            return future.result()
        except Exception as e:  # a bug in parsing one body costs that node, not the cycle
            reason = f"scrape of {target.pod} failed: {type(e).__name__}: {e}"[:500]
            self._observe(target.node, 0.0, False, reason)
            return unknown(target.node, self.name, reason, self.clock())

    def _still_running(self, target: ExporterTarget) -> NodeReadings:
        reason = f"scrape of {target.pod} ({target.url}) still running past its {self.timeout_s:g} s deadline"
        self._observe(target.node, self.timeout_s, False, reason)
        return unknown(target.node, self.name, reason, self.clock())

    def _scrape_once(self, target: ExporterTarget) -> NodeReadings:
        self._in_flight[target.node] = time.monotonic()
        try:
            return self._read_target(target)
        finally:
            self._in_flight.pop(target.node, None)

    def start(self) -> None:
        """Start watching the exporter pods (read() also starts it, on first use)."""
        with self._start_lock:
            if self._informer is None:
                self._informer = Informer(self.client, PODS, self.namespace, label_selector=self.label_selector)
                self._informer.start()

    def stop(self) -> None:
        if self._informer is not None:
            self._informer.stop()

    def _pods(self) -> list[Mapping[str, Any]]:
        """The exporter pods from the informer's store: a watch, not a LIST per cycle."""
        self.start()
        assert self._informer is not None
        if not self._informer.wait_for_sync(self.sync_timeout_s):
            why = self._informer.last_error or f"not listed within {self.sync_timeout_s:g} s"
            raise SourceError(f"cannot list exporter pods in {self.namespace} ({self.label_selector}): {why}")
        return list(self._informer.list())

    def _missing(self, covered: set[str]) -> list[NodeReadings]:
        if self.expected_nodes is None:
            return []
        now = self.clock()
        reason = f"no exporter pod ({self.label_selector}) in {self.namespace} on this node"
        return [unknown(node, self.name, reason, now) for node in sorted(set(self.expected_nodes()) - covered)]

    def _read_target(self, target: ExporterTarget) -> NodeReadings:
        observed_at = self.clock()
        if target.url is None:
            self._observe(target.node, 0.0, False, target.reason)
            return unknown(target.node, self.name, target.reason, observed_at)
        started = time.monotonic()
        try:
            body, content_type = fetch(target.url, self.timeout_s, self.max_bytes)
            readings = self._readings(target, body, content_type, observed_at)
        except FetchError as e:
            reason = f"scrape of {target.pod} ({target.url}) failed: {e}"
            self._observe(target.node, time.monotonic() - started, False, reason)
            return unknown(target.node, self.name, reason, observed_at)
        self._observe(target.node, time.monotonic() - started, readings.status != SOURCE_UNKNOWN, readings.reason)
        return readings

    def _readings(self, target: ExporterTarget, body: bytes, content_type: str, observed_at: float) -> NodeReadings:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FetchError(f"body is not UTF-8: {e}") from None
        parsed = exposition.parse(text, content_type=content_type or None, strict=False)
        samples = fresh_samples(parsed.samples, observed_at, self.stale_after_s)
        found = dcgm.readings_from_samples(samples, node=target.node, source=self.name, observed_at=observed_at,
                                           malformed_lines=len(parsed.malformed))
        mine = [r for r in found if r.node == target.node]
        if not mine or not mine[0].gpus:
            why = "stale" if len(samples) < len(parsed.samples) else "absent"
            return unknown(target.node, self.name, f"scrape of {target.pod} had no GPU series ({why})", observed_at)
        meta = {**mine[0].meta, "exporter_pod": target.pod}
        return dataclasses.replace(mine[0], meta=meta)

    def _observe(self, node: str, seconds: float, ok: bool, reason: str) -> None:
        if self.observer is not None:
            self.observer.scrape(node, seconds, ok, reason)


def fresh_samples(samples: Sequence[Sample], now: float, stale_after_s: float) -> list[Sample]:
    """Samples without a timestamp (the exporter's norm), or with one no older than ``stale_after_s``."""
    return [s for s in samples if s.timestamp is None or now - s.timestamp <= stale_after_s]


# ---------------------------------------------------------------- Prometheus


_Fault = tuple[str, Labels, float]  # a non-zero fault series: (metric, labels, value)


class PrometheusError(SourceError):
    """Prometheus could not answer the query; the message says what it said."""


NAME_LABEL = "gpuremediate_metric"  # the metric name, kept where aggregation drops __name__
KEY_LABELS = ("gpu", "GPU_I_ID", "UUID")  # one GPU (or MIG instance), on every value
# What else the controller reads about a GPU: its identity, the driver, the workload on it (behind a
# ServiceMonitor with honor_labels false the workload's pod/namespace arrive as exported_*).
IDENTITY_LABELS = ("modelName", "pci_bus_id", dcgm.DRIVER_VERSION_LABEL, "pod", "namespace", "exported_pod",
                   "exported_namespace")
XID_LABELS = ("xid", "err_msg")
XID_SERIES = (dcgm.XID_FIELD, dcgm.XID_COUNT_SERIES)
DENSE_METRICS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP")  # read whatever their value
IDENTITY_METRICS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS")  # every exporter has one of them
IDENTITY_QUERY_MAX_NODES = 50  # the nodes whose identity is fetched in the cycle they show a fault
FAULT_METRICS = tuple(m for m in POLICY_METRICS if m not in DENSE_METRICS)
FAULT_POLL_S = 1.0  # how often the fault fast path asks between full reads
QUERY_TIMEOUT_BASE_S = 10.0  # the default query timeout: this, plus QUERY_TIMEOUT_PER_NODE_S per GPU node
QUERY_TIMEOUT_PER_NODE_S = 0.004  # (30 s at 5,000 nodes)
# The default cap on one answer: this plus ANSWER_PER_NODE_BYTES per GPU node (the identity answer, the largest,
# is about 2.6 KB a node of 8 GPUs: a fixed 64 MiB refused it from about 25,000 nodes on)
ANSWER_BASE_BYTES = 64 * MIB
ANSWER_PER_NODE_BYTES = 8 * 1024
FAULT_QUERY_TIMEOUT_S = 10.0  # the fast path's query waits no longer (or the query timeout, if shorter)
FLEET_SIZE_EVERY_S = 30.0  # the fleet's size (for the query timeout) is counted at most this often


# dcgm-exporter >= 3.3 writes an XID into labels (err_code/err_msg: a new series per XID): Prometheus finds those
# by its index, reading no sample of the fleet's 40,000 quiet XID series. Older exporters (no err_code label)
# hold the XID in the value, which only a read of every series can filter.
XID_IN_LABELS = 'err_code!~"|0"'
XID_IN_VALUE = 'err_code=""'
# Freshness from two GPUs' series per node: every series of a scrape shares its time (and one GPU may be gone).
FRESHNESS_MATCHER = 'gpu=~"0|1"'

# The recording rules (signals/recording.py renders them; the source reads them once it finds RULES_INFO).
RULES_VERSION = "1"
RULES_INFO = "gpuremediate:recording_rules_info"
RECORDED_FAULTS = "gpuremediate:gpu_faults:max"  # the policy's non-zero fault series, one per (node, GPU, signal)
RECORDED_NEWEST = "gpuremediate:node_newest_sample_timestamp_seconds:max"  # each node's newest raw sample
RECORDED_OPEN_FAULTS = "gpuremediate:node_open_faults:count"  # per node with an open fault: the fault signals
MODE_RAW = "raw"  # the source aggregates dcgm-exporter's series itself, every query
MODE_RECORDED = "recorded"  # Prometheus' recording rules did it once per evaluation; the source reads their output
MODE_CHECK_EVERY = 10  # full reads between two looks for the recording rules


def _selector(metric: str, matcher: str = "", extra: str = "") -> str:
    """``metric{...}`` with the node matcher's (``{Hostname=~"a|b"}``) and ``extra``'s label matchers."""
    return metric + and_matcher(matcher, extra)


def _by(node_labels: Sequence[str], metric: str) -> str:
    return ", ".join((*node_labels, *KEY_LABELS, *(XID_LABELS if metric in XID_SERIES else ())))


def and_matcher(matcher: str, extra: str) -> str:
    """Two label matchers as one (`{Hostname=~"a"}` and `shard=~"3"`: `{Hostname=~"a", shard=~"3"}`)."""
    inner = ", ".join(part for part in (matcher[1:-1] if matcher else "", extra) if part)
    return f"{{{inner}}}" if inner else ""


@dataclass(frozen=True)
class ShardScope:
    """Per-shard reads (``--prometheus-shard-label``): every GPU series carries ``label``, Prometheus' hashmod of its
    node name mod ``shards`` (a relabelling in the scrape configuration, docs/sizing.md), and ``held()`` are the
    shards this replica holds: each query selects those shards' series only, so a read costs the shard, not the
    fleet. The controller's node -> shard hash is the same hashmod (``--shard-hash=hashmod``)."""

    label: str
    shards: int
    held: Callable[[], frozenset[int]]

    def matcher(self, held: frozenset[int]) -> str:
        return f'{self.label}=~"{"|".join(str(i) for i in sorted(held))}"'

    def holds(self, node: str, held: frozenset[int]) -> bool:
        return prometheus_hashmod(node, self.shards) in held


def fault_selector(metric: str, matcher: str = "", recorded: bool = False) -> str:
    """The non-zero values of one fault series. The XID gauge is taken from the index where the exporter puts the
    XID in labels, and from the values only where it does not (raw; with ``recorded``, only the index: the
    value-held XIDs are the recording rules' to aggregate)."""
    if metric != dcgm.XID_FIELD:
        return f"{_selector(metric, matcher)} != 0"
    indexed = f"{_selector(metric, matcher, XID_IN_LABELS)} != 0"
    return indexed if recorded else f"({indexed}) or ({_selector(metric, matcher, XID_IN_VALUE)} != 0)"


def fault_rule_exprs(node_labels: Sequence[str] = dcgm.NODE_LABEL_CANDIDATES) -> list[tuple[str, str]]:
    """(metric, expr) of each fault series' recording rule: what the raw readings query asks for, minus the XIDs
    the index finds (the source asks for those itself: no rule evaluation stands between them and a poll)."""
    exprs = []
    for metric in FAULT_METRICS:
        selector = (f"{metric}{{{XID_IN_VALUE}}} != 0" if metric == dcgm.XID_FIELD else f"{metric} != 0")
        exprs.append((metric, f"max by ({_by(node_labels, metric)}) ({selector})"))
    return exprs


def policy_query(node_labels: Sequence[str] = dcgm.NODE_LABEL_CANDIDATES,
                 metrics: Sequence[str] = POLICY_METRICS, matcher: str = "", recorded: bool = False) -> str:
    """One instant query: one value per (node, GPU, signal), with only the labels that say which GPU.

    Prometheus does the work: ``max by`` drops every other label and collapses duplicate series (two
    exporter pods during a rollout); the metric's name, which aggregation drops, is put back in
    ``gpuremediate_metric``. The counters and flags the policy reads fire only when non-zero, so only
    their non-zero values are asked for: a healthy fleet answers with its temperatures alone. With
    ``recorded`` the fault series are the recording rules' (``RECORDED_FAULTS``, already in that shape), but
    for the XIDs the index finds.
    """
    parts = []
    for metric in metrics:
        if recorded and metric not in DENSE_METRICS and metric != dcgm.XID_FIELD:
            continue  # in RECORDED_FAULTS
        selector = _selector(metric, matcher) if metric in DENSE_METRICS else fault_selector(metric, matcher,
                                                                                                 recorded)
        parts.append(f'label_replace(max by ({_by(node_labels, metric)}) ({selector}), "{NAME_LABEL}", "{metric}", '
                     f'"", "")')
    if recorded and any(m not in DENSE_METRICS for m in metrics):
        parts.append(_selector(RECORDED_FAULTS, matcher))
    return " or ".join(parts)


def identity_query(node_labels: Sequence[str] = dcgm.NODE_LABEL_CANDIDATES, nodes: Sequence[str] = (),
                   scope: str = "") -> str:
    """Each GPU's identity and workload labels (all nodes, or only ``nodes`` by the first node label; ``scope``: a
    label matcher every series must meet as well, a shard's)."""
    by = ", ".join((*node_labels, *KEY_LABELS, *IDENTITY_LABELS))
    if nodes:
        series = " or ".join(m + and_matcher(f'{{{node_labels[0]}="{_promql_string(n)}"}}', scope)
                             for m in IDENTITY_METRICS for n in nodes)
    else:
        series = and_matcher('{__name__=~"' + "|".join(IDENTITY_METRICS) + '"}', scope)
    return f"group by ({by}) ({series})"


def _promql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def polled_metrics(recorded: bool) -> tuple[str, ...]:
    """The fault series the fast path asks for: every one from the recording rules' output; without the rules,
    only the XID gauge (its XIDs in labels cost Prometheus no sample read; filtering every ECC and row-remap
    series by value once a second costs a core at 5,000 nodes: those wait for the full read)."""
    return FAULT_METRICS if recorded else (dcgm.XID_FIELD,)


def fault_query(node_labels: Sequence[str] = dcgm.NODE_LABEL_CANDIDATES, recorded: bool = False,
                matcher: str = "") -> str:
    """The fast path's query (``PrometheusSource.changed_nodes``): the readings query's non-zero fault series of
    ``polled_metrics`` alone. A healthy fleet answers with nothing, and the XIDs dcgm-exporter puts in labels
    come from Prometheus' index, so it is cheap to ask often."""
    return policy_query(node_labels, polled_metrics(recorded), matcher=matcher, recorded=recorded)


def node_matcher(label: str, nodes: Sequence[str]) -> str:
    """A selector's label matcher for exactly these nodes (``{Hostname=~"a|b"}``; the regex is anchored)."""
    alternatives = "|".join(re.escape(node) for node in nodes)
    return f'{{{label}=~"{_promql_string(alternatives)}"}}'


def freshness_query(node_labels: Sequence[str] = dcgm.NODE_LABEL_CANDIDATES,
                    metrics: Sequence[str] = IDENTITY_METRICS, matcher: str = "", recorded: bool = False) -> str:
    """Each node's newest sample time (of the series every exporter sends: every scrape refreshes them).

    ``timestamp()`` is applied to each raw selector: on the output of label_replace or an aggregation
    it would return the evaluation time, never the sample's. One metric per ``timestamp()`` (it drops
    ``__name__``, and two metrics' series would then clash), each tagged apart so ``or`` keeps them all. Two
    GPUs' series per node say it (``FRESHNESS_MATCHER``: a scrape writes all its series at one time), an
    eighth of the series to read. With ``recorded``: the recording rule's output of this very expression.
    """
    if recorded:
        return _selector(RECORDED_NEWEST, matcher)
    stamped = " or ".join(f'label_replace(timestamp({_selector(m, matcher, FRESHNESS_MATCHER)}), "{NAME_LABEL}", '
                          f'"{m}", "", "")' for m in metrics)
    return f"max by ({', '.join(node_labels)}) ({stamped})"


class PrometheusSource:
    """Readings for every node from two instant queries per cycle to Prometheus's HTTP API.

    Each GPU's identity and workload (model, PCI bus, driver, pods) changes rarely and is the bulk of
    the labels: it is asked for every ``identity_every`` reads, and at once for a node showing a fault.

    ``query_timeout_s`` (None: 10 s plus 4 ms per GPU node, so it scales with the fleet) is sent to
    Prometheus as the query's ``timeout`` and bounds the HTTP exchange. The node count is the larger of
    the last read's and ``fleet_size()`` (the Node informer's GPU nodes): the first read, before any node
    was seen, is sized for the fleet too (at 5,000 nodes a first read sized for none timed out for ever).
    ``max_bytes`` (None: 64 MiB plus 8 KiB per node, counted as for the timeout) caps the (gzip-decompressed)
    answer. A node whose newest sample is older than
    ``stale_after_s`` is unknown, as is an ``expected_nodes`` node that Prometheus has no series for (its
    target is down: Prometheus marks the series stale and drops them from instant queries).

    ``keep`` (a sharded replica's ``owns``) narrows what is made of each answer to its nodes: the queries are
    the fleet's, but readings, identity and the faults remembered are made and kept for the replica's own nodes
    only. With ``shard_scope`` (``--prometheus-shard-label``) the queries themselves select the shards held when
    each begins (Prometheus transfers and we decode the shard's series only), and only those shards' nodes are
    read, or unknown when Prometheus has nothing for them: a shard taken while a read runs is read from the next.
    Such reads use the raw series: the recording rules aggregate the shard label away.
    """

    name = "prometheus"

    def __init__(
        self,
        url: str,
        token: str | None = None,
        ca_file: str | None = None,
        node_label: str = "Hostname",
        timeout_s: float | None = None,
        stale_after_s: float = 120.0,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        expected_nodes: Callable[[], Iterable[str]] | None = None,
        identity_every: int = 8,
        fault_poll_s: float = FAULT_POLL_S,
        fleet_size: Callable[[], int] | None = None,
        recording_rules: bool = True,
        keep: Callable[[str], bool] | None = None,
        shard_scope: ShardScope | None = None,
    ) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"Prometheus URL must be http(s)://host[:port][/prefix], got {url!r}")
        if (timeout_s is not None and not timeout_s > 0) or (max_bytes is not None and max_bytes < 1) \
                or not stale_after_s > 0:
            raise ValueError(f"timeout_s ({timeout_s}), max_bytes ({max_bytes}), stale_after_s ({stale_after_s}) "
                             "must be > 0")
        self.url = url.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.node_labels = (node_label, *[n for n in dcgm.NODE_LABEL_CANDIDATES if n != node_label])
        self.query_timeout_s, self.stale_after_s, self.max_bytes = timeout_s, stale_after_s, max_bytes
        self.clock = clock
        self.expected_nodes = expected_nodes
        self.fleet_size = fleet_size
        self.keep = keep  # None: every node; else (--shards) only these nodes' readings, identity and faults are made
        self._fleet_known, self._fleet_counted_at = 0, -math.inf  # fleet_size()'s last answer, and when
        self.nodes_seen = 0
        self.reads = 0
        self.identity_every = max(1, identity_every)
        # (node, gpu, mig) -> each identity's label pairs, workload-attributed; pairs shared fleet-wide are one
        # object (a fleet's GPUs share a few models, drivers, bus ids and namespaces)
        self._identity: dict[tuple[str, str, str], tuple[Labels, ...]] = {}
        self._shared_pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self._faults_seen: dict[str, set[_Fault]] = {}  # node -> its non-zero fault series, as last read
        self._named_by: dict[str, str] = {}  # node -> the node label its changed fault series carried
        self.fault_poll_s = fault_poll_s  # 0: no fast path
        self.fault_error = ""  # why the last fast-path query failed ("" when it did not)
        self.fault_answer_s: float | None = None  # Prometheus' time to answer the last one that did (the pacer's)
        self.mode = ""  # MODE_RECORDED while Prometheus has our recording rules, else MODE_RAW ("": not looked yet)
        self.mode_detail = ""  # what the last look found, in words
        self.shard_scope = shard_scope
        if shard_scope is not None and recording_rules:
            recording_rules = False
            self.mode, self.mode_detail = MODE_RAW, (f"per-shard reads (series labelled {shard_scope.label}) use the "
                                                     "raw series: the recording rules aggregate that label away")
        elif not recording_rules:  # never looked for: the raw series, always
            self.mode, self.mode_detail = MODE_RAW, "recording rules not looked for"
        self.recording_rules = recording_rules
        # [degradation] (signals/prom_degradation.py): what to ask for, set by the detect loop from the policy; the
        # fleet's peers per GPU model as Prometheus computed them at the last full read (None: never asked)
        self.degradation_plan: prom_degradation.DegradationPlan | None = None
        self.fleet_peers: dict[str, PeerStats] | None = None
        self._peers_at = -math.inf  # when fleet_peers were asked for (monotonic: a clock step does not freeze them)
        self.degradation_error = ""  # why the last degradation query failed ("" when it did not)
        # [network] prometheus (signals/prom_nic.py): the sysfs counters to ask node_exporter's series for (None:
        # no query), set by the detect loop from the policy; each full read's NIC readings per node
        self.network_counters: tuple[str, ...] | None = None
        self.network_readings: dict[str, NetworkReadings] = {}
        self.network_error = ""  # why the last network query failed ("" when it did not)
        # the fast path may ask while a full read runs (the detect loop polls during it): what both change
        self._state_lock = threading.Lock()

    @property
    def timeout_s(self) -> float:
        if self.query_timeout_s is not None:
            return self.query_timeout_s
        return QUERY_TIMEOUT_BASE_S + QUERY_TIMEOUT_PER_NODE_S * self.nodes_known()

    @property
    def answer_cap(self) -> int:
        """The most bytes one answer may have once decompressed."""
        if self.max_bytes is not None:
            return self.max_bytes
        return ANSWER_BASE_BYTES + ANSWER_PER_NODE_BYTES * self.nodes_known()

    def nodes_known(self) -> int:
        """The GPU nodes a query answers for: the last full read's, or the fleet's before it (the informer's),
        counted at most every FLEET_SIZE_EVERY_S (the fast path asks every second; counting 5,000 Nodes' GPU
        resources each time was a tenth of the controller's CPU)."""
        if self.fleet_size is not None and time.monotonic() - self._fleet_counted_at >= FLEET_SIZE_EVERY_S:
            try:
                self._fleet_known = self.fleet_size()
                self._fleet_counted_at = time.monotonic()
            except Exception:  # a timeout is never worth failing a read for
                log.exception("fleet size for the Prometheus query timeout failed; using the nodes seen")
        return max(self.nodes_seen, self._fleet_known)

    def read(self, nodes: Sequence[str] = ()) -> list[NodeReadings]:
        """Every node's readings; with ``nodes``, only theirs (the fast path's follow-up: a small answer),
        and a node Prometheus has nothing for is left out instead of unknown (the next full read says).
        Each such node is selected by the label its fault series carried (``Hostname``, else a fallback)."""
        if not nodes:
            return self._read("", ())
        by_label: dict[str, list[str]] = {}
        with self._state_lock:
            for node in nodes:
                by_label.setdefault(self._named_by.get(node, self.node_labels[0]), []).append(node)
        return [r for label, group in by_label.items() for r in self._read(node_matcher(label, group), group)]

    @property
    def recorded(self) -> bool:
        return self.mode == MODE_RECORDED

    def detect_mode(self) -> str:
        """Look for the recording rules (their info series, of our version and carrying our node labels): read
        their output while they are there, aggregate the raw series when not. Looked for at the first full read
        and every MODE_CHECK_EVERY after (rules installed or removed later are followed); a change is logged. A
        failed look keeps the mode (the read's own queries say what is wrong)."""
        try:
            found, _ = self._query(RULES_INFO, "recording rules")
        except PrometheusError as exc:
            if not self.mode:
                self.mode, self.mode_detail = MODE_RAW, f"recording rules not looked for: {exc}"
            return self.mode
        infos = [dict(point[0]) for item in found if (point := _point(item)) is not None]
        ours = [i for i in infos if i.get("version") == RULES_VERSION
                and set(self.node_labels) <= set(i.get("node_labels", "").split(","))]
        if ours:
            mode, detail = MODE_RECORDED, (f"reading the output of gpuremediate's recording rules (version "
                                           f"{RULES_VERSION}, evaluated every {ours[0].get('interval', '?')})")
        elif infos:
            other = infos[0]
            mode, detail = MODE_RAW, (f"gpuremediate recording rules found but not usable (version "
                                      f"{other.get('version', '?')}, node labels {other.get('node_labels', '?')}; "
                                      f"this controller needs version {RULES_VERSION} with "
                                      f"{','.join(self.node_labels)}): aggregating the raw series")
        else:
            mode, detail = MODE_RAW, ("no gpuremediate recording rules in Prometheus: aggregating the raw series at "
                                      "every read (docs/operations.md: the recording rules)")
        if mode != self.mode or detail != self.mode_detail:
            log.info("Prometheus source mode", extra={"mode": mode, "detail": detail})
        self.mode, self.mode_detail = mode, detail
        return mode

    def _read(self, matcher: str, nodes: Sequence[str]) -> list[NodeReadings]:
        if self.recording_rules and not nodes and (not self.mode or self.reads % MODE_CHECK_EVERY == 0):
            self.detect_mode()
        recorded = self.recorded
        held = self._held()
        if held is not None and not held:
            return []  # no shard held: nothing of ours to ask for (an empty matcher would select the fleet)
        matcher, mine = self._scoped(matcher, held)
        plan = None if nodes else self.degradation_plan  # the fast path's follow-up reads hard faults only
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="prometheus") as pool:  # evaluated side by side
            asked = pool.submit(self._query, freshness_query(self.node_labels, matcher=matcher, recorded=recorded),
                                "freshness")
            degraded = pool.submit(self._degradation, plan, mine) if plan is not None else None
            counters = None if nodes else self.network_counters
            network = pool.submit(self._network_query, counters) if counters is not None else None
            values, eval_time = self._query(policy_query(self.node_labels, matcher=matcher, recorded=recorded),
                                            "readings")
            stamps, _ = asked.result()
            extra = degraded.result() if degraded is not None else []
            network_samples = network.result() if network is not None else None
        raw: dict[str, list[Sample]] = {}
        for sample in _drain_samples(values):  # the decoded answer is freed as it is read: a lower peak
            if (node := self._node_of(sample.label)) and mine(node):
                raw.setdefault(node, []).append(sample)
        self._remember_faults(raw, whole=not nodes)
        self._refresh_identity({node for node, got in raw.items() if any(s.name not in DENSE_METRICS for s in got)},
                               fleet=not nodes, mine=mine, scope=self._scope_matcher(held))
        for sample in extra:  # per-GPU degradation fields: values, not faults (remembered or not, above)
            if (node := self._node_of(sample.label)) and node in raw:
                raw[node].append(sample)
        newest = self._newest(stamps, mine)
        found = sorted(set(raw) | set(newest))
        readings = []
        for node in found:
            samples = [merged for sample in raw.pop(node, ()) for merged in self._with_identity(node, sample)]
            readings.append(self._node_readings(node, samples, newest.get(node), eval_time))
        if nodes:
            return readings
        if network_samples is not None:
            ok = {r.node for r in readings if r.status != SOURCE_UNKNOWN}
            self.network_readings = prom_nic.network_readings(network_samples, self.node_labels, ok.__contains__)
        readings += self._missing(set(found), eval_time, mine if held is not None else None)
        self.nodes_seen = len(readings)
        self.reads += 1
        return readings

    def _degradation(self, plan: prom_degradation.DegradationPlan,
                     mine: Callable[[str], bool] = lambda _node: True) -> list[Sample]:
        """The nodes query, then the marked nodes' fields (and the fleet's peers while there are slow suspects,
        kept in ``fleet_peers``): per-GPU samples for the readings. A failed query is logged (once until it
        changes) and reads no degradation field: those GPUs look idle and quiet to the detector for this read."""
        full = self.reads % prom_degradation.FULL_EVERY == 0
        if self.fleet_peers is None:
            self.fleet_peers = {}  # from now on the detector's fleet peers are Prometheus' (none until asked)
        query = prom_degradation.nodes_query(plan, self.node_labels, full)
        if not query:
            return []  # trends alone: looked at every FULL_EVERY reads
        try:
            result, _ = self._query(query, "degradation")
            marked, suspects = prom_degradation.marked_nodes(_drain_samples(result), self.node_labels)
            if suspects and time.monotonic() - self._peers_at >= prom_degradation.PEERS_TTL_S:
                result, _ = self._query(prom_degradation.peers_query(plan, self.node_labels), "degradation peers")
                self.fleet_peers = prom_degradation.fleet_peers(_drain_samples(result))
                self._peers_at = time.monotonic()
            fields = self._degradation_fields(plan, {node: label for node, label in marked.items() if mine(node)})
        except PrometheusError as exc:
            if str(exc) != self.degradation_error:
                log.warning("degradation query failed; no slow-GPU, link or trend field this read",
                            extra={"error": str(exc)})
            self.degradation_error = str(exc)
            return []
        self.degradation_error = ""
        return fields

    def _network_query(self, counters: Sequence[str]) -> list[Sample] | None:
        """node_exporter's InfiniBand series (signals/prom_nic.py); None when the query failed (logged once until
        the error changes: the controller then keeps each node's NIC findings as they were)."""
        try:
            result, _ = self._query(prom_nic.network_query(self.node_labels, counters), "network")
        except PrometheusError as exc:
            if str(exc) != self.network_error:
                log.warning("network query failed; NIC findings from Prometheus stay as they were",
                            extra={"error": str(exc)})
            self.network_error = str(exc)
            self.network_readings = {}
            return None
        self.network_error = ""
        return list(_drain_samples(result))

    def _degradation_fields(self, plan: prom_degradation.DegradationPlan, marked: Mapping[str, str]) -> list[Sample]:
        if len(marked) > prom_degradation.MAX_FIELD_NODES:
            log.warning("more nodes to read degradation fields for than one read brings; the rest wait",
                        extra={"nodes": len(marked), "read": prom_degradation.MAX_FIELD_NODES})
        by_label: dict[str, list[str]] = {}
        for node in sorted(marked)[:prom_degradation.MAX_FIELD_NODES]:
            by_label.setdefault(marked[node], []).append(node)
        samples: list[Sample] = []
        for label, group in by_label.items():
            query = prom_degradation.fields_query(plan, self.node_labels, node_matcher(label, group))
            result, _ = self._query(query, "degradation fields")
            samples += _drain_samples(result)
        return samples

    def _held(self) -> frozenset[int] | None:
        """The shards the queries select now (None: no per-shard reads, the fleet's series)."""
        return None if self.shard_scope is None else self.shard_scope.held()

    def _scope_matcher(self, held: frozenset[int] | None) -> str:
        return "" if held is None or self.shard_scope is None else self.shard_scope.matcher(held)

    def _scoped(self, matcher: str, held: frozenset[int] | None) -> tuple[str, Callable[[str], bool]]:
        """The selector's matcher with the held shards' label matcher, and which nodes of the answer are ours."""
        return and_matcher(matcher, self._scope_matcher(held)), self._keeper(held)

    def _keeper(self, held: frozenset[int] | None = None) -> Callable[[str], bool]:
        """``keep`` (and, for per-shard reads, a node of the shards ``held``), asked once per node for one answer (a
        shard's hash per series would cost more than the series)."""
        keep, scope = self.keep, self.shard_scope
        if keep is None and (held is None or scope is None):
            return lambda _node: True
        kept: dict[str, bool] = {}

        def mine(node: str) -> bool:
            answer = kept.get(node)
            if answer is None:
                answer = kept[node] = ((keep is None or keep(node))
                                       and (held is None or scope is None or scope.holds(node, held)))
            return answer

        return mine

    def changed_nodes(self) -> set[str]:
        """The fault fast path: nodes whose non-zero fault series differ from what the last read saw (a new
        XID, a DBE count that grew, a row-remap failure). One small query; ``read(nodes)`` follows for them.
        Nothing before the first full read: it reads every node anyway (and a poll during it would find every
        node with an old XID changed, and ask for all of them in one selector)."""
        self.fault_answer_s = None  # nothing asked (yet): no answer's time for the pacer to space by
        held = self._held()
        if self.reads == 0 or (held is not None and not held):
            self.fault_error = ""  # nor a failure to back off from
            return set()
        matcher, mine = self._scoped("", held)
        answered = Answered()
        try:
            values, _ = self._query(fault_query(self.node_labels, recorded=self.recorded, matcher=matcher), "fault",
                                    timeout=min(self.timeout_s, FAULT_QUERY_TIMEOUT_S), answered=answered)
        except PrometheusError as exc:  # said once: the full read reports Prometheus' trouble every cycle
            if not self.fault_error:
                log.warning("fault fast path query failed; faults wait for the next full read",
                            extra={"error": str(exc)})
            self.fault_error = str(exc)
            return set()
        self.fault_error = ""
        self.fault_answer_s = answered.seconds
        now: dict[str, set[_Fault]] = {}
        named_by: dict[str, str] = {}
        for sample in _drain_samples(values):
            if (named := self._naming_label(sample.label)) and mine(named[1]):
                now.setdefault(named[1], set()).add((sample.name, sample.labels, sample.value))
                named_by[named[1]] = named[0]
        watched = polled_metrics(self.recorded)
        with self._state_lock:
            changed = {node for node, faults in now.items()
                       if faults != {f for f in self._faults_seen.get(node, ()) if f[0] in watched}}
            self._named_by = {node: named_by[node] for node in changed}
            return changed

    def _remember_faults(self, raw: Mapping[str, list[Sample]], whole: bool) -> None:
        seen = {node: {(s.name, s.labels, s.value) for s in got if s.name not in DENSE_METRICS}
                for node, got in raw.items()}
        with self._state_lock:
            if whole:
                self._faults_seen = {node: faults for node, faults in seen.items() if faults}
            else:
                self._faults_seen.update(seen)

    def _refresh_identity(self, faulty: set[str], fleet: bool = True,
                          mine: Callable[[str], bool] = lambda _node: True, scope: str = "") -> None:
        """Every ``identity_every`` fleet reads for the fleet; at once for nodes showing a fault (their pods
        are what a drain reads next). A failed identity query keeps what was known: values still count."""
        full = fleet and self.reads % self.identity_every == 0
        nodes = () if full else tuple(sorted(faulty))[:IDENTITY_QUERY_MAX_NODES]
        if not full and not nodes:
            return
        try:
            result, _ = self._query(identity_query(self.node_labels, nodes, scope), "identity")
        except PrometheusError as e:
            log.warning("GPU identity query failed; keeping what was known", extra={"error": str(e)})
            return
        fresh: dict[tuple[str, str, str], tuple[Labels, ...]] = {}
        shared = self._shared_pairs if not full else {}  # a full read starts the shared pairs afresh
        for item in result:
            point = _point(item)
            labels = dict(point[0]) if point is not None else {}
            if (node := self._node_of(labels.get)) and mine(node):
                key = (node, labels.get("gpu", ""), labels.get("GPU_I_ID", ""))
                pairs = _workload_labels({k: labels[k] for k in IDENTITY_LABELS if labels.get(k)})
                fresh[key] = (*fresh.get(key, ()), tuple(shared.setdefault(pair, pair) for pair in pairs))
        with self._state_lock:
            self._shared_pairs = shared
            if full:
                self._identity = fresh
            else:
                self._identity = {k: v for k, v in self._identity.items() if k[0] not in nodes} | fresh

    def _with_identity(self, node: str, sample: Sample) -> list[Sample]:
        """The sample once per identity known for its GPU (several workload pods may share one GPU). The
        readings query groups by other labels than the identity's: the two sets never overlap."""
        identities = self._identity.get((node, sample.label("gpu") or "", sample.label("GPU_I_ID") or ""))
        if not identities:
            return [sample]
        return [Sample(sample.name, tuple(sorted((*sample.labels, *extra))), sample.value)
                for extra in identities]

    def _node_readings(self, node: str, samples: list[Sample], newest: float | None, eval_time: float) -> NodeReadings:
        if newest is not None and eval_time - newest > self.stale_after_s:
            return unknown(node, self.name, f"stale in Prometheus: newest sample {eval_time - newest:.0f} s old "
                                            f"(more than {self.stale_after_s:g} s)", eval_time)
        found = [r for r in dcgm.readings_from_samples(samples, node=node, source=self.name, observed_at=eval_time)
                 if r.node == node]
        if not found or not found[0].gpus:
            return unknown(node, self.name, "no GPU series of the policy for this node in Prometheus", eval_time)
        return found[0]

    def _missing(self, covered: set[str], eval_time: float,
                 asked: Callable[[str], bool] | None = None) -> list[NodeReadings]:
        """The expected nodes Prometheus had nothing for (with per-shard reads, of the shards ``asked`` for)."""
        if self.expected_nodes is None:
            return []
        label = "/".join(self.node_labels[:1]) + (f" and {self.shard_scope.label}" if self.shard_scope else "")
        reason = (f"no series for this node in Prometheus ({label} label): its exporter is not scraped, or its "
                  "target is down and the series went stale")
        return [unknown(n, self.name, reason, eval_time) for n in sorted(set(self.expected_nodes()) - covered)
                if asked is None or asked(n)]

    def _newest(self, stamps: Sequence[Any], mine: Callable[[str], bool]) -> dict[str, float]:
        newest: dict[str, float] = {}
        for item in stamps:
            point = _point(item)
            if point is None:
                continue
            labels, stamp = point
            node = self._node_of(dict(labels).get)
            if node and mine(node):
                newest[node] = max(stamp, newest.get(node, stamp))
        return newest

    def _node_of(self, label: Callable[[str], str | None]) -> str | None:
        named = self._naming_label(label)
        return named[1] if named else None

    def _naming_label(self, label: Callable[[str], str | None]) -> tuple[str, str] | None:
        """(the node label, the node) of a series: its first node label that has a value."""
        return next(((n, v) for n in self.node_labels if (v := label(n))), None)

    def _query(self, query: str, what: str, timeout: float | None = None,
               answered: Answered | None = None) -> tuple[list[Any], float]:
        timeout = self.timeout_s if timeout is None else timeout
        params = {"query": query, "timeout": f"{max(1, int(timeout * 1000))}ms"}
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params)
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            body, _ = fetch(url, timeout + 2.0, self.answer_cap, headers, self.context, answered)
        except FetchError as e:
            raise PrometheusError(f"Prometheus {what} query to {self.url} failed: {e}") from None
        return parse_query_response(body, self.clock())


def _workload_labels(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Sorted labels with the workload's pod as the exporter saw it: exported_pod/exported_namespace where
    Prometheus renamed them (honor_labels false), else pod/namespace."""
    if labels.get("exported_pod"):
        labels["pod"] = labels["exported_pod"]
        labels["namespace"] = labels.get("exported_namespace", "")
    labels.pop("exported_pod", None)
    labels.pop("exported_namespace", None)
    return tuple(sorted(labels.items()))


def parse_query_response(body: bytes, now: float) -> tuple[list[Any], float]:
    """The vector result of an instant query, and its evaluation time; PrometheusError otherwise.

    Each element is made compact as it is decoded (``_VectorDecoder``): the answer is never held as
    80,000 dicts at once, and what stays of it shares its label pairs.
    """
    data = api_data(body, PrometheusError, "Prometheus query", decode=_VectorDecoder().decode_bytes)
    if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise PrometheusError(f"expected a vector result, got {data.get('resultType')!r}")
    result = data["result"]
    times = [stamp for item in result if (stamp := _stamp(item)) is not None]
    return result, max(times) if times else now


_Point = tuple[Labels, float, float]  # one vector element: (sorted label pairs, evaluation time, value)


class _VectorDecoder:
    """JSON decoding that turns each ``{"metric": {...}, "value": [t, "v"]}`` into a ``_Point`` the moment it
    is decoded, so its dicts and lists are freed at once and their memory is reused for the next element.
    (A whole answer decoded first leaves long-lived objects scattered among 80,000 freed ones at 5,000
    nodes: the allocator keeps those arenas.) Label pairs repeated in the answer (the node's, a GPU
    index, a metric name) are one object. Anything else is decoded as json.loads would."""

    def __init__(self) -> None:
        self.pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self.decoder = json.JSONDecoder(object_pairs_hook=self._object)

    def decode_bytes(self, body: bytes) -> Any:
        return self.decoder.decode(body.decode("utf-8"))

    def _object(self, items: list[tuple[str, Any]]) -> Any:
        if len(items) == 2:
            point = self._point(dict(items))
            if point is not None:
                return point
        return dict(items)

    def _point(self, item: dict[str, Any]) -> _Point | None:
        metric, value = item.get("metric"), item.get("value")
        if not isinstance(metric, dict) or not isinstance(value, list) or len(value) != 2:
            return None
        try:
            stamp, number = float(value[0]), float(value[1])
        except (TypeError, ValueError):
            return None
        shared = self.pairs.setdefault
        labels = tuple(sorted(shared(pair, pair) for pair in ((str(k), str(v)) for k, v in metric.items())))
        return labels, stamp, number


def _stamp(item: Any) -> float | None:
    """The evaluation time of one vector element; None when it has none."""
    if isinstance(item, tuple):
        return item[1]
    value = item.get("value") if isinstance(item, dict) else None
    if not isinstance(value, list) or len(value) != 2:
        return None
    try:
        return float(value[0])
    except (TypeError, ValueError):
        return None


def _point(item: Any) -> tuple[Labels, float] | None:
    """(sorted label pairs, value) of one vector element (a decoded ``_Point``, or a dict as the JSON has it);
    None when it is not one."""
    if isinstance(item, tuple):
        return item[0], item[2]
    if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
        return None
    value = item.get("value")
    if not isinstance(value, list) or len(value) != 2:
        return None
    try:
        return tuple(sorted((str(k), str(v)) for k, v in item["metric"].items())), float(value[1])
    except (TypeError, ValueError):
        return None


def _drain_samples(result: list[Any]) -> Iterator[Sample]:
    """vector_samples, emptying ``result`` as it goes (each decoded element is dropped once read)."""
    result.reverse()
    while result:
        yield from vector_samples((result.pop(),))


def vector_samples(result: Sequence[Any]) -> list[Sample]:
    """Samples from the readings query's result, named from ``gpuremediate_metric``."""
    samples = []
    for item in result:
        point = _point(item)
        if point is None:
            continue
        labels, value = point
        names = dict(pair for pair in labels if pair[0] in (NAME_LABEL, "__name__"))
        name = names.get(NAME_LABEL) or names.get("__name__")
        if name:
            kept = tuple(pair for pair in labels if pair[0] not in (NAME_LABEL, "__name__"))
            samples.append(Sample(name=name, labels=kept, value=value, timestamp=None))
    return samples
