"""gpu-sim's commands for the kind overlay's Jobs: reset a Job's $(GPU_IDS), validate a node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sim import gpusim
from sim.gpusim import GpuSim


@pytest.fixture
def sim() -> Iterator[GpuSim]:
    s = GpuSim(port=0)
    s.add_node("gpu-node-1", gpus=4, ip="127.0.0.71")
    s.start()
    yield s
    s.stop()


def _url(sim: GpuSim) -> str:
    return f"http://127.0.0.71:{sim.port}"


def test_reset_with_a_gpu_list_resets_exactly_those(sim: GpuSim) -> None:
    for gpu in range(4):
        sim.inject_xid("gpu-node-1", gpu, 79)
    assert gpusim.main(["reset", "--url", _url(sim), "--node", "gpu-node-1", "--gpus=0,3"]) == 0
    assert [g.xid for g in sim.node("gpu-node-1").gpus] == [None, 79, 79, None]


def test_reset_with_an_empty_list_resets_every_gpu(sim: GpuSim) -> None:
    for gpu in range(4):
        sim.inject_dbe("gpu-node-1", gpu)
    assert gpusim.main(["reset", "--url", _url(sim), "--node", "gpu-node-1", "--gpus="]) == 0
    assert [g.dbe_vol for g in sim.node("gpu-node-1").gpus] == [0, 0, 0, 0]


def test_reset_rejects_a_bad_list_and_an_unknown_gpu(sim: GpuSim, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpusim.main(["reset", "--url", _url(sim), "--node", "gpu-node-1", "--gpus=0,x"]) == 2
    assert "--gpus: expected comma-separated GPU indexes" in capsys.readouterr().err
    assert gpusim.main(["reset", "--url", _url(sim), "--node", "gpu-node-1", "--gpus=7"]) == 1
    assert "has no GPU 7" in capsys.readouterr().err


def test_reset_needs_gpu_or_gpus_not_both(sim: GpuSim) -> None:
    with pytest.raises(SystemExit):
        gpusim.main(["reset", "--url", _url(sim), "--node", "gpu-node-1"])
    with pytest.raises(SystemExit):
        gpusim.main(["reset", "--url", _url(sim), "--node", "gpu-node-1", "--gpu", "1", "--gpus", "1"])


def test_validate_fails_while_a_fault_shows_and_passes_after_repair(
    sim: GpuSim, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["validate", "--url", _url(sim), "--node", "gpu-node-1"]
    assert gpusim.main(args) == 0
    sim.inject_xid("gpu-node-1", 2, 79)
    sim.inject_row_remap_pending("gpu-node-1", 1)
    capsys.readouterr()
    assert gpusim.main(args) == 1
    out = capsys.readouterr().out
    assert "GPU 2: XID 79" in out and "GPU 1: row remap pending" in out
    sim.reboot("gpu-node-1")
    assert gpusim.main(args) == 0


def test_validate_keeps_failing_on_a_remap_failure_a_reset_cannot_fix(sim: GpuSim) -> None:
    sim.inject_row_remap_failure("gpu-node-1", 0)
    sim.reboot("gpu-node-1")
    assert sim.problems("gpu-node-1") == ["GPU 0: row remap failure"]


def test_validate_of_an_unknown_node_is_an_error(sim: GpuSim, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpusim.main(["validate", "--url", _url(sim), "--node", "ghost"]) == 1
    assert "unknown node 'ghost'" in capsys.readouterr().err
