"""Table tests for every rule edge: readings -> findings."""

from __future__ import annotations

import pytest
from policy_builders import NODE, UUID, fingerprints, gpu, node, run

from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.evaluate import PolicyMemory
from gpuremediate.policy.rules import ThermalTimer
from gpuremediate.signals.model import SOURCE_UNKNOWN
from gpuremediate.vocab.findings import Finding

PLACEHOLDER = 9223372036854775794.0


def _policy(text: str):  # type: ignore[no-untyped-def]
    return loads_policy(text).defaults


def _only(readings_gpu, text: str = "") -> list[Finding]:  # type: ignore[no-untyped-def]
    return run(node(readings_gpu), _policy(text)).findings


def test_healthy_gpu_has_no_findings() -> None:
    healthy = gpu(xid=0, ecc_dbe_volatile=0, row_remap_failure=0, row_remap_pending=0,
                  uncorrectable_remapped_rows=0, gpu_temp=45, memory_temp=50, xid_counts={79: 0})
    assert run(node(healthy)).findings == []


def test_unknown_source_gives_no_findings_and_keeps_memory() -> None:
    memory = PolicyMemory.from_dict({"v": 1, "thermal": {UUID: {"cordoned_since": 5.0, "cause": "gpu_temp"}}})
    faulty = gpu(xid=79, ecc_dbe_volatile=3, gpu_temp=100)
    evaluation = run(node(faulty, status=SOURCE_UNKNOWN), memory=memory)
    assert evaluation.findings == [] and evaluation.memory == memory


@pytest.mark.parametrize(
    ("code", "action"), [(79, "reboot"), (48, "reset-gpu"), (13, "none"), (61, "quarantine"), (4242, "quarantine")]
)
def test_xid_gauge_finding(code: int, action: str) -> None:
    [finding] = _only(gpu(xid=code))
    assert (finding.kind, finding.code, finding.action, finding.gpus) == ("xid", str(code), action, (UUID,))
    assert finding.fingerprint == f"xid:{UUID}:{code}" and finding.node == NODE
    assert str(code) in finding.message


@pytest.mark.parametrize("value", [None, 0, -1, int(PLACEHOLDER)])
def test_xid_gauge_without_a_fault(value: int | None) -> None:
    assert _only(gpu(xid=value)) == []


def test_stale_xid_gauge_keeps_its_fingerprint_across_cycles_and_restarts() -> None:
    first = run(node(gpu(xid=79)), now=1.0)
    later = run(node(gpu(xid=79)), memory=PolicyMemory.from_dict(first.memory.to_dict()), now=5000.0)
    assert fingerprints(first) == fingerprints(later) == [f"xid:{UUID}:79"]


def test_xid_without_uuid_uses_node_and_index() -> None:
    [finding] = _only(gpu(index="3", uuid=None, xid=79))
    assert finding.gpus == (f"{NODE}/gpu3",) and finding.fingerprint == f"xid:{NODE}/gpu3:79"


def test_xid_counts() -> None:
    findings = _only(gpu(xid_counts={79: 2.0, 13: 1.0, 48: 0.0, 31: PLACEHOLDER, 95: float("nan"), -3: 4.0}))
    assert [(f.fingerprint, f.action) for f in findings] == [(f"xidcount:{UUID}:79", "reboot"),
                                                             (f"xidcount:{UUID}:13", "none")]
    assert "2 time(s)" in findings[0].message


def test_xid_overrides_and_disable() -> None:
    [finding] = _only(gpu(xid=79), '[xid.overrides]\n79 = {action = "reset-gpu", reason = "ours."}')
    assert (finding.action, finding.message.endswith("ours.")) == ("reset-gpu", True)
    assert _only(gpu(xid=4242), '[xid]\nunknown_action = "none"')[0].action == "none"
    assert _only(gpu(xid=79, xid_counts={79: 1}), "[xid]\nenabled = false") == []


@pytest.mark.parametrize(
    ("value", "fingerprint"),
    [(None, None), (0, None), (0.0, None), (-1, None), (PLACEHOLDER, None), (float("inf"), None),
     (1, f"ecc-dbe:{UUID}:1"), (7, f"ecc-dbe:{UUID}:7"), (2.5, f"ecc-dbe:{UUID}:2.5")],
)
def test_ecc_dbe(value: float | None, fingerprint: str | None) -> None:
    findings = _only(gpu(ecc_dbe_volatile=value))
    assert fingerprints_of(findings) == ([fingerprint] if fingerprint else [])
    if fingerprint:
        assert (findings[0].kind, findings[0].action, findings[0].urgent) == ("ecc-dbe", "reset-gpu", True)


def fingerprints_of(findings: list[Finding]) -> list[str]:
    return [f.fingerprint for f in findings]


def test_ecc_threshold_exactly_at_the_limit_and_custom_action() -> None:
    text = '[ecc]\ndbe_min = 3\ndbe_action = "my-fix"'
    assert _only(gpu(ecc_dbe_volatile=2), text) == []
    [finding] = _only(gpu(ecc_dbe_volatile=3), text)
    assert finding.action == "my-fix"
    assert _only(gpu(ecc_dbe_volatile=9), "[ecc]\nenabled = false") == []


def test_ecc_increase_is_a_new_fault() -> None:
    assert fingerprints_of(_only(gpu(ecc_dbe_volatile=1))) != fingerprints_of(_only(gpu(ecc_dbe_volatile=2)))


