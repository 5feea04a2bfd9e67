"""Focused regressions for controller bugs the reliability tests found, each on a small SimCluster
with the same recorder and invariant checker as the stateful test."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpuremediate import fleet
from gpuremediate.actions.nodes import KEEP_CORDONED_ANNOTATION
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import EVENTS, JOBS, NODES
from gpuremediate.policy.config import PolicyFile
from gpuremediate.vocab import states
from gpuremediate.vocab.record import ActionInProgress, NodeRecord, record_from_node
from sim.cluster import SimCluster
from sim.waiting import wait_for
from tests.loops.test_conflicts import job_service_account

from .harness import (
    PERSON_TOKEN,
    PERSON_USER,
    Checker,
    Controllers,
    Recorder,
    reliability_policy,
    reliability_settings,
)

NODE = "gpu-node-1"
NODE_PATCH = r"^/api/v1/nodes/gpu-node-1(\?.*)?$"


@dataclass
class Rig:
    cluster: SimCluster
    recorder: Recorder
    checker: Checker
    controllers: Controllers
    person: KubeClient

    @property
    def kube(self) -> KubeClient:
        return self.cluster.kube

    def record(self) -> NodeRecord:
        record = record_from_node(self.kube.get(NODES, NODE))
        assert isinstance(record, NodeRecord), f"{NODE} has no readable record: {record}"
        return record

    def wait_state(self, state: str, timeout: float) -> None:
        wait_for(lambda: _state(self.kube, NODE) == state, timeout,
                 f"{NODE} in {state} (it is {_state(self.kube, NODE)})")

    def jobs_named(self) -> list[str]:
        with self.recorder.lock:
            return [job.name for job in self.recorder.jobs if not job.deleted]

    def cordoned_by(self, node: str) -> str | None:
        self.checker.process()
        return self.checker.nodes[node].cordoned_by

    def violations(self, code: str) -> list[str]:
        self.checker.process()
        return [v.text for v in self.checker.violations if v.code == code]


def _state(kube: KubeClient, node: str) -> str:
    record = record_from_node(kube.get(NODES, node))
    return record.state if isinstance(record, NodeRecord) else str(record)


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield from _rig(reliability_policy(1))


@pytest.fixture
def slow_rig() -> Iterator[Rig]:
    """Repair Jobs get 20 s instead of 2 s: a person has time to act on a running one."""
    policy = reliability_policy(1)
    remediation = policy.defaults.remediation
    slow = dataclasses.replace(remediation, reset_gpu=dataclasses.replace(remediation.reset_gpu, timeout_s=20.0))
    yield from _rig(dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, remediation=slow)))


def _rig(policy: PolicyFile, start: bool = True, nodes: int = 2) -> Iterator[Rig]:
    """``start``: a controller started with its own clock (else the test starts one)."""
    cluster = SimCluster(nodes=nodes, gpus=2, job_duration_s=0.2, reboot_down_s=0.3)
    recorder = Recorder(cluster.api).install()
    cluster.start()
    job_service_account(cluster.kube)
    checker = Checker(recorder, 1, []).start()
    controllers = Controllers(cluster, policy, reliability_settings(cluster))
    cluster.api.add_token(PERSON_TOKEN, PERSON_USER)
    path = cluster.api.write_kubeconfig(cluster.kubeconfig + "-person", token=PERSON_TOKEN)
    person = KubeClient(load_config(path), qps=500, burst=1000, timeout=10.0)
    try:
        if start:
            controllers.start()
        yield Rig(cluster, recorder, checker, controllers, person)
    finally:
        person.close()
        checker.stop()
        controllers.close()
        cluster.stop()


def _time_out_with_conflict(rig: Rig, timeout: float) -> str:
    """Wait for the action's Job, then make the one node write after its timeout (the outcome) meet a 409: two of
    them, since a write whose node changed in nothing a decision reads is sent once more (``NodeWriter``)."""
    wait_for(lambda: bool(rig.jobs_named()), 10, "the Job to be created")
    job = rig.jobs_named()[-1]
    rig.cluster.api.inject("PATCH", NODE_PATCH, count=2, status=409)
    action = rig.record().action
    assert action is not None and action.name == job, f"record names {action}, Job {job}"

    def closed() -> bool:
        now = rig.record().action  # read once: the record can move between two reads
        return now is None or now.name != job or len(rig.jobs_named()) > 1

    wait_for(closed, timeout, f"the timed-out attempt {job} to be closed")
    return job


def test_timed_out_repair_job_is_not_created_again_when_the_outcome_write_fails(rig: Rig) -> None:
    assert rig.cluster.nodesim is not None
    rig.cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=30.0)  # outlasts the 2 s Job timeout
    rig.cluster.gpusim.inject_dbe(NODE, 0)  # reset-gpu
    rig.wait_state(states.REPAIRING, 10)
    job = _time_out_with_conflict(rig, 8)
    twice = rig.violations("job-twice") + rig.violations("job-recreated-after-own-delete")
    assert twice == [], f"{job}: {twice}"


def test_timed_out_validation_job_is_not_created_again_when_the_outcome_write_fails(rig: Rig) -> None:
    assert rig.cluster.nodesim is not None
    rig.cluster.gpusim.inject_row_remap_failure(NODE, 0)  # quarantine at once
    rig.wait_state(states.QUARANTINED, 10)
    rig.cluster.gpusim.reset_gpu(NODE, 0)
    rig.cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=30.0)
    fleet.release(rig.person, NODE, by=PERSON_USER)
    rig.wait_state(states.VALIDATING, 5)
    job = _time_out_with_conflict(rig, 8)
    twice = rig.violations("job-twice") + rig.violations("job-recreated-after-own-delete")
    assert twice == [], f"{job}: {twice}"


def test_person_cordon_on_a_quarantined_node_survives_release_and_validation(rig: Rig) -> None:
    rig.cluster.gpusim.inject_row_remap_failure(NODE, 0)  # quarantine at once, cordoned by us
    rig.wait_state(states.QUARANTINED, 10)
    person = rig.person
    person.patch(NODES, NODE, {"spec": {"unschedulable": False}})  # a person takes the node back...
    wait_for(lambda: rig.cordoned_by(NODE) is None, 5, "the uncordon to be recorded")
    time.sleep(1.0)  # ...the controller has a second to notice...
    person.patch(NODES, NODE, {"spec": {"unschedulable": True}})  # ...and cordons it again, for their own reasons
    fleet.release(person, NODE, by=PERSON_USER)
    wait_for(lambda: _state(rig.kube, NODE) == states.HEALTHY, 10, f"{NODE} validated and healthy")
    time.sleep(0.3)
    removed = rig.violations("person-cordon-kept") + rig.violations("person-cordon-removed-stale-record")
    assert removed == []
    assert rig.kube.get(NODES, NODE)["spec"].get("unschedulable") is True, "the person's cordon was removed"


def _action(rig: Rig) -> ActionInProgress | None:
    record = record_from_node(rig.kube.get(NODES, NODE))
    return record.action if isinstance(record, NodeRecord) else None


def _validate_jobs(rig: Rig) -> list[str]:
    with rig.recorder.lock:
        return [job.name for job in rig.recorder.jobs if job.kind == "validate" and not job.deleted]


def _quarantine_then_release(rig: Rig, validation_ok: bool) -> None:
    rig.cluster.set_validation(NODE, validation_ok)
    fleet.release(rig.person, NODE, by=PERSON_USER)


def test_a_second_release_runs_a_new_validation(rig: Rig) -> None:
    """Released, validation fails, released again: the second release validates with its own Job instead of
    finding the first run's failed Job (kept 24 h) under the same name and quarantining at once."""
    rig.cluster.gpusim.inject_row_remap_failure(NODE, 0)  # quarantine at once
    rig.wait_state(states.QUARANTINED, 10)
    rig.cluster.gpusim.reset_gpu(NODE, 0)
    _quarantine_then_release(rig, validation_ok=False)
    wait_for(lambda: len(_validate_jobs(rig)) == 1 and _state(rig.kube, NODE) == states.QUARANTINED, 10,
             "the first validation to fail")
    _quarantine_then_release(rig, validation_ok=True)
    wait_for(lambda: _state(rig.kube, NODE) == states.HEALTHY, 10,
             f"{NODE} validated by a second Job and healthy (it is {_state(rig.kube, NODE)})")
    first, second = _validate_jobs(rig)
    assert first != second
    assert rig.violations("job-twice") == []


