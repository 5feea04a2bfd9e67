"""Sources: ExporterSource against gpu-sim pods in the emulated cluster; PrometheusSource against a canned API."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.errors import TransportError
from gpuremediate.kube.resources import NAMESPACES, PODS
from gpuremediate.signals import exposition, prom_nic, sources
from gpuremediate.signals.model import SOURCE_OK, SOURCE_UNKNOWN, NodeReadings
from gpuremediate.signals.sources import ExporterSource, PrometheusError, PrometheusSource, SourceError
from sim.gpusim import GpuSim
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "gpu-operator"
SELECTOR = "app=nvidia-dcgm-exporter"
REAL_SCRAPE = Path("/work/shared/data/dcgm-exporter/scrape-A100-vgpu-xid-labels.prom")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, bool, str]] = []
        self.lock = threading.Lock()

    def scrape(self, node: str, seconds: float, ok: bool, reason: str) -> None:
        with self.lock:
            self.calls.append((node, seconds, ok, reason))


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[KubeAPIServer, KubeClient]]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    client.create(NAMESPACES, {"metadata": {"name": NS}})
    yield srv, client
    srv.stop()


@pytest.fixture
def sim() -> Iterator[GpuSim]:
    s = GpuSim(port=0)
    for i in (1, 2, 3):
        s.add_node(f"gpu-node-{i}", gpus=8 if i != 3 else 2, ip=f"127.0.0.{20 + i}")
    s.start()
    yield s
    s.stop()


STARTED: list[ExporterSource] = []  # each owns a pod informer: stopped after its test


@pytest.fixture
def client(cluster: tuple[KubeAPIServer, KubeClient]) -> Iterator[KubeClient]:
    _, c = cluster
    yield c
    while STARTED:
        STARTED.pop().stop()
    for pod in c.list(PODS, NS)["items"]:
        c.delete(PODS, pod["metadata"]["name"], NS, grace_period_seconds=0)


def exporter_pod(client: KubeClient, node: str, ip: str | None, phase: str = "Running", name: str = "") -> None:
    name = name or f"dcgm-exporter-{node}"
    body = {"metadata": {"name": name, "labels": {"app": "nvidia-dcgm-exporter"}},
            "spec": {"nodeName": node, "containers": [{"name": "exporter", "image": "gpu-sim"}]}}
    client.create(PODS, body, NS)
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    client.patch(PODS, name, {"status": status}, NS, subresource="status")


def pods_for(client: KubeClient, sim: GpuSim) -> None:
    for node in sim.nodes():
        exporter_pod(client, node, sim.node(node).ip)


def source(client: KubeClient, sim: GpuSim, **kw: Any) -> ExporterSource:
    made = ExporterSource(client, port=sim.port, **kw)
    STARTED.append(made)
    return made


def by_node(readings: list[NodeReadings]) -> dict[str, NodeReadings]:
    assert len({r.node for r in readings}) == len(readings), "one reading per node"
    return {r.node: r for r in readings}


# ------------------------------------------------------------------ exporter source


def test_scrapes_every_node_through_its_pod(client: KubeClient, sim: GpuSim) -> None:
    pods_for(client, sim)
    sim.inject_xid("gpu-node-2", 5, 79)
    sim.inject_dbe("gpu-node-1", 0, 2)
    rec = Recorder()
    got = by_node(source(client, sim, observer=rec, clock=lambda: 500.0).read())
    assert set(got) == {"gpu-node-1", "gpu-node-2", "gpu-node-3"}
    assert all(r.status == SOURCE_OK and r.source == "exporter" and r.observed_at == 500.0 for r in got.values())
    assert [len(got[n].gpus) for n in sorted(got)] == [8, 8, 2]
    gpu5 = next(g for g in got["gpu-node-2"].gpus if g.gpu == "5")
    assert gpu5.xid == 79 and gpu5.uuid == sim.node("gpu-node-2").gpus[5].uuid
    gpu0 = next(g for g in got["gpu-node-1"].gpus if g.gpu == "0")
    assert gpu0.ecc_dbe_volatile == 2.0 and gpu0.row_remap_failure == 0.0
    assert got["gpu-node-1"].meta["exporter_pod"] == f"{NS}/dcgm-exporter-gpu-node-1"
    assert sorted((n, ok) for n, _, ok, _ in rec.calls) == [(f"gpu-node-{i}", True) for i in (1, 2, 3)]


def test_node_comes_from_the_pod_not_the_hostname_label(client: KubeClient, sim: GpuSim) -> None:
    exporter_pod(client, "k8s-name-of-node", sim.node("gpu-node-1").ip)
    (reading,) = source(client, sim).read()
    assert reading.node == "k8s-name-of-node" and reading.status == SOURCE_OK
    assert {g.node for g in reading.gpus} == {"k8s-name-of-node"}


def test_exporter_down_is_unknown_never_unhealthy(client: KubeClient, sim: GpuSim) -> None:
    pods_for(client, sim)
    sim.set_down("gpu-node-1", "refuse")
    sim.set_down("gpu-node-2", "500")
    rec = Recorder()
    got = by_node(source(client, sim, observer=rec).read())
    assert got["gpu-node-1"].status == SOURCE_UNKNOWN and "cannot connect" in got["gpu-node-1"].reason
    assert got["gpu-node-2"].status == SOURCE_UNKNOWN and "HTTP 500" in got["gpu-node-2"].reason
    assert got["gpu-node-1"].gpus == () and got["gpu-node-2"].gpus == ()
    assert got["gpu-node-3"].status == SOURCE_OK
    assert {n: ok for n, _, ok, _ in rec.calls} == {"gpu-node-1": False, "gpu-node-2": False, "gpu-node-3": True}


def test_slow_exporter_times_out_without_holding_the_others(client: KubeClient, sim: GpuSim) -> None:
    pods_for(client, sim)
    sim.set_down("gpu-node-1", "hang")
    sim.set_delay("gpu-node-2", 2.0)
    started = time.monotonic()
    got = by_node(source(client, sim, timeout_s=0.4).read())
    elapsed = time.monotonic() - started
    sim.set_down("gpu-node-1", None)
    assert elapsed < 1.5, f"scrapes ran one after another ({elapsed:.2f} s)"
    for node in ("gpu-node-1", "gpu-node-2"):
        assert got[node].status == SOURCE_UNKNOWN and "timed out after 0.4 s" in got[node].reason
    assert got["gpu-node-3"].status == SOURCE_OK


def test_oversized_scrape_is_unknown(client: KubeClient, sim: GpuSim) -> None:
    pods_for(client, sim)
    sim.set_padding("gpu-node-3", 300_000)
    got = by_node(source(client, sim, max_bytes=100_000).read())
    assert got["gpu-node-3"].status == SOURCE_UNKNOWN
    assert "exceeds the 100000 byte limit" in got["gpu-node-3"].reason
    assert got["gpu-node-1"].status == SOURCE_OK


def test_pod_not_running_missing_or_without_ip(client: KubeClient, sim: GpuSim) -> None:
    exporter_pod(client, "gpu-node-1", sim.node("gpu-node-1").ip, phase="Pending")
    exporter_pod(client, "gpu-node-2", None)
    rec = Recorder()
    src = source(client, sim, observer=rec, expected_nodes=lambda: ["gpu-node-1", "gpu-node-2", "gpu-node-9"])
    got = by_node(src.read())
    assert got["gpu-node-1"].status == SOURCE_UNKNOWN and "is Pending, not Running" in got["gpu-node-1"].reason
    assert got["gpu-node-2"].status == SOURCE_UNKNOWN and "no pod IP" in got["gpu-node-2"].reason
    assert got["gpu-node-9"].status == SOURCE_UNKNOWN and "no exporter pod" in got["gpu-node-9"].reason
    assert {n for n, _, ok, _ in rec.calls if not ok} == {"gpu-node-1", "gpu-node-2"}


def test_running_pod_wins_over_a_terminated_one(client: KubeClient, sim: GpuSim) -> None:
    ip = sim.node("gpu-node-1").ip
    exporter_pod(client, "gpu-node-1", ip, phase="Failed", name="dcgm-old")
    exporter_pod(client, "gpu-node-1", ip, phase="Running", name="dcgm-new")
    (reading,) = source(client, sim).read()
    assert reading.status == SOURCE_OK and reading.meta["exporter_pod"] == f"{NS}/dcgm-new"


def test_scrape_without_gpu_series_is_unknown(client: KubeClient) -> None:
    class Empty(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 12\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.31", 0), Empty)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        exporter_pod(client, "bare", "127.0.0.31")
        src = ExporterSource(client, port=httpd.server_address[1])
        STARTED.append(src)
        (reading,) = src.read()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert reading.status == SOURCE_UNKNOWN and "no GPU series" in reading.reason


def test_listing_failure_is_a_source_error() -> None:
    class Broken:
        def list(self, *a: Any, **kw: Any) -> dict[str, Any]:
            raise TransportError("connection refused")

    src = ExporterSource(Broken(), sync_timeout_s=0.5)  # type: ignore[arg-type]
    try:
        with pytest.raises(SourceError, match=r"cannot list exporter pods in gpu-operator "
                                              r"\(app=nvidia-dcgm-exporter\): connection refused"):
            src.read()
    finally:
        src.stop()


def test_exporter_pods_come_from_a_watch_not_a_list_per_cycle(
        cluster: tuple[KubeAPIServer, KubeClient], client: KubeClient, sim: GpuSim) -> None:
    srv, _ = cluster
    pods_for(client, sim)
    src = source(client, sim)
    assert len(src.read()) == 3
    before = [r for r in list(srv.requests) if r[3] == "pods" and r[1] == "list"]
    for _ in range(3):
        assert len(src.read()) == 3
    after = [r for r in list(srv.requests) if r[3] == "pods" and r[1] == "list"]
    assert after == before, "the exporter source listed pods again on a later cycle"
    exporter_pod(client, "gpu-node-late", sim.node("gpu-node-1").ip)  # a new pod arrives through the watch
    wait_for(lambda: {r.node for r in src.read()} >= {"gpu-node-late"}, 10, "the new exporter pod")


def test_stale_timestamped_samples_are_dropped() -> None:
    text = "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 40 1000000\nDCGM_FI_DEV_MEMORY_TEMP{gpu=\"0\"} 41\n"
    samples = exposition.parse(text, strict=False).samples
    kept = sources.fresh_samples(samples, now=1000.0 + 500, stale_after_s=120)
    assert [s.name for s in kept] == ["DCGM_FI_DEV_MEMORY_TEMP"]
    assert len(sources.fresh_samples(samples, now=1000.0 + 60, stale_after_s=120)) == 2


# ------------------------------------------------------------------ Prometheus source
# Canned answers recorded from a real Prometheus 2.42 (data/prometheus-2.42/README.md); the same shapes are
# checked against a live server in test_prometheus_real.py.

PROM_DATA = Path(__file__).parent / "data" / "prometheus-2.42"
EVAL_TIME = float(json.loads((PROM_DATA / "freshness.json").read_text())["data"]["result"][0]["value"][0])


def recorded(name: str) -> bytes:
    return (PROM_DATA / name).read_bytes()


NO_RULES = b'{"status":"success","data":{"resultType":"vector","result":[]}}'  # no recording rules: raw series


class PromHandler(BaseHTTPRequestHandler):
    """Answers the readings, freshness and identity queries from ``replies`` (by which one was asked)."""

    replies: dict[str, tuple[int, bytes]] = {}
    seen: list[tuple[str, dict[str, list[str]], Any]] = []

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        type(self).seen.append((parts.path, query, self.headers))
        text = query.get("query", [""])[0]
        kind = "freshness" if "timestamp(" in text else "identity" if text.startswith("group by") else \
            "rules" if text == sources.RULES_INFO else "network" if "node_infiniband_" in text else "readings"
        code, body = type(self).replies.get(kind) or type(self).replies["readings"]
        gzipped = "gzip" in (self.headers.get("Accept-Encoding") or "")
        if gzipped:
            body = gzip.compress(body)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture
def prom() -> Iterator[tuple[str, type[PromHandler]]]:
    handler = type("Handler", (PromHandler,), {"seen": [], "replies": {
        "readings": (200, recorded("readings.json")), "freshness": (200, recorded("freshness.json")),
        "identity": (200, recorded("identity.json")), "rules": (200, NO_RULES)}})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/prom/", handler
    httpd.shutdown()
    httpd.server_close()


def test_prometheus_readings_from_two_aggregated_queries(prom: tuple[str, type[PromHandler]]) -> None:
    url, handler = prom
    src = PrometheusSource(url, token="s3cret", expected_nodes=lambda: ["fresh-1", "old-1", "gone-1"])
    got = by_node(src.read())
    asked = [(path, q["query"][0], q["timeout"], h["Authorization"], h["Accept-Encoding"])
             for path, q, h in handler.seen]
    expected = [("/prom/api/v1/query", query, ["10000ms"], "Bearer s3cret", "gzip")
                for query in (sources.policy_query(), sources.freshness_query())]
    assert asked[0][1] == sources.RULES_INFO and src.mode == sources.MODE_RAW  # looked for the rules: none
    del handler.seen[0]
    assert sorted(asked[1:3]) == sorted(expected)  # the two are sent side by side
    assert asked[3] == ("/prom/api/v1/query", sources.identity_query(), ["10000ms"], "Bearer s3cret", "gzip")
    fresh = got["fresh-1"]
    assert fresh.status == SOURCE_OK and fresh.observed_at == EVAL_TIME
    assert [(g.gpu, g.uuid, g.xid, g.gpu_temp, g.memory_temp, g.model) for g in fresh.gpus] == [
        ("0", "GPU-fresh-1-00", None, 40.0, 45.0, "NVIDIA H100 80GB HBM3"),  # a zero is not asked for
        ("1", "GPU-fresh-1-01", 79, 41.0, 46.0, "NVIDIA H100 80GB HBM3")]
    # honor_labels false: the workload is exported_pod/exported_namespace, not the exporter's own pod
    assert [(p.namespace, p.name) for p in fresh.gpus[1].pods] == [("ml", "train-fresh-1-1")]
    assert got["old-1"].status == SOURCE_UNKNOWN
    assert got["old-1"].reason == "stale in Prometheus: newest sample 200 s old (more than 120 s)"
    assert got["gone-1"].status == SOURCE_UNKNOWN and "no series for this node in Prometheus" in got["gone-1"].reason
    src.read()
    assert handler.seen[3][1]["timeout"] == ["10012ms"]  # 10 s + 4 ms per node seen: scales with the fleet
    # identity is not asked again for the fleet, only for the node showing a fault (fresh-1's XID 79)
    assert [q["query"][0] for _, q, _ in handler.seen[5:]] == [sources.identity_query(src.node_labels, ["fresh-1"])]
    assert by_node(src.read())["fresh-1"].gpus[1].pods == fresh.gpus[1].pods


def _vector(items: list[tuple[dict[str, str], float]]) -> bytes:
    result = [{"metric": metric, "value": [EVAL_TIME, str(value)]} for metric, value in items]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_prometheus_reads_node_exporters_infiniband_series_when_asked(prom: tuple[str, type[PromHandler]]) -> None:
    """[network] prometheus: one more query per full read; its series placed on the nodes read (instance less its
    port), a node without GPU readings left out; a failed query reads nothing (the judges keep their findings)."""
    url, handler = prom
    src = PrometheusSource(url, expected_nodes=lambda: ["fresh-1", "old-1"])
    src.read()
    assert not any("node_infiniband_" in q["query"][0] for _, q, _ in handler.seen)  # not asked: no query
    port = {"device": "mlx5_0", "port": "1"}
    handler.replies["network"] = (200, _vector([
        ({"gpuremediate_metric": "node_infiniband_state_id", "instance": "fresh-1:9100", **port}, 1),
        ({"gpuremediate_metric": "node_infiniband_physical_state_id", "instance": "fresh-1:9100", **port}, 2),
        ({"gpuremediate_metric": "node_infiniband_link_downed_total", "instance": "fresh-1:9100", **port}, 4),
        ({"gpuremediate_metric": "node_infiniband_state_id", "instance": "old-1:9100", **port}, 4),  # stale node
        ({"gpuremediate_metric": "node_infiniband_state_id", "instance": "10.0.0.9:9100", **port}, 4)]))
    src.network_counters = ("link_downed",)
    src.read()
    assert [q["query"][0] for _, q, _ in handler.seen if "node_infiniband_" in q["query"][0]] == [
        prom_nic.network_query(src.node_labels, ("link_downed",))]
    assert list(src.network_readings) == ["fresh-1"]
    got = src.network_readings["fresh-1"].nics[0].ports[0]
    assert (got.name, got.state, got.phys_state, got.counters) == ("mlx5_0/1", "DOWN", "Polling", {"link_downed": 4})
    handler.replies["network"] = (503, b'{"status":"error","errorType":"unavailable","error":"overloaded"}')
    src.read()
    assert src.network_readings == {} and "overloaded" in src.network_error
    assert by_node(src.read())["fresh-1"].status == SOURCE_OK  # the GPU readings are not the network query's


def test_prometheus_query_timeout_is_its_own(prom: tuple[str, type[PromHandler]]) -> None:
    url, handler = prom
    PrometheusSource(url, timeout_s=42).read()
    assert {q["timeout"][0] for _, q, _ in handler.seen} == {"42000ms"}


def test_prometheus_first_read_is_sized_for_the_fleet_the_informer_shows(prom: tuple[str, type[PromHandler]],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any read succeeded no node was seen: sized for none, the first read at 5,000 nodes had 10 s and
    every read timed out, for ever (issue 21). The Node informer's count sizes it from the start."""
    url, handler = prom
    fleet, counted = [5000], []
    src = PrometheusSource(url, fleet_size=lambda: counted.append(1) or fleet[0])
    assert src.timeout_s == 30.0
    src.read()
    assert {q["timeout"][0] for _, q, _ in handler.seen} == {"30000ms"}
    assert len(counted) == 1  # counted once for all the read's queries (the fast path asks every second)
    fleet[0] = 0  # the informer lost its nodes: the nodes the last read saw still count
    monkeypatch.setattr(sources, "FLEET_SIZE_EVERY_S", 0.0)
    assert src.timeout_s == 10.0 + 0.004 * src.nodes_seen and len(counted) == 2


