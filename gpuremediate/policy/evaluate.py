"""readings → findings, for one node: the pure entry point of the policy layer.

``evaluate`` is deterministic: the same readings, policy, memory and ``now`` give the same result.
Fingerprints identify a fault occurrence; the controller, not this module, remembers which ones it
has handled (on the node record). ``PolicyMemory`` is what the rules themselves must remember
between cycles (the thermal timers); the node record persists it via ``to_dict``/``from_dict``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuremediate.policy.config import Policy
from gpuremediate.policy.fabric import fabric_findings, step_timers
from gpuremediate.policy.recovery_action import recovery_action_findings
from gpuremediate.policy.rules import (
    GpuView,
    ThermalTimer,
    ecc_findings,
    lost_gpu_findings,
    merge_readings,
    row_remap_findings,
    thermal_finding,
    thermal_step,
    xid_findings,
)
from gpuremediate.signals.fabric_model import GpuFabric
from gpuremediate.signals.model import SOURCE_UNKNOWN, GpuReading, NodeReadings
from gpuremediate.vocab.findings import (
    Finding,
    by_severity,
)

MEMORY_VERSION = 1

class PolicyMemoryError(ValueError):
    """A stored PolicyMemory document that is not valid; the message names the path."""


@dataclass(frozen=True)
class PolicyMemory:
    """What the rules remember between cycles: per-GPU thermal timers (idle timers are dropped)."""

    thermal: Mapping[str, ThermalTimer] = field(default_factory=lambda: MappingProxyType({}))
    fabric: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # "<kind>:<gpu>" → since

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"v": MEMORY_VERSION,
                                "thermal": {key: timer.to_dict() for key, timer in sorted(self.thermal.items())}}
        if self.fabric:
            data["fabric"] = dict(sorted(self.fabric.items()))
        return data

    @classmethod
    def from_dict(cls, data: Any) -> PolicyMemory:
        if not isinstance(data, Mapping):
            raise PolicyMemoryError(f"memory: expected an object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"v", "thermal", "fabric"})
        if unknown:
            raise PolicyMemoryError(f"memory.{unknown[0]}: unknown key")
        if data.get("v") != MEMORY_VERSION:
            raise PolicyMemoryError(f"memory.v: expected {MEMORY_VERSION}, got {data.get('v')!r}")
        thermal = data.get("thermal", {})
        if not isinstance(thermal, Mapping):
            raise PolicyMemoryError(f"memory.thermal: expected an object, got {type(thermal).__name__}")
        try:
            timers = {str(key): ThermalTimer.from_dict(raw, f"memory.thermal[{key!r}]") for key, raw in thermal.items()}
        except ValueError as exc:
            raise PolicyMemoryError(str(exc)) from None
        return memory_of(timers, _fabric_timers(data.get("fabric", {})))


def _fabric_timers(raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in raw.values()):
        raise PolicyMemoryError("memory.fabric: expected an object of finite numbers (since when)")
    return {str(key): float(value) for key, value in raw.items()}


def memory_of(timers: Mapping[str, ThermalTimer], fabric: Mapping[str, float] | None = None) -> PolicyMemory:
    kept = {key: timers[key] for key in sorted(timers) if not timers[key].idle}
    return PolicyMemory(thermal=MappingProxyType(kept), fabric=MappingProxyType(dict(sorted((fabric or {}).items()))))


@dataclass(frozen=True)
class Evaluation:
    findings: list[Finding]  # worst first
    memory: PolicyMemory


def _by_gpu(readings: NodeReadings) -> dict[str, GpuView]:
    grouped: dict[str, list[GpuReading]] = {}
    for reading in readings.gpus:
        grouped.setdefault(reading.key, []).append(reading)
    return {key: merge_readings(readings.node, key, grouped[key]) for key in sorted(grouped)}


def _thermal(
    node: str, gpus: Mapping[str, GpuView], policy: Policy, memory: PolicyMemory, now: float
) -> tuple[list[Finding], PolicyMemory]:
    rules = policy.thermal
    if not rules.enabled:
        return [], PolicyMemory()
    timers = dict(memory.thermal)  # GPUs without readings keep their timers: missing changes nothing
    for key, gpu in gpus.items():
        timers[key] = thermal_step(timers.get(key, ThermalTimer()), gpu, rules, now)
    found = [thermal_finding(node, key, timer, gpus.get(key), rules)
             for key, timer in sorted(timers.items()) if timer.cordoned_since is not None]
    return found, memory_of(timers)


def _fabric(
    readings: NodeReadings, policy: Policy, memory: PolicyMemory, labels: Mapping[str, str], now: float,
) -> tuple[list[Finding], dict[str, float]]:
    if not policy.fabric.enabled:
        return [], {}
    fabrics: dict[str, GpuFabric | None] = {}
    for reading in readings.gpus:  # a MIG instance's series repeat its GPU's: the first reading that has one
        fabrics[reading.key] = fabrics.get(reading.key) or reading.fabric
    timers = step_timers(fabrics, labels, policy.fabric, memory.fabric, now)
    return fabric_findings(readings.node, fabrics, policy.fabric, timers, now), timers


def evaluate(
    readings: NodeReadings, policy: Policy, memory: PolicyMemory, now: float, labels: Mapping[str, str] | None = None,
) -> Evaluation:
    """One node's readings → its findings (worst first) and the new memory; ``labels`` (the Node's) place it in
    its NVLink domain (``[fabric] domain_label``).

    Unknown readings (exporter unreachable, stale) are not unhealthy: no findings, memory unchanged.
    """
    if not math.isfinite(now):
        raise ValueError(f"now must be a finite unix time, got {now!r}")
    if readings.status == SOURCE_UNKNOWN:
        return Evaluation(findings=[], memory=memory)
    now = float(now)
    gpus = _by_gpu(readings)
    findings: dict[str, Finding] = {}
    for gpu in gpus.values():
        for finding in (*xid_findings(gpu, policy), *ecc_findings(gpu, policy), *row_remap_findings(gpu, policy)):
            findings.setdefault(finding.fingerprint, finding)
    for finding in (*lost_gpu_findings(readings.node, readings.lost_gpus, policy),
                    *recovery_action_findings(readings.node, readings.gpus, policy.recovery_action)):
        findings.setdefault(finding.fingerprint, finding)
    thermal_found, new_memory = _thermal(readings.node, gpus, policy, memory, now)
    fabric_found, fabric_timers = _fabric(readings, policy, memory, labels or {}, now)
    new_memory = memory_of(new_memory.thermal, fabric_timers)
    return Evaluation(findings=by_severity([*findings.values(), *thermal_found, *fabric_found]), memory=new_memory)
