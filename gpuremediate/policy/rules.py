"""The rules: one physical GPU's readings (+ its thermal timer) → findings. Pure functions.

A GPU may have several readings (one per MIG instance); they share the physical GPU's key and are
merged: any XID or count any instance shows, the largest counter and temperature values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuremediate.policy.config import Policy, ThermalPolicy
from gpuremediate.policy.xid import lookup
from gpuremediate.signals.model import (
    GpuReading,
    LostGpu,
    plausible_count,
    plausible_flag,
    plausible_temp,
    plausible_xid,
)
from gpuremediate.vocab.findings import (
    ACTION_CORDON,
    KIND_ECC_DBE,
    KIND_GPU_LOST,
    KIND_ROW_REMAP_FAILURE,
    KIND_ROW_REMAP_PENDING,
    KIND_THERMAL,
    KIND_UNCORRECTABLE_ROWS,
    KIND_XID,
    Finding,
)

XID_FALLEN_OFF_THE_BUS = 79  # what a lost GPU is: its action (and any override of it) applies

# Every source's values pass the signal model's one notion of a reading again here (the exporter path
# already applied it; nvidia-smi and hand-built readings may not have): missing is never a fault.
usable_count = plausible_count
usable_flag = plausible_flag
usable_temp = plausible_temp


def _largest(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


@dataclass(frozen=True)
class GpuView:
    """One physical GPU's readings, merged over its MIG instances, placeholders dropped."""

    node: str
    key: str
    xids: frozenset[int]
    xid_counts: Mapping[int, float]
    xid_messages: Mapping[int, tuple[str, ...]]
    ecc_dbe_volatile: float | None
    row_remap_failure: float | None
    row_remap_pending: float | None
    uncorrectable_remapped_rows: float | None
    gpu_temp: float | None
    memory_temp: float | None


def merge_readings(node: str, key: str, readings: Sequence[GpuReading]) -> GpuView:
    if len(readings) == 1:  # a whole GPU (no MIG instances): nothing to merge
        return _one_reading(node, key, readings[0])
    return merge_many(node, key, readings)


def merge_many(node: str, key: str, readings: Sequence[GpuReading]) -> GpuView:
    counts: dict[int, float] = {}
    for reading in readings:
        for code, count in reading.xid_counts.items():
            usable = usable_count(count)
            if usable is not None and plausible_xid(code) is not None:
                counts[code] = max(counts.get(code, 0.0), usable)
    xids = {xid for r in readings if (xid := plausible_xid(r.xid)) is not None}
    messages: dict[int, tuple[str, ...]] = {}
    for reading in readings:
        for code, texts in reading.xid_messages.items():
            messages[code] = (*messages.get(code, ()), *(t for t in texts if t not in messages.get(code, ())))
    return GpuView(
        node=node,
        key=key,
        xids=frozenset(xids),
        xid_counts=counts,
        xid_messages=messages,
        ecc_dbe_volatile=_largest(usable_count(r.ecc_dbe_volatile) for r in readings),
        row_remap_failure=_largest(usable_flag(r.row_remap_failure) for r in readings),
        row_remap_pending=_largest(usable_flag(r.row_remap_pending) for r in readings),
        uncorrectable_remapped_rows=_largest(usable_count(r.uncorrectable_remapped_rows) for r in readings),
        gpu_temp=_largest(usable_temp(r.gpu_temp) for r in readings),
        memory_temp=_largest(usable_temp(r.memory_temp) for r in readings),
    )


def _one_reading(node: str, key: str, reading: GpuReading) -> GpuView:
    """merge_readings of one reading (the fleet's common case, on the hot path), without the merging."""
    counts = {code: max(0.0, usable) for code, count in reading.xid_counts.items()
              if (usable := usable_count(count)) is not None and plausible_xid(code) is not None}
    xid = plausible_xid(reading.xid)
    messages = {code: tuple(texts) for code, texts in reading.xid_messages.items()}
    return GpuView(
        node=node, key=key, xids=frozenset(() if xid is None else (xid,)), xid_counts=counts, xid_messages=messages,
        ecc_dbe_volatile=usable_count(reading.ecc_dbe_volatile),
        row_remap_failure=usable_flag(reading.row_remap_failure),
        row_remap_pending=usable_flag(reading.row_remap_pending),
        uncorrectable_remapped_rows=usable_count(reading.uncorrectable_remapped_rows),
        gpu_temp=usable_temp(reading.gpu_temp), memory_temp=usable_temp(reading.memory_temp),
    )


