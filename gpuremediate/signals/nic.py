"""The node's RDMA NICs as sysfs shows them: InfiniBand ports and RoCE net devices (readings, never findings).

Pure parsing of a directory laid out like ``/sys``, so a test points it at a tree. The formats, from the kernel
(``drivers/infiniband/core/sysfs.c``; Documentation/ABI/stable/sysfs-class-infiniband, sysfs-class-net) and as
Prometheus procfs's ``sysfs/class_infiniband.go`` parses them:

- ``class/infiniband/<dev>/ports/<n>/state``: ``"<id>: <NAME>"``, NAME one of NOP DOWN INIT ARMED ACTIVE
  ACTIVE_DEFER (``"4: ACTIVE"``);
- ``phys_state``: ``"<id>: <Name>"``, Name one of Sleep Polling Disabled PortConfigurationTraining LinkUp
  LinkErrorRecovery "Phy Test" (``"5: LinkUp"``);
- ``rate``: ``"<Gb/s>[.5] Gb/sec (<width>X[ <speed>])"`` (``"400 Gb/sec (4X NDR)"``, ``"2.5 Gb/sec (1X)"``);
- ``link_layer``: ``InfiniBand``, ``Ethernet`` (RoCE) or ``Unknown``;
- ``counters/<name>``: a decimal integer; ``"N/A (no PMA)"`` where the device has no performance agent. The PMA
  counters saturate at their width (``link_downed`` 8 bits, ``symbol_error`` 16) instead of wrapping;
- ``hw_counters/<name>``: the driver's own counters (mlx5: ``out_of_buffer``, ``local_ack_timeout_err``, ...);
- ``class/infiniband/<dev>/hca_type``: the HCA's model (mlx5: ``MT4129``, ConnectX-7; the OmniPath driver writes
  none);
- ``class/infiniband/<dev>/device``: a link to the PCI function (its name is the PCI address), with
  ``numa_node`` (-1: none) and ``net/<if>`` (the RoCE/IPoIB net devices of that function);
- ``class/net/<if>/operstate`` (RFC 2863: unknown notpresent down lowerlayerdown testing dormant up),
  ``speed`` (Mb/s; unreadable or -1 while the link is down) and ``carrier_changes`` (every up and down).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

INFINIBAND_CLASS = "class/infiniband"
NET_CLASS = "class/net"
PCI_DEVICES = "bus/pci/devices"
STATE_ACTIVE = "ACTIVE"
PHYS_LINK_UP = "LinkUp"
PHYS_DISABLED = "Disabled"  # administratively disabled
LINK_LAYER_INFINIBAND = "InfiniBand"
LINK_LAYER_ETHERNET = "Ethernet"
OPERSTATE_UP = "up"

_STATE = re.compile(r"\s*(\d+)\s*:\s*(.+?)\s*")
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec\s*\((\d+)X\s*([A-Za-z0-9]*)\)\s*")
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


class NicReadError(ValueError):
    """A sysfs file whose content is not in the documented format."""


@dataclass(frozen=True)
class NetDevice:
    """``class/net/<if>``: a RoCE (or IPoIB) interface of an RDMA device."""

    name: str
    operstate: str = ""
    speed_mbps: int | None = None  # None: unreadable or -1 (the link is down)
    carrier_changes: int | None = None


@dataclass(frozen=True)
class PortReading:
    device: str  # the RDMA device: mlx5_0
    port: int
    state: str = ""  # ACTIVE, DOWN, ... ("" unreadable)
    phys_state: str = ""  # LinkUp, Polling, Disabled, ...
    rate_gbps: float | None = None
    width: int | None = None  # lanes: 4 of "(4X NDR)"
    speed: str = ""  # NDR, HDR, EDR, ... ("" for SDR or an unnamed speed)
    link_layer: str = ""
    counters: Mapping[str, int] = field(default_factory=dict)  # counters/*, and hw_counters/* as "hw_counters/x"
    problems: tuple[str, ...] = ()  # files that could not be read or parsed, in words

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def up(self) -> bool:
        """Active and physically up (a RoCE port's state follows its net device's carrier)."""
        return self.state == STATE_ACTIVE and self.phys_state == PHYS_LINK_UP


@dataclass(frozen=True)
class NicReading:
    device: str
    pci_address: str = ""  # "" when the device link is missing (a soft RDMA device such as rxe)
    numa_node: int | None = None
    pci_path: str = ""  # the PCI function's path below devices/ (the bridges above it: its PCIe switch)
    hca_type: str = ""  # "" where the driver writes none
    ports: tuple[PortReading, ...] = ()
    netdevs: tuple[NetDevice, ...] = ()


    @property
    def model(self) -> str:
        """What makes two NICs alike: the HCA type, else the driver's name (``hfi1`` of ``hfi1_0``)."""
        return self.hca_type or re.sub(r"_?\d+$", "", self.device)