def test_prometheus_node_label_choice(prom: tuple[str, type[PromHandler]]) -> None:
    url, handler = prom

    def item(labels: dict[str, str], value: str) -> dict[str, Any]:
        return {"metric": {"gpuremediate_metric": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", **labels},
                "value": [100.0, value]}

    doc = {"status": "success", "data": {"resultType": "vector", "result": [
        item({"UUID": "GPU-1", "kubernetes_node": "k-1", "Hostname": "pod-hostname"}, "71"),
        item({"UUID": "GPU-2", "node": "n-2"}, "50"),
        item({"UUID": "GPU-3"}, "50"),
    ]}}
    empty = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
    handler.replies = {"readings": (200, json.dumps(doc).encode()), "freshness": (200, empty), "identity": (200, empty)}
    assert set(by_node(PrometheusSource(url).read())) == {"pod-hostname", "n-2"}
    src = PrometheusSource(url, node_label="kubernetes_node")
    got = by_node(src.read())
    assert set(got) == {"k-1", "n-2"} and got["k-1"].gpus[0].gpu_temp == 71.0
    assert any(q["query"][0].startswith("label_replace(max by (kubernetes_node, Hostname, hostname, node, gpu,")
               for _, q, _ in handler.seen[-3:])


@pytest.mark.parametrize(
    ("code", "body", "message"),
    [
        (400, recorded("error-400-parse.json"),
         r"readings query to .* failed: HTTP 400 Bad Request: bad_data: invalid parameter \"query\": 1:5: parse error"),
        (422, recorded("error-422-execution.json"),
         "HTTP 422 Unprocessable Entity: execution: vector cannot contain metrics with the same labelset"),
        (503, b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}',
         "HTTP 503 Service Unavailable: timeout: query timed out in expression evaluation"),
        (200, b'{"status":"error","errorType":"timeout","error":"query timed out"}', "timeout: query timed out"),
        (200, b"<html>proxy</html>", "not JSON"),
        (200, b'{"status":"success","data":{"resultType":"matrix","result":[]}}', "expected a vector result"),
        (502, b"<html>bad gateway</html>", "HTTP 502 Bad Gateway: <html>bad gateway</html>"),
    ],
)
def test_prometheus_errors_are_clear(
    prom: tuple[str, type[PromHandler]], code: int, body: bytes, message: str
) -> None:
    url, handler = prom
    handler.replies = {"readings": (code, body)}
    with pytest.raises(PrometheusError, match=message):
        PrometheusSource(url).read()


