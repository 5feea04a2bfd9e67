"""Issue 47: the autoscaler marks. While a node is in remediation it carries ``karpenter.sh/do-not-disrupt`` and
``cluster-autoscaler.kubernetes.io/scale-down-disabled`` ("true"), written in the record's own patch; they come off
when it is healthy again, and only the ones we added (a person's or another tool's mark stays)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.autoscaler_marks import CA_SCALE_DOWN_DISABLED, KARPENTER_DO_NOT_DISRUPT, MARKS, marks_change
from gpuremediate.actions.nodes import NodeWriter
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.obs.event_queue import EventQueue
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, decode, encode, record_from_node
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

DRAINING = NodeRecord(state=states.DRAINING, reason="xid-79", message="XID 79 on GPU 3")
REPAIRING = NodeRecord(state=states.REPAIRING, reason="drain-complete")
HEALTHY = NodeRecord(state=states.HEALTHY, reason="validation-passed")
BOTH = tuple(sorted(MARKS))


def _node(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "annotations": dict(annotations)}}


# ---- the pure builder --------------------------------------------------------------------------------------


def test_both_marks_are_added_while_in_remediation_and_recorded_as_ours() -> None:
    change = marks_change(_node(), DRAINING, ())
    assert change.annotations == {KARPENTER_DO_NOT_DISRUPT: "true", CA_SCALE_DOWN_DISABLED: "true"}
    assert change.marked_by_us == BOTH


@pytest.mark.parametrize("state", [states.CORDONED, states.DRAINING, states.REPAIRING, states.VALIDATING,
                                   states.QUARANTINED, states.MAINTENANCE])
def test_every_state_but_healthy_is_in_remediation(state: str) -> None:
    assert marks_change(_node(), NodeRecord(state=state), ()).marked_by_us == BOTH


def test_a_mark_someone_else_set_is_kept_and_never_ours() -> None:
    node = _node(**{KARPENTER_DO_NOT_DISRUPT: "true"})
    change = marks_change(node, DRAINING, ())
    assert change.annotations == {CA_SCALE_DOWN_DISABLED: "true"}
    assert change.marked_by_us == (CA_SCALE_DOWN_DISABLED,)
    back = marks_change(_node(**{KARPENTER_DO_NOT_DISRUPT: "true", CA_SCALE_DOWN_DISABLED: "true"}), HEALTHY,
                        change.marked_by_us)
    assert back.annotations == {CA_SCALE_DOWN_DISABLED: None}  # theirs stays
    assert back.marked_by_us == ()


def test_a_mark_of_ours_someone_took_off_mid_flow_is_not_put_back() -> None:
    change = marks_change(_node(**{CA_SCALE_DOWN_DISABLED: "true"}), REPAIRING, BOTH)
    assert change.annotations == {}
    assert change.marked_by_us == (CA_SCALE_DOWN_DISABLED,)


def test_marks_already_ours_are_not_written_again() -> None:
    node = _node(**{KARPENTER_DO_NOT_DISRUPT: "true", CA_SCALE_DOWN_DISABLED: "true"})
    change = marks_change(node, REPAIRING, BOTH)
    assert change.annotations == {} and change.marked_by_us == BOTH


def test_a_healthy_node_without_marks_of_ours_gets_no_change() -> None:
    node = _node(**{KARPENTER_DO_NOT_DISRUPT: "false"})
    assert marks_change(node, HEALTHY, ()).annotations == {}


def test_marked_by_us_survives_the_codec() -> None:
    record = NodeRecord(state=states.DRAINING, marked_by_us=BOTH)
    assert decode(encode(record)).marked_by_us == BOTH


# ---- the writer against the emulated API server --------------------------------------------------------------


class Rig:
    def __init__(self, client: KubeClient, writer: NodeWriter, reports: EventQueue) -> None:
        self.client, self.writer, self.reports = client, writer, reports

    def annotations(self, name: str = "gpu-1") -> dict[str, str]:
        return dict(self.client.get(NODES, name)["metadata"].get("annotations") or {})

    def write(self, record: NodeRecord, *, name: str = "gpu-1", cordon: bool = False) -> NodeRecord:
        assert self.writer.write(self.client.get(NODES, name), record, cordon=cordon) is not None
        assert self.reports.flush(10)
        # The node lifecycle follows a cordon (or its lift) with the unschedulable taint, a write of its own a
        # moment later, as on a real server: waited for, or the next write's read could be from before it and
        # meet a change to the taints, which a decision reads (the write is then decided again, not sent)
        wait_for(lambda: _lifecycle_caught_up(self.client.get(NODES, name)), timeout=30,
                 describe="the node lifecycle's unschedulable taint following the cordon")
        written = record_from_node(self.client.get(NODES, name))
        assert isinstance(written, NodeRecord)
        return written


def _lifecycle_caught_up(node: dict[str, Any]) -> bool:
    spec = node.get("spec") or {}
    tainted = any(t.get("key") == "node.kubernetes.io/unschedulable" for t in spec.get("taints") or [])
    return tainted == bool(spec.get("unschedulable"))


@pytest.fixture
def rig() -> Iterator[Rig]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": "gpuremediate-system"}})
    client.create(NODES, {"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.present": "true"}}})
    client.create(NODES, {"metadata": {"name": "gpu-2", "labels": {"nvidia.com/gpu.present": "true"},
                                       "annotations": {CA_SCALE_DOWN_DISABLED: "true"}}})
    controller = Controller(Settings(namespace="gpuremediate-system"), loads_policy(""), client=client, source=None)
    try:
        yield Rig(client, controller.ctx.writer, controller.reports)
    finally:
        controller.stop()
        srv.stop()


def test_the_marks_land_with_the_state_change_and_go_with_the_return_to_service(rig: Rig) -> None:
    written = rig.write(DRAINING, cordon=True)
    assert written.marked_by_us == BOTH
    annotations = rig.annotations()
    assert annotations[KARPENTER_DO_NOT_DISRUPT] == "true" and annotations[CA_SCALE_DOWN_DISABLED] == "true"
    assert rig.write(REPAIRING).marked_by_us == BOTH  # carried through the flow
    assert rig.write(HEALTHY).marked_by_us == ()
    annotations = rig.annotations()
    assert KARPENTER_DO_NOT_DISRUPT not in annotations and CA_SCALE_DOWN_DISABLED not in annotations


def test_the_writer_never_removes_a_mark_it_did_not_add(rig: Rig) -> None:
    assert rig.write(DRAINING, name="gpu-2").marked_by_us == (KARPENTER_DO_NOT_DISRUPT,)
    rig.write(HEALTHY, name="gpu-2")
    annotations = rig.annotations("gpu-2")
    assert annotations.get(CA_SCALE_DOWN_DISABLED) == "true"
    assert KARPENTER_DO_NOT_DISRUPT not in annotations


def test_a_dry_run_marks_nothing_on_the_node(rig: Rig) -> None:
    rig.writer.dry_run = True
    node = rig.client.get(NODES, "gpu-1")
    seen = rig.writer.write(node, DRAINING)
    assert seen is not None and (seen["metadata"]["annotations"] or {}).get(KARPENTER_DO_NOT_DISRUPT) == "true"
    assert KARPENTER_DO_NOT_DISRUPT not in rig.annotations()