def test_a_timed_out_validation_job_is_never_created_again_under_its_name(rig: Rig) -> None:
    assert rig.cluster.nodesim is not None
    rig.cluster.gpusim.inject_row_remap_failure(NODE, 0)
    rig.wait_state(states.QUARANTINED, 10)
    rig.cluster.gpusim.reset_gpu(NODE, 0)
    rig.cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=30.0)  # outlasts the 2 s timeout
    for _ in range(2):
        fleet.release(rig.person, NODE, by=PERSON_USER)
        rig.wait_state(states.VALIDATING, 5)
        rig.wait_state(states.QUARANTINED, 10)  # timed out; its Job deleted
    names = _validate_jobs(rig)
    assert len(names) == 2 and len(set(names)) == 2, names
    assert rig.violations("job-twice") + rig.violations("job-recreated-after-own-delete") == []


def test_a_person_deleting_the_running_repair_job_fails_that_attempt(slow_rig: Rig) -> None:
    rig = slow_rig
    assert rig.cluster.nodesim is not None
    rig.cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=60.0)
    rig.cluster.gpusim.inject_dbe(NODE, 0)  # reset-gpu
    wait_for(lambda: (action := _action(rig)) is not None and action.created, 15,
             "the repair Job created and recorded as created")
    first = rig.record().action
    assert first is not None and first.attempt == 1
    rig.person.delete(JOBS, first.name, "gpuremediate-jobs", propagation_policy="Background")
    wait_for(lambda: (action := _action(rig)) is not None and action.attempt == 2 and bool(action.name), 10,
             "the next attempt, under a new name")
    assert rig.record().action.name != first.name  # type: ignore[union-attr]
    time.sleep(0.5)  # a wrong controller would now create the deleted Job again
    assert rig.jobs_named().count(first.name) == 1, "the deleted Job was created again"
    assert rig.violations("job-twice") == []

    def deleted_failures() -> list[str]:  # the Event follows the record write of attempt 2
        events = rig.kube.list(EVENTS, "default")["items"]
        messages = [e["message"] for e in events if e["reason"] == "GPURemediationFailed"]
        return [m for m in messages if "was deleted before it finished" in m]

    wait_for(deleted_failures, 10, "a GPURemediationFailed Event saying the Job was deleted")


