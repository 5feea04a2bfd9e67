"""The fault fast path (issue 16): between full reads the detect loop asks the source which nodes' fault
series changed and reads and checks only those, so a fault is acted on about one poll after the source has
it instead of up to one scrape interval later."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from gpuremediate import cli
from gpuremediate.config import Settings, SettingsError
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.loops.detect import PollPacer
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.signals.sources import FaultFastPath
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "gpuremediate-system"
NAMES = [f"gpu-{i}" for i in range(4)]


class FastSource:
    """Healthy readings, an XID where the test puts one; says which nodes changed since it was last read."""

    fault_poll_s = 0.05

    def __init__(self) -> None:
        self.xid: set[str] = set()
        self.read_back: set[str] = set()  # nodes whose XID a read has returned
        self.full_reads = 0
        self.partial_reads: list[tuple[str, ...]] = []

    def changed_nodes(self) -> set[str]:
        return self.xid - self.read_back

    def read(self, nodes: Sequence[str] = ()) -> list[NodeReadings]:
        if nodes:
            self.partial_reads.append(tuple(nodes))
        else:
            self.full_reads += 1
        out = []
        for node in nodes or NAMES:
            gpu = GpuReading(node=node, gpu="0", uuid=f"GPU-{node}", xid=79 if node in self.xid else 0,
                             gpu_temp=40.0)
            out.append(NodeReadings(node=node, source="prometheus", status=SOURCE_OK, gpus=(gpu,)))
        self.read_back |= {node for node in nodes or NAMES if node in self.xid}
        return out


@pytest.fixture
def world() -> Iterator[tuple[KubeClient, Controller, FastSource]]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": NS}})
    for name in NAMES:
        client.create(NODES, {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                              "status": {"capacity": {"nvidia.com/gpu": "1"}, "allocatable": {"nvidia.com/gpu": "1"}}})
    src = FastSource()
    controller = Controller(Settings(namespace=NS, scrape_interval_s=3600), loads_policy(""), client=client,
                            source=src)
    assert controller.start_caches(timeout=20)
    try:
        yield client, controller, src
    finally:
        controller.stop()
        client.close()
        srv.stop()


def test_a_fault_between_full_reads_is_cordoned_by_the_fast_path(
        world: tuple[KubeClient, Controller, FastSource]) -> None:
    client, controller, src = world
    assert isinstance(src, FaultFastPath)
    controller.start_loops()
    wait_for(lambda: controller.detect.cycles >= 1, describe="the first full cycle")
    src.xid.add("gpu-2")
    wait_for(lambda: client.get(NODES, "gpu-2")["spec"].get("unschedulable") is True, timeout=10.0,
             describe="gpu-2 cordoned", seen=lambda: src.partial_reads)
    assert src.full_reads == 1  # the interval is an hour: no full read did it
    assert src.partial_reads[0] == ("gpu-2",)  # only the changed node is read
    assert all(client.get(NODES, n)["spec"].get("unschedulable") is not True for n in NAMES if n != "gpu-2")


def _run_settings(*flags: str) -> Settings:
    args = cli.build_parser().parse_args(["run", "--source", "prometheus", "--prometheus-url", "http://p:9090",
                                          *flags])
    return cli.settings_from_args(args)


def test_the_fast_path_poll_is_a_flag_and_can_be_off() -> None:
    assert _run_settings().prometheus_fault_poll_s == 1.0
    assert _run_settings().scrape_interval_s == 60.0  # the poll finds faults between the full reads
    assert _run_settings("--scrape-interval", "15s").scrape_interval_s == 15.0
    assert _run_settings("--prometheus-fault-poll", "250ms").prometheus_fault_poll_s == 0.25
    assert _run_settings("--prometheus-fault-poll", "off").prometheus_fault_poll_s == 0.0
    with pytest.raises(SettingsError, match="--prometheus-fault-poll: expected a duration"):
        _run_settings("--prometheus-fault-poll", "soon")


def test_with_the_poll_off_nothing_is_asked_between_reads(world: tuple[KubeClient, Controller, FastSource]) -> None:
    _, controller, src = world
    src.fault_poll_s = 0.0
    asked: list[int] = []

    def changed_nodes() -> set[str]:
        asked.append(1)
        return set()

    src.changed_nodes = changed_nodes  # type: ignore[method-assign]
    controller.start_loops()
    wait_for(lambda: controller.detect.cycles >= 1, describe="the first full cycle")
    controller.detect._between_cycles(time.monotonic() + 0.3)
    assert asked == []


def test_a_fault_that_comes_during_a_full_read_is_polled_for_as_soon_as_the_read_ends(
        world: tuple[KubeClient, Controller, FastSource]) -> None:
    client, controller, src = world
    src.fault_poll_s = 3600.0  # only the poll right after the full read can see it within the test
    full_read = src.read

    def read_then_fault(nodes: Sequence[str] = ()) -> list[NodeReadings]:
        out = full_read(nodes)
        if not nodes:
            src.xid.add("gpu-1")  # in Prometheus just after the read's query was evaluated
        return out

    src.read = read_then_fault  # type: ignore[method-assign]
    controller.start_loops()
    wait_for(lambda: client.get(NODES, "gpu-1")["spec"].get("unschedulable") is True, timeout=10.0,
             describe="gpu-1 cordoned", seen=lambda: src.partial_reads)
    assert src.full_reads == 1 and src.partial_reads == [("gpu-1",)]


class _StepClock:
    """A monotonic clock a test moves: each wait and each poll takes the time it is given."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.now += seconds
        return False

    def is_set(self) -> bool:
        return False


