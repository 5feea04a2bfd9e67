"""Unknown nodes at fleet scale (issue 16): one Event per transition into unknown, one fleet Event on the
controller instead of one per node when the source fails, Event writes that never block detection, and
ordinary API errors in the cycle logged as one line (issue 17 item 10)."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate import fleet
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP, BreakerStore
from gpuremediate.actions.events import EventRecorder
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import CONFIGMAPS, EVENTS, NAMESPACES, NODES
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.signals.sources import SourceError, unknown
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NODES_N = 8
POD_NS = "gpuremediate-system"


class ScriptedSource:
    """Readings chosen by the test: per node healthy, unknown, or an XID 79; or the whole read fails (or takes
    ``delay_s``)."""

    timeout_s = 30.0

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.down: dict[str, str] = {}
        self.xid: set[str] = set()
        self.fail: str = ""
        self.delay_s = 0.0

    def read(self) -> list[NodeReadings]:
        time.sleep(self.delay_s)
        if self.fail:
            raise SourceError(self.fail)
        out = []
        for node in self.nodes:
            if node in self.down:
                out.append(unknown(node, "exporter", self.down[node], 1.0))
            else:
                gpu = GpuReading(node=node, gpu="0", uuid=f"GPU-{node}", xid=79 if node in self.xid else None)
                out.append(NodeReadings(node=node, source="exporter", status=SOURCE_OK, gpus=(gpu,)))
        return out


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KubeAPIServer, Controller, ScriptedSource]]:
    monkeypatch.setenv("POD_NAME", "gpuremediate-abc")
    monkeypatch.setenv("POD_NAMESPACE", POD_NS)
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": POD_NS}})
    names = [f"gpu-{i}" for i in range(NODES_N)]
    for name in names:
        client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}})
    src = ScriptedSource(names)
    settings = Settings(namespace=POD_NS, scrape_interval_s=0.05)
    controller = Controller(settings, loads_policy(""), client=client, source=src)
    assert controller.start_caches(timeout=20)
    yield srv, controller, src
    controller.stop()
    srv.stop()


def event_creates(srv: KubeAPIServer, reason: str, client: KubeClient) -> int:
    items = client.list(EVENTS, None)["items"]
    return sum(1 for e in items if e.get("reason") == reason)


def cycle(controller: Controller) -> None:
    controller.detect.cycle()
    assert controller.detect.events.flush(), "event writer did not drain"
    assert controller.reports.flush(10), "report writer did not drain"


def test_one_event_per_transition_into_unknown_not_per_reason(
        world: tuple[KubeAPIServer, Controller, ScriptedSource]) -> None:
    srv, controller, src = world
    cycle(controller)
    src.down["gpu-1"] = "scrape failed: timed out after 5 s"
    cycle(controller)
    src.down["gpu-1"] = "scrape failed: cannot connect"  # a new reason is not a new transition
    cycle(controller)
    cycle(controller)
    assert event_creates(srv, "GPUHealthUnknown", controller.client) == 1
    del src.down["gpu-1"]
    cycle(controller)
    assert event_creates(srv, "GPUHealthKnown", controller.client) == 1
    assert controller.metrics.unknown_nodes.value() == 0


def test_source_failure_is_one_controller_event_not_one_per_node(
        world: tuple[KubeAPIServer, Controller, ScriptedSource], caplog: pytest.LogCaptureFixture) -> None:
    srv, controller, src = world
    cycle(controller)
    src.fail = "Prometheus query to http://prom:9090 failed: timed out after 10 s"
    with caplog.at_level(logging.WARNING, logger="gpuremediate.loops.detect"):
        for _ in range(3):
            cycle(controller)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "GPU health unknown" not in said  # no line per node: the fleet's one line says it
    assert sum(1 for line in said if line.startswith("GPU health unknown on")) == 1, said
    events = controller.client.list(EVENTS, None)["items"]
    ours = [e for e in events if e.get("reportingComponent") == "gpuremediate"]
    assert [e["reason"] for e in ours if e["involvedObject"]["kind"] == "Node"] == []
    (fleet,) = [e for e in ours if e["reason"] == "GPUHealthUnknownFleet"]
    assert fleet["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": POD_NS,
                                       "name": "gpuremediate-abc"}
    assert f"on {NODES_N} of {NODES_N} GPU nodes" in fleet["message"] and "timed out after 10 s" in fleet["message"]
    assert controller.metrics.fleet_unknown.value() == 1
    assert "Prometheus query" in controller.detect.unknown["gpu-3"]  # the reason says what is true
    src.fail = ""
    cycle(controller)
    assert event_creates(srv, "GPUHealthKnownFleet", controller.client) == 1
    assert event_creates(srv, "GPUHealthKnown", controller.client) == 0
    assert controller.metrics.fleet_unknown.value() == 0


def controller_events(controller: Controller, reason: str) -> list[dict[str, Any]]:
    return [e for e in controller.client.list(EVENTS, POD_NS)["items"] if e.get("reason") == reason
            and e["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": POD_NS,
                                        "name": "gpuremediate-abc"}]


def status_banner(controller: Controller) -> list[str]:
    """The lines ``gpuremediate status`` prints above its table, from what a reader's store sees."""
    store = BreakerStore(controller.client, POD_NS, read_only=True)
    breaker = store.load()
    return fleet.safety_lines(store.latest_pause(), breaker, source=store.latest_source())


