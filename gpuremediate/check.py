"""``gpuremediate check``: this machine's GPUs through nvidia-smi (and the kernel log), judged by the
same policy the controller uses.

Exit codes: 0 healthy, 1 degraded (thermal, or a repair that may wait), 2 needs repair,
3 could not check (no nvidia-smi, driver not loaded, GPU lost, bad policy file, ...).
A snapshot has no history, so the thermal hold time is not applied: hot now counts as hot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from gpuremediate.policy.config import Policy, PolicyError, default_policy, load_policy
from gpuremediate.policy.evaluate import PolicyMemory, evaluate
from gpuremediate.policy.findings import ACTION_NONE, Finding
from gpuremediate.signals.kernellog import KernelLog, read_kernel_log, with_kernel_xids
from gpuremediate.signals.model import GpuReading, NodeReadings
from gpuremediate.signals.nvidiasmi import NvidiaSmiError, NvidiaSmiSource

EXIT_HEALTHY = 0
EXIT_DEGRADED = 1
EXIT_NEEDS_REPAIR = 2
EXIT_CANNOT_CHECK = 3
VERDICTS = {
    EXIT_HEALTHY: "healthy",
    EXIT_DEGRADED: "degraded",
    EXIT_NEEDS_REPAIR: "needs repair",
    EXIT_CANNOT_CHECK: "could not check",
}


# ---------------------------------------------------------------- verdict


def snapshot_policy(policy: Policy) -> Policy:
    """A one-shot check cannot wait out the thermal hold: hot now is reported now."""
    return dataclasses.replace(policy, thermal=dataclasses.replace(policy.thermal, hold_s=0.0))


def exit_code_for(findings: Sequence[Finding]) -> int:
    if any(f.needs_repair and f.urgent for f in findings):
        return EXIT_NEEDS_REPAIR
    if any(f.action != ACTION_NONE for f in findings):
        return EXIT_DEGRADED  # cordon (thermal) or a repair that may wait for a window
    return EXIT_HEALTHY


@dataclass
class Report:
    exit_code: int
    node: str = ""
    readings: NodeReadings | None = None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reason: str = ""  # why the check could not be made
    detail: str = ""  # nvidia-smi's own message


def run_check(
    source: NvidiaSmiSource,
    policy: Policy,
    kernel_log: str = "auto",
    read_log: Callable[[], KernelLog] = read_kernel_log,
    now: float | None = None,
) -> Report:
    try:
        readings = source.read_node()
    except NvidiaSmiError as e:
        return Report(EXIT_CANNOT_CHECK, node=source.node, reason=e.reason, detail=e.output)
    if not readings.gpus:
        return Report(EXIT_CANNOT_CHECK, node=readings.node, readings=readings, reason="nvidia-smi listed no GPUs")
    notes: list[str] = []
    if kernel_log != "no":
        log = read_log()
        if not log.read:
            if kernel_log == "yes":
                return Report(EXIT_CANNOT_CHECK, node=readings.node, readings=readings, reason=log.note)
            notes.append(log.note + " (XIDs not checked; run as root or pass --kernel-log no)")
        else:
            readings, unmatched = with_kernel_xids(readings, log)
            notes += unmatched
            notes.append(f"kernel log read from {log.source}: {len(log.xids)} XID line(s)")
    evaluation = evaluate(readings, snapshot_policy(policy), PolicyMemory(), time.time() if now is None else now)
    findings = list(evaluation.findings)
    return Report(exit_code_for(findings), node=readings.node, readings=readings, findings=findings, notes=notes)


# ---------------------------------------------------------------- output


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = str(int(value)) if value == int(value) else f"{value:g}"
    return text + unit


def _yes_no(value: float | None) -> str:
    return "-" if value is None else ("yes" if value > 0 else "no")


def _xids(g: GpuReading) -> str:
    return ",".join(f"{code}x{_num(n)}" for code, n in sorted(g.xid_counts.items())) or "-"


def gpu_rows(readings: NodeReadings) -> list[list[str]]:
    header = ["GPU", "PCI", "MODEL", "TEMP", "MEM", "DBE", "REMAP PEND", "REMAP FAIL", "UNCORR ROWS", "XID(24h)"]
    rows = [header]
    for g in readings.gpus:
        rows.append([
            g.gpu, g.pci_bus_id or "-", g.model or "-", _num(g.gpu_temp, " C"), _num(g.memory_temp, " C"),
            _num(g.ecc_dbe_volatile), _yes_no(g.row_remap_pending), _yes_no(g.row_remap_failure),
            _num(g.uncorrectable_remapped_rows), _xids(g),
        ])
    return rows


def render_table(report: Report, out: TextIO) -> None:
    if report.readings is not None and report.readings.gpus:
        rows = gpu_rows(report.readings)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    if report.findings:
        out.write("\nFindings:\n")
        for f in report.findings:
            when = "" if f.urgent else ", may wait"
            out.write(f"  [{f.action}{when}] {f.message}\n")
    for note in report.notes:
        out.write(f"note: {note}\n")
    verdict = VERDICTS[report.exit_code]
    if report.exit_code == EXIT_CANNOT_CHECK:
        out.write(f"{verdict}: {report.reason}\n")
        if report.detail:
            out.write(f"nvidia-smi said: {report.detail}\n")
    else:
        out.write(f"\n{report.node}: {verdict} (exit {report.exit_code})\n")


def _gpu_json(g: GpuReading) -> dict[str, Any]:
    return {
        "index": g.gpu, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id, "model": g.model,
        "gpu_temp_c": g.gpu_temp, "memory_temp_c": g.memory_temp, "ecc_dbe_volatile": g.ecc_dbe_volatile,
        "row_remap_pending": g.row_remap_pending, "row_remap_failure": g.row_remap_failure,
        "uncorrectable_remapped_rows": g.uncorrectable_remapped_rows,
        "kernel_xids": {str(k): v for k, v in sorted(g.xid_counts.items())}, "extra": dict(g.extra),
    }


def report_json(report: Report) -> dict[str, Any]:
    readings = report.readings
    return {
        "node": report.node,
        "exit_code": report.exit_code,
        "verdict": VERDICTS[report.exit_code],
        "reason": report.reason or None,
        "nvidia_smi_message": report.detail or None,
        "driver_version": (readings.meta.get("driver_version") if readings else None),
        "gpus": [_gpu_json(g) for g in readings.gpus] if readings else [],
        "findings": [
            {"kind": f.kind, "code": f.code, "gpus": list(f.gpus), "action": f.action, "urgent": f.urgent,
             "needs_repair": f.needs_repair, "message": f.message}
            for f in report.findings
        ],
        "notes": report.notes,
    }


# ---------------------------------------------------------------- entry point


def _load(path: str | None) -> Policy:
    policy_file = load_policy(path) if path else default_policy()
    return policy_file.for_node({})  # a workstation has no node labels


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        policy = _load(args.policy)
    except (PolicyError, OSError) as e:
        report = Report(EXIT_CANNOT_CHECK, reason=f"policy: {e}")
    else:
        report = run_check(NvidiaSmiSource(path=args.nvidia_smi), policy, kernel_log=args.kernel_log)
    if args.json:
        out.write(json.dumps(report_json(report), indent=2) + "\n")
    else:
        render_table(report, out)
    return report.exit_code
