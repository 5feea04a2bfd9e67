"""nvidia-smi readings: each real capture replayed by a fake nvidia-smi, placeholders, old drivers, failures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.signals import nvidiasmi
from gpuremediate.signals.nvidiasmi import NvidiaSmiError, NvidiaSmiSource
from sim.waiting import wait_for


def _load_fakes() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "fakes.py"
    spec = importlib.util.spec_from_file_location("nvsmi_fakes", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["nvsmi_fakes"] = module
    spec.loader.exec_module(module)
    return module


fakes = _load_fakes()
CAPTURES = fakes.CAPTURES
H100 = CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H100_MIG = CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
H200 = CAPTURES / "linux-x86_64__nvidia-h200__590.48.01.txt"
RTX = CAPTURES / "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86.txt"
ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = fakes.install_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("FAKE_SMI_LOG", str(tmp_path / "calls.jsonl"))
    for var in ("FAKE_SMI_EXIT", "FAKE_SMI_REJECT", "FAKE_SMI_STATE", "FAKE_SMI_LOST", "FAKE_SMI_WRAPPER_PIDFILE"):
        monkeypatch.delenv(var, raising=False)
    return path


def calls(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]


def read(smi: Path, monkeypatch: pytest.MonkeyPatch, capture: Path, state: str = "load") -> nvidiasmi.NodeReadings:
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(capture))
    monkeypatch.setenv("FAKE_SMI_STATE", state)
    return NvidiaSmiSource(path=str(smi), node="ws-1", clock=lambda: 1000.0).read_node()


# capture, state, model, bus, driver, gpu temp, memory temp, dbe, failure, pending, uncorrectable rows, MIG
CASES = [
    (H100, "load", "NVIDIA H100 80GB HBM3", "00000000:00:09.0", "590.48.01", 59, 54, 0, 0, 0, 0, 0),
    (H100, "idle", "NVIDIA H100 80GB HBM3", "00000000:00:09.0", "590.48.01", 41, 48, 0, 0, 0, 0, 0),
    (H100_MIG, "load", "NVIDIA H100 80GB HBM3", "00000000:00:09.0", "590.48.01", 53, 59, 0, None, None, None, 1),
    (H200, "load", "NVIDIA H200", "00000000:83:00.0", "590.48.01", 52, 40, 0, 0, 0, 0, 0),
    (H200, "idle", "NVIDIA H200", "00000000:83:00.0", "590.48.01", 28, 32, 0, 0, 0, 0, 0),
    (RTX, "load", "NVIDIA GeForce RTX 2080 SUPER", "00000000:0C:00.0", "591.86", 45, None, None, None, None, None,
     None),
]


@pytest.mark.parametrize(
    ("capture", "state", "model", "bus", "driver", "temp", "mem", "dbe", "fail", "pend", "rows", "mig"), CASES
)
def test_each_capture_maps_to_readings(
    smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capture: Path, state: str, model: str, bus: str,
    driver: str, temp: float, mem: float | None, dbe: float | None, fail: float | None, pend: float | None,
    rows: float | None, mig: float | None,
) -> None:
    readings = read(smi, monkeypatch, capture, state)
    assert (readings.node, readings.source, readings.status) == ("ws-1", "nvidia-smi", "ok")
    assert readings.observed_at == 1000.0
    assert readings.meta["driver_version"] == driver
    (gpu,) = readings.gpus
    assert (gpu.gpu, gpu.uuid, gpu.model, gpu.pci_bus_id) == ("0", ZERO_UUID, model, bus)
    assert (gpu.gpu_temp, gpu.memory_temp) == (temp, mem)
    assert (gpu.ecc_dbe_volatile, gpu.row_remap_failure, gpu.row_remap_pending) == (dbe, fail, pend)
    assert gpu.uncorrectable_remapped_rows == rows
    assert gpu.extra.get("DCGM_FI_DEV_MIG_MODE") == mig
    assert gpu.xid is None and not gpu.xid_counts  # nvidia-smi does not report XIDs
    query = [f"--query-gpu={','.join(nvidiasmi.QUERY_FIELDS)}", "--format=csv,noheader,nounits"]
    optional = [f"--query-gpu={','.join(nvidiasmi.OPTIONAL_FIELDS)}", "--format=csv,noheader,nounits"]
    # the fabric and recovery-action fields are asked apart, in one call; MIG on: its devices are listed
    assert calls(tmp_path) == ([query, optional, ["-L"]] if mig else [query, optional])
    assert gpu.extra["DCGM_FI_DEV_GPU_RECOVERY_ACTION"] == 0.0  # "None" in every capture (driver 590 / 591)
    # HGX H100/H200 alone: registered (Completed, Success), in no multi-node NVLink domain (clique 0, zero UUID)
    seen = None if gpu.fabric is None else (gpu.fabric.state, gpu.fabric.status, gpu.fabric.clique)
    assert seen == (None if capture == RTX else ("completed", "Success", None))
    assert gpu.mig_devices == (("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb") if mig else ())


def test_older_driver_without_remap_fields_falls_back_to_q(
    smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    edited = fakes.edit_capture(H200, tmp_path / "h200.txt", q=[
        ("        Uncorrectable Error                            : 0",
         "        Uncorrectable Error                            : 3"),
        ("        Pending                                        : No\n        Remapping",
         "        Pending                                        : Yes\n        Remapping"),
    ])
    monkeypatch.setenv("FAKE_SMI_REJECT", "remapped_rows")
    (gpu,) = read(smi, monkeypatch, edited).gpus
    assert (gpu.row_remap_pending, gpu.row_remap_failure, gpu.uncorrectable_remapped_rows) == (1.0, 0.0, 3.0)
    assert gpu.extra["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 0.0
    assert gpu.gpu_temp == 52  # from the reduced query
    made = calls(tmp_path)
    assert [c[0] for c in made] == [
        f"--query-gpu={','.join(nvidiasmi.QUERY_FIELDS)}", f"--query-gpu={','.join(nvidiasmi.BASE_FIELDS)}", "-q"
    ]


def test_driver_not_loaded_is_an_error_with_its_message(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.")
    monkeypatch.setenv("FAKE_SMI_EXIT", "9")
    monkeypatch.setenv("FAKE_SMI_MESSAGE", message)
    with pytest.raises(NvidiaSmiError) as info:
        read(smi, monkeypatch, H100)
    assert info.value.exit_code == 9
    assert info.value.reason == "nvidia-smi exited 9 (the NVIDIA driver is not loaded)"
    assert info.value.output == message


def test_unexpected_output_shape_is_an_error(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NvidiaSmiError, match="line 1 has 2 cells, expected 3"):
        nvidiasmi.parse_query_csv("0, GPU-x\n", ("index", "uuid", "name"))


def test_hung_nvidia_smi_times_out(tmp_path: Path) -> None:
    slow = tmp_path / "slow-smi"
    slow.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(5)\n")
    slow.chmod(0o755)
    with pytest.raises(NvidiaSmiError, match=r"did not answer within 0\.3 s"):
        NvidiaSmiSource(path=str(slow), timeout_s=0.3).read_node()


def test_a_lost_gpu_is_named_and_the_others_still_read(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_LOST", "0000:3B:00.0")
    readings = read(smi, monkeypatch, H200)
    assert [(g.pci_bus_id, g.gpu_temp) for g in readings.gpus] == [("00000000:83:00.0", 52.0)]
    [lost] = readings.lost_gpus
    assert lost.pci_bus_id == "0000:3b:00.0" and lost.reason.startswith("GPU is lost. Reboot the system")


def test_a_lost_gpu_on_an_older_driver_still_reads_the_others_through_q(
    smi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SMI_REJECT", "remapped_rows")
    monkeypatch.setenv("FAKE_SMI_LOST", "0000:3b:00.0")
    readings = read(smi, monkeypatch, H200)
    [gpu] = readings.gpus
    assert (gpu.gpu_temp, gpu.row_remap_pending, gpu.uncorrectable_remapped_rows) == (52.0, 0.0, 0.0)  # from -q
    assert [lost.pci_bus_id for lost in readings.lost_gpus] == ["0000:3b:00.0"]


def test_exit_15_without_a_name_is_still_a_lost_gpu(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_LOST", "-")
    readings = read(smi, monkeypatch, H200)
    assert len(readings.gpus) == 1
    [lost] = readings.lost_gpus
    assert lost.pci_bus_id == "" and "exited 15" in lost.reason


def test_a_timed_out_wrapper_is_killed_with_its_child(smi: Path, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_SMI_WRAPPER_PIDFILE", str(pidfile))
    with pytest.raises(NvidiaSmiError, match=r"did not answer within 5 s"):
        NvidiaSmiSource(path=str(smi), timeout_s=5).read_node()
    wait_for(pidfile.exists, timeout=10, describe="the wrapper's child pid file")
    child = int(pidfile.read_text())
    wait_for(lambda: not _alive(child), timeout=10, describe=f"child {child} of the wrapper to be gone")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_not_executable(tmp_path: Path) -> None:
    plain = tmp_path / "nvidia-smi"
    plain.write_text("not a program")
    with pytest.raises(NvidiaSmiError, match="not executable"):
        NvidiaSmiSource(path=str(plain)).read_node()


# ------------------------------------------------------------------ finding nvidia-smi


def test_found_on_path(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(smi.parent))
    assert nvidiasmi.find_nvidia_smi() == str(smi)


def test_missing_on_linux() -> None:
    with pytest.raises(NvidiaSmiError, match="nvidia-smi not found on PATH"):
        nvidiasmi.find_nvidia_smi(platform="linux", which=lambda _: None, is_file=lambda _: True)


def test_explicit_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(NvidiaSmiError, match=f"nvidia-smi not found at {tmp_path / 'nope'}"):
        nvidiasmi.find_nvidia_smi(str(tmp_path / "nope"))


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        ({r"C:\Windows\System32\nvidia-smi.exe", r"C:\Program Files\NVIDIA Corporation\NVSMI\nvidia-smi.exe"},
         r"C:\Windows\System32\nvidia-smi.exe"),
        ({r"C:\Program Files\NVIDIA Corporation\NVSMI\nvidia-smi.exe"},
         r"C:\Program Files\NVIDIA Corporation\NVSMI\nvidia-smi.exe"),
    ],
)
def test_windows_locations_in_order(present: set[str], expected: str) -> None:
    found = nvidiasmi.find_nvidia_smi(platform="win32", which=lambda _: None, is_file=lambda p: p in present)
    assert found == expected


def test_windows_path_wins_and_missing_everywhere() -> None:
    assert nvidiasmi.find_nvidia_smi(platform="win32", which=lambda _: r"D:\x\nvidia-smi.exe",
                                     is_file=lambda _: True) == r"D:\x\nvidia-smi.exe"
    with pytest.raises(NvidiaSmiError, match=r"nvidia-smi.exe not found"):
        nvidiasmi.find_nvidia_smi(platform="win32", which=lambda _: None, is_file=lambda _: False)


# ------------------------------------------------------------------ cells


@pytest.mark.parametrize(
    "raw",
    ["[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "[GPU requires reset]",
     "Requested functionality has been deprecated", "", "  ", None],
)
def test_placeholders_are_missing(raw: str | None) -> None:
    assert nvidiasmi.cell(raw) is None
    assert nvidiasmi.number(raw) is None
    assert nvidiasmi.flag(raw) is None


@pytest.mark.parametrize(
    ("raw", "expected"), [("45", 45.0), ("45 C", 45.0), ("69.85", 69.85), ("0x1F", 31.0), ("lots", None)]
)
def test_numbers(raw: str, expected: float | None) -> None:
    assert nvidiasmi.number(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"), [("Yes", 1.0), ("No", 0.0), ("Enabled", 1.0), ("Disabled", 0.0), ("maybe", None)]
)
def test_flags(raw: str, expected: float | None) -> None:
    assert nvidiasmi.flag(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("00000000:3B:00.0", "0000:3b:00.0"), ("0000:3b:00", "0000:3b:00.0"), ("PCI:0000:3b:00", "0000:3b:00.0"),
     ("3b:00.0", "0000:3b:00.0"), ("garbage", "garbage")],
)
def test_bus_ids_normalise(raw: str, expected: str) -> None:
    assert nvidiasmi.normalise_bus_id(raw) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "0", "7", "Yes", "No",
                                 "12.5", "Enabled", "junk"]), min_size=len(nvidiasmi.QUERY_FIELDS),
                max_size=len(nvidiasmi.QUERY_FIELDS)))
def test_any_row_of_cells_maps_without_inventing_values(cells: list[str]) -> None:
    row = nvidiasmi.parse_query_csv(", ".join(cells), nvidiasmi.QUERY_FIELDS)[0]
    readings = nvidiasmi.node_readings("n", [row], {}, 0.0)
    (gpu,) = readings.gpus
    by_field = dict(zip(nvidiasmi.QUERY_FIELDS, cells, strict=True))
    for attr, fieldname in (("gpu_temp", "temperature.gpu"),
                            ("ecc_dbe_volatile", "ecc.errors.uncorrected.volatile.total"),
                            ("uncorrectable_remapped_rows", "remapped_rows.uncorrectable")):
        raw = by_field[fieldname]
        expected = float(raw) if raw.replace(".", "").isdigit() else None
        if attr == "gpu_temp" and expected == 0:
            expected = None  # 0 C: a sensor that is not there
        assert getattr(gpu, attr) == expected
    expected_flag = {"Yes": 1.0, "No": 0.0, "Enabled": 1.0, "0": 0.0}.get(by_field["remapped_rows.failure"])
    assert gpu.row_remap_failure == expected_flag


@pytest.mark.parametrize(("fieldname", "raw"), [
    ("temperature.gpu", "0"), ("temperature.memory", "0"), ("temperature.gpu", "4294967295"),
    ("ecc.errors.uncorrected.volatile.total", "2147483632"), ("ecc.errors.uncorrected.volatile.total", "-1"),
    ("remapped_rows.uncorrectable", "4294967295"),
])
def test_implausible_cells_are_missing_as_from_the_exporter(fieldname: str, raw: str) -> None:
    cells = {name: "[N/A]" for name in nvidiasmi.QUERY_FIELDS} | {"index": "0", fieldname: raw}
    row = nvidiasmi.parse_query_csv(", ".join(cells.values()), nvidiasmi.QUERY_FIELDS)[0]
    (gpu,) = nvidiasmi.node_readings("n", [row], {}, 0.0).gpus
    assert (gpu.gpu_temp, gpu.memory_temp, gpu.ecc_dbe_volatile, gpu.uncorrectable_remapped_rows) == (None,) * 4


def test_q_parser_reads_nested_sections() -> None:
    text = fakes_section(H100, "load :: query (-q)")
    gpus = nvidiasmi.parse_q(text)
    assert list(gpus) == ["0000:00:09.0"]
    q = gpus["0000:00:09.0"]
    assert q["Remapped Rows.Remapping Failure Occurred"] == "No"
    assert q["Temperature.GPU Current Temp"] == "59 C"
    assert q["ECC Errors.Volatile.DRAM Uncorrectable"] == "0"
    assert q["Remapped Rows.Bank Remap Availability Histogram.Max"] == "2560 bank(s)"
    mig = nvidiasmi.parse_q(fakes_section(H100_MIG, "load :: query (-q)"))["0000:00:09.0"]
    assert mig["MIG Mode.Current"] == "Enabled" and mig["Remapped Rows"] == "N/A"


def fakes_section(capture: Path, title: str) -> str:
    blocks = capture.read_text().split(fakes.RULE + "\n")
    for i in range(1, len(blocks) - 1, 2):
        if blocks[i].splitlines()[0].lstrip("# ").strip() == title:
            return str(blocks[i + 1])
    raise AssertionError(f"{title} not in {capture.name}")


def test_source_protocol_returns_one_node(smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(H200))
    result = NvidiaSmiSource(path=str(smi), node="box").read()
    assert [r.node for r in result] == ["box"]


# --- issue 45: "GPU Recovery Action" (driver 570+), as [recovery_action] reads DCGM's field 1523 -----------------


@pytest.mark.parametrize(("words", "value"), [
    ("None", 0.0), ("Reset", 1.0), ("GPU Reset Required", 1.0), ("Reboot", 2.0), ("Node Reboot Required", 2.0),
    ("Drain P2P", 3.0), ("Drain and Reset", 4.0), ("Recover IMEX Domain", 5.0), ("[N/A]", None),
    ("[Unknown Error]", None)])
def test_the_recovery_action_cell_reads_as_nvml_value(
    smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, words: str, value: float | None
) -> None:
    edited = fakes.edit_capture(H200, tmp_path / "h200.txt", csv={"gpu_recovery_action": words})
    readings = read(smi, monkeypatch, edited)
    assert readings.gpus[0].extra.get("DCGM_FI_DEV_GPU_RECOVERY_ACTION") == value
    assert readings.problems == ()


def test_a_recovery_action_word_not_known_is_a_problem_not_a_value(
    smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    edited = fakes.edit_capture(H200, tmp_path / "h200.txt", csv={"gpu_recovery_action": "Replace Tray"})
    readings = read(smi, monkeypatch, edited)
    assert "DCGM_FI_DEV_GPU_RECOVERY_ACTION" not in readings.gpus[0].extra
    [problem] = readings.problems
    assert problem == "GPU 0: GPU Recovery Action 'Replace Tray' is not one this version knows (not judged)"


def test_a_driver_without_the_recovery_action_still_gives_the_fabric_and_is_asked_once(
    smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAKE_SMI_REJECT", "gpu_recovery_action")  # a driver before R570 with the fabric API
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(H200))
    source = NvidiaSmiSource(path=str(smi), node="ws-1", clock=lambda: 1000.0)
    first, second = source.read_node(), source.read_node()
    for readings in (first, second):
        (gpu,) = readings.gpus
        assert gpu.fabric is not None and gpu.fabric.state == "completed"
        assert "DCGM_FI_DEV_GPU_RECOVERY_ACTION" not in gpu.extra
    asked = [c[0].removeprefix("--query-gpu=") for c in calls(tmp_path)]
    fabric, optional = ",".join(nvidiasmi.FABRIC_FIELDS), ",".join(nvidiasmi.OPTIONAL_FIELDS)
    main = ",".join(nvidiasmi.QUERY_FIELDS)
    assert asked == [main, optional, fabric, "index,gpu_recovery_action", main, fabric]


def test_an_older_driver_gives_the_recovery_action_through_q(
    smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    edited = fakes.edit_capture(H200, tmp_path / "h200.txt", q=[
        ("    GPU Recovery Action                                : None",
         "    GPU Recovery Action                                : Reboot")])
    monkeypatch.setenv("FAKE_SMI_REJECT", "remapped_rows")
    (gpu,) = read(smi, monkeypatch, edited).gpus
    assert gpu.extra["DCGM_FI_DEV_GPU_RECOVERY_ACTION"] == 2.0
