"""gpu-sim writes MIG series as dcgm-exporter does (issue 13): one series per GPU instance with GPU_I_ID and
GPU_I_PROFILE, the parent's gpu and UUID labels, the pod on its own instance's series only."""

from __future__ import annotations

import pytest

from gpuremediate.signals.dcgm import readings_from_samples
from gpuremediate.signals.exposition import parse
from gpuremediate.signals.model import PodRef
from sim.gpusim import GpuSim, SimError, new_node, render, smi_state


def test_mig_instances_are_series_of_their_own_under_the_parent() -> None:
    sim = GpuSim()
    sim.add_node("n1", gpus=2, ip="127.0.0.1")
    sim.set_mig("n1", 1, ["3g.40gb", "1g.10gb"])
    sim.set_mig_pod("n1", 1, 2, "w", "notebook")
    sim.set_pod("n1", 0, "w", "whole")
    sim.inject_xid("n1", 1, 79)
    text = sim.metrics("n1")
    temps = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert len(temps) == 3  # GPU 0 whole, GPU 1 as two instances (no series of its own)
    assert 'GPU_I_PROFILE="1g.10gb",GPU_I_ID="2"' in text
    [readings] = readings_from_samples(parse(text).samples, node="n1", source="exporter", observed_at=1.0)
    parent = sim.node("n1").gpu(1).uuid
    by_instance = {(g.gpu, g.mig_instance): g for g in readings.gpus}
    assert set(by_instance) == {("0", None), ("1", "1"), ("1", "2")}
    assert by_instance[("1", "2")].uuid == parent and by_instance[("1", "2")].pods == (PodRef("w", "notebook"),)
    assert by_instance[("1", "1")].pods == () and by_instance[("0", None)].pods == (PodRef("w", "whole"),)
    assert by_instance[("1", "1")].xid == 79 and by_instance[("1", "2")].xid == 79  # a device field: the GPU's


def test_mig_mode_shows_in_the_nvidia_smi_stand_in() -> None:
    node = new_node("n1", 2, "127.0.0.1")
    node.gpus[0].mig = []
    sim = GpuSim()
    sim.add_node("n1", gpus=2, ip="127.0.0.1")
    sim.set_mig("n1", 0, ["7g.80gb"])
    modes = [g["mig.mode.current"] for g in smi_state(sim.node("n1"))["gpus"]]
    assert modes == ["Enabled", "Disabled"]
    assert "GPU_I_ID" not in render(node)


def test_a_pod_on_an_instance_that_does_not_exist_is_refused() -> None:
    sim = GpuSim()
    sim.add_node("n1", gpus=1, ip="127.0.0.1")
    sim.set_mig("n1", 0, ["1g.10gb"])
    with pytest.raises(SimError, match="no MIG instance 5"):
        sim.set_mig_pod("n1", 0, 5, "w", "p")
