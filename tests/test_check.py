"""``gpuremediate check``: the real captures through a fake nvidia-smi, faults edited in, exit codes, kernel log."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuremediate import check, cli
from gpuremediate.signals import kernellog
from gpuremediate.signals.model import GpuReading, NodeReadings


def _load_fakes() -> ModuleType:
    path = Path(__file__).resolve().parent / "fixtures" / "nvidia-smi" / "fakes.py"
    spec = importlib.util.spec_from_file_location("nvsmi_fakes_check", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["nvsmi_fakes_check"] = module
    spec.loader.exec_module(module)
    return module


fakes = _load_fakes()
H100 = fakes.CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H100_MIG = fakes.CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
H200 = fakes.CAPTURES / "linux-x86_64__nvidia-h200__590.48.01.txt"
RTX = fakes.CAPTURES / "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86.txt"
DRIVER_GONE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.")


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    fakes.install_nvidia_smi(d)
    fakes.install(d, "journalctl", "fake_tool.py")
    fakes.install(d, "dmesg", "fake_tool.py")
    monkeypatch.setenv("PATH", str(d))  # nothing real: only the fakes are found
    for var in ("FAKE_SMI_EXIT", "FAKE_SMI_REJECT", "FAKE_SMI_STATE", "FAKE_SMI_LOG", "FAKE_SMI_LOST",
                "FAKE_SMI_WRAPPER_PIDFILE", "FAKE_JOURNALCTL_OUT", "FAKE_JOURNALCTL_ERR", "FAKE_DMESG_OUT"):
        monkeypatch.delenv(var, raising=False)
    return d


def run(argv: list[str]) -> tuple[int, str]:
    args = cli.build_parser().parse_args(["check", *argv])
    out = io.StringIO()
    return check.main(args, out=out), out.getvalue()


def run_json(argv: list[str]) -> tuple[int, dict[str, Any]]:
    code, text = run(["--json", *argv])
    return code, json.loads(text)


def use(monkeypatch: pytest.MonkeyPatch, capture: Path) -> None:
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(capture))


@pytest.mark.parametrize("capture", [H100, H100_MIG, H200, RTX], ids=lambda p: p.name.split("__")[1])
def test_every_real_capture_is_healthy(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, capture: Path) -> None:
    use(monkeypatch, capture)
    code, text = run(["--kernel-log", "no"])
    assert code == 0, text
    assert "healthy (exit 0)" in text
    code, report = run_json(["--kernel-log", "no"])
    assert code == 0
    assert report["verdict"] == "healthy" and report["findings"] == []
    assert len(report["gpus"]) == 1 and report["gpus"][0]["uuid"].startswith("GPU-")


def test_table_shows_readings_and_placeholders(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, RTX)
    _, text = run(["--kernel-log", "no"])
    header, row = text.splitlines()[:2]
    assert header.split()[:4] == ["GPU", "PCI", "MODEL", "TEMP"]
    assert "NVIDIA GeForce RTX 2080 SUPER" in row and "45 C" in row
    assert row.count(" - ") >= 4  # memory temp, DBE, remap columns: not reported, shown as missing


@pytest.mark.parametrize(
    ("csv", "code", "kind", "action"),
    [
        ({"ecc.errors.uncorrected.volatile.total": "2"}, 2, "ecc-dbe", "reset-gpu"),
        ({"remapped_rows.failure": "Yes"}, 2, "row-remap-failure", "quarantine"),
        ({"remapped_rows.uncorrectable": "12"}, 2, "uncorrectable-rows", "quarantine"),
        ({"remapped_rows.pending": "Yes"}, 1, "row-remap-pending", "reset-gpu"),
        ({"temperature.gpu": "96"}, 1, "thermal", "cordon"),
        ({"temperature.memory": "101"}, 1, "thermal", "cordon"),
    ],
)
def test_faults_edited_into_a_capture(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, csv: dict[str, str], code: int, kind: str,
    action: str,
) -> None:
    use(monkeypatch, fakes.edit_capture(H100, tmp_path / "faulty.txt", csv=csv))
    got, report = run_json(["--kernel-log", "no"])
    assert got == code
    assert [(f["kind"], f["action"]) for f in report["findings"]] == [(kind, action)]
    assert report["verdict"] == check.VERDICTS[code]
    _, text = run(["--kernel-log", "no"])
    assert f"[{action}" in text and f"(exit {code})" in text


def test_nvidia_smi_missing_is_3(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, text = run([])
    assert code == 3
    assert "could not check: nvidia-smi not found on PATH" in text
    code, report = run_json(["--nvidia-smi", str(tmp_path / "nope" / "nvidia-smi")])
    assert code == 3 and report["reason"] == f"nvidia-smi not found at {tmp_path / 'nope' / 'nvidia-smi'}"


def test_driver_not_loaded_is_3_with_its_message(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_EXIT", "9")
    monkeypatch.setenv("FAKE_SMI_MESSAGE", DRIVER_GONE)
    code, text = run([])
    assert code == 3
    assert "nvidia-smi exited 9 (the NVIDIA driver is not loaded)" in text
    assert DRIVER_GONE in text
    code, report = run_json([])
    assert (code, report["verdict"], report["nvidia_smi_message"]) == (3, "could not check", DRIVER_GONE)


def test_bad_policy_file_is_3(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use(monkeypatch, H100)
    bad = tmp_path / "policy.toml"
    bad.write_text("[thermal]\ngpu_cordon_c = 'hot'\n")
    code, report = run_json(["--policy", str(bad), "--kernel-log", "no"])
    assert code == 3 and report["reason"].startswith("policy:") and "gpu_cordon_c" in report["reason"]


def test_policy_file_changes_the_verdict(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use(monkeypatch, H100)  # 59 C under load
    strict = tmp_path / "policy.toml"
    strict.write_text("[thermal]\ngpu_cordon_c = 55\ngpu_clear_c = 50\n")
    code, report = run_json(["--policy", str(strict), "--kernel-log", "no"])
    assert code == 1 and report["findings"][0]["kind"] == "thermal"


# ------------------------------------------------------------------ kernel log

K = "gpu-box kernel: NVRM:"
JOURNAL = (
    f"2025-03-02T10:11:12+0000 {K} loading NVIDIA UNIX x86_64 Kernel Module  590.48.01\n"
    f"2025-03-02T10:22:33+0000 {K} Xid (PCI:0000:00:09): 79, pid=4242, name=python3, GPU has fallen off the bus.\n"
    f"2025-03-02T10:22:34+0000 {K} Xid (PCI:0000:00:09): 79, pid='<unknown>', name=<unknown>, GPU has fallen off"
    " the bus.\n"
    f"2025-03-02T10:30:00+0000 {K} Xid (PCI:0000:9a:00): 48, pid=1, name=x, An uncorrectable double bit error\n"
)


def test_parse_kernel_xids_formats() -> None:
    text = JOURNAL + (
        "[ 1234.567890] NVRM: Xid (0000:3b:00): 13, Graphics Exception: ESR 0x404600=0x80000001\n"
        "[ 1300.000000] NVRM: GPU at PCI:0000:3b:00: GPU-abc\n"
    )
    got = [(x.bus_id, x.xid) for x in kernellog.parse_kernel_xids(text)]
    assert got == [("0000:00:09.0", 79), ("0000:00:09.0", 79), ("0000:9a:00.0", 48), ("0000:3b:00.0", 13)]
    assert kernellog.parse_kernel_xids(JOURNAL)[0].text.startswith("pid=4242, name=python3, GPU has fallen off")


def test_kernel_xids_feed_the_policy(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use(monkeypatch, H100)  # its GPU sits at 00000000:00:09.0
    (tmp_path / "journal.txt").write_text(JOURNAL)
    monkeypatch.setenv("FAKE_JOURNALCTL_OUT", str(tmp_path / "journal.txt"))
    code, report = run_json(["--kernel-log", "yes"])
    assert code == 2
    assert [(f["kind"], f["code"], f["action"]) for f in report["findings"]] == [("xid", "79", "reboot")]
    assert report["gpus"][0]["kernel_xids"] == {"79": 2.0}
    assert any("PCI 0000:9a:00.0, which nvidia-smi does not list" in n for n in report["notes"])
    assert any("journalctl -k --since -24h: 3 XID line(s)" in n for n in report["notes"])


def test_application_xid_alone_stays_healthy(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use(monkeypatch, H200)
    (tmp_path / "j.txt").write_text("k: NVRM: Xid (PCI:0000:83:00): 13, Graphics Engine Exception\n")
    monkeypatch.setenv("FAKE_JOURNALCTL_OUT", str(tmp_path / "j.txt"))
    code, report = run_json([])
    assert code == 0
    assert [(f["code"], f["action"]) for f in report["findings"]] == [("13", "none")]


def test_journal_denied_falls_back_to_dmesg(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use(monkeypatch, H200)
    monkeypatch.setenv("FAKE_JOURNALCTL_ERR", "No journal files were opened due to insufficient permissions.\n")
    (tmp_path / "dmesg.txt").write_text("[  12.3] NVRM: Xid (PCI:0000:83:00): 95, pid=7, Uncontained ECC error\n")
    monkeypatch.setenv("FAKE_DMESG_OUT", str(tmp_path / "dmesg.txt"))
    code, report = run_json([])
    assert code == 2 and report["findings"][0]["code"] == "95"
    assert any("dmesg: 1 XID line(s)" in n for n in report["notes"])


def test_unreadable_kernel_log_is_a_note_with_auto_and_a_failure_with_yes(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(monkeypatch, H200)
    monkeypatch.setenv("FAKE_JOURNALCTL_ERR", "Hint: You are currently not seeing messages from other users.\n")
    monkeypatch.setenv("FAKE_DMESG_ERR", "dmesg: read kernel buffer failed: Operation not permitted\n")
    monkeypatch.setenv("FAKE_DMESG_EXIT", "1")
    code, report = run_json([])
    assert code == 0
    assert any("kernel log not readable" in n and "Operation not permitted" in n for n in report["notes"])
    code, report = run_json(["--kernel-log", "yes"])
    assert code == 3 and "Operation not permitted" in report["reason"]
    code, report = run_json(["--kernel-log", "no"])
    assert code == 0 and report["notes"] == []


def test_kernel_log_is_linux_only() -> None:
    log = kernellog.read_kernel_log(platform="win32")
    assert not log.read and "only read on Linux" in log.note


# ------------------------------------------------------------------ exit code rules


def test_exit_codes_follow_the_worst_finding() -> None:
    gpu = GpuReading(node="n", gpu="0", uuid="GPU-1", pci_bus_id="00000000:01:00.0", gpu_temp=40.0)
    readings = NodeReadings(node="n", source="nvidia-smi", gpus=(gpu,))

    class Fixed:
        node = "n"

        def read_node(self) -> NodeReadings:
            return readings

    policy = check._load(None)
    assert check.run_check(Fixed(), policy, kernel_log="no").exit_code == 0  # type: ignore[arg-type]
    empty = NodeReadings(node="n", source="nvidia-smi")
    Fixed.read_node = lambda self: empty  # type: ignore[method-assign]
    report = check.run_check(Fixed(), policy, kernel_log="no")  # type: ignore[arg-type]
    assert (report.exit_code, report.reason) == (3, "nvidia-smi listed no GPUs")


# GB200 kmsg lines quoted in leptonai/gpud pull request #1174, on the H100 capture's bus
NVLINK5_NONFATAL = (f"{K} Xid (PCI:0000:00:09): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
                    "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)\n")
NVLINK5_FATAL = (f"{K} Xid (PCI:0000:00:09): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
                 "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n")


@pytest.mark.parametrize(("journal", "code", "finding"), [
    (NVLINK5_NONFATAL * 3, 0, ("145", "none")),
    (NVLINK5_NONFATAL + NVLINK5_FATAL, 2, ("149", "reset-gpu")),
    (f"{K} Xid (PCI:0000:00:09): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\n",
     2, ("154", "reset-gpu")),
])
def test_kernel_log_messages_decode_nvlink5_and_154(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, journal: str, code: int,
    finding: tuple[str, str],
) -> None:
    use(monkeypatch, H100)
    (tmp_path / "journal.txt").write_text(journal)
    monkeypatch.setenv("FAKE_JOURNALCTL_OUT", str(tmp_path / "journal.txt"))
    got, report = run_json(["--kernel-log", "yes"])
    assert got == code
    assert (report["findings"][0]["code"], report["findings"][0]["action"]) == finding


# ------------------------------------------------------------------ item: journal absent, lost GPU, MIG, timeout


def test_no_journal_files_falls_back_to_dmesg(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # containers and minimal hosts: journalctl exits 0 saying so; an XID 79 in dmesg must still count
    use(monkeypatch, H100)
    monkeypatch.setenv("FAKE_JOURNALCTL_ERR", "No journal files were found.\n")
    (tmp_path / "empty.txt").write_text("-- No entries --\n")
    monkeypatch.setenv("FAKE_JOURNALCTL_OUT", str(tmp_path / "empty.txt"))
    (tmp_path / "dmesg.txt").write_text("[  12.3] NVRM: Xid (PCI:0000:00:09): 79, pid=7, GPU has fallen off the bus.\n")
    monkeypatch.setenv("FAKE_DMESG_OUT", str(tmp_path / "dmesg.txt"))
    code, report = run_json([])
    assert code == 2 and [(f["code"], f["action"]) for f in report["findings"]] == [("79", "reboot")]
    assert any("dmesg: 1 XID line(s)" in n for n in report["notes"])


def test_a_lost_gpu_needs_repair_and_the_others_are_shown(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, H200)
    monkeypatch.setenv("FAKE_SMI_LOST", "0000:3B:00.0")
    code, report = run_json(["--kernel-log", "no"])
    assert (code, report["verdict"]) == (2, "needs repair")
    assert [g["pci_bus_id"] for g in report["gpus"]] == ["00000000:83:00.0"]
    assert report["lost_gpus"] == [{"pci_bus_id": "0000:3b:00.0",
                                    "reason": "GPU is lost. Reboot the system to recover this GPU"}]
    [finding] = report["findings"]
    assert (finding["kind"], finding["action"], finding["code"]) == ("gpu-lost", "reboot", "0000:3b:00.0")
    code, text = run(["--kernel-log", "no"])
    assert code == 2
    assert "NVIDIA H200" in text and "LOST  0000:3b:00.0" in text and "GPU at PCI 0000:3b:00.0 is lost" in text


def test_mig_mode_and_devices_are_in_the_table(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, H100_MIG)
    code, text = run(["--kernel-log", "no"])
    header, row = text.splitlines()[:2]
    assert code == 0 and header.split()[-1] == "MIG"
    assert row.endswith("on: 3g.40gb,2g.20gb,2x1g.10gb")
    _, report = run_json(["--kernel-log", "no"])
    assert report["gpus"][0]["mig_mode"] == "on"
    assert report["gpus"][0]["mig_devices"] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    use(monkeypatch, H100)
    _, text = run(["--kernel-log", "no"])
    assert text.splitlines()[1].endswith("off")


def _check_parser() -> argparse.ArgumentParser:
    return check.add_arguments(argparse.ArgumentParser(prog="gpuremediate check", exit_on_error=False))


def test_timeout_option(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_SMI_WRAPPER_PIDFILE", str(tmp_path / "child.pid"))
    args = _check_parser().parse_args(["--json", "--kernel-log", "no", "--timeout", "3"])
    out = io.StringIO()
    assert check.main(args, out=out) == 3
    assert json.loads(out.getvalue())["reason"] == "nvidia-smi did not answer within 3 s"
    for bad in ("0", "-1", "nan", "inf", "1e9", "soon"):
        with pytest.raises(argparse.ArgumentError, match="timeout"):
            _check_parser().parse_args(["--timeout", bad])


def _entry_point(*argv: str) -> tuple[int, str, str]:
    """``python -m gpuremediate ARGV``: the real entry point, exit code and all."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "gpuremediate", *argv], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1])
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(("argv", "named"), [
    (["check", "--timeout", "0"], "--timeout"),
    (["check", "--timeout=-1"], "--timeout"),
    (["check", "--timeout", "abc"], "--timeout"),
    (["check", "--timeout"], "--timeout"),
    (["check", "--kernel-log", "maybe"], "--kernel-log"),
    (["check", "--bogus"], "--bogus"),
    (["--bogus", "check"], "--bogus"),
    (["check", "--json", "extra"], "extra"),
])
def test_a_usage_error_of_check_is_its_own_exit_code_never_a_verdict(argv: list[str], named: str) -> None:
    code, out, err = _entry_point(*argv)
    assert code == check.EXIT_USAGE and code not in check.VERDICTS, (code, err)
    assert out == "" and "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert line.startswith("gpuremediate check: error:") and named in line, err


