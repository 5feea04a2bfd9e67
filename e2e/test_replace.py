"""Replace as the ladder's last rung (issue 47): a node whose repairs are exhausted is replaced through its owner,
the Cluster API Machine of a MachineSet or the Karpenter NodeClaim the emulator serves (sim.node_owners: a deleted
one's node goes away and a new node registers under a new name, or under the old name with a new uid); a node no
owner would replace is quarantined with the reason; a dry run only says it would replace; a node deleted by someone
else mid-drain ends its flow (Event, metric, its DrainRequest deleted) and frees its budget slot; a node replaced
under its old name starts fresh.

The owner is simulated in the test process on the emulator only: on the ``apiserver`` and ``kubeconfig`` targets the
scenarios with an owner skip (make_cluster says why); the no-owner one runs everywhere a Job outcome can be chosen.

Run: ``python -m pytest e2e/test_replace.py -x -q``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import SYSTEM_NS, Cluster, EmulatorCluster, make_cluster
from e2e.plugins.remediation import drain_request_crd, install_crd
from e2e.test_escalation import fail_jobs
from e2e.test_plugins import DRAIN_API, custom_drain_policy, drain_requests
from gpuremediate.actions.jobs import JOB_LABEL
from gpuremediate.actions.replaced import DELETED, REPLACED_CONFIGMAP, REPLACED_KEY
from gpuremediate.kube import errors
from gpuremediate.kube.resources import CONFIGMAPS, NODES
from sim.node_owners import CAPI_GROUP, CAPI_NAMESPACE, KARPENTER_GROUP, MACHINES, NODECLAIMS, OwnerSim

NODE = "gpu-node-1"
REPLACE: dict[str, dict[str, Any]] = {
    "remediation.ladders": {"reset-gpu": [{"action": "reset-gpu", "attempts": 1}]},
    "remediation.replace": {"enabled": True, "timeout_s": 30},
}
REPLACED = "GPUNodeReplaced"


@pytest.fixture
def owned(tmp_path: Path) -> Iterator[Callable[[str], EmulatorCluster]]:
    """A cluster whose nodes the simulated ``provider`` owns (skipped where it is not simulated)."""
    made: list[EmulatorCluster] = []

    def make(provider: str) -> EmulatorCluster:
        c = make_cluster(tmp_path, node_owners=provider)
        assert isinstance(c, EmulatorCluster), c
        made.append(c.start())
        return c

    yield make
    for c in made:
        tail = c.controller_log().splitlines()[-40:]
        c.stop_controller()
        problems = c.log_problems()
        c.stop()
        if problems:
            print("\n".join(tail))
        assert problems == []


def owners(c: EmulatorCluster) -> OwnerSim:
    assert c.sim.owners is not None
    return c.sim.owners


def history(c: Cluster) -> list[dict[str, Any]]:
    try:
        cm = c.kube.get(CONFIGMAPS, REPLACED_CONFIGMAP, SYSTEM_NS)
    except errors.NotFound:
        return []
    entries: list[dict[str, Any]] = json.loads((cm.get("data") or {}).get(REPLACED_KEY) or "[]")
    return entries


def owner_deletes(c: Cluster, mark: int, group: str) -> list[tuple[str, ...]]:
    """The controller's deletes of owner objects (Machines, NodeClaims) since ``mark``."""
    return [m for m in c.mutations_since(mark) if m[0] == "delete" and m[1] == group]


def node_gone(c: Cluster, name: str) -> bool:
    try:
        c.kube.get(NODES, name)
    except errors.NotFound:
        return True
    return False


def replacement(c: EmulatorCluster) -> str:
    sim = owners(c)
    c.wait(lambda: bool(sim.replaced and sim.replaced[-1][1]), 20, "the replacement node registered")
    old, new = sim.replaced[-1]
    assert old == NODE
    return new


def exhaust_ladder(c: Cluster) -> None:
    fail_jobs(c, NODE, "reset-gpu")
    c.start_controller(REPLACE)
    c.inject(NODE, 2, "dbe", 1)


