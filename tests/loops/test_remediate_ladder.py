"""The escalation ladder and the diagnostics Job in the remediate loop (issue 13 part 3): a bare emulator (its Job
controller makes the pods), a hand-made node, scripted readings, the controller in process; the test plays the
kubelet (a Job pod's phase) and the remediation plugin."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.plugins.remediation import API_VERSION, KIND, install_crd, remediation_crd
from gpuremediate import fleet
from gpuremediate.actions.jobs import JOB_LABEL
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import EVENTS, JOBS, NAMESPACES, NODES, PODS, SERVICEACCOUNTS
from gpuremediate.loops import diagnostics
from gpuremediate.loops.remediate import current_rung
from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.workflow import DiagnosticsPolicy, RemediationPolicy, Rung
from gpuremediate.vocab import states
from gpuremediate.vocab.record import (
    DIAGNOSTICS_FAILED,
    DIAGNOSTICS_SKIPPED,
    OUTCOME_ESCALATED,
    OUTCOME_REPAIR_FAILED,
    OUTCOME_REPAIRED,
    ActionInProgress,
    Diagnostics,
    Fault,
    NodeRecord,
    record_from_node,
)
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for
from tests.loops.test_custom_plugins import NODE, SYSTEM_NS, FaultySource

JOBS_NS = "gpuremediate-jobs"

BASE = f"""
[drain]
retry_s = 0.2
timeout_s = 30
[remediation]
max_attempts = 2
reboot_wait_for_boot_id = false
[validation]
enabled = false
[budget]
max_unavailable = "1"
[breaker]
enabled = false
[xid.overrides]
"79" = "reset-gpu"
[actions.rma]
apiGroup = "remediation.example.com"
version = "v1alpha1"
kind = "{KIND}"
scope = "Namespaced"
namespace = "{SYSTEM_NS}"
equivalenceGroup = "external-rma"
timeout = 30
maxAttempts = 3
"""

TO_REBOOT = BASE + """
[remediation.ladders]
reset-gpu = [{action = "reset-gpu", attempts = 1, timeout = "45s"}, {action = "reboot", attempts = 1}]
"""

TO_REBOOT_LADDER = (Rung("reset-gpu", 1, 45.0), Rung("reboot", 1))  # as explain_node resolves it

TO_RMA = BASE + """
[remediation.ladders]
reset-gpu = [{action = "reset-gpu", attempts = 1}, {action = "rma", attempts = 1}, {action = "quarantine"}]
"""


@dataclass
class World:
    srv: KubeAPIServer
    kube: KubeClient
    controllers: list[Controller]

    def start(self, policy_text: str) -> Controller:
        settings = Settings(namespace=SYSTEM_NS, scrape_interval_s=0.1, resync_s=0.3)
        controller = Controller(settings, loads_policy(policy_text, "test-policy"), client=self.kube,
                                source=FaultySource(79))
        assert controller.start_caches(timeout=20)
        controller.start_loops()
        self.controllers.append(controller)
        return controller

    def record(self) -> NodeRecord:
        record = record_from_node(self.kube.get(NODES, NODE))
        assert isinstance(record, NodeRecord), record
        return record

    def state(self) -> str:
        record = record_from_node(self.kube.get(NODES, NODE))
        return record.state if isinstance(record, NodeRecord) else "-"

    def jobs(self, kind: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.kube.list(JOBS, JOBS_NS, label_selector=f"{JOB_LABEL}={kind}")["items"]
        return items

    def finish_job(self, kind: str, ok: bool) -> dict[str, Any]:
        """Play the kubelet: the (one) Job of ``kind``'s pod ends Succeeded or Failed."""
        wait_for(lambda: any(self._pods_of(j) for j in self.jobs(kind)), 20, f"a {kind} Job pod")
        job = self.jobs(kind)[0]
        for pod in self._pods_of(job):
            self.kube.patch(PODS, pod["metadata"]["name"], {"status": {"phase": "Succeeded" if ok else "Failed"}},
                            JOBS_NS, subresource="status")
        return job

    def _pods_of(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        pods = self.kube.list(PODS, JOBS_NS)["items"]
        return [p for p in pods if any(o.get("name") == job["metadata"]["name"]
                                       for o in p["metadata"].get("ownerReferences") or [])]

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.list(EVENTS, "default")["items"] if e["reason"] == reason]


