"""The busy-cluster writer against the emulator: other writers bump Nodes, so guarded patches meet 409s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NODES
from sim.busy import KEY_PREFIX, BusyWriter, writes_from_env
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim
from sim.waiting import wait_for


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[KubeClient, NodeSim]]:
    srv = KubeAPIServer().start()
    client = KubeClient(load_config(srv.write_kubeconfig(tmp_path / "kubeconfig")))
    nodesim = NodeSim(client)
    for name in ("gpu-1", "gpu-2"):
        nodesim.add_node(name)
    yield client, nodesim
    client.close()
    srv.stop()


def _taints(client: KubeClient, name: str) -> list[dict[str, Any]]:
    return list(client.get(NODES, name)["spec"].get("taints") or [])


def _ready(client: KubeClient, name: str) -> dict[str, Any]:
    return next(c for c in client.get(NODES, name)["status"]["conditions"] if c["type"] == "Ready")


def test_a_guarded_patch_from_before_a_busy_round_meets_409(env: tuple[KubeClient, NodeSim]) -> None:
    client, _ = env
    busy = BusyWriter(client, ["gpu-1"], seed=1)
    read = client.get(NODES, "gpu-1")
    busy.round()
    patch = {"metadata": {"resourceVersion": read["metadata"]["resourceVersion"],
                          "annotations": {"gpuremediate.io/record": "{}"}}}
    with pytest.raises(errors.Conflict):
        client.patch(NODES, "gpu-1", patch)
    assert busy.writes == 1


def test_it_never_touches_the_controllers_keys(env: tuple[KubeClient, NodeSim]) -> None:
    client, _ = env
    mine = {"gpuremediate.io/record": '{"state": "draining"}'}
    client.patch(NODES, "gpu-1", {"metadata": {"annotations": mine, "labels": {"gpuremediate.io/state": "draining"}}})
    busy = BusyWriter(client, ["gpu-1", "gpu-2"], seed=7)
    for _ in range(40):
        busy.round()
    meta = client.get(NODES, "gpu-1")["metadata"]
    assert meta["annotations"]["gpuremediate.io/record"] == mine["gpuremediate.io/record"]
    assert meta["labels"]["gpuremediate.io/state"] == "draining"
    busy_keys = {k for k in [*meta["annotations"], *meta["labels"]] if k.startswith(KEY_PREFIX)}
    assert busy_keys, "no annotation or label written in 40 rounds"
    assert not any(k.startswith("gpuremediate.io/") for k in busy_keys)

class RecordingClient:
    """Only what sync_taints and random writes call: the patches sent (an API server that taints nodes
    itself, as the emulator does, would hide whether the writer does)."""

    def __init__(self, conflict: bool = False) -> None:
        self.patches: list[dict[str, Any]] = []
        self.conflict = conflict

    def patch(self, res: object, name: str, body: dict[str, Any], *args: object, **kw: object) -> dict[str, Any]:
        self.patches.append(body)
        if self.conflict:
            raise errors.Conflict(409, {"reason": "Conflict", "message": "the object has been modified"})
        return body


def _node(ready: str, unschedulable: bool, taints: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "resourceVersion": "41"},
            "spec": {"unschedulable": unschedulable, "taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}


OWN = {"key": "nvidia.com/gpu-fault", "value": "xid-79", "effect": "NoSchedule"}
NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


@pytest.mark.parametrize(("ready", "unschedulable", "before", "after"), [
    ("False", False, [OWN], [OWN, NOT_READY]),
    ("True", False, [OWN, NOT_READY], [OWN]),
    ("True", True, [], [UNSCHEDULABLE]),
    ("False", True, [UNSCHEDULABLE], [UNSCHEDULABLE, NOT_READY]),
    ("True", False, [UNSCHEDULABLE], None),
])
def test_condition_taints_follow_ready_and_cordon_and_keep_the_others(
        ready: str, unschedulable: bool, before: list[dict[str, Any]], after: list[dict[str, Any]] | None) -> None:
    client = RecordingClient()
    busy = BusyWriter(client, ["gpu-1"], seed=3)  # type: ignore[arg-type]
    busy.sync_taints(_node(ready, unschedulable, before))
    assert client.patches == [{"metadata": {"resourceVersion": "41"}, "spec": {"taints": after}}]


def test_no_taint_write_when_they_are_right_and_a_409_is_left_for_the_next_round() -> None:
    client = RecordingClient(conflict=True)
    busy = BusyWriter(client, ["gpu-1"], seed=3)  # type: ignore[arg-type]
    busy.sync_taints(_node("True", False, [OWN]))
    assert client.patches == []
    busy.sync_taints(_node("False", False, [OWN]))
    assert len(client.patches) == 1 and busy.conflicts == 1 and busy.writes == 0


def test_without_taints_it_leaves_them_to_a_real_controller_manager() -> None:
    client = RecordingClient()
    busy = BusyWriter(client, ["gpu-1"], taints=False, seed=5)  # type: ignore[arg-type]
    for _ in range(20):
        busy.round()  # no list of nodes either: the recording client has none
    busy.react(_node("True", False, []), _node("True", True, []))
    assert len(client.patches) == 21 and not any("spec" in p for p in client.patches)


def test_a_heartbeat_never_changes_a_condition(env: tuple[KubeClient, NodeSim]) -> None:
    client, nodesim = env
    busy = BusyWriter(client, ["gpu-1"], seed=3)
    nodesim.reboot("gpu-1", down_s=60)
    before = _ready(client, "gpu-1")
    busy.heartbeat("gpu-1")
    after = _ready(client, "gpu-1")
    assert after["status"] == before["status"] == "False" and after["reason"] == before["reason"]
    assert after["lastHeartbeatTime"] >= before["lastHeartbeatTime"]


def test_on_the_emulator_a_reboot_and_a_cordon_leave_one_taint_of_each_kind(env: tuple[KubeClient, NodeSim]) -> None:
    """Whoever adds them (the writer, or an API server that runs the node lifecycle controller), the
    condition taints are there once each, and gone once the condition is."""
    client, nodesim = env
    busy = BusyWriter(client, ["gpu-1"], seed=5)
    nodesim.reboot("gpu-1", down_s=60)
    client.patch(NODES, "gpu-1", {"spec": {"unschedulable": True}})
    busy.round()

    def kinds() -> list[tuple[str, str]]:
        return [(t["key"], t["effect"]) for t in _taints(client, "gpu-1")]

    # the emulator's controllers add the taints right after the write, in their own thread: wait, on a busy machine
    wanted = {("node.kubernetes.io/not-ready", "NoSchedule"), ("node.kubernetes.io/unschedulable", "NoSchedule")}
    wait_for(lambda: wanted <= set(kinds()), 5.0, "the condition taints", seen=kinds)
    assert len(kinds()) == len(set(kinds())), kinds()
    nodesim.nodes["gpu-1"].down_until = 0.1  # the reboot is over: the next tick posts Ready
    nodesim.tick()
    client.patch(NODES, "gpu-1", {"spec": {"unschedulable": None}})
    busy.round()
    wait_for(lambda: not [k for k, _ in kinds() if k.startswith("node.kubernetes.io/")], 5.0,
             "the condition taints gone", seen=kinds)


@pytest.mark.parametrize(("value", "rate"), [(None, 8.0), ("", 8.0), ("0", 0.0), ("off", 0.0), ("2.5", 2.5)])
def test_the_switch(value: str | None, rate: float) -> None:
    assert writes_from_env({} if value is None else {"GPUREMEDIATE_SIM_BUSY": value}) == rate


@pytest.mark.parametrize(("value", "message"), [("lots", "expected a number"), ("-1", "cannot be negative")])
def test_a_bad_switch_names_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        writes_from_env({"GPUREMEDIATE_SIM_BUSY": value})
    assert "GPUREMEDIATE_SIM_BUSY" in str(info.value)


def test_a_second_write_in_a_row_meets_409_after_its_reaction(env: tuple[KubeClient, NodeSim]) -> None:
    """As kube-controller-manager answers a cordon within milliseconds: a write guarded by the
    resourceVersion of one's own previous write is refused."""
    client, _ = env
    busy = BusyWriter(client, ["gpu-1"], seed=2)
    before = client.get(NODES, "gpu-1")
    first = client.patch(NODES, "gpu-1", {"metadata": {"resourceVersion": before["metadata"]["resourceVersion"],
                                                       "labels": {"gpuremediate.io/state": "draining"}}})
    busy.react(before, first)
    with pytest.raises(errors.Conflict):
        client.patch(NODES, "gpu-1", {"metadata": {"resourceVersion": first["metadata"]["resourceVersion"],
                                                   "labels": {"gpuremediate.io/state": "repairing"}}})
    assert busy.reactions == 1


