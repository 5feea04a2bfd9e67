"""Issue 15 in the drain loop's admission: pause, domain budgets, the domain breaker, the gates and the skipped
namespaces, on a bare emulator with the controller in process. Nodes start as the detect loop leaves a fault
that waits for the budget (draining, cordoned by us, no drain started); no pods unless a test adds them, so an
admitted drain finishes at once."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuremediate import fleet
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP, PAUSE_ANNOTATION, BreakerStore
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import CONFIGMAPS, JOBS, NAMESPACES, NODES, PODS
from gpuremediate.loops import drain
from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.safety import CircuitBreaker, DomainTrip, Pause
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_RESET_GPU, KIND_XID
from gpuremediate.vocab.record import (
    OUTCOME_REPAIRED,
    Fault,
    HistoryEntry,
    NodeRecord,
    node_patch,
    record_from_node,
    start_action,
)
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "gpuremediate-system"
RACK = "topology.kubernetes.io/rack"
BASE = """
[drain]
retry_s = 0.2
[validation]
enabled = false
[budget]
max_unavailable = "100%"
"""


class HealthySource:
    """Every node's GPU healthy: the detect loop leaves the hand-made records alone."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes

    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=n, source="exporter", status=SOURCE_OK,
                             gpus=(GpuReading(node=n, gpu="0", uuid=f"GPU-{n}"),)) for n in self.nodes]


