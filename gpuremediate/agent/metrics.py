"""The agent's own /metrics (prefix ``gpuremediate_agent_``), on the controller's registry."""

from __future__ import annotations

from collections.abc import Mapping

from gpuremediate.agent.health import Assessment, SmiResult, physical_gpus
from gpuremediate.obs.metrics import Counter, Gauge, Histogram, Registry
from gpuremediate.signals.model import GpuReading
from gpuremediate.signals.nic import NetworkReadings
from gpuremediate.vocab.findings import Finding

SMI_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60)
P = "gpuremediate_agent_"


class AgentMetrics:
    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        r = self.registry
        self.xid = Counter(P + "xid_total", "NVRM Xid lines in the kernel log, every occurrence (join "
                           "gpu_info on pci_bus_id for the UUID)", ("pci_bus_id", "xid"))
        self.gpu_info = Gauge(P + "gpu_info", "1 per GPU the driver listed since the agent started",
                              ("pci_bus_id", "uuid", "model"))
        self.sxid = Counter(P + "sxid_total", "NVSwitch SXid events in the kernel log", ("device", "sxid", "severity"))
        self.kmsg_records = Counter(P + "kmsg_records_total", "kernel log records read")
        self.kmsg_missed = Counter(P + "kmsg_missed_records_total",
                                   "kernel log records overwritten before the agent read them")
        self.kmsg_readable = Gauge(P + "kmsg_readable", "1 when /dev/kmsg could be opened")
        self.smi_seconds = Histogram(P + "nvidia_smi_seconds", "time nvidia-smi took", buckets=SMI_BUCKETS)
        self.smi_failures = Counter(P + "nvidia_smi_failures_total", "nvidia-smi runs without readings", ("reason",))
        self.condition = Gauge(P + "condition", "1 for each published condition's current status",
                               ("type", "status", "reason"))
        self.gpus = Gauge(P + "gpus", "GPUs the driver reports and the node's capacity", ("source",))
        self.status_writes = Counter(P + "status_writes_total", "node status patches", ("result",))
        self.nic_port_up = Gauge(P + "nic_port_up", "1 per RDMA port ACTIVE and LinkUp, 0 otherwise ([network])",
                                 ("device", "port", "link_layer"))
        self.nic_port_rate = Gauge(P + "nic_port_rate_gbps", "the rate an RDMA port trained at (sysfs rate), Gb/s",
                                   ("device", "port"))
        self.nic_findings = Gauge(P + "nic_findings", "the [network] findings in force, per NIC and kind",
                                  ("device", "kind"))
        for metric in (self.xid, self.gpu_info, self.sxid, self.kmsg_records, self.kmsg_missed, self.kmsg_readable,
                       self.smi_seconds, self.smi_failures, self.condition, self.gpus, self.status_writes,
                       self.nic_port_up, self.nic_port_rate, self.nic_findings):
            r.register(metric)

    def observe(self, result: Assessment, smi: SmiResult, expected: int | None,
                inventory: Mapping[str, GpuReading]) -> None:
        self.gpu_info.replace_all(({"pci_bus_id": bus, "uuid": g.uuid or "", "model": g.model or ""}, 1.0)
                                  for bus, g in inventory.items())
        self.condition.replace_all(({"type": c.type, "status": c.status, "reason": c.reason}, 1.0)
                                   for c in result.conditions)
        values = []
        if smi.readings is not None:
            values.append(({"source": "driver"}, float(physical_gpus(smi.readings))))
        if expected:
            values.append(({"source": "capacity"}, float(expected)))
        self.gpus.replace_all(values)

    def observe_network(self, readings: NetworkReadings, findings: tuple[Finding, ...]) -> None:
        ports = [p for nic in readings.nics for p in nic.ports]
        self.nic_port_up.replace_all(({"device": p.device, "port": str(p.port), "link_layer": p.link_layer},
                                      1.0 if p.up else 0.0) for p in ports)
        self.nic_port_rate.replace_all(({"device": p.device, "port": str(p.port)}, p.rate_gbps)
                                       for p in ports if p.rate_gbps is not None)
        counts: dict[tuple[str, str], float] = {}
        for finding in findings:
            counts[(finding.code, finding.kind)] = counts.get((finding.code, finding.kind), 0.0) + 1.0
        self.nic_findings.replace_all(({"device": device, "kind": kind}, n) for (device, kind), n in counts.items())