@pytest.mark.parametrize(("value", "fires"), [(None, False), (0, False), (PLACEHOLDER, False), (1, True)])
def test_row_remap_failure(value: float | None, fires: bool) -> None:
    findings = _only(gpu(row_remap_failure=value))
    expected = [("row-remap-failure", "quarantine", f"row-remap-failure:{UUID}")] if fires else []
    assert [(f.kind, f.action, f.fingerprint) for f in findings] == expected


@pytest.mark.parametrize(("value", "fires"), [(None, False), (0, False), (PLACEHOLDER, False), (1, True)])
def test_row_remap_pending_is_not_urgent(value: float | None, fires: bool) -> None:
    findings = _only(gpu(row_remap_pending=value))
    expected = [("row-remap-pending", "reset-gpu", False)] if fires else []
    assert [(f.kind, f.action, f.urgent) for f in findings] == expected
    if fires:
        assert _only(gpu(row_remap_pending=1), "[row_remap]\npending_urgent = true")[0].urgent is True


@pytest.mark.parametrize(("rows", "fires"), [(None, False), (0, False), (7, False), (8, True), (30, True),
                                             (PLACEHOLDER, False)])
def test_uncorrectable_rows_default_threshold(rows: float | None, fires: bool) -> None:
    findings = _only(gpu(uncorrectable_remapped_rows=rows))
    expected = [("uncorrectable-rows", "quarantine", f"uncorrectable-rows:{UUID}:{rows:.0f}")] if fires else []
    assert [(f.kind, f.action, f.fingerprint) for f in findings] == expected


def test_uncorrectable_rows_zero_disables_and_threshold_one_fires_on_any() -> None:
    assert _only(gpu(uncorrectable_remapped_rows=500), "[row_remap]\nuncorrectable_rows_min = 0") == []
    assert len(_only(gpu(uncorrectable_remapped_rows=1), "[row_remap]\nuncorrectable_rows_min = 1")) == 1
    everything = gpu(row_remap_failure=1, row_remap_pending=1, uncorrectable_remapped_rows=100)
    assert _only(everything, "[row_remap]\nenabled = false") == []


def test_mig_instances_are_one_physical_gpu() -> None:
    instances = (gpu(mig_instance="1", xid=48, ecc_dbe_volatile=1, gpu_temp=40),
                 gpu(mig_instance="2", xid=48, ecc_dbe_volatile=3, gpu_temp=41),
                 gpu(mig_instance="3", xid=31))
    findings = run(node(*instances)).findings
    assert {f.gpus for f in findings} == {(UUID,)}
    assert fingerprints_of(findings) == [f"ecc-dbe:{UUID}:3", f"xid:{UUID}:48", f"xid:{UUID}:31"]


def test_several_gpus_and_findings_are_ordered_worst_first() -> None:
    readings = node(gpu("0", uuid="GPU-a", xid=13), gpu("1", uuid="GPU-b", row_remap_pending=1),
                    gpu("2", uuid="GPU-c", ecc_dbe_volatile=1), gpu("3", uuid="GPU-d", row_remap_failure=1),
                    gpu("4", uuid="GPU-e", xid=79))
    actions = [(f.action, f.urgent) for f in run(readings).findings]
    assert actions == [("quarantine", True), ("reboot", True), ("reset-gpu", True), ("reset-gpu", False),
                       ("none", True)]


def test_thermal_memory_for_a_gpu_without_readings_is_kept_and_still_cordons() -> None:
    memory = PolicyMemory.from_dict({"v": 1, "thermal": {"GPU-gone": {"cordoned_since": 10.0, "cause": "gpu_temp"}}})
    evaluation = run(node(gpu(gpu_temp=50)), memory=memory)
    assert [(f.gpus, f.action) for f in evaluation.findings] == [(("GPU-gone",), "cordon")]
    assert evaluation.memory.thermal["GPU-gone"] == ThermalTimer(cordoned_since=10.0, cause="gpu_temp")


def test_now_must_be_finite() -> None:
    with pytest.raises(ValueError, match="now must be a finite unix time"):
        run(node(gpu()), now=float("nan"))


# DCGM's int32 / fp64 blanks (dcgm_structs.h) and values no GPU can report, on readings from any source
INT32_BLANK, FP64_BLANK = 2147483632.0, 140737488355328.0
IMPLAUSIBLE_FIELDS = [
    {"row_remap_failure": INT32_BLANK}, {"row_remap_failure": INT32_BLANK + 2}, {"row_remap_pending": FP64_BLANK},
    {"ecc_dbe_volatile": INT32_BLANK + 3}, {"ecc_dbe_volatile": FP64_BLANK + 2},
    {"uncorrectable_remapped_rows": INT32_BLANK + 1}, {"xid": 4294967295}, {"xid": 2147483634},
    {"xid_counts": {4294967295: 1.0}}, {"xid_counts": {79: INT32_BLANK}}, {"gpu_temp": FP64_BLANK},
    {"gpu_temp": 9.2e18}, {"memory_temp": 9.2e18}, {"gpu_temp": 0.0}, {"memory_temp": INT32_BLANK},
]


@pytest.mark.parametrize("fields", IMPLAUSIBLE_FIELDS, ids=lambda fields: "-".join(map(str, fields.items())))
def test_blanks_and_implausible_values_are_never_faults(fields: dict[str, object]) -> None:
    policy = _policy("[thermal]\nhold_s = 0")
    assert run(node(gpu(**fields)), policy).findings == []
