"""NVRM Xid lines from the kernel log (journalctl -k, else dmesg) → per-GPU XID counts.

Used by ``gpuremediate check`` on a workstation, where there is no exporter: the driver's own log
is the XID source. Reading needs Linux and usually root; a log that cannot be read says why.

The lines, as the open driver prints them (NVIDIA/open-gpu-kernel-modules, 595.45.04):

- ``krcReportXid`` (src/nvidia/src/kernel/gpu/rc/kernel_rc.c): ``NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s,
  name=%s, %s`` (``NVRM: Xid (PCI:...): %d, %s`` without a process); on a MIG GPU the error may be attributed
  to a GPU instance, ``(PCI:%04x:%02x:%02x GPU-I:%02u)``, or to a GPU and a compute instance, ``(PCI:%04x:%02x:%02x
  GPU-I:%02u GPU-CI:%02u)``: ``NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=...``. The instance is kept
  (``KernelXid.gpu_instance``); the XID counts for the physical GPU at that bus.
- ``osHandleGpuLost`` (src/nvidia/arch/nvalloc/unix/src/osinit.c) prints an Xid 79 line only when asked to
  (``bEmitXid``), then always ``NV_DEV_PRINTF``'s ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``
- the adapter's start (src/nvidia/arch/nvalloc/unix/src/osapi.c), registers reading all ones, prints one message
  of three lines and no Xid: ``NVRM: The NVIDIA GPU 0000:3b:00.0`` / ``NVRM: (PCI ID: 10de:2330) installed in this
  system has`` / ``NVRM: fallen off the bus and is not responding to commands.``

A GPU fallen off the bus with no Xid line is read as an XID 79 (``xid_line`` False, its text says so); where
the same log also has the Xid 79 line for that bus, the fall is counted once.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from gpuremediate.signals.model import LostGpu, NodeReadings
from gpuremediate.signals.nvidiasmi import normalise_bus_id, run_process_group

_BUS = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
# NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=...   NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:00): 43, ...
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>" + _BUS + r")(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\): (?P<xid>\d+)"
    r"(?:, (?P<rest>.*))?"
)
XID_FALLEN_OFF_THE_BUS = 79
# NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.   (osHandleGpuLost)
FALLEN_LINE = re.compile(r"NVRM: GPU (?P<bus>" + _BUS + r"): GPU has fallen off the bus\.")
# NVRM: The NVIDIA GPU 0000:3b:00.0   (first line of osapi.c's message; "fallen off the bus" follows within two)
FALLEN_HEAD = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>" + _BUS + r")\b")
FALLEN_TAIL = "fallen off the bus and is not responding to commands"
FALLEN_TEXT = "GPU has fallen off the bus (the driver logged no Xid for it)"
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
    gpu_instance: int | None = None  # MIG: the GPU instance the driver attributed it to (GPU-I:05)
    compute_instance: int | None = None  # MIG: and the compute instance (GPU-CI:00)
    xid_line: bool = True  # False: a GPU fallen off the bus that the driver reported without an Xid line

    @property
    def where(self) -> str:
        """``PCI 0000:01:00.0``, or MIG-attributed ``PCI 0000:01:00.0 GPU-I:05 GPU-CI:00`` (as the driver writes it)."""
        parts = [f"PCI {self.bus_id}"]
        if self.gpu_instance is not None:
            parts.append(f"GPU-I:{self.gpu_instance:02d}")
        if self.compute_instance is not None:
            parts.append(f"GPU-CI:{self.compute_instance:02d}")
        return " ".join(parts)


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


def xid_of_line(line: str) -> KernelXid | None:
    """The Xid, or the fall off the bus written without one (``FALLEN_LINE``), in one line of the log."""
    m = XID_LINE.search(line)
    if m:
        gi, ci = m.group("gi"), m.group("ci")
        return KernelXid(normalise_bus_id(m.group("bus")), int(m.group("xid")), (m.group("rest") or "").strip(),
                         None if gi is None else int(gi), None if ci is None else int(ci))
    m = FALLEN_LINE.search(line)
    if m:
        return KernelXid(normalise_bus_id(m.group("bus")), XID_FALLEN_OFF_THE_BUS, FALLEN_TEXT, xid_line=False)
    return None


def scan_lines(lines: Sequence[str]) -> list[KernelXid]:
    """Every Xid and fall off the bus in these lines, in order (the three-line message is one event)."""
    found = []
    for i, line in enumerate(lines):
        if "NVRM:" not in line:
            continue
        event = xid_of_line(line)
        if event is None:
            head = FALLEN_HEAD.search(line)
            if head is not None and any(FALLEN_TAIL in later for later in lines[i:i + 3]):
                event = KernelXid(normalise_bus_id(head.group("bus")), XID_FALLEN_OFF_THE_BUS, FALLEN_TEXT,
                                  xid_line=False)
        if event is not None:
            found.append(event)
    return found


def once_per_fall(xids: Iterable[KernelXid]) -> list[KernelXid]:
    """``xids`` without the falls off the bus written without an Xid on a bus that also has its Xid 79 line
    (``osHandleGpuLost`` prints both for one fall)."""
    xids = list(xids)
    with_line = {x.bus_id for x in xids if x.xid_line and x.xid == XID_FALLEN_OFF_THE_BUS}
    return [x for x in xids if x.xid_line or x.bus_id not in with_line]


def parse_kernel_xids(text: str) -> list[KernelXid]:
    """Every NVRM Xid line (and fall off the bus without one) in journalctl/dmesg output, in order."""
    return once_per_fall(scan_lines(text.splitlines()))


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
    """Add per-GPU XID counts from the kernel log; notes for XIDs on PCI devices nvidia-smi did not list
    (one that fell off the bus is also a lost GPU: XID 79's action) and for MIG-attributed XIDs."""
    counts: dict[str, dict[int, float]] = {}
    messages: dict[str, dict[int, tuple[str, ...]]] = {}
    attributed: dict[tuple[str, int], set[str]] = {}
    for event in log.xids:
        per_gpu = counts.setdefault(event.bus_id, {})
        per_gpu[event.xid] = per_gpu.get(event.xid, 0.0) + 1
        texts = messages.setdefault(event.bus_id, {})
        if event.text and event.text not in texts.get(event.xid, ()):
            texts[event.xid] = (*texts.get(event.xid, ()), event.text)
        if event.gpu_instance is not None:
            attributed.setdefault((event.bus_id, event.xid), set()).add(event.where)
    known = {normalise_bus_id(g.pci_bus_id or ""): g for g in readings.gpus}
    notes = [
        f"kernel log: XID {', '.join(map(str, sorted(c)))} on PCI {bus}, which nvidia-smi does not list "
        "(a GPU that fell off the bus?)"
        for bus, c in sorted(counts.items())
        if bus not in known
    ]
    notes += [f"kernel log: XID {xid} attributed to MIG instance(s) {', '.join(sorted(where))}"
              for (bus, xid), where in sorted(attributed.items())]
    listed_lost = {lost.pci_bus_id for lost in readings.lost_gpus}
    fallen = tuple(LostGpu(bus, "the kernel log says it fell off the bus (XID 79) and nvidia-smi does not list it")
                   for bus, c in sorted(counts.items())
                   if XID_FALLEN_OFF_THE_BUS in c and bus not in known and bus not in listed_lost)
    gpus = tuple(
        dataclasses.replace(g, xid_counts=MappingProxyType(counts[bus]),
                            xid_messages=MappingProxyType(messages.get(bus, {}))) if bus in counts else g
        for bus, g in ((normalise_bus_id(g.pci_bus_id or ""), g) for g in readings.gpus)
    )
    return dataclasses.replace(readings, gpus=gpus, lost_gpus=(*readings.lost_gpus, *fallen)), notes
