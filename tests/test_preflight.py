"""``gpuremediate preflight``: the real nvidia-smi captures through the fake nvidia-smi, faults edited in, the pod's
GPUs, a fake dcgmi (its JSON), an operator's command with a time bound, the termination log, unknown != failed."""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpuremediate import cli, preflight
from gpuremediate.vocab.preflight import FAILED, UNKNOWN, PreflightMessage, parse_message


def _load_fakes() -> ModuleType:
    path = Path(__file__).resolve().parent / "fixtures" / "nvidia-smi" / "fakes.py"
    spec = importlib.util.spec_from_file_location("nvsmi_fakes_preflight", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["nvsmi_fakes_preflight"] = module
    spec.loader.exec_module(module)
    return module


fakes = _load_fakes()
H100 = fakes.CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H200 = fakes.CAPTURES / "linux-x86_64__nvidia-h200__590.48.01.txt"
SLEEP = f"exec {shutil.which('sleep')} 30\n"  # found before PATH holds only the fakes
DRIVER_GONE = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
# dcgmi diag -r 1 -j as DCGM 3.x prints it (test_categories / tests / results), one test failed on GPU 0.
DCGM_FAIL = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
    {"name": "Denylist", "results": [{"status": "Pass"}]},
    {"name": "GPU Memory", "results": [{"gpu_ids": "0", "status": "Fail", "warnings": [
        {"error_id": 83, "warning": "Pending page retirements detected on GPU 0."}]}]},
]}], "version": "3.3.5"}}
DCGM_PASS = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
    {"name": "Denylist", "results": [{"status": "Pass"}]}]}]}}


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    fakes.install_nvidia_smi(d)
    monkeypatch.setenv("PATH", str(d))
    for var in ("FAKE_SMI_EXIT", "FAKE_SMI_REJECT", "FAKE_SMI_STATE", "FAKE_SMI_LOG", "FAKE_SMI_LOST",
                "FAKE_DCGMI_OUT", "FAKE_DCGMI_ERR", "FAKE_DCGMI_EXIT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(H100))
    return d


def with_dcgmi(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, doc: object, code: int, err: str = "") -> None:
    fakes.install(bin_dir, "dcgmi", "fake_tool.py")
    out = bin_dir.parent / "dcgmi.json"
    out.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    monkeypatch.setenv("FAKE_DCGMI_OUT", str(out))
    monkeypatch.setenv("FAKE_DCGMI_EXIT", str(code))
    monkeypatch.setenv("FAKE_DCGMI_ERR", err)


def script(bin_dir: Path, name: str, body: str) -> Path:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def run(tmp_path: Path, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    log = tmp_path / "termination-log"
    log.unlink(missing_ok=True)
    args = cli.build_parser().parse_args(["preflight", "--termination-log", str(log), *argv])
    out = io.StringIO()
    code = preflight.main(args, out=out, env=env or {})
    return code, out.getvalue(), log.read_text(encoding="utf-8") if log.exists() else ""


def test_a_healthy_gpu_passes_and_writes_nothing(bin_dir: Path, tmp_path: Path) -> None:
    code, out, log = run(tmp_path, [])
    assert (code, log) == (0, "")
    assert "nvidia-smi: passed" in out and "preflight passed" in out


@pytest.mark.parametrize(("csv", "kind"), [
    ({"ecc.errors.uncorrected.volatile.total": "2"}, "ecc-dbe"),
    ({"remapped_rows.failure": "Yes"}, "row-remap-failure"),
    ({"temperature.gpu": "96"}, "thermal"),
])
def test_a_fault_fails_naming_the_gpu_and_the_finding(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, csv: dict[str, str], kind: str,
) -> None:
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(fakes.edit_capture(H100, tmp_path / "bad.txt", csv=csv)))
    code, _, log = run(tmp_path, [])
    assert code == preflight.EXIT_FAILED
    parsed = parse_message(log)
    assert parsed is not None and parsed.result == FAILED and parsed.check == kind
    assert len(parsed.gpus) == 1 and parsed.gpus[0].startswith("GPU-")
    assert "\n" not in log


def test_a_fault_that_may_wait_does_not_fail_the_pod(bin_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bad = fakes.edit_capture(H100, tmp_path / "bad.txt", csv={"remapped_rows.pending": "Yes"})
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(bad))
    assert run(tmp_path, [])[0] == 0  # a pending row remap may wait for a window (check says "degraded")


def test_a_lost_gpu_fails(bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_LOST", "0000:3B:00.0")
    code, _, log = run(tmp_path, [])
    parsed = parse_message(log)
    assert code == 1 and parsed is not None and parsed.check == "gpu-lost"


def test_only_the_pods_gpus_are_judged(bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = fakes.edit_capture(H100, tmp_path / "bad.txt", csv={"ecc.errors.uncorrected.volatile.total": "2"})
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(bad))
    assert run(tmp_path, [], env={"NVIDIA_VISIBLE_DEVICES": "0"})[0] == 1
    assert run(tmp_path, [], env={"NVIDIA_VISIBLE_DEVICES": "none"})[0] == preflight.EXIT_UNKNOWN
    assert run(tmp_path, ["--gpus", "all"], env={"NVIDIA_VISIBLE_DEVICES": "none"})[0] == 1


def test_pod_gpus_reads_the_runtimes_variables() -> None:
    assert preflight.pod_gpus({}) is None
    assert preflight.pod_gpus({"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "1"}) is None
    assert preflight.pod_gpus({"NVIDIA_VISIBLE_DEVICES": "GPU-a, GPU-b"}) == ("GPU-a", "GPU-b")
    assert preflight.pod_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == ("0", "1")
    assert preflight.pod_gpus({"NVIDIA_VISIBLE_DEVICES": "void"}) == ()
    assert preflight.pod_gpus({"NVIDIA_VISIBLE_DEVICES": "0"}, given="1") == ("1",)


@pytest.mark.parametrize("env", [{"FAKE_SMI_EXIT": "9", "FAKE_SMI_MESSAGE": DRIVER_GONE}, {}])
def test_no_driver_or_no_nvidia_smi_is_unknown_never_failed(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
) -> None:
    if env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    else:
        (bin_dir / "nvidia-smi").unlink()
    code, _, log = run(tmp_path, [])
    parsed = parse_message(log)
    assert code == preflight.EXIT_UNKNOWN and parsed is not None and parsed.result == UNKNOWN
    assert run(tmp_path, ["--on-unknown", "pass"])[0] == 0
    assert parse_message(run(tmp_path, ["--on-unknown", "pass"])[2]).result == UNKNOWN  # type: ignore[union-attr]


def test_an_nvidia_smi_that_hangs_is_unknown(bin_dir: Path, tmp_path: Path) -> None:
    slow = script(bin_dir, "slow-smi", SLEEP)
    code, _, log = run(tmp_path, ["--nvidia-smi", str(slow), "--timeout", "0.5"])
    assert code == preflight.EXIT_UNKNOWN and "did not answer within 0.5 s" in log


def test_dcgmi_failure_names_its_gpu_and_test(bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_dcgmi(bin_dir, monkeypatch, DCGM_FAIL, 226)
    code, _out, log = run(tmp_path, [])
    parsed = parse_message(log)
    assert code == 1 and parsed is not None
    assert (parsed.check, parsed.gpus) == ("dcgm-diag", ("0",))
    assert "GPU Memory: Pending page retirements detected on GPU 0." in parsed.text
    with_dcgmi(bin_dir, monkeypatch, DCGM_PASS, 0)
    assert run(tmp_path, [])[0] == 0
    assert run(tmp_path, ["--dcgmi", "no"])[1].count("dcgm-diag") == 0


def test_dcgmi_without_a_host_engine_is_unknown(bin_dir: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with_dcgmi(bin_dir, monkeypatch, "", 255, err="Error: unable to establish a connection to the specified host: "
                                                  "localhost\n")
    code, _, log = run(tmp_path, [])
    assert code == preflight.EXIT_UNKNOWN
    assert "dcgmi diag exited 255 with no test failed: Error: unable to establish a connection" in log


def test_dcgmi_out_of_time_is_unknown(bin_dir: Path, tmp_path: Path) -> None:
    slow = script(bin_dir, "slow-dcgmi", SLEEP)
    code, _, log = run(tmp_path, ["--dcgmi", str(slow), "--dcgm-timeout", "0.5"])
    assert code == preflight.EXIT_UNKNOWN and "did not finish within 0.5 s" in log


def test_the_operators_command(bin_dir: Path, tmp_path: Path) -> None:
    script(bin_dir, "allreduce", 'echo "busbw 12.1 GB/s below 300"; exit "$1"\n')
    assert run(tmp_path, ["--command", "allreduce 0"])[0] == 0
    code, _, log = run(tmp_path, ["--command", "allreduce 7"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
    parsed = parse_message(log)
    assert code == 1 and parsed is not None
    assert (parsed.check, parsed.gpus) == ("command", ("0",))
    assert parsed.text == "allreduce 7 exited 7: busbw 12.1 GB/s below 300"
    script(bin_dir, "hangs", SLEEP)
    code, _, log = run(tmp_path, ["--command", "hangs", "--command-timeout", "0.5"])
    assert code == preflight.EXIT_UNKNOWN and "hangs did not finish within 0.5 s" in log
    code, _, log = run(tmp_path, ["--command", "no-such-check"])
    assert code == preflight.EXIT_UNKNOWN and "cannot run no-such-check" in log


def test_a_failed_check_stops_the_run(bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(fakes.edit_capture(
        H100, tmp_path / "bad.txt", csv={"ecc.errors.uncorrected.volatile.total": "2"})))
    marker = tmp_path / "ran"
    script(bin_dir, "mark", f"touch {marker}\n")
    assert run(tmp_path, ["--command", "mark"])[0] == 1
    assert not marker.exists()  # the pod's start waits for no more checks once one failed


def test_usage_errors_exit_64(bin_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["preflight", "--timeout", "-1"])
    assert e.value.code == preflight.EXIT_USAGE
    assert run(tmp_path, ["--command", "'unclosed"])[0] == preflight.EXIT_USAGE


def test_the_message_is_one_bounded_line() -> None:
    from gpuremediate.vocab.preflight import MAX_MESSAGE, failed_message
    line = failed_message(("GPU-a",), "command", "x\n" * 5000)
    assert "\n" not in line and len(line.encode()) <= MAX_MESSAGE
    assert parse_message(line) is not None and parse_message("container main: CUDA error") is None


H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"  # the capture's one GPU, at 00000000:00:09.0


def test_a_gpu_lost_after_xid_79_fails_named_as_the_pod_knows_it(bin_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod was given two GPUs; nvidia-smi reads one and prints, for the other, what a real one prints after an
    XID 79 ("Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost.  Reboot...", exit 15)."""
    monkeypatch.setenv("FAKE_SMI_LOST", "0000:3B:00.0")
    code, out, log = run(tmp_path, [], env={"NVIDIA_VISIBLE_DEVICES": f"{H100_UUID},GPU-lost-one"})
    parsed = parse_message(log)
    assert code == preflight.EXIT_FAILED and parsed is not None, out
    assert (parsed.result, parsed.gpus, parsed.check) == (FAILED, ("GPU-lost-one",), "gpu-lost")
    assert "0000:3b:00.0" in parsed.text and "is lost" in parsed.text


def test_a_given_gpu_nvidia_smi_does_not_list_fails_never_fit(bin_dir: Path, tmp_path: Path) -> None:
    code, _, log = run(tmp_path, [], env={"NVIDIA_VISIBLE_DEVICES": f"{H100_UUID},GPU-gone"})
    assert code == preflight.EXIT_FAILED
    assert parse_message(log) == PreflightMessage(
        FAILED, ("GPU-gone",), "gpu-lost",
        "GPU GPU-gone given to the pod is not listed by nvidia-smi (it lists 1): the driver cannot reach it")
    assert run(tmp_path, [], env={"CUDA_VISIBLE_DEVICES": "0,1"})[0] == preflight.EXIT_FAILED  # by index too


def test_no_devices_found_fails_the_gpus_given_and_is_unknown_when_none_is_known(
        bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_EXIT", "6")
    monkeypatch.setenv("FAKE_SMI_MESSAGE", "No devices were found")
    code, _, log = run(tmp_path, [], env={"NVIDIA_VISIBLE_DEVICES": H100_UUID})
    parsed = parse_message(log)
    assert code == preflight.EXIT_FAILED and parsed is not None and parsed.gpus == (H100_UUID,)
    assert "No devices were found" in parsed.text
    code, _, log = run(tmp_path, ["--expect-gpus", "2"])
    parsed = parse_message(log)
    assert code == preflight.EXIT_FAILED and parsed is not None and parsed.check == "gpu-lost"
    assert parsed.text.startswith("the pod was given 2 GPU(s), nvidia-smi lists none")
    code, _, log = run(tmp_path, [])  # how many the pod was given is not known: it cannot tell
    assert code == preflight.EXIT_UNKNOWN and parse_message(log).result == UNKNOWN  # type: ignore[union-attr]


def test_fewer_gpus_than_expected_fails_without_a_list(bin_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(tmp_path, ["--expect-gpus", "1"])[0] == preflight.EXIT_FIT
    code, _, log = run(tmp_path, ["--expect-gpus", "2"], env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert code == preflight.EXIT_FAILED
    assert parse_message(log) == PreflightMessage(
        FAILED, (), "gpu-lost", "the pod was given 2 GPU(s), nvidia-smi lists 1: the driver cannot reach 1")
    monkeypatch.setenv("FAKE_SMI_LOST", "0000:3B:00.0")  # seen, as lost: the lost finding names it
    parsed = parse_message(run(tmp_path, ["--expect-gpus", "2"])[2])
    assert parsed is not None and parsed.gpus == ("pci0000:3b:00.0",) and parsed.check == "gpu-lost"


def test_fewer_gpus_under_mig_is_not_judged_by_count(bin_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(fakes.CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"))
    code, out, _ = run(tmp_path, ["--expect-gpus", "3"], env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert code == preflight.EXIT_FIT, out  # nvidia.com/gpu under MIG's single strategy counts MIG devices


def test_expect_gpus_must_be_a_count(bin_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        run(tmp_path, ["--expect-gpus", "two"])
