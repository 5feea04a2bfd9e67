"""Attacks of issue 22 on a small SimCluster (the reliability rig): each reproduces what an operator or an
attacker did, and checks the controller's answer."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.held import HELD_LABEL
from gpuremediate.clock import SteadyClock
from gpuremediate.kube.resources import EVENTS, NODES
from gpuremediate.vocab import states
from gpuremediate.vocab.record import RECORD_ANNOTATION, NodeRecord, record_from_node
from sim.waiting import wait_for

from .harness import reliability_policy
from .test_regressions import NODE, Rig, _rig

OTHER = "gpu-node-2"


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield from _rig(reliability_policy(2))


def _events(rig: Rig, node: str) -> list[str]:
    return [e["message"] for e in rig.kube.list(EVENTS, "default")["items"]
            if (e.get("involvedObject") or {}).get("name") == node]


def _record(rig: Rig, node: str) -> NodeRecord | None:
    found = record_from_node(rig.kube.get(NODES, node))
    return found if isinstance(found, NodeRecord) else None


def test_a_record_copied_onto_another_node_is_replaced_not_acted_on(rig: Rig) -> None:
    """gpu-node-1's in-flight reboot record copied onto the healthy gpu-node-2 (a restore, YAML re-applied, a
    person's `kubectl annotate --overwrite` from the wrong node): gpu-node-2 must not count gpu-node-1's reboot
    Job as its own repair, nor go to validating while schedulable; the copy is evented and replaced."""
    assert rig.cluster.nodesim is not None
    rig.cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=30.0)  # the reboot runs on
    rig.cluster.gpusim.inject_xid(NODE, 0, 79)
    rig.wait_state(states.REPAIRING, 15)
    source = rig.kube.get(NODES, NODE)["metadata"]["annotations"][RECORD_ANNOTATION]
    rig.person.patch(NODES, OTHER, {"metadata": {"annotations": {RECORD_ANNOTATION: source}}})

    def replaced() -> bool:
        record = _record(rig, OTHER)
        return record is not None and record.state == states.HEALTHY and record.reason == states.RECORD_MALFORMED

    wait_for(replaced, 10, f"{OTHER}'s copied record replaced by a fresh one")
    record = _record(rig, OTHER)
    assert record is not None and "written on node 'gpu-node-1'" in record.message, record
    assert record.node == OTHER and record.action is None
    assert not rig.kube.get(NODES, OTHER)["spec"].get("unschedulable"), f"{OTHER} cordoned for another's fault"
    wait_for(lambda: any("written on node 'gpu-node-1'" in e for e in _events(rig, OTHER)), 10,
             f"an Event on {OTHER} saying whose record it was")
    source_record = _record(rig, NODE)
    assert source_record is not None and source_record.state == states.REPAIRING, "the real owner is unaffected"


BLOB = "example.com/inventory"


def _fill_annotations(rig: Rig, node: str, room: int = 200) -> None:
    """Another tool keeps all but ``room`` bytes of the 256 KiB the API server allows a Node's annotations."""
    size = 256 * 1024 - len(BLOB) - room
    rig.person.patch(NODES, node, {"metadata": {"annotations": {BLOB: "x" * size}}}, field_manager="inventory-tool")


def _node(rig: Rig, node: str) -> dict[str, Any]:
    found: dict[str, Any] = rig.kube.get(NODES, node)
    return found


def _held(rig: Rig, node: str) -> bool:
    obj = _node(rig, node)
    return bool(obj["spec"].get("unschedulable")) and HELD_LABEL in (obj["metadata"].get("labels") or {}) \
        and RECORD_ANNOTATION not in (obj["metadata"].get("annotations") or {})