@dataclass
class World:
    srv: KubeAPIServer
    kube: KubeClient
    nodes: list[str] = field(default_factory=list)
    controllers: list[Controller] = field(default_factory=list)

    def node(self, name: str, labels: dict[str, str] | None = None, record: NodeRecord | None = None) -> None:
        self.kube.create(NODES, {"metadata": {"name": name,
                                              "labels": {"nvidia.com/gpu.present": "true", **(labels or {})}},
                                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        if record is not None:
            self.kube.patch(NODES, name, node_patch(record, unschedulable=record.cordoned_by_us))
        self.nodes.append(name)

    def start(self, policy_text: str = BASE, prometheus_url: str = "") -> Controller:
        settings = Settings(namespace=NS, scrape_interval_s=0.1, resync_s=0.3, prometheus_url=prometheus_url)
        controller = Controller(settings, loads_policy(policy_text, "test-policy"), client=self.kube,
                                source=HealthySource(self.nodes))
        assert controller.start_caches(timeout=20)
        controller.start_loops()
        self.controllers.append(controller)
        return controller

    def record(self, name: str) -> NodeRecord:
        record = record_from_node(self.kube.get(NODES, name))
        assert isinstance(record, NodeRecord), record
        return record

    def started(self, name: str) -> bool:
        record = self.record(name)
        return record.state != states.DRAINING or record.action is not None

    def blocked(self, name: str) -> str:
        record = record_from_node(self.kube.get(NODES, name))
        blocked = record.blocked if isinstance(record, NodeRecord) else None
        return f"{blocked.reason}: {blocked.detail}" if blocked else ""


@pytest.fixture
def world() -> Iterator[World]:
    srv = KubeAPIServer(node_monitor_grace_s=3600).start()  # the nodes renew no Lease: they stay Ready
    kube = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    for namespace in (NS, "gpuremediate-jobs", "default", "kube-system"):
        with contextlib.suppress(errors.AlreadyExists):
            kube.create(NAMESPACES, {"metadata": {"name": namespace}})
    made = World(srv, kube)
    try:
        yield made
    finally:
        for controller in made.controllers:
            controller.stop()
        srv.stop()


def waiting(name: str, first_seen: float = 1000.0, history: tuple[HistoryEntry, ...] = ()) -> NodeRecord:
    """A fault cordoned at once and waiting for its drain (what the detect loop leaves)."""
    fault = Fault(kind=KIND_XID, code="79", gpus=(f"GPU-{name}",), fingerprint=f"xid/GPU-{name}/79",
                  action=ACTION_RESET_GPU, first_seen=first_seen, last_seen=first_seen, message="XID 79")
    return NodeRecord(state=states.DRAINING, since=first_seen, reason="xid-79", message="XID 79", fault=fault,
                      cordoned_by_us=True, history=history)


def pod(name: str, node: str, namespace: str = "default", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running"}}


# ---- pause ----------------------------------------------------------------------------------------


def test_a_pause_holds_a_new_drain_naming_who_and_why_and_resume_lets_it_go(world: World) -> None:
    world.node("gpu-1", record=waiting("gpu-1"))
    store = BreakerStore(world.kube, NS)
    store.set_pause(Pause(paused=True, by="alice", reason="cluster upgrade", at=1000.0))
    controller = world.start()
    wait_for(lambda: world.blocked("gpu-1") == f"{drain.BLOCK_PAUSED}: paused by alice: cluster upgrade", 10,
             f"the drain held by the pause (blocked {world.blocked('gpu-1')!r})")
    assert not world.started("gpu-1")
    wait_for(lambda: controller.metrics.paused.value() == 1.0, 5, "gpuremediate_paused = 1")
    store.set_pause(Pause())
    wait_for(lambda: world.started("gpu-1"), 10, "the drain started once resumed")
    wait_for(lambda: controller.metrics.paused.value() == 0.0, 5, "gpuremediate_paused = 0")


def test_a_tools_pause_annotation_holds_new_drains(world: World) -> None:
    world.node("gpu-1", record=waiting("gpu-1"))
    BreakerStore(world.kube, NS).save(CircuitBreaker())
    world.kube.patch(CONFIGMAPS, BREAKER_CONFIGMAP, {"metadata": {"annotations": {PAUSE_ANNOTATION: "node-upgrade"}}},
                     NS)
    world.start()
    wait_for(lambda: "paused by annotation gpuremediate.io/pause: node-upgrade" in world.blocked("gpu-1"), 10,
             f"held by the annotation (blocked {world.blocked('gpu-1')!r})")
    world.kube.patch(CONFIGMAPS, BREAKER_CONFIGMAP, {"metadata": {"annotations": {PAUSE_ANNOTATION: None}}}, NS)
    wait_for(lambda: world.started("gpu-1"), 10, "the drain started once the annotation went")


# ---- failure domains ----------------------------------------------------------------------------


def test_a_rack_budget_of_one_admits_one_node_per_rack(world: World) -> None:
    world.node("r1-a", {RACK: "r1"}, waiting("r1-a", first_seen=1000.0))
    world.node("r1-b", {RACK: "r1"}, waiting("r1-b", first_seen=1001.0))
    world.node("r2-a", {RACK: "r2"}, waiting("r2-a", first_seen=1002.0))
    world.start(BASE + f'[[budget.domains]]\nlabel = "{RACK}"\nmax_unavailable = "1"\n')
    wait_for(lambda: world.started("r1-a") and world.started("r2-a"), 10, "one drain per rack")
    wait_for(lambda: "domain budget full: topology.kubernetes.io/rack=r1" in world.blocked("r1-b"), 10,
             f"the second node of rack r1 waits, naming the rack (blocked {world.blocked('r1-b')!r})")
    assert not world.started("r1-b")


def test_an_open_domain_breaker_holds_that_domain_only(world: World) -> None:
    world.node("r1-a", {RACK: "r1"}, waiting("r1-a"))
    world.node("r2-a", {RACK: "r2"}, waiting("r2-a"))
    trip = DomainTrip(RACK, "r1", "2 of 2 nodes with topology.kubernetes.io/rack=r1 faulted", 1000.0)
    BreakerStore(world.kube, NS).save(CircuitBreaker(domains=(trip,)))
    world.start()
    wait_for(lambda: world.started("r2-a"), 10, "the other rack works on")
    wait_for(lambda: "domain breaker open for topology.kubernetes.io/rack=r1" in world.blocked("r1-a"), 10,
             f"rack r1 held (blocked {world.blocked('r1-a')!r})")
    assert not world.started("r1-a")


# ---- gates --------------------------------------------------------------------------------------


def test_a_blocking_pod_holds_the_drain_until_it_goes(world: World) -> None:
    world.node("gpu-1", record=waiting("gpu-1"))
    world.kube.create(PODS, pod("checkpoint", "gpu-1", labels={"app": "checkpoint-writer"}), "default")
    world.start(BASE + '[gates]\nblocking_pod_selectors = ["app=checkpoint-writer"]\n')
    wait_for(lambda: "blocking pods running: default/checkpoint (app=checkpoint-writer)" in world.blocked("gpu-1"),
             10, f"held by the pod (blocked {world.blocked('gpu-1')!r})")
    assert not world.started("gpu-1")
    world.kube.delete(PODS, "checkpoint", "default", grace_period_seconds=0)
    wait_for(lambda: world.started("gpu-1"), 10, "the drain started once the pod went")


def test_a_node_held_by_its_own_blocking_pod_does_not_hold_younger_faults(world: World) -> None:
    world.node("old", record=waiting("old", first_seen=1000.0))
    world.node("young", record=waiting("young", first_seen=2000.0))
    world.kube.create(PODS, pod("checkpoint", "old", labels={"app": "checkpoint-writer"}), "default")
    world.start(BASE.replace('"100%"', '"1"') + '[gates]\nblocking_pod_selectors = ["app=checkpoint-writer"]\n')
    wait_for(lambda: world.started("young"), 10,
             f"the younger fault drains (young blocked {world.blocked('young')!r}, old {world.blocked('old')!r})")
    assert not world.started("old")


class Alerts(http.server.BaseHTTPRequestHandler):
    firing: list[str] = []

    def do_GET(self) -> None:
        alerts = [{"labels": {"alertname": n}, "state": "firing"} for n in self.firing]
        data = json.dumps({"status": "success", "data": {"alerts": alerts}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[tuple[str, type[Alerts]]]:
    handler = type("Handler", (Alerts,), {"firing": ["KubeNodeNotReady"]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_firing_blocking_alert_holds_drains_until_it_stops(world: World,
                                                             prometheus: tuple[str, type[Alerts]]) -> None:
    url, handler = prometheus
    world.node("gpu-1", record=waiting("gpu-1"))
    world.start(BASE + '[gates]\nblocking_alerts = ["KubeNodeNotReady"]\nalerts_ttl_s = 1\n', prometheus_url=url)
    wait_for(lambda: "blocking alert firing: KubeNodeNotReady" in world.blocked("gpu-1"), 10,
             f"held by the alert (blocked {world.blocked('gpu-1')!r})")
    handler.firing = []
    wait_for(lambda: world.started("gpu-1"), 10, "the drain started once the alert stopped")


def test_blocking_alerts_without_a_prometheus_hold_drains_and_say_why(world: World) -> None:
    world.node("gpu-1", record=waiting("gpu-1"))
    world.start(BASE + '[gates]\nblocking_alerts = ["KubeNodeNotReady"]\n')
    wait_for(lambda: "set [gates].prometheus_url or --prometheus-url" in world.blocked("gpu-1"), 10,
             f"held, saying why (blocked {world.blocked('gpu-1')!r})")


def test_the_settle_delay_holds_drains_after_a_node_returned(world: World) -> None:
    returned = HistoryEntry(at=4e9, kind=KIND_XID, code="79", action=ACTION_RESET_GPU, outcome=OUTCOME_REPAIRED)
    world.node("back", record=NodeRecord(state=states.HEALTHY, since=4e9, history=(returned,)))
    world.node("gpu-1", record=waiting("gpu-1"))
    world.start(BASE + "[gates]\nsettle_s = 600\n")
    wait_for(lambda: "settling: a node returned less than 600s ago" in world.blocked("gpu-1"), 10,
             f"held while the fleet settles (blocked {world.blocked('gpu-1')!r})")
    assert not world.started("gpu-1")


# ---- skipped namespaces ---------------------------------------------------------------------------


def test_pods_in_skipped_namespaces_are_neither_evicted_nor_waited_for(world: World) -> None:
    world.node("gpu-1", record=waiting("gpu-1"))
    world.kube.create(PODS, pod("coredns", "gpu-1", namespace="kube-system"), "kube-system")
    policy = BASE + '[drain]\nskip_namespaces = ["kube-system"]\n'
    policy = policy.replace("[drain]\nretry_s = 0.2\n", "").replace("[drain]\n", "[drain]\nretry_s = 0.2\n")
    parsed = loads_policy(policy, "explain")
    assert "Drain skipped: 1 pods in kube-system" in fleet.explain_node(world.kube, "gpu-1", parsed)
    world.start(policy)
    wait_for(lambda: world.record("gpu-1").state != states.DRAINING, 10,
             f"the drain done without the kube-system pod (blocked {world.blocked('gpu-1')!r})")
    assert world.kube.get(PODS, "coredns", "kube-system")["metadata"].get("deletionTimestamp") is None


def test_in_flight_hold_stops_a_started_drain_until_resumed(world: World) -> None:
    world.node("gpu-1", record=start_action(waiting("gpu-1"), "drain", "", 1, 1000.0, 1e6))
    world.kube.create(PODS, pod("train", "gpu-1"), "default")
    store = BreakerStore(world.kube, NS)
    store.set_pause(Pause(paused=True, by="alice", reason="upgrade"))
    world.start(BASE + '[pause]\nin_flight = "hold"\n')
    wait_for(lambda: "paused by alice: upgrade (in_flight = hold)" in world.blocked("gpu-1"), 10,
             f"the started drain held (blocked {world.blocked('gpu-1')!r})")
    assert world.kube.get(PODS, "train", "default")["metadata"].get("deletionTimestamp") is None, "evicted"
    store.set_pause(Pause())
    wait_for(lambda: world.record("gpu-1").state != states.DRAINING, 10, "the drain finished once resumed")


def test_in_flight_finish_lets_a_started_drain_go_on_while_paused(world: World) -> None:
    world.node("gpu-1", record=start_action(waiting("gpu-1"), "drain", "", 1, 1000.0, 1e6))
    BreakerStore(world.kube, NS).set_pause(Pause(paused=True, by="alice", reason="upgrade"))
    world.start()
    wait_for(lambda: world.record("gpu-1").state != states.DRAINING, 10, "the started drain finished")


def test_in_flight_hold_stops_a_repair_and_a_validation_until_resumed(world: World) -> None:
    repairing = dataclasses.replace(start_action(waiting("gpu-1"), "drain", "", 1, 1000.0, 1e6),
                                    state=states.REPAIRING, action=None)
    validating = dataclasses.replace(repairing, state=states.VALIDATING)
    world.node("gpu-1", record=repairing)
    world.node("gpu-2", record=validating)
    store = BreakerStore(world.kube, NS)
    store.set_pause(Pause(paused=True, by="alice", reason="upgrade"))
    world.start(BASE + '[pause]\nin_flight = "hold"\n')
    for name in ("gpu-1", "gpu-2"):
        wait_for(lambda n=name: "paused by alice: upgrade (in_flight = hold)" in world.blocked(n), 10,
                 f"{name}'s step held (blocked {world.blocked(name)!r})")
    assert world.kube.list(JOBS, "gpuremediate-jobs")["items"] == [], "a Job started while held"
    assert world.record("gpu-2").state == states.VALIDATING
    store.set_pause(Pause())
    wait_for(lambda: len(world.kube.list(JOBS, "gpuremediate-jobs")["items"]) == 1, 10, "the repair Job once resumed")
    wait_for(lambda: world.record("gpu-2").state != states.VALIDATING, 10, "the validation step once resumed")
    assert world.blocked("gpu-1") == ""


def test_namespace_modes_evict_one_namespace_and_wait_for_another(world: World) -> None:
    world.kube.create(NAMESPACES, {"metadata": {"name": "batch"}})
    world.node("gpu-1", record=start_action(waiting("gpu-1"), "drain", "", 1, time.time(), 3600.0))
    world.kube.create(PODS, pod("serve", "gpu-1"), "default")
    world.kube.create(PODS, pod("train", "gpu-1", namespace="batch"), "batch")
    world.start(BASE.replace("[drain]\n", '[drain]\nnamespace_modes = { batch = "AllowCompletion" }\n'))
    wait_for(lambda: world.kube.get(PODS, "serve", "default")["metadata"].get("deletionTimestamp"), 10,
             "the default namespace's pod evicted (mode Immediate)", seen=lambda: world.record("gpu-1"))
    world.kube.delete(PODS, "serve", "default", grace_period_seconds=0)  # no kubelet here finishes it
    assert world.kube.get(PODS, "train", "batch")["metadata"].get("deletionTimestamp") is None, "batch evicted"
    assert world.record("gpu-1").state == states.DRAINING  # the batch pod is waited for
    world.kube.patch(PODS, "train", {"status": {"phase": "Succeeded"}}, "batch", subresource="status")
    wait_for(lambda: world.record("gpu-1").state != states.DRAINING, 10, "the drain done once the batch pod finished")
    assert world.kube.get(PODS, "train", "batch")["metadata"].get("deletionTimestamp") is None


def test_at_the_timeout_only_delete_after_timeout_namespaces_are_deleted(world: World) -> None:
    world.kube.create(NAMESPACES, {"metadata": {"name": "batch"}})
    world.node("gpu-1", record=start_action(waiting("gpu-1"), "drain", "", 1, 1000.0, 1.0))  # timed out long ago
    world.kube.create(PODS, pod("scratch", "gpu-1", namespace="batch"), "batch")
    world.kube.create(PODS, pod("train", "gpu-1"), "default")
    modes = '[drain]\nmode = "AllowCompletion"\nnamespace_modes = { batch = "DeleteAfterTimeout" }\n'
    world.start(BASE.replace("[drain]\n", modes))
    wait_for(lambda: world.record("gpu-1").state == states.QUARANTINED, 10, "the drain failed on the default pod")
    assert world.kube.get(PODS, "scratch", "batch")["metadata"].get("deletionTimestamp"), "batch not deleted"
    assert world.kube.get(PODS, "train", "default")["metadata"].get("deletionTimestamp") is None
