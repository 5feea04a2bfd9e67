"""The degradation queries (signals/prom_degradation.py) against a REAL Prometheus (Debian's package).

Two hours of a small fleet are backfilled: every GPU busy at the same clock but one slow GPU, an idle node,
counters that rose (PCIe replays, one NVLink counter, single-bit ECC), counters that are high but flat, pages
pending retirement, ordinary nodes, and a node whose series began half an hour ago (younger than the windows).
Exactly the nodes with something unusual come back, each with every field of every GPU; the fleet's peers per
model are what statistics.median computes. Then the detector, fed by the source over reads, finds the slow GPU.
Skipped, saying why, where prometheus/promtool are not installed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import promlab
from gpuremediate.policy.degradation import DegradationDetector, NodeContext
from gpuremediate.signals import prom_degradation
from gpuremediate.signals.degradation_fields import MAD_SCALE, NVLINK_ERRORS
from gpuremediate.signals.model import NodeReadings
from gpuremediate.signals.sources import PrometheusSource
from gpuremediate.vocab.degradation import DegradationPolicy

BINARIES = promlab.binaries()
pytestmark = pytest.mark.skipif(
    BINARIES is None, reason="prometheus/promtool not installed (apt-get install -y prometheus; .ci/run does it)")
MODEL = "NVIDIA H100 80GB HBM3"
FAST, SLOW = 1980.0, 1350.0
NODES = [f"deg-{i}" for i in range(10)]  # deg-6..9: ordinary
GPUS = 4
STEP_S = 15.0
SPAN_S = 7200.0


def _values(node: str, gpu: int, age_s: float) -> dict[str, float]:
    """One GPU's fields ``age_s`` before now."""
    idle = node == "deg-5"
    rising = (SPAN_S - age_s) / STEP_S  # one more each sample
    return {
        "DCGM_FI_DEV_GPU_TEMP": 50.0, "DCGM_FI_DEV_MEMORY_TEMP": 55.0, "DCGM_FI_DEV_XID_ERRORS": 0.0,
        "DCGM_FI_DEV_GPU_UTIL": 0.0 if idle else 95.0,
        "DCGM_FI_DEV_SM_CLOCK": 210.0 if idle else SLOW if (node, gpu) == ("deg-2", 1) else FAST + gpu,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": rising if (node, gpu) == ("deg-3", 0) else 7.0,
        **{name: (rising if (node, gpu, name) == ("deg-4", 2, NVLINK_ERRORS[1]) else 3.0) for name in NVLINK_ERRORS},
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 1000 + 5 * rising if (node, gpu) == ("deg-1", 3) else 400.0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2.0,
        "DCGM_FI_DEV_RETIRED_PENDING": 1.0 if (node, gpu) == ("deg-0", 2) else 0.0,
    }


