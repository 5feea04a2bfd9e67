"""The Prometheus source's fault fast path: one small query for the non-zero fault series says which nodes
changed since the last read, and a read limited to those nodes follows (issue 16's fault-to-cordon goal)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpuremediate.signals import sources
from gpuremediate.signals.model import SOURCE_OK
from gpuremediate.signals.sources import PrometheusSource

NOW = 1_800_000_000.0


class FakePrometheus:
    """Answers like Prometheus for a few nodes: temperatures, an XID where set, fresh timestamps; a node
    matcher (``Hostname=~"..."``) limits the answer as Prometheus would."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.xid: dict[str, int] = {}
        self.queries: list[str] = []
        self.fail = False
        self.node_label = "Hostname"  # the label the fleet's series name their node by
        self.think_s = 0.0  # before the status line: Prometheus evaluating
        self.trickle_s = 0.0  # between the headers and the body's second half: the transfer

    def answer(self, query: str) -> tuple[int, dict[str, Any]]:
        self.queries.append(query)
        if self.fail:
            return 503, {"status": "error", "errorType": "timeout", "error": "query timed out"}
        if query == sources.RULES_INFO:  # no recording rules here: the raw series
            return 200, {"status": "success", "data": {"resultType": "vector", "result": []}}
        matcher = re.search(r'(Hostname|hostname|node|kubernetes_node)=~"((?:[^"\\\\]|\\\\.)*)"', query)  # the
        # node matcher's regex, PromQL string escapes undone
        pattern = matcher.group(2).replace("\\\\", "\\") if matcher else None
        if matcher and matcher.group(1) != self.node_label:
            pattern = "$nothing"  # a label the series do not carry matches no node
        nodes = [n for n in self.nodes if pattern is None or re.fullmatch(pattern, n)]
        result: list[dict[str, Any]] = []
        for node in nodes:
            key = {self.node_label: node, "gpu": "0", "UUID": f"GPU-{node}"}
            if "timestamp(" in query:
                result.append({"metric": {self.node_label: node}, "value": [NOW, str(NOW - 5)]})
                continue
            if query.startswith("group by"):
                continue
            if node in self.xid:
                result.append({"metric": {**key, sources.NAME_LABEL: "DCGM_FI_DEV_XID_ERRORS"},
                               "value": [NOW, str(self.xid[node])]})
            if "DCGM_FI_DEV_GPU_TEMP" in query:
                result.append({"metric": {**key, sources.NAME_LABEL: "DCGM_FI_DEV_GPU_TEMP"}, "value": [NOW, "40"]})
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}


@pytest.fixture
def prom() -> Iterator[tuple[FakePrometheus, str]]:
    fake = FakePrometheus(["gpu-1", "gpu-2", "gpu-3"])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, doc = fake.answer(parse_qs(urlsplit(self.path).query)["query"][0])
            body = json.dumps(doc).encode()
            time.sleep(fake.think_s)
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:10])
            self.wfile.flush()
            time.sleep(fake.trickle_s)
            self.wfile.write(body[10:])

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield fake, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_only_nodes_whose_faults_changed_since_the_last_read_are_named(prom: tuple[FakePrometheus, str]) -> None:
    fake, url = prom
    fake.xid["gpu-3"] = 13  # an old XID, seen by the full read: sticky, not news
    src = PrometheusSource(url, clock=lambda: NOW)
    src.read()
    assert src.changed_nodes() == set()
    assert fake.queries[-1] == sources.fault_query(src.node_labels)
    assert "DCGM_FI_DEV_GPU_TEMP" not in fake.queries[-1]  # a healthy fleet answers with nothing
    fake.xid["gpu-1"] = 79
    fake.xid["gpu-3"] = 48  # a new XID on a GPU that had one
    assert src.changed_nodes() == {"gpu-1", "gpu-3"}
    got = {r.node: r for r in src.read(nodes=["gpu-1", "gpu-3"])}
    assert set(got) == {"gpu-1", "gpu-3"}  # only those asked for; none of the others is made unknown
    assert got["gpu-1"].status == SOURCE_OK and got["gpu-1"].gpus[0].xid == 79 and got["gpu-1"].gpus[0].gpu_temp == 40
    assert src.changed_nodes() == set()  # read since: no longer news


def test_a_fleet_named_by_a_fallback_label_gets_the_fast_path_too(prom: tuple[FakePrometheus, str]) -> None:
    """Series that carry ``node`` (no ``Hostname``): the limited read selects by the label that named them."""
    fake, url = prom
    fake.node_label = "node"
    src = PrometheusSource(url, clock=lambda: NOW)
    assert {r.node for r in src.read()} == {"gpu-1", "gpu-2", "gpu-3"}
    fake.xid["gpu-2"] = 79
    assert src.changed_nodes() == {"gpu-2"}
    [got] = src.read(nodes=["gpu-2"])
    assert got.node == "gpu-2" and got.status == SOURCE_OK and got.gpus[0].xid == 79
    assert any('DCGM_FI_DEV_XID_ERRORS{node=~"gpu\\\\-2", err_code!~"|0"}' in q for q in fake.queries[-3:])
    assert src.changed_nodes() == set()  # read since: no longer news


