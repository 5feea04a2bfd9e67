"""signals.prom_nic: node_exporter's InfiniBand series → the NIC readings the agent makes from sysfs, judged the same.

The exposition is node_exporter's infiniband collector's shape (collector/infiniband_linux.go: labels device and
port, state_id / physical_state_id ids, rate_bytes_per_second = Gb/s * 125,000,000, ``*_total`` counters only where
sysfs has a value), as the text a scrape of it reads, with the ``instance`` label Prometheus adds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuremediate.policy.network import NetworkJudge, NetworkJudges, NetworkPolicy
from gpuremediate.signals import prom_nic
from gpuremediate.signals.exposition import Sample, parse
from gpuremediate.signals.nic import NetworkReadings, read_network
from sim.nic_sysfs import NicTree

NODE_LABELS = ("Hostname", "hostname", "node", "kubernetes_node")

# Two HCAs of a GPU node as node_exporter 1.8 writes them (HELP lines as the collector's descriptions; an unused
# second port of a dual-port HCA polling for a peer; mlx5_1 has no PMA: no counters at all).
SCRAPE = """\
# HELP node_infiniband_link_downed_total Number of times the link failed to recover from an error state and went down
# TYPE node_infiniband_link_downed_total counter
node_infiniband_link_downed_total{device="mlx5_0",port="1"} 2
node_infiniband_link_downed_total{device="mlx5_0",port="2"} 0
# HELP node_infiniband_physical_state_id Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, \
3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)
# TYPE node_infiniband_physical_state_id gauge
node_infiniband_physical_state_id{device="mlx5_0",port="1"} 5
node_infiniband_physical_state_id{device="mlx5_0",port="2"} 2
node_infiniband_physical_state_id{device="mlx5_1",port="1"} 5
# HELP node_infiniband_port_errors_received_total Number of packets containing an error that were received on this port
# TYPE node_infiniband_port_errors_received_total counter
node_infiniband_port_errors_received_total{device="mlx5_0",port="1"} 17
node_infiniband_port_errors_received_total{device="mlx5_0",port="2"} 0
# HELP node_infiniband_rate_bytes_per_second Maximum signal transfer rate
# TYPE node_infiniband_rate_bytes_per_second gauge
node_infiniband_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10
node_infiniband_rate_bytes_per_second{device="mlx5_0",port="2"} 1.25e+09
node_infiniband_rate_bytes_per_second{device="mlx5_1",port="1"} 2.5e+10
# HELP node_infiniband_state_id State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, \
5: act defer)
# TYPE node_infiniband_state_id gauge
node_infiniband_state_id{device="mlx5_0",port="1"} 4
node_infiniband_state_id{device="mlx5_0",port="2"} 1
node_infiniband_state_id{device="mlx5_1",port="1"} 4
# HELP node_infiniband_symbol_error_total Number of minor link errors detected on one or more physical lanes.
# TYPE node_infiniband_symbol_error_total counter
node_infiniband_symbol_error_total{device="mlx5_0",port="1"} 65535
node_infiniband_symbol_error_total{device="mlx5_0",port="2"} 0
# HELP node_infiniband_out_of_buffer_drops_total The number of drops occurred due to lack of WQE for the associated QPs.
# TYPE node_infiniband_out_of_buffer_drops_total counter
node_infiniband_out_of_buffer_drops_total{device="mlx5_0",port="1"} 3
"""


def scraped(text: str, **target: str) -> list[Sample]:
    """The samples of a scrape with the target labels Prometheus adds (``instance``, a relabelled ``node``)."""
    extra = tuple(target.items())
    return [Sample(s.name, tuple(sorted((*s.labels, *extra))), s.value) for s in parse(text).samples]


def test_the_scrape_reads_as_the_sysfs_reader_would() -> None:
    got = prom_nic.network_readings(scraped(SCRAPE, instance="gpu-7:9100"), NODE_LABELS, {"gpu-7"}.__contains__)
    readings = got["gpu-7"]
    assert readings.problems == ()
    assert [n.device for n in readings.nics] == ["mlx5_0", "mlx5_1"]
    up, polling = readings.nics[0].ports
    assert (up.name, up.state, up.phys_state, up.rate_gbps, up.up) == ("mlx5_0/1", "ACTIVE", "LinkUp", 400.0, True)
    assert up.counters == {"link_downed": 2, "port_rcv_errors": 17, "symbol_error": 65535,
                           "hw_counters/out_of_buffer": 3}
    assert (polling.state, polling.phys_state, polling.rate_gbps, polling.up) == ("DOWN", "Polling", 10.0, False)
    no_pma = readings.nics[1].ports[0]
    assert no_pma.counters == {} and no_pma.rate_gbps == 200.0  # no counter series: no value, never 0
    assert up.link_layer == "" and readings.nics[0].pci_address == ""  # what node_exporter does not say


@pytest.mark.parametrize(("target", "node"), [
    ({"instance": "gpu-7:9100"}, "gpu-7"),  # kube-prometheus: instance relabelled to the pod's node name
    ({"instance": "10.0.3.7:9100", "node": "gpu-7"}, "gpu-7"),  # a node label wins over instance
    ({"instance": "10.0.3.7:9100", "kubernetes_node": "gpu-7"}, "gpu-7"),
    ({"instance": "10.0.3.7:9100"}, None),  # an address names no node
    ({"instance": "cpu-1:9100"}, None),  # a host the source has no GPU readings for
])
def test_a_series_is_placed_on_a_node_by_its_labels(target: dict[str, str], node: str | None) -> None:
    got = prom_nic.network_readings(scraped(SCRAPE, **target), NODE_LABELS, {"gpu-7"}.__contains__)
    assert list(got) == ([node] if node else [])


def test_instance_host() -> None:
    assert prom_nic.instance_host("gpu-7:9100") == "gpu-7"
    assert prom_nic.instance_host("[fe80::1]:9100") == "fe80::1"
    assert prom_nic.instance_host("gpu-7") == "gpu-7"


def test_an_id_outside_node_exporters_is_said_not_guessed() -> None:
    text = ('node_infiniband_state_id{device="mlx5_0",port="1"} 9\n'
            'node_infiniband_physical_state_id{device="mlx5_0",port="1"} 5\n'
            'node_infiniband_state_id{device="mlx5_0",port="x"} 4\n')
    readings = prom_nic.network_readings(scraped(text, node="n"), NODE_LABELS, lambda _: True)["n"]
    port = readings.nics[0].ports[0]
    assert port.state == "" and not port.up
    assert any("state_id 9 is none of node_exporter's ids" in p for p in readings.problems)
    assert any("port 'x' is not a port number" in p for p in readings.problems)


def test_the_query_asks_each_series_per_node_and_port_by_name() -> None:
    query = prom_nic.network_query(("Hostname", "node"), ("link_downed", "symbol_error"))
    assert query.count(" or ") == 4
    assert ('label_replace(max by (Hostname, node, instance, device, port) (node_infiniband_symbol_error_total), '
            '"gpuremediate_metric", "node_infiniband_symbol_error_total", "", "")') in query


def test_wanted_counters_follow_the_policies() -> None:
    assert prom_nic.wanted_counters([(False, ("symbol_error",))]) is None  # no group asks: no query
    assert prom_nic.wanted_counters([(True, ("symbol_error", "hw_counters/no_such")), (False, ("port_rcv_errors",))]) \
        == ("link_downed", "symbol_error")


# ---- the same judge as the agent's sysfs path -------------------------------------------------------------


def node_exporter_text(readings: NetworkReadings) -> str:
    """What node_exporter's collector writes for a sysfs tree (its formats; no HELP lines, parsed alike)."""
    states = {v: k for k, v in prom_nic.STATE_NAMES.items()}
    phys = {v: k for k, v in prom_nic.PHYS_STATE_NAMES.items()}
    lines = []
    for nic in readings.nics:
        for port in nic.ports:
            labels = f'{{device="{port.device}",port="{port.port}"}}'
            lines += [f"node_infiniband_state_id{labels} {states[port.state]}",
                      f"node_infiniband_physical_state_id{labels} {phys[port.phys_state]}",
                      f"node_infiniband_rate_bytes_per_second{labels} {int((port.rate_gbps or 0) * 125_000_000)}"]
            lines += [f"{prom_nic.SYSFS_COUNTERS[name]}{labels} {value}" for name, value in port.counters.items()
                      if name in prom_nic.SYSFS_COUNTERS]
    return "\n".join(lines) + "\n"


