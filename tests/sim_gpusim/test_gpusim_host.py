"""gpu-sim playing the host for the node agent: the kernel log (kmsg records), the boot id and the
nvidia-smi stand-in, read by the agent's own parsers (gpuremediate.agent.kmsg, signals.nvidiasmi)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate.agent.kmsg import KmsgReader, parse_record
from gpuremediate.signals.nvidiasmi import NvidiaSmiError, NvidiaSmiSource
from sim.gpusim import GpuSim, SimError

NODE = "gpu-node-1"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[GpuSim]:
    s = GpuSim(port=0, control_port=0, files_dir=str(tmp_path))
    s.add_node(NODE, gpus=4, ip="127.0.0.11")
    s.start()
    yield s
    s.stop()


def _kmsg(sim: GpuSim) -> str:
    return str(Path(sim.host_dir(NODE)) / "kmsg")


def _in_process(sim: GpuSim, timeout_s: float = 5.0) -> NvidiaSmiSource:
    return NvidiaSmiSource(str(Path(sim.host_dir(NODE)) / "nvidia-smi"), NODE, timeout_s,
                           runner=sim.nvidia_smi_runner(NODE))


def test_every_kernel_xid_is_a_record_the_agent_parses_even_the_same_code_again(sim: GpuSim) -> None:
    before_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    sim.kernel_xid(NODE, 1, 79)
    sim.kernel_xid(NODE, 1, 79)
    events = KmsgReader(_kmsg(sim)).poll().events
    assert [(e.seq, e.bus_id, e.code) for e in events] == [(0, "0000:2a:00.0", 79), (1, "0000:2a:00.0", 79)]
    assert all(before_us <= e.usec <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000 for e in events)
    assert "DCGM_FI_DEV_XID_ERRORS" in sim.metrics(NODE)  # the exporter shows the last one


def test_records_have_the_dev_kmsg_shape(sim: GpuSim) -> None:
    record = sim.kernel_xid(NODE, 0, 48)
    assert record.startswith("4,0,") and record.endswith("\n")
    parsed = parse_record(record)
    assert parsed is not None and parsed.message.startswith("NVRM: Xid (PCI:0000:18:00): 48, ")


def test_the_stand_in_script_answers_as_the_in_process_runner_does(sim: GpuSim) -> None:
    sim.inject_dbe(NODE, 2, 3)
    script = NvidiaSmiSource(str(Path(sim.host_dir(NODE)) / "nvidia-smi"), NODE, 10.0).read_node()
    in_process = _in_process(sim).read_node()
    assert [g.gpu for g in script.gpus] == ["0", "1", "2", "3"]
    assert [(g.uuid, g.pci_bus_id, g.ecc_dbe_volatile) for g in script.gpus] == \
        [(g.uuid, g.pci_bus_id, g.ecc_dbe_volatile) for g in in_process.gpus]
    assert script.gpus[2].ecc_dbe_volatile == 3.0


def test_a_lost_gpu_vanishes_from_nvidia_smi_and_the_exporter_until_a_reboot(sim: GpuSim) -> None:
    sim.gpu_lost(NODE, 3)
    read = _in_process(sim).read_node()
    assert [g.gpu for g in read.gpus] == ["0", "1", "2"]
    assert [(g.pci_bus_id, g.reason) for g in read.lost_gpus] == [
        ("0000:5d:00.0", "GPU is lost. Reboot the system to recover this GPU")]
    assert 'gpu="3"' not in sim.metrics(NODE)
    assert "): 79, " in sim.kmsg_lines(NODE)[-1]
    assert sim.problems(NODE) == ["GPU 3: fell off the bus"]
    sim.reboot(NODE)
    assert len(_in_process(sim).read_node().gpus) == 4 and 'gpu="3"' in sim.metrics(NODE)


def test_nvidia_smi_names_a_gpu_lost_after_xid_79_as_the_real_one_does(sim: GpuSim) -> None:
    """The driver's line for each lost GPU after the others' rows, exit 15 (nvidia-smi(1): "GPU has fallen off the
    bus"); the script and the in-process runner alike. A GPU gone without the driver noticing is only not listed."""
    sim.gpu_lost(NODE, 1)
    script = str(Path(sim.host_dir(NODE)) / "nvidia-smi")
    for argv in (["--query-gpu=index,uuid", "--format=csv,noheader,nounits"], ["-L"]):
        proc = subprocess.run([script, *argv], capture_output=True, text=True, timeout=10, check=False)
        assert proc.returncode == 15 and proc.stdout.count("\n") == 4, proc
        assert proc.stdout.splitlines()[-1] == ("Unable to determine the device handle for GPU0000:2A:00.0: GPU is "
                                                "lost.  Reboot the system to recover this GPU")
        in_process = sim.nvidia_smi_runner(NODE)([script, *argv], 5.0)
        assert (proc.returncode, proc.stdout) == (in_process.returncode, in_process.stdout)
    sim.reboot(NODE)
    sim.gpu_lost(NODE, 1, log_xid=False)
    read = _in_process(sim).read_node()
    assert ([g.gpu for g in read.gpus], read.lost_gpus) == (["0", "2", "3"], ())
    sim.gpu_lost(NODE, 0, log_xid=False)
    sim.gpu_lost(NODE, 2, log_xid=False)
    sim.gpu_lost(NODE, 3, log_xid=False)
    with pytest.raises(NvidiaSmiError, match="exited 6"):
        _in_process(sim).read_node()


def test_a_driver_hang_times_nvidia_smi_out_and_a_release_answers_again(sim: GpuSim) -> None:
    sim.driver_hang(NODE)
    with pytest.raises(NvidiaSmiError, match="did not answer"):
        _in_process(sim, timeout_s=0.2).read_node()
    script = str(Path(sim.host_dir(NODE)) / "nvidia-smi")
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([script, "-L"], capture_output=True, timeout=0.5, check=False)
    sim.driver_hang(NODE, False)
    assert len(_in_process(sim).read_node().gpus) == 4


def test_a_reboot_ends_a_driver_hang_and_brings_a_hung_exporter_back(sim: GpuSim) -> None:
    sim.driver_hang(NODE)
    sim.set_down(NODE, "hang")
    sim.reboot(NODE)
    assert sim.node(NODE).down is None and not sim.node(NODE).driver_hung
    assert len(_in_process(sim, timeout_s=0.5).read_node().gpus) == 4


def test_a_reboot_starts_a_new_kernel_log_under_a_new_boot_id(sim: GpuSim) -> None:
    boot_id = Path(sim.host_dir(NODE), "boot_id").read_text()
    sim.kernel_xid(NODE, 0, 79)
    sim.reboot(NODE)
    assert Path(sim.host_dir(NODE), "boot_id").read_text() != boot_id
    assert Path(_kmsg(sim)).read_text() == "" and sim.kmsg_lines(NODE) == []
    assert sim.kernel_xid(NODE, 0, 79).startswith("4,0,")  # SEQ starts again each boot


def _post(sim: GpuSim, path: str, body: object) -> int:
    req = urllib.request.Request(f"{sim.control_url}{path}", data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_the_fault_api_over_http(sim: GpuSim) -> None:
    assert _post(sim, "/kernel-xid", {"node": NODE, "gpu": 0, "xid": 13}) == 200
    assert _post(sim, "/gpu-lost", {"node": NODE, "gpu": 1, "log_xid": False}) == 200
    assert _post(sim, "/driver-hang", {"node": NODE}) == 200
    assert len(sim.kmsg_lines(NODE)) == 1 and sim.node(NODE).driver_hung and sim.node(NODE).gpus[1].lost
    assert _post(sim, "/driver-hang", {"node": NODE, "hung": False}) == 200 and not sim.node(NODE).driver_hung
    assert _post(sim, "/kernel-xid", {"node": NODE, "gpu": 0, "xid": 0}) == 400
    assert _post(sim, "/driver-hang", {"node": NODE, "hung": "yes"}) == 400


def test_host_files_need_a_files_dir() -> None:
    s = GpuSim(port=0)
    s.add_node(NODE, gpus=1, ip="127.0.0.11")
    assert s.kernel_xid(NODE, 0, 31).startswith("4,0,")  # kept in memory all the same
    with pytest.raises(SimError, match="files_dir"):
        s.host_dir(NODE)
