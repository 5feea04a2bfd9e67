"""NVRM Xid lines from the kernel log (journalctl -k, else dmesg) → per-GPU XID counts.

Used by ``gpuremediate check`` on a workstation, where there is no exporter: the driver's own log
is the XID source. Reading needs Linux and usually root; a log that cannot be read says why.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from gpuremediate.signals.model import NodeReadings
from gpuremediate.signals.nvidiasmi import normalise_bus_id, run_process_group

# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (?P<xid>\d+)"
    r"(?:, (?P<rest>.*))?"
)
JOURNAL_DENIED = ("insufficient permissions", "not seeing messages", "permission denied")
# journalctl exits 0 with this when the machine keeps no journal (containers, minimal hosts): not a
# clean kernel log, an absent one, so dmesg is read instead
JOURNAL_ABSENT = "no journal files were found"
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class KernelXid:
    bus_id: str  # normalised, e.g. 0000:3b:00.0
    xid: int
    text: str  # the rest of the line: pid, process, NVIDIA's message


@dataclass(frozen=True)
class KernelLog:
    xids: tuple[KernelXid, ...] = ()
    source: str = ""  # "journalctl -k --since -24h" or "dmesg"
    note: str = ""  # why it could not be read (empty when it was)

    @property
    def read(self) -> bool:
        return not self.note


class KernelLogError(RuntimeError):
    """The kernel log could not be read; ``denied`` when it was a permission problem."""

    def __init__(self, message: str, denied: bool = False) -> None:
        super().__init__(message)
        self.denied = denied


def parse_kernel_xids(text: str) -> list[KernelXid]:
    """Every NVRM Xid line in journalctl/dmesg output, in order."""
    found = []
    for line in text.splitlines():
        m = XID_LINE.search(line)
        if m:
            rest = (m.group("rest") or "").strip()
            found.append(KernelXid(normalise_bus_id(m.group("bus")), int(m.group("xid")), rest))
    return found


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return run_process_group(argv, TIMEOUT_S)


def _read_journal(runner: Runner) -> str:
    if shutil.which("journalctl") is None:
        raise KernelLogError("journalctl not found")
    proc = runner(["journalctl", "-k", "--since", "-24h", "-o", "short-iso", "--no-pager"])
    # Without access journalctl may exit 0 with nothing but a hint on stderr.
    if any(s in proc.stderr.lower() for s in JOURNAL_DENIED):
        raise KernelLogError(f"journalctl: {proc.stderr.strip().splitlines()[0]}", denied=True)
    if proc.returncode != 0:
        raise KernelLogError(f"journalctl exited {proc.returncode}: {proc.stderr.strip()}")
    if JOURNAL_ABSENT in (proc.stderr + proc.stdout).lower():
        raise KernelLogError("journalctl: No journal files were found.")
    return proc.stdout


def _read_dmesg(runner: Runner) -> str:
    if shutil.which("dmesg") is None:
        raise KernelLogError("dmesg not found")
    proc = runner(["dmesg"])
    if proc.returncode != 0:
        message = proc.stderr.strip() or f"exit {proc.returncode}"
        denied = "not permitted" in message.lower() or "permission denied" in message.lower()
        raise KernelLogError(f"dmesg: {message}", denied=denied)
    return proc.stdout


def read_kernel_log(runner: Runner = _run, platform: str = sys.platform) -> KernelLog:
    """XIDs of the last 24 h (journalctl), else since boot (dmesg); a note when neither is readable."""
    if not platform.startswith("linux"):
        return KernelLog(note=f"the kernel log is only read on Linux (this is {platform})")
    errors = []
    for source, reader in (("journalctl -k --since -24h", _read_journal), ("dmesg", _read_dmesg)):
        try:
            return KernelLog(tuple(parse_kernel_xids(reader(runner))), source=source)
        except KernelLogError as e:
            errors.append(str(e))
        except (OSError, subprocess.TimeoutExpired) as e:
            errors.append(f"{source}: {e}")
    return KernelLog(note="kernel log not readable: " + "; ".join(errors))


def with_kernel_xids(readings: NodeReadings, log: KernelLog) -> tuple[NodeReadings, list[str]]:
    """Add per-GPU XID counts from the kernel log; notes for XIDs on PCI devices nvidia-smi did not list."""
    counts: dict[str, dict[int, float]] = {}
    messages: dict[str, dict[int, tuple[str, ...]]] = {}
    for event in log.xids:
        per_gpu = counts.setdefault(event.bus_id, {})
        per_gpu[event.xid] = per_gpu.get(event.xid, 0.0) + 1
        texts = messages.setdefault(event.bus_id, {})
        if event.text and event.text not in texts.get(event.xid, ()):
            texts[event.xid] = (*texts.get(event.xid, ()), event.text)
    known = {normalise_bus_id(g.pci_bus_id or ""): g for g in readings.gpus}
    notes = [
        f"kernel log: XID {', '.join(map(str, sorted(c)))} on PCI {bus}, which nvidia-smi does not list "
        "(a GPU that fell off the bus?)"
        for bus, c in sorted(counts.items())
        if bus not in known
    ]
    gpus = tuple(
        dataclasses.replace(g, xid_counts=MappingProxyType(counts[bus]),
                            xid_messages=MappingProxyType(messages.get(bus, {}))) if bus in counts else g
        for bus, g in ((normalise_bus_id(g.pci_bus_id or ""), g) for g in readings.gpus)
    )
    return dataclasses.replace(readings, gpus=gpus), notes
