"""policy.network: the judge of RDMA NIC ports, on sysfs trees sim/nic_sysfs writes in the kernel's formats."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpuremediate.policy import conditions as c
from gpuremediate.policy.config import PolicyError, parse_policy
from gpuremediate.policy.network import (
    NetworkJudge,
    NetworkPolicy,
    condition_rules,
    reason_of,
)
from gpuremediate.signals.nic import read_network
from gpuremediate.vocab.findings import ACTION_CORDON, ACTION_REBOOT
from gpuremediate.vocab.schema import merge_section
from sim.nic_sysfs import NicTree

FIXTURE = Path(__file__).parents[1] / "signals" / "data" / "sysfs-dgx-h100"
POLICY = NetworkPolicy(clear_after_s=30.0, stuck_down_after_s=300.0)


class Node:
    """A tree, a judge and a clock."""

    def __init__(self, root: Path, policy: NetworkPolicy = POLICY) -> None:
        self.tree = NicTree(root)
        self.judge = NetworkJudge("node-a")
        self.policy = policy
        self.now = 1000.0

    def read(self, after_s: float = 10.0) -> list[tuple[str, str, str]]:
        self.now += after_s
        found = self.judge.judge(read_network(self.tree.root), self.policy, self.now, {"mlx5_2": ("GPU-2",)})
        return [(f.kind, f.code, f.action) for f in found]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    node = Node(tmp_path)
    assert node.read() == []
    return node


def test_a_healthy_busy_node_gives_nothing(node: Node) -> None:
    for _ in range(20):
        node.tree.traffic(10**9)  # data counters race, error counters stay
        assert node.read(30.0) == []


def test_the_fixture_node_gives_nothing_however_long_it_is_read() -> None:
    judge = NetworkJudge("dgx")
    readings = read_network(FIXTURE)
    assert all(judge.judge(readings, NetworkPolicy(), t * 30.0) == [] for t in range(50))
    assert judge.judge(readings, NetworkPolicy(watch_never_up=True, ignore_ports=("mlx5_9",)), 9999.0) == []


def test_a_node_without_infiniband_gives_nothing(tmp_path: Path) -> None:
    assert NetworkJudge("cpu").judge(read_network(tmp_path), NetworkPolicy(watch_never_up=True), 0.0) == []


def test_port_down_then_up_is_lifted_after_the_hysteresis(node: Node) -> None:
    node.tree.port_down("mlx5_2")
    assert node.read() == [("nic-down", "mlx5_2", ACTION_CORDON)]
    node.tree.port_up("mlx5_2")
    assert node.read() == [("nic-down", "mlx5_2", ACTION_CORDON)]  # clearing, not yet lifted
    assert node.read(30.0) == []


def test_a_port_that_comes_back_briefly_stays_one_finding(node: Node) -> None:
    node.tree.port_down("mlx5_2")
    first = node.judge.judge(read_network(node.tree.root), POLICY, node.now + 1)[0]
    node.tree.port_up("mlx5_2")
    node.read(5.0)
    node.tree.port_down("mlx5_2")
    again = node.judge.judge(read_network(node.tree.root), POLICY, node.now + 5)[0]
    assert again.fingerprint == first.fingerprint


def test_a_port_down_past_the_hold_asks_for_a_reboot(node: Node) -> None:
    node.tree.port_down("mlx5_2")
    assert node.read() == [("nic-down", "mlx5_2", ACTION_CORDON)]
    assert node.read(301.0) == [("nic-down", "mlx5_2", ACTION_REBOOT)]
    finding = node.judge.judge(read_network(node.tree.root), POLICY, node.now, {"mlx5_2": ("GPU-2",)})[0]
    assert reason_of(finding) == "NicStuckDown:mlx5_2"
    assert finding.gpus == ("GPU-2",) and "GPUs on its rail: GPU-2" in finding.message


def test_a_port_never_up_is_not_judged_unless_asked(tmp_path: Path) -> None:
    tree = NicTree(tmp_path)
    tree.port_down("mlx5_7", phys_state="Polling")
    readings = read_network(tmp_path)
    assert NetworkJudge("n").judge(readings, POLICY, 0.0) == []
    watched = NetworkJudge("n").judge(readings, NetworkPolicy(watch_never_up=True), 0.0)
    assert [(f.kind, f.code) for f in watched] == [("nic-down", "mlx5_7")]


def test_an_ignored_port_gives_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, NetworkPolicy(ignore_ports=("mlx5_2/1", "mlx5_[56]")))
    node.read()
    node.tree.port_down("mlx5_2")
    node.tree.downtrain("mlx5_5")
    node.tree.flap("mlx5_6", times=9)
    assert node.read() == []
    node.tree.port_down("mlx5_3")
    assert node.read() == [("nic-down", "mlx5_3", ACTION_CORDON)]


def test_downtrained_below_the_peers_rate(node: Node) -> None:
    node.tree.downtrain("mlx5_1", width=2)
    assert node.read() == [("nic-degraded", "mlx5_1", ACTION_CORDON)]
    node.tree.heal()
    node.read()
    assert node.read(31.0) == []


def test_downtrained_from_boot_is_seen_against_an_explicit_rate(tmp_path: Path) -> None:
    tree = NicTree(tmp_path)
    for index in range(8):
        tree.downtrain(f"mlx5_{index}", width=2)  # every port at 200: no peer shows more
    readings = read_network(tmp_path)
    assert NetworkJudge("n").judge(readings, POLICY, 0.0) == []
    found = NetworkJudge("n").judge(readings, NetworkPolicy(expected_rate_gbps=400), 0.0)
    assert len(found) == 8 and {f.kind for f in found} == {"nic-degraded"}


def test_flapping_is_counted_in_the_window_not_ever(node: Node) -> None:
    node.tree.flap("mlx5_4", times=2)
    assert node.read() == []
    node.tree.flap("mlx5_4", times=1)
    assert node.read() == [("nic-flapping", "mlx5_4", ACTION_CORDON)]
    node.read(600.0)  # the flaps leave the window
    assert node.read(31.0) == []


def test_errors_are_a_rise_over_the_window_never_a_total(tmp_path: Path) -> None:
    tree = NicTree(tmp_path)
    tree.add_errors("mlx5_5", count=10**6)  # a huge old total
    node = Node.__new__(Node)
    node.tree, node.judge, node.policy, node.now = tree, NetworkJudge("n"), POLICY, 0.0
    assert node.read() == []
    for _ in range(5):
        tree.add_errors("mlx5_5", count=15, counter="port_rcv_errors")
        assert node.read(60.0) == []  # 75 in the window: under 100
    tree.add_errors("mlx5_5", count=30, counter="link_error_recovery")
    assert node.read(60.0) == [("nic-errors", "mlx5_5", ACTION_CORDON)]


def test_a_counter_reset_is_not_a_negative_rise(node: Node) -> None:
    node.tree.add_errors("mlx5_5", count=90)
    node.read()
    node.tree.port("mlx5_5").counters["symbol_error"] = 20  # the driver reloaded: counters from zero
    node.tree.write()
    assert node.read() == [("nic-errors", "mlx5_5", ACTION_CORDON)]  # 90 + 20


def test_roce_carrier_changes_count_as_flaps(tmp_path: Path) -> None:
    from sim.nic_sysfs import SimNic, SimPort
    tree = NicTree(tmp_path, [SimNic("mlx5_0", "0000:12:00.0", "0000:11:00.0", "0000:10:01.0", "pci0000:10", 0,
                                     ports=[SimPort(link_layer="Ethernet", speed="HDR")], netdev="eth2")], [])
    judge = NetworkJudge("n")
    assert judge.judge(read_network(tmp_path), POLICY, 0.0) == []
    tree.port("mlx5_0").carrier_changes += 6  # three downs and ups; link_downed not counted by this driver
    tree.write()
    assert [f.kind for f in judge.judge(read_network(tmp_path), POLICY, 10.0)] == ["nic-flapping"]


def test_a_nic_gone_from_sysfs_is_down(node: Node) -> None:
    node.tree.gone("mlx5_6")
    assert node.read() == [("nic-down", "mlx5_6", ACTION_CORDON)]
    node.tree.gone("mlx5_6", present=True)
    node.read()
    assert node.read(31.0) == []


def test_disabled_gives_nothing(node: Node) -> None:
    node.tree.port_down("mlx5_2")
    assert node.judge.judge(read_network(node.tree.root), NetworkPolicy(enabled=False), node.now) == []


def test_the_section_parses_and_refuses_bad_values() -> None:
    policy = merge_section(NetworkPolicy(), tomllib.loads(
        'ignore_ports = ["mlx5_1/2"]\nexpected_rate_gbps = 400\ndown_action = "reboot"\nerror_counters = '
        '["symbol_error", "hw_counters/out_of_buffer"]'), "network")
    assert policy.ignored("mlx5_1/2") and not policy.ignored("mlx5_1/1")
    assert policy.down_action == ACTION_REBOOT and policy.expected_rate_gbps == 400.0
    for bad, key in (('ignore_ports = ["a b"]', "ignore_ports"), ("flap_count = 0", "flap_count"),
                     ('error_counters = ["../x"]', "error_counters"), ("window_s = 1", "window_s")):
        with pytest.raises(PolicyError, match=f"network.{key}"):
            merge_section(NetworkPolicy(), tomllib.loads(bad), "network")
    assert parse_policy(tomllib.loads("[network]\nflap_count = 5\n")).defaults.network.flap_count == 5


def test_the_controller_maps_the_agents_condition_to_the_sections_action() -> None:
    policy = NetworkPolicy(degraded_action="none")
    rules = condition_rules(policy)
    node = {"metadata": {"name": "n"}, "status": {"conditions": [
        {"type": c.GPU_NETWORK_HEALTHY, "status": "False", "reason": "NicStuckDown:mlx5_3",
         "message": "nic-down mlx5_3/1: state DOWN", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    view = c.condition_view(node, c.ConditionsPolicy(), 1767225600.0 + 10, rules)
    assert [(f.kind, f.code, f.action) for f in view.findings] == [("nic-down", "mlx5_3", ACTION_REBOOT)]
    node["status"]["conditions"][0]["reason"] = "NicDegraded:mlx5_1"  # type: ignore[index]
    view = c.condition_view(node, c.ConditionsPolicy(), 1767225600.0 + 10, rules)
    assert [(f.kind, f.code, f.action) for f in view.findings] == [("nic-degraded", "mlx5_1", "none")]
    assert condition_rules(NetworkPolicy(enabled=False)) == ()


def test_a_nic_finding_names_only_the_gpus_on_its_nics_rail(tmp_path: Path) -> None:
    """The agent's message holds every finding (two NICs down: both rails); the controller's finding for the worst
    NIC names that NIC's rail alone (status -o json's fault gpus, a reset's targets)."""
    a, b = "GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b"
    judge = NetworkJudge("n")
    tree = NicTree(tmp_path)
    rails = {"mlx5_3": (a,), "mlx5_5": (b,)}
    judge.judge(read_network(tree.root), POLICY, 1000.0, rails)
    tree.port_down("mlx5_3")
    tree.port_down("mlx5_5")
    found = judge.judge(read_network(tree.root), POLICY, 1010.0, rails)
    assert [(f.code, f.gpus) for f in found] == [("mlx5_3", (a,)), ("mlx5_5", (b,))]
    node = {"metadata": {"name": "n"}, "status": {"conditions": [
        {"type": c.GPU_NETWORK_HEALTHY, "status": "False", "reason": reason_of(found[0]),
         "message": "; ".join(f.message for f in found), "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    view = c.condition_view(node, c.ConditionsPolicy(), 1767225600.0 + 10, condition_rules(POLICY))
    assert [(f.code, f.gpus) for f in view.findings] == [("mlx5_3", (a,))]
    node["status"]["conditions"][0]["message"] = "nic-down mlx5_3/1: gone → cordon"  # type: ignore[index]
    view = c.condition_view(node, c.ConditionsPolicy(), 1767225600.0 + 10, condition_rules(POLICY))
    assert view.findings[0].gpus == ()  # no rail said: the node's, not every GPU the message could name
