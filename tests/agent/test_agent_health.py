"""The agent's health model: the shared policy evaluation plus a hung driver, a missing GPU and NVSwitch errors."""

from __future__ import annotations

from gpuremediate.agent import kmsg
from gpuremediate.agent.health import (
    Expected,
    Inputs,
    SmiResult,
    Wanted,
    assess,
    expected_gpus,
    update_inventory,
)
from gpuremediate.agent.kmsg import KIND_SXID, KIND_XID, KernelEvent
from gpuremediate.policy import conditions as c
from gpuremediate.policy.config import default_policy
from gpuremediate.policy.evaluate import PolicyMemory
from gpuremediate.policy.xid import lookup
from gpuremediate.signals import nvidiasmi
from gpuremediate.signals.model import GpuReading, NodeReadings

NOW = 1_800_000_000.0
POLICY = default_policy().for_node({})


def gpu(index: int, **values: object) -> GpuReading:
    return GpuReading(node="n1", gpu=str(index), uuid=f"GPU-{index}", pci_bus_id=f"00000000:{0x3b + index:02X}:00.0",
                      **values)  # type: ignore[arg-type]


def readings(*gpus: GpuReading) -> SmiResult:
    return SmiResult(readings=NodeReadings(node="n1", source="nvidia-smi", observed_at=NOW, gpus=gpus))


def xid(code: int, bus: str = "0000:3b:00.0", seq: int = 1) -> KernelEvent:
    return KernelEvent(seq, seq, KIND_XID, bus, code, text="message")


def by_type(conds: tuple[Wanted, ...]) -> dict[str, tuple[str, str]]:
    return {w.type: (w.status, w.reason) for w in conds}


def run(smi: SmiResult, events: tuple[KernelEvent, ...] = (), expected: int | None = 2,
        inventory: dict[str, GpuReading] | None = None, timeouts: int = 0) -> dict[str, tuple[str, str]]:
    inv = update_inventory(inventory or {}, smi.readings)
    count = Expected(expected, "nvidia.com/gpu capacity" if expected else "no capacity")
    result = assess(Inputs("n1", smi, events, count, inv, timeouts), POLICY, PolicyMemory(), NOW)
    return by_type(result.conditions)


def test_all_healthy() -> None:
    assert run(readings(gpu(0), gpu(1))) == {
        c.GPU_HEALTHY: ("True", "NoGPUFault"), c.GPU_DRIVER_RESPONSIVE: ("True", "NvidiaSmiAnswered"),
        c.GPU_COUNT_MATCHES: ("True", "CountMatches"), c.GPU_FABRIC_HEALTHY: ("True", "NoFatalSXid")}


def test_kernel_xid_is_judged_by_the_shared_policy() -> None:
    entry = lookup(79, POLICY.xid.overrides, POLICY.xid.unknown_action)
    got = run(readings(gpu(0), gpu(1)), (xid(79),))
    assert got[c.GPU_HEALTHY] == ("False", c.reason_for_action(entry.action))


def test_the_same_findings_as_check_for_an_ecc_error() -> None:
    got = run(readings(gpu(0, ecc_dbe_volatile=2.0), gpu(1)))
    assert got[c.GPU_HEALTHY] == ("False", c.reason_for_action(POLICY.ecc.dbe_action))


def test_a_pending_row_remap_is_a_deferred_repair() -> None:
    got = run(readings(gpu(0, row_remap_pending=1.0), gpu(1)))
    assert got[c.GPU_HEALTHY] == ("False", c.reason_for_action(POLICY.row_remap.pending_action, urgent=False))


def test_xid_on_a_gpu_that_vanished_still_names_its_uuid_and_the_count_is_short() -> None:
    before = update_inventory({}, readings(gpu(0), gpu(1)).readings)
    smi = readings(gpu(1))
    inv = update_inventory(before, smi.readings)
    result = assess(Inputs("n1", smi, (xid(79, "0000:3b:00.0"),), Expected(2, "nvidia.com/gpu capacity"), inv),
                    POLICY, PolicyMemory(), NOW)
    conds = {w.type: w for w in result.conditions}
    assert conds[c.GPU_HEALTHY].status == "False"
    assert "GPU-0" in conds[c.GPU_HEALTHY].message
    assert (conds[c.GPU_COUNT_MATCHES].status, conds[c.GPU_COUNT_MATCHES].reason) == ("False", "GPUMissing")
    assert "GPU-0 at 0000:3b:00.0" in conds[c.GPU_COUNT_MATCHES].message
    assert "1 of 2" in conds[c.GPU_COUNT_MATCHES].message


