"""Thermal cordon with hysteresis: hold times, clear times, missing readings, no flapping."""

from __future__ import annotations

from collections.abc import Sequence

from policy_builders import UUID, gpu, node

from gpuremediate.policy.config import Policy, loads_policy
from gpuremediate.policy.evaluate import PolicyMemory, evaluate

# hold 60 s above 90 C (GPU) / 95 C (memory); clear after 300 s at or below 80 C / 85 C
DEFAULT = Policy()


def _series(samples: Sequence[tuple[float, float | None, float | None]], policy: Policy = DEFAULT) -> list[bool]:
    """Feed (time, gpu_temp, memory_temp) samples; return whether a cordon finding is open after each."""
    memory, cordoned = PolicyMemory(), []
    for now, gpu_temp, memory_temp in samples:
        evaluation = evaluate(node(gpu(gpu_temp=gpu_temp, memory_temp=memory_temp)), policy, memory, now)
        memory = evaluation.memory
        cordoned.append(any(f.kind == "thermal" and f.action == "cordon" for f in evaluation.findings))
    return cordoned


def test_hot_for_the_hold_time_cordons_exactly_at_the_limit() -> None:
    assert _series([(0, 95, None), (30, 95, None), (59.9, 95, None), (60, 95, None)]) == [False, False, False, True]


def test_at_the_cordon_threshold_counts_as_hot_and_just_below_does_not() -> None:
    assert _series([(0, 90, None), (60, 90, None)]) == [False, True]
    assert _series([(0, 89.9, None), (60, 89.9, None), (120, 89.9, None)]) == [False, False, False]


def test_memory_temperature_alone_cordons() -> None:
    assert _series([(0, 40, 95), (60, 40, 96)]) == [False, True]
    assert _series([(0, 40, 94.9), (60, 40, 94.9)]) == [False, False]


def test_a_cool_reading_restarts_the_hold_timer() -> None:
    assert _series([(0, 95, None), (50, 85, None), (60, 95, None), (110, 95, None), (120, 95, None)]) == [
        False, False, False, False, True]


def test_missing_readings_neither_start_nor_clear_the_hold_timer() -> None:
    assert _series([(0, None, None), (60, 95, None), (100, None, None), (120, 95, None)]) == [
        False, False, False, True]
    placeholder = 9223372036854775794.0
    assert _series([(0, 95, None), (30, placeholder, float("nan")), (60, 95, None)]) == [False, False, True]


def test_cordon_stays_in_the_band_and_clears_after_the_clear_hold() -> None:
    samples = [(0, 95, None), (60, 95, None),  # cordoned
               (100, 85, None), (1000, 85, None),  # in the band (80 < t < 90): stays cordoned
               (1100, 80, None), (1399, 70, None), (1400, 70, None)]  # cool from 1100: clears at 1400
    assert _series(samples) == [False, True, True, True, True, True, False]


def test_a_warm_reading_restarts_the_clear_timer() -> None:
    samples = [(0, 95, None), (60, 95, None), (100, 70, None), (350, 81, None), (399, 70, None),
               (400, 70, None), (698, 70, None), (699, 70, None)]
    assert _series(samples) == [False, True, True, True, True, True, True, False]  # cool again from 399


def test_missing_readings_do_not_clear_a_cordon() -> None:
    samples = [(0, 95, None), (60, 95, None), (100, None, None), (10_000, None, None), (10_001, 70, None),
               (10_301, 70, None)]
    assert _series(samples) == [False, True, True, True, True, False]


def test_both_temperatures_must_be_cool_to_clear() -> None:
    samples = [(0, 95, None), (60, 95, None), (100, 70, 90), (500, 70, 90), (600, 70, 85), (900, 70, 85)]
    assert _series(samples) == [False, True, True, True, True, False]


def test_cordon_fingerprint_is_stable_during_an_episode_and_new_for_the_next() -> None:
    policy = loads_policy("[thermal]\nhold_s = 0\nclear_hold_s = 0").defaults
    memory, seen = PolicyMemory(), []
    for now, temp in [(1, 95), (2, 95), (3, 70), (4, 95)]:
        evaluation = evaluate(node(gpu(gpu_temp=temp)), policy, memory, now)
        memory = evaluation.memory
        seen.append([f.fingerprint for f in evaluation.findings])
    assert seen == [[f"thermal:{UUID}:1.000"], [f"thermal:{UUID}:1.000"], [], [f"thermal:{UUID}:4.000"]]


def test_disabled_thermal_forgets_its_timers() -> None:
    memory = PolicyMemory.from_dict({"v": 1, "thermal": {UUID: {"cordoned_since": 1.0, "cause": "gpu_temp"}}})
    policy = loads_policy("[thermal]\nenabled = false").defaults
    evaluation = evaluate(node(gpu(gpu_temp=99)), policy, memory, 100.0)
    assert evaluation.findings == [] and evaluation.memory == PolicyMemory()


def test_group_thresholds_apply() -> None:
    policy = loads_policy('[[groups]]\nselector = "pool=hot"\nthermal.gpu_cordon_c = 85\nthermal.hold_s = 10'
                          ).for_node({"pool": "hot"})
    assert _series([(0, 86, None), (10, 86, None)], policy) == [False, True]


def test_a_memory_sensor_reading_zero_does_not_clear_a_cordon_while_the_gpu_temperature_is_missing() -> None:
    # L40S, T4, RTX and vGPU scrapes report DCGM_FI_DEV_MEMORY_TEMP 0: no sensor, not 0 C
    samples = [(0, 95, 0), (60, 95, 0), (100, None, 0), (10_000, None, 0), (10_001, 70, 0), (10_301, 70, 0)]
    assert _series(samples) == [False, True, True, True, True, False]


def test_a_cordon_waits_for_the_reading_that_caused_it() -> None:
    # cordoned for the GPU temperature: a cool memory reading alone is not "cool" while the GPU one is missing
    samples = [(0, 95, 40), (60, 95, 40), (100, None, 40), (10_000, None, 40), (10_001, 70, 40), (10_301, 70, 40)]
    assert _series(samples) == [False, True, True, True, True, False]


def test_a_missing_cause_reading_pauses_the_clear_timer_without_restarting_it() -> None:
    samples = [(0, 95, 40), (60, 95, 40), (100, 70, 40), (200, None, 40), (400, 70, 40)]
    assert _series(samples) == [False, True, True, True, False]  # cool since 100, clear hold 300 s


def test_blank_temperatures_do_not_cordon() -> None:
    fp64_blank, int32_blank = 140737488355328.0, 2147483632.0
    assert _series([(0, fp64_blank, int32_blank), (60, fp64_blank, int32_blank), (120, 9.2e18, 9.2e18)]) == [
        False, False, False]
