"""/dev/kmsg records, Xid and SXid lines, and resuming after a restart without replaying.

The record lines are hand-made in the documented format (Documentation/ABI/testing/dev-kmsg:
``PRI,SEQ,USEC,FLAGS;MESSAGE`` plus `` KEY=value`` continuation lines); the SXid texts follow the
nvswitch driver's SXID_PRINT format ("nvidia-%s: SXid (PCI:%s): %05d, " + Fatal/Non-fatal + details).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from gpuremediate.agent import kmsg
from gpuremediate.agent.kmsg import KIND_SXID, KIND_XID, KernelEvent, KmsgReader, ResumePoint

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
SXID_FATAL = "nvidia-nvswitch3: SXid (PCI:0000:c7:00.0): 24007, Fatal, Link 47 sourcetrack TCEN0 crumbstore ECC DBE"
SXID_DETAIL = "nvidia-nvswitch3: SXid (PCI:0000:c7:00.0): 24007, Severity 1 Engine instance 47 Sub-engine instance 00"
SXID_NONFATAL = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error"


def rec(seq: int, message: str, usec: int | None = None, extra: str = "") -> str:
    return f"4,{seq},{usec if usec is not None else seq * 1000},-{extra};{message}\n"


def write(path: Path, *records: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write("".join(records))


def test_parse_record_reads_seq_and_usec_and_ignores_future_fields() -> None:
    record = kmsg.parse_record("6,339,5140900,-,caller=T1;NVRM: loading NVIDIA UNIX x86_64 Kernel Module")
    assert record == kmsg.Record(339, 5140900, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module")


@pytest.mark.parametrize("junk", ["", "no semicolon here", "6,x,1,-;text", "6,1;short header"])
def test_parse_record_refuses_what_is_not_a_record(junk: str) -> None:
    assert kmsg.parse_record(junk) is None


def test_continuation_lines_belong_to_their_record() -> None:
    chunk = rec(1, "first") + " SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n" + rec(2, "second")
    assert [kmsg.parse_record(r).message for r in kmsg.split_records(chunk)] == ["first", "second"]  # type: ignore[union-attr]


def test_xid_line_becomes_an_event_with_the_normalised_bus_id() -> None:
    [event] = kmsg.events_of(kmsg.Record(7, 99, XID_79))
    assert (event.kind, event.bus_id, event.code, event.seq, event.usec) == (KIND_XID, "0000:3b:00.0", 79, 7, 99)
    assert "fallen off the bus" in event.text


def test_sxid_headline_is_an_event_its_detail_lines_are_not() -> None:
    [fatal] = kmsg.events_of(kmsg.Record(1, 1, SXID_FATAL))
    assert (fatal.kind, fatal.device, fatal.bus_id, fatal.code, fatal.fatal) == (
        KIND_SXID, "nvswitch3", "0000:c7:00.0", 24007, True)
    [nonfatal] = kmsg.events_of(kmsg.Record(2, 2, SXID_NONFATAL))
    assert not nonfatal.fatal and nonfatal.code == 12028
    assert kmsg.events_of(kmsg.Record(3, 3, SXID_DETAIL)) == []
    assert kmsg.events_of(kmsg.Record(4, 4, "usb 1-1: new high-speed USB device")) == []


def test_every_occurrence_is_an_event_even_the_same_code_twice(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    write(log, rec(0, "boot"), rec(1, XID_79), rec(2, XID_79), rec(3, SXID_FATAL), rec(4, SXID_DETAIL))
    reader = KmsgReader(str(log))
    polled = reader.poll()
    assert [(e.kind, e.code) for e in polled.events] == [(KIND_XID, 79), (KIND_XID, 79), (KIND_SXID, 24007)]
    assert (polled.records, polled.lost, polled.last_seq) == (5, 0, 4)
    write(log, rec(5, XID_79))
    assert [e.seq for e in reader.poll().events] == [5]  # only what is new
    reader.close()


def test_a_record_caught_half_written_in_a_plain_file_is_read_whole_next_time(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    line = rec(0, XID_79)
    write(log, line[:20])
    reader = KmsgReader(str(log))
    assert reader.poll().records == 0
    write(log, line[20:])
    polled = reader.poll()
    assert [(e.seq, e.code) for e in polled.events] == [(0, 79)]
    assert polled.events[0].text == "pid=1234, name=python3, GPU has fallen off the bus."
    reader.close()


def test_a_gap_in_seq_counts_the_records_we_never_saw(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    write(log, rec(10, "oldest still in the buffer"), rec(11, "x"), rec(15, XID_79))
    polled = KmsgReader(str(log)).poll()
    assert polled.lost == 10 + 3  # seq 0-9 were overwritten before we started, 12-14 while we read


def test_resuming_skips_what_was_read_before(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    write(log, rec(0, XID_79), rec(1, XID_79), rec(2, "x"), rec(3, XID_79))
    polled = KmsgReader(str(log), after_seq=2).poll()
    assert [e.seq for e in polled.events] == [3]
    assert polled.lost == 0


def test_unreadable_kmsg_is_an_oserror_for_the_caller(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        KmsgReader(str(tmp_path / "absent"))


# --- the state file --------------------------------------------------------------------------------


def event(seq: int) -> KernelEvent:
    return KernelEvent(seq, seq * 1000, KIND_XID, "0000:3b:00.0", 79, text="GPU has fallen off the bus.")


def test_state_round_trip_same_boot(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    kmsg.save_state(path, ResumePoint("boot-a", 41, (event(40), event(41))))
    point, note = kmsg.load_state(path, "boot-a")
    assert point == ResumePoint("boot-a", 41, (event(40), event(41)))
    assert note == ""
    assert not (tmp_path / "state.json.tmp").exists()


def test_a_new_boot_starts_from_the_beginning(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    kmsg.save_state(path, ResumePoint("boot-a", 41, (event(41),)))
    assert kmsg.load_state(path, "boot-b") == (ResumePoint("boot-b"), "")


def test_no_state_file_starts_from_the_beginning(tmp_path: Path) -> None:
    assert kmsg.load_state(tmp_path / "none.json", "boot-a") == (ResumePoint("boot-a"), "")


@pytest.mark.parametrize(("text", "why"), [
    ("{not json", "not JSON"),
    (json.dumps({"v": 9, "boot_id": "b", "seq": 1}), "expected an object with v=1"),
    (json.dumps({"v": 1, "boot_id": "b", "seq": "1"}), "seq an integer"),
    (json.dumps({"v": 1, "boot_id": "b", "seq": 1, "recent": [[1, 2, "bogus", "x", 1, True, "", ""]]}),
     "unknown event kind"),
])
def test_a_corrupt_state_file_says_why_and_starts_over(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    point, note = kmsg.load_state(path, "b")
    assert point == ResumePoint("b")
    assert why in note and str(path) in note


def test_boot_id_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert kmsg.read_boot_id(str(tmp_path / "boot_id")) == ""
    (tmp_path / "boot_id").write_text("3f2c0a6e-1111-2222-3333-444455556666\n")
    assert kmsg.read_boot_id(str(tmp_path / "boot_id")) == "3f2c0a6e-1111-2222-3333-444455556666"


# --- issue 45: MIG-attributed Xids and a fall off the bus without an Xid --------------------------------
# krcReportXid (open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc.c) attributes an Xid on a MIG GPU
# as "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, pid=%s, name=%s, %s" (and "... GPU-I:%02u GPU-CI:%02u)").
XID_94_MIG = "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=2144, name=python3, Contained: SM (0x1). RST: No, D-RST: No"
XID_79_MIG = "NVRM: Xid (PCI:0000:01:00 GPU-I:01): 79, pid=2144, name=python3, GPU has fallen off the bus."
XID_48_MIG_CI = "NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:00): 48, pid=2144, name=python3, An uncorrectable double bit"
# osHandleGpuLost (src/nvidia/arch/nvalloc/unix/src/osinit.c): NV_DEV_PRINTF -> "NVRM: GPU %04x:%02x:%02x.%x: ..."
FALLEN = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
# the adapter's start (src/nvidia/arch/nvalloc/unix/src/osapi.c): one printk of three lines; /dev/kmsg escapes
# the line feeds inside a record as \x0a
FALLEN_AT_START = ("NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has"
                   "\\x0aNVRM: fallen off the bus and is not responding to commands.")


@pytest.mark.parametrize(("line", "code", "device"), [
    (XID_94_MIG, 94, "GPU-I:05"), (XID_79_MIG, 79, "GPU-I:01"), (XID_48_MIG_CI, 48, "GPU-I:01 GPU-CI:00")])
def test_a_mig_attributed_xid_is_an_event_of_its_gpu_naming_the_instance(line: str, code: int, device: str) -> None:
    [event] = kmsg.events_of(kmsg.Record(9, 9, line))
    assert (event.kind, event.bus_id, event.code, event.device) == (KIND_XID, "0000:01:00.0", code, device)
    assert event.text.startswith("pid=2144, name=python3, ")
    xid = kmsg.kernel_xid(event)
    assert (xid.gpu_instance, xid.xid_line) == (5 if code == 94 else 1, True)
    assert xid.compute_instance == (0 if code == 48 else None)


@pytest.mark.parametrize(("message", "bus"), [(FALLEN, "0000:3b:00.0"), (FALLEN_AT_START, "0000:b3:00.0")])
def test_a_gpu_fallen_off_the_bus_without_an_xid_is_an_xid_79(message: str, bus: str) -> None:
    [event] = kmsg.events_of(kmsg.Record(3, 3, message))
    assert (event.kind, event.bus_id, event.code, event.device) == (KIND_XID, bus, 79, kmsg.NO_XID_LINE)
    assert "fallen off the bus" in event.text and "no Xid" in event.text
    assert not kmsg.kernel_xid(event).xid_line
    # the GPU's UUID line at start-up (_krcLogUuidOnce) is not a fault
    uuid_line = "NVRM: GPU at PCI:0000:3b:00: GPU-2f4ee1a0-5c41-4fd4-a7e3-1b5c9d1c0d2b"
    assert kmsg.events_of(kmsg.Record(4, 4, uuid_line)) == []


def test_the_xid_79_line_and_the_fallen_line_after_it_are_one_fall(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    # osHandleGpuLost with bEmitXid: the Xid 79 line, then its own line; another GPU falls without an Xid
    write(log, rec(0, XID_79), rec(1, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."),
          rec(2, "NVRM: GPU 0000:5e:00.0: GPU has fallen off the bus."))
    reader = KmsgReader(str(log))
    events = reader.poll().events
    reader.close()
    assert [(e.bus_id, e.code, e.device) for e in events] == [
        ("0000:3b:00.0", 79, ""), ("0000:5e:00.0", 79, kmsg.NO_XID_LINE)]


def test_a_mig_attribution_survives_the_state_file(tmp_path: Path) -> None:
    [event] = kmsg.events_of(kmsg.Record(5, 50, XID_48_MIG_CI))
    path = tmp_path / "state.json"
    kmsg.save_state(path, ResumePoint("boot-1", 5, (event,)))
    point, note = kmsg.load_state(path, "boot-1")
    assert note == "" and point.recent == (event,)


class ScriptedKmsg(KmsgReader):
    """/dev/kmsg's read(2) as the kernel answers it (devkmsg_read): one record per read, EPIPE once when the ring
    overwrote the record we were to read next (then the oldest one left), EINVAL while the buffer is smaller than
    the record (which stays unread), EAGAIN when caught up."""

    def __init__(self, path: str, script: list[str | int], after_seq: int = -1) -> None:
        super().__init__(path, after_seq)
        self.script = list(script)
        self.sizes: list[int] = []

    def _read(self, size: int) -> bytes:
        self.sizes.append(size)
        if not self.script:
            raise BlockingIOError(errno.EAGAIN, "caught up")
        step = self.script[0]
        if isinstance(step, int):
            self.script.pop(0)
            raise OSError(step, os.strerror(step))
        data = step.encode()
        if len(data) > size:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        self.script.pop(0)
        return data


def test_epipe_resynchronises_to_the_oldest_record_left_and_counts_the_overwritten(tmp_path: Path) -> None:
    (tmp_path / "kmsg").write_text("")
    reader = ScriptedKmsg(str(tmp_path / "kmsg"), [rec(0, "boot"), rec(1, XID_79), errno.EPIPE, rec(5, XID_79),
                                                   rec(6, "x")])
    polled = reader.poll()
    assert [e.seq for e in polled.events] == [1, 5]
    assert (polled.records, polled.lost, polled.last_seq) == (4, 3, 6)
    reader.script = [errno.EPIPE, rec(9, XID_79)]  # and again on a later poll: the reader goes on, never dies
    again = reader.poll()
    assert ([e.seq for e in again.events], again.lost) == ([9], 2)


def test_a_record_larger_than_the_buffer_is_read_again_with_a_larger_one(tmp_path: Path) -> None:
    (tmp_path / "kmsg").write_text("")
    long = rec(0, XID_79 + " " + "x" * (kmsg.READ_SIZE + 100))
    reader = ScriptedKmsg(str(tmp_path / "kmsg"), [long, rec(1, XID_79)])
    polled = reader.poll()
    assert [e.seq for e in polled.events] == [0, 1]
    assert reader.sizes[:3] == [kmsg.READ_SIZE, 2 * kmsg.READ_SIZE, 2 * kmsg.READ_SIZE]


def test_an_error_other_than_epipe_or_einval_is_the_callers(tmp_path: Path) -> None:
    (tmp_path / "kmsg").write_text("")
    reader = ScriptedKmsg(str(tmp_path / "kmsg"), [errno.EIO])
    with pytest.raises(OSError):
        reader.poll()


def test_wait_on_a_plain_file_says_whether_it_grew(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    write(log, rec(0, "boot"))
    reader = KmsgReader(str(log))
    assert reader.wait(0.0) is True  # nothing read yet
    reader.poll()
    assert reader.wait(0.0) is False
    write(log, rec(1, XID_79))
    assert reader.wait(0.0) is True
    reader.close()
