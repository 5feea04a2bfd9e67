"""Issue 47: ``replace`` as the last rung of the ladder ([remediation.replace]), in the remediate loop: a bare
emulator with the Cluster API Machine as a CRD, a hand-made Cluster API node, the controller in process; the test
plays the Machine's owner (it deletes the Node)."""

# ruff: noqa: F811 (the ``world`` fixture, imported, is every test's argument)
from __future__ import annotations

from typing import Any

from e2e.plugins.remediation import install_crd
from gpuremediate.actions.replace import MACHINE_ANNOTATION, MACHINE_NAMESPACE_ANNOTATION
from gpuremediate.actions.replaced import DELETED, DELETING, ReplacedHistory
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NAMESPACES, NODES, Resource
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_REPLACE
from gpuremediate.vocab.record import OUTCOME_ESCALATED, OUTCOME_REPAIR_FAILED, NodeRecord, record_from_node
from sim.waiting import wait_for
from tests.actions.test_replace import CAPI_NS, MACHINE, _crd
from tests.loops.test_custom_plugins import NODE, SYSTEM_NS, FaultySource
from tests.loops.test_remediate_ladder import BASE, World, _history, world  # noqa: F401 (the fixture)

REPLACE = BASE + """
[remediation.ladders]
reset-gpu = [{action = "reset-gpu", attempts = 1}]
[remediation.replace]
enabled = true
timeout_s = 60
"""


class CountingClient(KubeClient):
    """Counts the Machine deletes the API server took; ``fail`` of them fail first (the connection drops)."""

    def __init__(self, base: KubeClient, fail: int = 0) -> None:
        self.__dict__.update(base.__dict__)
        self.fail = fail
        self.deleted = 0

    def delete(self, res: Resource, name: str, namespace: str | None = None, **kwargs: Any) -> Any:
        if res.plural != "machines":
            return super().delete(res, name, namespace, **kwargs)
        if self.fail:
            self.fail -= 1
            raise errors.TransportError("connection reset (test)", sent=False)
        result = super().delete(res, name, namespace, **kwargs)
        self.deleted += 1
        return result


def _capi(world: World, owned: bool = True) -> str:
    world.kube.create(NAMESPACES, {"metadata": {"name": CAPI_NS}})
    install_crd(world.kube, _crd("cluster.x-k8s.io", "v1beta1", "Machine", "machines", "Namespaced"),
                "cluster.x-k8s.io/v1beta1", "Machine")
    owners = [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": "gpu-ms", "uid": "ms-uid",
               "controller": True}] if owned else []
    machine = world.kube.create(MACHINE, {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {
        "name": "gpu-ms-x1", "namespace": CAPI_NS, "ownerReferences": owners}, "spec": {"clusterName": "c1"}}, CAPI_NS)
    world.kube.patch(NODES, NODE, {"metadata": {"annotations": {MACHINE_ANNOTATION: "gpu-ms-x1",
                                                                MACHINE_NAMESPACE_ANNOTATION: CAPI_NS}}})
    return str(machine["metadata"]["uid"])


def _machines(world: World) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = world.kube.list(MACHINE, CAPI_NS)["items"]
    return items


def _replace_under_way(world: World) -> bool:
    record = record_from_node(world.kube.get(NODES, NODE))
    return isinstance(record, NodeRecord) and record.action is not None and record.action.kind == ACTION_REPLACE \
        and record.action.created_at is not None


def test_the_ladder_ends_in_replace_the_machine_is_deleted_once_and_the_flow_ends_as_replaced(world: World) -> None:
    machine_uid = _capi(world)
    counting = CountingClient(world.kube)
    world.kube, plain = counting, world.kube
    controller = world.start(REPLACE)
    world.kube = plain
    world.finish_job("reset-gpu", ok=False)
    wait_for(lambda: _replace_under_way(world), 20, f"the replace under way (state {world.state()})")
    assert _machines(world) == [] and counting.deleted == 1
    record = world.record()
    assert record.state == states.REPAIRING and record.action is not None
    assert (record.action.name, record.action.detail) == (f"Machine {CAPI_NS}/gpu-ms-x1", machine_uid)
    [entry] = ReplacedHistory(world.kube, SYSTEM_NS).entries()
    assert (entry.node, entry.target_uid, entry.state) == (NODE, machine_uid, DELETED)
    wait_for(lambda: world.events("GPUNodeReplace"), 10, "the replace Event")
    assert controller.metrics.replacements.value(provider="cluster-api") == 1.0
    node_uid = world.kube.get(NODES, NODE)["metadata"]["uid"]
    world.kube.delete(NODES, NODE)  # the MachineSet's controller takes the node away
    wait_for(lambda: world.events("GPUNodeReplaced"), 10, "the flow ended as replaced")
    event = world.events("GPUNodeReplaced")[0]
    assert event["involvedObject"]["uid"] == node_uid and f"Machine {CAPI_NS}/gpu-ms-x1" in event["message"]
    assert world.events("GPUNodeDeletedMidFlow") == []
    assert controller.metrics.nodes_replaced.value() == 1.0
    assert counting.deleted == 1


