"""The Prometheus input: range queries in chunks folded into change points; then a real Prometheus
(Debian's package) backfilled with ``promtool tsdb create-blocks-from openmetrics``."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from gpuremediate.policy.config import default_policy
from gpuremediate.replay.engine import replay
from gpuremediate.replay.history import HistoryError, load_scrapes
from gpuremediate.replay.prometheus import PrometheusHistory
from gpuremediate.signals.sources import POLICY_METRICS
from sim.history import FIELDS as SERIES
from sim.history import gpu_values, is_down, write_openmetrics, write_scrapes
from sim.waiting import wait_for
from tests.replay.helpers import HOUR, T0, fleet, moves, xid

STEP = 30.0


def _served(scenario: object, step: float, series: Mapping[str, str] = SERIES) -> Callable[[str], bytes]:
    """A stand-in for Prometheus's query_range over the scenario (lookback: the sample at or before), serving
    ``series`` (GpuState attribute -> metric name)."""
    calls: list[dict[str, str]] = []

    def fetch(url: str) -> bytes:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        calls.append(query)
        attr = next((a for a, name in series.items() if name == query["query"]), None)
        if attr is None:  # a series the exporter does not serve here (the per-XID counts)
            return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()
        start, end, qstep = float(query["start"]), float(query["end"]), float(query["step"])
        result = []
        for node in scenario.nodes:  # type: ignore[attr-defined]
            for gpu in range(8):
                times = [start + k * qstep for k in range(int((end - start) // qstep) + 1)]
                values = [[t, f"{gpu_values(scenario, node, gpu, t)[attr]:g}"] for t in times  # type: ignore[arg-type]
                          if not is_down(scenario, node, t)]  # type: ignore[arg-type]
                if values:
                    labels = {"__name__": query["query"], "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}",
                              "Hostname": node, "instance": f"{node}:9400", "job": "dcgm"}
                    result.append({"metric": labels, "values": values})
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()

    fetch.calls = calls  # type: ignore[attr-defined]
    return fetch


def test_chunked_range_queries_give_the_same_replay_as_saved_scrapes(tmp_path: Path) -> None:
    scenario = fleet(count=4, hours=6, faults=[xid(1, 600, 3 * HOUR)], down=[("node-2", T0 + HOUR, T0 + 2 * HOUR)])
    fetch = _served(scenario, STEP)
    source = PrometheusHistory("http://prometheus.test:9090", fetcher=fetch)
    history = source.load(T0, T0 + 6 * HOUR, STEP, chunk_s=HOUR)

    assert source.queries == len(POLICY_METRICS) * 7  # one metric, one hour per query; the 7th: the end instant
    assert all(float(q["end"]) - float(q["start"]) <= HOUR - STEP for q in fetch.calls)  # type: ignore[attr-defined]
    assert [(c.at - T0, c.readings.status) for c in history.changes["node-2"]] == [
        (0, "ok"), (HOUR, "unknown"), (2 * HOUR, "ok")]
    assert len(history.changes["node-0"]) == 1  # six hours of identical samples: one change point

    write_scrapes(scenario, tmp_path / "scrapes")
    from_scrapes = replay(load_scrapes(tmp_path / "scrapes"), default_policy())
    from_prometheus = replay(history, default_policy())
    assert moves(from_prometheus) == moves(from_scrapes) and len(from_scrapes.moves) == 4
    assert [(u.node, u.start, u.end) for u in from_prometheus.unacted] == \
        [(u.node, u.start, u.end) for u in from_scrapes.unacted]


def test_prometheus_errors_are_named() -> None:
    def refuse(url: str) -> bytes:
        return json.dumps({"status": "error", "error": "query processing would load too many samples"}).encode()

    with pytest.raises(HistoryError, match="too many samples"):
        PrometheusHistory("http://p:9090", fetcher=refuse).load(T0, T0 + HOUR, STEP)
    with pytest.raises(HistoryError, match="not JSON"):
        PrometheusHistory("http://p:9090", fetcher=lambda url: b"<html>").load(T0, T0 + HOUR, STEP)
    with pytest.raises(HistoryError, match=r"cannot connect|failed"):
        PrometheusHistory("http://127.0.0.1:9", timeout_s=2).load(T0, T0 + HOUR, STEP)


# ---- a real Prometheus ------------------------------------------------------------------------------

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.fixture
def backfilled(tmp_path: Path) -> Iterator[tuple[str, object]]:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("needs Debian's prometheus package (prometheus and promtool on PATH): apt-get install prometheus")
    scenario = fleet(count=4, hours=4, faults=[xid(1, 600, 3 * HOUR)], down=[("node-2", T0 + HOUR, T0 + 2 * HOUR)])
    om = tmp_path / "history.om"
    write_openmetrics(scenario, om, STEP)
    data = tmp_path / "tsdb"
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                   capture_output=True, timeout=300)
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=100y",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    try:
        wait_for(lambda: _ready(url) or proc.poll() is not None, timeout=120, describe="prometheus ready")
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
        yield url, scenario
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_replay_from_a_backfilled_prometheus(backfilled: tuple[str, object], tmp_path: Path) -> None:
    url, scenario = backfilled
    history = PrometheusHistory(url).load(T0, T0 + 4 * HOUR, STEP, chunk_s=HOUR)
    result = replay(history, default_policy())

    assert moves(result) == [
        (600, "node-1", "healthy", "draining", "xid-79"),
        (1200, "node-1", "draining", "repairing", "drain-complete"),
        (2100, "node-1", "repairing", "validating", "repair-complete"),
        (2700, "node-1", "validating", "healthy", "validation-passed"),
    ]
    [unknown] = [u for u in result.unacted if u.category == "unknown"]
    # Backfilled blocks carry no staleness markers: Prometheus answers with the last sample for its 5 min lookback.
    assert unknown.node == "node-2" and HOUR <= unknown.start - T0 <= HOUR + 300 + STEP
    assert 2 * HOUR <= unknown.end - T0 <= 2 * HOUR + STEP
    assert sorted(result.gpus) == scenario.nodes  # type: ignore[attr-defined]


def test_fluctuating_temperatures_keep_only_threshold_crossings() -> None:
    def noisy(url: str) -> bytes:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        if query["query"] != "DCGM_FI_DEV_GPU_TEMP":
            return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()
        start, end, step = float(query["start"]), float(query["end"]), float(query["step"])
        values = []
        for k in range(int((end - start) // step) + 1):
            at = start + k * step
            hot = T0 + 600 <= at < T0 + 1800
            values.append([at, str((91 if hot else 60) + (k % 3))])  # jitter of 0..2 C every scrape
        labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "UUID": "GPU-node-0-0", "Hostname": "node-0"}
        return json.dumps({"status": "success", "data": {"resultType": "matrix",
                                                         "result": [{"metric": labels, "values": values}]}}).encode()

    source = PrometheusHistory("http://p:9090", fetcher=noisy)
    exact = source.load(T0, T0 + HOUR, STEP)
    banded = source.load(T0, T0 + HOUR, STEP, thresholds=[80.0, 85.0, 90.0, 95.0])

    assert len(exact.changes["node-0"]) > 100
    assert [c.at - T0 for c in banded.changes["node-0"]] == [0, 600, 1800]
    assert moves(replay(banded, default_policy())) == moves(replay(exact, default_policy())) == [
        (660, "node-0", "healthy", "cordoned", "thermal"), (2100, "node-0", "cordoned", "healthy", "thermal-cleared")]
