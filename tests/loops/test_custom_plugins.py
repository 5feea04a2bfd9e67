"""Custom drain and custom remediation against people and permissive or slow plugin resources
(issue 10 item 3, issue 17 items 2 and 7): a bare emulator, a hand-made node without pods (drains finish
at once), scripted readings, the controller in process; the test plays the plugins and the person."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.plugins.remediation import API_VERSION, KIND, install_crd, remediation_crd
from gpuremediate import fleet
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import EVENTS, NAMESPACES, NODES, Resource
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.vocab import states
from gpuremediate.vocab.record import ActionInProgress, NodeRecord, record_from_node
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for
from tests.loops.test_conflicts import ConflictingClient

NODE = "gpu-node-1"
SYSTEM_NS = "gpuremediate-system"
DRAIN_API = "nvsentinel.nvidia.com/v1alpha1"

BASE_POLICY = """
[drain]
retry_s = 0.2
timeout_s = 30
[remediation]
max_attempts = 2
[validation.job]
timeout_s = 10
[budget]
max_unavailable = "1"
[breaker]
enabled = false
"""

REMEDIATION_POLICY = BASE_POLICY + f"""
[xid.overrides]
"48" = "rma"
[actions.rma]
apiGroup = "remediation.example.com"
version = "v1alpha1"
kind = "{KIND}"
scope = "Namespaced"
namespace = "{SYSTEM_NS}"
completeConditionType = "Complete"
equivalenceGroup = "external-rma"
timeout = 30
maxAttempts = 2
[actions.rma.template.spec]
nodeName = "{{{{nodeName}}}}"
"""


def drain_policy(timeout: float) -> str:
    return BASE_POLICY + f"""
[customDrain]
enabled = true
namespace = "{SYSTEM_NS}"
timeout = {timeout}
"""


def permissive_drain_request_crd() -> dict[str, Any]:
    """A plugin CRD that accepts anything (no status subresource: status is written with the object)."""
    anything = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "drainrequests.nvsentinel.nvidia.com"},
        "spec": {"group": "nvsentinel.nvidia.com", "scope": "Namespaced",
                 "names": {"kind": "DrainRequest", "listKind": "DrainRequestList", "plural": "drainrequests",
                           "singular": "drainrequest"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": anything}}]},
    }


class FaultySource:
    """The node's one GPU reports ``xid`` (None: healthy)."""

    def __init__(self, xid: int | None) -> None:
        self.xid = xid

    def read(self) -> list[NodeReadings]:
        gpu = GpuReading(node=NODE, gpu="0", uuid="GPU-1", xid=self.xid)
        return [NodeReadings(node=NODE, source="exporter", status=SOURCE_OK, gpus=(gpu,))]


@dataclass
class World:
    srv: KubeAPIServer
    kube: KubeClient
    controllers: list[Controller]

    def start(self, policy_text: str, xid: int | None, client: KubeClient | None = None) -> Controller:
        settings = Settings(namespace=SYSTEM_NS, scrape_interval_s=0.1, resync_s=0.3)
        controller = Controller(settings, loads_policy(policy_text, "test-policy"), client=client or self.kube,
                                source=FaultySource(xid))
        assert controller.start_caches(timeout=20)
        controller.start_loops()
        self.controllers.append(controller)
        return controller


@pytest.fixture
def world() -> Iterator[World]:
    srv = KubeAPIServer().start()
    kube = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    for namespace in (SYSTEM_NS, "gpuremediate-jobs", "default"):
        with contextlib.suppress(errors.AlreadyExists):
            kube.create(NAMESPACES, {"metadata": {"name": namespace}})
    kube.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}}})
    made = World(srv, kube, [])
    try:
        yield made
    finally:
        for controller in made.controllers:
            controller.stop()
        srv.stop()


def _record(kube: KubeClient) -> NodeRecord | None:
    record = record_from_node(kube.get(NODES, NODE))
    return record if isinstance(record, NodeRecord) else None


