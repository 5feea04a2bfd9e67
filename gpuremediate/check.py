"""``gpuremediate check``: this machine's GPUs through nvidia-smi (and the kernel log), judged by the
same policy the controller uses.

Exit codes: 0 healthy, 1 degraded (thermal, or a repair that may wait), 2 needs repair (a lost GPU
included: nvidia-smi exit 15 names it, the readable GPUs are still shown and judged),
3 could not check (no nvidia-smi, driver not loaded, nvidia-smi timed out, bad policy file, ...),
64 usage error (an unknown flag, a missing or bad flag value: sysexits' EX_USAGE; argparse's own 2
would read as "needs repair", so a typo in a script is never taken for a broken GPU).
A snapshot has no history, so the thermal hold time is not applied: hot now counts as hot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from gpuremediate.policy.config import Policy, PolicyError, default_policy, load_policy
from gpuremediate.policy.evaluate import PolicyMemory, evaluate
from gpuremediate.signals.kernellog import KernelLog, read_kernel_log, with_kernel_xids
from gpuremediate.signals.model import GpuReading, NodeReadings
from gpuremediate.signals.nvidiasmi import DEFAULT_TIMEOUT_S, NvidiaSmiError, NvidiaSmiSource
from gpuremediate.vocab.findings import ACTION_NONE, Finding

MAX_TIMEOUT_S = 3600.0

EXIT_HEALTHY = 0
EXIT_DEGRADED = 1
EXIT_NEEDS_REPAIR = 2
EXIT_CANNOT_CHECK = 3
EXIT_USAGE = 64  # sysexits.h EX_USAGE: no verdict at all (cli.py makes argparse exit with it for check)
VERDICTS = {
    EXIT_HEALTHY: "healthy",
    EXIT_DEGRADED: "degraded",
    EXIT_NEEDS_REPAIR: "needs repair",
    EXIT_CANNOT_CHECK: "could not check",
}


# ---------------------------------------------------------------- verdict


def snapshot_policy(policy: Policy) -> Policy:
    """A one-shot check cannot wait out the thermal hold: hot now is reported now; so is a fabric registration
    that completed with an error (one still in progress may only be booting: it keeps its grace)."""
    return dataclasses.replace(policy, thermal=dataclasses.replace(policy.thermal, hold_s=0.0),
                               fabric=dataclasses.replace(policy.fabric, failure_grace_s=0.0))


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
    if not readings.gpus and not readings.lost_gpus:
        return Report(EXIT_CANNOT_CHECK, node=readings.node, readings=readings, reason="nvidia-smi listed no GPUs")
    notes: list[str] = list(readings.problems)
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


def _mig_mode(g: GpuReading) -> str | None:
    mode = g.extra.get("DCGM_FI_DEV_MIG_MODE")
    return None if mode is None else ("on" if mode else "off")


def _mig(g: GpuReading) -> str:
    """MIG mode and its devices by profile: ``on: 3g.40gb,2g.20gb,2x1g.10gb``."""
    mode = _mig_mode(g)
    if mode != "on" or not g.mig_devices:
        return mode or "-"
    counts = {profile: g.mig_devices.count(profile) for profile in g.mig_devices}
    return "on: " + ",".join(p if n == 1 else f"{n}x{p}" for p, n in counts.items())


HEADER = ["GPU", "PCI", "MODEL", "TEMP", "MEM", "DBE", "REMAP PEND", "REMAP FAIL", "UNCORR ROWS", "XID(24h)", "MIG"]


def gpu_rows(readings: NodeReadings) -> list[list[str]]:
    rows = [HEADER]
    for g in readings.gpus:
        rows.append([
            g.gpu, g.pci_bus_id or "-", g.model or "-", _num(g.gpu_temp, " C"), _num(g.memory_temp, " C"),
            _num(g.ecc_dbe_volatile), _yes_no(g.row_remap_pending), _yes_no(g.row_remap_failure),
            _num(g.uncorrectable_remapped_rows), _xids(g), _mig(g),
        ])
    for lost in readings.lost_gpus:
        rows.append(["LOST", lost.pci_bus_id or "?", *["-"] * (len(HEADER) - 2)])
    return rows


def render_table(report: Report, out: TextIO) -> None:
    if report.readings is not None and (report.readings.gpus or report.readings.lost_gpus):
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
        "kernel_xids": {str(k): v for k, v in sorted(g.xid_counts.items())}, "mig_mode": _mig_mode(g),
        "mig_devices": list(g.mig_devices), "extra": dict(g.extra),
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
        "lost_gpus": [{"pci_bus_id": g.pci_bus_id or None, "reason": g.reason}
                      for g in (readings.lost_gpus if readings else ())],
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


def timeout_seconds(text: str) -> float:
    """``--timeout``: seconds, finite, above 0 and at most an hour."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds above 0 and at most {MAX_TIMEOUT_S:g}")
    return value


EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_HEALTHY}  healthy
  {EXIT_DEGRADED}  degraded (thermal, or a repair that may wait)
  {EXIT_NEEDS_REPAIR}  needs repair (a lost GPU included)
  {EXIT_CANNOT_CHECK}  could not check (no nvidia-smi, driver not loaded, nvidia-smi timed out, bad policy file)
  {EXIT_USAGE} usage error (an unknown flag, a missing or bad flag value): no verdict
"""


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``gpuremediate check`` options (the parser's usage errors should exit ``EXIT_USAGE``: cli.py's do)."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--nvidia-smi", dest="nvidia_smi", help="path to nvidia-smi (default: found on PATH)")
    parser.add_argument("--policy", help="TOML policy file (default: built-in policy)")
    parser.add_argument(
        "--kernel-log",
        choices=("auto", "yes", "no"),
        default="auto",
        help="also read NVRM Xid lines from journalctl -k / dmesg (Linux; default: when readable)",
    )
    parser.add_argument(
        "--timeout", type=timeout_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help=f"how long each nvidia-smi call may take; then it is killed with its children "
             f"(default {DEFAULT_TIMEOUT_S:g})",
    )
    return parser


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    timeout_s = args.timeout
    try:
        policy = _load(args.policy)
    except (PolicyError, OSError) as e:
        report = Report(EXIT_CANNOT_CHECK, reason=f"policy: {e}")
    else:
        source = NvidiaSmiSource(path=args.nvidia_smi, timeout_s=timeout_s)
        report = run_check(source, policy, kernel_log=args.kernel_log)
    if args.json:
        out.write(json.dumps(report_json(report), indent=2) + "\n")
    else:
        render_table(report, out)
    return report.exit_code
