"""gpu-sim's NVL72 racks (issue 28): clique, fabric states, Fabric Manager down, IMEX down, as the controller reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuremediate.signals.dcgm import readings_from_samples
from gpuremediate.signals.exposition import parse
from gpuremediate.signals.fabric import STATE_COMPLETED, STATE_IN_PROGRESS, STATE_NOT_STARTED
from gpuremediate.signals.fabric_model import GpuFabric
from gpuremediate.signals.nvidiasmi import NvidiaSmiSource
from sim.gpusim import GpuSim, SimError


def fabrics(sim: GpuSim, node: str) -> list[GpuFabric | None]:
    samples = parse(sim.metrics(node), strict=False).samples
    [readings] = readings_from_samples(samples, node=node, source="exporter", observed_at=1.0)
    return [g.fabric for g in readings.gpus]


@pytest.fixture
def sim(tmp_path: Path) -> GpuSim:
    return GpuSim(port=0, files_dir=str(tmp_path))  # not started: metrics() and nvidia-smi are read directly


def test_a_rack_is_18_trays_of_4_gpus_in_one_domain(sim: GpuSim) -> None:
    trays = sim.add_nvl72_rack("rack-a")
    assert len(trays) == 18 and {len(sim.node(t).gpus) for t in trays} == {4}
    cliques = {sim.node(t).fabric.clique for t in trays}  # type: ignore[union-attr]
    assert len(cliques) == 1
    [tray0] = {f for f in fabrics(sim, trays[0])}
    assert tray0 is not None and tray0.clique == cliques.pop()
    assert (tray0.state, tray0.status, tray0.imex_daemon, tray0.imex_domain) == (STATE_COMPLETED, "Success", 5, "UP")


def test_a_plain_node_has_no_fabric_series(sim: GpuSim) -> None:
    sim.add_node("hgx", gpus=8)
    assert "FABRIC" not in sim.metrics("hgx") and "IMEX" not in sim.metrics("hgx")
    assert fabrics(sim, "hgx") == [None] * 8
    with pytest.raises(SimError, match="no NVLink domain"):
        sim.inject("hgx", 0, "fabric-manager-down")


def test_faults_and_their_repairs(sim: GpuSim) -> None:
    a, b = sim.add_nvl72_rack("rack-a", trays=2)
    sim.inject(a, 0, "fabric-manager-down")
    assert {f.state for f in fabrics(sim, a) if f} == {STATE_NOT_STARTED}
    assert {f.state for f in fabrics(sim, b) if f} == {STATE_COMPLETED}  # the other tray is untouched
    assert sim.problems(a) and not sim.problems(b)
    sim.reboot(a)
    assert {f.state for f in fabrics(sim, a) if f} == {STATE_COMPLETED} and not sim.problems(a)
    sim.inject(b, 1, "fabric-failure")
    sim.inject(b, 2, "fabric-stuck")
    got = fabrics(sim, b)
    assert got[1] is not None and got[1].status == "Failure (error code 3)"
    assert got[2] is not None and got[2].state == STATE_IN_PROGRESS
    sim.reset_gpus(b, [1, 2])
    assert not sim.problems(b)
    sim.inject(b, 0, "imex-down")
    assert {(f.imex_daemon, f.imex_domain) for f in fabrics(sim, b) if f} == {(2, "DOWN")}


def smi(sim: GpuSim, node: str) -> NvidiaSmiSource:
    return NvidiaSmiSource(str(Path(sim.host_dir(node)) / "nvidia-smi"), node, 5.0, runner=sim.nvidia_smi_runner(node))


def test_the_nvidia_smi_stand_in_answers_the_fabric_fields(sim: GpuSim) -> None:
    [tray] = sim.add_nvl72_rack("rack-a", trays=1)
    sim.add_node("hgx", gpus=1)
    sim.inject(tray, 3, "fabric-failure")
    read = smi(sim, tray).read_node()
    states = [(g.fabric.state, g.fabric.status) for g in read.gpus if g.fabric]
    assert states == [(STATE_COMPLETED, "Success")] * 3 + [(STATE_COMPLETED, "Insufficient Resources")]
    plain = smi(sim, "hgx").read_node()
    assert [g.fabric for g in plain.gpus] == [None]


def test_the_command_line_serves_racks_and_a_tray() -> None:
    from sim.gpusim import build_parser, sim_from_args

    many = sim_from_args(build_parser().parse_args(["--nodes", "1", "--nvl72-racks", "2", "--port", "0"]))
    assert len(many.nodes()) == 1 + 2 * 18 and many.node("rack-2-tray-18").fabric is not None
    one = sim_from_args(build_parser().parse_args(["--node", "t1", "--gpus", "4", "--port", "0",
                                                   "--clique", "c0ffee00-0000-4000-8000-000000000001.7"]))
    assert one.node("t1").fabric is not None and one.node("t1").fabric.clique_id == 7
    with pytest.raises(SimError, match="--clique"):
        sim_from_args(build_parser().parse_args(["--node", "t2", "--port", "0", "--clique", "nope"]))
