"""[notifications].events chosen for every repair (kured's one message per reboot): a fault's drain start, its
repair and its return to service each reach the webhook receiver once, in order, named and in the template's
words. The simulated cluster (emulator, gpu-sim, nodesim) and the controller in process."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.resources import NODES, SECRETS
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.cluster import EXPORTER_NAMESPACE, SimCluster
from sim.waiting import wait_for

from .test_notify import Receiver

NS = "gpuremediate-system"
NODE = "gpu-node-1"
POLICY = """
[drain]
retry_s = 0.2
[remediation.reboot]
timeout_s = 10
[notifications]
enabled = true
cluster = "lab"
events = ["quarantined", "repair-failed", "breaker-open", "drain-blocked", "drain-started", "repaired", "returned"]
template = "[{cluster}] {kind} {node}: {from} -> {to} ({reason})"
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver([])
    yield r
    r.close()


def _state(cluster: SimCluster) -> str:
    record = record_from_node(cluster.kube.get(NODES, NODE))
    return record.state if isinstance(record, NodeRecord) else states.HEALTHY


def test_a_reboot_is_told_at_its_drain_its_repair_and_its_return(receiver: Receiver) -> None:
    with SimCluster(nodes=2, gpus=2, job_duration_s=0.2, reboot_down_s=0.3) as cluster:
        cluster.kube.create(SECRETS, {"metadata": {"name": "gpuremediate-notifications", "namespace": NS},
                                      "data": {"url": base64.b64encode(receiver.url.encode()).decode()}}, NS)
        settings = Settings(namespace=NS, scrape_interval_s=0.2, resync_s=0.3, metrics_port=0,
                            exporter_namespace=EXPORTER_NAMESPACE, exporter_port=cluster.exporter_port)
        controller = Controller(settings, loads_policy(POLICY, "test-policy"), client=cluster.kube)
        assert controller.start_caches(timeout=20)
        controller.start_loops()
        try:
            cluster.gpusim.inject_xid(NODE, 0, 79)  # XID 79: drain, reboot, validate
            wait_for(lambda: _state(cluster) != states.HEALTHY, 20, "the fault taken up")
            wait_for(lambda: any(b.get("kind") == "returned" for b in receiver.bodies), 60,
                     "the node back in service, told", seen=lambda: (_state(cluster), receiver.bodies))
        finally:
            controller.stop()
    kinds = [b["kind"] for b in receiver.bodies]
    assert kinds == ["drain-started", "repaired", "returned"], receiver.bodies
    assert all(b["node"] == NODE and b["nodes"] == [NODE] and b["cluster"] == "lab" for b in receiver.bodies)
    drain, repaired, returned = receiver.bodies
    assert drain["reason"] == "xid-79" and drain["to"] == states.DRAINING
    assert (repaired["from"], repaired["to"]) == (states.REPAIRING, states.VALIDATING)
    assert (returned["from"], returned["to"], returned["reason"]) == (states.VALIDATING, states.HEALTHY,
                                                                      states.VALIDATION_PASSED)
    assert returned["text"] == f"[lab] returned {NODE}: validating -> healthy (validation-passed)"
