"""The maintenance loop against the emulator: a request's phase never runs ahead of the node claim
(issue 10 item 2), and a phase a person writes does not release a node that is still in maintenance
(issue 17). A bare emulator, hand-made nodes and scripted healthy readings: nothing else runs."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuremediate.actions.maintenance import CLAIM_ANNOTATION
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube import errors, miniyaml
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import CRDS, EVENTS, NAMESPACES, NODES, Resource
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.state import decide
from gpuremediate.state import maintenance as mr
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, node_patch, record_from_node
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for
from tests.loops.test_conflicts import ConflictingClient

_C = TypeVar("_C", bound=KubeClient)
ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "manifests" / "crds" / "gpuremediate.io_maintenancerequests.yaml"
NODE = "gpu-1"
POD_NS = "gpuremediate-system"
POLICY = """
[maintenance]
respect_budget = false
[validation]
enabled = false
[breaker]
enabled = false
"""


class LosesOneRelease(KubeClient):
    """The controller's client: its first release of a claim meets a 409 once ``armed``."""

    armed = False

    def patch(self, res: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None,
              **kwargs: Any) -> dict[str, Any]:
        annotations = (patch.get("metadata") or {}).get("annotations") or {}
        if self.armed and res is NODES and CLAIM_ANNOTATION in annotations and annotations[CLAIM_ANNOTATION] is None:
            self.armed = False
            raise errors.Conflict(409, {"kind": "Status", "reason": "Conflict", "message": "another writer"})
        result: dict[str, Any] = super().patch(res, name, patch, namespace, **kwargs)
        return result


class Healthy:
    def read(self) -> list[NodeReadings]:
        gpu = GpuReading(node=NODE, gpu="0", uuid="GPU-1")
        return [NodeReadings(node=NODE, source="exporter", status=SOURCE_OK, gpus=(gpu,))]


@pytest.fixture
def world() -> Iterator[tuple[KubeAPIServer, LosesOneRelease, Resource]]:
    yield from _world(LosesOneRelease)


@pytest.fixture
def busy_world() -> Iterator[tuple[KubeAPIServer, ConflictingClient, Resource]]:
    yield from _world(ConflictingClient)


def _world(client_type: type[_C]) -> Iterator[tuple[KubeAPIServer, _C, Resource]]:
    srv = KubeAPIServer().start()
    client = client_type(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500,
                         burst=500)
    client.create(NAMESPACES, {"metadata": {"name": POD_NS}})
    client.create(CRDS, miniyaml.loads(CRD.read_text()))
    wait_for(lambda: _served(client), 10, "the MaintenanceRequest kind served")
    client.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}}})
    settings = Settings(namespace=POD_NS, scrape_interval_s=0.1, resync_s=0.3)
    controller = Controller(settings, loads_policy(POLICY), client=client, source=Healthy())
    assert controller.start_caches(timeout=20)
    controller.start_loops()
    try:
        yield srv, client, client.resolve(f"gpuremediate.io/{mr.VERSION}", mr.KIND)
    finally:
        controller.stop()
        srv.stop()


def _served(client: KubeClient) -> bool:
    try:
        client.resolve(f"gpuremediate.io/{mr.VERSION}", mr.KIND)
    except errors.NotFound:  # not served yet
        return False
    return True


def _request(client: KubeClient, res: Resource, name: str = "mr-1", start: str | None = None) -> dict[str, Any]:
    body = {"apiVersion": f"gpuremediate.io/{mr.VERSION}", "kind": mr.KIND, "metadata": {"name": name},
            "spec": {"healthEvent": {"nodeName": NODE, "isHealthy": False, "recommendedAction": "NONE",
                                     "message": "planned maintenance", "checkName": "maintenance",
                                     "componentClass": "GPU"}}}
    if start is not None:
        body["spec"]["startTime"] = start
    created: dict[str, Any] = client.create(res, body)
    return created


def _claim(client: KubeClient) -> str:
    return str((client.get(NODES, NODE)["metadata"].get("annotations") or {}).get(CLAIM_ANNOTATION, ""))