# --- XID, ECC, row remap ---------------------------------------------------------------------------


def _xid_finding(gpu: GpuView, code: int, policy: Policy, fingerprint: str, seen: str) -> Finding:
    entry = lookup(code, policy.xid.overrides, policy.xid.unknown_action, gpu.xid_messages.get(code, ()))
    message = f"GPU {gpu.key} {seen} XID {code} ({entry.mnemonic}): {entry.reason}"
    return Finding(gpu.node, KIND_XID, str(code), (gpu.key,), entry.action, fingerprint, message)


def xid_findings(gpu: GpuView, policy: Policy) -> list[Finding]:
    if not policy.xid.enabled:
        return []
    found = [_xid_finding(gpu, code, policy, f"xid:{gpu.key}:{code}", "last reported") for code in sorted(gpu.xids)]
    for code in sorted(gpu.xid_counts):
        if gpu.xid_counts[code] > 0:
            seen = f"reported {_number(gpu.xid_counts[code])} time(s) recently:"
            found.append(_xid_finding(gpu, code, policy, f"xidcount:{gpu.key}:{code}", seen))
    return found


def lost_gpu_findings(node: str, lost: Sequence[LostGpu], policy: Policy) -> list[Finding]:
    """A GPU the driver reports lost is what XID 79 reports (fallen off the bus): XID 79's action."""
    entry = lookup(XID_FALLEN_OFF_THE_BUS, policy.xid.overrides, policy.xid.unknown_action)
    found = []
    for gpu in lost:
        key = f"{node}/pci{gpu.pci_bus_id}" if gpu.pci_bus_id else f"{node}/gpu?"
        where = f"at PCI {gpu.pci_bus_id}" if gpu.pci_bus_id else "(not named)"
        message = f"GPU {where} is lost: {gpu.reason} (as XID {XID_FALLEN_OFF_THE_BUS}: {entry.action})."
        found.append(Finding(node, KIND_GPU_LOST, gpu.pci_bus_id, (key,), entry.action, f"gpu-lost:{key}", message))
    return found


def ecc_findings(gpu: GpuView, policy: Policy) -> list[Finding]:
    value, ecc = gpu.ecc_dbe_volatile, policy.ecc
    if not ecc.enabled or value is None or value < ecc.dbe_min:
        return []
    count = _number(value)
    message = f"GPU {gpu.key} has {count} volatile double-bit ECC error(s), uncorrectable ({ecc.dbe_action})."
    return [Finding(gpu.node, KIND_ECC_DBE, "ecc_dbe_volatile", (gpu.key,), ecc.dbe_action,
                    f"ecc-dbe:{gpu.key}:{count}", message)]


def row_remap_findings(gpu: GpuView, policy: Policy) -> list[Finding]:
    rules = policy.row_remap
    if not rules.enabled:
        return []
    found: list[Finding] = []
    if gpu.row_remap_failure is not None and gpu.row_remap_failure > 0:
        message = f"GPU {gpu.key} failed to remap a memory row: NVIDIA's RMA signal ({rules.failure_action})."
        found.append(Finding(gpu.node, KIND_ROW_REMAP_FAILURE, "row_remap_failure", (gpu.key,), rules.failure_action,
                             f"row-remap-failure:{gpu.key}", message))
    if gpu.row_remap_pending is not None and gpu.row_remap_pending > 0:
        message = f"GPU {gpu.key} has a row remap pending: a GPU reset applies it ({rules.pending_action})."
        found.append(Finding(gpu.node, KIND_ROW_REMAP_PENDING, "row_remap_pending", (gpu.key,), rules.pending_action,
                             f"row-remap-pending:{gpu.key}", message, urgent=rules.pending_urgent))
    rows = gpu.uncorrectable_remapped_rows
    if rules.uncorrectable_rows_min > 0 and rows is not None and rows >= rules.uncorrectable_rows_min:
        message = (f"GPU {gpu.key} has {_number(rows)} rows remapped for uncorrectable errors "
                   f"(limit {rules.uncorrectable_rows_min}) ({rules.uncorrectable_rows_action}).")
        found.append(Finding(gpu.node, KIND_UNCORRECTABLE_ROWS, "uncorrectable_remapped_rows", (gpu.key,),
                             rules.uncorrectable_rows_action, f"uncorrectable-rows:{gpu.key}:{_number(rows)}", message))
    return found


