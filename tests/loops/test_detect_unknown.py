"""Unknown nodes at fleet scale (issue 16): one Event per transition into unknown, one fleet Event on the
controller instead of one per node when the source fails, Event writes that never block detection, and
ordinary API errors in the cycle logged as one line (issue 17 item 10)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.events import EventRecorder
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import EVENTS, NAMESPACES, NODES
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.signals.sources import SourceError, unknown
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NODES_N = 8
POD_NS = "gpuremediate-system"


class ScriptedSource:
    """Readings chosen by the test: per node healthy, unknown, or an XID 79; or the whole read fails."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.down: dict[str, str] = {}
        self.xid: set[str] = set()
        self.fail: str = ""

    def read(self) -> list[NodeReadings]:
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
        world: tuple[KubeAPIServer, Controller, ScriptedSource]) -> None:
    srv, controller, src = world
    cycle(controller)
    src.fail = "Prometheus query to http://prom:9090 failed: timed out after 10 s"
    for _ in range(3):
        cycle(controller)
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
            wait_for(lambda: any("detect cycle failed" in r.getMessage() for r in caplog.records), 20,
                     "a failed detect cycle logged")
        finally:
            controller.detect.stop()
    failed = [r for r in caplog.records if "detect cycle failed" in r.getMessage()]
    assert failed and all(r.exc_info is None and r.levelno == logging.WARNING for r in failed)

