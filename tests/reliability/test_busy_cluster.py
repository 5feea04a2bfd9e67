"""What the people and tools sharing a real cluster do to a node mid-flow (issue 41), each on a small SimCluster
with the reliability recorder: a node deleted and registered again, a node that reboots on its own, a person's
``kubectl drain`` during validation, a pod stuck Terminating."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.jobs import JOB_LABEL, NODE_LABEL
from gpuremediate.actions.nodes import boot_id
from gpuremediate.kube import errors
from gpuremediate.kube.resources import EVENTS, JOBS, NODES, PODS
from gpuremediate.policy.config import PolicyFile
from gpuremediate.vocab import states
from sim.waiting import wait_for

from .harness import PERSON_USER, reliability_policy
from .test_regressions import NODE, Rig, _action, _rig, _state

JOBS_NS = "gpuremediate-jobs"


def _slow_reboot_policy() -> PolicyFile:
    """A reboot Job may take 30 s and its boot 20 s more: there is time for the world to act while it runs."""
    policy = reliability_policy(1)
    remediation = policy.defaults.remediation
    slow = dataclasses.replace(remediation, reboot=dataclasses.replace(remediation.reboot, timeout_s=30.0),
                               reboot_ready_timeout_s=20.0)
    return dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, remediation=slow))


@pytest.fixture
def rig() -> Iterator[Rig]:
    """Validation Jobs get 10 s instead of 2 s: an evicted pod's replacement runs within the attempt's time."""
    policy = reliability_policy(1)
    validation = policy.defaults.validation
    slow = dataclasses.replace(validation, job=dataclasses.replace(validation.job, timeout_s=10.0))
    yield from _rig(dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, validation=slow)))


@pytest.fixture
def reboot_rig() -> Iterator[Rig]:
    yield from _rig(_slow_reboot_policy())


def _jobs(rig: Rig, kind: str) -> list[str]:
    """The Jobs of ``kind`` the controller created on NODE (each name once)."""
    with rig.recorder.lock:
        return sorted({job.name for job in rig.recorder.jobs
                       if job.kind == kind and job.node == NODE and not job.deleted and job.user != PERSON_USER})


def _reboots(rig: Rig) -> int:
    """How many times a reboot Job's pod rebooted NODE."""
    return sum(1 for node, kind, ok in rig.cluster.job_log if node == NODE and kind == "reboot" and ok)


def _job_pods(rig: Rig, name: str) -> list[dict[str, Any]]:
    return [p for p in rig.kube.list(PODS, JOBS_NS)["items"]
            if (p["metadata"].get("labels") or {}).get("job-name") == name
            or any(ref.get("name") == name for ref in p["metadata"].get("ownerReferences") or [])]


def _node_events(rig: Rig, reason: str) -> list[str]:
    return [e["message"] for e in rig.kube.list(EVENTS, "default")["items"] if e["reason"] == reason]


def test_a_node_deleted_and_registered_again_mid_reboot_is_rebooted_once(reboot_rig: Rig) -> None:
    """``kubectl delete node`` and the kubelet's registering it again (a new UID, no record) while the reboot Job
    waits to run: the new flow follows that Job instead of creating a second one, and the node reboots once."""
    rig = reboot_rig
    assert rig.cluster.nodesim is not None
    rig.cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=4.0, kind="reboot")
    rig.cluster.gpusim.inject_xid(NODE, 0, 79)  # fallen off the bus: reboot
    wait_for(lambda: bool(_jobs(rig, "reboot")), 15, "the reboot Job")
    old_uid = rig.kube.get(NODES, NODE)["metadata"]["uid"]
    rig.person.delete(NODES, NODE)
    rig.cluster.nodesim.add_node(NODE, gpus=2, labels=rig.cluster._node_labels(NODE))
    assert rig.kube.get(NODES, NODE)["metadata"]["uid"] != old_uid
    wait_for(lambda: _reboots(rig) >= 1 and _state(rig.kube, NODE) == states.HEALTHY, 40,
             f"{NODE} rebooted and healthy again (it is {_state(rig.kube, NODE)})")
    time.sleep(1.0)  # a second reboot Job's pod would run within this (4 s after its creation at the latest)
    assert _jobs(rig, "reboot") and len(_jobs(rig, "reboot")) == 1, f"reboot Jobs: {_jobs(rig, 'reboot')}"
    assert _reboots(rig) == 1
    assert any("follows it instead of starting another" in m for m in _node_events(rig, "GPURemediationJob"))


