"""PrometheusSource against a REAL Prometheus (Debian's ``prometheus`` package; .ci/run installs it).

A small fleet is backfilled with ``promtool tsdb create-blocks-from openmetrics`` (one node fresh, one
whose samples stopped 200 s ago, as after a Prometheus restart with a dead exporter), one gpu-sim node
is scraped live and then fails its scrapes (Prometheus marks its series stale: they vanish from instant
queries). Skipped, saying why, where prometheus/promtool are not installed.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import promlab
from gpuremediate.signals import sources
from gpuremediate.signals.model import SOURCE_OK, SOURCE_UNKNOWN, NodeReadings
from gpuremediate.signals.sources import PrometheusError, PrometheusSource
from sim.gpusim import GpuSim
from sim.waiting import wait_for

BINARIES = promlab.binaries()
pytestmark = pytest.mark.skipif(
    BINARIES is None, reason="prometheus/promtool not installed (apt-get install -y prometheus; .ci/run does it)")
FIXTURES = Path(__file__).parent / "data" / "prometheus-2.42"
STALE_AFTER_S = 60.0


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[promlab.PromServer, GpuSim]]:
    assert BINARIES is not None
    prometheus, promtool = BINARIES
    workdir = tmp_path_factory.mktemp("prometheus")
    now = time.time()
    families = promlab.fleet_families({"fresh-1": (now - 300, now - 1), "old-1": (now - 500, now - 200)},
                                      gpus=2, xid={"fresh-1": (1, 79)})
    promlab.backfill(promlab.openmetrics(families), workdir / "data", promtool)
    sim = GpuSim(port=0)
    sim.add_node("live-1", gpus=2, ip="127.0.0.90")
    sim.start()
    server = promlab.PromServer(workdir, prometheus, targets=[promlab.Target(f"127.0.0.90:{sim.port}")]).start()
    yield server, sim
    server.stop()
    sim.stop()


def source(server: promlab.PromServer, **kw: Any) -> PrometheusSource:
    return PrometheusSource(server.url, stale_after_s=STALE_AFTER_S,
                            expected_nodes=lambda: ["fresh-1", "old-1", "live-1", "never-1"], **kw)


def by_node(readings: list[NodeReadings]) -> dict[str, NodeReadings]:
    assert len({r.node for r in readings}) == len(readings)
    return {r.node: r for r in readings}


def test_readings_staleness_and_attribution(prom: tuple[promlab.PromServer, GpuSim]) -> None:
    server, sim = prom
    src = source(server)
    got = wait_for(lambda: (r := by_node(src.read()))["live-1"].status == SOURCE_OK and r, 30,
                   "the live node scraped by Prometheus")
    fresh = got["fresh-1"]
    assert fresh.status == SOURCE_OK and [(g.gpu, g.xid, g.gpu_temp) for g in fresh.gpus] == [("0", None, 40.0),
                                                                                              ("1", 79, 41.0)]
    assert [(p.namespace, p.name) for p in fresh.gpus[1].pods] == [("ml", "train-fresh-1-1")]  # exported_pod
    assert fresh.gpus[0].uuid == "GPU-fresh-1-00" and fresh.meta.get("driver_version") == "570.124.06"
    assert got["old-1"].status == SOURCE_UNKNOWN and "stale in Prometheus" in got["old-1"].reason
    assert got["never-1"].status == SOURCE_UNKNOWN and "no series for this node" in got["never-1"].reason
    assert len(got["live-1"].gpus) == 2

    sim.set_down("live-1", "500")  # the target fails its scrapes: Prometheus writes staleness markers
    try:
        gone = wait_for(lambda: (r := by_node(src.read()))["live-1"].status == SOURCE_UNKNOWN and r, 30,
                        "the failed target's node to be unknown")
    finally:
        sim.set_down("live-1", None)
    assert "no series for this node" in gone["live-1"].reason
    assert gone["fresh-1"].status == SOURCE_OK


def test_error_paths_keep_what_prometheus_said(prom: tuple[promlab.PromServer, GpuSim]) -> None:
    server, _ = prom
    with pytest.raises(PrometheusError, match=r"exceeds the 200 byte limit"):
        source(server, max_bytes=200).read()
    src = source(server)
    with pytest.raises(PrometheusError, match=r"HTTP 400 Bad Request: bad_data: .*parse error"):
        src._query("sum(", "test")
    with pytest.raises(PrometheusError, match=r"HTTP 422 Unprocessable Entity: execution: "
                                              r"vector cannot contain metrics with the same labelset"):
        src._query('timestamp({__name__=~"DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_XID_ERRORS"})', "test")


def test_timestamp_of_label_replace_is_the_evaluation_time(prom: tuple[promlab.PromServer, GpuSim]) -> None:
    """Why freshness_query applies timestamp() to the raw selector (issue 16, root cause 1)."""
    server, _ = prom
    wrong = 'timestamp(label_replace(DCGM_FI_DEV_GPU_TEMP{Hostname="old-1"}, "a", "b", "", ""))'
    (item, *_) = query(server, wrong)
    assert abs(float(item["value"][1]) - float(item["value"][0])) < 1.0  # the evaluation time, not 200 s ago
    (stamp,) = [i for i in query(server, sources.freshness_query()) if i["metric"].get("Hostname") == "old-1"]
    assert float(stamp["value"][0]) - float(stamp["value"][1]) > 150


def test_canned_fixtures_have_the_real_servers_shape(prom: tuple[promlab.PromServer, GpuSim]) -> None:
    """The fixtures test_sources.py serves were recorded from this server (see data/prometheus-2.42/README.md):
    the same queries still give elements with the same label names."""
    server, _ = prom
    for name, q in (("readings.json", sources.policy_query()), ("freshness.json", sources.freshness_query()),
                    ("identity.json", sources.identity_query())):
        recorded = json.loads((FIXTURES / name).read_text())
        real = [i for i in query(server, q) if i["metric"].get("Hostname") == "fresh-1"]
        canned = [i for i in recorded["data"]["result"] if i["metric"].get("Hostname") == "fresh-1"]
        assert recorded["status"] == "success" and recorded["data"]["resultType"] == "vector"
        assert sorted(sorted(i["metric"]) for i in real) == sorted(sorted(i["metric"]) for i in canned), name


def query(server: promlab.PromServer, q: str) -> list[dict[str, Any]]:
    url = f"{server.url}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=10) as resp:
        result: list[dict[str, Any]] = json.loads(resp.read())["data"]["result"]
    return result