def left_alone(c: EmulatorCluster, new: str) -> None:
    """The replacement stays in service: no record beyond healthy, not cordoned, no Job of ours."""
    c.holds(lambda: c.state(new) == "healthy" and not c.unschedulable(new) and not c.jobs(new), 3,
            f"the replacement {new} left alone")


@pytest.mark.parametrize("provider, group, kind", [("cluster-api", CAPI_GROUP, "Machine"),
                                                   ("karpenter", KARPENTER_GROUP, "NodeClaim")])
def test_an_exhausted_ladder_replaces_the_node_through_its_owner(
        owned: Callable[[str], EmulatorCluster], provider: str, group: str, kind: str) -> None:
    c = owned(provider)
    before = owners(c).owner_of(NODE)
    assert before is not None
    node_uid = c.node(NODE)["metadata"]["uid"]
    mark = c.audit_mark()
    exhaust_ladder(c)
    event = c.wait_event(NODE, REPLACED, timeout=60)
    assert f"{kind} " in event["message"] and before.name in event["message"], event["message"]
    assert event["involvedObject"]["uid"] == node_uid
    assert node_gone(c, NODE)
    [entry] = history(c)
    assert (entry["node"], entry["node_uid"], entry["provider"], entry["target_uid"], entry["state"]) == \
        (NODE, node_uid, provider, before.uid, DELETED)
    assert before.name in entry["target"] and entry["provider_id"] == f"sim://{NODE}"
    new = replacement(c)
    left_alone(c, new)
    assert len(owner_deletes(c, mark, group)) == 1, owner_deletes(c, mark, group)
    assert c.event_reasons(NODE).count(REPLACED) == 1 and "GPUNodeDeletedMidFlow" not in c.event_reasons(NODE)
    c.wait_metric("gpuremediate_replacements_total", 1, provider=provider)
    c.wait_metric("gpuremediate_nodes_replaced_total", 1)
    cli_shows_the_replacement(c, before.name, provider)


STARTUP_TAINT = "gpuremediate.io/unvalidated"


def test_the_replacement_registers_tainted_and_is_validated_before_it_takes_work(
        owned: Callable[[str], EmulatorCluster]) -> None:
    """The replacement joins with the startup taint (as a Karpenter NodePool's startupTaints put it): the
    controller validates it (its validation Job) and takes the taint off in the write that says healthy."""
    c = owned("karpenter")
    owners(c).startup_taint = {"key": STARTUP_TAINT, "effect": "NoSchedule"}
    mark = c.audit_mark()
    fail_jobs(c, NODE, "reset-gpu")
    policy = {**REPLACE, "remediation.replace": {**REPLACE["remediation.replace"], "startup_taint": STARTUP_TAINT}}
    c.start_controller(policy)
    c.inject(NODE, 2, "dbe", 1)
    c.wait_event(NODE, REPLACED, timeout=60)
    new = replacement(c)
    c.wait(lambda: c.state(new) == "validating" or c.jobs(new), 30, f"{new} validating")
    c.wait(lambda: c.state(new) == "healthy" and not taints_of(c, new, STARTUP_TAINT), 90,
           f"{new} validated and its startup taint removed")
    kinds = [j["metadata"]["labels"].get(JOB_LABEL) for j in c.jobs(new)]
    assert kinds and set(kinds) <= {"validate"}, kinds  # validated, nothing else run on it
    assert not c.unschedulable(new)
    rec = c.record(new)
    assert rec is not None and rec.reason == "validation-passed", rec
    assert len(owner_deletes(c, mark, KARPENTER_GROUP)) == 1
    said = [e["message"] for e in c.events(new)]
    assert any(f"startup taint {STARTUP_TAINT}" in m for m in said), said  # it went through new-node


def taints_of(c: Cluster, name: str, key: str) -> list[dict[str, Any]]:
    return [t for t in c.kube.get(NODES, name)["spec"].get("taints") or [] if t.get("key") == key]