def test_polls_are_one_period_apart_and_a_slow_one_spaces_the_next(
        world: tuple[KubeClient, Controller, FastSource]) -> None:
    """From start to start while Prometheus answers fast; a slow answer keeps the next poll away for 20 times its
    length (a 1.6 s fault query at 5,000 nodes was asked back to back: most of a core of the user's Prometheus)."""
    _, controller, src = world
    clock = _StepClock()
    src.fault_poll_s = 1.0
    started: list[float] = []

    def poll() -> set[str]:  # Prometheus answers in 8 ms, once in 125 ms (binary fractions: exact sums)
        started.append(clock.now)
        clock.now += 0.125 if len(started) == 3 else 0.0078125
        return set()

    src.changed_nodes = poll  # type: ignore[method-assign]
    detect, wake = controller.detect, controller.detect._wake
    detect._monotonic, detect._wake = clock, clock  # type: ignore[assignment]
    try:
        detect._between_cycles(8.0)
    finally:
        detect._monotonic, detect._wake = time.monotonic, wake
    assert started == [0.0, 1.0, 2.0, 4.5, 5.5, 6.5, 7.5]  # the first at once; 2.0 took 1/8 s: the next 2.5 s on


def test_the_pacer_backs_off_on_failures_and_never_past_its_cap() -> None:
    pacer = PollPacer(1.0, 8.0)
    spacings = []
    for failed in (True, True, True, True, False):
        pacer.done(0.0, 0.01, failed)
        spacings.append(pacer.next_at)
    assert spacings == [2.0, 4.0, 8.0, 8.0, 1.0]
    pacer.done(10.0, 12.0, False)  # a 2 s poll: 40 s until the next, whatever the cap (it bounds failures)
    assert pacer.next_at == 50.0
    pacer.at_once(20.0)  # a full read ended: still spaced out
    assert pacer.next_at == 50.0
    pacer.done(50.0, 50.01, False)
    pacer.at_once(50.5)
    assert pacer.next_at == 50.5


def test_the_pacer_spaces_polls_by_prometheus_time_to_answer_not_by_the_poll_s_wall_time() -> None:
    """At 100,000 nodes a 0.18 s poll whose answer took Prometheus 0.05 s spaced the next one 3.7 s away: the
    rest was this replica decoding while its other threads held the interpreter (issue 48)."""
    pacer = PollPacer(1.0, 30.0)
    pacer.done(0.0, 0.18, False, prometheus_s=0.05)
    assert pacer.next_at == 1.0
    pacer.done(1.0, 1.3, False, prometheus_s=0.25)  # Prometheus itself slow: 20 times its 0.25 s
    assert pacer.next_at == 6.0
    pacer.done(6.0, 6.5, False)  # a source that cannot say: the poll's whole time
    assert pacer.next_at == 16.0


def test_a_failing_poll_is_asked_less_often(world: tuple[KubeClient, Controller, FastSource]) -> None:
    _, controller, src = world
    clock = _StepClock()
    src.fault_poll_s = 1.0
    started: list[float] = []

    def failing() -> set[str]:
        started.append(clock.now)
        clock.now += 0.0078125
        src.fault_error = "Prometheus fault query failed: HTTP 503"  # type: ignore[attr-defined]
        return set()

    src.changed_nodes = failing  # type: ignore[method-assign]
    detect, wake = controller.detect, controller.detect._wake
    detect._monotonic, detect._wake = clock, clock  # type: ignore[assignment]
    try:
        detect._between_cycles(40.0)
    finally:
        detect._monotonic, detect._wake = time.monotonic, wake
    assert started == [0.0, 2.0, 6.0, 14.0, 30.0]  # doubling, up to --scrape-interval


def test_a_fault_during_a_long_full_read_is_cordoned_before_the_read_ends_and_its_readings_kept(
        world: tuple[KubeClient, Controller, FastSource]) -> None:
    client, controller, src = world
    release, reading = threading.Event(), threading.Event()
    full_read = src.read

    def slow_full_read(nodes: Sequence[str] = ()) -> list[NodeReadings]:
        if nodes:
            return full_read(nodes)
        stale = full_read(())  # what Prometheus answered when the read was asked: no fault yet
        reading.set()
        release.wait(30)  # a read that takes seconds (5,000 nodes)
        return [r for r in stale if r.node != "gpu-3"] + [
            NodeReadings(node="gpu-3", source="prometheus", status=SOURCE_OK,
                         gpus=(GpuReading(node="gpu-3", gpu="0", uuid="GPU-gpu-3", xid=0, gpu_temp=40.0),))]

    src.read = slow_full_read  # type: ignore[method-assign]
    cycle = threading.Thread(target=controller.detect.cycle, daemon=True)  # one cycle, as the loop runs it
    cycle.start()
    try:
        assert reading.wait(10)
        src.xid.add("gpu-3")
        wait_for(lambda: client.get(NODES, "gpu-3")["spec"].get("unschedulable") is True, timeout=10.0,
                 describe="gpu-3 cordoned while the full read still runs", seen=lambda: src.partial_reads)
        assert controller.detect.cycles == 0
    finally:
        release.set()
    cycle.join(10)
    assert controller.detect.cycles == 1 and src.partial_reads == [("gpu-3",)]
    assert controller.ctx.readings["gpu-3"].gpus[0].xid == 79  # the poll's readings, newer than the read's
