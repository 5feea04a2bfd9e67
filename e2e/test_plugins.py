"""Plugin scenarios (issue 5): custom drain through DrainRequest + the drain-window plugin, and
custom remediation through RemediationRequest + the example controller (e2e/plugins/remediation.py).

Run: ``python -m pytest e2e/test_plugins.py -x -q``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from e2e.harness import ROOT, SYSTEM_NS, Cluster, _child_env
from e2e.plugins.remediation import (
    API_VERSION,
    KIND,
    ExampleRemediationController,
    drain_request_crd,
    install_crd,
    remediation_crd,
)
from gpuremediate.actions.custom import condition
from gpuremediate.kube.resources import Resource
from gpuremediate.vocab.window import DAYS

DRAIN_API = "nvsentinel.nvidia.com/v1alpha1"
NODE_LABEL = "nvsentinel.nvidia.com/node-name"


def action(group: str, **extra: Any) -> dict[str, Any]:
    return {"apiGroup": "remediation.example.com", "version": "v1alpha1", "kind": KIND, "scope": "Namespaced",
            "namespace": SYSTEM_NS, "completeConditionType": "Complete", "equivalenceGroup": group,
            "timeout": 20, "maxAttempts": 2,
            "template": {"metadata": {"labels": {"team": "gpu-ops"}},
                         "spec": {"nodeName": "{{nodeName}}", "action": "{{action}}",
                                  "healthEventId": "{{healthEventID}}", "gpus": "{{gpuUUIDs}}"}},
            **extra}


REMEDIATION_POLICY: dict[str, dict[str, Any]] = {
    "xid.overrides": {"79": "rma", "48": "rma"},
    "actions.rma": action("external-rma", supersedingEquivalenceGroups=["restart"]),
    "actions.reboot-vm": action("restart"),
}


def custom_drain_policy(**extra: Any) -> dict[str, dict[str, Any]]:
    return {"customDrain": {"enabled": True, "namespace": SYSTEM_NS, "timeout": 20, **extra}}


# ---- helpers ------------------------------------------------------------------------------------


class DrainWindowProcess:
    """``gpuremediate plugin drain-window`` as its Deployment runs it (a subprocess)."""

    def __init__(self, cluster: Cluster, days: str) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in stop())
        args = [sys.executable, "-m", "gpuremediate", "plugin", "drain-window", f"--days={days}",
                "--hours=00:00-24:00", "--timezone=UTC", "--retry=300ms", "--resync=1s", "--log-format=json",
                *cluster.kubeconfig_args()]
        self.proc = subprocess.Popen(args, cwd=ROOT, env=_child_env(), stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.seek(0)
        text = self.log.read()
        self.log.close()
        return text


@pytest.fixture
def drain_res(cluster: Cluster) -> Resource:
    return install_crd(cluster.kube, drain_request_crd(), DRAIN_API, "DrainRequest")


@pytest.fixture
def remediation(cluster: Cluster) -> Iterator[ExampleRemediationController]:
    install_crd(cluster.kube, remediation_crd(), API_VERSION, KIND)
    controller = ExampleRemediationController(cluster.kube).start()
    yield controller
    controller.stop()


@pytest.fixture
def plugins(cluster: Cluster) -> Iterator[list[DrainWindowProcess]]:
    running: list[DrainWindowProcess] = []
    yield running
    for proc in running:
        print(proc.stop()[-3000:])


def today() -> str:
    return DAYS[datetime.now(UTC).weekday()]


def not_today() -> str:
    return DAYS[(datetime.now(UTC).weekday() + 3) % 7]


def drain_requests(cluster: Cluster, res: Resource, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kube.list(res, SYSTEM_NS, label_selector=f"{NODE_LABEL}={node}")["items"]
    return items


def requests_for(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    res = cluster.kube.resolve(API_VERSION, KIND)
    items = cluster.kube.list(res, SYSTEM_NS, label_selector=f"gpuremediate.io/node={node}")["items"]
    return sorted(items, key=lambda i: i["metadata"]["creationTimestamp"] + i["metadata"]["name"])


def cond_status(obj: Mapping[str, Any], type_: str) -> str | None:
    found = condition(obj, type_)
    return None if found is None else str(found.get("status"))


def release(cluster: Cluster, node: str) -> None:
    done = cluster.cli("release", node, "--by", "e2e")
    assert done.returncode == 0, done.stderr


# ---- custom drain -------------------------------------------------------------------------------


def test_custom_drain_completes(cluster: Cluster, drain_res: Resource, plugins: list[DrainWindowProcess]) -> None:
    node, other = cluster.nodes[0], cluster.nodes[1]
    cluster.workload("train-a", node)
    cluster.workload("daemon-like", node, gpus=0)
    cluster.workload("bystander", other)
    cluster.start_controller({**custom_drain_policy(), "drain": {"scope": "gpu"}})
    cluster.inject(node, 3, "xid", 48)  # a reset of GPU 3 (a reboot would widen the scope to every pod)
    seen = cluster.wait(lambda: drain_requests(cluster, drain_res, node), 10, f"a DrainRequest for {node}",
                        seen=lambda: cluster.summary(node))
    request = seen[0]
    rec = cluster.record(node)
    assert rec is not None and rec.state == "draining"
    assert request["metadata"]["name"].startswith(f"drain-{node}-")
    spec = request["spec"]
    assert spec["nodeName"] == node
    assert spec["podsToDrain"] == {"workloads": ["train-a"]}, spec  # scope gpu: the GPU-less pod stays
    assert spec["recommendedAction"] == "reset-gpu" and spec["errorCode"] == ["48"]
    assert request["metadata"]["name"].endswith(spec["healthEventID"])
    cluster.holds(lambda: cluster.evicted() == set() and cluster.state(node) == "draining", 1.0,
                  "no eviction by the controller itself although a drain plugin is configured",
                  seen=lambda: (cluster.evicted(), cluster.summary(node)))
    plugins.append(DrainWindowProcess(cluster, "Mon-Sun"))
    rec2 = cluster.wait_state(node, "healthy", 30)
    assert rec2.reason == "validation-passed"
    assert cluster.evicted() == {"workloads/train-a"}
    assert cluster.pod_exists("daemon-like") and cluster.pod_exists("bystander")
    assert drain_requests(cluster, drain_res, node) == [], "the DrainRequest is deleted once complete"
    reasons = cluster.event_reasons(node)
    assert "GPUDrainRequested" in reasons and reasons.index("GPUDrainRequested") < reasons.index("GPUNodeRepairing")


def test_custom_drain_deferred_then_allowed(cluster: Cluster, drain_res: Resource,
                                            plugins: list[DrainWindowProcess]) -> None:
    node = cluster.nodes[0]
    cluster.workload("train-a", node)
    cluster.start_controller(custom_drain_policy())
    plugins.append(DrainWindowProcess(cluster, not_today()))
    cluster.inject(node, 1, "xid", 79)

    def deferred() -> dict[str, Any] | None:
        items = drain_requests(cluster, drain_res, node)
        return items[0] if items and cond_status(items[0], "DrainDeferred") == "True" else None

    request = cluster.wait(deferred, 15, "DrainDeferred=True on the DrainRequest",
                           seen=lambda: drain_requests(cluster, drain_res, node))
    assert request is not None
    deferral = condition(request, "DrainDeferred") or {}
    message = str(deferral.get("message"))
    assert "next opening" in message and not_today() in message, message
    assert cond_status(request, "DrainComplete") is None
    assert deferral.get("observedGeneration") == request["metadata"]["generation"]
    cluster.holds(lambda: cluster.pod_exists("train-a") and cluster.evicted() == set()
                  and cluster.state(node) == "draining", 1.5, "a deferred drain touches no pod",
                  seen=lambda: (cluster.evicted(), cluster.summary(node)))
    # The deferral shows on the node: `gpuremediate status` says what it waits for, and until when.
    waiting = cluster.wait(lambda: cluster.blocked_record(node, "window"), 5, "the node blocked: window")
    assert waiting is not None and waiting.blocked is not None and "next opening" in waiting.blocked.detail, waiting

    plugins.pop().stop()
    plugins.append(DrainWindowProcess(cluster, today()))
    rec = cluster.wait_state(node, "healthy", 30)
    assert rec.reason == "validation-passed"
    assert cluster.evicted() == {"workloads/train-a"}


@pytest.mark.parametrize("on_timeout", ["quarantine", "builtin"])
def test_custom_drain_times_out(cluster: Cluster, drain_res: Resource, on_timeout: str) -> None:
    node = cluster.nodes[2]
    cluster.workload("train-a", node)
    cluster.start_controller(custom_drain_policy(timeout=2, onTimeout=on_timeout))
    cluster.inject(node, 0, "xid", 79)
    cluster.wait(lambda: drain_requests(cluster, drain_res, node), 10, "a DrainRequest")
    if on_timeout == "quarantine":
        rec = cluster.wait_state(node, "quarantined", 15)
        assert rec.reason == "drain-failed" and "DrainComplete=True" in rec.message, rec.message
        assert cluster.pod_exists("train-a") and cluster.evicted() == set()
        cluster.wait_event(node, "GPUDrainTimedOut")
    else:
        rec = cluster.wait_state(node, "healthy", 30)
        assert rec.reason == "validation-passed"
        assert cluster.evicted() == {"workloads/train-a"}, "the built-in drain took over"
        cluster.wait_event(node, "GPUDrainPluginTimedOut")
    assert drain_requests(cluster, drain_res, node) == []


# ---- custom remediation -------------------------------------------------------------------------


def test_custom_remediation_succeeds(cluster: Cluster, remediation: ExampleRemediationController) -> None:
    node = cluster.nodes[0]
    cluster.start_controller(REMEDIATION_POLICY)
    cluster.inject(node, 2, "xid", 79)
    rec = cluster.wait_state(node, "healthy", 30)
    assert [(h.kind, h.code, h.action, h.outcome) for h in rec.history] == [("xid", "79", "rma", "repaired")]
    made = requests_for(cluster, node)
    assert len(made) == 1, [m["metadata"]["name"] for m in made]
    obj = made[0]
    labels = obj["metadata"]["labels"]
    assert labels["gpuremediate.io/action"] == "rma" and labels["gpuremediate.io/equivalence-group"] == "external-rma"
    assert labels["gpuremediate.io/attempt"] == "1" and labels["team"] == "gpu-ops"
    assert obj["spec"]["nodeName"] == node and obj["spec"]["action"] == "rma"
    assert obj["metadata"]["name"].endswith(f"-{obj['spec']['healthEventId']}-1")
    assert obj["spec"]["gpus"].startswith("GPU-"), obj["spec"]
    assert cond_status(obj, "Complete") == "True"
    assert cluster.jobs(node, "reboot") == [] and cluster.jobs(node, "reset-gpu") == []
    assert "GPURemediationRequested" in cluster.event_reasons(node)


def test_custom_remediation_fails_once_then_succeeds(cluster: Cluster,
                                                     remediation: ExampleRemediationController) -> None:
    node = cluster.nodes[1]
    remediation.set_mode(node, "fail-then-succeed")
    cluster.start_controller(REMEDIATION_POLICY)
    cluster.inject(node, 5, "xid", 79)
    rec = cluster.wait_state(node, "healthy", 30)
    assert rec.reason == "validation-passed"
    made = requests_for(cluster, node)
    assert [m["metadata"]["labels"]["gpuremediate.io/attempt"] for m in made] == ["1", "2"]
    assert [cond_status(m, "Complete") for m in made] == ["False", "True"]
    assert "GPURemediationFailed" in cluster.event_reasons(node)


def _leave_in_progress(cluster: Cluster, remediation: ExampleRemediationController, node: str, xid: int,
                       want_action: str) -> dict[str, Any]:
    """A first fault whose repair never completes: the attempt times out (the resource stays, its
    plugin may still act) and the node is quarantined; a person releases it back to healthy."""
    remediation.set_mode(node, "never")
    cluster.inject(node, 0, "xid", xid)
    rec = cluster.wait_state(node, "quarantined", 20)
    assert rec.reason == "repair-failed", rec
    made = requests_for(cluster, node)
    assert [m["metadata"]["labels"]["gpuremediate.io/action"] for m in made] == [want_action], made
    release(cluster, node)
    cluster.wait_state(node, "healthy", 20)
    return made[0]


def test_equivalence_group_suppresses_a_duplicate(cluster: Cluster,
                                                  remediation: ExampleRemediationController) -> None:
    node = cluster.nodes[0]
    short = {**REMEDIATION_POLICY, "actions.rma": {**REMEDIATION_POLICY["actions.rma"], "timeout": 1.5,
                                                  "maxAttempts": 1}}
    cluster.start_controller(short)
    first = _leave_in_progress(cluster, remediation, node, 79, "rma")
    cluster.inject(node, 4, "xid", 48)  # a new fault, the same group: the open request covers it
    cluster.wait(lambda: (r := cluster.record(node)) and r.action and r.action.name == first["metadata"]["name"],
                 20, "the new fault's repair to adopt the request in progress", seen=lambda: cluster.summary(node))
    cluster.wait_event(node, "GPURemediationCovered")
    remediation.complete(first["metadata"]["name"])
    rec = cluster.wait_state(node, "healthy", 20)
    assert rec.history[-1].action == "rma" and rec.history[-1].outcome == "repaired"
    assert [m["metadata"]["name"] for m in requests_for(cluster, node)] == [first["metadata"]["name"]]


def test_superseding_group_covers_a_narrower_one(cluster: Cluster,
                                                 remediation: ExampleRemediationController) -> None:
    node = cluster.nodes[1]
    policy = {**REMEDIATION_POLICY, "xid.overrides": {"79": "reboot-vm", "48": "rma"},
              "actions.reboot-vm": {**REMEDIATION_POLICY["actions.reboot-vm"], "timeout": 1.5, "maxAttempts": 1}}
    cluster.start_controller(policy)
    restart = _leave_in_progress(cluster, remediation, node, 79, "reboot-vm")
    cluster.inject(node, 6, "xid", 48)  # rma lists restart as superseding: the open restart covers it
    cluster.wait(lambda: (r := cluster.record(node)) and r.action and r.action.name == restart["metadata"]["name"],
                 20, "the rma repair to adopt the restart in progress", seen=lambda: cluster.summary(node))
    remediation.complete(restart["metadata"]["name"])
    rec = cluster.wait_state(node, "healthy", 20)
    assert rec.history[-1].action == "rma" and rec.history[-1].outcome == "repaired"
    actions = [m["metadata"]["labels"]["gpuremediate.io/action"] for m in requests_for(cluster, node)]
    assert actions == ["reboot-vm"], f"a narrower rma request was created: {actions}"


def test_restart_while_custom_resource_in_progress(cluster: Cluster,
                                                   remediation: ExampleRemediationController) -> None:
    node = cluster.nodes[3]
    remediation.set_mode(node, "never")
    cluster.start_controller(REMEDIATION_POLICY)
    cluster.inject(node, 1, "xid", 79)
    made = cluster.wait(lambda: requests_for(cluster, node), 20, "the RemediationRequest",
                        seen=lambda: cluster.summary(node))
    cluster.restart_controller()  # SIGKILL + start
    cluster.holds(lambda: [m["metadata"]["name"] for m in requests_for(cluster, node)] == [made[0]["metadata"]["name"]]
                  and cluster.state(node) == "repairing", 1.5,
                  "through several resyncs of the new controller: still repairing, the same one RemediationRequest",
                  seen=lambda: (requests_for(cluster, node), cluster.summary(node)))
    remediation.complete(made[0]["metadata"]["name"])
    rec = cluster.wait_state(node, "healthy", 20)
    assert rec.history[-1].outcome == "repaired"
    assert len(requests_for(cluster, node)) == 1