def cli_shows_the_replacement(c: Cluster, target: str, provider: str) -> None:
    """`status` counts it and shows it; `explain` of the gone node says it was replaced (not "not found")."""
    status = c.cli("status", "-o", "json", "--namespace", SYSTEM_NS)
    assert status.returncode == 0, status.stderr
    replaced = json.loads(status.stdout)["fleet"]["replaced"]
    assert replaced["recent"] == 1 and replaced["total"] == 1, replaced
    assert replaced["latest"][0]["node"] == NODE and target in replaced["latest"][0]["target"], replaced
    assert replaced["latest"][0]["provider"] == provider and replaced["latest"][0]["state"] == DELETED
    explain = c.cli("explain", NODE, "--namespace", SYSTEM_NS)
    assert explain.returncode == 0, explain.stderr
    assert explain.stdout.startswith(f"{NODE}: replaced.") and target in explain.stdout, explain.stdout


def test_a_restart_while_the_machine_drains_never_deletes_twice(owned: Callable[[str], EmulatorCluster]) -> None:
    c = owned("cluster-api")
    owners(c).drain_s = 4.0  # the Machine stays (deletionTimestamp set) and its node with it for a while
    before = owners(c).owner_of(NODE)
    assert before is not None
    mark = c.audit_mark()
    exhaust_ladder(c)
    c.wait(lambda: owner_deletes(c, mark, CAPI_GROUP), 60, "the Machine deleted")
    assert not node_gone(c, NODE)
    c.restart_controller()  # killed (SIGKILL) with the delete sent and the node still here
    c.wait_event(NODE, REPLACED, timeout=30)
    new = replacement(c)
    left_alone(c, new)
    assert len(owner_deletes(c, mark, CAPI_GROUP)) == 1, owner_deletes(c, mark, CAPI_GROUP)
    assert [e["state"] for e in history(c)] == [DELETED]
    assert owners(c).replaced == [(NODE, new)]


def test_a_node_no_owner_would_replace_is_quarantined_with_the_reason(cluster: Cluster) -> None:
    exhaust_ladder(cluster)
    rec = cluster.wait_state(NODE, "quarantined", 60)
    assert "no owner would replace this node" in rec.message, rec.message
    assert "no Cluster API Machine" in rec.message and "no Karpenter" in rec.message, rec.message
    assert history(cluster) == [] and not node_gone(cluster, NODE)


DRY_REPLACE: dict[str, dict[str, Any]] = {
    "remediation.ladders": {"reset-gpu": [{"action": "reset-gpu", "attempts": 1, "timeout": 2}]},
    "remediation.replace": {"enabled": True, "timeout_s": 15},  # long enough to read status and explain
}


def test_a_dry_run_shows_would_replace_and_deletes_no_machine(owned: Callable[[str], EmulatorCluster]) -> None:
    """The ladder of a dry run reaches replace (its reset Job, never created, times out): its Event, `status`
    (the dry run's journal) and `explain` say it would delete the Machine; nothing is deleted, and once the
    attempt's deadline passes the node would go to a person with that said."""
    c = owned("cluster-api")
    before = owners(c).owner_of(NODE)
    assert before is not None
    machine = f"Machine default/{before.name}"
    mark = c.audit_mark()
    c.start_controller(DRY_REPLACE, dry_run=True)
    c.inject(NODE, 2, "dbe", 1)
    event = c.wait_event(NODE, "GPUNodeReplace", timeout=60)
    assert "would replace: delete " + machine in event["message"], event["message"]
    row = c.wait(lambda: _dry_row(c, lambda r: r["stateText"].startswith("would replace")), 30,
                 "status shows the would-be replace")
    assert row["action"]["kind"] == "replace" and row["action"]["name"] == machine, row["action"]
    explain = c.cli("explain", NODE, "--namespace", SYSTEM_NS)
    assert explain.returncode == 0, explain.stderr
    assert "DRY RUN" in explain.stdout and "it would replace" in explain.stdout, explain.stdout
    assert f"replace attempt 1 {machine}" in explain.stdout, explain.stdout
    row = c.wait(lambda: _dry_row(c, lambda r: r["stateText"] == "would be quarantined"), 45,
                 "the would-be replace timed out: a person would decide")
    assert f"would replace: delete {machine}" in row["message"] and "nothing deleted" in row["message"], row
    assert owner_deletes(c, mark, CAPI_GROUP) == []
    assert {m[2] for m in c.mutations_since(mark)} <= {"configmaps"}, c.mutations_since(mark)  # the journal only
    kept = c.kube.get(MACHINES, before.name, CAPI_NAMESPACE)
    assert kept["metadata"]["uid"] == before.uid and not kept["metadata"].get("deletionTimestamp")
    assert not node_gone(c, NODE) and history(c) == [] and owners(c).replaced == []
    assert c.metrics().value("gpuremediate_replacements_total") == 0


