"""signals.nic: the RDMA sysfs reader, on a tree in the kernel's formats (data/sysfs-dgx-h100, its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuremediate.signals import nic
from sim.nic_sysfs import NicTree

FIXTURE = Path(__file__).parent / "data" / "sysfs-dgx-h100"


@pytest.mark.parametrize(("text", "expected"), [
    ("400 Gb/sec (4X NDR)\n", (400.0, 4, "NDR")),
    ("200 Gb/sec (2X NDR)\n", (200.0, 2, "NDR")),
    ("56 Gb/sec (4X FDR)\n", (56.0, 4, "FDR")),
    ("2.5 Gb/sec (1X)\n", (2.5, 1, "")),  # SDR: rate_show prints no speed name
    ("12.5 Gb/sec (1X EDR)", (12.5, 1, "EDR")),
])
def test_rate_in_the_kernels_format(text: str, expected: tuple[float, int, str]) -> None:
    assert nic.parse_rate(text) == expected


@pytest.mark.parametrize("text", ["400", "fast", "400 Gb/sec", "Gb/sec (4X NDR)"])
def test_a_rate_in_another_format_is_an_error_naming_it(text: str) -> None:
    with pytest.raises(nic.NicReadError, match="rate"):
        nic.parse_rate(text)


def test_states_and_counters() -> None:
    assert nic.parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert nic.parse_state("7: Phy Test\n", "phys_state") == (7, "Phy Test")
    with pytest.raises(nic.NicReadError, match="phys_state"):
        nic.parse_state("LinkUp", "phys_state")
    assert nic.parse_counter("18446744073709551615\n") == 2**64 - 1
    assert nic.parse_counter("N/A (no PMA)\n") is None
    with pytest.raises(nic.NicReadError):
        nic.parse_counter("-3")


def test_the_fixture_node_reads_whole() -> None:
    readings = nic.read_network(FIXTURE)
    assert readings.problems == ()
    assert [n.device for n in readings.nics] == [f"mlx5_{i}" for i in range(10)]
    first = readings.nics[0]
    assert (first.pci_address, first.numa_node) == ("0000:12:00.0", 0)
    assert first.pci_path == "pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0"
    port = first.ports[0]
    assert (port.name, port.state, port.phys_state, port.rate_gbps, port.width, port.speed, port.link_layer) == \
        ("mlx5_0/1", "ACTIVE", "LinkUp", 400.0, 4, "NDR", "InfiniBand")
    assert port.up
    assert "VL15_dropped" not in port.counters  # N/A (no PMA): no reading, not zero
    assert port.counters["port_rcv_data"] == 123456789 and port.counters["hw_counters/out_of_buffer"] == 0
    assert readings.nic("mlx5_3").ports[0].counters["symbol_error"] == 7  # type: ignore[union-attr]


def test_roce_ports_carry_their_net_device() -> None:
    readings = nic.read_network(FIXTURE)
    roce, spare = readings.nic("mlx5_8"), readings.nic("mlx5_9")
    assert roce is not None and spare is not None
    assert roce.ports[0].link_layer == "Ethernet"
    assert roce.netdevs == (nic.NetDevice("enp170s0f0np0", "up", 200_000, 2),)
    assert spare.netdevs[0].operstate == "down" and spare.netdevs[0].speed_mbps is None  # -1 while down
    assert not spare.ports[0].up


def test_a_node_without_infiniband_reads_empty(tmp_path: Path) -> None:
    assert nic.read_network(tmp_path) == nic.NetworkReadings()
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    assert nic.read_network(tmp_path) == nic.NetworkReadings()


def test_unreadable_files_are_problems_not_a_healthy_port(tmp_path: Path) -> None:
    NicTree(tmp_path)
    port_dir = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (port_dir / "state").unlink()
    (port_dir / "rate").write_text("fast\n")
    (port_dir / "counters/symbol_error").write_text("lots\n")
    reading = nic.read_network(tmp_path).nic("mlx5_0")
    assert reading is not None
    port = reading.ports[0]
    assert not port.up and port.rate_gbps is None and "symbol_error" not in port.counters
    assert any("state" in p for p in port.problems) and any("rate" in p for p in port.problems)
    assert any("symbol_error" in p for p in port.problems)


def test_the_gpus_on_a_nics_rail_share_its_pcie_switch() -> None:
    readings = nic.read_network(FIXTURE)
    gpus = {address: nic.pci_place(FIXTURE, address) for address in
            ("0000:13:00.0", "0000:23:00.0", "0000:53:00.0", "0000:83:00.0")}
    places = {k: v for k, v in gpus.items() if v is not None}
    assert len(places) == 4
    assert nic.rail_gpus(readings.nic("mlx5_1"), places) == ("0000:23:00.0",)  # type: ignore[arg-type]
    # mlx5_8 shares no switch with a GPU: the GPUs of its NUMA node
    assert nic.rail_gpus(readings.nic("mlx5_8"), places) == ("0000:53:00.0", "0000:83:00.0")  # type: ignore[arg-type]
    assert nic.pci_place(FIXTURE, "0000:99:00.0") is None
