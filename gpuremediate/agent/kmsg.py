"""The kernel log from ``/dev/kmsg``: records, the NVRM Xid and NVSwitch SXid lines in them, and where to resume.

Record format (Documentation/ABI/testing/dev-kmsg): ``PRI,SEQ,USEC,FLAGS[,more fields];MESSAGE\\n``,
then optional continuation lines starting with a space (`` SUBSYSTEM=pci``). PRI is syslog
facility*8+level, SEQ the 64-bit sequence number (consecutive; a gap means records were overwritten),
USEC the kernel's monotonic timestamp in microseconds, FLAGS ``-`` (or ``c`` for an obsolete
continuation); fields after FLAGS are to be ignored. Non-printable bytes in MESSAGE are escaped ``\\xNN``.

Each ``read()`` on /dev/kmsg returns one record; ``EAGAIN`` (opened non-blocking) means caught up;
``EPIPE`` means the ring buffer overwrote records before we read them (the next read returns the oldest
one still there: the reader goes on from it, the SEQ gap counts what was lost); ``EINVAL`` means the
buffer is smaller than the record (the record is not consumed: read again with a larger one). poll(2)
says POLLIN when a record is waiting (and POLLERR|POLLPRI after an overwrite), so the follower blocks in
poll, not in read, and a stop is seen within its timeout. A fresh open starts at the oldest record of
this boot's buffer. Reading needs CAP_SYSLOG when ``kernel.dmesg_restrict=1`` (devkmsg_open →
check_syslog_permissions).

The resume point (boot id + last SEQ) is kept in a small JSON state file: after a restart the records
up to that SEQ are skipped, not counted again; a new boot id (the node rebooted) starts from the
beginning of the new boot's buffer.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuremediate.signals.kernellog import XID_FALLEN_OFF_THE_BUS, KernelXid, scan_lines
from gpuremediate.signals.nvidiasmi import normalise_bus_id

KMSG_PATH = "/dev/kmsg"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
READ_SIZE = 16384  # larger than any record (the kernel's CONSOLE_EXT_LOG_MAX is 8 KiB)
MAX_READ_SIZE = 1 << 20  # EINVAL (record larger than the buffer) doubles it up to this
FILE_POLL_S = 0.05  # a plain file (gpu-sim's kmsg) cannot be poll(2)ed for growth: its size is checked this often
STATE_VERSION = 1

KIND_XID = "xid"
KIND_SXID = "sxid"
# KernelEvent.device of an XID 79 read from a fall off the bus the driver logged without an Xid line
NO_XID_LINE = "no-xid-line"
# /dev/kmsg escapes a line feed inside a record (one printk of several lines, as osapi.c's "The NVIDIA GPU ...
# fallen off the bus" message) as \x0a (msg_print_ext_body)
ESCAPED_LINE_FEED = "\\x0a"

# nvswitch driver (SXID_PRINT in nvswitch's error.h): "nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, " fmt;
# the first line of an event says Fatal/Non-fatal, the lines after it repeat the code with details.
#   nvidia-nvswitch3: SXid (PCI:0000:c7:00.0): 24007, Fatal, Link 47 sourcetrack TCEN0 crumbstore ECC DBE Error
#   nvidia-nvswitch3: SXid (PCI:0000:c7:00.0): 24007, Severity 1 Engine instance 47 Sub-engine instance 00
SXID_LINE = re.compile(
    r"nvidia-(?P<switch>nvswitch\d+): SXid \(PCI:(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
    r"(?:\.[0-7])?)\): (?P<sxid>\d+), (?P<severity>Fatal|Non-fatal)\b,? ?(?P<rest>.*)"
)


@dataclass(frozen=True)
class Record:
    seq: int
    usec: int
    message: str


@dataclass(frozen=True)
class KernelEvent:
    """One Xid or SXid occurrence."""

    seq: int
    usec: int  # the kernel's monotonic timestamp of the record
    kind: str  # KIND_XID or KIND_SXID
    bus_id: str  # normalised PCI bus id of the GPU (Xid) or the NVSwitch (SXid)
    code: int
    fatal: bool = True  # SXid: Fatal vs Non-fatal; an Xid is judged by the policy, not here
    device: str = ""  # SXid: nvswitchN; Xid: its MIG attribution (GPU-I:05, GPU-I:05 GPU-CI:00), or NO_XID_LINE
    text: str = ""  # the rest of the line

    def to_json(self) -> list[Any]:
        return [self.seq, self.usec, self.kind, self.bus_id, self.code, self.fatal, self.device, self.text]

    @classmethod
    def from_json(cls, raw: Any) -> KernelEvent:
        seq, usec, kind, bus, code, fatal, device, text = raw
        if kind not in (KIND_XID, KIND_SXID):
            raise ValueError(f"unknown event kind {kind!r}")
        return cls(int(seq), int(usec), str(kind), str(bus), int(code), bool(fatal), str(device), str(text))


def parse_record(raw: str) -> Record | None:
    """One record's text (its first line; continuation lines are ignored); None when it is not one."""
    head, sep, message = raw.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4:
        return None
    try:
        seq, usec = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    return Record(seq, usec, message.split("\n", 1)[0])