def test_a_source_never_read_since_start_is_said_loudly_within_one_cycle(
        world: tuple[KubeAPIServer, Controller, ScriptedSource]) -> None:
    """At 5,000 nodes every read of a user's Prometheus failed from the start: all nodes unknown, and nothing but a
    log line said so (issue 21). The first failed cycle now says it on the Pod, the metrics and status."""
    _, controller, src = world
    src.fail = "Prometheus readings query to http://prom:9090 failed: timed out after 12 s"
    cycle(controller)
    (event,) = controller_events(controller, "GPUHealthSourceNeverRead")
    assert event["type"] == "Warning" and "no read of the exporter source has succeeded since the controller " \
        "started (1 tried" in event["message"] and "timed out after 12 s" in event["message"]
    assert "the query timeout" not in event["message"] and "each scrape's timeout is 30 s" in event["message"]
    metrics = controller.metrics
    assert metrics.source_problem.value(problem="never-read") == 1 and metrics.fleet_unknown.value() == 1
    (banner,) = status_banner(controller)
    assert banner.startswith("GPU HEALTH SOURCE NEVER READ (since ") and "timed out after 12 s" in banner
    cm = controller.client.get(CONFIGMAPS, BREAKER_CONFIGMAP, POD_NS)
    assert json.loads(cm["data"]["source"])["problem"] == "never-read"
    assert json.loads(cm["data"]["state"])["open"] is False  # the breaker is written back as it was
    for _ in range(2):
        cycle(controller)
    assert len(controller_events(controller, "GPUHealthSourceNeverRead")) == 1  # said once, not per cycle

    src.fail = ""
    cycle(controller)
    assert len(controller_events(controller, "GPUHealthSourceRead")) == 1
    assert metrics.source_problem.value(problem="never-read") == 0 and metrics.fleet_unknown.value() == 0
    assert status_banner(controller) == []
    assert "source" not in controller.client.get(CONFIGMAPS, BREAKER_CONFIGMAP, POD_NS)["data"]
    src.fail = "down again"
    cycle(controller)  # read once: a later failure is the ordinary fleet-unknown one
    assert len(controller_events(controller, "GPUHealthSourceNeverRead")) == 1
    assert metrics.source_problem.value(problem="never-read") == 0


def test_fleet_health_is_unknown_from_start_until_the_first_read(
        world: tuple[KubeAPIServer, Controller, ScriptedSource]) -> None:
    _, controller, src = world
    src.delay_s = 0.5
    controller.detect.start()
    try:
        assert controller.metrics.fleet_unknown.value() == 1  # the first read has not answered yet
        wait_for(lambda: controller.detect.cycles >= 1, 20, "the first cycle")
        assert controller.metrics.fleet_unknown.value() == 0
    finally:
        controller.detect.stop()


def test_a_read_longer_than_the_interval_is_said_while_it_still_runs(
        world: tuple[KubeAPIServer, Controller, ScriptedSource]) -> None:
    _, controller, src = world
    controller.ctx.settings = dataclasses.replace(controller.ctx.settings, scrape_interval_s=0.3)
    src.delay_s = 1.5
    done = threading.Event()
    threading.Thread(target=lambda: (controller.detect.cycle(), done.set()), daemon=True).start()
    wait_for(lambda: controller.metrics.source_problem.value(problem="slow") == 1, 5, "the slow read said")
    assert not done.is_set()  # before the read ended
    assert done.wait(10) and controller.detect.events.flush() and controller.reports.flush(10)
    (event,) = controller_events(controller, "GPUHealthSourceSlow")
    assert re.search(r"has taken \d+\.\d s so far, longer than --scrape-interval 0\.3 s", event["message"])
    assert status_banner(controller)[0].startswith("GPU HEALTH SOURCE TOO SLOW (since ")
    src.delay_s = 0.0
    cycle(controller)
    assert controller.metrics.source_problem.value(problem="slow") == 0 and status_banner(controller) == []


def test_a_blocked_event_write_never_delays_detection(
        world: tuple[KubeAPIServer, Controller, ScriptedSource]) -> None:
    """Every GPUHealthUnknown write hangs (a storm at the client's rate limit); the XID 79 node is cordoned."""
    _, controller, src = world
    release = threading.Event()
    original = EventRecorder.node_event

    def hanging(self: EventRecorder, node: str, reason: str, *a: Any, **kw: Any) -> None:
        if reason == "GPUHealthUnknown":
            release.wait(60)
        original(self, node, reason, *a, **kw)

    src.down["gpu-2"] = "scrape failed"
    src.down["gpu-3"] = "scrape failed"
    src.xid.add("gpu-5")
    EventRecorder.node_event = hanging  # type: ignore[method-assign]
    try:
        done = threading.Event()
        threading.Thread(target=lambda: (controller.detect.cycle(), done.set()), daemon=True).start()
        assert done.wait(30), "the detect cycle waited on an Event write"
        assert controller.client.get(NODES, "gpu-5")["spec"].get("unschedulable") is True
    finally:
        release.set()
        controller.detect.events.flush(10)  # the held writes end in this test (they log: not after its capture)
        EventRecorder.node_event = original  # type: ignore[method-assign]


def test_api_error_in_the_cycle_is_one_line(world: tuple[KubeAPIServer, Controller, ScriptedSource],
                                            caplog: pytest.LogCaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _, controller, _ = world

    def broken_load() -> None:
        raise errors.TransportError("connection refused")

    monkeypatch.setattr(controller.detect.breakers, "load", broken_load)
    with caplog.at_level(logging.WARNING, logger="gpuremediate.loops.detect"):
        controller.detect.start()
        try:
            # twice: the wait between cycles, which asks the breaker about its storm look, survives it too
            wait_for(lambda: sum("detect cycle failed" in r.getMessage() for r in caplog.records) >= 2, 20,
                     "two failed detect cycles logged")
            assert controller.detect.running
        finally:
            controller.detect.stop()
    failed = [r for r in caplog.records if "detect cycle failed" in r.getMessage()]
    assert failed and all(r.exc_info is None and r.levelno == logging.WARNING for r in failed)

