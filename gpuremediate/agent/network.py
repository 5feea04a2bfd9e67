"""The agent's NIC watch (issue 45): read the node's RDMA sysfs every cycle, judge it with ``[network]``, and say
it as NodeCondition ``GPUNetworkHealthy``.

True (``PortsHealthy``) while no port has a finding, and on a node without an RDMA device (``NoRdmaDevice``:
never a fault); False with reason ``<Kind>:<nic>`` (``NicDown:mlx5_3``, ``policy.network.reason_of``) for the
worst finding, every finding in the message, each naming its port and the GPUs on its rail; Unknown when the
tree cannot be read. The controller maps the reason to ``[network]``'s action (``policy.network.condition_rules``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuremediate.agent.health import MESSAGE_LIMIT, Wanted
from gpuremediate.policy.conditions import GPU_NETWORK_HEALTHY
from gpuremediate.policy.network import NetworkJudge, NetworkPolicy, reason_of
from gpuremediate.signals.model import NodeReadings
from gpuremediate.signals.nic import NetworkReadings, PciPlace, pci_place, rail_gpus, read_network
from gpuremediate.vocab.findings import ACTION_NONE, Finding

DEFAULT_SYSFS = "/sys"


def sysfs_address(bus_id: str) -> str:
    """nvidia-smi's ``00000000:17:00.0`` as sysfs names it (``0000:17:00.0``)."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}" if rest else bus_id.lower()


@dataclass(frozen=True)
class NetworkResult:
    condition: Wanted
    readings: NetworkReadings
    findings: tuple[Finding, ...]


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def network_condition(readings: NetworkReadings, findings: tuple[Finding, ...], root: str) -> Wanted:
    actionable = [f for f in findings if f.action != ACTION_NONE]
    if actionable:
        return Wanted(GPU_NETWORK_HEALTHY, "False", reason_of(actionable[0]),
                      _clip("; ".join(f.message for f in actionable)))
    if not readings.nics and readings.problems:
        return Wanted(GPU_NETWORK_HEALTHY, "Unknown", "SysfsUnreadable", _clip("; ".join(readings.problems)))
    if not readings.nics:
        return Wanted(GPU_NETWORK_HEALTHY, "True", "NoRdmaDevice",
                      f"no RDMA device under {root}/class/infiniband (a node without InfiniBand or RoCE)")
    ports = sum(len(n.ports) for n in readings.nics)
    return Wanted(GPU_NETWORK_HEALTHY, "True", "PortsHealthy",
                  f"{ports} port(s) of {len(readings.nics)} RDMA device(s) without a fault")


class NetworkWatch:
    """One node's NICs, cycle after cycle (the judge remembers each port's history)."""

    def __init__(self, node: str, root: str = DEFAULT_SYSFS) -> None:
        self.root = root
        self.judge = NetworkJudge(node)
        self._places: dict[str, PciPlace | None] = {}  # a GPU's PCI place does not move while the node runs

    def _gpu_places(self, gpus: NodeReadings | None) -> dict[str, PciPlace]:
        places: dict[str, PciPlace] = {}
        for gpu in gpus.gpus if gpus is not None else ():
            if not gpu.pci_bus_id:
                continue
            address = sysfs_address(gpu.pci_bus_id)
            if address not in self._places:
                self._places[address] = pci_place(self.root, address)
            place = self._places[address]
            if place is not None:
                places[gpu.uuid or gpu.key] = place
        return places

    def rails(self, readings: NetworkReadings, gpus: NodeReadings | None) -> Mapping[str, tuple[str, ...]]:
        places = self._gpu_places(gpus)
        return {nic.device: rail_gpus(nic, places) for nic in readings.nics} if places else {}

    def cycle(self, policy: NetworkPolicy, now: float, gpus: NodeReadings | None) -> NetworkResult | None:
        """The condition for this cycle; None when ``[network]`` is off (the agent then writes none)."""
        if not policy.enabled:
            return None
        readings = read_network(Path(self.root))
        findings = tuple(self.judge.judge(readings, policy, now, self.rails(readings, gpus)))
        return NetworkResult(network_condition(readings, findings, self.root), readings, findings)