def _families(now: float) -> dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]]:
    families: dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]] = {}
    spans = {**{node: SPAN_S for node in NODES}, "new-1": 1800.0}
    for node, span in spans.items():
        ages = [span - i * STEP_S for i in range(int(span // STEP_S))]
        for gpu in range(GPUS):
            labels = promlab.gpu_labels(node, gpu)
            per_age = [(age, _values(node if node != "new-1" else "deg-0", gpu, age)) for age in ages]
            if node == "new-1":  # a node younger than the windows: GPU 1's PCIe counter rose 5 minutes ago
                per_age = [(age, {**v, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 9.0 + (gpu == 1 and age < 300),
                                  "DCGM_FI_DEV_RETIRED_PENDING": 0.0}) for age, v in per_age]
            for name in per_age[0][1]:
                families.setdefault(name, []).append((labels, [(now - age, v[name]) for age, v in per_age]))
    return families


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[promlab.PromServer]:
    assert BINARIES is not None
    prometheus, promtool = BINARIES
    workdir: Path = tmp_path_factory.mktemp("prometheus-degradation")
    promlab.backfill(promlab.openmetrics(_families(time.time())), workdir / "data", promtool)
    with promlab.PromServer(workdir, prometheus) as started:  # __enter__ starts it
        yield started


def _policy() -> DegradationPolicy:
    return DegradationPolicy(enabled=True, trends=True, hold_s=0.0, min_peers=4)


def _source(server: promlab.PromServer) -> PrometheusSource:
    src = PrometheusSource(server.url, recording_rules=False, stale_after_s=120.0)
    src.degradation_plan = prom_degradation.plan_for([_policy()])
    return src


def _extra(readings: list[NodeReadings]) -> dict[tuple[str, str], dict[str, float]]:
    return {(r.node, g.gpu): dict(g.extra) for r in readings for g in r.gpus if g.extra}


def test_only_what_is_not_ordinary_comes_back(server: promlab.PromServer) -> None:
    src = _source(server)
    extra = _extra(src.read())
    # the marked nodes (a slow suspect, a changed counter, pages pending, a young series that changed) bring
    # every field of every GPU; the ordinary and the idle nodes nothing
    marked = {"deg-0", "deg-1", "deg-2", "deg-3", "deg-4", "new-1"}
    assert {node for node, _ in extra} == marked
    assert all(len([k for k in extra if k[0] == node]) == GPUS for node in marked)
    # the suspect's node: every GPU's clock and load (its own peers), the slow one among them
    assert {gpu: got["DCGM_FI_DEV_SM_CLOCK"] for (node, gpu), got in extra.items() if node == "deg-2"} == {
        "0": FAST, "1": SLOW, "2": FAST + 2, "3": FAST + 3}
    assert all({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", *NVLINK_ERRORS,
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_RETIRED_PENDING"} <= set(got) for got in extra.values())
    # the counters are totals, as the exporter serves them
    assert extra[("deg-3", "0")]["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == SPAN_S / STEP_S - 1
    assert extra[("deg-3", "1")]["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 7.0
    assert extra[("deg-0", "2")]["DCGM_FI_DEV_RETIRED_PENDING"] == 1.0
    # the fleet's peers are asked only while there is a suspect: the busy GPUs (not the idle node), statistics as
    # the exporter path computes them
    busy = [_values(node, gpu, 0)["DCGM_FI_DEV_SM_CLOCK"] for node in NODES if node != "deg-5"
            for gpu in range(GPUS)] + [_values("deg-0", gpu, 0)["DCGM_FI_DEV_SM_CLOCK"] for gpu in range(GPUS)]
    median = statistics.median(busy)
    assert src.fleet_peers is not None and set(src.fleet_peers) == {MODEL}
    peers = src.fleet_peers[MODEL]
    assert peers.count == len(busy)
    assert peers.median == pytest.approx(median)
    assert peers.spread == pytest.approx(MAD_SCALE * statistics.median(abs(c - median) for c in busy))


def test_between_full_reads_only_suspects_and_link_counters_mark_a_node(server: promlab.PromServer) -> None:
    src = _source(server)
    src.read()
    extra = _extra(src.read())  # the second read: no trend counter, pending page or young series looked at
    assert {node for node, _ in extra} == {"deg-2", "deg-3", "deg-4"}


def test_the_detector_fed_by_prometheus_finds_the_slow_gpu_and_nothing_else(server: promlab.PromServer) -> None:
    src = _source(server)
    detector = DegradationDetector()
    policy = _policy()
    for now in (1000.0, 1030.0, 1060.0):
        detector.update(src.read(), lambda _node: NodeContext("", policy), now, src.fleet_peers)
    found = {(node, f.kind, f.gpus) for node in NODES for f in detector.findings(node) if f.kind == "slow-gpu"}
    assert found == {("deg-2", "slow-gpu", ("GPU-deg-2-01",))}


def test_a_failed_degradation_query_reads_no_field_and_says_why(server: promlab.PromServer,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(server)
    monkeypatch.setattr(prom_degradation, "nodes_query", lambda *_: "max by (")  # Prometheus: HTTP 400
    readings = src.read()
    assert readings and all(r.status == "ok" for r in readings if r.node in NODES)
    assert not _extra(readings)
    assert "Prometheus degradation query" in src.degradation_error and "400" in src.degradation_error