def test_a_node_that_reboots_on_its_own_returns_only_after_its_reboot_job_is_gone(reboot_rig: Rig) -> None:
    """The machine reboots by itself (a watchdog, the BMC) while our reboot Job's pod has not run yet: the attempt
    ends the Job and its pod before the node goes on, so nothing reboots it again once it is back in service."""
    rig = reboot_rig
    assert rig.cluster.nodesim is not None
    rig.cluster.nodesim.set_image_pull(NODE, 6.0, kind="reboot")  # its pod pending that long, then it reboots
    rig.cluster.gpusim.inject_xid(NODE, 0, 79)
    wait_for(lambda: (action := _action(rig)) is not None and action.kind == "reboot" and action.created,
             15, "the reboot Job created and recorded")
    job = rig.record().action.name  # type: ignore[union-attr]
    before = boot_id(rig.kube.get(NODES, NODE))
    rig.cluster.gpusim.reboot(NODE)
    rig.cluster.nodesim.reboot(NODE, down_s=0.3)  # on its own: no Job of ours did this
    wait_for(lambda: boot_id(rig.kube.get(NODES, NODE)) != before, 5, "the new boot")
    wait_for(lambda: _state(rig.kube, NODE) in (states.VALIDATING, states.HEALTHY), 20,
             f"{NODE} past its repair (it is {_state(rig.kube, NODE)})")
    with pytest.raises(errors.NotFound):
        rig.kube.get(JOBS, job, JOBS_NS)
    assert _job_pods(rig, job) == [], "the reboot Job's pod outlived the attempt"
    wait_for(lambda: _state(rig.kube, NODE) == states.HEALTHY, 15, f"{NODE} healthy")
    time.sleep(6.5)  # the Job's pod would have started and rebooted the node by now
    assert _reboots(rig) == 0, "our reboot Job rebooted a node that was back in service"


def test_a_reboot_job_whose_status_lags_its_pod_is_done_not_deleted(reboot_rig: Rig) -> None:
    """On a real cluster a Job's status follows its pods a second or more later (the Job controller's
    SyncJobBatchPeriod): the node's new boot can be seen while the Job still reads as running. Its pod ran: the
    reboot is the Job's, the attempt is done, and the Job is not deleted as if the node had rebooted on its own."""
    rig = reboot_rig
    assert rig.cluster.nodesim is not None
    rig.cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=30.0, kind="reboot")  # still Running
    rig.cluster.gpusim.inject_xid(NODE, 0, 79)
    wait_for(lambda: (action := _action(rig)) is not None and action.kind == "reboot" and action.created,
             15, "the reboot Job created and recorded")
    job = rig.record().action.name  # type: ignore[union-attr]
    wait_for(lambda: any(p["status"].get("phase") == "Running" for p in _job_pods(rig, job)), 10,
             "the reboot pod running")
    rig.cluster.gpusim.reboot(NODE)
    rig.cluster.nodesim.reboot(NODE, down_s=0.3)  # what the pod's reboot does; the Job reads running still
    wait_for(lambda: _state(rig.kube, NODE) in (states.VALIDATING, states.HEALTHY), 20,
             f"{NODE} past its repair (it is {_state(rig.kube, NODE)})")
    assert rig.kube.get(JOBS, job, JOBS_NS)["metadata"].get("deletionTimestamp") is None
    assert job in rig.jobs_named(), "the reboot Job was deleted"
    # Validation starts at once: the reboot Job reading running is this flow's concluded step, not a Job in flight.
    wait_for(lambda: bool(_jobs(rig, "validate")), 10, "the validation Job")
    assert not rig.kube.get(JOBS, job, JOBS_NS).get("status", {}).get("conditions"), "the reboot Job finished"
    assert _node_events(rig, "GPURemediationWaiting") == []


