"""The GPURemediation condition and the unhealthy taint: pure builders, then against the API emulator with
other writers' conditions and taints on the node."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions import node_status as ns
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NODES
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord
from gpuremediate.vocab.schema import PolicyError, merge_section
from sim.kubeapi import KubeAPIServer

NOW = 1_800_000_000.0
OTHERS_TAINT = {"key": "example.com/maintenance", "value": "soon", "effect": "NoSchedule"}
NPD_CONDITION = {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock",
                 "message": "kernel has no deadlock", "lastHeartbeatTime": "2027-01-15T07:00:00Z",
                 "lastTransitionTime": "2027-01-01T00:00:00Z"}


def held(state: str = states.DRAINING, message: str = "XID 79 on GPU-1: reboot") -> NodeRecord:
    return NodeRecord(state=state, since=NOW, reason="xid-79", message=message)


def node(taints: list[dict[str, Any]] | None = None, conditions: list[dict[str, Any]] | None = None,
         rv: str = "7") -> dict[str, Any]:
    return {"metadata": {"name": "gpu-node-1", "resourceVersion": rv},
            "spec": {"taints": taints or []}, "status": {"conditions": conditions or []}}


# --- the condition ---------------------------------------------------------------------------------


def test_condition_is_true_while_held_with_the_state_as_reason_and_why_as_message() -> None:
    cond = ns.remediation_condition(node(), held(), NOW)
    assert cond is not None
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        "GPURemediation", "True", "Draining", "XID 79 on GPU-1: reboot")
    assert cond["lastTransitionTime"] == cond["lastHeartbeatTime"] == "2027-01-15T08:00:00Z"


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = ns.remediation_condition(node(), held(states.DRAINING), NOW)
    assert first is not None
    repairing = ns.remediation_condition(node(conditions=[first]), held(states.REPAIRING, "rebooting"), NOW + 60)
    assert repairing is not None and repairing["reason"] == "Repairing"
    assert repairing["lastTransitionTime"] == first["lastTransitionTime"]
    healthy = ns.remediation_condition(node(conditions=[repairing]), NodeRecord(), NOW + 120)
    assert healthy is not None and healthy["status"] == "False" and healthy["reason"] == "Healthy"
    assert healthy["lastTransitionTime"] == ns.rfc3339(NOW + 120)


def test_no_write_when_only_the_heartbeat_would_change() -> None:
    first = ns.remediation_condition(node(), held(), NOW)
    assert first is not None
    assert ns.remediation_condition(node(conditions=[first]), held(), NOW + 30) is None


def test_a_node_never_held_gets_no_condition() -> None:
    assert ns.remediation_condition(node(), None, NOW) is None
    assert ns.remediation_condition(node(), NodeRecord(), NOW) is None


def test_build_condition_refuses_a_bad_status() -> None:
    with pytest.raises(ValueError, match="status must be True, False or Unknown"):
        ns.build_condition(None, "X", "yes", "R", "m", NOW)


def test_state_reason_is_camel_case() -> None:
    assert [ns.state_reason(s) for s in (states.QUARANTINED, "record-malformed")] == ["Quarantined",
                                                                                     "RecordMalformed"]


# --- the taint -------------------------------------------------------------------------------------

TAINT = ns.TaintPolicy(enabled=True).as_taint()


def test_adding_keeps_other_taints_and_carries_the_resource_version() -> None:
    change = ns.taint_change(node([OTHERS_TAINT]), TAINT, want=True, tainted_by_us=False)
    assert change.patch == {"metadata": {"resourceVersion": "7"},
                            "spec": {"taints": [OTHERS_TAINT, {"key": "gpuremediate.io/unhealthy",
                                                               "effect": "NoSchedule"}]}}
    assert change.tainted_by_us


def test_removing_takes_off_only_ours() -> None:
    ours = dict(TAINT)
    change = ns.taint_change(node([OTHERS_TAINT, ours]), TAINT, want=False, tainted_by_us=True)
    assert change.patch is not None and change.patch["spec"]["taints"] == [OTHERS_TAINT]
    assert not change.tainted_by_us


def test_a_persons_taint_with_our_key_is_never_removed() -> None:
    present = ns.taint_change(node([dict(TAINT)]), TAINT, want=True, tainted_by_us=False)
    assert present.patch is None and not present.tainted_by_us
    assert ns.taint_change(node([dict(TAINT)]), TAINT, want=False, tainted_by_us=False).patch is None


def test_nothing_to_do_writes_nothing() -> None:
    assert ns.taint_change(node([OTHERS_TAINT]), TAINT, want=False, tainted_by_us=True).patch is None
    assert ns.taint_change(node([dict(TAINT)]), TAINT, want=True, tainted_by_us=True).patch is None


def test_a_taint_patch_needs_the_resource_version() -> None:
    with pytest.raises(ValueError, match="resourceVersion"):
        ns.taint_change({"metadata": {"name": "n"}}, TAINT, want=True, tainted_by_us=False)


def test_remediation_taint_follows_the_record_and_the_policy() -> None:
    assert ns.remediation_taint(node(), held(), ns.TaintPolicy(enabled=True), False).tainted_by_us
    assert ns.remediation_taint(node(), held(), ns.TaintPolicy(), False).patch is None  # disabled
    off = ns.remediation_taint(node([dict(TAINT)]), NodeRecord(), ns.TaintPolicy(enabled=True), True)
    assert off.patch is not None and off.patch["spec"]["taints"] == []


def taint_policy(text: str) -> ns.TaintPolicy:
    return merge_section(ns.TaintPolicy(), tomllib.loads(text)["taint"], "taint")


def test_taint_policy_parses_and_names_bad_keys() -> None:
    policy = taint_policy('[taint]\nenabled = true\nkey = "example.com/gpu-bad"\nvalue = "x"\n'
                          'effect = "PreferNoSchedule"\n')
    assert policy.as_taint() == {"key": "example.com/gpu-bad", "value": "x", "effect": "PreferNoSchedule"}
    for text, error in (
        ('[taint]\neffect = "NoExec"\n', "taint.effect: expected one of NoSchedule, PreferNoSchedule, NoExecute"),
        ('[taint]\nkey = "not a key"\n', "taint.key: expected a taint key"),
        ('[taint]\nvalue = "has space"\n', "taint.value: expected a label value"),
        ("[taint]\ninstead_of_cordon = true\n", "taint.instead_of_cordon: needs taint.enabled = true"),
    ):
        with pytest.raises(PolicyError) as exc:
            taint_policy(text)
        assert str(exc.value).startswith(error)


# --- against the emulator --------------------------------------------------------------------------


@pytest.fixture
def api() -> Iterator[tuple[KubeAPIServer, KubeClient]]:
    server = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=server.url, token_source=StaticToken(server.admin_token)),
                        backoff_base=0.01, backoff_cap=0.05)
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"},
                          "spec": {"taints": [OTHERS_TAINT]},
                          "status": {"capacity": {"nvidia.com/gpu": "8"}, "conditions": [NPD_CONDITION]}})
    try:
        yield server, client
    finally:
        client.close()
        server.stop()


def test_condition_patch_leaves_other_writers_conditions(api: tuple[KubeAPIServer, KubeClient]) -> None:
    _, client = api
    current = client.get(NODES, "gpu-node-1")
    cond = ns.remediation_condition(current, held(), NOW)
    assert cond is not None
    client.patch(NODES, "gpu-node-1", ns.conditions_patch([cond]), patch_type=ns.STATUS_PATCH_TYPE,
                 subresource="status")
    after = client.get(NODES, "gpu-node-1")
    assert ns.find_condition(after, "KernelDeadlock") == NPD_CONDITION
    healthy = ns.remediation_condition(after, NodeRecord(), NOW + 60)
    assert healthy is not None
    client.patch(NODES, "gpu-node-1", ns.conditions_patch([healthy]), patch_type=ns.STATUS_PATCH_TYPE,
                 subresource="status")
    final = client.get(NODES, "gpu-node-1")
    assert [c["type"] for c in final["status"]["conditions"]] == ["KernelDeadlock", "GPURemediation"]
    assert ns.find_condition(final, "GPURemediation") == healthy


def test_taint_round_trip_keeps_another_writers_taint(api: tuple[KubeAPIServer, KubeClient]) -> None:
    _, client = api
    read = client.get(NODES, "gpu-node-1")
    before = ns.taints_of(read)  # the other writer's, and the admission plugin's not-ready taint
    assert OTHERS_TAINT in before and len(before) == 2
    add = ns.taint_change(read, TAINT, want=True, tainted_by_us=False)
    assert add.patch is not None
    client.patch(NODES, "gpu-node-1", add.patch)
    assert ns.taints_of(client.get(NODES, "gpu-node-1")) == [*before, TAINT]
    remove = ns.taint_change(client.get(NODES, "gpu-node-1"), TAINT, want=False, tainted_by_us=add.tainted_by_us)
    assert remove.patch is not None
    client.patch(NODES, "gpu-node-1", remove.patch)
    assert ns.taints_of(client.get(NODES, "gpu-node-1")) == before


def test_a_concurrent_taint_is_never_lost(api: tuple[KubeAPIServer, KubeClient]) -> None:
    _, client = api
    read = client.get(NODES, "gpu-node-1")
    racer = {"key": "racer.example.com/hold", "effect": "NoSchedule"}
    # another writer adds its taint between our read and our write
    client.patch(NODES, "gpu-node-1", {"spec": {"taints": [*ns.taints_of(read), racer]}})
    stale = ns.taint_change(read, TAINT, want=True, tainted_by_us=False)
    assert stale.patch is not None
    with pytest.raises(errors.Conflict):
        client.patch(NODES, "gpu-node-1", stale.patch)
    fresh = ns.taint_change(client.get(NODES, "gpu-node-1"), TAINT, want=True, tainted_by_us=False)
    assert fresh.patch is not None
    client.patch(NODES, "gpu-node-1", fresh.patch)
    assert ns.taints_of(client.get(NODES, "gpu-node-1")) == [*ns.taints_of(read), racer, TAINT]