def test_a_limited_read_asks_for_its_nodes_only_and_leaves_fleet_counters_alone(
        prom: tuple[FakePrometheus, str]) -> None:
    fake, url = prom
    src = PrometheusSource(url, clock=lambda: NOW, expected_nodes=lambda: fake.nodes)
    src.read()
    reads, seen = src.reads, src.nodes_seen
    fake.queries.clear()
    src.read(nodes=["gpu-2"])
    readings_query = next(q for q in fake.queries if "DCGM_FI_DEV_GPU_TEMP" in q and "timestamp(" not in q)
    assert 'DCGM_FI_DEV_GPU_TEMP{Hostname=~"gpu\\\\-2"}' in readings_query
    assert ('(DCGM_FI_DEV_XID_ERRORS{Hostname=~"gpu\\\\-2", err_code!~"|0"} != 0) or '
            '(DCGM_FI_DEV_XID_ERRORS{Hostname=~"gpu\\\\-2", err_code=""} != 0)') in readings_query
    assert 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{Hostname=~"gpu\\\\-2"} != 0' in readings_query
    assert (src.reads, src.nodes_seen) == (reads, seen)  # timeouts and identity cadence follow full reads
    assert sources.node_matcher("Hostname", ["a.b", "c"]) == '{Hostname=~"a\\\\.b|c"}'


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_failing_fast_path_names_no_node_and_says_so_once(prom: tuple[FakePrometheus, str]) -> None:
    fake, url = prom
    src = PrometheusSource(url, clock=lambda: NOW)
    src.read()
    fake.fail = True
    records, logger = Records(), logging.getLogger(sources.__name__)
    # On the module's logger, at its own level: the root's handlers and level are whatever setup_logging left.
    level, logger.level = logger.level, logging.WARNING
    logger.addHandler(records)
    try:
        assert src.changed_nodes() == set() and src.changed_nodes() == set()
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert sum("fault fast path query failed" in m for m in records.messages) == 1
    assert "query timed out" in src.fault_error
    fake.fail = False
    src.changed_nodes()
    assert src.fault_error == ""


def test_no_fault_is_news_before_the_first_full_read(prom: tuple[FakePrometheus, str]) -> None:
    fake, url = prom
    fake.xid["gpu-1"] = 79  # an old XID: the first full read sees it like every other node
    src = PrometheusSource(url, clock=lambda: NOW)
    assert src.changed_nodes() == set() and fake.queries == []  # nothing asked, nothing to read at once
    src.read()
    fake.xid["gpu-2"] = 48
    assert src.changed_nodes() == {"gpu-2"}


def test_a_sharded_replica_makes_readings_and_fault_memory_for_its_own_nodes_only(
        prom: tuple[FakePrometheus, str]) -> None:
    """The queries are the fleet's; what is made of the answers is the shard's (``keep``): readings, the faults
    remembered for the fast path, the GPU identities, each node asked of ``keep`` once per read."""
    fake, url = prom
    asked: list[str] = []

    def keep(node: str) -> bool:
        asked.append(node)
        return node != "gpu-2"

    src = PrometheusSource(url, clock=lambda: NOW, keep=keep)
    assert {r.node for r in src.read()} == {"gpu-1", "gpu-3"}
    assert asked.count("gpu-2") == 1  # once for the read's three answers (readings, freshness, identity)
    assert {key[0] for key in src._identity} <= {"gpu-1", "gpu-3"}
    fake.xid["gpu-2"] = 79  # another shard's node
    fake.xid["gpu-3"] = 48
    assert src.changed_nodes() == {"gpu-3"}
    src.read(nodes=["gpu-3"])
    assert src.changed_nodes() == set() and "gpu-2" not in src._faults_seen


def test_the_fault_query_says_how_long_prometheus_took_to_answer_apart_from_the_transfer(
        prom: tuple[FakePrometheus, str]) -> None:
    """The pacer spaces polls by Prometheus' own time (issue 48): the status line's wait, not the body's transfer
    or its decoding here, which wait for this process's interpreter when the replica is busy."""
    fake, url = prom
    src = PrometheusSource(url, clock=lambda: NOW)
    src.read()
    assert src.fault_answer_s is None or src.fault_answer_s < 0.3
    fake.think_s, fake.trickle_s = 0.3, 0.6
    began = time.monotonic()
    src.changed_nodes()
    took = time.monotonic() - began
    assert src.fault_answer_s is not None and src.fault_answer_s >= 0.3
    assert took - src.fault_answer_s >= 0.55  # the trickled body is not Prometheus' answering time
    fake.fail = True
    fake.think_s = fake.trickle_s = 0.0
    src.changed_nodes()
    assert src.fault_error and src.fault_answer_s is None  # no answer: the pacer backs off from the failure
