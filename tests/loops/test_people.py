"""People: a cordon a person wants kept (issue 17), on a bare emulator with the controller in process."""

from __future__ import annotations

from typing import Any

from gpuremediate import fleet
from gpuremediate.actions.nodes import KEEP_CORDONED_ANNOTATION
from gpuremediate.kube.resources import EVENTS, NODES
from gpuremediate.state import decide
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_QUARANTINE, KIND_ROW_REMAP_FAILURE
from gpuremediate.vocab.record import Fault, node_patch, transition
from sim.waiting import wait_for

from .test_custom_plugins import NODE, World, _state, world  # noqa: F401 (the fixture)

NO_VALIDATION = """
[validation]
enabled = false
[breaker]
enabled = false
"""


def _quarantined_by_us(made: World) -> None:
    fault = Fault(kind=KIND_ROW_REMAP_FAILURE, code="", gpus=("GPU-1",), fingerprint="row-remap/GPU-1",
                  action=ACTION_QUARANTINE, first_seen=1000.0, last_seen=1000.0, message="row remap failure")
    quarantined = transition(decide.fresh_record(1000.0), states.QUARANTINED, "row-remap-failure", 1000.0,
                             "row remap failure", fault=fault, cordoned_by_us=True)
    made.kube.patch(NODES, NODE, node_patch(quarantined, unschedulable=True))


def test_a_person_who_wants_the_cordon_kept_keeps_it_after_validation(world: World) -> None:  # noqa: F811
    _quarantined_by_us(world)
    world.start(NO_VALIDATION, xid=None)
    person = world.kube
    person.patch(NODES, NODE, {"spec": {"unschedulable": True},  # kubectl cordon: a no-op on our cordon
                               "metadata": {"annotations": {KEEP_CORDONED_ANNOTATION: "ticket-42"}}})
    assert "will not uncordon" in fleet.explain_node(person, NODE)
    fleet.release(person, NODE, by="alice")
    wait_for(lambda: _state(person) == states.HEALTHY, 10, f"{NODE} validated and healthy ({_state(person)})")
    assert person.get(NODES, NODE)["spec"].get("unschedulable") is True, "the person's cordon was removed"

    def kept_cordoned() -> list[str]:  # the transition's Event follows its record write
        healthy = [e["message"] for e in person.list(EVENTS, "default")["items"] if e["reason"] == "GPUNodeHealthy"]
        return [m for m in healthy if "kept cordoned" in m]

    wait_for(kept_cordoned, 10, "a GPUNodeHealthy Event saying 'kept cordoned'")


def test_without_the_annotation_our_cordon_is_removed(world: World) -> None:  # noqa: F811
    _quarantined_by_us(world)
    world.start(NO_VALIDATION, xid=None)
    fleet.release(world.kube, NODE, by="alice")
    wait_for(lambda: _state(world.kube) == states.HEALTHY, 10, f"{NODE} validated and healthy")
    assert not world.kube.get(NODES, NODE)["spec"].get("unschedulable")


def test_a_hand_edited_record_with_an_absurd_time_is_replaced_and_said_so(world: World) -> None:  # noqa: F811
    """first_seen = 1e308 is finite JSON, but every name built from it overflowed (65 tracebacks per node in
    20 s, the node stuck): the record is unreadable, a schedulable node starts over, a Warning Event says why."""
    garbage = ('{"v": 1, "state": "repairing", "since": 1000.0, "fault": {"kind": "xid", "code": "48", '
               '"fingerprint": "xid/GPU-1/48", "action": "reset-gpu", "first_seen": 1e308, "last_seen": 1e308}}')
    world.kube.patch(NODES, NODE, {"metadata": {"annotations": {"gpuremediate.io/record": garbage},
                                                "labels": {"gpuremediate.io/state": "repairing"}}})
    world.start(NO_VALIDATION, xid=None)
    wait_for(lambda: _state(world.kube) == states.HEALTHY, 10, f"the record replaced (it is {_state(world.kube)})")

    def malformed_events() -> list[dict[str, Any]]:
        return [e for e in world.kube.list(EVENTS, "default")["items"] if "record-malformed" in e["message"]]

    events = wait_for(malformed_events, 10, "the record-malformed Event (written just after the record)")
    assert len(events) == 1 and events[0]["type"] == "Warning", events
    assert "first_seen = 1e+308 is not a plausible time" in events[0]["message"]
