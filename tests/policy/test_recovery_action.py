"""[recovery_action]: the driver's verdict (DCGM field 1523) from an exporter's text to a finding."""

from __future__ import annotations

import pytest

from gpuremediate.policy.config import default_policy, loads_policy
from gpuremediate.policy.evaluate import PolicyMemory, evaluate
from gpuremediate.policy.recovery_action import KIND_RECOVERY_ACTION
from gpuremediate.signals.dcgm import readings_from_samples
from gpuremediate.signals.exposition import parse
from gpuremediate.signals.model import NodeReadings

LABELS = 'gpu="{gpu}",UUID="GPU-{gpu:04d}",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"'


def scrape(values: dict[int, str], field: str = "DCGM_FI_DEV_GPU_RECOVERY_ACTION") -> NodeReadings:
    lines = [f"# TYPE {field} gauge"]
    lines += [f"{field}{{{LABELS.format(gpu=gpu)}}} {value}" for gpu, value in values.items()]
    lines += ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    lines += [f"DCGM_FI_DEV_GPU_TEMP{{{LABELS.format(gpu=gpu)}}} 40" for gpu in values]
    [readings] = readings_from_samples(parse("\n".join(lines) + "\n").samples, node="n1", source="exporter",
                                       observed_at=100.0)
    return readings


def recovery(readings: NodeReadings, policy_text: str = "") -> list[tuple[str, str, tuple[str, ...], bool]]:
    policy = loads_policy(policy_text, "p").defaults if policy_text else default_policy().defaults
    found = evaluate(readings, policy, PolicyMemory(), 200.0).findings
    return [(f.code, f.action, f.gpus, f.urgent) for f in found if f.kind == KIND_RECOVERY_ACTION]


def test_each_verdict_gets_its_action_and_drain_and_reset_may_wait() -> None:
    readings = scrape({0: "0", 1: "1", 2: "2", 3: "3", 4: "4"})
    assert sorted(recovery(readings)) == [
        ("DRAIN_AND_RESET", "reset-gpu", ("GPU-0004",), False),
        ("DRAIN_P2P", "cordon", ("GPU-0003",), True),
        ("GPU_RESET", "reset-gpu", ("GPU-0001",), True),
        ("NODE_REBOOT", "reboot", ("GPU-0002",), True),
    ]


def test_the_deprecated_field_name_is_read_too() -> None:
    assert recovery(scrape({0: "2"}, field="DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION")) == [
        ("NODE_REBOOT", "reboot", ("GPU-0000",), True)]


@pytest.mark.parametrize("value", ["2147483632", "-1", "1.5", "NaN", "300"])
def test_blanks_and_garbage_are_no_verdict(value: str) -> None:
    assert recovery(scrape({0: value})) == []


def test_an_unknown_value_is_an_event_only_and_the_policy_can_change_each_action() -> None:
    assert recovery(scrape({0: "9"})) == [("value 9", "none", ("GPU-0000",), True)]
    assert sorted(recovery(scrape({0: "5", 1: "6", 2: "7"}))) == [
        ("BUS_RESET", "reboot", ("GPU-0001",), True), ("RECOVER_IMEX_DOMAIN", "cordon", ("GPU-0000",), True),
        ("SYSTEM_REBOOT", "reboot", ("GPU-0002",), True)]
    custom = '[recovery_action]\ndrain_p2p_action = "reboot"\nunknown_action = "reset-gpu"\n'
    assert sorted(recovery(scrape({0: "3", 1: "9"}), custom)) == [
        ("DRAIN_P2P", "reboot", ("GPU-0000",), True), ("value 9", "reset-gpu", ("GPU-0001",), True)]
    assert recovery(scrape({0: "2"}), "[recovery_action]\nenabled = false\n") == []


def test_a_verdict_cleared_and_raised_again_is_a_new_fault_only_by_its_value() -> None:
    policy = default_policy().defaults
    first = evaluate(scrape({0: "1"}), policy, PolicyMemory(), 1.0).findings
    again = evaluate(scrape({0: "1"}), policy, PolicyMemory(), 2.0).findings
    other = evaluate(scrape({0: "2"}), policy, PolicyMemory(), 3.0).findings
    assert [f.fingerprint for f in first] == [f.fingerprint for f in again] != [f.fingerprint for f in other]
