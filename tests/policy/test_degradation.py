"""The degradation detector: slow GPUs against their peers, degraded links, and what is never either."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from gpuremediate.policy.config import PolicyError, loads_policy
from gpuremediate.policy.degradation import DegradationDetector, NodeContext, job_of_pod
from gpuremediate.signals.dcgm import readings_from_samples
from gpuremediate.signals.exposition import parse
from gpuremediate.signals.model import GpuReading, NodeReadings, PodRef
from gpuremediate.vocab.degradation import DegradationPolicy
from gpuremediate.vocab.findings import KIND_LINK_DEGRADED, KIND_SLOW_GPU

ON = DegradationPolicy(enabled=True, hold_s=300.0, clear_hold_s=600.0, link_hold_s=180.0)
PEAK = 1980.0
HERE = Path(__file__).resolve().parent
SHARED = Path("/work/shared/data/dcgm-exporter")


def gpu(node: str, index: int, clock: float | None = PEAK, util: float | None = 95.0, *, job: str = "train",
        reasons: float | None = None, replays: float | None = None, model: str = "NVIDIA H100 80GB HBM3",
        pods: bool = True) -> GpuReading:
    extra: dict[str, float] = {}
    for name, value in (("DCGM_FI_DEV_SM_CLOCK", clock), ("DCGM_FI_DEV_GPU_UTIL", util),
                        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", reasons),
                        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", replays)):
        if value is not None:
            extra[name] = value
    return GpuReading(node=node, gpu=str(index), uuid=f"GPU-{node}-{index}", model=model, extra=extra,
                      pods=(PodRef("ml", f"{job}-worker-{node[-1]}"),) if pods else ())


def fleet(nodes: int = 4, **overrides: Mapping[int, dict[str, object]]) -> list[NodeReadings]:
    """``nodes`` nodes x 8 busy GPUs of one job; ``overrides[node name][gpu index]`` changes one GPU."""
    out = []
    for n in range(nodes):
        name = f"node-{n}"
        changes = overrides.get(name, {})
        out.append(NodeReadings(node=name, source="exporter", gpus=tuple(
            gpu(name, i, **changes.get(i, {})) for i in range(8))))  # type: ignore[arg-type]
    return out


def run(detector: DegradationDetector, passes: Iterable[tuple[float, list[NodeReadings]]],
        policy: DegradationPolicy = ON, domain: Mapping[str, str] | None = None) -> list[list[str]]:
    """Feed passes; after each, the (kind, gpu) findings of the whole fleet."""
    seen = []
    for now, readings in passes:
        detector.update(readings, lambda name: NodeContext("", policy, (domain or {}).get(name, "")
                                                            if policy.peer_label else ""), now)
        seen.append(sorted(f"{f.kind}:{f.gpus[0]}" for r in readings for f in detector.findings(r.node)))
    return seen


def every_minute(minutes: int, readings: list[NodeReadings], start: float = 0.0) -> list[tuple[float, list]]:
    return [(start + 60.0 * m, readings) for m in range(minutes)]


def test_an_outlier_is_found_once_its_hold_has_passed_and_not_before() -> None:
    slow = fleet(**{"node-1": {3: {"clock": 0.6 * PEAK, "reasons": 0x4}}})
    seen = run(DegradationDetector(), every_minute(7, slow))
    assert seen[:5] == [[]] * 5  # 0..240 s: within the 300 s hold
    assert seen[5] == seen[6] == ["slow-gpu:GPU-node-1-3"]


def test_a_hold_as_long_as_the_read_interval_passes_at_the_second_read() -> None:
    """The Prometheus source reads every 60 s (a little more, under load): a 60 s hold is found at the second
    read, not never (each read was one interval after the last outlier, longer than the hold)."""
    slow = fleet(**{"node-1": {3: {"clock": 0.6 * PEAK}}})
    passes = [(1000.0 + 61.5 * m, slow) for m in range(3)]
    seen = run(DegradationDetector(), passes, dataclasses.replace(ON, hold_s=60.0))
    assert seen == [[], ["slow-gpu:GPU-node-1-3"], ["slow-gpu:GPU-node-1-3"]]


def test_the_finding_names_the_clock_its_peers_and_the_power_cap() -> None:
    detector = DegradationDetector()
    run(detector, every_minute(6, fleet(**{"node-1": {3: {"clock": 0.6 * PEAK, "reasons": 0x4}}})))
    (finding,) = detector.findings("node-1")
    assert finding.action == "cordon" and finding.kind == KIND_SLOW_GPU
    assert "60%" in finding.message and "1980 MHz" in finding.message and "SW power cap" in finding.message


def test_a_busy_pass_at_peer_speed_restarts_the_hold() -> None:
    slow = fleet(**{"node-1": {3: {"clock": 0.6 * PEAK}}})
    passes = [*every_minute(4, slow), (240.0, fleet()), *every_minute(6, slow, start=300.0)]
    seen = run(DegradationDetector(), passes)
    assert all(not s for s in seen[:10])
    assert seen[-1] == ["slow-gpu:GPU-node-1-3"]  # 300 s after 300


def test_an_idle_gpu_is_never_slow() -> None:
    idle = fleet(**{"node-1": {3: {"clock": 210.0, "util": 0.0}, 4: {"clock": 345.0, "util": 80.0, "reasons": 0x1}}})
    assert run(DegradationDetector(), every_minute(30, idle))[-1] == []


def test_a_hot_rack_slow_together_is_not_an_outlier() -> None:
    warm = {i: {"clock": 0.7 * PEAK, "reasons": 0x20} for i in range(8)}
    readings = fleet(8, **{"node-0": warm, "node-1": warm})
    assert run(DegradationDetector(), every_minute(30, readings))[-1] == []


def test_a_node_that_is_its_jobs_only_peers_is_not_judged_against_other_jobs() -> None:
    other = {i: {"clock": 0.7 * PEAK, "job": "infer"} for i in range(8)}  # another job runs lower clocks
    assert run(DegradationDetector(), every_minute(30, fleet(6, **{"node-2": other})))[-1] == []


def test_a_gpu_without_peers_never_fires() -> None:
    alone = [NodeReadings(node="solo", source="exporter", gpus=(gpu("solo", 0, clock=0.3 * PEAK),))]
    assert run(DegradationDetector(), every_minute(60, alone))[-1] == []
    pair = [NodeReadings(node="duo", source="exporter", gpus=(gpu("duo", 0), gpu("duo", 1, clock=0.3 * PEAK)))]
    assert run(DegradationDetector(), every_minute(60, pair))[-1] == []


def test_recovery_clears_after_the_clear_hold_and_the_detector_says_so() -> None:
    detector = DegradationDetector()
    run(detector, every_minute(6, fleet(**{"node-1": {3: {"clock": 0.6 * PEAK}}})))
    assert not detector.cleared("node-1", KIND_SLOW_GPU, ["GPU-node-1-3"])
    seen = run(detector, every_minute(11, fleet(), start=360.0))
    assert seen[9] == ["slow-gpu:GPU-node-1-3"] and seen[10] == []  # 540 s calm: still; 600 s: cleared
    assert detector.cleared("node-1", KIND_SLOW_GPU, ["GPU-node-1-3"])


def test_a_detector_that_never_saw_the_gpu_has_not_seen_it_recover() -> None:
    assert not DegradationDetector().cleared("node-1", KIND_SLOW_GPU, ["GPU-node-1-3"])


def test_disabled_finds_nothing() -> None:
    off = dataclasses.replace(ON, enabled=False)
    readings = fleet(**{"node-1": {3: {"clock": 0.3 * PEAK, "replays": 0.0}}})
    assert run(DegradationDetector(), every_minute(30, readings), policy=off)[-1] == []


def test_peer_label_splits_peers() -> None:
    idle = {i: {"util": 0.0} for i in range(4, 8)}
    slow = fleet(**{"node-1": {3: {"clock": 0.6 * PEAK}, **idle}})  # 4 busy GPUs on node-1
    racks = {"node-0": "a", "node-1": "b", "node-2": "a", "node-3": "a"}
    assert run(DegradationDetector(), every_minute(6, slow), ON, racks)[-1] == ["slow-gpu:GPU-node-1-3"]
    policy = dataclasses.replace(ON, peer_label="rack")
    assert run(DegradationDetector(), every_minute(6, slow), policy, racks)[-1] == []  # 3 peers in rack b


def _replays(minutes: int, per_minute: float, gpu_index: int = 5) -> list[tuple[float, list[NodeReadings]]]:
    return [(60.0 * m, fleet(**{"node-2": {gpu_index: {"replays": 1000 + per_minute * m}}})) for m in range(minutes)]


def test_pcie_replays_rising_for_the_link_hold_are_a_degraded_link() -> None:
    seen = run(DegradationDetector(), _replays(6, 10.0))
    assert seen[:3] == [[]] * 3  # rising since 60 s: the 180 s hold ends at 240 s
    assert seen[4] == ["link-degraded:GPU-node-2-5"]


def test_sporadic_replays_never_add_up() -> None:
    passes = [(60.0 * m, fleet(**{"node-2": {5: {"replays": 1000 + 5 * (m // 10)}}})) for m in range(600)]
    assert all(not s for s in run(DegradationDetector(), passes))


def test_a_counter_reset_is_no_error_and_quiet_clears() -> None:
    detector = DegradationDetector()
    seen = run(detector, [*_replays(6, 10.0), (360.0, fleet(**{"node-2": {5: {"replays": 0.0}}}))])
    assert seen[-1] == ["link-degraded:GPU-node-2-5"]
    quiet = [(360.0 + 60 * m, fleet(**{"node-2": {5: {"replays": 0.0}}})) for m in range(1, 32)]
    seen = run(detector, quiet)
    assert seen[0] and seen[-1] == []
    assert detector.cleared("node-2", KIND_LINK_DEGRADED, ["GPU-node-2-5"])


def test_job_of_pod_drops_generated_suffixes() -> None:
    assert job_of_pod(PodRef("ml", "train-worker-3")) == job_of_pod(PodRef("ml", "train-master-0")) == "ml/train"
    assert job_of_pod(PodRef("ml", "web-5d8f7c9b6d-x7k2p")) == "ml/web"
    assert job_of_pod(PodRef("ml", "llm-7b-2-abcd9")) == "ml/llm-7b"


@pytest.mark.parametrize("path", sorted([*SHARED.glob("*.prom"), *(HERE / "data" / "dcgm-exporter").glob("*.prom")]),
                         ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_no_degradation_finding_from_a_real_scrape(path: Path) -> None:
    """Each real scrape as a whole fleet of identical nodes, repeated for an hour: idle and loaded GPUs alike."""
    samples = parse(path.read_text(encoding="utf-8"), strict=False).samples
    base = readings_from_samples(samples, node="n", source="exporter", observed_at=0.0)[0]
    nodes = [dataclasses.replace(base, node=f"n{i}", gpus=tuple(
        dataclasses.replace(g, node=f"n{i}", uuid=f"{g.uuid}-{i}") for g in base.gpus)) for i in range(6)]
    detector = DegradationDetector()
    seen = run(detector, every_minute(60, nodes))
    assert seen[-1] == [] and all(not s for s in seen)


@pytest.mark.parametrize(("text", "path"), [
    ("[degradation]\nslow_ratio = 1.5", "degradation.slow_ratio"),
    ("[degradation]\nslow_action = \"reboot\"", "degradation.slow_action"),
    ("[degradation]\nmin_peers = 1", "degradation.min_peers"),
    ("[degradation]\nhold = 3", "degradation.hold"),
    ("[degradation]\nlink_gap_s = 4000", "degradation"),
    ("[[groups]]\nselector = \"a=b\"\n[groups.degradation]\nenabled = \"yes\"", "groups[0].degradation.enabled"),
])
def test_a_bad_degradation_section_names_its_path(text: str, path: str) -> None:
    with pytest.raises(PolicyError) as caught:
        loads_policy(text)
    assert str(caught.value).startswith(f"{path}:") or str(caught.value).startswith(f"{path}.")


def test_the_section_is_off_by_default_and_per_group() -> None:
    parsed = loads_policy("[[groups]]\nname = \"h100\"\nselector = \"gpu=h100\"\n"
                          "[groups.degradation]\nenabled = true\nslow_action = \"drain\"\n")
    assert not parsed.defaults.degradation.enabled
    assert parsed.groups[0].policy.degradation.enabled and parsed.groups[0].policy.degradation.slow_action == "drain"


def test_after_a_restart_a_gpu_seen_healthy_clears_only_after_its_clear_hold() -> None:
    detector = DegradationDetector()  # a new controller: the node was cordoned by the one before
    run(detector, every_minute(9, fleet(**{"node-2": {5: {"replays": 500.0}}})))  # 0..480 s, all quiet
    assert not detector.cleared("node-1", KIND_SLOW_GPU, ["GPU-node-1-3"])  # calm for 480 s of 600
    assert not detector.cleared("node-2", KIND_LINK_DEGRADED, ["GPU-node-2-5"])  # quiet for 480 s of 1800
    run(detector, [(600.0, fleet(**{"node-2": {5: {"replays": 500.0}}}))])
    assert detector.cleared("node-1", KIND_SLOW_GPU, ["GPU-node-1-3"])
    run(detector, [(1800.0, fleet(**{"node-2": {5: {"replays": 500.0}}}))])
    assert detector.cleared("node-2", KIND_LINK_DEGRADED, ["GPU-node-2-5"])



TRENDS = dataclasses.replace(DegradationPolicy(), trends=True)


def _counters(minutes: int, field: str, per_minute: float, start: float = 0.0,
              base: float = 10.0) -> list[tuple[float, list[NodeReadings]]]:
    out = []
    for m in range(minutes):
        readings = fleet(2)
        changed = dataclasses.replace(readings[0].gpus[1], extra={**readings[0].gpus[1].extra,
                                                                  field: base + per_minute * m})
        out.append((start + 60.0 * m, [dataclasses.replace(readings[0], gpus=(readings[0].gpus[0], changed,
                                                                                *readings[0].gpus[2:])),
                                       readings[1]]))
    return out


def test_single_bit_errors_climbing_past_the_window_minimum_are_a_trend_not_urgent() -> None:
    detector = DegradationDetector()
    seen = run(detector, _counters(30, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 5.0), TRENDS)
    assert seen[19] == [] and seen[20] == ["trend:GPU-node-0-1"]  # 100 new by minute 20
    (finding,) = detector.findings("node-0")
    assert finding.code == "sbe-rate" and finding.action == "none" and not finding.urgent
    assert not DegradationDetector().findings("node-0")


def test_a_few_single_bit_errors_an_hour_are_no_trend() -> None:
    seen = run(DegradationDetector(), _counters(600, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0.5), TRENDS)
    assert all(not s for s in seen)


def test_pages_pending_retirement_are_a_trend_while_pending() -> None:
    pending = [(0.0, fleet(2, **{"node-1": {}})), *_counters(1, "DCGM_FI_DEV_RETIRED_PENDING", 0.0, 60.0, 2.0),
               *_counters(1, "DCGM_FI_DEV_RETIRED_PENDING", 0.0, 120.0, 0.0)]
    assert run(DegradationDetector(), pending, TRENDS) == [[], ["trend:GPU-node-0-1"], []]


def test_new_remapped_rows_within_a_day_are_a_trend_and_a_quiet_day_clears_it() -> None:
    detector = DegradationDetector()
    rows = [(0.0, 3.0), (3600.0, 4.0), (7200.0, 5.0), (7200.0 + 86400.0 + 7200.0, 5.0)]
    seen = []
    for at, total in rows:
        seen += run(detector, _counters(1, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 0.0, at, total), TRENDS)
    assert seen == [[], [], ["trend:GPU-node-0-1"], []]
    assert detector.cleared("node-0", "trend", ["GPU-node-0-1"])


def test_a_restart_does_not_clear_a_trend_before_its_window_was_watched() -> None:
    detector = DegradationDetector()
    run(detector, _counters(10, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0.0), TRENDS)
    assert not detector.cleared("node-0", "trend", ["GPU-node-0-1"])  # 9 minutes of a 60-minute window
    run(detector, _counters(1, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0.0, 3600.0), TRENDS)
    assert detector.cleared("node-0", "trend", ["GPU-node-0-1"])


def test_trends_off_and_degradation_on_finds_no_trend() -> None:
    on = dataclasses.replace(ON, trends=False)
    assert run(DegradationDetector(), _counters(30, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 50.0), on)[-1] == []


def test_a_gpu_seen_on_another_node_starts_afresh_there_and_leaves_the_first() -> None:
    detector = DegradationDetector()
    run(detector, every_minute(6, fleet(**{"node-1": {3: {"clock": 0.6 * PEAK}}})))
    assert detector.findings("node-1")
    moved = fleet()
    moved[2] = dataclasses.replace(moved[2], gpus=(*moved[2].gpus[:7], dataclasses.replace(
        moved[1].gpus[3], node="node-2")))
    run(detector, [(360.0, moved)])
    assert detector.findings("node-1") == [] and detector.findings("node-2") == []
    assert detector.gpus["GPU-node-1-3"].node == "node-2"


def test_after_a_restart_a_gpu_prometheus_never_ships_clears_once_quiet_for_the_window() -> None:
    """The Prometheus source ships a GPU's counters only when they changed: after a restart a quiet link (or trend)
    is never read. Its node, cordoned before the restart, is released once the GPU has been read with nothing
    unusual for the link's clear hold (the trends' longest window), not kept cordoned for ever."""
    blank = [NodeReadings(node="node-1", source="prometheus", gpus=(GpuReading(node="node-1", gpu="3",
                                                                               uuid="GPU-node-1-3"),))]
    policy = dataclasses.replace(ON, trends=True)
    detector = DegradationDetector()
    cleared = []
    for now in (1000.0, 1000.0 + policy.link_clear_s - 60, 1000.0 + policy.link_clear_s,
                1000.0 + policy.rows_window_s):
        detector.update(blank, lambda _name: NodeContext("", policy), now, {})
        cleared.append((detector.cleared("node-1", KIND_LINK_DEGRADED, ["GPU-node-1-3"]),
                        detector.cleared("node-1", "trend", ["GPU-node-1-3"])))
    assert cleared == [(False, False), (False, False), (True, False), (True, True)]
