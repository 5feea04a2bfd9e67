"""The budget counts a GPU-level flow (one GPU out by a DeviceTaintRule, the node schedulable) in GPUs: its
isolated GPUs' share of the node's slot; node-level flows take a whole slot as before (issue 26)."""

from __future__ import annotations

from fractions import Fraction

from gpuremediate.policy.safety import Budget, DomainBudget, NodeView, admit, budget_check, node_view
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states as s

RACK = "topology.kubernetes.io/rack"


def gpu_level(name: str, state: str = s.DRAINING, **kw: object) -> NodeView:
    return NodeView(name, state=state, gpus=8, gpus_out=1, **kw)  # type: ignore[arg-type]


def healthy(count: int) -> list[NodeView]:
    return [NodeView(f"h{i}", gpus=8) for i in range(count)]


def test_eight_gpu_level_flows_fill_one_node_slot() -> None:
    fleet = [*(gpu_level(f"g{i}", s.REPAIRING) for i in range(7)), gpu_level("cand"), *healthy(10)]

    result = budget_check(fleet, "cand", Budget(1))
    assert result.allowed and result.in_use == 1.0  # 7/8 and the candidate's 1/8
    fleet.append(gpu_level("ninth", s.VALIDATING))
    refused = budget_check(fleet, "cand", Budget(1))
    assert not refused.allowed
    assert "budget full: 1 of 1 out of service" in refused.reason and "(1/8 of its GPUs)" in refused.reason


def test_a_node_level_candidate_needs_a_whole_slot_free() -> None:
    fleet = [gpu_level("g0", s.REPAIRING), NodeView("cand", state=s.DRAINING, gpus=8), *healthy(6)]

    refused = budget_check(fleet, "cand", Budget(1))
    assert not refused.allowed and "0.125 of 1" in refused.reason
    assert budget_check(fleet, "cand", Budget(2)).allowed


def test_a_gpu_level_node_cordoned_by_someone_or_not_ready_counts_whole() -> None:
    assert gpu_level("a").share == Fraction(1, 8)
    assert gpu_level("a", unschedulable=True).share == 1
    assert gpu_level("a", ready=False).share == 1
    assert NodeView("a", state=s.DRAINING, gpus=0, gpus_out=1).share == 1  # GPU count unknown: the safe side
    assert NodeView("a", state=s.DRAINING, gpus=8).share == 1  # node-level


def test_admit_lets_gpu_level_candidates_share_a_slot_oldest_first() -> None:
    fleet = [*(gpu_level(f"g{i}", first_seen=float(i), waiting=True) for i in range(10)), *healthy(4)]
    admitted = admit(fleet, [f"g{i}" for i in range(10)], Budget(1))
    assert admitted == [f"g{i}" for i in range(8)]


def test_domain_budgets_count_in_gpus_too() -> None:
    rack = {RACK: "r1"}
    fleet = [gpu_level("g0", s.REPAIRING, labels=rack), gpu_level("cand", labels=rack),
             NodeView("n", gpus=8, labels=rack), *healthy(8)]
    domains = [DomainBudget(RACK, 1)]

    assert budget_check(fleet, "cand", Budget(5), domains).allowed  # 1/8 + 1/8 in a rack of limit 1
    refused = budget_check(fleet, "n", Budget(5), domains)
    assert not refused.allowed and "domain budget full" in refused.reason and "0.25 of 1" in refused.reason


def test_node_view_reads_the_isolation_from_the_record_and_the_gpu_count_from_the_node() -> None:
    isolation = r.Isolation(scope=r.SCOPE_GPU, uuid="GPU-1", rule="gpur-x")
    record = r.NodeRecord(state=s.DRAINING, isolation=isolation)
    node = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.count": "4"},
                         "annotations": {r.RECORD_ANNOTATION: r.encode(record)}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    view = node_view(node)
    assert (view.gpus, view.gpus_out, view.share) == (4, 1, Fraction(1, 4))  # a DRA node: GFD's label counts
    assert view.waiting and not view.out_of_service  # its drain not admitted yet: holds no slot (no deadlock)
    widened = r.NodeRecord(state=s.DRAINING, isolation=r.Isolation(scope=r.SCOPE_NODE, uuid="GPU-1", why="x"))
    node["metadata"]["annotations"] = {r.RECORD_ANNOTATION: r.encode(widened)}  # type: ignore[index]
    assert node_view(node).share == 1


def _node(record: r.NodeRecord, unschedulable: bool = False) -> dict[str, object]:
    return {"metadata": {"name": "dp", "annotations": {r.RECORD_ANNOTATION: r.encode(record)}},
            "spec": {"unschedulable": unschedulable},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "7"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_gpu_the_device_plugin_holds_out_counts_in_gpus_until_its_node_level_validation() -> None:
    fault = r.Fault("xid", "48", ("GPU-3",), "xid:48", "reset-gpu", 80.0, 80.0, "XID 48")
    isolation = r.Isolation(r.SCOPE_GPU, "GPU-3", via=r.VIA_DEVICE_PLUGIN, effect=r.EFFECT_UNHEALTHY)
    repairing = r.NodeRecord(state=s.REPAIRING, since=80.0, fault=fault, isolation=isolation)
    assert node_view(_node(repairing)).share == Fraction(1, 8)
    cordoned = r.NodeRecord(state=s.VALIDATING, since=90.0, fault=fault, cordoned_by_us=True,
                            isolation=r.Isolation(r.SCOPE_NODE, "GPU-3", why="validation is node-level",
                                                  via=r.VIA_DEVICE_PLUGIN, effect=r.EFFECT_UNHEALTHY))
    assert node_view(_node(cordoned, unschedulable=True)).share == 1