def test_xid_on_a_device_never_listed_is_still_a_finding() -> None:
    got = run(readings(gpu(0)), (xid(79, "0000:99:00.0"),), expected=1)
    assert got[c.GPU_HEALTHY][0] == "False"


def test_one_timeout_is_not_yet_a_hang_two_are() -> None:
    timeout = SmiResult(error="nvidia-smi did not answer within 20 s", timed_out=True)
    assert run(timeout, timeouts=1)[c.GPU_DRIVER_RESPONSIVE] == ("Unknown", "NvidiaSmiUnusable")
    hung = run(timeout, timeouts=2)
    assert hung[c.GPU_DRIVER_RESPONSIVE] == ("False", "NvidiaSmiTimeout")
    assert hung[c.GPU_HEALTHY] == ("Unknown", "NoReadings")
    assert hung[c.GPU_COUNT_MATCHES] == ("Unknown", "NoReadings")


def test_a_hung_driver_still_reports_kernel_xids_on_known_gpus() -> None:
    inv = update_inventory({}, readings(gpu(0)).readings)
    timeout = SmiResult(error="did not answer", timed_out=True)
    got = run(timeout, (xid(79),), inventory=inv, timeouts=3)
    assert got[c.GPU_HEALTHY][0] == "False"
    assert got[c.GPU_DRIVER_RESPONSIVE] == ("False", "NvidiaSmiTimeout")


def test_driver_side_exit_codes_are_not_responsive_setup_errors_are_unknown() -> None:
    lost = SmiResult(error="nvidia-smi exited 15 (the GPU has fallen off the bus)", exit_code=15)
    assert run(lost)[c.GPU_DRIVER_RESPONSIVE] == ("False", "NvidiaSmiFailed")
    missing = SmiResult(error="nvidia-smi not found on PATH")
    assert run(missing)[c.GPU_DRIVER_RESPONSIVE] == ("Unknown", "NvidiaSmiUnusable")


def test_no_capacity_is_unknown_count() -> None:
    assert run(readings(gpu(0)), expected=None)[c.GPU_COUNT_MATCHES] == ("Unknown", "NoExpectedCount")


def kube_node(capacity: str | None = "8", **labels: str) -> dict[str, object]:
    status = {"capacity": {"nvidia.com/gpu": capacity}} if capacity is not None else {}
    return {"metadata": {"name": "n1", "labels": labels}, "status": status}


def test_expected_count_is_the_capacity_per_physical_gpu() -> None:
    plain = readings(gpu(0)).readings
    assert expected_gpus(kube_node("8"), plain, None) == Expected(8, "nvidia.com/gpu capacity")
    sliced = expected_gpus(kube_node("32", **{"nvidia.com/gpu.replicas": "4"}), plain, None)
    assert sliced.count == 8 and "time-slicing" in sliced.basis
    assert expected_gpus(kube_node("8"), plain, 4).count == 4  # --expected-gpus wins
    assert expected_gpus(kube_node(None), plain, None).count is None
    assert expected_gpus(kube_node("many"), plain, None).count is None
    assert expected_gpus(None, plain, None).count is None


def test_under_mig_only_the_physical_count_label_will_do() -> None:
    mig = readings(gpu(0, extra={"DCGM_FI_DEV_MIG_MODE": 1.0})).readings  # type: ignore[arg-type]
    assert expected_gpus(kube_node("7"), mig, None).count is None  # 7 MIG devices on one GPU: not a count
    labelled = expected_gpus(kube_node("7", **{"nvidia.com/gpu.count": "1"}), mig, None)
    assert labelled.count == 1 and "MIG" in labelled.basis


def test_fatal_sxid_fails_the_fabric_non_fatal_does_not() -> None:
    fatal = KernelEvent(5, 5, KIND_SXID, "0000:c7:00.0", 24007, True, "nvswitch3", "Link 47 ECC DBE")
    nonfatal = KernelEvent(6, 6, KIND_SXID, "0000:05:00.0", 12028, False, "nvswitch0", "Link 32")
    assert run(readings(gpu(0), gpu(1)), (nonfatal,))[c.GPU_FABRIC_HEALTHY] == ("True", "NoFatalSXid")
    assert run(readings(gpu(0), gpu(1)), (fatal, nonfatal))[c.GPU_FABRIC_HEALTHY] == ("False", "FatalSXid")
    assert run(readings(gpu(0), gpu(1)), (fatal,))[c.GPU_HEALTHY] == ("True", "NoGPUFault")  # not a GPU's fault