@dataclass(frozen=True)
class NetworkReadings:
    nics: tuple[NicReading, ...] = ()
    problems: tuple[str, ...] = ()  # what could not be read, in words (an unreadable tree is not a healthy one)

    def nic(self, device: str) -> NicReading | None:
        return next((n for n in self.nics if n.device == device), None)


# --- the formats -----------------------------------------------------------------------------------


def parse_state(text: str, what: str = "state") -> tuple[int, str]:
    """``"4: ACTIVE"`` → (4, "ACTIVE")."""
    match = _STATE.fullmatch(text)
    if match is None:
        raise NicReadError(f"{what}: expected '<id>: <name>' (such as '4: ACTIVE'), got {text.strip()!r}")
    return int(match.group(1)), match.group(2)


def parse_rate(text: str) -> tuple[float, int, str]:
    """``"400 Gb/sec (4X NDR)"`` → (400.0, 4, "NDR")."""
    match = _RATE.fullmatch(text)
    if match is None:
        raise NicReadError(f"rate: expected '<n> Gb/sec (<w>X <speed>)' (such as '400 Gb/sec (4X NDR)'), "
                           f"got {text.strip()!r}")
    return float(match.group(1)), int(match.group(2)), match.group(3)


def parse_counter(text: str) -> int | None:
    """A counter's decimal value; None for the kernel's ``N/A (no PMA)``."""
    value = text.strip()
    if value.startswith("N/A"):
        return None
    try:
        number = int(value)
    except ValueError:
        raise NicReadError(f"expected a decimal counter, got {value!r}") from None
    if number < 0:
        raise NicReadError(f"expected a counter (0 or more), got {value!r}")
    return number


# --- reading a tree --------------------------------------------------------------------------------


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace")


