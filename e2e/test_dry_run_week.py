"""The operator's first week (issue 24): a dry run shows what the controller would do — `status`, `explain`
and `breaker status` read the dry run's journal — and what `status` showed is what the same faults then do when
the controller acts: the same decisions, in the same order. A week of faults, replayed in seconds. A dry run
whose faults pass the breaker's threshold shows the breaker it would open, the drain it would hold, and the
fault it would keep waiting, while the real breaker stays closed and no Node is written."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from e2e.harness import SYSTEM_NS, Cluster
from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord

POLICY: dict[str, Any] = {"budget": {"max_unavailable": "100%"}, "breaker": {"enabled": False},
                          "thermal": {"hold_s": 0.5, "clear_hold_s": 0.5}}
# One node's fault a cycle past 30 % of 4 nodes (and at least 3): the third opens it.
BREAKER_POLICY: dict[str, Any] = {"budget": {"max_unavailable": "1"},
                                  "breaker": {"threshold_percent": 30, "min_nodes": 3}}
QUARANTINE = "quarantine"
CORDON = "cordon"

Decision = tuple[str, str, str]  # node, fault (as status shows it), what is done about it


def _week(cluster: Cluster) -> list[tuple[str, int, str, float]]:
    n = cluster.nodes
    return [(n[2], 0, "xid", 79), (n[0], 1, "dbe", 1), (n[3], 0, "temp", 95), (n[1], 0, "xid", 54)]


def _rows(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """`gpuremediate status -o json`'s nodes (docs/output.md), by node; each says whether a dry run ran
    (``dryRunning``: the fleet's dryRun) beside its own entry."""
    shown = cluster.cli("status", "-o", "json", "--namespace", SYSTEM_NS)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    running = status["fleet"]["dryRun"] is not None
    return {row["name"]: {**row, "dryRunning": running} for row in status["nodes"]}


def _fault_shown(row: dict[str, Any]) -> str:
    """The fault as the table's FAULT column says it (kind and code), from the row's structured fault."""
    fault = row["fault"]
    return f"{fault['kind']} {fault['code'] or ''}".strip() if fault is not None else "-"


def _would(row: dict[str, Any]) -> str | None:
    """What a dry-run row says the controller would do about its fault; None while nothing is decided yet, or
    only the drain that comes before a repair (the repair it would then run is the decision)."""
    state = row["stateText"]
    if state == "would be quarantined":
        return QUARANTINE
    if state == "would cordon":
        return CORDON
    action = row["action"]["kind"] if row["action"] is not None else "-"
    return action if state.startswith(f"would {action}") and action not in ("-", "drain") else None


def _done(record: NodeRecord | None) -> str | None:
    """What the acting controller did about the node's fault, from its record (None: nothing decided yet)."""
    if record is None:
        return None
    if record.state == states.QUARANTINED:
        return QUARANTINE
    if record.state == states.CORDONED:
        return CORDON
    if record.state == states.REPAIRING and record.action is not None:
        return record.action.kind
    return record.history[0].action if record.history else None


def _play(cluster: Cluster, week: list[tuple[str, int, str, float]],
          decision: Callable[[str], Decision | None]) -> list[Decision]:
    """Each fault in turn, the next once the controller has decided on the last; the decisions in that order."""
    decided: list[Decision] = []
    for node, gpu, fault, value in week:
        cluster.inject(node, gpu, fault, value)
        made = cluster.wait(functools.partial(decision, node), 30, f"a decision on {node}")
        assert made is not None
        decided.append(made)
    return decided


def test_what_status_showed_in_a_dry_run_is_what_acting_then_does(cluster: Cluster) -> None:
    week = _week(cluster)
    cluster.start_controller(POLICY, dry_run=True)

    def shown(node: str) -> Decision | None:
        row = _rows(cluster)[node]
        would = _would(row)
        if would is None:
            return None
        assert row["dryRunning"] is True, row
        return node, _fault_shown(row), would

    dry = _play(cluster, week, shown)
    n = cluster.nodes
    assert [(node, would) for node, _, would in dry] == [(n[2], "reboot"), (n[0], "reset-gpu"), (n[3], CORDON),
                                                         (n[1], QUARANTINE)], dry
    status = cluster.cli("status", "--namespace", SYSTEM_NS)
    lines = status.stdout.splitlines()
    assert lines[0].startswith("DRY RUN: the controller"), status.stdout
    rows = {line.split()[0]: line for line in lines[1:] if line.split() and line.split()[0] in n}
    assert "would reboot" in rows[n[2]] and "would reset-gpu" in rows[n[0]], status.stdout
    assert "would cordon" in rows[n[3]] and "would be quarantined" in rows[n[1]], status.stdout
    assert all(cluster.record(node) is None and not cluster.unschedulable(node) for node in n)  # nothing written
    explained = cluster.cli("explain", n[1], "--namespace", SYSTEM_NS)
    assert explained.stdout.startswith(f"DRY RUN: gpuremediate writes nothing to {n[1]}; it would be quarantined"), \
        explained.stdout
    assert "Needs a person" in explained.stdout
    breaker = cluster.cli("breaker", "status", "--namespace", SYSTEM_NS)
    assert breaker.stdout.startswith("circuit breaker (DRY RUN"), breaker.stdout

    cluster.stop_controller()
    for node, gpu, _, _ in week:  # the faults go, so the same week can be played again, for real
        cluster.reset_gpu(node, gpu)
        cluster.inject(node, 0, "temp", 40)
    cluster.start_controller(POLICY)

    def done(node: str) -> Decision | None:
        record = cluster.record(node)
        did = _done(record)
        return (node, _fault_of(record), did) if record is not None and did is not None else None

    acting = _play(cluster, week, done)
    assert acting == dry, f"status showed in the dry run {dry}, acting did {acting}"
    after = cluster.cli("status", "--namespace", SYSTEM_NS).stdout
    assert not after.startswith("DRY RUN"), after  # the acting controller's own status


def _fault_of(record: NodeRecord | None) -> str:
    """The fault as `status` shows it (FAULT: kind and code), from the open fault or, once repaired, the history."""
    if record is None:
        return "-"
    if record.fault is not None:
        return f"{record.fault.kind} {record.fault.code}".strip()
    return f"{record.history[0].kind} {record.history[0].code}".strip() if record.history else "-"


def test_a_dry_run_shows_the_breaker_it_would_open_and_what_it_would_hold(cluster: Cluster) -> None:
    """Budget 1: the first fault's repair takes the slot, the second's drain waits for it; the third fault opens
    the breaker the dry run keeps (30 % of 4 nodes, at least 3): `status` and `breaker status` show it would be
    open, the waiting drain as waiting, and the third fault as held; the real breaker and every Node stay as
    they were."""
    first, second, third, spare = cluster.nodes[:4]
    cluster.start_controller(BREAKER_POLICY, dry_run=True)
    cluster.inject(first, 0, "dbe", 1)
    cluster.wait(lambda: _rows(cluster)[first]["stateText"] == "would reset-gpu", 30, f"{first}'s repair shown",
                 seen=lambda: _rows(cluster)[first])
    cluster.inject(second, 0, "dbe", 1)
    cluster.wait(lambda: _rows(cluster)[second]["stateText"] == "would drain (waiting)", 30,
                 f"{second}'s drain shown waiting for the budget", seen=lambda: _rows(cluster)[second])
    cluster.inject(third, 0, "dbe", 1)
    cluster.wait(lambda: (_rows(cluster)[third]["fault"] or {}).get("held") is True, 30, f"{third}'s fault shown held",
                 seen=lambda: _rows(cluster)[third])

    status = cluster.cli("status", "--namespace", SYSTEM_NS).stdout.splitlines()
    assert status[0].startswith("DRY RUN: the controller"), status
    assert status[1].startswith("CIRCUIT BREAKER WOULD BE OPEN: 3 of 4 GPU nodes faulted"), status
    rows = _rows(cluster)
    assert all(row["dryRunning"] is True for row in rows.values()) and all(
        rows[node]["dryRun"] is True for node in (first, second, third)), rows  # the last: the journal's records
    assert (rows[second]["stateText"], rows[second]["heldBy"]) == ("would drain (waiting)", "circuit breaker"), rows
    assert rows[second]["blocked"]["reason"] == "breaker" and rows[second]["blocked"]["detail"].startswith(
        "circuit breaker open: 3 of 4"), rows[second]
    assert (rows[third]["stateText"], rows[third]["heldBy"]) == ("would wait (healthy)", "circuit breaker"), rows
    assert rows[spare]["state"] == states.HEALTHY
    breaker = cluster.cli("breaker", "status", "--namespace", SYSTEM_NS).stdout
    assert breaker.startswith("circuit breaker (DRY RUN: what it would be): open (3 of 4 GPU nodes faulted"), breaker
    assert cluster.metrics().value("gpuremediate_circuit_breaker_open") == 1  # the metric says what the CLI says
    drained = cluster.cli("explain", second, "--namespace", SYSTEM_NS).stdout
    assert drained.startswith(f"DRY RUN: gpuremediate writes nothing to {second}; it would drain (waiting)"), drained
    assert "Waiting: breaker (circuit breaker open: 3 of 4" in drained and "would cordon this node" in drained, drained
    held = cluster.cli("explain", third, "--namespace", SYSTEM_NS).stdout
    assert held.startswith(f"DRY RUN: gpuremediate writes nothing to {third}; it would wait (healthy)"), held
    assert "Held fault: ecc-dbe" in held and "reset-gpu once it ends" in held, held

    assert not BreakerStore(cluster.kube, SYSTEM_NS, read_only=True).load().is_open  # the real one: closed
    assert all(cluster.record(node) is None and not cluster.unschedulable(node) for node in cluster.nodes)
