"""actions.node_status.nic_taints: gpuremediate.io/nic-degraded=<nic>:NoSchedule while held for a NIC fault."""

from __future__ import annotations

from gpuremediate.actions.node_status import nic_taints
from gpuremediate.vocab import states
from gpuremediate.vocab.record import Fault, NodeRecord

OTHER = {"key": "example.com/rack", "value": "r7", "effect": "PreferNoSchedule"}
NIC = {"key": "gpuremediate.io/nic-degraded", "value": "mlx5_3", "effect": "NoSchedule"}


def record(kind: str, state: str = states.CORDONED, code: str = "mlx5_3") -> NodeRecord:
    fault = Fault(kind=kind, code=code, gpus=(), fingerprint="f", action="cordon", first_seen=1.0, last_seen=1.0,
                  message="m")
    return NodeRecord(state=state, fault=fault)


def test_held_for_a_nic_fault_the_taint_names_the_nic_beside_others() -> None:
    assert nic_taints([OTHER], record("nic-down")) == [OTHER, NIC]
    assert nic_taints([OTHER, NIC], record("nic-down")) is None  # already there: no write
    assert nic_taints([NIC, OTHER], record("nic-flapping", code="mlx5_1")) == [
        OTHER, {**NIC, "value": "mlx5_1"}]


def test_healthy_or_another_fault_takes_it_off_and_leaves_the_rest() -> None:
    assert nic_taints([OTHER, NIC], record("nic-down", state=states.HEALTHY)) == [OTHER]
    assert nic_taints([OTHER, NIC], record("xid")) == [OTHER]
    assert nic_taints([OTHER, NIC], None) == [OTHER]
    assert nic_taints([OTHER], record("xid")) is None


def test_the_value_is_a_label_value() -> None:
    taints = nic_taints([], record("nic-errors", code="mlx5 0:1/" + "x" * 80))
    assert taints is not None
    value = taints[0]["value"]
    assert len(value) <= 63 and all(ch.isalnum() or ch in "._-" for ch in value)
