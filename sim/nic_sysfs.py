"""A node's RDMA NICs as a sysfs tree (the directory the agent reads as ``/sys``), with faults to inject.

Built from the formats of the kernel's ``drivers/infiniband/core/sysfs.c`` and Documentation/ABI
(sysfs-class-infiniband, sysfs-class-net), as ``gpuremediate.signals.nic`` documents them: per device
``class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer,counters/*,hw_counters/*}``, a ``device`` link
to its PCI function under ``devices/pci0000:XX/...`` (with ``numa_node`` and ``net/<if>``), ``class/net/<if>``
for a RoCE port's net device and ``bus/pci/devices/<address>`` links for the GPUs (to place them on a rail).

The default layout is a DGX H100-like node: 8 GPUs, each behind a PCIe switch shared with one ConnectX-7
(``mlx5_0``..``mlx5_7``, InfiniBand NDR 400 Gb/s, one port), two switches per NUMA node.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
PHYS_STATES = {"Polling": 2, "Disabled": 3, "LinkUp": 5, "LinkErrorRecovery": 6}
COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_rcv_remote_physical_errors",
            "port_rcv_switch_relay_errors", "port_xmit_discards", "port_xmit_constraint_errors",
            "port_rcv_constraint_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
            "VL15_dropped", "port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
            "unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets", "multicast_rcv_packets")
HW_COUNTERS = ("out_of_buffer", "out_of_sequence", "local_ack_timeout_err", "packet_seq_err", "rnr_nak_retry_err")
SPEEDS = {"NDR": 100.0, "HDR": 50.0, "EDR": 25.0}  # Gb/s per lane


@dataclass
class SimPort:
    number: int = 1
    state: str = "ACTIVE"
    phys_state: str = "LinkUp"
    width: int = 4
    speed: str = "NDR"
    link_layer: str = "InfiniBand"
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    hw_counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HW_COUNTERS, 0))
    carrier_changes: int = 2  # the net device's (RoCE): one up at boot counts 2 on mlx5

    @property
    def rate(self) -> str:
        gbps = SPEEDS[self.speed] * self.width
        return f"{gbps:g} Gb/sec ({self.width}X {self.speed})"


@dataclass
class SimNic:
    device: str
    pci_address: str
    switch: str  # the PCIe switch port above it (shared with its GPU)
    root_port: str
    root: str  # pci0000:XX
    numa_node: int
    ports: list[SimPort] = field(default_factory=lambda: [SimPort()])
    netdev: str = ""  # RoCE: the net device's name
    present: bool = True


@dataclass
class SimGpuPlace:
    pci_address: str
    switch: str
    root_port: str
    root: str
    numa_node: int


def dgx_layout(gpus: int = 8, nics: int = 8) -> tuple[list[SimNic], list[SimGpuPlace]]:
    """One GPU and one NIC behind each PCIe switch; four switches per NUMA node."""
    nic_list: list[SimNic] = []
    gpu_list: list[SimGpuPlace] = []
    for index in range(max(gpus, nics)):
        bus = 0x10 + index * 0x10
        root = f"pci0000:{bus:02x}"
        root_port = f"0000:{bus:02x}:01.0"
        switch = f"0000:{bus + 1:02x}:00.0"
        numa = 0 if index < max(gpus, nics) // 2 else 1
        if index < gpus:
            gpu_list.append(SimGpuPlace(f"0000:{bus + 3:02x}:00.0", switch, root_port, root, numa))
        if index < nics:
            nic_list.append(SimNic(f"mlx5_{index}", f"0000:{bus + 2:02x}:00.0", switch, root_port, root, numa))
    return nic_list, gpu_list


def layout_for_buses(buses: list[int]) -> tuple[list[SimNic], list[SimGpuPlace]]:
    """One NIC beside each GPU (GPU at bus ``b``: NIC at ``b-1``, their switch at ``b-2``, root port ``b-3``)."""
    nics: list[SimNic] = []
    gpus: list[SimGpuPlace] = []
    for index, bus in enumerate(buses):
        root, root_port, switch = f"pci0000:{bus - 3:02x}", f"0000:{bus - 3:02x}:01.0", f"0000:{bus - 2:02x}:00.0"
        numa = 0 if index < len(buses) // 2 else 1
        gpus.append(SimGpuPlace(f"0000:{bus:02x}:00.0", switch, root_port, root, numa))
        nics.append(SimNic(f"mlx5_{index}", f"0000:{bus - 1:02x}:00.0", switch, root_port, root, numa))
    return nics, gpus


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # the agent never reads half a file


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(target, link.parent)
    if link.is_symlink() and os.readlink(link) == relative:
        return
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(relative)


def _function_dir(root: Path, place: SimNic | SimGpuPlace) -> Path:
    return root / "devices" / place.root / place.root_port / place.switch / place.pci_address


class NicTree:
    """One node's NICs and the tree they are written to; every change rewrites the tree."""

    def __init__(self, root: str | Path, nics: list[SimNic] | None = None,
                 gpus: list[SimGpuPlace] | None = None) -> None:
        self.root = Path(root)
        default_nics, default_gpus = dgx_layout()
        self.nics = default_nics if nics is None else nics
        self.gpus = default_gpus if gpus is None else gpus
        self._lock = threading.Lock()
        self.write()

    def nic(self, device: str) -> SimNic:
        found = next((n for n in self.nics if n.device == device), None)
        if found is None:
            raise KeyError(f"no NIC {device!r} (known: {', '.join(n.device for n in self.nics)})")
        return found

    def port(self, device: str, number: int = 1) -> SimPort:
        found = next((p for p in self.nic(device).ports if p.number == number), None)
        if found is None:
            raise KeyError(f"{device} has no port {number}")
        return found

    # --- faults --------------------------------------------------------------------------------------

    def port_down(self, device: str, number: int = 1, phys_state: str = "Polling") -> None:
        with self._lock:
            port = self.port(device, number)
            if port.state == "ACTIVE":
                port.counters["link_downed"] += 1
                port.carrier_changes += 1
            port.state, port.phys_state = "DOWN", phys_state
            self._write_locked()

    def port_up(self, device: str, number: int = 1) -> None:
        with self._lock:
            port = self.port(device, number)
            if port.state != "ACTIVE":
                port.carrier_changes += 1
            port.state, port.phys_state = "ACTIVE", "LinkUp"
            self._write_locked()

    def flap(self, device: str, number: int = 1, times: int = 1) -> None:
        """Down and up again ``times`` times between two reads: only the counters show it."""
        with self._lock:
            port = self.port(device, number)
            port.counters["link_downed"] += times
            port.carrier_changes += 2 * times
            self._write_locked()

    def downtrain(self, device: str, number: int = 1, width: int = 2, speed: str | None = None) -> None:
        with self._lock:
            port = self.port(device, number)
            port.width = width
            port.speed = speed or port.speed
            self._write_locked()

    def add_errors(self, device: str, number: int = 1, count: int = 1, counter: str = "symbol_error") -> None:
        with self._lock:
            port = self.port(device, number)
            port.counters[counter] = port.counters.get(counter, 0) + count
            self._write_locked()

    def traffic(self, packets: int = 1_000_000) -> None:
        """A busy fabric: data and packet counters rise on every port, error counters do not."""
        with self._lock:
            for nic in self.nics:
                for port in nic.ports:
                    for name in ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
                                 "unicast_xmit_packets", "unicast_rcv_packets"):
                        port.counters[name] += packets
            self._write_locked()

    def gone(self, device: str, present: bool = False) -> None:
        """The NIC leaves sysfs (driver unloaded, fell off the bus); ``present=True`` brings it back."""
        with self._lock:
            self.nic(device).present = present
            self._write_locked()

    def heal(self) -> None:
        """Every NIC present, every port up at full width (counters keep their values, as a real port's do)."""
        with self._lock:
            for nic in self.nics:
                nic.present = True
                for port in nic.ports:
                    if port.state != "ACTIVE":
                        port.carrier_changes += 1
                    port.state, port.phys_state, port.width = "ACTIVE", "LinkUp", 4
            self._write_locked()

    # --- the tree ------------------------------------------------------------------------------------

    def write(self) -> None:
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        ib = self.root / "class" / "infiniband"
        ib.mkdir(parents=True, exist_ok=True)
        for gpu in self.gpus:
            function = _function_dir(self.root, gpu)
            _write(function / "numa_node", f"{gpu.numa_node}\n")
            _link(self.root / "bus" / "pci" / "devices" / gpu.pci_address, function)
        for nic in self.nics:
            self._write_nic(nic)

    def _write_nic(self, nic: SimNic) -> None:
        base = self.root / "class" / "infiniband" / nic.device
        if not nic.present:
            shutil.rmtree(base, ignore_errors=True)
            if nic.netdev:
                shutil.rmtree(self.root / "class" / "net" / nic.netdev, ignore_errors=True)
            return
        function = _function_dir(self.root, nic)
        _write(function / "numa_node", f"{nic.numa_node}\n")
        _link(base / "device", function)
        _write(base / "fw_ver", "28.39.1002\n")
        _write(base / "hca_type", "MT4129\n")
        _write(base / "node_type", "1: CA\n")
        for port in nic.ports:
            where = base / "ports" / str(port.number)
            _write(where / "state", f"{STATES[port.state]}: {port.state}\n")
            _write(where / "phys_state", f"{PHYS_STATES[port.phys_state]}: {port.phys_state}\n")
            _write(where / "rate", port.rate + "\n")
            _write(where / "link_layer", port.link_layer + "\n")
            for name, value in port.counters.items():
                _write(where / "counters" / name, f"{value}\n")
            for name, value in port.hw_counters.items():
                _write(where / "hw_counters" / name, f"{value}\n")
        if nic.netdev:
            net = self.root / "class" / "net" / nic.netdev
            port = nic.ports[0]
            up = port.state == "ACTIVE"
            _write(net / "operstate", "up\n" if up else "down\n")
            _write(net / "speed", f"{int(SPEEDS[port.speed] * port.width * 1000)}\n" if up else "-1\n")
            _write(net / "carrier_changes", f"{port.carrier_changes}\n")
            _link(function / "net" / nic.netdev, net)
