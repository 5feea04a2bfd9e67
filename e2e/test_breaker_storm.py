"""A storm in one scrape (issue 30): the controller counts the new faults of the whole read before it acts on
any. Past the breaker's threshold it opens with nothing cordoned and says how many; below it every fault is
acted on; split across two shards (each replica scrapes only its own), each replica's share of the storm opens
it before either acts. Faults are injected before the controller starts, so its first read has them all."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench import promlab
from e2e.harness import SYSTEM_NS, Cluster, ControllerProcess, EmulatorCluster, Metrics, make_cluster, policy_toml
from e2e.test_shards import Replica, _holders
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP
from gpuremediate.actions.node_status import build_condition, conditions_patch
from gpuremediate.kube.resources import CONFIGMAPS, NODES
from gpuremediate.policy.safety import CircuitBreaker
from gpuremediate.vocab import states

BUDGET_ALL = {"max_unavailable": "100%"}
BREAKER = {"threshold_percent": 30, "min_nodes": 3}


def _storm(cluster: Cluster, nodes: list[str]) -> None:
    for node in nodes:
        cluster.inject(node, 0, "xid", 79)


def _breaker_held(cluster: Cluster, node: str) -> bool:
    rec = cluster.record(node)
    return rec is not None and rec.blocked is not None and rec.blocked.reason == "breaker"


def test_a_storm_in_one_scrape_opens_the_breaker_with_nothing_cordoned(cluster: Cluster) -> None:
    stormed = cluster.nodes[:3]  # 3 of 4: past 30 %
    _storm(cluster, stormed)
    cluster.start_controller({"budget": BUDGET_ALL, "breaker": BREAKER})
    for node in stormed:
        cluster.wait(lambda n=node: _breaker_held(cluster, n), 20, f"{node}'s fault held by the breaker",
                     seen=lambda n=node: cluster.summary(n))
    event = cluster.wait_event(stormed[0], "GPURemediationBreakerOpen", "3 of 4 GPU nodes faulted", timeout=10)
    assert "3 new in one read" in event["message"], event["message"]
    assert not any(cluster.unschedulable(n) for n in cluster.nodes), [cluster.summary(n) for n in cluster.nodes]
    assert all(cluster.state(n) == states.HEALTHY for n in cluster.nodes)


def test_faults_below_the_threshold_in_one_scrape_are_all_acted_on(cluster: Cluster) -> None:
    stormed = cluster.nodes[:1]  # 1 of 4: 25 %, under 30 %
    _storm(cluster, stormed)
    cluster.start_controller({"budget": BUDGET_ALL, "breaker": BREAKER})
    for node in stormed:
        cluster.wait(lambda n=node: cluster.unschedulable(n) and cluster.state(n) != states.HEALTHY, 20,
                     f"{node} cordoned", seen=lambda n=node: cluster.summary(n))
    assert cluster.metrics().value("gpuremediate_circuit_breaker_open") == 0


WIDE = 48  # two shards of about 24 nodes: each replica's own nodes are a sample of the fleet


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[tuple[EmulatorCluster, list[Replica]]]:
    """The target's cluster with WIDE nodes (the emulator, or NodeSim's nodes on the apiserver target's server)."""
    cluster = make_cluster(tmp_path, nodes=WIDE)
    if not isinstance(cluster, EmulatorCluster):
        pytest.skip("48 simulated GPU nodes (a kubeconfig cluster's nodes are its own)")
    cluster.start()
    replicas: list[Replica] = []
    try:
        yield cluster, replicas
    finally:
        for replica in replicas:
            replica.proc.terminate()
        cluster.stop()


def _acted_on(cluster: Cluster, node: str) -> bool:
    """Cordoned for its fault now, or already through its repair (the emulator's reboot and validation take about a
    second: the nodes the storm look held go through theirs after the others are back)."""
    rec = cluster.record(node)
    return rec is not None and (rec.state != states.HEALTHY or any(h.outcome for h in rec.history))


def _sharded(cluster: EmulatorCluster, replicas: list[Replica], tmp: Path, stormed: list[str]) -> None:
    _storm(cluster, stormed)
    path = tmp / "policy.toml"
    path.write_text(policy_toml({"budget": BUDGET_ALL, "breaker": BREAKER}))
    replicas.extend(Replica(cluster, name, path) for name in ("replica-a", "replica-b"))
    cluster.wait(lambda: _holders(cluster) == {"replica-a", "replica-b"}, 30, "each replica holding a shard")


