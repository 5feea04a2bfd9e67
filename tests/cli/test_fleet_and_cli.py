"""The people-facing commands: status, explain, release, breaker, and flag errors that name the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuremediate import cli, fleet
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP, RESET_ANNOTATION, BreakerStore
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import CONFIGMAPS, NODES
from gpuremediate.policy.safety import CircuitBreaker
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_QUARANTINE, KIND_ROW_REMAP_FAILURE
from gpuremediate.vocab.record import (
    Fault,
    NodeRecord,
    RecordError,
    mark_created,
    node_patch,
    record_from_node,
    start_action,
)

NS = "gpuremediate-system"


def _node(client: KubeClient, name: str, record: NodeRecord | None = None, unschedulable: bool = False) -> None:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
            "spec": {"unschedulable": unschedulable},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}}
    client.create(NODES, body)
    if record is not None:
        client.patch(NODES, name, node_patch(record))


def _quarantined(now: float = 1000.0) -> NodeRecord:
    fault = Fault(KIND_ROW_REMAP_FAILURE, "", ("GPU-1",), "row-remap-failure:GPU-1", ACTION_QUARANTINE, now, now,
                  "row remapping failed")
    return NodeRecord(state=states.QUARANTINED, since=now, reason="row-remap-failure", message="row remapping failed",
                      fault=fault, cordoned_by_us=True)


def test_release_moves_a_quarantined_node_to_validating_and_keeps_the_cordon(api: tuple[KubeClient, str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", _quarantined(), unschedulable=True)
    assert cli.main(["release", "gpu-a", "--kubeconfig", kubeconfig, "--by", "alice"]) == 0
    node = client.get(NODES, "gpu-a")
    record = record_from_node(node)
    assert isinstance(record, NodeRecord)
    assert record.state == states.VALIDATING and record.reason == states.RELEASED
    assert "alice" in record.message
    assert node["metadata"]["labels"]["gpuremediate.io/state"] == "validating"
    assert node["spec"]["unschedulable"] is True  # validation decides; nothing is uncordoned on release


def test_release_refuses_a_node_that_is_not_quarantined(api: tuple[KubeClient, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-b")
    assert cli.main(["release", "gpu-b", "--kubeconfig", kubeconfig]) == 2
    assert "gpu-b is healthy, not quarantined" in capsys.readouterr().err
    assert cli.main(["release", "nope", "--kubeconfig", kubeconfig]) == 2
    assert "node 'nope' not found" in capsys.readouterr().err


def test_status_lists_gpu_nodes_with_state_fault_and_blocked(api: tuple[KubeClient, str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", _quarantined(), unschedulable=True)
    _node(client, "gpu-b")
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only"}})
    assert cli.main(["status", "--kubeconfig", kubeconfig, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    assert set(rows) == {"gpu-a", "gpu-b"}
    assert rows["gpu-a"]["state"] == "quarantined" and rows["gpu-a"]["fault"]["kind"] == "row-remap-failure"
    assert rows["gpu-a"]["schedulable"] is False and rows["gpu-b"]["state"] == "healthy"
    assert cli.main(["status", "--kubeconfig", kubeconfig]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["NODE", "STATE", "SINCE", "FAULT", "ACTION", "BLOCKED"]
    assert "quarantined *" in table


def test_explain_says_why_and_what_a_person_can_do() -> None:
    text = fleet.explain(_quarantined(now=1000.0), "gpu-a", now=1000.0 + 7200)
    assert "gpu-a: quarantined for 2h (reason row-remap-failure)" in text
    assert "row remapping failed" in text and "gpuremediate release gpu-a" in text
    assert "will uncordon it only after a person releases it and validation passes" in text
    assert "never acted" in fleet.explain(None, "gpu-b")
    assert "cannot be read" in fleet.explain(RecordError("bad json"), "gpu-c")


def test_breaker_store_round_trips_and_resets_by_annotation(api: tuple[KubeClient, str]) -> None:
    client, _ = api
    store = BreakerStore(client, NS)
    assert store.load().is_open is False  # no ConfigMap yet: closed
    opened = CircuitBreaker().record_fault("a", 1.0).record_fault("b", 2.0).evaluate(2, 3.0, 30.0, 600.0, 1)
    assert opened.is_open
    store.save(opened)
    assert BreakerStore(client, NS).load() == opened
    client.patch(CONFIGMAPS, BREAKER_CONFIGMAP, {"metadata": {"annotations": {RESET_ANNOTATION: "now"}}}, NS)
    after = BreakerStore(client, NS).load()
    assert after.is_open is False and RESET_ANNOTATION in after.reset_by
    cm = client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)
    assert RESET_ANNOTATION not in (cm["metadata"].get("annotations") or {})


def test_unreadable_breaker_state_is_treated_as_open(api: tuple[KubeClient, str]) -> None:
    client, kubeconfig = api
    client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": BREAKER_CONFIGMAP, "namespace": NS},
                               "data": {"state": "{not json"}}, NS)
    assert BreakerStore(client, NS).load().is_open
    assert cli.main(["breaker", "reset", "--kubeconfig", kubeconfig, "--namespace", NS]) == 0
    assert BreakerStore(client, NS).load().is_open is False


@pytest.mark.parametrize(("flags", "message"), [
    (["--scrape-interval", "soon"], "--scrape-interval: expected a duration"),
    (["--metrics-addr", "8080"], "--metrics-addr: expected [HOST]:PORT"),
    (["--source", "prometheus"], "--prometheus-url is required"),
    (["--resync=-5s"], "--resync: must not be negative"),
])
def test_bad_run_flags_are_named(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *flags]) == 2
    assert message in capsys.readouterr().err


def test_bad_policy_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[drain]\nmode = \"Fast\"\n")
    assert cli.main(["run", "--policy", str(policy), "--kubeconfig", str(tmp_path / "none")]) == 2
    assert "drain.mode: expected one of Immediate, AllowCompletion, DeleteAfterTimeout" in capsys.readouterr().err


def test_settings_from_flags() -> None:
    args = cli.build_parser().parse_args(["run", "--metrics-addr", "127.0.0.1:9090", "--scrape-interval", "500ms",
                                          "--dry-run", "--leader-elect"])
    settings = cli.settings_from_args(args)
    assert (settings.metrics_host, settings.metrics_port) == ("127.0.0.1", 9090)
    assert settings.scrape_interval_s == 0.5 and settings.dry_run and settings.leader_elect


def test_explain_says_how_long_a_plugin_resource_has_waited() -> None:
    repairing = NodeRecord(state=states.REPAIRING, since=1000.0)
    started = start_action(repairing, "rma", "rma-gpu-a-1", 1, 1000.0, 300.0)
    created = mark_created(started, 1002.0, 300.0)  # the first create took 2 s
    text = fleet.explain(created, "gpu-a", now=1062.0)
    assert "Waited 1m since its object was created (timeout after 5m)." in text
    assert "Waited" not in fleet.explain(started, "gpu-a", now=1062.0)


class BumpedBeforeEachPatch(KubeClient):
    """Another writer (kube-controller-manager's taint, a heartbeat) changes the node before each of the first
    ``bumps`` guarded patches: each meets a 409."""

    bumps = 0

    def patch(self, res: Any, name: str, patch: Any, namespace: str | None = None, **kwargs: Any) -> dict[str, Any]:
        if self.bumps > 0 and (patch.get("metadata") or {}).get("resourceVersion"):
            self.bumps -= 1
            super().patch(res, name, {"metadata": {"annotations": {"example.com/heartbeat": str(self.bumps)}}})
        result: dict[str, Any] = super().patch(res, name, patch, namespace, **kwargs)
        return result


def test_release_reads_again_when_another_writer_changed_the_node(api: tuple[KubeClient, str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", _quarantined(), unschedulable=True)
    person = BumpedBeforeEachPatch(load_config(kubeconfig))
    person.bumps = 2
    assert fleet.release(person, "gpu-a", by="alice").state == states.VALIDATING
    record = record_from_node(client.get(NODES, "gpu-a"))
    assert isinstance(record, NodeRecord) and record.state == states.VALIDATING
    person.bumps = 99
    _node(client, "gpu-b", _quarantined(), unschedulable=True)
    with pytest.raises(fleet.FleetError, match="kept changing"):
        fleet.release(person, "gpu-b", by="alice")
    person.close()


def test_explain_says_what_ends_each_state_and_what_a_hold_keeps_waiting() -> None:
    now = 10_000.0
    hot = r.Fault(kind="thermal", code="gpu_temp", gpus=("GPU-1",), fingerprint="thermal:GPU-1", action="cordon",
                  first_seen=now - 60, last_seen=now, message="GPU GPU-1 ran hot")
    thermal = r.NodeRecord(state=states.CORDONED, since=now - 60, reason="thermal", fault=hot, cordoned_by_us=True)
    text = fleet.explain(thermal, "gpu-t", now)
    assert "uncordon it once its GPUs have stayed cool" in text and "validation passes" not in text, text
    assert "Ends: the GPU cooling down" in text
    xid = r.Fault(kind="xid", code="48", gpus=("GPU-2",), fingerprint="xid:GPU-2:48", action="reset-gpu",
                  first_seen=now - 30, last_seen=now, message="GPU GPU-2 last reported XID 48")
    held = r.NodeRecord(state=states.HEALTHY, since=now - 30, held=xid,
                        blocked=r.Blocked(r.BLOCK_BREAKER, "circuit breaker open: no new work", now - 30))
    text = fleet.explain(held, "gpu-h", now)
    assert "Held fault: xid 48 on GPU(s) GPU-2" in text and "reset-gpu once it ends" in text, text
    assert "Waiting: breaker" in text
    row = fleet.row_for({"metadata": {"name": "gpu-h", "annotations": {r.RECORD_ANNOTATION: r.encode(held)}}})
    assert row.fault == "xid 48 (held)" and row.blocked.startswith("breaker: ")
    waiting = r.NodeRecord(state=states.DRAINING, since=now, fault=xid, cordoned_by_us=True,
                           blocked=r.Blocked(r.BLOCK_BUDGET, "budget full: 1 of 1 out of service (gpu-q: "
                                                             "quarantined, needs a person)", now))
    row = fleet.row_for({"metadata": {"name": "gpu-w", "annotations": {r.RECORD_ANNOTATION: r.encode(waiting)}},
                         "spec": {"unschedulable": True}})
    assert row.state == "draining (waiting)" and "gpu-q: quarantined, needs a person" in row.blocked
    failed = r.NodeRecord(state=states.QUARANTINED, since=now, reason=states.VALIDATION_FAILED, fault=xid,
                          history=(r.HistoryEntry(at=now - 5, kind="xid", code="48", action="reset-gpu",
                                                  outcome=r.OUTCOME_REPAIRED),))
    assert "reset-gpu: repaired, then its validation failed (quarantined)" in fleet.explain(failed, "gpu-f", now)


def test_explain_shows_a_gpu_watched_within_its_thermal_hold() -> None:
    now = 10_000.0
    memory = {"v": 1, "thermal": {"GPU-7": {"hot_since": now - 50, "cool_since": None, "cordoned_since": None,
                                            "cause": ""}}}
    watched = r.NodeRecord(state=states.HEALTHY, since=now - 50, policy_memory=memory)
    text = fleet.explain(watched, "gpu-w", now, hold_s=60.0)  # a record from before thermal_hold_ends: the policy's
    assert ("Watching: GPU GPU-7 hot for 50s of its 60 s hold: cordoned in 10s (at 1970-01-01T02:46:50Z) if it stays "
            "hot.") in text, text
    assert "(cordoned when [thermal].hold_s is over)" in fleet.explain(watched, "gpu-w", now)
    ends = r.NodeRecord(state=states.HEALTHY, since=now - 50, policy_memory=memory,
                        thermal_hold_ends={"GPU-7": now + 70})  # the controller's own: no --policy needed
    text = fleet.explain(ends, "gpu-w", now)
    assert ("Watching: GPU GPU-7 hot for 50s of its 120 s hold: cordoned in 1m (at 1970-01-01T02:47:50Z) if it stays "
            "hot.") in text, text
    assert "of its 120 s hold" in fleet.explain(ends, "gpu-w", now, hold_s=60.0)  # the record's end wins
    late = fleet.explain(ends, "gpu-w", now + 75)
    assert "over at 1970-01-01T02:47:50Z: cordoned at its next reading if it is still hot" in late, late
    row = fleet.row_for({"metadata": {"name": "gpu-w", "annotations": {r.RECORD_ANNOTATION: r.encode(ends)}}}, now=now)
    assert (row.state, row.fault) == (states.HEALTHY, "thermal (watched, cordon in 1m)"), row


def test_a_dry_run_says_what_it_would_do_and_says_waiting_as_waiting() -> None:
    now = 10_000.0
    xid = r.Fault(kind="xid", code="48", gpus=("GPU-2",), fingerprint="xid:GPU-2:48", action="reset-gpu",
                  first_seen=now - 30, last_seen=now, message="GPU GPU-2 last reported XID 48")
    budget = r.Blocked(r.BLOCK_BUDGET, "budget full: 1 of 1 out of service (gpu-a: repairing since ...)", now)
    waiting = r.NodeRecord(state=states.DRAINING, since=now, fault=xid, cordoned_by_us=True, blocked=budget)
    assert fleet.would(waiting) == "would drain (waiting)"
    assert fleet.would(r.NodeRecord(state=states.DRAINING, since=now, fault=xid, cordoned_by_us=True,
                                    action=r.ActionInProgress("drain", "", 1, now))) == "would drain"
    held = r.NodeRecord(state=states.HEALTHY, since=now, held=xid, blocked=r.Blocked(r.BLOCK_BREAKER, "open", now))
    assert fleet.would(held) == "would wait (healthy)"
    text = fleet.explain(waiting, "gpu-w", now, dry_run=True)
    assert "gpuremediate would cordon this node, and uncordon it once validation passes." in text, text
    assert "gpuremediate cordoned this node" not in text


def _explained(kubeconfig: str, node: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["explain", node, "--kubeconfig", kubeconfig]) == 0
    return capsys.readouterr().out


def test_every_state_s_explanation_says_what_ends_it(api: tuple[KubeClient, str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`explain` of a person's cordon, a cordon-only fault, draining, repairing, validating and maintenance: each
    says what ends it (thermal, quarantined and a held fault: test_explain_says_what_ends_each_state_...)."""
    client, kubeconfig = api
    now = 10_000.0
    xid = Fault("xid", "48", ("GPU-2",), "xid:GPU-2:48", "reset-gpu", now, now, "XID 48")
    cordon_only = Fault("xid", "63", ("GPU-3",), "xid:GPU-3:63", "cordon", now, now, "XID 63")
    flows = {
        "gpu-person": None,  # cordoned by a person; gpuremediate never acted on it
        "gpu-cordon": NodeRecord(state=states.CORDONED, since=now, reason="xid-63", fault=cordon_only,
                                 cordoned_by_us=True),
        "gpu-cordon-before": NodeRecord(state=states.CORDONED, since=now, reason="xid-63", fault=cordon_only,
                                        was_unschedulable=True),
        "gpu-drain": start_action(NodeRecord(state=states.DRAINING, since=now, reason="xid-48", fault=xid,
                                             cordoned_by_us=True), "drain", "", 1, now),
        "gpu-repair": start_action(NodeRecord(state=states.REPAIRING, since=now, reason="drain-complete", fault=xid,
                                              cordoned_by_us=True), "reset-gpu", "gpur-reset-1", 1, now),
        "gpu-validate": start_action(NodeRecord(state=states.VALIDATING, since=now, reason="repair-complete",
                                                fault=xid, cordoned_by_us=True), "validate", "gpur-validate-1", 1,
                                     now),
        "gpu-maint": NodeRecord(state=states.MAINTENANCE, since=now, reason="maintenance-requested",
                                cordoned_by_us=True),
    }
    for name, record in flows.items():
        _node(client, name, record, unschedulable=True)
    person = _explained(kubeconfig, "gpu-person", capsys)
    assert person.startswith("gpu-person: healthy, but unschedulable: a person (or another tool) cordoned it."), person
    assert "Ends: a person uncordoning it (`kubectl uncordon`); until then it counts against [budget]" in person
    cordon = _explained(kubeconfig, "gpu-cordon", capsys)
    assert "Ends: a person uncordoning it (a cordon-only fault gets no repair and is not lifted by gpuremediate), " \
           "or a worse fault (then it drains, or is quarantined)." in cordon, cordon
    assert "will uncordon it only if a worse fault takes it through a repair" in cordon, cordon
    before = _explained(kubeconfig, "gpu-cordon-before", capsys)
    assert "The node was unschedulable before gpuremediate touched it: it will never uncordon it." in before, before
    assert "Ends: a person uncordoning it" in before
    ends = {name: _explained(kubeconfig, name, capsys) for name in ("gpu-drain", "gpu-repair", "gpu-validate",
                                                                   "gpu-maint")}
    assert "Ends: its pods gone (evicted, PodDisruptionBudgets honoured); then the repair starts." in ends["gpu-drain"]
    assert "Ends: the repair's Job or resource finishing; then validation (a failure climbs the ladder)." in \
        ends["gpu-repair"], ends["gpu-repair"]
    assert "Ends: the validation Job: passed, the node is healthy and uncordoned; failed, quarantined." in \
        ends["gpu-validate"], ends["gpu-validate"]
    assert "Ends: the MaintenanceRequest completing, or being deleted." in ends["gpu-maint"], ends["gpu-maint"]
    assert all(text.count("Ends: ") == 1 for text in (person, cordon, before, *ends.values()))


def test_explain_of_a_node_being_replaced_says_the_node_goes_away_not_that_validation_follows() -> None:
    """The replace rung ends when the Node goes away (its owner deleted): no Job, no validation, no uncordon."""
    now = 10_000.0
    xid = Fault("xid", "79", ("GPU-2",), "xid:GPU-2:79", "reboot", now, now, "XID 79")
    replacing = start_action(NodeRecord(state=states.REPAIRING, since=now, reason="replace", fault=xid,
                                        cordoned_by_us=True), "replace", "Machine default/m-1", 1, now)
    text = fleet.explain(replacing, "gpu-r", now)
    assert "Ends: the Node going away: its owner deleted" in text, text
    assert "will not uncordon it: a new Node takes its place" in text, text
    assert "then validation" not in text and "once validation passes" not in text, text