# --- thermal hysteresis ----------------------------------------------------------------------------

_TIMER_FIELDS = ("hot_since", "cool_since", "cordoned_since")


@dataclass(frozen=True)
class ThermalTimer:
    """One GPU's thermal state. ``cordoned_since`` set: the GPU is thermally cordoned."""

    hot_since: float | None = None  # first reading of the current uninterrupted hot run
    cool_since: float | None = None  # while cordoned: first reading of the current cool run
    cordoned_since: float | None = None
    cause: str = ""  # which reading crossed its threshold when the cordon began

    @property
    def idle(self) -> bool:
        return self == ThermalTimer()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {name: getattr(self, name) for name in _TIMER_FIELDS}
        data["cause"] = self.cause
        return data

    @classmethod
    def from_dict(cls, data: Any, path: str) -> ThermalTimer:
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: expected an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {*_TIMER_FIELDS, "cause"})
        if unknown:
            raise ValueError(f"{path}.{unknown[0]}: unknown key")
        times = {name: _time_or_none(data.get(name), f"{path}.{name}") for name in _TIMER_FIELDS}
        cause = data.get("cause", "")
        if not isinstance(cause, str):
            raise ValueError(f"{path}.cause: expected a string, got {type(cause).__name__}")
        return cls(**times, cause=cause)


def _time_or_none(value: Any, path: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{path}: expected a finite number or null, got {value!r}")
    return float(value)


def _hot_causes(gpu: GpuView, rules: ThermalPolicy) -> list[str]:
    causes = []
    if gpu.gpu_temp is not None and gpu.gpu_temp >= rules.gpu_cordon_c:
        causes.append("gpu_temp")
    if gpu.memory_temp is not None and gpu.memory_temp >= rules.memory_cordon_c:
        causes.append("memory_temp")
    return causes


def _cool(gpu: GpuView, rules: ThermalPolicy, cause: str) -> bool | None:
    """While cordoned: True when the readings show the GPU cool, False when one is above its clear
    threshold, None when a reading the cordon began with is missing (missing changes nothing: a GPU
    whose temperature cannot be read is not cool)."""
    watched = (("gpu_temp", gpu.gpu_temp, rules.gpu_clear_c), ("memory_temp", gpu.memory_temp, rules.memory_clear_c))
    if any(value is not None and value > clear for _, value, clear in watched):
        return False
    causes = set(cause.split(",")) if cause else set()
    if any(value is None and name in causes for name, value, _ in watched):
        return None
    return True


def thermal_step(timer: ThermalTimer, gpu: GpuView, rules: ThermalPolicy, now: float) -> ThermalTimer:
    """Advance one GPU's timer by one observation. Missing temperatures change nothing."""
    if gpu.gpu_temp is None and gpu.memory_temp is None:
        return timer
    if timer.cordoned_since is None:
        causes = _hot_causes(gpu, rules)
        if not causes:
            return replace(timer, hot_since=None)
        hot_since = now if timer.hot_since is None else timer.hot_since
        if now - hot_since >= rules.hold_s:
            return ThermalTimer(cordoned_since=now, cause=",".join(causes))
        return replace(timer, hot_since=hot_since)
    cool = _cool(gpu, rules, timer.cause)
    if cool is None:
        return timer
    if not cool:
        return replace(timer, cool_since=None)
    cool_since = now if timer.cool_since is None else timer.cool_since
    if now - cool_since >= rules.clear_hold_s:
        return ThermalTimer()
    return replace(timer, cool_since=cool_since)


def _temps(gpu: GpuView | None) -> str:
    if gpu is None:
        return "no temperature reading now"
    shown = [f"{name} {_number(value)} C" for name, value in (("GPU", gpu.gpu_temp), ("memory", gpu.memory_temp))
             if value is not None]
    return ", ".join(shown) or "no temperature reading now"


def thermal_finding(node: str, key: str, timer: ThermalTimer, gpu: GpuView | None, rules: ThermalPolicy) -> Finding:
    assert timer.cordoned_since is not None
    message = (f"GPU {key} ran hot ({timer.cause}) for {_number(rules.hold_s)} s; cordoned until it stays cool "
               f"for {_number(rules.clear_hold_s)} s ({_temps(gpu)}).")
    return Finding(node, KIND_THERMAL, timer.cause, (key,), ACTION_CORDON,
                   f"thermal:{key}:{timer.cordoned_since:.3f}", message)
