"""PrometheusSource against a REAL Prometheus (Debian's ``prometheus`` package; .ci/run installs it).

A small fleet is backfilled with ``promtool tsdb create-blocks-from openmetrics`` (one node fresh, one
whose samples stopped 200 s ago, as after a Prometheus restart with a dead exporter), one gpu-sim node
is scraped live and then fails its scrapes (Prometheus marks its series stale: they vanish from instant
queries). Prometheus also evaluates gpuremediate's recording rules (every second here): the source reads
their output when it finds them (issue 21) and the raw series when told not to look. Skipped, saying why,
where prometheus/promtool are not installed.
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
from gpuremediate.signals import recording, sources
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
    rules = workdir / "gpuremediate-recording.rules.yml"
    rules.write_text(recording.rules_file(interval="1s"))
    server = promlab.PromServer(workdir, prometheus, targets=[promlab.Target(f"127.0.0.90:{sim.port}")],
                                rule_files=[rules], evaluation_interval="1s").start()
    yield server, sim
    server.stop()
    sim.stop()


def source(server: promlab.PromServer, recording_rules: bool = False, **kw: Any) -> PrometheusSource:
    return PrometheusSource(server.url, stale_after_s=STALE_AFTER_S, recording_rules=recording_rules,
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


def shown(readings: list[NodeReadings]) -> dict[str, tuple[Any, ...]]:
    """What the policy gets of each node: status, reason's start, each GPU's signals and pods."""
    return {r.node: (r.status, r.reason.split(":")[0], [(g.gpu, g.uuid, g.xid, g.ecc_dbe_volatile, g.gpu_temp,
                                                        g.memory_temp, g.pods) for g in r.gpus]) for r in readings}


def test_with_the_recording_rules_the_source_reads_their_output_and_sees_the_same(
        prom: tuple[promlab.PromServer, GpuSim]) -> None:
    server, _ = prom
    raw, recorded = source(server), source(server, recording_rules=True)
    wait_for(lambda: recorded.detect_mode() == sources.MODE_RECORDED, 30, "the rules' info series",
             seen=lambda: recorded.mode_detail)
    assert "version 1, evaluated every 1s" in recorded.mode_detail and raw.mode == sources.MODE_RAW
    wait_for(lambda: by_node(raw.read())["live-1"].status == SOURCE_OK, 30, "the live node scraped")
    # the two modes read through different queries; a rule evaluation (1 s) may lie between them: try a few
    wait_for(lambda: shown(recorded.read()) == shown(raw.read()), 10, "the same readings from both modes",
             seen=lambda: (shown(recorded.read()), shown(raw.read())))
    got = by_node(recorded.read())
    assert recorded.mode == sources.MODE_RECORDED and got["fresh-1"].gpus[1].xid == 79  # an XID held in the value
    assert got["old-1"].status == SOURCE_UNKNOWN and "stale in Prometheus" in got["old-1"].reason
    assert got["never-1"].status == SOURCE_UNKNOWN


def test_the_fast_path_sees_an_xid_in_labels_at_once_and_a_counter_after_one_evaluation(
        prom: tuple[promlab.PromServer, GpuSim]) -> None:
    """gpu-sim writes XIDs as dcgm-exporter >= 3.3 does (err_code/err_msg): Prometheus' index finds them, no
    rule in between; a DBE count is a value, which the rules aggregate, and the fast path reads their output."""
    server, sim = prom
    src, raw = source(server, recording_rules=True), source(server)
    wait_for(lambda: by_node(src.read())["live-1"].status == SOURCE_OK and src.recorded, 30, "a recorded read")
    raw.read()
    assert src.changed_nodes() == set() and raw.changed_nodes() == set()
    sim.inject("live-1", 0, "xid", 79)
    try:
        wait_for(lambda: "live-1" in src.changed_nodes(), 30, "the XID in the fast path")
        wait_for(lambda: "live-1" in raw.changed_nodes(), 30, "the XID in the raw fast path")
        raw.read()
        (xid_only,) = src.read(nodes=["live-1"])
        assert xid_only.gpus[0].xid == 79
        sim.inject("live-1", 1, "dbe", 3)
        wait_for(lambda: "live-1" in src.changed_nodes(), 30, "the DBE count in the fast path")
        (both,) = src.read(nodes=["live-1"])
        assert both.gpus[0].xid == 79 and both.gpus[1].ecc_dbe_volatile == 3
        # without the rules a DBE count is not polled for (a read of every ECC series a second): the full read has it
        assert raw.changed_nodes() == set() and by_node(raw.read())["live-1"].gpus[1].ecc_dbe_volatile == 3
        answer = query(server, sources.fault_query(src.node_labels, recorded=True))
        assert {i["metric"].get("__name__", "") for i in answer} == {"", sources.RECORDED_FAULTS}
    finally:
        sim.reset_gpu("live-1", 0)
        sim.reset_gpu("live-1", 1)


def test_without_the_rules_the_source_says_it_aggregates_the_raw_series(
        prom: tuple[promlab.PromServer, GpuSim], tmp_path: Path) -> None:
    assert BINARIES is not None
    with promlab.PromServer(tmp_path, BINARIES[0]) as bare:
        src = PrometheusSource(bare.url)
        assert src.detect_mode() == sources.MODE_RAW and "no gpuremediate recording rules" in src.mode_detail
    server, _ = prom
    other = PrometheusSource(server.url, node_label="kubernetes_host")  # rules made for other node labels
    assert other.detect_mode() == sources.MODE_RAW and "not usable" in other.mode_detail