@pytest.fixture
def world() -> Iterator[World]:
    srv = KubeAPIServer().start()
    kube = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    for namespace in (SYSTEM_NS, JOBS_NS, "default"):
        with contextlib.suppress(errors.AlreadyExists):
            kube.create(NAMESPACES, {"metadata": {"name": namespace}})
    kube.create(SERVICEACCOUNTS, {"metadata": {"name": "gpuremediate-job"}}, JOBS_NS)
    kube.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}}})
    made = World(srv, kube, [])
    try:
        yield made
    finally:
        for controller in made.controllers:
            controller.stop()
        srv.stop()


def _history(record: NodeRecord) -> list[tuple[str, str]]:
    return [(h.action, h.outcome) for h in record.history]


def test_a_failed_reset_escalates_to_a_reboot_that_repairs(world: World) -> None:
    controller = world.start(TO_REBOOT)
    reset = world.finish_job("reset-gpu", ok=False)
    assert reset["spec"]["activeDeadlineSeconds"] == 45  # the rung's timeout
    wait_for(lambda: world.jobs("reboot"), 20, f"the reboot rung's Job (state {world.state()})")
    record = world.record()
    assert record.state == states.REPAIRING and record.action is not None
    assert (record.action.kind, record.action.rung, record.action.attempt) == ("reboot", 1, 1)
    assert "rung 2/2 reboot, attempt 1/1" in fleet.explain(record, NODE, ladder=TO_REBOOT_LADDER)
    wait_for(lambda: world.events("GPURemediationEscalated"), 10, "the escalation Event")
    message = world.events("GPURemediationEscalated")[0]["message"]
    assert "rung 2/2 reboot" in message and "reset-gpu failed 1 time(s)" in message, message
    assert controller.metrics.escalations.value(**{"from": "reset-gpu", "to": "reboot"}) == 1.0
    world.finish_job("reboot", ok=True)
    wait_for(lambda: world.state() == states.HEALTHY, 20, f"healthy after the reboot (state {world.state()})")
    assert _history(world.record()) == [("reset-gpu", OUTCOME_ESCALATED), ("reboot", OUTCOME_REPAIRED)]
    assert len(world.jobs("reset-gpu")) == 1  # the reset was not retried: its rung had one attempt


def test_a_ladder_ending_in_a_custom_action_quarantines_when_it_fails(world: World) -> None:
    res = install_crd(world.kube, remediation_crd(), API_VERSION, KIND)
    world.start(TO_RMA)
    world.finish_job("reset-gpu", ok=False)
    wait_for(lambda: world.kube.list(res, SYSTEM_NS)["items"], 20, f"the rma resource (state {world.state()})")
    resource = world.kube.list(res, SYSTEM_NS)["items"][0]
    record = world.record()
    assert record.action is not None and (record.action.kind, record.action.rung) == ("rma", 1)
    world.kube.patch(res, resource["metadata"]["name"], {"status": {"conditions": [
        {"type": "Complete", "status": "False", "reason": "NoSpare", "message": "no spare GPU"}]}}, SYSTEM_NS,
        subresource="status")
    # rma's own maxAttempts is 3: the rung's attempts = 1 win, and quarantine (explicit last rung) follows.
    wait_for(lambda: world.state() == states.QUARANTINED, 20, f"quarantined (state {world.state()})")
    record = world.record()
    assert record.reason == states.REPAIR_FAILED
    assert _history(record) == [("reset-gpu", OUTCOME_ESCALATED), ("rma", OUTCOME_REPAIR_FAILED)]
    assert len(world.kube.list(res, SYSTEM_NS)["items"]) == 1
    text = fleet.explain(record, NODE)
    assert "xid 79 → reset-gpu: escalated" in text and "xid 79 → rma: repair-failed" in text, text


def test_diagnostics_run_once_before_the_first_repair_and_a_failure_does_not_block_it(world: World) -> None:
    world.start(BASE + "[remediation.diagnostics]\nenabled = true\noutput_dir = \"/var/log/bug-reports\"\n")
    wait_for(lambda: world.jobs("diagnostics"), 20, f"the diagnostics Job (state {world.state()})")
    assert world.jobs("reset-gpu") == []  # not before the diagnostics ended
    job = world.jobs("diagnostics")[0]
    name = job["metadata"]["name"]
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DIAGNOSTICS_OUTPUT"] == f"/var/log/bug-reports/{name}.log"
    assert env["DIAGNOSTICS_DIR"] == "/var/log/bug-reports"
    world.finish_job("diagnostics", ok=False)
    wait_for(lambda: world.jobs("reset-gpu"), 20, f"the reset after failed diagnostics (state {world.state()})")
    record = world.record()
    assert record.fault is not None and record.fault.diagnostics is not None
    assert record.fault.diagnostics.outcome == DIAGNOSTICS_FAILED
    assert record.fault.diagnostics.location == f"/var/log/bug-reports/{name}.log"
    wait_for(lambda: world.events("GPUDiagnosticsCollected"), 10, "the diagnostics Event")
    event = world.events("GPUDiagnosticsCollected")[0]
    assert event["type"] == "Warning" and f"/var/log/bug-reports/{name}.log" in event["message"]
    assert f"Diagnostics: diagnostics Job {name} failed; the repair goes on" in fleet.explain(record, NODE)
    world.finish_job("reset-gpu", ok=False)  # the second reset attempt: diagnostics are not run again
    wait_for(lambda: len(world.jobs("reset-gpu")) == 2, 20, "the second reset attempt")
    assert len(world.jobs("diagnostics")) == 1