def split_records(chunk: str) -> Iterator[str]:
    """The records in what one read returned: one on /dev/kmsg, several when reading a plain file."""
    current: list[str] = []
    for line in chunk.split("\n"):
        if line.startswith(" ") and current:
            continue  # a continuation line (KEY=value) of the record before
        if current:
            yield current[0]
        current = [line] if line else []
    if current:
        yield current[0]


def events_of(record: Record) -> list[KernelEvent]:
    if "NVRM:" in record.message:
        return [xid_event(record, x) for x in scan_lines(record.message.split(ESCAPED_LINE_FEED))]
    sxid = SXID_LINE.search(record.message)
    if sxid:
        return [KernelEvent(record.seq, record.usec, KIND_SXID, normalise_bus_id(sxid.group("bus")),
                            int(sxid.group("sxid")), fatal=sxid.group("severity") == "Fatal",
                            device=sxid.group("switch"), text=sxid.group("rest").strip())]
    return []


def xid_event(record: Record, xid: KernelXid) -> KernelEvent:
    attribution = " ".join(
        f"{name}:{number:02d}" for name, number in (("GPU-I", xid.gpu_instance), ("GPU-CI", xid.compute_instance))
        if number is not None)
    return KernelEvent(record.seq, record.usec, KIND_XID, xid.bus_id, xid.xid, text=xid.text,
                       device=attribution if xid.xid_line else NO_XID_LINE)


def kernel_xid(event: KernelEvent) -> KernelXid:
    """An Xid event as ``signals.kernellog`` reads it (its MIG attribution and whether it had an Xid line)."""
    gi = ci = None
    for part in event.device.split():
        name, _, number = part.partition(":")
        if name in ("GPU-I", "GPU-CI") and number.isdigit():
            gi, ci = (int(number), ci) if name == "GPU-I" else (gi, int(number))
    return KernelXid(event.bus_id, event.code, event.text, gi, ci, xid_line=event.device != NO_XID_LINE)


# --- where to resume -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumePoint:
    boot_id: str
    seq: int = -1  # the last record read (-1: none yet this boot)
    recent: tuple[KernelEvent, ...] = ()  # events still inside the health window, so a restart keeps them


class StateError(ValueError):
    """The state file is not what the agent writes; the message says what is wrong."""


