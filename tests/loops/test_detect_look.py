"""The breaker judges how fast faults arrive (issue 49), on every path they arrive by. A storm that reaches the
controller in installments (Prometheus' endpoints each at its own phase, the fast path's polls; node conditions
read one full read after another) opens the breaker with none of it cordoned; a burst under the threshold is held
for the look and then cordoned, each node once; a single fault is cordoned at once, without a look. What is held
is visible: the node's record, the metric, an Event, `status` and `breaker status`; in a dry run too."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpuremediate import cli
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP
from gpuremediate.actions.node_status import build_condition, conditions_patch
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import CONFIGMAPS, EVENTS, NAMESPACES, NODES
from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.safety import LOOK_OPENED, LOOK_RELEASED, CircuitBreaker
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.vocab.record import BLOCK_BREAKER, NodeRecord, record_from_node
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "gpuremediate-system"
COUNT = 40  # the breaker opens past 12 (30 %); a look past 4 within the window (10 % of 40, under look_nodes)
NAMES = [f"gpu-{i:02d}" for i in range(COUNT)]
LOOK_S = 1.5
POLICY = f"""
[budget]
max_unavailable = "100%"
[breaker]
threshold_percent = 30
min_nodes = 3
look_s = {LOOK_S}
[[conditions.rules]]
type = "KernelDeadlock"
status = "True"
action = "cordon"
"""


class Installments:
    """A Prometheus-like source with the fault fast path: an XID on the nodes in ``xid``; ``changed_nodes`` says
    which a read has not returned yet (one installment per poll, as Prometheus' endpoints hand a storm over)."""

    def __init__(self, fault_poll_s: float = 0.05) -> None:
        self.fault_poll_s = fault_poll_s
        self.xid: set[str] = set()
        self.read_back: set[str] = set()

    def changed_nodes(self) -> set[str]:
        return self.xid - self.read_back

    def read(self, nodes: Sequence[str] = ()) -> list[NodeReadings]:
        out = []
        for node in nodes or NAMES:
            gpu = GpuReading(node=node, gpu="0", uuid=f"GPU-{node}", xid=79 if node in self.xid else None)
            out.append(NodeReadings(node=node, source="prometheus", status=SOURCE_OK, gpus=(gpu,)))
        self.read_back |= {n for n in nodes or NAMES if n in self.xid}
        return out


class FullReads:
    """No fast path: healthy readings on every full read (the faults come from node conditions)."""

    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=n, source="exporter", status=SOURCE_OK,
                             gpus=(GpuReading(node=n, gpu="0", uuid=f"GPU-{n}"),)) for n in NAMES]


class World:
    def __init__(self) -> None:
        self.srv = KubeAPIServer().start()
        self.client = KubeClient(ClusterConfig(server=self.srv.url, token_source=StaticToken(self.srv.admin_token)),
                                 qps=1000, burst=1000)
        self.client.create(NAMESPACES, {"metadata": {"name": NS}})
        for name in NAMES:
            self.client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                                       "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        self.controllers: list[Controller] = []
        self.cordon_seen: dict[str, int] = {}

    def controller(self, source: object, **settings: object) -> Controller:
        made = Controller(Settings(namespace=NS, **settings), loads_policy(POLICY), client=self.client,  # type: ignore[arg-type]
                          source=source)  # type: ignore[arg-type]
        assert made.start_caches(timeout=20)
        self.controllers.append(made)
        return made

    def cordoned(self) -> set[str]:
        return {n for n in NAMES if self.client.get(NODES, n).get("spec", {}).get("unschedulable")}

    def cordon_patches(self) -> dict[str, int]:
        """Node patches that set spec.unschedulable, by node (a node cordoned twice would show 2)."""
        counts: dict[str, int] = {}
        for entry in self.srv.requests:
            _u, verb, _g, resource, sub, _ns, name = entry
            if resource == "nodes" and verb == "patch" and not sub and name:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def breaker(self) -> CircuitBreaker:
        data = self.client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS).get("data") or {}
        return CircuitBreaker.from_dict(json.loads(data.get("state", "{}")))

    def record(self, node: str) -> NodeRecord | None:
        rec = record_from_node(self.client.get(NODES, node))
        return rec if isinstance(rec, NodeRecord) else None

    def held_by_look(self, node: str) -> bool:
        """In the look under way, and nothing written to the Node yet (the look's end decides it)."""
        look = self.breaker().looking
        return look is not None and look.holds(node) and self.record(node) is None and node not in self.cordoned()

    def events(self, reason: str) -> list[str]:
        return [e["message"] for e in self.client.list(EVENTS, "default")["items"] if e["reason"] == reason]

    def condition(self, node: str) -> None:
        cond = build_condition(None, "KernelDeadlock", "True", "Hung", "task blocked (test)", time.time())
        self.client.patch(NODES, node, conditions_patch([cond]), patch_type="strategic", subresource="status")

    def close(self) -> None:
        for controller in self.controllers:
            controller.stop()
        self.client.close()
        self.srv.stop()


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    yield made
    made.close()


