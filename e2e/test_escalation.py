"""Escalation ladder and diagnostics scenarios (issue 13 part 3): a failed reset escalates to a reboot, a ladder
ends in a custom remediation, an exhausted ladder quarantines with its rungs in history and explain, and the
diagnostics Job runs before the first repair with its output location on an Event.

Run: ``python -m pytest e2e/test_escalation.py -x -q``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from e2e.harness import JOB_LABEL, Cluster
from e2e.plugins.remediation import API_VERSION, KIND, ExampleRemediationController, install_crd, remediation_crd
from e2e.test_plugins import action, requests_for

ESCALATED = "GPURemediationEscalated"
RESET_THEN_REBOOT = {"remediation.ladders": {"reset-gpu": [{"action": "reset-gpu", "attempts": 2},
                                                           {"action": "reboot", "attempts": 1}]}}


@pytest.fixture(autouse=True)
def clean_controller_log(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.stop_controller()
    assert cluster.log_problems() == []


@pytest.fixture
def plugin(cluster: Cluster) -> Iterator[ExampleRemediationController]:
    """The example remediation controller (it completes every request it sees)."""
    install_crd(cluster.kube, remediation_crd(), API_VERSION, KIND)
    controller = ExampleRemediationController(cluster.kube).start()
    yield controller
    controller.stop()


def fail_jobs(cluster: Cluster, node: str, *kinds: str) -> None:
    """The Jobs of ``kinds`` on ``node`` fail (their pods end Failed; a failed reboot does not reboot)."""
    cluster.require("choose a repair Job's outcome")
    nodesim = cluster.sim.nodesim  # type: ignore[attr-defined]
    decide_before = nodesim.job_succeeds

    def succeeds(name: str, pod: dict[str, Any]) -> bool:
        if name == node and (pod["metadata"].get("labels") or {}).get(JOB_LABEL) in kinds:
            return False
        return bool(decide_before(name, pod))

    nodesim.job_succeeds = succeeds


def history(cluster: Cluster, node: str) -> list[tuple[str, str]]:
    rec = cluster.record(node)
    assert rec is not None
    return [(h.action, h.outcome) for h in rec.history]


def test_reset_fails_twice_then_reboot_repairs(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    fail_jobs(cluster, node, "reset-gpu")
    cluster.start_controller(RESET_THEN_REBOOT)
    boot_before = cluster.node(node)["status"]["nodeInfo"]["bootID"]
    cluster.inject(node, 2, "dbe", 1)
    rec = cluster.wait_state(node, "healthy", 60)
    assert rec.reason == "validation-passed"
    assert history(cluster, node) == [("reset-gpu", "escalated"), ("reboot", "repaired")]
    assert len(cluster.jobs(node, "reset-gpu")) == 2 and len(cluster.jobs(node, "reboot")) == 1
    assert cluster.node(node)["status"]["nodeInfo"]["bootID"] != boot_before
    event = cluster.wait_event(node, ESCALATED, "rung 2/2 reboot")
    assert "reset-gpu failed 2 time(s)" in event["message"], event["message"]
    assert cluster.event_reasons(node).count(ESCALATED) == 1
    cluster.wait_metric("gpuremediate_escalations_total", 1, **{"from": "reset-gpu", "to": "reboot"})
    cluster.wait_metric("gpuremediate_remediation_seconds_count", 2, action="reset-gpu")
    cluster.wait_metric("gpuremediate_remediation_seconds_count", 1, action="reboot")


def test_ladder_to_a_custom_remediation(cluster: Cluster, plugin: ExampleRemediationController) -> None:
    node = cluster.nodes[1]
    fail_jobs(cluster, node, "reset-gpu")
    cluster.start_controller({
        "actions.rma": action("external-rma"),
        "remediation.ladders": {"reset-gpu": [{"action": "reset-gpu", "attempts": 1}, {"action": "rma"},
                                              {"action": "quarantine"}]}})
    cluster.inject(node, 4, "dbe", 1)
    rec = cluster.wait_state(node, "healthy", 60)
    assert rec.reason == "validation-passed"
    assert history(cluster, node) == [("reset-gpu", "escalated"), ("rma", "repaired")]
    made = requests_for(cluster, node)
    assert len(made) == 1 and made[0]["spec"]["action"] == "rma", [m["metadata"]["name"] for m in made]
    assert len(cluster.jobs(node, "reset-gpu")) == 1 and cluster.jobs(node, "reboot") == []
    cluster.wait_event(node, ESCALATED, "rung 2/2 rma")
    cluster.wait_metric("gpuremediate_escalations_total", 1, **{"from": "reset-gpu", "to": "rma"})


def test_exhausted_ladder_quarantines_with_its_rungs_in_history_and_explain(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    fail_jobs(cluster, node, "reset-gpu", "reboot")
    cluster.start_controller({"remediation.ladders": {"reset-gpu": [{"action": "reset-gpu", "attempts": 1},
                                                                    {"action": "reboot", "attempts": 1}]}})
    cluster.inject(node, 1, "dbe", 1)
    rec = cluster.wait_state(node, "quarantined", 60)
    assert rec.reason == "repair-failed" and cluster.unschedulable(node)
    assert history(cluster, node) == [("reset-gpu", "escalated"), ("reboot", "repair-failed")]
    assert cluster.jobs(node, "validate") == []
    explained = cluster.cli("explain", node)
    assert explained.returncode == 0, explained.stderr
    assert "ecc-dbe" in explained.stdout and "→ reset-gpu: escalated" in explained.stdout, explained.stdout
    assert "→ reboot: repair-failed" in explained.stdout, explained.stdout
    assert "GPUNodeQuarantined" in cluster.event_reasons(node)


def _time(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")


def test_diagnostics_job_runs_before_the_reset_and_names_its_output(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    cluster.start_controller({"remediation.diagnostics": {"enabled": True},
                              "remediation.diagnostics.job": {"command": "true", "timeout_s": 20}})
    cluster.inject(node, 3, "dbe", 1)
    rec = cluster.wait_state(node, "healthy", 60)
    assert history(cluster, node) == [("reset-gpu", "repaired")]
    [diagnostics] = cluster.jobs(node, "diagnostics")
    [reset] = cluster.jobs(node, "reset-gpu")
    name = diagnostics["metadata"]["name"]
    finished = diagnostics["status"].get("completionTime")
    assert finished is not None, diagnostics["status"]  # it succeeded, and it ended before the reset was made
    assert _time(finished) <= _time(reset["metadata"]["creationTimestamp"])
    location = f"/var/log/gpuremediate/diagnostics/{name}.log"
    event = cluster.wait_event(node, "GPUDiagnosticsCollected", location)
    assert event["type"] == "Normal" and f"on node {node}" in event["message"], event
    assert rec.fault is None  # the flow closed; the location stays on the Event
    cluster.wait_metric("gpuremediate_diagnostics_total", 1, outcome="ok")