def test_check_help_lists_every_exit_code() -> None:
    code, out, _ = _entry_point("check", "--help")
    assert code == 0
    for exit_code in (*check.VERDICTS, check.EXIT_USAGE):
        assert f"{exit_code} " in out.split("exit codes:", 1)[1], out


def test_the_other_commands_keep_exit_2_for_a_usage_error() -> None:
    code, _, err = _entry_point("status", "--bogus")
    assert code == 2 and "gpuremediate status: error: unrecognized arguments: --bogus" in err


# ------------------------------------------------------------------ issue 45: MIG Xids, a fall without an Xid

# krcReportXid (open-gpu-kernel-modules kernel_rc.c): "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, pid=%s, name=%s,
# %s" on a MIG GPU; the H100 MIG capture's GPU sits at 00000000:00:09.0
MIG_JOURNAL = (
    f"2026-07-03T22:10:40+0000 {K} Xid (PCI:0000:00:09 GPU-I:05): 94, pid=2144, name=python3, Contained: SM (0x1). "
    "RST: No, D-RST: No\n"
    f"2026-07-03T22:10:41+0000 {K} Xid (PCI:0000:00:09 GPU-I:01 GPU-CI:00): 48, pid=2144, name=python3, "
    "An uncorrectable double bit error\n"
)