def _read_counters(directory: Path, prefix: str, problems: list[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return found  # no such directory: the driver has none (irdma has no counters/, most have no hw_counters/)
    for entry in entries:
        try:
            if not entry.is_file():
                continue
            value = parse_counter(_read(entry))
        except OSError as exc:  # EINVAL / EOPNOTSUPP: a counter this device does not have
            problems.append(f"{entry}: {exc.strerror or exc}")
            continue
        except NicReadError as exc:
            problems.append(f"{entry}: {exc}")
            continue
        if value is not None:
            found[prefix + entry.name] = value
    return found


def read_port(device: str, port_dir: Path) -> PortReading:
    problems: list[str] = []
    values: dict[str, object] = {}
    for name in ("state", "phys_state", "rate", "link_layer"):
        try:
            text = _read(port_dir / name)
            if name in ("state", "phys_state"):
                values[name] = parse_state(text, name)[1]
            elif name == "rate":
                values["rate"] = parse_rate(text)
            else:
                values[name] = text.strip()
        except OSError as exc:
            problems.append(f"{port_dir / name}: {exc.strerror or exc}")
        except NicReadError as exc:
            problems.append(f"{port_dir}: {exc}")
    rate = values.get("rate")
    gbps, width, speed = rate if isinstance(rate, tuple) else (None, None, "")
    counters = _read_counters(port_dir / "counters", "", problems)
    counters.update(_read_counters(port_dir / "hw_counters", "hw_counters/", problems))
    return PortReading(device=device, port=int(port_dir.name), state=str(values.get("state", "")),
                       phys_state=str(values.get("phys_state", "")), rate_gbps=gbps, width=width, speed=speed,
                       link_layer=str(values.get("link_layer", "")), counters=counters, problems=tuple(problems))


def _int_file(path: Path) -> int | None:
    try:
        return int(_read(path).strip())
    except (OSError, ValueError):
        return None


def read_netdev(root: Path, name: str) -> NetDevice:
    base = root / NET_CLASS / name
    try:
        operstate = _read(base / "operstate").strip()
    except OSError:
        operstate = ""
    speed = _int_file(base / "speed")
    return NetDevice(name=name, operstate=operstate, speed_mbps=speed if speed is not None and speed >= 0 else None,
                     carrier_changes=_int_file(base / "carrier_changes"))


def _pci_location(device_link: Path) -> tuple[str, str]:
    """(PCI address, path below ``devices/``) of the function a ``device`` link points at; ("", "") if none."""
    try:
        target = os.path.realpath(device_link)
    except OSError:
        return "", ""
    parts = Path(target).parts
    if "devices" not in parts:
        return "", ""
    below = parts[len(parts) - parts[::-1].index("devices"):]
    address = below[-1] if below and _PCI_ADDRESS.fullmatch(below[-1]) else ""
    return address.lower(), "/".join(below) if address else ""


def read_nic(root: Path, device: str) -> tuple[NicReading, list[str]]:
    base = root / INFINIBAND_CLASS / device
    problems: list[str] = []
    ports: list[PortReading] = []
    try:
        port_dirs = sorted((p for p in (base / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError as exc:
        problems.append(f"{base / 'ports'}: {exc.strerror or exc}")
        port_dirs = []
    for port_dir in port_dirs:
        reading = read_port(device, port_dir)
        ports.append(reading)
        problems.extend(reading.problems)
    address, path = _pci_location(base / "device")
    numa = _int_file(base / "device" / "numa_node")
    try:
        netdev_names = sorted(p.name for p in (base / "device" / "net").iterdir())
    except OSError:
        netdev_names = []
    netdevs = tuple(read_netdev(root, name) for name in netdev_names)
    try:
        hca_type = _read(base / "hca_type").strip()
    except OSError:
        hca_type = ""
    return NicReading(device=device, pci_address=address, numa_node=numa if numa is not None and numa >= 0 else None,
                      pci_path=path, hca_type=hca_type, ports=tuple(ports), netdevs=netdevs), problems


def read_network(root: str | Path) -> NetworkReadings:
    """Every RDMA device under ``<root>/class/infiniband`` (none: a node without InfiniBand or RoCE)."""
    base = Path(root) / INFINIBAND_CLASS
    try:
        devices = sorted(p.name for p in base.iterdir())
    except FileNotFoundError:
        return NetworkReadings()
    except OSError as exc:
        return NetworkReadings(problems=(f"{base}: {exc.strerror or exc}",))
    nics: list[NicReading] = []
    problems: list[str] = []
    for device in devices:
        nic, found = read_nic(Path(root), device)
        nics.append(nic)
        problems.extend(found)
    return NetworkReadings(tuple(nics), tuple(problems))


@dataclass(frozen=True)
class PciPlace:
    """Where a PCI function sits: its path below ``devices/`` and its NUMA node."""

    path: str
    numa_node: int | None


def pci_place(root: str | Path, address: str) -> PciPlace | None:
    """A GPU's (or any function's) place, from ``<root>/bus/pci/devices/<address>``; None when not there."""
    link = Path(root) / PCI_DEVICES / address.lower()
    if not link.exists():
        return None
    _, path = _pci_location(link)
    numa = _int_file(link / "numa_node")
    return PciPlace(path, numa if numa is not None and numa >= 0 else None)


def _bridges(path: str) -> list[str]:
    """The PCI components of a path, without the root complex (``pci0000:00``) and the function itself."""
    parts = [p for p in path.split("/") if _PCI_ADDRESS.fullmatch(p)]
    return parts[:-1]


def rail_gpus(nic: NicReading, gpus: Mapping[str, PciPlace]) -> tuple[str, ...]:
    """The GPUs (keys of ``gpus``) nearest the NIC: those below the deepest PCIe bridge the NIC shares with any
    GPU, when that is below the root port (one PCIe switch: GPUDirect RDMA's rail); else those on its NUMA
    node; else none."""
    mine = _bridges(nic.pci_path)
    best, near = 0, []
    for key, place in sorted(gpus.items()):
        theirs = _bridges(place.path)
        shared = 0
        while shared < min(len(mine), len(theirs)) and mine[shared] == theirs[shared]:
            shared += 1
        if shared > best:
            best, near = shared, [key]
        elif shared == best and shared:
            near.append(key)
    if best >= 2:  # a root port and a switch port in common
        return tuple(near)
    if nic.numa_node is not None:
        return tuple(k for k, p in sorted(gpus.items()) if p.numa_node == nic.numa_node)
    return ()