def _installment(src: Installments, nodes: Sequence[str], controller: Controller) -> None:
    src.xid |= set(nodes)
    controller.detect.fast_cycle()


def test_a_storm_in_installments_through_the_fast_path_opens_the_breaker_with_nothing_cordoned(world: World) -> None:
    src = Installments()
    controller = world.controller(src, scrape_interval_s=3600)
    controller.ctx.breakers.start()
    controller.detect.cycle()  # the first full read: all healthy
    _installment(src, NAMES[:6], controller)  # 6 within the window: more than 4, a look opens
    look = world.breaker().looking
    assert look is not None and sorted(look.nodes) == NAMES[:6] and not world.breaker().is_open
    assert world.cordoned() == set()
    assert all(world.held_by_look(n) for n in NAMES[:6]), [world.record(n) for n in NAMES[:6]]
    assert controller.metrics.breaker_look_held.value() == 6
    patches = world.cordon_patches()
    assert not any(patches.get(n) for n in NAMES[:16]), patches  # the look writes no Node: judging stays fast
    _installment(src, NAMES[6:10], controller)  # they join the look
    assert world.breaker().looking is not None and len(world.breaker().looking.nodes) == 10  # type: ignore[union-attr]
    _installment(src, NAMES[10:16], controller)  # 16 of 40: past 30 %
    breaker = world.breaker()
    assert breaker.is_open and breaker.look is not None and breaker.look.outcome == LOOK_OPENED
    controller.detect._settle_look()  # the look's held faults are decided again: held by the open breaker now
    assert world.cordoned() == set()
    assert all((r := world.record(n)) is not None and r.blocked is not None and r.blocked.reason == BLOCK_BREAKER
               and r.blocked.detail == "circuit breaker open: no new work" and r.held is not None for n in NAMES[:16])
    controller.detect.events.flush(10)
    assert len(world.events("GPURemediationBreakerLook")) == 1
    assert any("with the circuit breaker open" in m for m in world.events("GPURemediationBreakerLookEnded"))
    assert controller.metrics.breaker_look_held.value() == 0


def test_a_burst_under_the_threshold_waits_for_the_look_then_each_node_is_cordoned_once(world: World) -> None:
    src = Installments()
    controller = world.controller(src, scrape_interval_s=3600)  # no full read during the test: the fast path's
    controller.start_loops()
    wait_for(lambda: controller.detect.cycles >= 1, describe="the first full cycle")
    src.xid.add(NAMES[0])  # one fault alone: cordoned at once, no look
    wait_for(lambda: world.cordoned() == {NAMES[0]}, timeout=5, describe="the single fault cordoned")
    assert world.breaker().look is None
    started = time.monotonic()
    burst = NAMES[10:18]  # 8 more within the window: a look, under the threshold (9 of 40)
    src.xid |= set(burst)
    wait_for(lambda: all(world.held_by_look(n) for n in burst), timeout=5, describe="the burst held by the look",
             seen=lambda: [world.record(n) for n in burst])
    assert world.cordoned() == {NAMES[0]}
    wait_for(lambda: world.cordoned() == {NAMES[0], *burst}, timeout=10, describe="the burst cordoned after the look",
             seen=lambda: world.breaker().look)
    took = time.monotonic() - started
    assert LOOK_S - 0.2 <= took <= LOOK_S + 4.0, took  # the look's length, then at once (no full read: an hour)
    look = world.breaker().look
    assert look is not None and look.outcome == LOOK_RELEASED and sorted(look.nodes) == burst
    assert all(world.cordon_patches().get(n, 0) >= 1 for n in burst)
    assert all((r := world.record(n)) is not None and r.fault is not None and r.blocked is None for n in burst)
    assert not world.breaker().is_open
    faults = world.breaker().faults
    assert sorted(n for n, _ in faults) == sorted([NAMES[0], *burst])  # each counted once, not again on release
    controller.detect.events.flush(10)
    assert any("under the breaker's threshold" in m for m in world.events("GPURemediationBreakerLookEnded"))
    assert controller.metrics.breaker_looks.value(outcome="opened") == 1
    assert controller.metrics.breaker_looks.value(outcome="released") == 1