def test_a_storm_split_across_two_shards_opens_the_breaker_with_nothing_cordoned(
        wide: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = wide
    stormed = [n for i, n in enumerate(cluster.nodes) if i % 5 < 3]  # 60 %, in both shards
    _sharded(cluster, replicas, tmp_path, stormed)
    cluster.wait(lambda: all(_breaker_held(cluster, n) for n in stormed), 60,
                 "every stormed node held by the breaker",
                 seen=lambda: [n for n in stormed if not _breaker_held(cluster, n)])
    assert not any(cluster.unschedulable(n) for n in cluster.nodes)
    for replica in replicas:
        assert replica.problems() == [], replica.problems()


def test_faults_below_the_threshold_split_across_two_shards_are_all_acted_on(
        wide: tuple[EmulatorCluster, list[Replica]], tmp_path: Path) -> None:
    cluster, replicas = wide
    stormed = cluster.nodes[::5]  # 20 %: past the arrival rate (more than 4 of 48), a look holds those not yet acted on
    _sharded(cluster, replicas, tmp_path, stormed)
    cluster.wait(lambda: all(_acted_on(cluster, n) for n in stormed), 60, "every faulted node acted on",
                 seen=lambda: [cluster.summary(n) for n in stormed if not _acted_on(cluster, n)])
    assert sum(r.metrics().value("gpuremediate_circuit_breaker_open") for r in replicas) == 0


# ---- the arrival rate (issue 49): a storm handed over in installments ------------------------------------------

LOOK_S = 3.0  # the look: about one scrape interval of the source and a few polls (here the agents' installments)
LOOK_BREAKER = {**BREAKER, "look_s": LOOK_S}  # 20 nodes: a look past 2 within 30 s (10 %), the breaker past 6
STORM_BREAKER = {**BREAKER, "look_s": 15.0}  # the scenario looks at the held faults before the next installment
DEADLOCK_RULE = {"rules": [{"type": "KernelDeadlock", "status": "True", "action": "cordon"}]}
TWENTY = 20


@pytest.fixture
def twenty(tmp_path: Path) -> Iterator[EmulatorCluster]:
    cluster = make_cluster(tmp_path, nodes=TWENTY)
    if not isinstance(cluster, EmulatorCluster):
        pytest.skip("20 simulated GPU nodes (a kubeconfig cluster's nodes are its own)")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _condition_storm(cluster: Cluster, nodes: list[str]) -> None:
    """The agents of ``nodes`` say the kernel hangs (a node-problem-detector condition the policy cordons for)."""
    for node in nodes:
        cond = build_condition(None, "KernelDeadlock", "True", "DockerHung", "task docker:7 blocked", time.time())
        cluster.kube.patch(NODES, node, conditions_patch([cond]), patch_type="strategic", subresource="status")


def _held_by_look(cluster: Cluster, node: str) -> bool:
    """The node's fault is held by the look under way (the breaker ConfigMap's; nothing is written to the Node
    until the look ends)."""
    cm = cluster.kube.get(CONFIGMAPS, BREAKER_CONFIGMAP, SYSTEM_NS)
    look = CircuitBreaker.from_dict(json.loads((cm.get("data") or {}).get("state", "{}"))).looking
    return look is not None and look.holds(node) and not cluster.unschedulable(node)


def _never_cordoned(cluster: Cluster) -> Callable[[], str | None]:
    return lambda: next((f"{n} cordoned" for n in cluster.nodes if cluster.unschedulable(n)), None)


def test_a_storm_of_node_conditions_in_installments_opens_the_breaker_with_nothing_cordoned(
        twenty: EmulatorCluster) -> None:
    cluster = twenty
    first, second = cluster.nodes[:4], cluster.nodes[4:8]  # 4 of 20: past the rate; 8 of 20: past 30 %
    # The first installment is there when the controller starts, so one read hands it over whole (patched while it
    # runs, a detect cycle could fall between two patches: up to the rate's 2 would be acted on, as the policy says).
    _condition_storm(cluster, first)
    with cluster.invariant(_never_cordoned(cluster), "no node of the storm cordoned"):
        cluster.start_controller({"budget": BUDGET_ALL, "breaker": STORM_BREAKER, "conditions": DEADLOCK_RULE})
        cluster.wait(lambda: all(_held_by_look(cluster, n) for n in first), 20, "the first installment held",
                     seen=lambda: [cluster.summary(n) for n in first])
        assert cluster.metrics().value("gpuremediate_breaker_look_held") == 4
        out = cluster.cli("status").stdout
        assert "STORM LOOK: 4 new faults held" in out, out
        _condition_storm(cluster, second)
        cluster.wait(lambda: all(_breaker_held(cluster, n) and not _held_by_look(cluster, n)
                                 for n in first + second), 20, "the storm held by the open breaker",
                     seen=lambda: [cluster.summary(n) for n in first + second])
        cluster.holds(lambda: not any(cluster.unschedulable(n) for n in cluster.nodes), 2,
                      "nothing cordoned after the breaker opened")
    assert cluster.metrics().value("gpuremediate_circuit_breaker_open") == 1
    assert cluster.metrics().value("gpuremediate_breaker_looks_total", outcome="breaker-open") == 1
    cluster.wait_event(first[0], "GPURemediationBreakerLook", "4 GPU nodes faulted within 30s", timeout=10)
    out = cluster.cli("breaker", "status").stdout
    # It opens at the 7th fault (past 30 % of 20); the second installment's 4 reach it in one read or in two (a
    # detect cycle between two patches), so the count it opened at is 7 or 8: both are the policy's.
    assert re.search(r"circuit breaker: open \([78] of 20 GPU nodes faulted", out), out
    assert "with the breaker open" in out, out


def test_a_small_burst_of_node_conditions_passes_at_once_and_a_larger_one_after_the_look(
        twenty: EmulatorCluster) -> None:
    cluster = twenty
    cluster.start_controller({"budget": BUDGET_ALL, "breaker": LOOK_BREAKER, "conditions": DEADLOCK_RULE})
    pair = cluster.nodes[:2]  # a handful: not more than the rate allows
    _condition_storm(cluster, pair)
    cluster.wait(lambda: all(cluster.unschedulable(n) for n in pair), 10, "the pair cordoned at once",
                 seen=lambda: [cluster.summary(n) for n in pair])
    assert not any(_held_by_look(cluster, n) for n in pair)
    assert not cluster.metrics().has("gpuremediate_breaker_looks_total", outcome="opened")
    burst = cluster.nodes[10:14]  # 6 of 20 within the window: a look, and it stays under the threshold (30 %)
    started = time.monotonic()
    _condition_storm(cluster, burst)
    cluster.wait(lambda: all(_held_by_look(cluster, n) for n in burst), 10, "the burst held by the look",
                 seen=lambda: [cluster.summary(n) for n in burst])
    cluster.wait(lambda: all(cluster.unschedulable(n) for n in burst), 20, "the burst cordoned once the look ended",
                 seen=lambda: [cluster.summary(n) for n in burst])
    assert time.monotonic() - started >= LOOK_S - 0.5
    assert cluster.metrics().value("gpuremediate_circuit_breaker_open") == 0
    assert cluster.metrics().value("gpuremediate_breaker_looks_total", outcome="released") == 1
    assert all(cluster.state(n) != states.HEALTHY for n in [*pair, *burst])


# ---- the same through a real Prometheus ----------------------------------------------------------------------


class Endpoints:
    """Prometheus scrape targets that each serve a group of nodes' exporters in one body, as several dcgm-exporter
    Services or federation shards do (the bench's 10 endpoints): a group's faults reach Prometheus in one scrape,
    one installment, and each group is scraped at its own phase of the interval."""

    def __init__(self, cluster: EmulatorCluster, groups: list[list[str]]) -> None:
        self.servers: list[ThreadingHTTPServer] = []
        for group in groups:
            urls = [cluster.sim.gpusim.url_for(node) for node in group]
            server = ThreadingHTTPServer(("127.0.0.1", 0), _endpoint_handler(urls))
            threading.Thread(target=server.serve_forever, name="e2e-endpoint", daemon=True).start()
            self.servers.append(server)

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{s.server_address[1]}" for s in self.servers]

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def _endpoint_handler(urls: list[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            lines: list[str] = []
            for url in urls:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    lines += [line for line in resp.read().decode().splitlines() if line and not line.startswith("#")]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            return

    return Handler


@dataclass
class PromWorld:
    cluster: EmulatorCluster
    prom_url: str
    tmp: Path
    log: list[str] = field(default_factory=list)
    proc: ControllerProcess | None = None

    def start_controller(self, breaker: dict[str, object]) -> None:
        path = self.tmp / "policy.toml"
        path.write_text(policy_toml({"budget": BUDGET_ALL, "breaker": breaker}))
        args = [*self.cluster.kubeconfig_args(), "--source", "prometheus", "--prometheus-url", self.prom_url,
                "--prometheus-fault-poll", "200ms", "--scrape-interval", "5s", "--resync", "1s",
                "--policy", str(path), "--metrics-addr", "127.0.0.1:0", "--log-format", "json"]
        self.proc = ControllerProcess(args, self.log)
        self.proc.wait_port(20)

    def metrics(self) -> Metrics:
        assert self.proc is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.proc.port}/metrics", timeout=5) as resp:
            return Metrics(resp.read().decode())

    def read_once(self) -> bool:
        """The controller has read Prometheus (every node's health known)."""
        try:
            metrics = self.metrics()
        except OSError:
            return False
        return metrics.value("gpuremediate_detect_cycles_total") >= 1 \
            and metrics.value("gpuremediate_nodes_unknown") == 0 \
            and metrics.value("gpuremediate_fleet_health_unknown") == 0


GROUPS = 4  # endpoints of 5 nodes each


@pytest.fixture
def prom_world(twenty: EmulatorCluster, tmp_path: Path) -> Iterator[PromWorld]:
    binaries = promlab.binaries()
    if binaries is None:
        pytest.skip("prometheus not installed (apt-get install -y prometheus; .ci/run does it)")
    groups = [twenty.nodes[i::GROUPS] for i in range(GROUPS)]
    endpoints = Endpoints(twenty, groups)
    (tmp_path / "prometheus").mkdir()
    prom = promlab.PromServer(tmp_path / "prometheus", binaries[0],
                              targets=[promlab.Target(t) for t in endpoints.targets], scrape_interval="1s",
                              honor_labels=True).start()
    world = PromWorld(twenty, prom.url, tmp_path)
    try:
        yield world
    finally:
        if world.proc is not None:
            world.proc.terminate()
        prom.stop()
        endpoints.stop()


def test_a_storm_through_prometheus_in_installments_opens_the_breaker_with_nothing_cordoned(
        prom_world: PromWorld) -> None:
    world, cluster = prom_world, prom_world.cluster
    world.start_controller({**BREAKER, "look_s": 10.0})
    cluster.wait(world.read_once, 30, "the controller's first read of Prometheus", seen=lambda: world.log[-5:])
    stormed = [n for i in range(GROUPS) for n in cluster.nodes[i::GROUPS][:3]]  # 3 per endpoint: 12 of 20
    with cluster.invariant(_never_cordoned(cluster), "no node of the storm cordoned"):
        for node in stormed:
            cluster.inject(node, 0, "xid", 79)
        cluster.wait(lambda: all(_breaker_held(cluster, n) and not _held_by_look(cluster, n) for n in stormed), 30,
                     "the storm held by the open breaker", seen=lambda: [cluster.summary(n) for n in stormed])
        cluster.holds(lambda: not any(cluster.unschedulable(n) for n in cluster.nodes), 2,
                      "nothing cordoned after the breaker opened")
    metrics = world.metrics()
    assert metrics.value("gpuremediate_circuit_breaker_open") == 1
    # The installments arrive as Prometheus scrapes each endpoint (1 s apart): usually the first is held by a storm
    # look that ends with the breaker open. On a loaded machine the fault poll can find all twelve in one read, and
    # the breaker opens from that batch with no look. Either way: no look released its faults to be cordoned.
    looks = metrics.value("gpuremediate_breaker_looks_total", outcome="opened")
    assert looks <= 1, [line for line in world.log if "storm look" in line or "breaker" in line][-5:]
    assert metrics.value("gpuremediate_breaker_looks_total", outcome="breaker-open") == looks
    assert metrics.value("gpuremediate_breaker_looks_total", outcome="released") == 0


def test_a_small_burst_through_prometheus_is_cordoned_at_once(prom_world: PromWorld) -> None:
    world, cluster = prom_world, prom_world.cluster
    world.start_controller(BREAKER)  # the default look (20 s): a pair never waits for it
    cluster.wait(world.read_once, 30, "the controller's first read of Prometheus", seen=lambda: world.log[-5:])
    pair = cluster.nodes[:2]
    started = time.monotonic()
    for node in pair:
        cluster.inject(node, 0, "xid", 79)
    cluster.wait(lambda: all(cluster.unschedulable(n) for n in pair), 10, "the pair cordoned",
                 seen=lambda: [cluster.summary(n) for n in pair])
    assert time.monotonic() - started < 10  # Prometheus' 1 s scrape and a 200 ms poll: never the 20 s look
    metrics = world.metrics()
    assert not metrics.has("gpuremediate_breaker_looks_total", outcome="opened")
    assert metrics.value("gpuremediate_circuit_breaker_open") == 0