def test_a_delete_that_fails_then_a_restart_deletes_once(world: World) -> None:
    _capi(world)
    failing = CountingClient(world.kube, fail=10**6)  # every delete of this controller fails
    world.kube, plain = failing, world.kube
    first = world.start(REPLACE)
    world.kube = plain
    world.finish_job("reset-gpu", ok=False)

    def recorded() -> bool:
        entries = ReplacedHistory(plain, SYSTEM_NS).entries()
        return bool(entries) and entries[0].state == DELETING

    wait_for(recorded, 20, f"the history entry before the delete (state {world.state()})")
    record = world.record()
    assert record.action is not None and record.action.kind == ACTION_REPLACE and record.action.name
    assert len(_machines(world)) == 1 and failing.deleted == 0
    first.stop()
    world.controllers.remove(first)
    counting = CountingClient(plain)
    world.kube = counting
    second = world.start(REPLACE)  # a restart: the record and the history name the delete to send
    world.kube = plain
    wait_for(lambda: _replace_under_way(world), 20, f"the replace after the restart (state {world.state()})")
    assert _machines(world) == [] and counting.deleted == 1
    assert [e.state for e in ReplacedHistory(plain, SYSTEM_NS).entries()] == [DELETED]
    second.stop()
    world.controllers.remove(second)
    third = CountingClient(plain)
    world.kube = third
    world.start(REPLACE)  # and again: the history says deleted, nothing is sent
    world.kube = plain
    wait_for(lambda: _replace_under_way(world), 20, "still replacing")
    assert third.deleted == 0 and _history(world.record())[-1] == ("reset-gpu", OUTCOME_ESCALATED)


def test_a_machine_without_an_owner_goes_to_a_person_with_the_reason(world: World) -> None:
    _capi(world, owned=False)
    world.start(REPLACE)
    world.finish_job("reset-gpu", ok=False)
    wait_for(lambda: world.state() == states.QUARANTINED, 20, f"quarantined (state {world.state()})")
    record = world.record()
    assert "no owner would replace this node" in record.message and "no controller owner" in record.message
    assert _history(record) == [("reset-gpu", OUTCOME_ESCALATED), (ACTION_REPLACE, OUTCOME_REPAIR_FAILED)]
    assert len(_machines(world)) == 1 and ReplacedHistory(world.kube, SYSTEM_NS).entries() == []


def test_a_dry_run_says_would_replace_and_deletes_nothing(world: World) -> None:
    _capi(world)
    settings = Settings(namespace=SYSTEM_NS, scrape_interval_s=0.1, resync_s=0.3, dry_run=True)
    policy = REPLACE.replace('reset-gpu = [{action = "reset-gpu", attempts = 1}]',
                             'reset-gpu = [{action = "reset-gpu", attempts = 1, timeout = "1s"}]')
    controller = Controller(settings, loads_policy(policy, "test-policy"), client=world.kube,
                            source=FaultySource(79))
    assert controller.start_caches(timeout=20)
    controller.start_loops()
    world.controllers.append(controller)
    wait_for(lambda: world.events("GPUNodeReplace"), 30, "the would-replace Event")
    message = world.events("GPUNodeReplace")[0]["message"]
    assert message == f"(dry-run) would replace: delete Machine {CAPI_NS}/gpu-ms-x1 (cluster-api)", message
    assert len(_machines(world)) == 1 and ReplacedHistory(world.kube, SYSTEM_NS).entries() == []
    assert record_from_node(world.kube.get(NODES, NODE)) is None  # a dry run writes no record
