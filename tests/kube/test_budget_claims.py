"""Drain admission across shards (actions.budget_claims): the API server decides who takes the last slot.

Two replicas whose informers both show one free slot must not both admit: each node's own record never
conflicts with the other's, so the claim goes through one ConfigMap written with a resourceVersion."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import pytest

from gpuremediate.actions.budget_claims import (
    ADMITTED_KEY,
    BUDGET_CONFIGMAP,
    BudgetClaims,
    Contended,
    budget_refusal,
)
from gpuremediate.kube import errors
from gpuremediate.kube.resources import CONFIGMAPS, NODES
from gpuremediate.policy import safety
from gpuremediate.vocab import states
from tests.kube.conftest import KubeTarget

FLEET = [safety.NodeView(f"gpu-{i}") for i in range(4)]  # all in service, as both informers see it
BUDGET_ONE = safety.Budget(1)


def _waiting(name: str) -> safety.NodeView:
    return safety.NodeView(name, unschedulable=True, state=states.DRAINING, waiting=True, first_seen=100.0)


def _views(*waiting: str) -> list[safety.NodeView]:
    return [_waiting(v.name) if v.name in waiting else v for v in FLEET]


def _claims(target: KubeTarget, looks_done: Any = lambda _name: False) -> BudgetClaims:
    return BudgetClaims(target.client(), target.namespace, looks_done, clock=lambda: 1000.0)


def _refusal(candidate: str, views: list[safety.NodeView]) -> Any:
    return lambda claimed: budget_refusal(views, candidate, [], BUDGET_ONE, [], claimed)


def test_a_claim_made_between_a_read_and_a_write_wins_and_the_other_is_refused(kube_target: KubeTarget) -> None:
    _reset_configmap(kube_target)  # the set exists (empty): both write from its resourceVersion
    first, second = _claims(kube_target), _claims(kube_target)
    views = _views("gpu-0", "gpu-1")  # each informer: two waiting, none out, limit 1
    calls: list[frozenset[str]] = []

    def first_refusal(claimed: frozenset[str]) -> str:
        calls.append(claimed)
        if len(calls) == 1:  # the other shard admits after our read, before our write
            assert second.claim("gpu-1", _refusal("gpu-1", views)) == ""
        return _refusal("gpu-0", views)(claimed)

    why = first.claim("gpu-0", first_refusal)
    assert calls == [frozenset(), frozenset({"gpu-1"})]  # the 409 made it read and decide again
    assert why.startswith("budget full: 1 of 1 out of service (gpu-1: ")
    assert set(first.admitted()) == {"gpu-1"}


def test_two_replicas_racing_for_one_slot_admit_exactly_one(kube_target: KubeTarget) -> None:
    for round_ in range(10):
        _reset_configmap(kube_target, create=round_ % 2 == 0)  # both create it, or both update it
        replicas = [_claims(kube_target), _claims(kube_target)]
        candidates = [f"gpu-{2 * (round_ % 2)}", f"gpu-{2 * (round_ % 2) + 1}"]
        results = _race(replicas, candidates, _views(*candidates))
        admitted = [name for name, why in results.items() if why == ""]
        assert len(results) == 2 and len(admitted) == 1, results
        assert set(replicas[0].admitted()) == set(admitted)


def _race(replicas: list[BudgetClaims], candidates: list[str], views: list[safety.NodeView]) -> dict[str, str]:
    """Both replicas claim at once (released together by a barrier); each candidate's answer."""
    start = threading.Barrier(2)
    results: dict[str, str] = {}

    def admit(claims: BudgetClaims, name: str) -> None:
        start.wait()
        results[name] = claims.claim(name, _refusal(name, views))

    threads = [threading.Thread(target=admit, args=(c, n)) for c, n in zip(replicas, candidates, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_a_claimed_node_holds_its_slot_until_a_fresh_read_shows_it_done(kube_target: KubeTarget) -> None:
    admin = kube_target.client()
    admin.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"},
                         "spec": {"unschedulable": True},
                         "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    try:
        looks_done = {"gpu-0": True}  # this replica's informer already shows gpu-0 finished
        claims = _claims(kube_target, looks_done=lambda name: looks_done.get(name, False))
        assert _claims(kube_target).claim("gpu-0", _refusal("gpu-0", _views("gpu-0"))) == ""
        # The API server still has gpu-0 cordoned: the claim stays and gpu-1 must wait.
        assert claims.claim("gpu-1", _refusal("gpu-1", _views("gpu-1"))).startswith("budget full")
        admin.patch(NODES, "gpu-0", {"spec": {"unschedulable": False}})
        assert claims.claim("gpu-1", _refusal("gpu-1", _views("gpu-1"))) == ""
        assert set(claims.admitted()) == {"gpu-1"}
    finally:
        admin.delete(NODES, "gpu-0")


def test_a_candidate_already_claimed_keeps_its_slot(kube_target: KubeTarget) -> None:
    claims = _claims(kube_target)
    assert claims.claim("gpu-0", _refusal("gpu-0", _views("gpu-0"))) == ""
    assert claims.claim("gpu-0", lambda _claimed: "must not be asked") == ""  # its node write had failed


def test_a_mangled_admitted_set_is_an_error_naming_the_key(kube_target: KubeTarget) -> None:
    kube_target.client().create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                             "metadata": {"name": BUDGET_CONFIGMAP}, "data": {ADMITTED_KEY: "[1"}},
                                kube_target.namespace)
    why = _claims(kube_target).claim("gpu-0", lambda _claimed: "")  # the drain waits, saying why
    assert why.startswith(f"budget claim failed: ConfigMap {BUDGET_CONFIGMAP} key {ADMITTED_KEY}: not JSON")


