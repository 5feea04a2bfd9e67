"""explain and status name the NIC and the GPUs on its rail for a NIC finding (issue 45): the agent's judge on a
simulated tree → its GPUNetworkHealthy condition → the controller's finding → the record's fault → the views."""

from __future__ import annotations

import time
from pathlib import Path

from gpuremediate.actions.node_status import build_condition
from gpuremediate.agent.network import network_condition
from gpuremediate.fleet import explain, row_for
from gpuremediate.policy.conditions import ConditionsPolicy, condition_view, nic_said
from gpuremediate.policy.network import NIC_TAINT_KEY, NetworkJudge, NetworkPolicy, condition_rules
from gpuremediate.signals.nic import read_network
from gpuremediate.vocab.record import Fault, NodeRecord, node_patch
from sim.nic_sysfs import NicTree

RAILS = {"mlx5_3": ("GPU-3a", "GPU-3b"), "mlx5_0": ("GPU-0a",)}


def nic_record(tmp_path: Path, *down: str) -> NodeRecord:
    tree, judge, policy, now = NicTree(tmp_path), NetworkJudge("gpu-1"), NetworkPolicy(), time.time()
    judge.judge(read_network(tmp_path), policy, now - 30, RAILS)
    for nic in down:
        tree.port_down(nic)
    readings = read_network(tmp_path)
    wanted = network_condition(readings, tuple(judge.judge(readings, policy, now, RAILS)), str(tmp_path))
    cond = build_condition(None, wanted.type, wanted.status, wanted.reason, wanted.message, now)
    node = {"metadata": {"name": "gpu-1"}, "status": {"conditions": [cond]}}
    [f] = condition_view(node, ConditionsPolicy(), now, condition_rules(policy)).findings
    fault = Fault(f.kind, f.code, f.gpus, f.fingerprint, f.action, now - 60, now, f.message)
    return NodeRecord(state="cordoned", since=now - 60, fault=fault, reason="fault", cordoned_by_us=True)


def test_explain_names_the_nic_its_port_and_only_its_rails_gpus(tmp_path: Path) -> None:
    record = nic_record(tmp_path, "mlx5_3", "mlx5_0")
    assert record.fault is not None and record.fault.code == "mlx5_0"  # the condition's reason: the first NIC
    text = explain(record, "gpu-1")
    [fault] = [t for t in text.splitlines() if t.startswith("  Open fault:")]
    assert fault.startswith("  Open fault: nic-down on NIC mlx5_0; GPUs on its rail: GPU-0a; recommended action "
                            "cordon;")
    assert "GPU-3a" not in fault  # the other NIC's rail, named in the same condition message
    assert any(t.startswith("    nic-down mlx5_0/1: ") for t in text.splitlines())
    assert f"Tainted {NIC_TAINT_KEY}=mlx5_0:NoSchedule" in text
    assert "uncordon it once the NIC's port is healthy again" in text  # lifted by itself, not by a person
    assert "a person uncordoning it" not in text


def test_the_parser_reads_each_nic_of_a_message(tmp_path: Path) -> None:
    record = nic_record(tmp_path, "mlx5_3", "mlx5_0")
    assert record.fault is not None
    [three] = nic_said(record.fault.message, "mlx5_3")
    assert (three.kind, three.port, three.rail) == ("nic-down", "mlx5_3/1", ("GPU-3a", "GPU-3b"))
    assert nic_said(record.fault.message, "mlx5_9") == []


def test_status_names_the_nic(tmp_path: Path) -> None:
    record = nic_record(tmp_path, "mlx5_3")
    patch = node_patch(record, unschedulable=True)
    node = {"metadata": {"name": "gpu-1", **patch["metadata"]}, "spec": patch["spec"]}
    assert row_for(node).fault == "nic-down mlx5_3 (2 GPUs on its rail)"