def test_the_controller_table_maps_every_agent_fault_back_to_an_action() -> None:
    """The seam: what the agent writes, the default condition table acts on."""
    entry = lookup(79, POLICY.xid.overrides, POLICY.xid.unknown_action)
    reason = run(readings(gpu(0), gpu(1)), (xid(79),))[c.GPU_HEALTHY][1]
    rule = next(r for r in c.DEFAULT_RULES if r.matches({"type": c.GPU_HEALTHY, "status": "False", "reason": reason}))
    assert rule.action == entry.action


def test_a_domain_tray_whose_fabric_has_not_started_is_unhealthy_only_with_its_clique_label() -> None:
    import dataclasses

    from gpuremediate.signals.fabric import CLIQUE_LABEL, STATE_NOT_STARTED
    from gpuremediate.signals.fabric_model import GpuFabric

    policy = dataclasses.replace(POLICY, fabric=dataclasses.replace(POLICY.fabric, not_started_grace_s=0))
    smi = readings(gpu(0, fabric=GpuFabric(state=STATE_NOT_STARTED)), gpu(1, fabric=GpuFabric(state=STATE_NOT_STARTED)))
    count = Expected(2, "nvidia.com/gpu capacity")
    inv = update_inventory({}, smi.readings)
    tray = assess(Inputs("n1", smi, (), count, inv, 0, {CLIQUE_LABEL: "c0ffee00-0000-4000-8000-000000000001.1"}),
                  policy, PolicyMemory(), NOW)
    assert {f.kind for f in tray.findings} == {"fabric-unhealthy"}
    assert by_type(tray.conditions)[c.GPU_HEALTHY][0] == "False"
    alone = assess(Inputs("n1", smi, (), count, inv, 0), policy, PolicyMemory(), NOW)  # no domain: nothing
    assert not alone.findings and by_type(alone.conditions)[c.GPU_HEALTHY] == ("True", "NoGPUFault")


def test_a_fall_off_the_bus_without_an_xid_is_judged_as_xid_79() -> None:
    # "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." (osHandleGpuLost) and nothing else in the log
    [fallen] = kmsg.events_of(kmsg.Record(1, 1, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."))
    entry = lookup(79, POLICY.xid.overrides, POLICY.xid.unknown_action)
    smi = readings(gpu(1))  # nvidia-smi no longer lists the GPU at 3b
    result = assess(Inputs("n1", smi, (fallen,), Expected(2, "nvidia.com/gpu capacity"),
                           update_inventory({}, smi.readings)), POLICY, PolicyMemory(), NOW)
    [finding] = [f for f in result.findings if f.code == "79"]
    assert finding.action == entry.action and "0000:3b:00.0" in finding.gpus[0]
    assert by_type(result.conditions)[c.GPU_HEALTHY] == ("False", c.reason_for_action(entry.action))


def test_the_xid_79_and_its_fallen_line_count_once_in_the_window() -> None:
    fallen = KernelEvent(2, 2, KIND_XID, "0000:3b:00.0", 79, device=kmsg.NO_XID_LINE, text="GPU has fallen off")
    result = assess(Inputs("n1", readings(gpu(0), gpu(1)), (xid(79), fallen), Expected(2, "capacity"), {}),
                    POLICY, PolicyMemory(), NOW)
    [finding] = [f for f in result.findings if f.code == "79"]
    assert "1 time(s)" in finding.message


def test_a_mig_attributed_xid_counts_for_its_physical_gpu() -> None:
    [event] = kmsg.events_of(kmsg.Record(1, 1, "NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=7, name=python3, "
                                               "Contained: SM (0x1). RST: No, D-RST: No"))
    result = assess(Inputs("n1", readings(gpu(0), gpu(1)), (event,), Expected(2, "capacity"), {}),
                    POLICY, PolicyMemory(), NOW)
    [finding] = [f for f in result.findings if f.code == "94"]
    assert finding.gpus == (gpu(0).key,)


def test_the_agent_judges_nvidia_smis_recovery_action_as_the_controller_judges_field_1523() -> None:
    # a --query-gpu row as nvidia-smi 590 writes it, "GPU Recovery Action" set to "Reset"
    row = {"index": "0", "uuid": "GPU-0", "pci.bus_id": "00000000:3B:00.0", "gpu_recovery_action": "Reset"}
    smi = SmiResult(readings=nvidiasmi.node_readings("n1", [row], {}, NOW))
    got = run(smi, expected=1)
    assert got[c.GPU_HEALTHY] == ("False", c.reason_for_action(POLICY.recovery_action.gpu_reset_action))
    row["gpu_recovery_action"] = "None"
    healthy = run(SmiResult(readings=nvidiasmi.node_readings("n1", [row], {}, NOW)), expected=1)
    assert healthy[c.GPU_HEALTHY][0] == "True"