def _reset_configmap(target: KubeTarget, create: bool = False) -> None:
    """No admitted set (``create``: the replicas create it), or an empty one."""
    client = target.client()
    with contextlib.suppress(errors.NotFound):
        client.delete(CONFIGMAPS, BUDGET_CONFIGMAP, target.namespace)
    if not create:
        client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": BUDGET_CONFIGMAP},
                                   "data": {ADMITTED_KEY: "{}"}}, target.namespace)


def test_a_claim_every_write_of_which_meets_another_replica_s_is_contended_not_refused(
        kube_target: KubeTarget, caplog: pytest.LogCaptureFixture) -> None:
    """Another replica writes the set between each of our reads and writes (a burst admitted on two shards):
    ``Contended`` (the drain asks again at once), no refusal to record and no warning."""
    _reset_configmap(kube_target)
    mine, other = _claims(kube_target), _claims(kube_target)
    asked: list[frozenset[str]] = []

    def refusal(claimed: frozenset[str]) -> str:
        asked.append(claimed)
        assert other.claim(f"other-{len(asked)}", lambda _c: "") == ""
        return ""

    with caplog.at_level(logging.WARNING), pytest.raises(Contended, match="5 conflicting writes in a row"):
        mine.claim("gpu-0", refusal)
    assert len(asked) == 5 and not caplog.records
    assert set(mine.admitted()) == {f"other-{i}" for i in range(1, 6)}


def test_claiming_ahead_takes_what_the_budget_admits_in_the_candidate_s_one_write(kube_target: KubeTarget) -> None:
    """A budget of 3, four of this replica's nodes waiting: the candidate and the two next in one write; the fourth
    is refused by its own refusal (the budget counts those claimed before it) and left to its own admission."""
    _reset_configmap(kube_target)
    claims = _claims(kube_target)
    views = _views("gpu-0", "gpu-1", "gpu-2", "gpu-3")
    budget = safety.Budget(3)

    def refusal(candidate: str) -> Any:
        return lambda claimed: budget_refusal(views, candidate, [], budget, [], claimed)

    writes_before = claims.requests
    why, taken = claims.claim_ahead("gpu-0", refusal("gpu-0"), lambda: {n: refusal(n) for n in ("gpu-1", "gpu-2",
                                                                                                 "gpu-3")})
    assert (why, taken) == ("", ("gpu-1", "gpu-2"))
    assert claims.requests - writes_before == 2  # one read, one write
    assert set(claims.admitted()) == {"gpu-0", "gpu-1", "gpu-2"}
    # gpu-1's own admission finds its claim made (its refusal is not asked) and gpu-3 still does not fit: no write
    before = claims.requests
    assert claims.claim_ahead("gpu-1", lambda _c: "must not be asked", lambda: {"gpu-3": refusal("gpu-3")}) \
        == ("", ())
    assert claims.requests - before == 1
    assert set(claims.admitted()) == {"gpu-0", "gpu-1", "gpu-2"}


def test_a_refused_candidate_claims_nothing_ahead(kube_target: KubeTarget) -> None:
    _reset_configmap(kube_target)
    claims = _claims(kube_target)

    def never_asked() -> dict[str, Any]:
        raise AssertionError("the nodes ahead were looked for although the candidate was refused")

    assert claims.claim_ahead("gpu-0", lambda _claimed: "paused", never_asked) == ("paused", ())
    assert claims.admitted() == {}
