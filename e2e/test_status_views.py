"""What a person reads while the controller waits (issue 24), from records a real controller run wrote: a fault
held by the open breaker shows the fault and what holds it; a node waiting for the budget shows waiting (never
a verb that is not happening) and who holds the budget since when; a GPU hot within its thermal hold shows
being watched and when it is cordoned; a repair whose validation failed says so. Each read through the CLI
(`status`, `status -o wide`, `explain`) as a person runs it."""

from __future__ import annotations

import re
import time

from e2e.harness import Cluster
from gpuremediate.vocab import states
from gpuremediate.vocab.record import BLOCK_BUDGET, NodeRecord

BREAKER = {"threshold_percent": 30, "min_nodes": 3}


def _row(cluster: Cluster, node: str, *flags: str) -> str:
    """The node's line of `gpuremediate status FLAGS`."""
    shown = cluster.cli("status", *flags)
    assert shown.returncode == 0, shown.stderr
    return next(line for line in shown.stdout.splitlines() if line.startswith(node + " "))


def _explain(cluster: Cluster, node: str) -> str:
    explained = cluster.cli("explain", node)
    assert explained.returncode == 0, explained.stderr
    assert "never acted on this node" not in explained.stdout, explained.stdout
    return explained.stdout


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _blocked(cluster: Cluster, node: str, reason: str) -> NodeRecord | None:
    record = cluster.record(node)
    return record if record is not None and record.blocked is not None and record.blocked.reason == reason else None


def _watched(cluster: Cluster, node: str) -> NodeRecord | None:
    record = cluster.record(node)
    return record if record is not None and record.thermal_hold_ends else None


def test_a_fault_held_by_the_open_breaker_shows_the_fault_and_what_holds_it(cluster: Cluster) -> None:
    *stormed, late = cluster.nodes[:4]
    for node in stormed:  # 3 of 4 in one read: the breaker opens before any is acted on
        cluster.inject(node, 0, "xid", 79)
    cluster.start_controller({"budget": {"max_unavailable": "100%"}, "breaker": BREAKER})
    cluster.wait(lambda: all(_blocked(cluster, n, "breaker") for n in stormed), 20, "the storm held by the breaker")
    cluster.inject(late, 0, "dbe", 1)
    held = cluster.wait(lambda: _blocked(cluster, late, "breaker"), 20, f"{late}'s fault held",
                        seen=lambda: cluster.summary(late))
    assert held is not None and held.held is not None
    assert held.state == states.HEALTHY and not cluster.unschedulable(late)

    status = cluster.cli("status").stdout
    assert status.startswith("CIRCUIT BREAKER OPEN: 3 of 4 GPU nodes faulted"), status
    row = _row(cluster, late)
    assert re.match(rf"{late}\s+healthy\s+\S+\s+ecc-dbe ecc_dbe_volatile \(held\)\s+-\s+breaker: circuit breaker "
                    r"open: no new work$", row), row
    assert _row(cluster, late, "-o", "wide").endswith("circuit breaker"), "HELD BY names the breaker"
    text = _explain(cluster, late)
    gpus = ", ".join(held.held.gpus)
    assert f"Held fault: ecc-dbe ecc_dbe_volatile on GPU(s) {gpus}" in text, text
    assert "Not acted on while the hold below lasts: reset-gpu once it ends." in text, text
    assert "Waiting: breaker (circuit breaker open: no new work)" in text, text


def test_a_node_waiting_for_the_budget_shows_waiting_and_who_holds_the_budget_since_when(cluster: Cluster) -> None:
    holder, waiting = cluster.nodes[:2]
    cluster.start_controller({"budget": {"max_unavailable": "1"}, "breaker": {"enabled": False}})
    cluster.inject(holder, 1, "row-remap-failure")
    quarantined = cluster.wait_state(holder, states.QUARANTINED, 20)
    cluster.inject(waiting, 0, "dbe", 1)
    record = cluster.wait(lambda: _blocked(cluster, waiting, BLOCK_BUDGET), 20, f"{waiting} waiting for the budget",
                          seen=lambda: cluster.summary(waiting))
    assert record is not None and record.state == states.DRAINING
    assert record.action is None  # cordoned, nothing evicted yet

    since = f"{holder}: quarantined since {_utc(quarantined.since)}, needs a person"
    row = _row(cluster, waiting)
    assert re.match(rf"{waiting}\s+draining \(waiting\) \*\s+\S+\s+ecc-dbe ecc_dbe_volatile\s+-\s+budget: budget "
                    rf"full: 1 of 1 out of service \({re.escape(since)}\)", row), row
    assert _row(cluster, waiting, "-o", "wide").endswith(f"  {holder}"), "HELD BY names the quarantined node"
    text = _explain(cluster, waiting)
    assert f"Waiting: budget (budget full: 1 of 1 out of service ({since})" in text, text
    assert "In progress:" not in text  # no drain is said to run while it waits


def test_a_hot_gpu_within_its_thermal_hold_shows_being_watched_and_when_it_is_cordoned(cluster: Cluster) -> None:
    node = cluster.nodes[2]
    cluster.start_controller({"thermal": {"hold_s": 600}})
    cluster.inject(node, 0, "temp", 95)
    record = cluster.wait(lambda: _watched(cluster, node), 20, f"{node}'s hot GPU watched",
                          seen=lambda: cluster.summary(node))
    assert record is not None
    (gpu, ends), = record.thermal_hold_ends.items()
    assert not cluster.unschedulable(node) and record.state == states.HEALTHY

    row = _row(cluster, node)
    assert re.match(rf"{node}\s+healthy\s+\S+\s+thermal \(watched, cordon in \d+m\)\s+-\s+-$", row), row
    text = _explain(cluster, node)  # without --policy: the record says when the hold ends
    assert re.search(rf"Watching: GPU {gpu} hot for \d+s of its 600 s hold: cordoned in \d+m \(at "
                     rf"{_utc(ends)}\) if it stays hot\.", text), text


def test_a_repair_whose_validation_failed_says_so(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    cluster.require("choose a validation outcome per node")
    cluster.set_validation(node, False)
    cluster.start_controller()
    cluster.inject(node, 0, "dbe", 1)
    cluster.wait_state(node, states.QUARANTINED, 30)
    text = _explain(cluster, node)
    assert text.startswith(f"{node}: quarantined for "), text
    assert "(reason validation-failed)" in text.splitlines()[0], text
    assert re.search(r"ago: ecc-dbe ecc_dbe_volatile → reset-gpu: repaired, then its validation failed "
                     r"\(quarantined\)", text), text
    assert "Ends: a person: `gpuremediate release` sends it through validation again." in text, text
    assert f"Needs a person. When fixed: gpuremediate release {node}" in text, text