def _action(kube: KubeClient) -> ActionInProgress | None:
    record = _record(kube)
    return record.action if record is not None else None


def _state(kube: KubeClient) -> str:
    record = _record(kube)
    return record.state if record is not None else "-"


def _events(kube: KubeClient, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list(EVENTS, "default")["items"] if e["reason"] == reason]


def _requests(kube: KubeClient, res: Resource) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.list(res, SYSTEM_NS)["items"]
    return items


def test_a_person_deleting_the_custom_remediation_resource_fails_that_attempt(world: World) -> None:
    kube = world.kube
    res = install_crd(kube, remediation_crd(), API_VERSION, KIND)
    world.start(REMEDIATION_POLICY, xid=48)
    wait_for(lambda: (a := _action(kube)) is not None and a.kind == "rma" and a.created, 20,
             f"the rma resource created and recorded (state {_state(kube)})")
    first = _action(kube)
    assert first is not None and first.attempt == 1
    kube.delete(res, first.name, SYSTEM_NS)  # a person stops this repair
    wait_for(lambda: (a := _action(kube)) is not None and a.attempt == 2 and a.created, 10,
             "the next attempt's resource")
    time.sleep(0.5)  # a wrong controller would now create the deleted resource again
    names = {r["metadata"]["name"] for r in _requests(kube, res)}
    assert first.name not in names, "the person's delete was undone"
    failed = [e["message"] for e in _events(kube, "GPURemediationFailed")]
    assert any(first.name in m and "deleted before it completed" in m for m in failed), failed


def test_custom_drain_timeout_counts_from_the_request_creation(world: World) -> None:
    """The first create after a CRD is Established takes ~2 s on a real server: a 2 s timeout counted from
    the drain's start would fire as the create returns, before any plugin could act."""
    kube = world.kube
    res = install_crd(kube, permissive_drain_request_crd(), DRAIN_API, "DrainRequest")
    world.srv.inject("POST", r"/drainrequests(\?.*)?$", count=1, action="delay", delay_s=2.5)
    world.start(drain_policy(timeout=2.0), xid=79)
    wait_for(lambda: bool(_requests(kube, res)), 20, "the DrainRequest")
    name = _requests(kube, res)[0]["metadata"]["name"]
    kube.patch(res, name, {"status": {"conditions": [{"type": "DrainComplete", "status": "True"}]}}, SYSTEM_NS)
    wait_for(lambda: _state(kube) in (states.REPAIRING, states.VALIDATING, states.HEALTHY, states.QUARANTINED), 10,
             f"the drain to end (state {_state(kube)})")
    record = _record(kube)
    assert record is not None and record.reason != states.DRAIN_FAILED, record.message


def test_malformed_drain_request_conditions_are_reported_once_not_a_crash(world: World) -> None:
    kube = world.kube
    res = install_crd(kube, permissive_drain_request_crd(), DRAIN_API, "DrainRequest")
    world.start(drain_policy(timeout=30.0), xid=79)
    wait_for(lambda: bool(_requests(kube, res)), 20, "the DrainRequest")
    name = _requests(kube, res)[0]["metadata"]["name"]
    kube.patch(res, name, {"status": {"conditions": ["DrainDeferred", 7, None]}}, SYSTEM_NS)
    wait_for(lambda: bool(_events(kube, "GPUPluginResourceMalformed")), 10, "the malformed request reported")
    time.sleep(1.0)  # several drain steps on the malformed request
    reported = _events(kube, "GPUPluginResourceMalformed")
    assert len(reported) == 1 and int(reported[0].get("count") or 1) == 1, reported
    assert "status.conditions[0] is str" in reported[0]["message"]
    kube.patch(res, name, {"status": {"conditions": [{"type": "DrainComplete", "status": "True"}]}}, SYSTEM_NS)
    wait_for(lambda: _state(kube) != states.DRAINING, 10, "the drain to complete once the plugin says so")
    assert _record(kube) is not None and _record(kube).reason == states.DRAIN_COMPLETE  # type: ignore[union-attr]


