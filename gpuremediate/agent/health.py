"""The agent's health model: nvidia-smi readings + kernel-log events → findings → NodeConditions.

One model with ``gpuremediate check``: the readings come from the same NvidiaSmiSource, the kernel
XIDs are folded in by the same ``with_kernel_xids`` and the findings come from the same
``policy.evaluate``. What the agent adds needs time or the cluster: a timeout of nvidia-smi (the
driver is hung), the GPU count against the node's ``nvidia.com/gpu`` capacity, NVSwitch SXids, and
a window over kernel events (an XID counts for ``window_s`` after it was logged, as the exporter's
XID count does; every occurrence is counted in the metrics).

The conditions are positive (True = healthy, like Ready): a node without the agent has none, which is
never a fault. GPUHealthy's reason names the action the policy chose for the worst finding
(``policy.conditions.reason_for_action``), so the controller's condition table maps it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.agent.kmsg import KIND_SXID, KIND_XID, KernelEvent, kernel_xid
from gpuremediate.policy.conditions import (
    GPU_COUNT_MATCHES,
    GPU_DRIVER_RESPONSIVE,
    GPU_FABRIC_HEALTHY,
    GPU_HEALTHY,
    reason_for_action,
)
from gpuremediate.policy.config import Policy
from gpuremediate.policy.evaluate import PolicyMemory, evaluate
from gpuremediate.signals.kernellog import KernelLog, once_per_fall, with_kernel_xids
from gpuremediate.signals.model import GpuReading, NodeReadings
from gpuremediate.signals.nvidiasmi import normalise_bus_id
from gpuremediate.vocab.findings import ACTION_NONE, Finding

GPU_RESOURCE = "nvidia.com/gpu"
GFD_COUNT_LABEL = "nvidia.com/gpu.count"  # GPU feature discovery: the physical GPUs
GFD_REPLICAS_LABEL = "nvidia.com/gpu.replicas"  # GPU feature discovery: time-slicing replicas per GPU
MIG_MODE_FIELD = "DCGM_FI_DEV_MIG_MODE"  # nvidia-smi's mig.mode.current, as signals.nvidiasmi names it
MESSAGE_LIMIT = 1024  # a condition message is for people; the full list is in the agent's log and metrics
# nvidia-smi exit codes that are the driver's or the GPU's failure (nvidia-smi(1)), not the agent's setup.
DRIVER_EXIT_CODES = frozenset({9, 10, 12, 14, 15, 18})


@dataclass(frozen=True)
class SmiResult:
    """One nvidia-smi run: the readings, or why there are none."""

    readings: NodeReadings | None = None
    error: str = ""
    timed_out: bool = False
    exit_code: int | None = None


@dataclass(frozen=True)
class Wanted:
    """A condition as the agent wants it (times are added when it is written)."""

    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Assessment:
    conditions: tuple[Wanted, ...]
    findings: tuple[Finding, ...] = ()
    memory: PolicyMemory = field(default_factory=PolicyMemory)
    notes: tuple[str, ...] = ()


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def identity_only(gpu: GpuReading) -> GpuReading:
    """A GPU as an inventory entry: who it is, no values (an old value is not a reading)."""
    return GpuReading(node=gpu.node, gpu=gpu.gpu, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id, model=gpu.model)


def update_inventory(inventory: Mapping[str, GpuReading], readings: NodeReadings | None) -> dict[str, GpuReading]:
    """Every GPU seen since the agent started, by bus id: an XID on a GPU that fell off the bus still
    names its UUID."""
    known = dict(inventory)
    for gpu in readings.gpus if readings is not None else ():
        known[normalise_bus_id(gpu.pci_bus_id or gpu.key)] = identity_only(gpu)
    return known


def _with_vanished(node: str, readings: NodeReadings | None, inventory: Mapping[str, GpuReading],
                   events: Sequence[KernelEvent]) -> NodeReadings:
    """The readings plus, as identity only, inventory GPUs they lack and devices only the kernel log names."""
    gpus = list(readings.gpus) if readings is not None else []
    listed = {normalise_bus_id(g.pci_bus_id or g.key) for g in gpus}
    for bus, gpu in sorted(inventory.items()):
        if bus not in listed:
            gpus.append(gpu)
            listed.add(bus)
    for event in events:
        if event.bus_id not in listed:
            gpus.append(GpuReading(node=node, gpu=event.bus_id, pci_bus_id=event.bus_id))
            listed.add(event.bus_id)
    base = readings or NodeReadings(node=node, source="agent")
    return dataclasses.replace(base, gpus=tuple(gpus))


def gpu_findings(
    node: str, smi: SmiResult, inventory: Mapping[str, GpuReading], events: Sequence[KernelEvent],
    policy: Policy, memory: PolicyMemory, now: float, labels: Mapping[str, str] | None = None,
) -> tuple[list[Finding], PolicyMemory]:
    """The policy's findings over what nvidia-smi read (if it could) and the XIDs in the window."""
    xids = [e for e in events if e.kind == KIND_XID]
    if smi.readings is None and not inventory and not xids:
        return [], memory
    readings = _with_vanished(node, smi.readings, inventory, xids)
    log = KernelLog(tuple(once_per_fall(kernel_xid(e) for e in xids)), source="/dev/kmsg")
    readings, _ = with_kernel_xids(readings, log)
    result = evaluate(readings, policy, memory, now, labels)
    return list(result.findings), result.memory