class Both:
    """One sysfs tree judged twice: as the agent reads it, and through node_exporter's series."""

    def __init__(self, root: Path) -> None:
        self.tree = NicTree(root)
        self.agent, self.controller = NetworkJudge("gpu-7"), NetworkJudges()
        self.policy = NetworkPolicy(prometheus=True, clear_after_s=30.0)
        self.now = 1000.0

    def read(self, after_s: float = 10.0) -> list[tuple[str, str, str]]:
        self.now += after_s
        sysfs = read_network(self.tree.root)
        agent = [(f.kind, f.code, f.action) for f in self.agent.judge(sysfs, self.policy, self.now)]
        series = scraped(node_exporter_text(sysfs), instance="gpu-7:9100")
        prom = prom_nic.network_readings(series, NODE_LABELS, {"gpu-7"}.__contains__).get("gpu-7")
        controller = [(f.kind, f.code, f.action) for f in self.controller.findings("gpu-7", prom, self.policy,
                                                                                   self.now)]
        assert controller == agent
        return agent


def test_every_fault_is_judged_as_the_agent_judges_it(tmp_path: Path) -> None:
    both = Both(tmp_path)
    assert both.read() == []
    both.tree.traffic(10**9)
    assert both.read() == []  # a busy healthy node: nothing
    both.tree.port_down("mlx5_2")
    assert both.read() == [("nic-down", "mlx5_2", "cordon")]
    both.tree.port_up("mlx5_2")
    both.read()
    assert both.read(31.0) == []  # lifted after the hysteresis
    both.tree.downtrain("mlx5_1", width=2)
    assert both.read() == [("nic-degraded", "mlx5_1", "cordon")]  # below what the port itself showed
    both.tree.heal()
    both.read()
    both.read(31.0)
    both.tree.flap("mlx5_4", times=3)
    assert both.read() == [("nic-flapping", "mlx5_4", "cordon")]
    both.read(700.0)
    both.read(31.0)
    both.tree.add_errors("mlx5_5", count=150)
    assert both.read() == [("nic-errors", "mlx5_5", "cordon")]