def test_a_forbidden_plugin_kind_backs_off_and_names_the_missing_permission(world: World) -> None:
    """As its ServiceAccount the controller may lack the custom kind's ClusterRole (capture 38): one refusal,
    then backoff (it was listed 430 times in one run), and the node says which permission is missing."""
    kube = world.kube
    install_crd(kube, remediation_crd(), API_VERSION, KIND)
    world.srv.add_token("sa-token", "system:serviceaccount:gpuremediate-system:gpuremediate")
    everything_but_the_plugin = [{"apiGroups": ["", "batch", "policy", "coordination.k8s.io", "events.k8s.io",
                                                "apiextensions.k8s.io"], "resources": ["*"], "verbs": ["*"]}]
    world.srv.enforce_rbac("system:serviceaccount:gpuremediate-system:gpuremediate", everything_but_the_plugin)
    config = ClusterConfig(server=world.srv.url, token_source=StaticToken("sa-token"))
    controller = world.start(REMEDIATION_POLICY, xid=48, client=KubeClient(config, qps=500, burst=500))
    wait_for(lambda: (r := _record(kube)) is not None and r.blocked is not None and r.blocked.reason == "permission",
             20, f"the node blocked on the permission (state {_state(kube)})")
    time.sleep(2.0)  # ~7 resyncs and many requeues: none may ask again inside the backoff
    refused = [r for r in world.srv.requests if r[3] == "remediationrequests"
               and r[0] == "system:serviceaccount:gpuremediate-system:gpuremediate"]
    assert len(refused) == 1, refused
    record = _record(kube)
    assert record is not None and record.blocked is not None
    detail = record.blocked.detail
    assert "list" in detail and "remediationrequests.remediation.example.com" in detail and SYSTEM_NS in detail
    assert len(_events(kube, "GPURemediationBlocked")) == 1
    metric = controller.ctx.metrics.permission_denied.value(verb="list", group="remediation.example.com",
                                                            resource="remediationrequests", namespace=SYSTEM_NS)
    assert metric == 1.0
    assert "Waiting: permission (RBAC refuses list on remediationrequests" in fleet.explain(record, NODE)


