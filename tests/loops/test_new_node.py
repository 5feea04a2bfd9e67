"""Issue 47: a new node registering with the startup taint (``[remediation.replace] startup_taint``) is validated
before it takes work: moved to validating (reason new-node), the validation Job run, the taint taken off in the
write that says healthy; a failure quarantines it with the reason and leaves the taint. Its GPUs not yet readable
make it "unknown", never faulty. A bare emulator (its Job controller makes the pods); the test plays the kubelet."""

from __future__ import annotations

from typing import Any

from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.resources import NODES
from gpuremediate.policy.config import PolicyError, loads_policy
from gpuremediate.signals.model import NodeReadings
from gpuremediate.signals.sources import unknown
from gpuremediate.vocab import states
from gpuremediate.vocab.record import OUTCOME_REPAIRED, RECORD_ANNOTATION, HistoryEntry, NodeRecord, encode
from sim.waiting import wait_for
from tests.loops.test_custom_plugins import NODE, SYSTEM_NS
from tests.loops.test_remediate_ladder import World, world  # noqa: F401 (the fixture)

STARTUP = "example.com/unvalidated"
POLICY = f"""
[breaker]
enabled = false
[remediation.replace]
startup_taint = "{STARTUP}"
"""
OTHER = {"key": "example.com/keep", "value": "yes", "effect": "NoSchedule"}


class NotReadable:
    """The new node's exporter is not up yet: its GPUs cannot be read."""

    def read(self) -> list[NodeReadings]:
        return [unknown(NODE, "exporter", "no exporter pod on the node yet", 1.0)]


def start(made: World, policy: str) -> Controller:
    controller = Controller(Settings(namespace=SYSTEM_NS, scrape_interval_s=0.1, resync_s=0.3),
                            loads_policy(policy, "test-policy"), client=made.kube, source=NotReadable())
    assert controller.start_caches(timeout=20)
    controller.start_loops()
    made.controllers.append(controller)
    return controller


def taint(made: World, *taints: dict[str, Any]) -> None:
    """The new node as it registers: tainted, its device plugin offering its GPU."""
    made.kube.patch(NODES, NODE, {"spec": {"taints": list(taints)}})
    gpus = {"nvidia.com/gpu": "1"}
    made.kube.patch(NODES, NODE, {"status": {"capacity": gpus, "allocatable": gpus}}, subresource="status")


def cycles(controller: Controller) -> float:
    return controller.metrics.detect_cycles.value()


def taint_keys(made: World) -> list[str]:
    return [t["key"] for t in made.kube.get(NODES, NODE)["spec"].get("taints") or []]


def test_a_new_node_with_the_startup_taint_is_validated_and_then_untainted(world: World) -> None:  # noqa: F811
    taint(world, {"key": STARTUP, "effect": "NoSchedule"}, OTHER)
    start(world, POLICY)
    wait_for(lambda: world.state() == states.VALIDATING, 20, "the new node validating")
    record = world.record()
    assert record.reason == states.NEW_NODE and record.fault is None and STARTUP in record.message
    assert not record.cordoned_by_us and not world.kube.get(NODES, NODE)["spec"].get("unschedulable")
    job = world.finish_job("validate", ok=True)
    assert {"operator": "Exists"} in job["spec"]["template"]["spec"]["tolerations"]  # it runs under the taint
    wait_for(lambda: world.state() == states.HEALTHY, 20, f"healthy (state {world.state()})")
    assert taint_keys(world) == [OTHER["key"]], "the startup taint goes, every other taint stays"
    assert world.record().reason == states.VALIDATION_PASSED
    assert not world.kube.get(NODES, NODE)["spec"].get("unschedulable")
    assert len(world.jobs("validate")) == 1, "validated once, not again once healthy"


def test_a_new_node_that_fails_its_validation_is_quarantined_with_the_reason(world: World) -> None:  # noqa: F811
    taint(world, {"key": STARTUP, "effect": "NoSchedule"})
    start(world, POLICY)
    world.finish_job("validate", ok=False)
    wait_for(lambda: world.state() == states.QUARANTINED, 20, f"quarantined (state {world.state()})")
    record = world.record()
    assert record.reason == states.VALIDATION_FAILED
    assert "a new node failed its validation before taking work" in record.message, record.message
    assert taint_keys(world) == [STARTUP], "the startup taint stays on a node that failed"


def test_a_new_node_whose_gpus_are_not_readable_is_unknown_not_faulty(world: World) -> None:  # noqa: F811
    """Without a startup taint, or before the move to validating: nothing is decided from readings not had."""
    controller = start(world, "[breaker]\nenabled = false\n")
    wait_for(lambda: world.events("GPUHealthUnknown"), 20, "the GPUHealthUnknown Event")
    wait_for(lambda: 'gpuremediate_nodes_unknown 1' in controller.metrics.registry.render(), 20, "counted unknown")
    wait_for(lambda: cycles(controller) >= 3, 20, "three detect cycles")
    assert world.state() == "-", "a node whose GPUs cannot be read yet got a record"
    assert not world.kube.get(NODES, NODE)["spec"].get("unschedulable") and world.jobs("validate") == []


def test_a_node_with_a_past_flow_of_ours_is_no_new_node(world: World) -> None:  # noqa: F811
    """A taint of that key on a node gpuremediate repaired before (a person's, a tool's): not a registration's."""
    past = NodeRecord(state=states.HEALTHY, history=(HistoryEntry(at=1.0, kind="xid", code="79", action="reboot",
                                                                  outcome=OUTCOME_REPAIRED),))
    world.kube.patch(NODES, NODE, {"metadata": {"annotations": {RECORD_ANNOTATION: encode(past)}}})
    taint(world, {"key": STARTUP, "effect": "NoSchedule"})
    controller = start(world, POLICY)
    wait_for(lambda: cycles(controller) >= 3, 20, "three detect cycles")
    assert world.state() == states.HEALTHY and world.jobs("validate") == []
    assert taint_keys(world) == [STARTUP]


def test_a_startup_taint_that_is_no_taint_key_is_refused() -> None:
    try:
        loads_policy('[remediation.replace]\nstartup_taint = "not a key!"\n', "p")
    except PolicyError as exc:
        assert "remediation.replace.startup_taint" in str(exc) and "taint key" in str(exc), str(exc)
    else:
        raise AssertionError("accepted")
