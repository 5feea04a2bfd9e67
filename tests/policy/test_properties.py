"""Property tests: evaluate never raises, thermal never flaps, memory survives JSON."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_builders import NODE, gpu, node

from gpuremediate.policy.config import Policy, loads_policy
from gpuremediate.policy.evaluate import PolicyMemory, PolicyMemoryError, evaluate
from gpuremediate.policy.rules import ThermalTimer
from gpuremediate.signals.model import SOURCE_OK, SOURCE_UNKNOWN, GpuReading, NodeReadings
from gpuremediate.vocab.findings import BUILTIN_ACTIONS, Finding, worst

SETTINGS = settings(max_examples=150, deadline=None)
values = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.just(9223372036854775794.0) | st.integers(
    min_value=-5, max_value=600).map(float)
xid_codes = st.none() | st.integers(min_value=-10, max_value=2**63)
readings_strategy = st.builds(
    GpuReading,
    node=st.just(NODE),
    gpu=st.sampled_from(["0", "1", "2"]),
    uuid=st.none() | st.sampled_from(["GPU-a", "GPU-b"]),
    mig_instance=st.none() | st.sampled_from(["1", "2"]),
    xid=xid_codes,
    xid_counts=st.dictionaries(st.integers(min_value=-3, max_value=300), values, max_size=3),
    ecc_dbe_volatile=values,
    row_remap_failure=values,
    row_remap_pending=values,
    uncorrectable_remapped_rows=values,
    gpu_temp=values,
    memory_temp=values,
)
nodes = st.builds(NodeReadings, node=st.just(NODE), source=st.just("exporter"),
                  status=st.sampled_from([SOURCE_OK, SOURCE_OK, SOURCE_UNKNOWN]),
                  gpus=st.lists(readings_strategy, max_size=4).map(tuple))


@SETTINGS
@given(st.lists(nodes, min_size=1, max_size=4), st.floats(min_value=0, max_value=2e9))
def test_evaluate_never_raises_and_findings_are_well_formed(cycles: list[NodeReadings], start: float) -> None:
    memory = PolicyMemory()
    for step, readings in enumerate(cycles):
        evaluation = evaluate(readings, Policy(), memory, start + 30 * step)
        memory = PolicyMemory.from_dict(json.loads(json.dumps(evaluation.memory.to_dict())))
        assert memory == evaluation.memory
        if readings.status == SOURCE_UNKNOWN:
            assert evaluation.findings == []
        for finding in evaluation.findings:
            assert finding.node == NODE and finding.action in BUILTIN_ACTIONS and finding.gpus
            assert len(finding.gpus) == 1 and f":{finding.gpus[0]}" in finding.fingerprint
        assert len({f.fingerprint for f in evaluation.findings}) == len(evaluation.findings)
        if evaluation.findings:
            assert worst(evaluation.findings) == evaluation.findings[0]


def test_worst_ranking() -> None:
    def finding(action: str, urgent: bool = True) -> Finding:
        return Finding(NODE, "xid", "1", ("g",), action, f"{action}:{urgent}", "m", urgent)

    order = [finding("quarantine"), finding("reboot"), finding("reset-gpu"), finding("reset-gpu", urgent=False),
             finding("my-fix"), finding("cordon"), finding("none")]
    for index in range(len(order)):
        assert worst(order[index:]) == order[index]
        assert worst(list(reversed(order[index:]))) == order[index]
    assert worst([]) is None


temps = st.none() | st.sampled_from([70.0, 80.0, 85.0, 89.9, 90.0, 95.0]) | st.floats(min_value=60, max_value=110)
deltas = st.sampled_from([1.0, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 300.0]) | st.floats(min_value=0.5, max_value=200)


@SETTINGS
@given(st.lists(st.tuples(deltas, temps), min_size=1, max_size=40),
       st.sampled_from([0.0, 30.0, 60.0]), st.sampled_from([0.0, 45.0, 300.0]))
def test_thermal_never_flaps(samples: list[tuple[float, float | None]], hold: float, clear_hold: float) -> None:
    """Checked against the history, not the timers: a cordon begins only after an unbroken hot run of
    at least hold_s, and ends only after an unbroken cool run of at least clear_hold_s (missing
    readings neither break nor extend a run); and it does begin/end as soon as those hold."""
    policy = loads_policy(f"[thermal]\nhold_s = {hold}\nclear_hold_s = {clear_hold}").defaults
    rules = policy.thermal
    memory, now, cordoned = PolicyMemory(), 1000.0, False
    history: list[tuple[float, float]] = []  # present readings only
    for delta, temp in samples:
        now += delta
        evaluation = evaluate(node(gpu(gpu_temp=temp)), policy, memory, now)
        memory = evaluation.memory
        if temp is not None:
            history.append((now, temp))
        is_cordoned = any(f.kind == "thermal" for f in evaluation.findings)
        if not cordoned:
            run_start = _run_start(history, lambda t: t >= rules.gpu_cordon_c)
            expected = run_start is not None and now - run_start >= rules.hold_s and temp is not None
        else:
            run_start = _run_start(history, lambda t: t <= rules.gpu_clear_c)
            clears = run_start is not None and now - run_start >= rules.clear_hold_s and temp is not None
            expected = not clears
        assert is_cordoned == expected, (history, now, cordoned)
        if is_cordoned != cordoned:
            history = history[-1:]  # a new phase: its runs start at the transition
        cordoned = is_cordoned


def _run_start(history: list[tuple[float, float]], condition) -> float | None:  # type: ignore[no-untyped-def]
    """Time of the first reading of the unbroken run of readings meeting ``condition`` that ends now."""
    start = None
    for when, temp in reversed(history):
        if not condition(temp):
            break
        start = when
    return start


@SETTINGS
@given(st.dictionaries(
    st.text(min_size=1, max_size=20),
    st.builds(ThermalTimer,
              hot_since=st.none() | st.floats(allow_nan=False, allow_infinity=False),
              cool_since=st.none() | st.floats(allow_nan=False, allow_infinity=False),
              cordoned_since=st.none() | st.floats(allow_nan=False, allow_infinity=False),
              cause=st.sampled_from(["", "gpu_temp", "memory_temp", "gpu_temp,memory_temp"])),
    max_size=5))
def test_memory_round_trip(timers: dict[str, ThermalTimer]) -> None:
    from gpuremediate.policy.evaluate import memory_of

    memory = memory_of(timers)
    assert PolicyMemory.from_dict(json.loads(json.dumps(memory.to_dict()))) == memory
    assert all(not timer.idle for timer in memory.thermal.values())


def test_memory_from_dict_rejects_bad_documents_naming_the_path() -> None:
    cases = [
        ([], "memory: expected an object"),
        ({"v": 2}, "memory.v: expected 1"),
        ({"v": 1, "extra": 1}, "memory.extra: unknown key"),
        ({"v": 1, "thermal": []}, "memory.thermal: expected an object"),
        ({"v": 1, "thermal": {"g": 3}}, "memory.thermal['g']: expected an object"),
        ({"v": 1, "thermal": {"g": {"hot_since": "x"}}}, "memory.thermal['g'].hot_since: expected a finite number"),
        ({"v": 1, "thermal": {"g": {"hot_since": math.inf}}}, "memory.thermal['g'].hot_since: expected a finite"),
        ({"v": 1, "thermal": {"g": {"hot_since": True}}}, "memory.thermal['g'].hot_since: expected a finite"),
        ({"v": 1, "thermal": {"g": {"when": 1}}}, "memory.thermal['g'].when: unknown key"),
        ({"v": 1, "thermal": {"g": {"cause": 1}}}, "memory.thermal['g'].cause: expected a string"),
    ]
    for document, error in cases:
        try:
            PolicyMemory.from_dict(document)
        except PolicyMemoryError as exc:
            assert str(exc).startswith(error), (document, str(exc))
        else:
            raise AssertionError(f"accepted {document!r}")


@given(readings_strategy)
@settings(max_examples=300, deadline=None)
def test_one_gpu_s_readings_merge_as_the_general_merge_does(reading: GpuReading) -> None:
    """The hot path's single-reading merge is the general one, for any values a source may hand in."""
    from gpuremediate.policy.rules import merge_many, merge_readings

    fast, general = merge_readings(NODE, reading.key, [reading]), merge_many(NODE, reading.key, [reading])
    assert fast == general or _nan_equal(fast, general)


def _nan_equal(a: object, b: object) -> bool:
    return json.dumps(a.__dict__, default=str, sort_keys=True) == json.dumps(b.__dict__, default=str, sort_keys=True)
