"""The NIC readers and judge on sysfs trees and node_exporter output that the Prometheus projects keep as their own
test data (data/prometheus-fixtures, its README: source, commit, licence, and what is hand-written in them).

Values are asserted against the archived files' text, read here from the archive itself, not retyped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuremediate.policy.network import NetworkJudge, NetworkPolicy
from gpuremediate.signals import nic, prom_nic
from gpuremediate.signals.exposition import Sample, parse
from gpuremediate.vocab.findings import KIND_NIC_DOWN

DATA = Path(__file__).parent / "data" / "prometheus-fixtures"
NODE_EXPORTER_SYS = DATA / "node_exporter-sys-class-infiniband.ttar"
NODE_EXPORTER_OUTPUT = DATA / "node_exporter-e2e-output-infiniband.txt"
PROCFS_SYS = DATA / "procfs-sys-class-infiniband.ttar"
PROCFS_NET = DATA / "procfs-sys-class-net-eth0.ttar"
NODE_LABELS = ("Hostname", "hostname", "node", "kubernetes_node")


def ttar_files(archive: Path) -> dict[str, str]:
    """Each file of a ttar archive (github.com/ideaship/ttar, the format both projects keep sysfs trees in) by its
    path, as the ``ttar -x`` script writes it: ``Lines: n`` lines follow, each with its newline unless it ends in
    ``EOF``."""
    files: dict[str, str] = {}
    lines = archive.read_text(encoding="utf-8").split("\n")
    path, index = "", 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if line.startswith("Path: "):
            path = line[len("Path: "):]
        elif line.startswith("Lines: "):
            body = []
            for text in lines[index:index + int(line[len("Lines: "):])]:
                assert "NULLBYTE" not in text and "\\EOF" not in text, "escapes this reader does not undo"
                body.append(text[:-3] if text.endswith("EOF") else text + "\n")
            index += len(body)
            files[path] = "".join(body)
    return files


def extract(archive: Path, into: Path, strip: str) -> Path:
    """The archive's tree below ``into`` (directories, files, symlinks), its paths less the ``strip`` prefix."""
    lines = archive.read_text(encoding="utf-8").split("\n")
    contents = ttar_files(archive)
    path = ""
    for line in lines:
        if line.startswith(("Directory: ", "Path: ")):
            path = line.split(": ", 1)[1]
            target = into / path.removeprefix(strip)
            if line.startswith("Directory: "):
                target.mkdir(parents=True, exist_ok=True)
            elif path in contents:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(contents[path], encoding="utf-8")
        elif line.startswith("SymlinkTo: "):
            os.symlink(line[len("SymlinkTo: "):], into / path.removeprefix(strip))
    return into


@pytest.fixture
def node_exporter_tree(tmp_path: Path) -> Path:
    return extract(NODE_EXPORTER_SYS, tmp_path, "sys/")


@pytest.fixture
def procfs_tree(tmp_path: Path) -> Path:
    extract(PROCFS_SYS, tmp_path, "fixtures/sys/")
    return extract(PROCFS_NET, tmp_path, "fixtures/sys/")


def archived(archive: Path, prefix: str, device: str, port: int, name: str) -> str:
    return ttar_files(archive)[f"{prefix}class/infiniband/{device}/ports/{port}/{name}"]


def test_the_ttar_reader_undoes_the_eof_marker() -> None:
    files = ttar_files(PROCFS_SYS)
    assert files["fixtures/sys/class/infiniband/mlx5_0/node_guid"] == "0a7f:bc12:45ef:d23b"  # "...d23bEOF"
    assert files["fixtures/sys/class/infiniband/mlx4_0/ports/2/link_layer"] == "InfiniBand\n\n"  # Lines: 2


# ---- the sysfs reader ---------------------------------------------------------------------------------------


def test_node_exporters_tree_reads_as_its_files_say(node_exporter_tree: Path) -> None:
    readings = nic.read_network(node_exporter_tree)
    assert readings.problems == ()
    assert [n.device for n in readings.nics] == ["i40iw0", "mlx4_0"]
    iwarp, mlx4 = readings.nics
    assert (iwarp.hca_type, mlx4.hca_type) == ("I40IW", "MT4099")
    assert iwarp.pci_address == "" and iwarp.netdevs == ()  # no device link in the archive
    port = iwarp.ports[0]
    assert archived(NODE_EXPORTER_SYS, "sys/", "i40iw0", 1, "rate") == "10 Gb/sec (4X)\n"
    assert (port.name, port.state, port.phys_state, port.rate_gbps, port.width, port.speed, port.up) == \
        ("i40iw0/1", "ACTIVE", "LinkUp", 10.0, 4, "", True)
    assert archived(NODE_EXPORTER_SYS, "sys/", "i40iw0", 1, "counters/symbol_error") == "N/A (no PMA)\n"
    assert port.counters == {}  # every counter "N/A (no PMA)": no value, never 0
    assert [p.name for p in mlx4.ports] == ["mlx4_0/1", "mlx4_0/2"]
    for number, got in enumerate(mlx4.ports, start=1):
        for name in ("link_downed", "port_xmit_wait", "port_rcv_data", "symbol_error"):
            text = ttar_files(NODE_EXPORTER_SYS).get(f"sys/class/infiniband/mlx4_0/ports/{number}/counters/{name}")
            assert got.counters.get(name) == (int(text) if text is not None else None)
        assert (got.rate_gbps, got.speed, got.link_layer, got.up) == (40.0, "QDR", "InfiniBand", True)
    assert mlx4.ports[0].counters["port_xmit_wait"] == 4294967295  # saturated 32-bit PMA counter, read whole
    assert not any(name.startswith("counters_ext") for name in mlx4.ports[0].counters)  # not a directory we read


