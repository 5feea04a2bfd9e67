"""Issue 15 in the detect loop: a pause holds new faults (no cordon, blocked naming who and why), the domain
breaker opens on faults clustered on one label value and holds only that domain; breaker-open and quarantine
notifications reach a webhook receiver. A bare emulator, scripted readings, the controller in process."""

from __future__ import annotations

import base64
import dataclasses
import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.resources import EVENTS, NODES, SECRETS
from gpuremediate.loops import drain
from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.safety import DomainTrip, Pause
from gpuremediate.signals.fabric import CLIQUE_LABEL
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.vocab import states
from sim.waiting import wait_for

from .test_admission import BASE, NS, RACK, World, world  # noqa: F401 (the fixture)

# No fleet breaker, and no storm look (issue 49): 2 faults of 4 nodes arrive faster than its rate, and these tests
# are about the holds that come after the breakers, not about the look's wait (tests/loops/test_detect_look.py).
NO_FLEET_BREAKER = BASE + "[breaker]\nthreshold_percent = 100\nwindow_s = 600\nlook_s = 0\n"


class XidSource:
    """Each node's one GPU reports the XID in ``xids`` (absent: healthy); tests change it as they go."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.xids: dict[str, int] = {}

    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=n, source="exporter", status=SOURCE_OK,
                             gpus=(GpuReading(node=n, gpu="0", uuid=f"GPU-{n}", xid=self.xids.get(n)),))
                for n in self.nodes]


def start(made: World, policy: str) -> tuple[Controller, XidSource]:
    source = XidSource(made.nodes)
    settings = Settings(namespace=NS, scrape_interval_s=0.1, resync_s=0.3)
    controller = Controller(settings, loads_policy(policy, "test-policy"), client=made.kube, source=source)
    assert controller.start_caches(timeout=20)
    controller.start_loops()
    made.controllers.append(controller)
    return controller, source


def state(made: World, name: str) -> str:
    try:
        return made.record(name).state
    except AssertionError:
        return states.HEALTHY  # no record yet


def test_a_pause_holds_a_new_fault_without_a_cordon_and_resume_lets_it_drain(world: World) -> None:  # noqa: F811
    world.node("gpu-1")
    store = BreakerStore(world.kube, NS)
    store.set_pause(Pause(paused=True, by="alice", reason="driver upgrade"))
    _, source = start(world, BASE)
    source.xids["gpu-1"] = 79
    wait_for(lambda: world.blocked("gpu-1") == f"{drain.BLOCK_PAUSED}: paused by alice: driver upgrade", 10,
             "the new fault held by the pause")
    assert state(world, "gpu-1") == states.HEALTHY
    assert not world.kube.get(NODES, "gpu-1")["spec"].get("unschedulable"), "cordoned while paused"
    store.set_pause(Pause())
    wait_for(lambda: state(world, "gpu-1") != states.HEALTHY, 10, "the fault acted on once resumed")


def test_a_domain_breaker_opens_on_clustered_faults_and_leaves_another_domain_working(
        world: World) -> None:  # noqa: F811
    for name, rack in (("r1-a", "r1"), ("r1-b", "r1"), ("r2-a", "r2"), ("r2-b", "r2")):
        world.node(name, {RACK: rack})
    policy = NO_FLEET_BREAKER + (f'domain_labels = ["{RACK}"]\ndomain_threshold_percent = 50\n'
                                 "domain_min_nodes = 2\n")
    _, source = start(world, policy)
    source.xids.update({"r1-a": 79, "r1-b": 79})
    wait_for(lambda: BreakerStore(world.kube, NS).load().domains, 10, "a domain breaker")
    trips = BreakerStore(world.kube, NS).load().domains
    assert [(t.label, t.value) for t in trips] == [(RACK, "r1")]

    def opened() -> list[str]:  # the Event follows the breaker's write (queued, written by the recorder)
        return [e["message"] for e in world.kube.list(EVENTS, "default")["items"]
                if e["reason"] == "GPURemediationDomainBreakerOpen"]

    wait_for(opened, 10, "the domain breaker's Event")
    assert f"{RACK}=r1 (the faults' common label)" in opened()[0], opened()
    source.xids["r2-a"] = 79
    wait_for(lambda: state(world, "r2-a") != states.HEALTHY, 10, "rack r2 keeps working")
    assert not BreakerStore(world.kube, NS).load().is_open


class Receiver(http.server.BaseHTTPRequestHandler):
    got: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        self.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    got: list[dict[str, Any]] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("R", (Receiver,), {"got": got}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    finally:
        server.shutdown()
        server.server_close()


NOTIFY = NO_FLEET_BREAKER + """
[notifications]
enabled = true
cluster = "lab"
drain_blocked_after_s = 1
[xid.overrides]
"79" = "quarantine"
"""


def _secret(made: World, url: str) -> None:
    made.kube.create(SECRETS, {"metadata": {"name": "gpuremediate-notifications", "namespace": NS},
                               "data": {"url": base64.b64encode(url.encode()).decode()}}, NS)


def test_a_quarantine_reaches_the_webhook(world: World, receiver: tuple[str, list[dict[str, Any]]]) -> None:  # noqa: F811
    url, got = receiver
    _secret(world, url)
    world.node("gpu-1")
    _, source = start(world, NOTIFY)
    source.xids["gpu-1"] = 79
    wait_for(lambda: any(n["kind"] == "quarantined" for n in got), 15, "the quarantine notification",
             seen=lambda: (got, state(world, "gpu-1")))
    note = next(n for n in got if n["kind"] == "quarantined")
    assert (note["node"], note["cluster"]) == ("gpu-1", "lab")


def test_a_long_blocked_drain_is_notified_once(world: World, receiver: tuple[str, list[dict[str, Any]]]) -> None:  # noqa: F811
    url, got = receiver
    _secret(world, url)
    world.node("gpu-1")
    _, source = start(world, NOTIFY.replace('"79" = "quarantine"', '"79" = "reset-gpu"')
                      .replace('"100%"', '"0"'))
    source.xids["gpu-1"] = 79
    wait_for(lambda: any(n["kind"] == "drain-blocked" for n in got), 15, "the drain-blocked notification",
             seen=lambda: (got, world.blocked("gpu-1")))
    controller = world.controllers[0]
    wait_for(lambda: controller.metrics.notifications.value(kind="drain-blocked", result="sent") == 1.0,
             5, "sent, counted")
    notifier = controller.ctx.writer.notifier
    assert notifier is not None
    queued: list[str] = []
    original = notifier.notify
    notifier.notify = lambda note: queued.append(note.kind) or original(note)  # type: ignore[method-assign]
    drain = controller.node_loops[0]
    for _ in range(3):
        drain.reconcile_name("gpu-1")  # steps of a drain still blocked past the threshold
    assert "drain-blocked" not in queued, "the same blocked drain was notified again"
    assert [n["kind"] for n in got].count("drain-blocked") == 1


def test_without_the_secret_the_controller_runs_on_without_notifications(world: World,  # noqa: F811
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    world.node("gpu-1")
    controller, source = start(world, NOTIFY)
    assert controller.ctx.writer.notifier is None
    assert any("notifications are off: Secret gpuremediate-system/gpuremediate-notifications not found"
               in r.getMessage() for r in caplog.records)
    source.xids["gpu-1"] = 79
    wait_for(lambda: state(world, "gpu-1") == states.QUARANTINED, 15, "the controller works on")


def test_a_domain_action_waits_for_the_pause_then_takes_every_tray_of_its_domain_only(world: World) -> None:  # noqa: F811
    """The domain breaker is open for clique c1 (as a storm left it) and ``[fabric] domain_action`` is set: while
    paused no tray is taken; once resumed every tray of c1 (the healthy ones too) is cordoned, drained and
    quarantined with the domain fault, and the node of another domain is left alone."""
    for name, clique in (("c1-a", "c1"), ("c1-b", "c1"), ("c1-c", "c1"), ("c2-a", "c2")):
        world.node(name, {CLIQUE_LABEL: clique})
    store = BreakerStore(world.kube, NS)
    trip = DomainTrip(CLIQUE_LABEL, "c1", "2 of 3 nodes faulted", time.time())
    store.update(lambda b: dataclasses.replace(b, domains=(trip,)))
    store.set_pause(Pause(paused=True, by="alice", reason="rack work"))
    start(world, NO_FLEET_BREAKER + '\n[fabric]\ndomain_action = "quarantine"\n')
    time.sleep(1.0)
    assert all(state(world, n) == states.HEALTHY for n in ("c1-a", "c1-b", "c1-c", "c2-a")), "taken while paused"
    assert not any(world.kube.get(NODES, n)["spec"].get("unschedulable") for n in ("c1-a", "c1-b", "c1-c"))
    store.set_pause(Pause())

    def handed_over(name: str) -> bool:
        if state(world, name) != states.QUARANTINED:
            return False
        fault = world.record(name).fault
        return fault is not None and fault.kind == "domain" and bool(world.kube.get(NODES, name)["spec"].get(
            "unschedulable"))

    wait_for(lambda: all(handed_over(n) for n in ("c1-a", "c1-b", "c1-c")), 15, "every c1 tray handed over")
    assert state(world, "c2-a") == states.HEALTHY
    prints = {world.record(n).fault.fingerprint for n in ("c1-a", "c1-b", "c1-c")}  # type: ignore[union-attr]
    assert prints == {f"domain:{CLIQUE_LABEL}=c1@{trip.opened_at:.0f}"}