def test_prometheus_response_size_cap(prom: tuple[str, type[PromHandler]]) -> None:
    url, _ = prom
    with pytest.raises(PrometheusError, match="exceeds the 1000 byte limit once decompressed"):
        PrometheusSource(url, max_bytes=1000).read()  # readings.json gzips below 1000 bytes, inflates above
    assert PrometheusSource(url, max_bytes=20_000).read()


def test_prometheus_answer_cap_scales_with_the_fleet(prom: tuple[str, type[PromHandler]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed 64 MiB refused the identity answer (about 2.6 KB a node) from about 25,000 nodes on: by default
    the cap grows with the fleet, as the query timeout does; --prometheus-max-bytes fixes it."""
    url, _ = prom
    assert PrometheusSource(url, fleet_size=lambda: 5000).answer_cap == 64 * 1024 * 1024 + 5000 * 8 * 1024
    assert PrometheusSource(url, max_bytes=4096, fleet_size=lambda: 5000).answer_cap == 4096
    monkeypatch.setattr(sources, "ANSWER_BASE_BYTES", 1000)
    monkeypatch.setattr(sources, "ANSWER_PER_NODE_BYTES", 1000)
    with pytest.raises(PrometheusError, match="exceeds the 1000 byte limit once decompressed"):
        PrometheusSource(url, fleet_size=lambda: 0).read()
    assert PrometheusSource(url, fleet_size=lambda: 20).read()  # 21,000 bytes: readings.json fits


def test_prometheus_unreachable_and_bad_url() -> None:
    with pytest.raises(PrometheusError, match="failed: cannot connect"):
        PrometheusSource("http://127.0.0.1:1", timeout_s=1).read()
    with pytest.raises(ValueError, match="must be http"):
        PrometheusSource("prometheus:9090")
    with pytest.raises(ValueError, match="must be > 0"):
        PrometheusSource("http://p:9090", max_bytes=0)
