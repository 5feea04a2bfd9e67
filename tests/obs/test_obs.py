import io
import json
import logging
import urllib.error
import urllib.request

import pytest

from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.obs.log import setup_logging
from gpuremediate.obs.metrics import Counter, Gauge, Histogram, Registry
from gpuremediate.obs.server import ObservabilityServer


def test_counter_gauge_histogram_render_prometheus_text() -> None:
    reg = Registry()
    c = Counter("t_total", "A counter.", ["k"])
    g = Gauge("g", "A gauge.", ["state"])
    h = Histogram("d_seconds", "A histogram.", buckets=(1, 10))
    for m in (c, g, h):
        reg.register(m)
    c.inc(k='a"b\\c\nd')
    c.inc(2, k='a"b\\c\nd')
    g.set(3, state="healthy")
    h.observe(0.5)
    h.observe(5)
    text = reg.render()
    assert '# TYPE t_total counter\nt_total{k="a\\"b\\\\c\\nd"} 3\n' in text
    assert 'g{state="healthy"} 3' in text
    assert 'd_seconds_bucket{le="1"} 1' in text
    assert 'd_seconds_bucket{le="10"} 2' in text
    assert 'd_seconds_bucket{le="+Inf"} 2' in text
    assert "d_seconds_sum 5.5" in text and "d_seconds_count 2" in text


def test_metric_misuse_is_an_error() -> None:
    c = Counter("x_total", "x", ["a"])
    with pytest.raises(ValueError, match="labels"):
        c.inc(b="1")
    with pytest.raises(ValueError, match="only goes up"):
        c.inc(-1, a="1")
    reg = Registry()
    reg.register(c)
    with pytest.raises(ValueError, match="twice"):
        reg.register(Counter("x_total", "x"))


def test_gauge_replace_all_drops_absent_series() -> None:
    g = Gauge("nodes", "n", ["state"])
    g.set(2, state="draining")
    g.replace_all([({"state": "healthy"}, 4)])
    assert g.value(state="draining") == 0
    assert 'nodes{state="draining"}' not in "\n".join(g.render())


def test_design_metric_names_are_all_registered() -> None:
    text = ControllerMetrics().registry.render()
    for name in (
        "nodes", "transitions_total", "faults_total", "evictions_total", "drain_seconds", "remediation_seconds",
        "budget_in_use", "budget_limit", "circuit_breaker_open", "scrape_seconds", "scrape_errors_total",
        "leader", "blocked_nodes", "dry_run",
    ):
        assert f"# TYPE gpuremediate_{name} " in text


def test_server_serves_metrics_and_probes() -> None:
    m = ControllerMetrics()
    m.leader.set(1)
    state = {"ready": (False, "caches not synced")}
    srv = ObservabilityServer(m.registry, ready=lambda: state["ready"], host="127.0.0.1", port=0).start()
    base = f"http://127.0.0.1:{srv.port}"
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert "gpuremediate_leader 1" in resp.read().decode()
        with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
            assert resp.status == 200
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/readyz", timeout=5)
        assert err.value.code == 503 and b"caches not synced" in err.value.read()
        state["ready"] = (True, "ok")
        with urllib.request.urlopen(base + "/readyz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        srv.stop()


def test_json_logs_carry_context() -> None:
    out = io.StringIO()
    setup_logging("json", "info", stream=out)
    logging.getLogger("gpuremediate.test").info("node cordoned", extra={"node": "gpu-1", "reason": "xid-79"})
    doc = json.loads(out.getvalue().strip().splitlines()[-1])
    assert doc["msg"] == "node cordoned" and doc["node"] == "gpu-1" and doc["reason"] == "xid-79"
    with pytest.raises(ValueError, match="log-format"):
        setup_logging("yaml")
    logging.getLogger().handlers.clear()