def test_a_fault_on_a_node_whose_annotations_are_full_is_held_visibly_then_handled(rig: Rig) -> None:
    """A faulty GPU on a Node whose annotations are full: no record fits, so the node is cordoned and labelled
    (no work lands on the faulty GPU), an Event says once what fills the annotations and who wrote it; when the
    other tool frees space, the fault takes its ordinary path and the node ends healthy and uncordoned."""
    _fill_annotations(rig, OTHER)
    rig.cluster.gpusim.inject_dbe(OTHER, 0)
    wait_for(lambda: _held(rig, OTHER), 15, f"{OTHER} cordoned and labelled, without a record")
    assert _node(rig, OTHER)["metadata"]["labels"][HELD_LABEL].startswith("ecc"), _node(rig, OTHER)["metadata"]
    wait_for(lambda: _refused_events(rig), 10, "the Event saying why no record was written")
    time.sleep(2.0)  # several detect cycles: said once, not every cycle
    events = _refused_events(rig)
    assert len(events) == 1, events
    assert BLOB in events[0] and "inventory-tool" in events[0] and "262,144" in events[0], events[0]
    condition = _condition(rig, OTHER)
    assert condition is not None and condition["reason"] == "RecordNotWritable", condition
    assert rig.violations("cordon-explained") == []

    rig.person.patch(NODES, OTHER, {"metadata": {"annotations": {BLOB: None}}})
    wait_for(lambda: (record := _record(rig, OTHER)) is not None and record.state == states.HEALTHY
             and any(h.outcome == "repaired" for h in record.history), 30, f"{OTHER} repaired once space is free")
    obj = _node(rig, OTHER)
    assert not obj["spec"].get("unschedulable") and HELD_LABEL not in (obj["metadata"].get("labels") or {}), obj
    assert rig.violations("cordon-explained") == []


def test_a_held_node_whose_fault_clears_is_uncordoned(rig: Rig) -> None:
    _fill_annotations(rig, OTHER)
    rig.cluster.gpusim.inject_dbe(OTHER, 0)
    wait_for(lambda: _held(rig, OTHER), 15, f"{OTHER} held")
    rig.cluster.gpusim.reset_gpu(OTHER, 0)  # the volatile count is gone: no fault any more
    wait_for(lambda: not _node(rig, OTHER)["spec"].get("unschedulable"), 15, f"{OTHER} uncordoned")
    assert HELD_LABEL not in (_node(rig, OTHER)["metadata"].get("labels") or {})
    assert RECORD_ANNOTATION not in (_node(rig, OTHER)["metadata"].get("annotations") or {})


def _refused_events(rig: Rig) -> list[str]:
    return [e["message"] for e in rig.kube.list(EVENTS, "default")["items"]
            if e["reason"] == "GPURemediationRecordRefused" and e["involvedObject"]["name"] == OTHER]


def _condition(rig: Rig, node: str) -> dict[str, Any] | None:
    for cond in _node(rig, node)["status"].get("conditions") or []:
        if cond["type"] == "GPURemediation":
            return dict(cond)
    return None


class SteppedWall:
    """The machine's wall clock, which NTP may step while the controller runs."""

    def __init__(self) -> None:
        self.step = 0.0

    def __call__(self) -> float:
        return time.time() + self.step


@pytest.fixture
def slow_reboot_rig() -> Iterator[Rig]:
    policy = reliability_policy(2)
    remediation, validation = policy.defaults.remediation, policy.defaults.validation
    slow = dataclasses.replace(remediation, reboot=dataclasses.replace(remediation.reboot, timeout_s=30.0))
    slow_validation = dataclasses.replace(validation, job=dataclasses.replace(validation.job, timeout_s=30.0))
    defaults = dataclasses.replace(policy.defaults, remediation=slow, validation=slow_validation)
    yield from _rig(dataclasses.replace(policy, defaults=defaults), start=False)


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_clock_step_while_nodes_reboot_runs_no_reboot_twice(slow_reboot_rig: Rig, step: float) -> None:
    """An NTP step of an hour, either way, while two nodes reboot: no reboot times out early (a second reboot
    for one fault) or late; both finish as if nothing happened."""
    rig = slow_reboot_rig
    wall = SteppedWall()
    rig.controllers.start(clock=SteadyClock(wall=wall))
    assert rig.cluster.nodesim is not None
    for node in (NODE, OTHER):
        rig.cluster.nodesim.set_job_outcome(node, succeed=True, duration_s=3.0)
        rig.cluster.gpusim.inject_xid(node, 0, 79)
    wait_for(lambda: all((r := _record(rig, n)) is not None and r.state == states.REPAIRING
                         for n in (NODE, OTHER)), 15, "both nodes rebooting")
    wall.step = step
    for node in (NODE, OTHER):
        wait_for(lambda n=node: (r := _record(rig, n)) is not None and r.state == states.HEALTHY, 30,
                 f"{node} back to healthy", seen=lambda n=node: _record(rig, n))
    reboots = [name for name in rig.jobs_named() if "reboot" in name]
    assert len(reboots) == 2 and all(name.endswith("-1") for name in reboots), reboots
    for node in (NODE, OTHER):
        record = _record(rig, node)
        assert record is not None and [h.outcome for h in record.history] == ["repaired"], record.history