def _dry_row(c: Cluster, want: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """NODE's row of `status -o json` while a dry run runs (its journal), when ``want`` says so."""
    shown = c.cli("status", "-o", "json", "--namespace", SYSTEM_NS)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["fleet"]["dryRun"] is not None, status["fleet"]
    row: dict[str, Any] = next(r for r in status["nodes"] if r["name"] == NODE)
    return row if row["dryRun"] and want(row) else None


OTHER = "gpu-node-2"
MID_FLOW = "GPUNodeDeletedMidFlow"


@pytest.mark.parametrize("drain", ["evict", "custom"])
def test_a_node_deleted_by_someone_else_mid_drain_frees_its_slot_and_leaves_nothing_of_its_flow(
        owned: Callable[[str], EmulatorCluster], drain: str) -> None:
    """Budget 1. NODE drains, held (a PDB refuses its pod's eviction; or a DrainRequest no drainer completes);
    a second faulty node waits for the slot. Someone else deletes NODE's NodeClaim (a person, an autoscaler that
    ignores the marks): the node goes with it. Its flow ends with the Event and the metric, its DrainRequest is
    deleted, the slot is free, so the second node's repair starts; the replacement is left alone."""
    c = owned("karpenter")
    policy: dict[str, dict[str, Any]] = {"remediation.replace": {"enabled": True}}
    drain_res = None
    if drain == "custom":
        drain_res = install_crd(c.kube, drain_request_crd(), DRAIN_API, "DrainRequest")
        policy |= custom_drain_policy(timeout=300)
    else:
        c.workload("held", NODE, labels={"app": "held"})
        c.pdb("held", {"app": "held"}, min_available=1)
    c.start_controller(policy)
    c.inject(NODE, 2, "dbe", 1)
    if drain_res is not None:
        c.wait(lambda: drain_requests(c, drain_res, NODE), 30, f"a DrainRequest for {NODE}",
               seen=lambda: c.summary(NODE))
    else:
        c.wait(lambda: c.blocked_record(NODE, "pdb"), 30, f"{NODE}'s drain held by the PDB",
               seen=lambda: c.summary(NODE))
    node_uid = c.node(NODE)["metadata"]["uid"]
    c.inject(OTHER, 0, "dbe", 1)
    c.wait(lambda: c.blocked_record(OTHER, "budget"), 30, f"{OTHER} waits for the budget's slot",
           seen=lambda: c.summary(OTHER))
    assert c.state(NODE) == "draining" and not c.jobs(OTHER)
    owner = owners(c).owner_of(NODE)
    assert owner is not None
    mark = c.audit_mark()
    c.kube.delete(NODECLAIMS, owner.name)  # someone else's delete: its owner takes the node away

    event = c.wait_event(NODE, MID_FLOW, timeout=30)
    assert event["type"] == "Warning" and event["involvedObject"]["uid"] == node_uid, event
    assert "deleted by someone else while draining" in event["message"], event["message"]
    c.wait_metric("gpuremediate_nodes_deleted_mid_flow_total", 1, state="draining")
    if drain_res is not None:  # its drain starts: its own DrainRequest (nobody completes that one either)
        c.wait(lambda: drain_requests(c, drain_res, OTHER), 30, f"{OTHER}'s drain started in the freed slot",
               seen=lambda: c.summary(OTHER))
        assert c.blocked_record(OTHER, "budget") is None
    else:  # its drain, repair and validation run in the slot
        c.wait_state(OTHER, "healthy", 60)
        assert c.jobs(OTHER, "reset-gpu"), c.summary(OTHER)
    if drain_res is not None:
        assert "DrainRequest drain-" in event["message"], event["message"]
        assert drain_requests(c, drain_res, NODE) == []
        assert any(m[0] == "delete" and m[2] == "drainrequests" for m in c.mutations_since(mark))
    assert not c.jobs(NODE)
    assert REPLACED not in c.event_reasons(NODE) and history(c) == []  # not ours: no replace recorded
    assert c.metrics().value("gpuremediate_nodes_replaced_total") == 0
    left_alone(c, replacement(c))


@pytest.mark.parametrize("taint", [False, True], ids=["plain", "startup-taint"])
def test_a_node_replaced_under_its_old_name_starts_fresh(owned: Callable[[str], EmulatorCluster], taint: bool) -> None:
    """The owner replaces the Machine by a node of the same name (a new uid, another machine): its flow is the
    old node's no longer. It has no record of the old one (healthy; with the startup taint, validated as a new
    node), no Job of the old flow, and the history and `status` name the old Node (its uid) as replaced."""
    c = owned("cluster-api")
    sim = owners(c)
    sim.same_name = True
    policy = REPLACE
    if taint:
        sim.startup_taint = {"key": STARTUP_TAINT, "effect": "NoSchedule"}
        policy = {**REPLACE, "remediation.replace": {**REPLACE["remediation.replace"], "startup_taint": STARTUP_TAINT}}
    before = sim.owner_of(NODE)
    assert before is not None
    old_uid = c.node(NODE)["metadata"]["uid"]
    mark = c.audit_mark()
    fail_jobs(c, NODE, "reset-gpu")
    c.start_controller(policy)
    c.inject(NODE, 2, "dbe", 1)
    c.wait_event(NODE, REPLACED, timeout=60)
    assert replacement(c) == NODE
    new_uid = c.wait(lambda: _uid_other_than(c, old_uid), 20, f"{NODE} registered again")
    seen: list[str] = []

    def settled() -> bool:
        seen.append(c.state(NODE))
        return seen[-1] == "healthy" and not taints_of(c, NODE, STARTUP_TAINT)

    c.wait(settled, 60, f"the new {NODE} in service", seen=lambda: c.summary(NODE))
    c.holds(lambda: c.state(NODE) == "healthy" and not c.unschedulable(NODE), 2, f"the new {NODE} left alone")
    assert set(seen) <= {"healthy", "validating"}, seen  # never the old flow's repairing, quarantined...
    rec = c.record(NODE)
    kinds = [j["metadata"]["labels"].get(JOB_LABEL) for j in c.jobs(NODE)]
    if taint:
        assert rec is not None and rec.reason == "validation-passed" and not rec.history, rec
        assert kinds == ["validate"], kinds
    else:
        assert rec is None or (rec.state == "healthy" and not rec.history and rec.fault is None), rec
        assert kinds == [], kinds  # the old flow's failed reset Job went with the old node
    assert c.node(NODE)["metadata"]["uid"] == new_uid
    [entry] = history(c)
    assert (entry["node"], entry["node_uid"], entry["target_uid"], entry["state"]) == \
        (NODE, old_uid, before.uid, DELETED)
    assert len(owner_deletes(c, mark, CAPI_GROUP)) == 1, owner_deletes(c, mark, CAPI_GROUP)
    assert MID_FLOW not in c.event_reasons(NODE)
    status = c.cli("status", "-o", "json", "--namespace", SYSTEM_NS)
    assert status.returncode == 0, status.stderr
    replaced = json.loads(status.stdout)["fleet"]["replaced"]
    assert replaced["total"] == 1 and replaced["latest"][0]["node"] == NODE, replaced


def _uid_other_than(c: Cluster, uid: str) -> str | None:
    try:
        now = str(c.node(NODE)["metadata"]["uid"])
    except errors.NotFound:
        return None
    return now if now != uid else None