def test_it_does_not_react_to_its_own_writes_or_to_status(env: tuple[KubeClient, NodeSim]) -> None:
    client, _ = env
    busy = BusyWriter(client, ["gpu-1"], seed=2)
    before = client.get(NODES, "gpu-1")
    busy.random_write("gpu-1")
    busy.heartbeat("gpu-1")
    busy.react(before, client.get(NODES, "gpu-1"))
    assert busy.reactions == 0


def test_reactions_come_from_its_watch(env: tuple[KubeClient, NodeSim]) -> None:
    client, _ = env
    busy = BusyWriter(client, ["gpu-1"], writes_per_s=0.01, seed=2).start()
    try:
        wait_for(lambda: busy._watch is not None and busy._watch.has_synced(), 5, "the busy writer's watch")
        client.patch(NODES, "gpu-1", {"metadata": {"labels": {"gpuremediate.io/state": "draining"}}})
        wait_for(lambda: "sim.example.com/reacted" in (client.get(NODES, "gpu-1")["metadata"].get("annotations")
                                                        or {}),
                 5, "the busy writer's reaction",
                 seen=lambda: {"reactions": busy.reactions, "writes": busy.writes, "errors": busy.errors,
                               "annotations": client.get(NODES, "gpu-1")["metadata"].get("annotations")})
    finally:
        busy.stop()