def test_a_storm_of_node_conditions_over_two_full_reads_opens_the_breaker_with_nothing_cordoned(
        world: World) -> None:
    controller = world.controller(FullReads(), scrape_interval_s=3600)
    controller.ctx.breakers.start()
    controller.detect.cycle()
    for node in NAMES[:8]:  # the first agents to publish
        world.condition(node)
    wait_for(lambda: all(_cached_condition(controller, n) for n in NAMES[:8]), timeout=10,
             describe="the conditions in the node cache")
    controller.detect.cycle()
    assert world.cordoned() == set() and world.breaker().looking is not None
    assert all(world.held_by_look(n) for n in NAMES[:8])
    for node in NAMES[8:16]:  # the rest, one full read later: 16 of 40
        world.condition(node)
    wait_for(lambda: all(_cached_condition(controller, n) for n in NAMES[8:16]), timeout=10,
             describe="the conditions in the node cache")
    controller.detect.cycle()
    assert world.breaker().is_open and world.cordoned() == set()
    assert all(not world.held_by_look(n) and (r := world.record(n)) is not None and r.blocked is not None
               for n in NAMES[:16])


def test_a_look_on_full_reads_lasts_until_a_read_begun_after_it_is_judged(world: World) -> None:
    controller = world.controller(FullReads(), scrape_interval_s=3600)
    controller.ctx.breakers.start()
    controller.detect.cycle()
    for node in NAMES[:6]:
        world.condition(node)
    wait_for(lambda: all(_cached_condition(controller, n) for n in NAMES[:6]), timeout=10,
             describe="the conditions in the node cache")
    controller.detect.cycle()
    assert world.breaker().looking is not None
    time.sleep(LOOK_S + 0.2)
    controller.detect._settle_look()  # look_s has passed, but no read begun after the look has been judged
    assert world.breaker().looking is not None and world.cordoned() == set()
    controller.detect.cycle()  # that read: nothing more arrived, the look ends and the six go on
    assert world.breaker().look is not None and world.breaker().look.outcome == LOOK_RELEASED  # type: ignore[union-attr]
    assert world.cordoned() == set(NAMES[:6])


def test_status_and_breaker_status_show_the_look_in_a_dry_run_too(world: World, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    src = Installments()
    controller = world.controller(src, scrape_interval_s=3600, dry_run=True)
    controller.ctx.breakers.start()
    controller.detect.cycle()
    _installment(src, NAMES[:6], controller)
    assert controller.metrics.breaker_look_held.value() == 6
    assert world.cordoned() == set() and world.record(NAMES[0]) is None  # a dry run writes no Node
    journal = controller.ctx.writer.journal
    assert journal is not None
    journal.flush()
    kube = ["--kubeconfig", str(world.srv.write_kubeconfig(tmp_path / "kubeconfig"))]
    assert cli.main(["breaker", "status", *kube, "--namespace", NS]) == 0
    out = capsys.readouterr().out
    assert "storm look (DRY RUN): 6 new faults held for a storm look" in out, out
    assert "held: gpu-00, gpu-01" in out, out
    assert cli.main(["status", *kube, "--namespace", NS]) == 0
    out = capsys.readouterr().out
    assert "STORM LOOK: 6 new faults held" in out, out


def _cached_condition(controller: Controller, node: str) -> bool:
    cached = next(n for n in controller.ctx.nodes.gpu_nodes() if n["metadata"]["name"] == node)
    return any(c.get("type") == "KernelDeadlock" for c in cached.get("status", {}).get("conditions", []))


def test_a_controller_started_after_a_look_decides_its_faults_at_its_first_read(world: World) -> None:
    """The look outlives the replica that opened it (the breaker ConfigMap): the next one ends it and decides the
    held faults at its first read, without calling their nodes unknown for want of readings."""
    src = Installments()
    first = world.controller(src, scrape_interval_s=3600)
    first.ctx.breakers.start()
    first.detect.cycle()
    _installment(src, NAMES[:6], first)
    assert world.breaker().looking is not None
    first.stop()
    time.sleep(LOOK_S + 0.2)
    second = world.controller(src, scrape_interval_s=3600)
    second.ctx.breakers.start()
    second.detect._settle_look()  # due: ended by this replica, which has no readings of them yet
    assert world.breaker().look is not None and world.breaker().look.outcome == LOOK_RELEASED  # type: ignore[union-attr]
    assert world.cordoned() == set() and second.detect.unknown == {}
    second.detect.cycle()  # its first read: the six go on
    assert world.cordoned() == set(NAMES[:6])
    second.detect.events.flush(10)
    assert world.events("GPUHealthUnknown") == []


def test_explain_says_the_look_holds_the_node(world: World, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    src = Installments()
    controller = world.controller(src, scrape_interval_s=3600)
    controller.ctx.breakers.start()
    controller.detect.cycle()
    _installment(src, NAMES[:6], controller)
    kube = ["--kubeconfig", str(world.srv.write_kubeconfig(tmp_path / "kubeconfig")), "--namespace", NS]
    assert cli.main(["explain", NAMES[2], *kube]) == 0
    out = capsys.readouterr().out
    assert "Storm look: its new fault is held until" in out and "with 5 other(s)" in out, out
    assert cli.main(["explain", NAMES[20], *kube]) == 0
    assert "Storm look" not in capsys.readouterr().out  # a node the look does not hold