def load_state(path: Path, boot_id: str) -> tuple[ResumePoint, str]:
    """The resume point for this boot, and a note when the file was unusable (then: start of the boot)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ResumePoint(boot_id), ""
    except OSError as exc:
        return ResumePoint(boot_id), f"state file {path} unreadable ({exc}); reading this boot's log from the start"
    try:
        saved = _decode_state(text)
    except StateError as exc:
        return ResumePoint(boot_id), f"state file {path}: {exc}; reading this boot's log from the start"
    if saved.boot_id != boot_id:
        return ResumePoint(boot_id), ""  # the node rebooted: a new buffer, a new sequence
    return saved, ""


def _decode_state(text: str) -> ResumePoint:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("v") != STATE_VERSION:
        raise StateError(f"expected an object with v={STATE_VERSION}")
    boot_id, seq = data.get("boot_id"), data.get("seq")
    if not isinstance(boot_id, str) or not isinstance(seq, int) or isinstance(seq, bool):
        raise StateError("boot_id must be a string and seq an integer")
    try:
        recent = tuple(KernelEvent.from_json(e) for e in data.get("recent", []))
    except (TypeError, ValueError) as exc:
        raise StateError(f"recent: {exc}") from None
    return ResumePoint(boot_id, seq, recent)


def save_state(path: Path, point: ResumePoint) -> None:
    """Atomically: a crash leaves the old file or the new one, never half of one."""
    data = {"v": STATE_VERSION, "boot_id": point.boot_id, "seq": point.seq,
            "recent": [e.to_json() for e in point.recent]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    try:
        return Path(path).read_text(encoding="ascii").strip()
    except OSError:
        return ""  # not Linux, or hidden: every start is then treated as a new boot's start


# --- the reader ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Poll:
    events: tuple[KernelEvent, ...]
    records: int  # new records read
    lost: int  # records overwritten before we read them (EPIPE or a gap in SEQ)
    last_seq: int


class KmsgReader:
    """Non-blocking reads of /dev/kmsg (or a file of records, for tests), from a resume SEQ on."""

    def __init__(self, path: str = KMSG_PATH, after_seq: int = -1) -> None:
        self.path = path
        self.last_seq = after_seq
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # OSError (EPERM: CAP_SYSLOG) to the caller
        self._plain = stat.S_ISREG(os.fstat(self._fd).st_mode)
        self._read_size = READ_SIZE
        self._partial = ""  # a plain file's last line while it is still being written (no newline yet)
        self._fallen: set[str] = set()  # buses with an XID 79 read: a later "fallen off the bus" line is the same fall

    def close(self) -> None:
        os.close(self._fd)

    def poll(self, max_records: int = 100_000) -> Poll:
        """Everything new since the last poll (at most ``max_records``, the rest next time)."""
        events: list[KernelEvent] = []
        records = lost = 0
        for chunk in self._chunks(max_records):
            if chunk is None:
                continue  # EPIPE: records were overwritten; the SEQ gap below counts them
            # /dev/kmsg returns whole records; a plain file's read may end inside one: keep it for next time
            complete, _, self._partial = (self._partial + chunk).rpartition("\n")
            for raw in split_records(complete):
                record = parse_record(raw)
                if record is None or record.seq <= self.last_seq:
                    continue
                if record.seq > self.last_seq + 1:  # SEQ starts at 0 each boot: a gap is records we never saw
                    lost += record.seq - self.last_seq - 1
                self.last_seq = record.seq
                records += 1
                events.extend(self._once_per_fall(events_of(record)))
        return Poll(tuple(events), records, lost, self.last_seq)

    def _once_per_fall(self, events: list[KernelEvent]) -> list[KernelEvent]:
        """``osHandleGpuLost`` logs the Xid 79 line, then its own "GPU has fallen off the bus.": one event."""
        kept = []
        for event in events:
            if event.kind == KIND_XID and event.code == XID_FALLEN_OFF_THE_BUS:
                if event.device == NO_XID_LINE and event.bus_id in self._fallen:
                    continue
                self._fallen.add(event.bus_id)
            kept.append(event)
        return kept

    def wait(self, timeout_s: float) -> bool:
        """Block until a record may be waiting, at most ``timeout_s``; True when one may be. /dev/kmsg: poll(2)
        (POLLIN: a record; POLLERR|POLLPRI: records were overwritten, the next read says EPIPE). A plain file:
        its size against the read offset, every FILE_POLL_S."""
        if not self._plain:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN | select.POLLPRI)
            return bool(poller.poll(max(0, int(timeout_s * 1000))))
        deadline = time.monotonic() + timeout_s
        while True:
            if os.fstat(self._fd).st_size > os.lseek(self._fd, 0, os.SEEK_CUR):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(FILE_POLL_S, left))

    def _read(self, size: int) -> bytes:
        return os.read(self._fd, size)

    def _chunks(self, limit: int) -> Iterable[str | None]:
        for _ in range(limit):
            try:
                data = self._read(self._read_size)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    yield None
                    continue
                if exc.errno == errno.EINVAL and self._read_size < MAX_READ_SIZE:
                    self._read_size *= 2  # the record stays unread: the next read, with room for it, gets it
                    continue
                raise
            if not data:
                return  # end of a plain file
            yield data.decode("utf-8", errors="replace")