def _state(client: KubeClient) -> str:
    record = record_from_node(client.get(NODES, NODE))
    return record.state if isinstance(record, NodeRecord) else "-"


def _phase(client: KubeClient, res: Resource, name: str = "mr-1") -> str:
    return str((client.get(res, name).get("status") or {}).get("phase", ""))


def test_a_phase_a_person_writes_does_not_release_a_node_in_maintenance(
    world: tuple[KubeAPIServer, LosesOneRelease, Resource]
) -> None:
    _, client, res = world
    _request(client, res)
    wait_for(lambda: _state(client) == states.MAINTENANCE and _phase(client, res) == mr.PREPARED, 15,
             f"the node held for maintenance (state {_state(client)}, phase {_phase(client, res)})")
    claim = _claim(client)
    assert claim.startswith("mr-1/")
    client.patch(res, "mr-1", {"status": {"phase": mr.COMPLETED}}, subresource="status")  # a person
    wait_for(lambda: _phase(client, res) == mr.PREPARED, 10, "the phase rewritten from the node record")
    assert _claim(client) == claim, "the claim was released while the node stays in maintenance"
    assert _state(client) == states.MAINTENANCE


def test_the_completed_phase_never_runs_ahead_of_the_claim_release(
    world: tuple[KubeAPIServer, LosesOneRelease, Resource]
) -> None:
    srv, client, res = world
    seen: list[tuple[str, str]] = []  # (phase, claim) at every store change of the request or the node
    lock = threading.Lock()
    node_key, request_key = srv.type_for("", "nodes").key, srv.type_for("gpuremediate.io", "maintenancerequests").key
    current = {"phase": "", "claim": ""}

    def listen(event: Any) -> None:
        if event.key == request_key:
            current["phase"] = str((event.obj.get("status") or {}).get("phase", ""))
        elif event.key == node_key:
            current["claim"] = str((event.obj["metadata"].get("annotations") or {}).get(CLAIM_ANNOTATION, ""))
        else:
            return
        with lock:
            seen.append((current["phase"], current["claim"]))

    srv.store.listeners.append(listen)
    _request(client, res)
    wait_for(lambda: _state(client) == states.MAINTENANCE and _phase(client, res) == mr.PREPARED, 15,
             "the node held for maintenance")
    # The flow finishes (as a repaired and validated node's would: healthy, the request's fault handled);
    # the claim release then meets one 409: the Completed phase must wait for the release that succeeds.
    record = record_from_node(client.get(NODES, NODE))
    assert isinstance(record, NodeRecord) and record.fault is not None
    validating = decide.maintenance_request_deleted(record, record.fault.fingerprint, 1.0e9).record
    done = decide.complete_validation(validating, True, 1.0e9).record
    client.armed = True
    KubeClient.patch(client, NODES, NODE, node_patch(done))
    wait_for(lambda: _phase(client, res) == mr.COMPLETED, 10, "the request Completed")
    with lock:
        ahead = [s for s in seen if s[0] == mr.COMPLETED and s[1]]
    assert ahead == [], f"Completed while the node still held the claim: {ahead}"
    assert _claim(client) == ""
    assert not client.armed, "the claim release never met its 409"


def test_a_maintenance_flow_repeats_nothing_when_every_other_node_write_conflicts(
    busy_world: tuple[KubeAPIServer, ConflictingClient, Resource]
) -> None:
    _, client, res = busy_world
    _request(client, res)
    wait_for(lambda: _state(client) == states.MAINTENANCE and _phase(client, res) == mr.PREPARED, 15,
             f"the node held for maintenance (state {_state(client)}, phase {_phase(client, res)})")
    client.delete(res, "mr-1")
    wait_for(lambda: _state(client) == states.HEALTHY and _claim(client) == "", 15,
             f"the node back (state {_state(client)}, claim {_claim(client)!r})")
    wait_for(lambda: not client.list(res)["items"], 10, "the finalizer removed")
    assert client.conflicts >= 3, "the test did not make the controller's node writes conflict"
    events = [e for e in client.list(EVENTS, None)["items"] if (e.get("source") or {}).get("component")
              == "gpuremediate"]
    seen = Counter((e["reason"], e["message"]) for e in events for _ in range(int(e.get("count") or 1)))
    assert [k for k, n in seen.items() if n > 1] == []