def test_a_person_draining_the_node_during_validation_does_not_quarantine_it(rig: Rig) -> None:
    """``kubectl drain`` evicts the validation Job's pod: that pod was disrupted, it did not fail. The Job runs
    another (its podFailurePolicy ignores DisruptionTarget) and the repaired node is validated, not quarantined."""
    assert rig.cluster.nodesim is not None
    rig.cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=1.5, kind="validate")
    rig.cluster.gpusim.inject_dbe(NODE, 0)  # reset-gpu, then validate
    rig.wait_state(states.VALIDATING, 20)

    def running_validation_pod() -> dict[str, Any] | None:
        pods = [p for p in rig.kube.list(PODS, JOBS_NS)["items"]
                if (p["metadata"].get("labels") or {}).get(JOB_LABEL) == "validate"
                and (p["metadata"].get("labels") or {}).get(NODE_LABEL) == NODE
                and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        return pods[0] if pods else None

    pod = wait_for(running_validation_pod, 10, "the validation Job's pod running")
    rig.person.evict(pod["metadata"]["name"], JOBS_NS)  # what kubectl drain sends
    wait_for(lambda: _state(rig.kube, NODE) in (states.HEALTHY, states.QUARANTINED), 20,
             f"{NODE} validated (it is {_state(rig.kube, NODE)})")
    assert _state(rig.kube, NODE) == states.HEALTHY, rig.record().message
    assert len(_jobs(rig, "validate")) == 1


def _stuck_policy() -> PolicyFile:
    policy = reliability_policy(1)
    drain = dataclasses.replace(policy.defaults.drain, timeout_s=2.0, timeout_action="delete", stuck_s=1.0)
    return dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, drain=drain))


@pytest.fixture
def stuck_rig() -> Iterator[Rig]:
    yield from _rig(_stuck_policy())


def test_a_pod_stuck_terminating_does_not_keep_the_drain_forever(stuck_rig: Rig) -> None:
    """A pod that never finishes terminating (a finalizer, a D-state process): past the drain's timeout and the
    pods' own grace, the drain ends by its policy (``delete``: on to the repair) with an Event, freeing the budget
    slot, instead of waiting forever."""
    rig = stuck_rig
    rig.cluster.workload("stuck", NODE)
    wait_for(lambda: rig.kube.get(PODS, "stuck", "workloads")["status"].get("phase") == "Running", 10,
             "the workload running")
    rig.person.patch(PODS, "stuck", {"metadata": {"finalizers": ["example.com/never-done"]}}, "workloads")
    rig.person.delete(PODS, "stuck", "workloads", grace_period_seconds=1)  # terminating, and it stays so
    rig.cluster.gpusim.inject_dbe(NODE, 0)
    rig.wait_state(states.DRAINING, 15)
    wait_for(lambda: _state(rig.kube, NODE) != states.DRAINING, 30,
             f"the drain to end (it is {_state(rig.kube, NODE)})")
    assert _state(rig.kube, NODE) in (states.REPAIRING, states.VALIDATING, states.HEALTHY)
    assert rig.kube.get(PODS, "stuck", "workloads")["metadata"].get("deletionTimestamp")
    wait_for(lambda: [m for m in _node_events(rig, "GPUDrainTimedOut") if "workloads/stuck" in m], 10,
             "an Event naming the stuck pod")



@pytest.fixture
def four_node_rig() -> Iterator[Rig]:
    yield from _rig(reliability_policy(1), nodes=4)


def test_drains_admitted_by_several_workers_at_once_keep_the_budget(four_node_rig: Rig) -> None:
    """Four nodes fault at once, the budget is one node, the loop has four workers and every Node write takes half
    a second: each admission counts the one before it (decided in turn, written outside), so one node drains at a
    time (the checker fails on a second slot holder or a drain started past the budget)."""
    rig = four_node_rig
    assert rig.controllers.settings.loop_workers >= 4
    rig.cluster.api.inject("PATCH", r"^/api/v1/nodes/[^/?]+(\?.*)?$", count=10**6, action="delay", delay_s=0.5)
    names = [n["metadata"]["name"] for n in rig.kube.list(NODES)["items"]]
    for name in names:
        rig.cluster.gpusim.inject_xid(name, 0, 48)
    wait_for(lambda: any(_state(rig.kube, n) in (states.REPAIRING, states.VALIDATING) for n in names), 30,
             "a first drain through")
    time.sleep(2.0)  # the others' admissions, had they raced it, have written by now
    assert rig.violations("budget-slots") == []
    assert rig.violations("budget-admission") == []