def test_diagnostics_are_skipped_on_a_node_that_is_not_ready(world: World) -> None:
    world.kube.patch(NODES, NODE, {"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}}, subresource="status")
    world.start(TO_REBOOT + "[remediation.diagnostics]\nenabled = true\n")
    wait_for(lambda: world.jobs("reset-gpu"), 20, f"the reset without waiting for diagnostics (state {world.state()})")
    assert world.jobs("diagnostics") == []  # a Job could not run on a node that is down
    record = world.record()
    assert record.fault is not None and record.fault.diagnostics is not None
    assert record.fault.diagnostics.outcome == DIAGNOSTICS_SKIPPED
    wait_for(lambda: world.events("GPUDiagnosticsCollected"), 10, "the diagnostics Event")
    assert "is not Ready" in world.events("GPUDiagnosticsCollected")[0]["message"]


def _mid_ladder(rung: int, name: str = "") -> NodeRecord:
    fault = Fault("xid", "79", (), "f", "reset-gpu", 1.0, 1.0, "")
    return NodeRecord(state=states.REPAIRING, fault=fault, action=ActionInProgress("rma", name, 1, 2.0, rung=rung))


def test_a_reload_that_shortens_the_ladder_keeps_the_rung_index_clamped() -> None:
    three = loads_policy(TO_RMA).defaults.remediation
    assert current_rung(three, _mid_ladder(1)) == (1, (Rung("reset-gpu", 1), Rung("rma", 1)))
    assert current_rung(RemediationPolicy(), _mid_ladder(1)) == (0, (Rung("reset-gpu"),))
    assert current_rung(RemediationPolicy(), NodeRecord(state=states.REPAIRING, fault=_mid_ladder(0).fault)) == (
        0, (Rung("reset-gpu"),))


def test_a_restart_on_the_second_rung_goes_on_there_without_repeating_the_first(world: World) -> None:
    first = world.start(TO_REBOOT)
    world.finish_job("reset-gpu", ok=False)
    wait_for(lambda: world.jobs("reboot"), 20, f"the reboot rung's Job (state {world.state()})")
    first.stop()
    world.controllers.remove(first)
    record = world.record()
    assert record.action is not None and (record.action.kind, record.action.rung) == ("reboot", 1)
    world.start(TO_REBOOT)
    world.finish_job("reboot", ok=True)
    wait_for(lambda: world.state() == states.HEALTHY, 20, f"healthy after the reboot (state {world.state()})")
    assert len(world.jobs("reset-gpu")) == 1 and len(world.jobs("reboot")) == 1
    assert _history(world.record()) == [("reset-gpu", OUTCOME_ESCALATED), ("reboot", OUTCOME_REPAIRED)]


def test_diagnostics_are_due_once_before_the_first_attempt_and_one_under_way_is_finished() -> None:
    on, off = DiagnosticsPolicy(enabled=True), DiagnosticsPolicy()
    fault = _mid_ladder(0).fault
    assert fault is not None
    fresh = NodeRecord(state=states.REPAIRING, fault=fault)
    assert diagnostics.due(on, fresh) and not diagnostics.due(off, fresh)
    under_way = dataclasses.replace(fresh, action=ActionInProgress(diagnostics.DIAGNOSTICS, "gpur-diagnostics", 1, 2.0))
    assert diagnostics.due(off, under_way)  # a reload turned them off: the Job under way still ends as diagnostics
    retry = dataclasses.replace(fresh, action=ActionInProgress("reset-gpu", "", 2, 2.0))
    assert not diagnostics.due(on, retry)  # a repair attempt ran: the evidence is gone
    done = dataclasses.replace(fresh, fault=dataclasses.replace(
        fault, diagnostics=Diagnostics(DIAGNOSTICS_FAILED, "gpur-diagnostics", "/x.log", 3.0)))
    assert not diagnostics.due(on, done)