def test_mig_attributed_xids_count_for_the_gpu_and_name_the_instance(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use(monkeypatch, H100_MIG)
    (tmp_path / "journal.txt").write_text(MIG_JOURNAL)
    monkeypatch.setenv("FAKE_JOURNALCTL_OUT", str(tmp_path / "journal.txt"))
    code, report = run_json(["--kernel-log", "yes"])
    assert report["gpus"][0]["kernel_xids"] == {"48": 1.0, "94": 1.0}
    assert {f["code"] for f in report["findings"]} >= {"48", "94"} and code == 2
    assert any("XID 94 attributed to MIG instance(s) PCI 0000:00:09.0 GPU-I:05" in n for n in report["notes"])
    assert any("XID 48 attributed to MIG instance(s) PCI 0000:00:09.0 GPU-I:01 GPU-CI:00" in n for n in report["notes"])


# osHandleGpuLost (osinit.c) without bEmitXid prints only NV_DEV_PRINTF's "NVRM: GPU %04x:%02x:%02x.%x: GPU has fallen
# off the bus."; the adapter's start (osapi.c) prints three lines, shown by dmesg / journalctl indented under the first
FALLEN_LISTED = f"2026-07-03T22:10:40+0000 {K} GPU 0000:00:09.0: GPU has fallen off the bus.\n"
FALLEN_AT_START = (
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    "               NVRM: (PCI ID: 10de:2330) installed in this system has\n"
    "               NVRM: fallen off the bus and is not responding to commands.\n"
)


def test_a_fall_off_the_bus_without_an_xid_is_xid_79(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use(monkeypatch, H100)
    (tmp_path / "journal.txt").write_text(FALLEN_LISTED)
    monkeypatch.setenv("FAKE_JOURNALCTL_OUT", str(tmp_path / "journal.txt"))
    code, report = run_json(["--kernel-log", "yes"])
    assert code == 2 and [(f["code"], f["action"]) for f in report["findings"]] == [("79", "reboot")]
    assert report["gpus"][0]["kernel_xids"] == {"79": 1.0}


def test_a_gpu_that_fell_at_start_and_is_not_listed_is_lost(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use(monkeypatch, H200)  # lists only its GPU at 83:00.0
    (tmp_path / "dmesg.txt").write_text(FALLEN_AT_START)
    monkeypatch.setenv("FAKE_JOURNALCTL_ERR", "No journal files were found.\n")
    monkeypatch.setenv("FAKE_DMESG_OUT", str(tmp_path / "dmesg.txt"))
    code, report = run_json([])
    assert (code, report["verdict"]) == (2, "needs repair")
    assert [g["pci_bus_id"] for g in report["lost_gpus"]] == ["0000:b3:00.0"]
    assert [(f["kind"], f["code"], f["action"]) for f in report["findings"]] == [("gpu-lost", "0000:b3:00.0", "reboot")]


def test_the_xid_79_line_and_the_fallen_line_of_one_fall_count_once() -> None:
    text = (f"{K} Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
            f"{K} GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
            f"{K} GPU at PCI:0000:5e:00: GPU-2f4ee1a0-5c41-4fd4-a7e3-1b5c9d1c0d2b\n")
    assert [(x.bus_id, x.xid, x.xid_line) for x in kernellog.parse_kernel_xids(text)] == [("0000:3b:00.0", 79, True)]


# "GPU Recovery Action" (nvidia-smi, driver 570+; "None" in every capture): judged as [recovery_action] judges
# DCGM's field 1523
@pytest.mark.parametrize(("words", "code", "action", "urgent"), [
    ("Reset", 2, "reset-gpu", True), ("Reboot", 2, "reboot", True), ("Drain P2P", 1, "cordon", True),
    ("Drain and Reset", 1, "reset-gpu", False)])
def test_a_gpu_waiting_for_its_recovery_action_is_not_healthy(
    bin_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, words: str, code: int, action: str, urgent: bool
) -> None:
    use(monkeypatch, fakes.edit_capture(H200, tmp_path / "h200.txt", csv={"gpu_recovery_action": words}))
    got, report = run_json(["--kernel-log", "no"])
    assert got == code
    [finding] = report["findings"]
    assert (finding["kind"], finding["action"], finding["urgent"]) == ("recovery-action", action, urgent)
    assert report["gpus"][0]["extra"]["DCGM_FI_DEV_GPU_RECOVERY_ACTION"] >= 1


def test_recovery_action_none_in_the_real_captures_is_healthy(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, H200)
    code, report = run_json(["--kernel-log", "no"])
    assert code == 0 and report["findings"] == []
    assert report["gpus"][0]["extra"]["DCGM_FI_DEV_GPU_RECOVERY_ACTION"] == 0.0
