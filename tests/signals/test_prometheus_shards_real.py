"""Per-shard reads against a REAL Prometheus (Debian's ``prometheus`` package; .ci/run installs it).

Prometheus scrapes a gpu-sim fleet with the relabelling docs/sizing.md tells a user to copy: ``hashmod`` of the
node name mod S into ``gpuremediate_shard``. The controller's ``--shard-hash=hashmod`` must give every node the
shard Prometheus gave its series, and a replica's reads (``ShardScope``) must bring its own shards' nodes and no
other, following the shards it holds when they change hands. Skipped, saying why, where Prometheus is missing.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from bench import promlab
from gpuremediate.kube.shards import shard_of
from gpuremediate.signals.model import SOURCE_OK, SOURCE_UNKNOWN
from gpuremediate.signals.sources import PrometheusSource, ShardScope
from sim.gpusim import GpuSim
from sim.waiting import wait_for

BINARIES = promlab.binaries()
pytestmark = pytest.mark.skipif(
    BINARIES is None, reason="prometheus/promtool not installed (apt-get install -y prometheus; .ci/run does it)")
SHARDS = 4
LABEL = "gpuremediate_shard"
NODES = [f"gpu-node-{i}" for i in range(10)] + ["a100-rack7-u12", "h100.pool-b.example.com"]
RELABEL = {"source_labels": ["Hostname"], "action": "hashmod", "modulus": SHARDS, "target_label": LABEL}


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[promlab.PromServer, GpuSim]]:
    assert BINARIES is not None
    workdir = tmp_path_factory.mktemp("prometheus-shards")
    sim = GpuSim(port=0)
    for i, node in enumerate(NODES):
        sim.add_node(node, gpus=2, ip=f"127.0.0.{100 + i}")
    sim.start()
    server = promlab.PromServer(workdir, BINARIES[0], targets=[promlab.Target(f"127.0.0.{100 + i}:{sim.port}")
                                                               for i in range(len(NODES))],
                                metric_relabel_configs=[RELABEL]).start()
    yield server, sim
    server.stop()
    sim.stop()


def _shards_in_prometheus(server: promlab.PromServer) -> dict[str, str]:
    query = urllib.parse.urlencode({"query": f"group by (Hostname, {LABEL}) (DCGM_FI_DEV_GPU_TEMP)"})
    with urllib.request.urlopen(f"{server.url}/api/v1/query?{query}", timeout=10) as resp:
        result = json.loads(resp.read())["data"]["result"]
    return {item["metric"]["Hostname"]: item["metric"].get(LABEL, "") for item in result}


def test_the_controller_s_hashmod_is_prometheus_hashmod(prom: tuple[promlab.PromServer, GpuSim]) -> None:
    server, _sim = prom
    labelled = wait_for(lambda: len(got := _shards_in_prometheus(server)) == len(NODES) and got, 30,
                        "every node's series scraped")
    assert labelled == {node: str(shard_of(node, SHARDS, "hashmod")) for node in NODES}
    assert len(set(labelled.values())) > 1  # the fleet is split, not all in one shard


def test_a_replica_reads_only_the_shards_it_holds_and_follows_a_handover(
        prom: tuple[promlab.PromServer, GpuSim]) -> None:
    server, sim = prom
    held = {"now": frozenset({1, 3})}
    source = PrometheusSource(server.url, recording_rules=False, expected_nodes=lambda: NODES,
                              shard_scope=ShardScope(LABEL, SHARDS, lambda: held["now"]))
    wait_for(lambda: len(_shards_in_prometheus(server)) == len(NODES), 30, "every node's series scraped")
    mine = {n for n in NODES if shard_of(n, SHARDS, "hashmod") in {1, 3}}
    readings = {r.node: r for r in source.read()}
    assert set(readings) == mine and mine  # nobody else's node, not even as unknown
    assert all(r.status == SOURCE_OK and len(r.gpus) == 2 for r in readings.values())

    faulty = sorted(mine)[0]
    other = next(n for n in NODES if n not in mine)
    sim.inject_xid(faulty, 1, 79)
    sim.inject_xid(other, 0, 79)  # another shard's: its holder's to see
    changed = wait_for(lambda: source.changed_nodes() or None, 30, "the fault fast path sees the XID")
    assert changed == {faulty}

    held["now"] = frozenset({0, 1, 3})  # shard 0 changes hands to this replica: read from the next read on
    readings = {r.node: r for r in source.read()}
    assert set(readings) == mine | {n for n in NODES if shard_of(n, SHARDS, "hashmod") == 0}
    assert readings[faulty].gpus[1].xid == 79

    held["now"] = frozenset()  # nothing held: nothing asked for (an empty matcher would select the fleet)
    assert source.read() == [] and source.changed_nodes() == set()


def test_a_shard_with_no_series_is_unknown_for_its_holder(prom: tuple[promlab.PromServer, GpuSim]) -> None:
    server, _sim = prom
    ghost = next(f"ghost-{i}" for i in range(100) if shard_of(f"ghost-{i}", SHARDS, "hashmod") == 2)
    source = PrometheusSource(server.url, recording_rules=False, expected_nodes=lambda: [*NODES, ghost],
                              shard_scope=ShardScope(LABEL, SHARDS, lambda: frozenset({2})))
    readings = {r.node: r for r in source.read()}
    assert readings[ghost].status == SOURCE_UNKNOWN and LABEL in readings[ghost].reason
    assert set(readings) == {n for n in [*NODES, ghost] if shard_of(n, SHARDS, "hashmod") == 2}