def test_a_gap_in_prometheus_keeps_the_findings_it_had(tmp_path: Path) -> None:
    judges = NetworkJudges()
    tree = NicTree(tmp_path)
    policy = NetworkPolicy(prometheus=True)
    first = prom_nic.network_readings(scraped(node_exporter_text(read_network(tmp_path)), node="n"), NODE_LABELS,
                                      lambda _: True)["n"]
    assert judges.findings("n", first, policy, 0.0) == []
    tree.port_down("mlx5_3")
    down = prom_nic.network_readings(scraped(node_exporter_text(read_network(tmp_path)), node="n"), NODE_LABELS,
                                     lambda _: True)["n"]
    found = judges.findings("n", down, policy, 10.0)
    assert [f.kind for f in found] == ["nic-down"]
    assert judges.findings("n", None, policy, 20.0) == found  # nothing read for the node: not a link back up
    assert judges.kinds("n") == {"nic-down"}  # the controller's gpuremediate_nic_nodes counts it
    assert judges.findings("n", down, NetworkPolicy(), 30.0) == []  # [network] prometheus off: nothing judged
    assert judges.kinds("n") == set()
    judges.forget(lambda _: False)
    assert judges.findings("n", None, policy, 40.0) == []


def test_a_port_of_unknown_link_layer_is_not_held_to_another_ports_rate() -> None:
    """An InfiniBand port at 400 and a RoCE port at 200 on one node: node_exporter names neither's link layer."""
    text = "".join(f'node_infiniband_{m}{{device="{d}",port="1"}} {v}\n' for d, rate in (("mlx5_0", 5e10),
                                                                                          ("mlx5_1", 2.5e10))
                   for m, v in (("state_id", 4), ("physical_state_id", 5), ("rate_bytes_per_second", rate)))
    readings = prom_nic.network_readings(scraped(text, node="n"), NODE_LABELS, lambda _: True)["n"]
    assert NetworkJudges().findings("n", readings, NetworkPolicy(prometheus=True), 0.0) == []
