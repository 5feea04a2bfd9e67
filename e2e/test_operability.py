"""Operability scenarios (issue 15): pause and resume, a rack budget, a domain breaker, a blocking pod, and a
webhook notification, end to end with the controller as a subprocess.

Run: ``python -m pytest e2e/test_operability.py -x -q``.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.harness import SYSTEM_NS, WORKLOAD_NS, Cluster
from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.kube.resources import PODS, SECRETS

RACK = "topology.kubernetes.io/rack"
NO_FLEET_BREAKER = {"threshold_percent": 100, "window_s": 600}  # only the domain breakers here


@pytest.fixture(autouse=True)
def clean_controller_log(cluster: Cluster) -> Iterator[None]:
    """Every scenario ends with a clean SIGTERM shutdown and no traceback in the controller's log."""
    yield
    cluster.stop_controller()
    assert cluster.log_problems() == []


def blocked(cluster: Cluster, node: str) -> str:
    rec = cluster.record(node)
    return f"{rec.blocked.reason}: {rec.blocked.detail}" if rec is not None and rec.blocked is not None else ""


def repaired(cluster: Cluster, node: str, timeout: float = 30) -> list[str]:
    """Wait until the node is back healthy with a repair in its history; the history's outcomes."""
    def back() -> list[str]:
        rec = cluster.record(node)
        return [h.outcome for h in rec.history] if rec is not None and rec.state == "healthy" else []

    return cluster.wait(back, timeout, f"{node} repaired and healthy", seen=lambda: cluster.summary(node))


