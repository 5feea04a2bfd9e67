"""node_exporter's InfiniBand series through the Prometheus source (issue 45): the same NIC readings the agent makes
from sysfs (``signals.nic``), for the controller to judge with ``[network]`` where a fleet scrapes node_exporter.

node_exporter's ``infiniband`` collector (``collector/infiniband_linux.go``) reads sysfs through Prometheus procfs
(``sysfs/class_infiniband.go``) and writes, per port, with labels ``device`` (the RDMA device: mlx5_0) and
``port`` (its number):

- ``node_infiniband_state_id`` (gauge: 0 no change, 1 down, 2 init, 3 armed, 4 active, 5 act defer: the number
  before the colon of sysfs ``state``);
- ``node_infiniband_physical_state_id`` (gauge: 1 sleep, 2 polling, 3 disable, 4 shift (training), 5 link up,
  6 link error recover, 7 phytest: of ``phys_state``);
- ``node_infiniband_rate_bytes_per_second`` (gauge: sysfs ``rate``'s Gb/s times 125,000,000; no width, no speed
  name);
- one counter per ``counters/*`` file that has a value (``N/A (no PMA)`` writes none), such as
  ``node_infiniband_link_downed_total`` (``counters/link_downed``), ``node_infiniband_symbol_error_total``,
  ``node_infiniband_port_errors_received_total`` (``counters/port_rcv_errors``), and for mlx5's
  ``hw_counters/*`` some as well (``node_infiniband_out_of_buffer_drops_total``: ``hw_counters/out_of_buffer``).

What these series do not say: the link layer (InfiniBand or RoCE), a RoCE port's net device (``operstate``,
``carrier_changes``: node_exporter's netclass collector has them, unlinked to the RDMA device), the PCI address
and NUMA node (so no rail). A port is judged as the agent judges one whose link layer it could not read.

Each series is placed on a node by the source's node labels (``Hostname``, ``hostname``, ``node``,
``kubernetes_node``), else by ``instance`` less its port (kube-prometheus and OpenShift relabel node_exporter's
``instance`` to the pod's node name); only the nodes the source has GPU readings for are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from gpuremediate.signals.exposition import Sample
from gpuremediate.signals.nic import NetworkReadings, NicReading, PortReading

PREFIX = "node_infiniband_"
NAME_LABEL = "gpuremediate_metric"  # as every query of the source names its series (sources.NAME_LABEL)
INSTANCE = "instance"
PORT_LABELS = ("device", "port")
STATE = PREFIX + "state_id"
PHYS_STATE = PREFIX + "physical_state_id"
RATE = PREFIX + "rate_bytes_per_second"
BYTES_PER_GBIT = 125_000_000  # procfs: "Convert Gb/s into bytes/s"
# The kernel's names (drivers/infiniband/core/sysfs.c state_show / phys_state_show), by the ids node_exporter writes.
STATE_NAMES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATE_NAMES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
                    6: "LinkErrorRecovery", 7: "Phy Test"}
# node_exporter's counter (less prefix and suffix) -> the sysfs file the agent reads ([network] error_counters and
# link_downed name these).
COUNTERS: Mapping[str, str] = {
    "link_downed_total": "link_downed",
    "link_error_recovery_total": "link_error_recovery",
    "symbol_error_total": "symbol_error",
    "port_errors_received_total": "port_rcv_errors",
    "local_link_integrity_errors_total": "local_link_integrity_errors",
    "excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors",
    "port_receive_remote_physical_errors_total": "port_rcv_remote_physical_errors",
    "port_receive_switch_relay_errors_total": "port_rcv_switch_relay_errors",
    "port_constraint_errors_received_total": "port_rcv_constraint_errors",
    "port_constraint_errors_transmitted_total": "port_xmit_constraint_errors",
    "port_discards_transmitted_total": "port_xmit_discards",
    "vl15_dropped_total": "VL15_dropped",
    "out_of_buffer_drops_total": "hw_counters/out_of_buffer",
    "local_ack_timeout_errors_total": "hw_counters/local_ack_timeout_err",
    "packet_sequence_errors_total": "hw_counters/packet_seq_err",
    "rx_icrc_encapsulated_errors_total": "hw_counters/rx_icrc_encapsulated",
    "req_cqes_errors_total": "hw_counters/req_cqe_error",
    "resp_cqes_errors_total": "hw_counters/resp_cqe_error",
}
SYSFS_COUNTERS = {sysfs: PREFIX + name for name, sysfs in COUNTERS.items()}


@runtime_checkable
class ServesNetwork(Protocol):
    """A source that reads node_exporter's InfiniBand series (PrometheusSource): ``network_counters`` set by the
    detect loop from the policy (None: not asked), ``network_readings`` each full read's, per node (a node absent:
    nothing read for it this time, not a node without NICs)."""

    network_counters: tuple[str, ...] | None
    network_readings: Mapping[str, NetworkReadings]


def wanted_counters(policies: Iterable[tuple[bool, Iterable[str]]]) -> tuple[str, ...] | None:
    """The sysfs counters to ask for, from each policy's (``[network] prometheus``, ``error_counters``); None when
    no policy asks Prometheus (no query at all). A counter node_exporter does not write is left out."""
    asked = [tuple(counters) for on, counters in policies if on]
    if not asked:
        return None
    names = {"link_downed", *(c for counters in asked for c in counters)}
    return tuple(sorted(n for n in names if n in SYSFS_COUNTERS))


def network_query(node_labels: Sequence[str], counters: Sequence[str]) -> str:
    """One instant query: per node and port, its state, physical state, rate and ``counters`` (sysfs names)."""
    by = ", ".join((*node_labels, INSTANCE, *PORT_LABELS))
    metrics = (STATE, PHYS_STATE, RATE, *(SYSFS_COUNTERS[c] for c in counters))
    return " or ".join(f'label_replace(max by ({by}) ({metric}), "{NAME_LABEL}", "{metric}", "", "")'
                       for metric in metrics)


def instance_host(instance: str) -> str:
    """``gpu-node-7:9100`` → ``gpu-node-7``; ``[fe80::1]:9100`` → ``fe80::1``."""
    if instance.startswith("["):
        return instance[1:].partition("]")[0]
    host, colon, port = instance.rpartition(":")
    return host if colon and port.isdigit() and ":" not in host else instance


def node_of(sample: Sample, node_labels: Sequence[str], known: Callable[[str], bool]) -> str | None:
    """The node a series belongs to: its first node label with a value, else its ``instance``'s host; None when
    that is not a node ``known`` (an IP address, a host outside the fleet)."""
    named = next((value for label in node_labels if (value := sample.label(label))), None)
    if named is None and (instance := sample.label(INSTANCE)):
        named = instance_host(instance)
    return named if named is not None and known(named) else None


def network_readings(samples: Iterable[Sample], node_labels: Sequence[str],
                     known: Callable[[str], bool]) -> dict[str, NetworkReadings]:
    """Each node's readings from the network query's answer (only nodes with at least one series)."""
    ports: dict[str, dict[tuple[str, int], dict[str, float]]] = {}
    problems: dict[str, list[str]] = {}
    for sample in samples:
        node = node_of(sample, node_labels, known)
        device, port = sample.label("device"), sample.label("port")
        if node is None or not device or not sample.name.startswith(PREFIX) or port is None:
            continue  # no port label: a device's series (node_infiniband_info), not a port's
        if not port.isdigit():
            problems.setdefault(node, []).append(f"{sample.name}{{device={device!r}}}: port {port!r} is not a "
                                                 "port number")
            continue
        ports.setdefault(node, {}).setdefault((device, int(port)), {})[sample.name] = sample.value
    return {node: _readings(found, problems.get(node, [])) for node, found in ports.items()}


def _readings(ports: Mapping[tuple[str, int], Mapping[str, float]], problems: list[str]) -> NetworkReadings:
    by_device: dict[str, list[PortReading]] = {}
    for (device, number), values in sorted(ports.items()):
        port = _port(device, number, values)
        by_device.setdefault(device, []).append(port)
        problems.extend(port.problems)
    nics = tuple(NicReading(device=device, ports=tuple(found)) for device, found in sorted(by_device.items()))
    return NetworkReadings(nics, tuple(problems))


def _named(values: Mapping[str, float], metric: str, names: Mapping[int, str], where: str,
           problems: list[str]) -> str:
    value = values.get(metric)
    if value is None:
        problems.append(f"{where}: no {metric}")
        return ""
    name = names.get(int(value)) if value == int(value) else None
    if name is None:
        problems.append(f"{where}: {metric} {value:g} is none of node_exporter's ids {sorted(names)}")
        return ""
    return name


def _port(device: str, number: int, values: Mapping[str, float]) -> PortReading:
    where = f"{device}/{number}"
    problems: list[str] = []
    state = _named(values, STATE, STATE_NAMES, where, problems)
    phys = _named(values, PHYS_STATE, PHYS_STATE_NAMES, where, problems)
    rate = values.get(RATE)
    counters = {sysfs: int(values[metric]) for sysfs, metric in SYSFS_COUNTERS.items()
                if metric in values and values[metric] >= 0}
    return PortReading(device=device, port=number, state=state, phys_state=phys,
                       rate_gbps=rate / BYTES_PER_GBIT if rate is not None and rate > 0 else None,
                       counters=counters, problems=tuple(problems))