def test_ordinary_api_errors_in_the_loops_are_one_line_warnings(world: World,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A 500 while repairing: a one-line warning per retry, never a traceback per interval (issue 17 item 10)."""
    kube = world.kube
    install_crd(kube, remediation_crd(), API_VERSION, KIND)
    world.srv.inject("GET", r"/remediationrequests", count=30, status=500)
    caplog.set_level(logging.WARNING, logger="gpuremediate")
    world.start(REMEDIATION_POLICY, xid=48)
    wait_for(lambda: any("reconcile failed" in r.getMessage() for r in caplog.records), 20,
             f"the loop to meet the errors (state {_state(kube)})")
    tracebacks = [r for r in caplog.records if r.exc_info and r.name.startswith("gpuremediate")]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]


def _plugin_completes(kube: KubeClient, res: Resource, condition: str, stop: threading.Event) -> None:
    """Plays the plugin: every resource it sees gets ``condition=True``."""
    while not stop.wait(0.1):
        for item in _requests(kube, res):
            if not (item.get("status") or {}).get("conditions"):
                body = {"status": {"conditions": [{"type": condition, "status": "True", "reason": "Done"}]}}
                with contextlib.suppress(errors.ApiError):
                    sub = "status" if res.plural == "remediationrequests" else None
                    kube.patch(res, item["metadata"]["name"], body, SYSTEM_NS, subresource=sub)


def test_custom_drain_and_remediation_repeat_nothing_when_every_other_node_write_conflicts(world: World) -> None:
    kube = world.kube
    drain_res = install_crd(kube, permissive_drain_request_crd(), DRAIN_API, "DrainRequest")
    rma_res = install_crd(kube, remediation_crd(), API_VERSION, KIND)
    stop = threading.Event()
    plugins = [threading.Thread(target=_plugin_completes, args=(kube, drain_res, "DrainComplete", stop), daemon=True),
               threading.Thread(target=_plugin_completes, args=(kube, rma_res, "Complete", stop), daemon=True)]
    for plugin in plugins:
        plugin.start()
    policy = REMEDIATION_POLICY.replace("[validation.job]", "[validation]\nenabled = false\n[validation.job]") + \
        f'[customDrain]\nenabled = true\nnamespace = "{SYSTEM_NS}"\ntimeout = 30\n'
    client = ConflictingClient(kube.config, qps=500, burst=500)
    try:
        controller = world.start(policy, xid=48, client=client)
        wait_for(lambda: (r := _record(kube)) is not None and len(r.history) == 1 and r.state == states.HEALTHY,
                 60, f"{NODE} repaired by the plugins and healthy", seen=lambda: _state(kube))
    finally:
        stop.set()
    assert client.conflicts >= 3, "the test did not make the controller's node writes conflict"
    creates = Counter(r[3] for r in world.srv.requests if r[1] == "create" and r[3] in ("drainrequests",
                                                                                       "remediationrequests"))
    assert creates == {"drainrequests": 1, "remediationrequests": 1}, creates
    metrics = controller.ctx.metrics
    assert metrics.drain_seconds.count() == 1 and metrics.remediation_seconds.count(action="rma") == 1
    assert [line for line in metrics.transitions.render() if not line.endswith(" 1")] == []
    events = kube.list(EVENTS, "default")["items"]
    ours = [e for e in events if (e.get("source") or {}).get("component") == "gpuremediate"]
    seen = Counter((e["reason"], e["message"]) for e in ours for _ in range(int(e.get("count") or 1)))
    assert [k for k, n in seen.items() if n > 1] == []


def test_a_person_deleting_the_drain_request_ends_that_drain_it_is_not_created_again(world: World) -> None:
    kube = world.kube
    res = install_crd(kube, permissive_drain_request_crd(), DRAIN_API, "DrainRequest")
    world.start(drain_policy(timeout=30.0), xid=79)
    wait_for(lambda: (a := _action(kube)) is not None and a.created, 20, "the DrainRequest created and recorded")
    name = _requests(kube, res)[0]["metadata"]["name"]
    kube.delete(res, name, SYSTEM_NS)  # a person
    wait_for(lambda: _state(kube) == states.QUARANTINED, 10, f"the drain given up (state {_state(kube)})")
    record = _record(kube)
    assert record is not None and "was deleted before the drain completed" in record.message
    time.sleep(0.5)
    creates = [r for r in world.srv.requests if r[1] == "create" and r[3] == "drainrequests"]
    assert len(creates) == 1 and _requests(kube, res) == [], "the person's delete was undone"


def test_a_new_policy_without_the_custom_action_in_flight_ends_its_resource(world: World) -> None:
    """Issue 41: restarted with a valid policy that no longer has [actions.rma] while an rma resource was in
    flight, the controller quarantined the node and left the resource behind for its plugin to act on. The attempt
    is ended: its resource deleted, the failure said."""
    kube = world.kube
    res = install_crd(kube, remediation_crd(), API_VERSION, KIND)
    world.start(REMEDIATION_POLICY, xid=48)
    wait_for(lambda: (a := _action(kube)) is not None and a.kind == "rma" and a.created, 20,
             f"the rma resource created and recorded (state {_state(kube)})")
    first = _action(kube)
    assert first is not None
    world.controllers.pop().stop()
    world.start(BASE_POLICY, xid=48)  # valid on its own: XID 48 back to its built-in action, no [actions.rma]
    wait_for(lambda: first.name not in {r["metadata"]["name"] for r in _requests(kube, res)}, 10,
             "the in-flight rma resource deleted")
    wait_for(lambda: [e for e in _events(kube, "GPURemediationFailed")
                      if "removed from the policy" in e["message"] and first.name in e["message"]], 10,
             "a GPURemediationFailed Event saying why")