def test_a_person_who_cordons_our_cordoned_node_keeps_it_cordoned_with_the_annotation(rig: Rig) -> None:
    """A person's cordon of a node we already cordoned leaves no trace (spec.unschedulable was true already);
    the annotation says it: validation passes, the node is healthy, and it stays cordoned."""
    rig.cluster.gpusim.inject_row_remap_failure(NODE, 0)  # quarantined and cordoned by us
    rig.wait_state(states.QUARANTINED, 10)
    assert rig.record().cordoned_by_us
    rig.person.patch(NODES, NODE, {"spec": {"unschedulable": True},  # kubectl cordon: a no-op here
                                   "metadata": {"annotations": {KEEP_CORDONED_ANNOTATION: "ticket-42"}}})
    rig.cluster.gpusim.reset_gpu(NODE, 0)
    fleet.release(rig.person, NODE, by=PERSON_USER)
    wait_for(lambda: _state(rig.kube, NODE) == states.HEALTHY, 10, f"{NODE} validated and healthy")
    assert rig.kube.get(NODES, NODE)["spec"].get("unschedulable") is True, "the person's cordon was removed"

    def kept_cordoned() -> list[str]:  # the transition's Event follows its record write
        healthy = [e["message"] for e in rig.kube.list(EVENTS, "default")["items"] if e["reason"] == "GPUNodeHealthy"]
        return [m for m in healthy if "kept cordoned" in m]

    wait_for(kept_cordoned, 10, "a GPUNodeHealthy Event saying 'kept cordoned'")
    assert "will not uncordon" in fleet.explain_node(rig.person, NODE)