def healthy_condition(smi: SmiResult, findings: Sequence[Finding]) -> Wanted:
    actionable = [f for f in findings if f.action != ACTION_NONE]
    if actionable:
        worst = actionable[0]  # findings come worst first
        return Wanted(GPU_HEALTHY, "False", reason_for_action(worst.action, worst.urgent),
                      _clip("; ".join(f.message for f in actionable)))
    if smi.readings is None:
        return Wanted(GPU_HEALTHY, "Unknown", "NoReadings", _clip(f"nvidia-smi gave no readings: {smi.error}"))
    return Wanted(GPU_HEALTHY, "True", "NoGPUFault", f"{len(smi.readings.gpus)} GPU(s) without a fault")


def driver_condition(smi: SmiResult, timeouts_in_a_row: int, hang_after: int) -> Wanted:
    if smi.readings is not None:
        return Wanted(GPU_DRIVER_RESPONSIVE, "True", "NvidiaSmiAnswered", "nvidia-smi answered")
    if smi.timed_out and timeouts_in_a_row >= hang_after:
        return Wanted(GPU_DRIVER_RESPONSIVE, "False", "NvidiaSmiTimeout",
                      _clip(f"nvidia-smi did not answer {timeouts_in_a_row} time(s) in a row: the driver is hung "
                            f"({smi.error})"))
    if smi.exit_code in DRIVER_EXIT_CODES:
        return Wanted(GPU_DRIVER_RESPONSIVE, "False", "NvidiaSmiFailed", _clip(smi.error))
    why = "nvidia-smi timed out once (not yet a hang)" if smi.timed_out else "nvidia-smi could not be used"
    return Wanted(GPU_DRIVER_RESPONSIVE, "Unknown", "NvidiaSmiUnusable", _clip(f"{why}: {smi.error}"))


def physical_gpus(readings: NodeReadings) -> int:
    return len({g.key for g in readings.gpus})


@dataclass(frozen=True)
class Expected:
    """How many GPUs the driver should report, and where that number comes from (in words)."""

    count: int | None
    basis: str


def _count(value: Any) -> int | None:
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if number > 0 else None


