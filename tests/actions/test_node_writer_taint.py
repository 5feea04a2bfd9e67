"""The NodeWriter's view on the Node (issue 12): the [taint] taint in the record's own patch (atomic, guarded
by the resourceVersion, every other taint kept), never removing a taint it did not add; and the GPURemediation
condition after the write, whose failure never blocks the record."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.node_status import REMEDIATION_CONDITION, find_condition
from gpuremediate.actions.nodes import KEEP_CORDONED_ANNOTATION, NodeWriter
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.obs.event_queue import EventQueue
from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.taint import DEFAULT_TAINT_KEY, TaintPolicy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

OURS = {"key": DEFAULT_TAINT_KEY, "effect": "NoSchedule"}
OTHERS = {"key": "example.com/maintenance", "value": "rack-7", "effect": "NoSchedule"}
HELD = NodeRecord(state=states.DRAINING, reason="xid-79", message="XID 79 on GPU 3")
HEALTHY = NodeRecord(state=states.HEALTHY, reason="validated", message="validation passed")


class Rig:
    def __init__(self, client: KubeClient, writer: NodeWriter, reports: EventQueue) -> None:
        self.client = client
        self.writer = writer
        self.reports = reports  # the condition is published from here, after the write

    def node(self, name: str = "gpu-1") -> dict[str, Any]:
        return self.client.get(NODES, name)

    def write(self, record: NodeRecord, *, cordon: bool = False, name: str = "gpu-1") -> dict[str, Any]:
        written = self.writer.write(self.node(name), record, cordon=cordon)
        assert written is not None
        assert self.reports.flush(10), "the deferred condition was not written within 10 s"
        return self.node(name)


@pytest.fixture
def rig() -> Iterator[Rig]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": "gpuremediate-system"}})
    for name, taints in (("gpu-1", [OTHERS]), ("gpu-2", [])):
        client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                              "spec": {"taints": taints}})
    controller = Controller(Settings(namespace="gpuremediate-system"), loads_policy(""), client=client,
                            source=None)
    writer = controller.ctx.writer
    writer.taint = TaintPolicy(enabled=True)
    try:
        yield Rig(client, writer, controller.reports)
    finally:
        controller.stop()
        srv.stop()


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every taint but the node lifecycle's (these nodes have no kubelet: the emulator marks them not-ready)."""
    return [t for t in (node.get("spec") or {}).get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")]


def test_the_taint_lands_with_the_record_and_others_taints_stay(rig: Rig) -> None:
    node = rig.write(HELD, cordon=True)
    assert _taints(node) == [OTHERS, OURS]
    record = record_from_node(node)
    assert isinstance(record, NodeRecord) and record.tainted_by_us and record.state == states.DRAINING
    assert node["spec"]["unschedulable"] is True
    node = rig.write(HEALTHY)
    assert _taints(node) == [OTHERS]
    record = record_from_node(node)
    assert isinstance(record, NodeRecord) and not record.tainted_by_us


def test_a_taint_someone_else_set_with_our_key_is_never_removed(rig: Rig) -> None:
    rig.client.patch(NODES, "gpu-2", {"spec": {"taints": [OURS]}})
    node = rig.write(HELD, name="gpu-2")
    record = record_from_node(node)
    assert isinstance(record, NodeRecord) and not record.tainted_by_us
    assert _taints(rig.write(HEALTHY, name="gpu-2")) == [OURS]


def test_instead_of_cordon_taints_and_leaves_spec_unschedulable_alone(rig: Rig) -> None:
    rig.writer.taint = TaintPolicy(enabled=True, instead_of_cordon=True)
    node = rig.write(HELD, cordon=True, name="gpu-2")
    assert _taints(node) == [OURS] and not node["spec"].get("unschedulable")
    record = record_from_node(node)
    assert isinstance(record, NodeRecord) and not record.cordoned_by_us  # nothing for a person to "uncordon"


def test_the_remediation_condition_follows_the_record(rig: Rig) -> None:
    held = find_condition(rig.write(HELD), REMEDIATION_CONDITION)
    assert held is not None and (held["status"], held["reason"], held["message"]) == \
        ("True", "Draining", "XID 79 on GPU 3")
    healthy = find_condition(rig.write(HEALTHY), REMEDIATION_CONDITION)
    assert healthy is not None and (healthy["status"], healthy["reason"]) == ("False", "Healthy")


def test_a_failed_condition_write_does_not_block_the_record_and_the_next_write_retries(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    original = rig.client.patch

    def refusing_status(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("subresource") == "status":
            raise errors.TransportError("connection reset")
        return original(*args, **kwargs)

    monkeypatch.setattr(rig.client, "patch", refusing_status)
    node = rig.write(HELD)
    assert isinstance(record_from_node(node), NodeRecord) and find_condition(node, REMEDIATION_CONDITION) is None
    monkeypatch.setattr(rig.client, "patch", original)
    again = rig.write(NodeRecord(state=states.DRAINING, reason="xid-79", message="XID 79 on GPU 3 (again)"))
    assert find_condition(again, REMEDIATION_CONDITION) is not None


def test_with_the_taint_disabled_nothing_is_tainted(rig: Rig) -> None:
    rig.writer.taint = TaintPolicy()
    assert _taints(rig.write(HELD, name="gpu-2")) == []


def test_the_condition_follows_the_write_and_the_view_keeps_its_version(rig: Rig) -> None:
    """The record's patch comes first (the condition is deferred: a burst of cordons is not paced by it), then the
    GPURemediation status patch moves the resourceVersion again (the view's part: test_report_lane.py). No
    cordon: the emulator's node lifecycle answers one with its unschedulable taint, a write of its own."""
    written = rig.writer.write(rig.node(), HELD)
    assert written is not None and find_condition(written, REMEDIATION_CONDITION) is None, "not in the write"
    assert rig.reports.flush(10)
    stored = rig.node()
    assert find_condition(stored, REMEDIATION_CONDITION) is not None
    assert rig.writer.write(stored, HEALTHY) is not None, "guarded by the stored resourceVersion: no 409"


def test_switching_to_instead_of_cordon_still_lifts_our_earlier_cordon(rig: Rig) -> None:
    ours = dataclasses.replace(HELD, cordoned_by_us=True)  # as decide writes a cordon of ours
    node = rig.write(ours, cordon=True)  # cordoned by us before the setting changed
    assert node["spec"]["unschedulable"] is True
    rig.writer.taint = TaintPolicy(enabled=True, instead_of_cordon=True)
    node = rig.write(ours)
    record = record_from_node(node)
    assert isinstance(record, NodeRecord) and record.cordoned_by_us, "our cordon is no longer recorded as ours"
    written = rig.writer.write(rig.node(), HEALTHY, uncordon=True)
    assert written is not None and rig.reports.flush(10)  # the deferred condition lands before the next read
    assert not rig.node()["spec"].get("unschedulable"), "our old cordon stayed"
    rig.write(ours, cordon=True)  # with the setting on, a new flow does not cordon
    assert not rig.node()["spec"].get("unschedulable")


def _heartbeat(client: KubeClient, name: str, at: str) -> None:
    """What a kubelet posts every 10 s or so: the Ready condition's heartbeat time (its status unchanged)."""
    client.patch(NODES, name, {"status": {"conditions": [{"type": "Ready", "status": "True",
                                                          "lastHeartbeatTime": at}]}},
                 patch_type="strategic", subresource="status")


def _first_heartbeat(client: KubeClient, name: str, at: str) -> None:
    """The node's first Ready=True: the node lifecycle controller then lifts the not-ready taint it was created
    with, a write of its own, after ours (as on a real server). Waited for, so that the tests' later heartbeats
    are the only change between a read and a write."""
    _heartbeat(client, name, at)
    wait_for(lambda: not any(t["key"] == "node.kubernetes.io/not-ready" for t in _taints_all(client.get(NODES, name))),
             timeout=30, describe="the node lifecycle lifting the not-ready taint")


def _taints_all(node: dict[str, Any]) -> list[dict[str, Any]]:
    return (node.get("spec") or {}).get("taints") or []


def test_a_write_that_met_only_a_heartbeat_is_sent_again_not_decided_again(rig: Rig) -> None:
    """Issue 41: on an API server answering in seconds, each kubelet heartbeat between a read and its write cost a
    409 and a whole new decision from a cache that lags. A node changed in nothing a decision reads (heartbeat
    times, our own GPURemediation condition, another tool's annotation) takes the same write under its new version."""
    _first_heartbeat(rig.client, "gpu-1", "2026-12-06T10:00:00Z")
    seen = rig.node()
    _heartbeat(rig.client, "gpu-1", "2026-12-06T10:00:10Z")  # the version moved, nothing else...
    rig.client.patch(NODES, "gpu-1", {"metadata": {"annotations": {"example.com/owner": "team-b"}}})  # ...of ours
    written = rig.writer.write(seen, HELD, cordon=True)
    assert written is not None
    assert rig.node()["spec"].get("unschedulable") is True
    record = record_from_node(rig.node())
    assert isinstance(record, NodeRecord) and record.state == states.DRAINING


def test_a_write_that_meets_a_heartbeat_again_after_its_re_read_is_sent_again(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat can land between the re-read and the write sent again (two in a row on a slow server, under a
    loaded controller): still nothing a decision reads, so the write is sent again, a bounded number of times."""
    _first_heartbeat(rig.client, "gpu-1", "2026-12-06T11:00:00Z")
    seen = rig.node()
    _heartbeat(rig.client, "gpu-1", "2026-12-06T11:00:05Z")  # the version moved since the read
    real_get, beats = rig.client.get, iter(["2026-12-06T11:00:10Z", "2026-12-06T11:00:20Z"])

    def get_then_heartbeat(resource: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        found = real_get(resource, name, *args, **kwargs)
        beat = next(beats, None)
        if beat is not None:
            _heartbeat(rig.client, "gpu-1", beat)  # lands after the re-read: the write sent again meets a 409 too
        return found

    monkeypatch.setattr(rig.client, "get", get_then_heartbeat)
    written = rig.writer.write(seen, HELD, cordon=True)
    assert written is not None
    assert next(beats, None) is None  # both heartbeats landed between a re-read and its write
    record = record_from_node(real_get(NODES, "gpu-1"))
    assert isinstance(record, NodeRecord) and record.state == states.DRAINING


def test_a_write_whose_node_changed_in_what_decisions_read_is_decided_again(rig: Rig) -> None:
    """A label, an annotation of ours, a condition's status or the spec changed since the read: the 409 stands, the loop
    reads again and decides again (the label may move the node to another group's policy)."""
    changes: list[dict[str, Any]] = [
        {"metadata": {"labels": {"pool": "b"}}},
        {"metadata": {"annotations": {KEEP_CORDONED_ANNOTATION: "ticket-7"}}},
        {"spec": {"unschedulable": True}},
    ]
    for change in changes:
        seen = rig.node()
        rig.client.patch(NODES, "gpu-1", change)
        assert rig.writer.write(seen, HELD) is None, change
        assert record_from_node(rig.node()) is None, change
    _first_heartbeat(rig.client, "gpu-1", "2026-12-06T10:00:00Z")
    seen = rig.node()
    rig.client.patch(NODES, "gpu-1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
                     patch_type="strategic", subresource="status")
    assert rig.writer.write(seen, HELD) is None