def _emitted(client: KubeClient, res: Resource, name: str) -> tuple[str, str]:
    """(reason, message) of a request's HealthEventEmitted condition."""
    for cond in (client.get(res, name).get("status") or {}).get("conditions") or []:
        if cond.get("type") == mr.EMITTED:
            return str(cond.get("reason", "")), str(cond.get("message", ""))
    return "", ""


def test_a_claim_not_started_yet_yields_to_a_request_that_starts_earlier(
    world: tuple[KubeAPIServer, LosesOneRelease, Resource]
) -> None:
    _, client, res = world
    _request(client, res, "far", start="9999-12-31T00:00:00Z")
    wait_for(lambda: _claim(client).startswith("far/") and _emitted(client, res, "far")[0] == "WaitingForStartTime",
             15, f"the far request claims the node and waits (claim {_claim(client)!r})")
    _request(client, res, "now")
    wait_for(lambda: _state(client) == states.MAINTENANCE and _claim(client).startswith("now/"), 15,
             f"the node held for the request that starts now (state {_state(client)}, claim {_claim(client)!r})")
    wait_for(lambda: _emitted(client, res, "far")[0] == "Blocked", 10, "the far request reports the node taken")
    assert "MaintenanceRequest now" in _emitted(client, res, "far")[1]
    assert _claim(client).startswith("now/"), "the claim went back to the request that starts later"
    client.delete(res, "now")
    wait_for(lambda: _state(client) == states.HEALTHY and _claim(client).startswith("far/"), 15,
             f"the node back, claimed again by the far request (state {_state(client)}, claim {_claim(client)!r})")
    wait_for(lambda: _emitted(client, res, "far")[0] == "WaitingForStartTime", 10, "the far request waits again")


def test_a_started_request_keeps_its_claim_against_one_that_starts_earlier(
    world: tuple[KubeAPIServer, LosesOneRelease, Resource]
) -> None:
    _, client, res = world
    _request(client, res, "held")  # starts now: enters the pipeline and holds the node
    wait_for(lambda: _state(client) == states.MAINTENANCE and _phase(client, res, "held") == mr.PREPARED, 15,
             "the node held for maintenance")
    _request(client, res, "earlier", start="2001-01-01T00:00:00Z")  # asks earlier, but the node is taken
    wait_for(lambda: _emitted(client, res, "earlier")[0] == "Blocked", 10, "the second request blocked")
    assert _claim(client).startswith("held/") and _state(client) == states.MAINTENANCE


def test_a_crd_installed_after_start_is_used_without_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kubectl apply -k manifests/crds`` after the controller started: it asks discovery again while the kind is
    not served, and a request then made is handled, with no restart."""
    monkeypatch.setattr("gpuremediate.controller.MAINTENANCE_DISCOVERY_S", 0.2)
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": POD_NS}})
    client.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}}})
    controller = Controller(Settings(namespace=POD_NS, scrape_interval_s=0.1, resync_s=0.3), loads_policy(POLICY),
                            client=client, source=Healthy())
    try:
        assert controller.start_caches(timeout=20)
        controller.start_loops()
        assert controller.maintenance is None  # not served at start
        client.create(CRDS, miniyaml.loads(CRD.read_text()))
        wait_for(lambda: controller.maintenance is not None, 10, "the maintenance loop started once served")
        res = client.resolve(f"gpuremediate.io/{mr.VERSION}", mr.KIND)
        _request(client, res)
        wait_for(lambda: _state(client) == states.MAINTENANCE, 15, f"the node in maintenance ({_state(client)})")
    finally:
        controller.stop()
        srv.stop()