def test_pause_stops_a_new_fault_from_draining_and_resume_lets_it_go(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    cluster.workload("train", node)
    cluster.start_controller()
    paused = cluster.cli("pause", "--reason", "control-plane upgrade", "--by", "e2e-operator")
    assert paused.returncode == 0 and "paused by e2e-operator" in paused.stdout, (paused.stdout, paused.stderr)
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_paused") == 1, 5, "gpuremediate_paused = 1")
    cluster.inject(node, 0, "dbe", 1)
    cluster.wait(lambda: "paused by e2e-operator: control-plane upgrade" in blocked(cluster, node), 5,
                 f"{node}'s fault held by the pause", seen=lambda: cluster.summary(node))
    cluster.holds(lambda: cluster.state(node) == "healthy" and not cluster.unschedulable(node)
                  and cluster.evicted() == set(), 1.0, f"{node} untouched while paused",
                  seen=lambda: cluster.summary(node))
    status = cluster.cli("status")
    assert status.returncode == 0 and status.stdout.startswith("PAUSED by e2e-operator"), status.stdout
    resumed = cluster.cli("resume")
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, (resumed.stdout, resumed.stderr)
    assert repaired(cluster, node) == ["repaired"]
    assert cluster.evicted() == {f"{WORKLOAD_NS}/train"}
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_paused") == 0, 5, "gpuremediate_paused = 0")


def test_a_rack_budget_of_one_drains_one_node_per_rack(cluster: Cluster) -> None:
    r1a, r1b, r2a, r2b = cluster.nodes[:4]
    for node, rack in ((r1a, "r1"), (r1b, "r1"), (r2a, "r2"), (r2b, "r2")):
        cluster.set_label(node, RACK, rack)
    cluster.workload("held", r1a, labels={"app": "held"})
    cluster.pdb("held", {"app": "held"}, min_available=1)  # r1a's drain stays in progress: its rack is full
    cluster.workload("w-r1b", r1b)
    cluster.workload("w-r2a", r2a)
    cluster.start_controller({"budget": {"max_unavailable": "4", "domains": [{"label": RACK, "max_unavailable": "1"}]},
                              "breaker": {"enabled": False}})
    cluster.inject(r1a, 0, "dbe", 1)
    cluster.wait(lambda: blocked(cluster, r1a).startswith("pdb"), 10, f"{r1a} draining, held by its PDB",
                 seen=lambda: cluster.summary(r1a))
    cluster.inject(r1b, 0, "dbe", 1)
    cluster.inject(r2a, 0, "dbe", 1)
    assert repaired(cluster, r2a), f"{r2a} repaired: another rack is admitted"
    cluster.wait(lambda: f"domain budget full: {RACK}=r1" in blocked(cluster, r1b), 5,
                 f"{r1b} waits for its rack", seen=lambda: cluster.summary(r1b))
    cluster.holds(lambda: f"{WORKLOAD_NS}/w-r1b" not in cluster.evicted(), 1.0, f"{r1b} not drained",
                  seen=lambda: cluster.summary(r1b))
    cluster.set_pdb_min_available("held", 0)
    assert repaired(cluster, r1a)
    assert repaired(cluster, r1b), f"{r1b} drained once its rack had room"


def test_a_domain_breaker_opens_on_clustered_faults_and_another_domain_works(cluster: Cluster) -> None:
    r1a, r1b, r2a, r2b = cluster.nodes[:4]
    for node, rack in ((r1a, "r1"), (r1b, "r1"), (r2a, "r2"), (r2b, "r2")):
        cluster.set_label(node, RACK, rack)
    cluster.start_controller({"budget": {"max_unavailable": "4"},
                              "breaker": {**NO_FLEET_BREAKER, "domain_labels": [RACK], "domain_threshold_percent": 50,
                                          "domain_min_nodes": 2}})
    cluster.inject(r1a, 0, "dbe", 1)
    cluster.wait(lambda: cluster.unschedulable(r1a), 5, f"{r1a}'s fault acted on")
    cluster.inject(r1b, 0, "dbe", 1)  # 2 of 2 in rack r1: its breaker opens, r1b is held
    cluster.wait(lambda: f"domain breaker open for {RACK}=r1" in blocked(cluster, r1b), 5,
                 f"{r1b} held by its rack's breaker", seen=lambda: cluster.summary(r1b))
    event = cluster.wait_event(r1b, "GPURemediationDomainBreakerOpen", f"{RACK}=r1")
    assert "common label" in event["message"], event["message"]
    cluster.wait(lambda: cluster.metrics().value("gpuremediate_domain_breaker_open") == 1, 5, "one domain open")
    cluster.inject(r2a, 0, "dbe", 1)
    assert repaired(cluster, r2a), f"{r2a} repaired: rack r2 works on"
    assert cluster.state(r1b) == "healthy" and not cluster.unschedulable(r1b)
    status = cluster.cli("breaker", "status")
    assert f"domain breaker open for {RACK}=r1" in status.stdout, status.stdout
    assert cluster.cli("breaker", "reset").returncode == 0
    assert repaired(cluster, r1b), f"{r1b} repaired after the reset"


def test_a_blocking_pod_holds_a_drain_until_it_goes(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    cluster.workload("checkpoint", node, labels={"app": "checkpoint-writer"})
    cluster.workload("train", node)
    cluster.start_controller({"gates": {"blocking_pod_selectors": ["app=checkpoint-writer"]}})
    cluster.inject(node, 0, "dbe", 1)
    cluster.wait(lambda: f"blocking pods running: {WORKLOAD_NS}/checkpoint" in blocked(cluster, node), 5,
                 f"{node}'s drain held by the checkpoint pod", seen=lambda: cluster.summary(node))
    cluster.holds(lambda: cluster.evicted() == set(), 1.0, "nothing evicted while the blocking pod runs")
    explained = cluster.cli("explain", node)
    assert "blocking pods running" in explained.stdout, explained.stdout
    cluster.kube.delete(PODS, "checkpoint", WORKLOAD_NS)
    cluster.wait(lambda: not cluster.pod_exists("checkpoint"), 10, "the checkpoint pod gone")
    assert repaired(cluster, node) == ["repaired"]
    assert f"{WORKLOAD_NS}/train" in cluster.evicted()


class Receiver(http.server.BaseHTTPRequestHandler):
    got: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        self.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    got: list[dict[str, Any]] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("R", (Receiver,), {"got": got}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/gpu", got
    finally:
        server.shutdown()
        server.server_close()


def test_a_webhook_receiver_gets_the_quarantine_notification(cluster: Cluster,
                                                            receiver: tuple[str, list[dict[str, Any]]]) -> None:
    cluster.require("reach a webhook receiver in the test process")
    url, got = receiver
    cluster.kube.create(SECRETS, {"metadata": {"name": "gpuremediate-notifications", "namespace": SYSTEM_NS},
                                  "data": {"url": base64.b64encode(url.encode()).decode()}}, SYSTEM_NS)
    node = cluster.nodes[2]
    cluster.start_controller({"notifications": {"enabled": True, "cluster": "e2e"}})
    cluster.inject(node, 1, "row-remap-failure")
    cluster.wait_state(node, "quarantined", 10)
    cluster.wait(lambda: any(n["kind"] == "quarantined" for n in got), 10, "the quarantine notification",
                 seen=lambda: got)
    note = next(n for n in got if n["kind"] == "quarantined")
    assert (note["node"], note["cluster"], note["reason"]) == (node, "e2e", "row-remap-failure"), note
    cluster.wait_metric("gpuremediate_notifications_total", 1, kind="quarantined", result="sent")
    assert not BreakerStore(cluster.kube, SYSTEM_NS).latest_pause().paused