def test_procfs_tree_reads_as_its_files_say(procfs_tree: Path) -> None:
    readings = nic.read_network(procfs_tree)
    assert readings.problems == ()
    assert [n.device for n in readings.nics] == ["hfi1_0", "mlx4_0", "mlx5_0"]
    omni, mlx4, mlx5 = readings.nics
    assert omni.hca_type == "" and mlx5.hca_type == "MT4118"  # the OmniPath driver writes no hca_type
    assert (omni.ports[0].rate_gbps, omni.ports[0].speed, omni.ports[0].up) == (100.0, "EDR", True)
    assert omni.ports[0].counters["port_rcv_data"] == int(archived(PROCFS_SYS, "fixtures/sys/", "hfi1_0", 1,
                                                                   "counters/port_rcv_data"))
    assert mlx4.ports[1].link_layer == "InfiniBand"  # "InfiniBand\n\n" in the archive
    port = mlx5.ports[0]
    assert archived(PROCFS_SYS, "fixtures/sys/", "mlx5_0", 1, "phys_state") == "4: ACTIVE\n"
    assert (port.state, port.phys_state, port.rate_gbps, port.width, port.up) == ("ACTIVE", "ACTIVE", 25.0, 1, False)
    for name in ("local_ack_timeout_err", "req_cqe_error", "out_of_buffer"):
        text = archived(PROCFS_SYS, "fixtures/sys/", "mlx5_0", 1, f"hw_counters/{name}")
        assert port.counters[f"hw_counters/{name}"] == int(text)


def test_procfs_net_device_reads_as_its_files_say(procfs_tree: Path) -> None:
    files = ttar_files(PROCFS_NET)
    assert [files[f"fixtures/sys/class/net/eth0/{n}"] for n in ("operstate", "speed", "carrier_changes")] == \
        ["up\n", "1000\n", "2\n"]
    assert nic.read_netdev(procfs_tree, "eth0") == nic.NetDevice("eth0", "up", 1000, 2)


# ---- node_exporter's own output on its tree, through the Prometheus source -----------------------------------


def scraped() -> list[Sample]:
    text = NODE_EXPORTER_OUTPUT.read_text(encoding="utf-8")
    return [Sample(s.name, tuple(sorted((*s.labels, ("instance", "ib-7:9100")))), s.value)
            for s in parse(text).samples]


def test_node_exporters_output_reads_as_its_tree(node_exporter_tree: Path) -> None:
    readings = prom_nic.network_readings(scraped(), NODE_LABELS, {"ib-7"}.__contains__)["ib-7"]
    assert readings.problems == ()
    from_sysfs = nic.read_network(node_exporter_tree)
    assert [n.device for n in readings.nics] == [n.device for n in from_sysfs.nics]
    for served, read in zip(readings.nics, from_sysfs.nics, strict=True):
        for port, sysfs_port in zip(served.ports, read.ports, strict=True):
            assert (port.name, port.state, port.phys_state, port.rate_gbps, port.up) == \
                (sysfs_port.name, sysfs_port.state, sysfs_port.phys_state, sysfs_port.rate_gbps, True)
            # what node_exporter exports of the counters the judge reads, equal to the files
            assert port.counters == {k: v for k, v in sysfs_port.counters.items() if k in prom_nic.SYSFS_COUNTERS}
    assert readings.nic("i40iw0").ports[0].counters == {}  # type: ignore[union-attr]  # N/A: no series at all
    assert readings.nic("mlx4_0").ports[0].counters["port_xmit_discards"] == 5  # type: ignore[union-attr]


# ---- the judge: healthy trees give nothing -------------------------------------------------------------------


def judged(readings: nic.NetworkReadings, policy: NetworkPolicy, reads: int = 20) -> list[list[str]]:
    judge = NetworkJudge("node")
    return [[f"{f.kind} {f.message}" for f in judge.judge(readings, policy, 1000.0 + 30.0 * t)]
            for t in range(reads)]


def test_no_finding_on_node_exporters_tree(node_exporter_tree: Path) -> None:
    """A 10 Gb/s iWARP port beside 40 Gb/s QDR ports: different HCAs, neither trained low."""
    readings = nic.read_network(node_exporter_tree)
    assert judged(readings, NetworkPolicy()) == [[]] * 20
    assert judged(readings, NetworkPolicy(watch_never_up=True)) == [[]] * 20


def test_no_finding_on_node_exporters_output() -> None:
    readings = prom_nic.network_readings(scraped(), NODE_LABELS, lambda _: True)["ib-7"]
    assert judged(readings, NetworkPolicy(prometheus=True, watch_never_up=True)) == [[]] * 20


def test_procfs_tree_judged(procfs_tree: Path) -> None:
    """OmniPath at 100 Gb/s beside ConnectX-3 at 40: no finding. mlx5_0's phys_state reads "4: ACTIVE", a name the
    kernel never writes for a physical state (its 4 is PortConfigurationTraining; upstream hand-wrote the file):
    not LinkUp, so a port never seen up, judged only under watch_never_up, and then down."""
    readings = nic.read_network(procfs_tree)
    assert judged(readings, NetworkPolicy()) == [[]] * 20
    watched = judged(readings, NetworkPolicy(watch_never_up=True), reads=1)[0]
    assert watched == [f"{KIND_NIC_DOWN} {KIND_NIC_DOWN} mlx5_0/1: state ACTIVE, phys_state ACTIVE → cordon"]
    assert judged(readings, NetworkPolicy(watch_never_up=True, ignore_ports=("mlx5_0/1",))) == [[]] * 20