def expected_gpus(node: Mapping[str, Any] | None, readings: NodeReadings | None, explicit: int | None) -> Expected:
    """``--expected-gpus``, else the node's ``nvidia.com/gpu`` capacity — per physical GPU: divided by GPU
    feature discovery's replicas label under time-slicing; under MIG the capacity counts MIG devices, so
    only GFD's physical count label will do (else unknown: a wrong count would reboot a healthy node)."""
    if explicit:
        return Expected(explicit, "--expected-gpus")
    if node is None:
        return Expected(None, "the node could not be read")
    labels = (node.get("metadata") or {}).get("labels") or {}
    capacity = _count(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE))
    if readings is not None and any(g.extra.get(MIG_MODE_FIELD) == 1.0 for g in readings.gpus):
        physical = _count(labels.get(GFD_COUNT_LABEL))
        if physical is None:
            return Expected(None, f"MIG mode is on, so the {GPU_RESOURCE} capacity counts MIG devices and there is "
                                  f"no {GFD_COUNT_LABEL} label; set --expected-gpus")
        return Expected(physical, f"the {GFD_COUNT_LABEL} label (MIG mode)")
    if capacity is None:
        return Expected(None, f"the node has no {GPU_RESOURCE} capacity and there is no --expected-gpus")
    replicas = _count(labels.get(GFD_REPLICAS_LABEL)) or 1
    if replicas > 1:
        return Expected(capacity // replicas, f"{GPU_RESOURCE} capacity {capacity} / {replicas} time-slicing replicas")
    return Expected(capacity, f"{GPU_RESOURCE} capacity")


def count_condition(smi: SmiResult, expected: Expected, inventory: Mapping[str, GpuReading]) -> Wanted:
    if smi.readings is None:
        return Wanted(GPU_COUNT_MATCHES, "Unknown", "NoReadings", "nvidia-smi gave no readings")
    if not expected.count:
        return Wanted(GPU_COUNT_MATCHES, "Unknown", "NoExpectedCount", _clip(expected.basis))
    reported, wanted = physical_gpus(smi.readings), expected.count
    if reported >= wanted:
        return Wanted(GPU_COUNT_MATCHES, "True", "CountMatches", f"the driver reports {reported} of {wanted} GPUs")
    listed = {normalise_bus_id(g.pci_bus_id or g.key) for g in smi.readings.gpus}
    missing = [f"{g.uuid or '?'} at {bus}" for bus, g in sorted(inventory.items()) if bus not in listed]
    which = f"; missing since the agent started: {', '.join(missing)}" if missing else ""
    return Wanted(GPU_COUNT_MATCHES, "False", "GPUMissing",
                  _clip(f"the driver reports {reported} of {wanted} GPUs ({expected.basis}){which}"))


def fabric_condition(events: Iterable[KernelEvent]) -> Wanted:
    fatal = [e for e in events if e.kind == KIND_SXID and e.fatal]
    if not fatal:
        return Wanted(GPU_FABRIC_HEALTHY, "True", "NoFatalSXid", "no fatal NVSwitch SXid in the window")
    seen = sorted({f"SXid {e.code} on {e.device or e.bus_id}" for e in fatal})
    return Wanted(GPU_FABRIC_HEALTHY, "False", "FatalSXid",
                  _clip(f"fatal NVSwitch error(s): {', '.join(seen)} ({fatal[-1].text})"))


@dataclass(frozen=True)
class Inputs:
    node: str
    smi: SmiResult
    events: tuple[KernelEvent, ...]  # the kernel events inside the window
    expected: Expected
    inventory: Mapping[str, GpuReading]
    timeouts_in_a_row: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)  # the Node's: its NVLink domain ([fabric] domain_label)


def assess(inputs: Inputs, policy: Policy, memory: PolicyMemory, now: float, hang_after: int = 2) -> Assessment:
    findings, new_memory = gpu_findings(inputs.node, inputs.smi, inputs.inventory, inputs.events, policy, memory, now,
                                        inputs.labels)
    conditions = (
        healthy_condition(inputs.smi, findings),
        driver_condition(inputs.smi, inputs.timeouts_in_a_row, hang_after),
        count_condition(inputs.smi, inputs.expected, inputs.inventory),
        fabric_condition(inputs.events),
    )
    return Assessment(conditions, tuple(findings), new_memory)
