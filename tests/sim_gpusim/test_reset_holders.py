"""gpu-sim refuses a reset while a client holds the node's GPUs, as nvidia-smi does (NVML_ERROR_IN_USE)."""

from __future__ import annotations

from sim.gpusim import GpuSim


def test_a_reset_is_refused_while_a_client_holds_the_gpus() -> None:
    sim = GpuSim(port=0)
    sim.add_node("n1", gpus=2, ip="127.0.0.1")
    assert sim.reset_refusal("n1", [1]) == ""
    sim.hold("n1", "nvidia-device-plugin")
    sim.hold("n1", "nv-hostengine")
    refusal = sim.reset_refusal("n1", [1])
    assert "In use by another client" in refusal
    assert "nv-hostengine, nvidia-device-plugin" in refusal
    assert sim.node("n1").gpu(1).pci_bus_id in refusal
    sim.hold("n1", "nvidia-device-plugin", held=False)
    sim.hold("n1", "nv-hostengine", held=False)
    assert sim.reset_refusal("n1", [1]) == ""
