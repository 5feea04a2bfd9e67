"""Drain admission across shards, decided by the API server: ConfigMap ``gpuremediate-budget``.

With one replica the node informer is the whole truth: the one drain loop admits one node at a time and its
own writes are the only admissions. With several shards it is not: two replicas can each see one free slot
in their informers and each admit a node of its own shard — two Nodes' records never conflict, so no 409
stops them. So a sharded replica admits a drain only by writing the node into the ConfigMap's ``admitted``
set (data key ``admitted``: JSON ``{node: admitted-at}``) with a resourceVersion precondition, after checking
the budget with every node already in that set counted out of service. Two replicas admitting at once
write from the same resourceVersion: one gets 409, reads the set again (now with the other's node) and
decides again.

A node leaves the set when a fresh read shows it back in service and in no active state: a LIST by name
with no resourceVersion, which the API server answers consistently ("most recent", as a GET; and nodes'
list is already granted). Only nodes the informer already shows done are read that way (one LIST per
finished node). A stale informer elsewhere can only count such a node out, never a claimed one in.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CONFIGMAPS, NODES
from gpuremediate.policy import safety
from gpuremediate.vocab import states

log = logging.getLogger(__name__)

BUDGET_CONFIGMAP = "gpuremediate-budget"
ADMITTED_KEY = "admitted"
CLAIM_ATTEMPTS = 5  # one write and four re-reads after a 409
CLAIM_AHEAD = 16  # a replica's other waiting nodes claimed in one admission's write, at most

Refusal = Callable[[frozenset[str]], str]  # why a node may not be admitted with these claimed ("" when it may)


class ClaimError(RuntimeError):
    """The admitted set could not be read or written; the drain waits and asks again."""


class Contended(ClaimError):
    """Every attempt met another replica's write of the set (a burst admitted on several shards at once): no
    failure, the drain asks again at once. Counted as a failure it was a warning and a node left waiting a resync
    (3-8 of them in each 750-node burst on 2 shards)."""


def is_done(view: safety.NodeView) -> bool:
    """Back in service and in no active state: its admission holds no slot any more."""
    return not view.out_of_service and view.state not in states.ACTIVE_STATES


def with_claimed(views: Collection[safety.NodeView], claimed: Collection[str], candidate: str
                 ) -> list[safety.NodeView]:
    """The informer's views with every claimed node but the candidate counted out of service."""
    return [dataclasses.replace(v, unschedulable=True, waiting=False) if v.name in claimed and v.name != candidate
            else v for v in views]


def budget_refusal(views: Collection[safety.NodeView], candidate: str, waiting: Collection[str], budget: safety.Budget,
                   domains: Collection[safety.DomainBudget], claimed: Collection[str],
                   size: safety.FleetSize | None = None,
                   view_of: Callable[[str], safety.NodeView | None] | None = None) -> str:
    """Why ``candidate`` may not start with the claimed nodes counted out ("" when it may). With ``size``, ``views``
    are the notable nodes only: a claimed node not among them (admitted by another replica, still in service in
    this cache) is looked up with ``view_of``, which ``size`` needs."""
    if size is not None:
        if view_of is None:
            raise ValueError("budget_refusal: views of the notable nodes only (size) need view_of for claimed nodes")
        known = {v.name for v in views}
        views = [*views, *(v for name in sorted(set(claimed) - known) if (v := view_of(name)) is not None)]
    counted = with_claimed(views, claimed, candidate)
    result = safety.budget_check(counted, candidate, budget, list(domains), size)
    if not result.allowed:
        return f"{result.reason} (admitted across shards: {len(claimed)})"
    candidates = [n for n in waiting if n not in claimed] + [candidate]
    if candidate not in safety.admit(counted, candidates, budget, list(domains), size):
        return "older faults go first: " + result.reason
    return ""


class BudgetClaims:
    """The admitted set in ConfigMap ``gpuremediate-budget`` (namespace: the controller's)."""

    def __init__(self, client: KubeClient, namespace: str, looks_done: Callable[[str], bool],
                 clock: Callable[[], float]) -> None:
        """``looks_done``: whether the informer shows a node done (then a fresh read decides)."""
        self.client = client
        self.namespace = namespace
        self.looks_done = looks_done
        self.clock = clock
        self.requests = 0  # API calls made (the cost the docs quote)

    def claim(self, candidate: str, refusal: Refusal) -> str:
        """Put ``candidate`` in the admitted set when ``refusal(the others admitted)`` is ""; else that reason.
        A candidate already in the set holds its slot (a claim whose node write failed). The set unreadable or
        unwritable: the reason says why (the drain waits, blocked on the budget, and asks again). Raises
        ``Contended`` when every attempt met another replica's write."""
        return self.claim_ahead(candidate, refusal, dict)[0]

    def claim_ahead(self, candidate: str, refusal: Refusal, ahead: Callable[[], Mapping[str, Refusal]]
                    ) -> tuple[str, tuple[str, ...]]:
        """``claim``, and with the candidate admitted, in the same write, each node of ``ahead()`` (in its order;
        asked once, only when the candidate is admitted) that its own refusal lets in with every node admitted
        before it counted: this replica's other nodes waiting for admission, so that a burst's share is claimed in
        a few writes of the one ConfigMap every shard writes, not one contended read-modify-write each. Returns
        the candidate's reason and the nodes of ``ahead`` now claimed (each holds its slot until its own admission
        starts its drain)."""
        try:
            return self._claim(candidate, refusal, ahead)
        except Contended:
            raise
        except ClaimError as exc:
            log.warning("budget claim failed; the drain waits", extra={"node": candidate, "error": str(exc)})
            return f"budget claim failed: {exc}", ()

    def _claim(self, candidate: str, refusal: Refusal, ahead: Callable[[], Mapping[str, Refusal]]
               ) -> tuple[str, tuple[str, ...]]:
        others: Mapping[str, Refusal] | None = None
        for _ in range(CLAIM_ATTEMPTS):
            current = self._read()
            admitted = self._pruned(_admitted_of(current))
            why = "" if candidate in admitted else refusal(frozenset(admitted))
            taken: list[str] = []
            if not why:
                now = self.clock()
                admitted.setdefault(candidate, now)
                others = ahead() if others is None else others
                for name, refuses in others.items():
                    if name not in admitted and not refuses(frozenset(admitted)):
                        admitted[name] = now
                        taken.append(name)
            if self._write(current, admitted):  # no write where nothing changed
                return why, tuple(taken)
        raise Contended(f"ConfigMap {self.namespace}/{BUDGET_CONFIGMAP}: {CLAIM_ATTEMPTS} conflicting writes in a "
                        f"row")

    def admitted(self) -> dict[str, float]:
        return _admitted_of(self._read())

    # ---- the ConfigMap ---------------------------------------------------------------------------------

    def _read(self) -> dict[str, Any] | None:
        self.requests += 1
        try:
            return self.client.get(CONFIGMAPS, BUDGET_CONFIGMAP, self.namespace)
        except errors.NotFound:
            return None
        except (errors.ApiError, errors.TransportError) as exc:
            raise ClaimError(f"ConfigMap {self.namespace}/{BUDGET_CONFIGMAP} unreadable: {exc}") from exc

    def _write(self, current: dict[str, Any] | None, admitted: Mapping[str, float]) -> bool:
        """The set written from ``current``'s resourceVersion; False on a conflict (someone wrote first)."""
        if current is not None and _admitted_of(current) == dict(admitted):
            return True
        data = {ADMITTED_KEY: json.dumps(dict(sorted(admitted.items())), separators=(",", ":"))}
        self.requests += 1
        try:
            if current is None:
                self.client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                "metadata": {"name": BUDGET_CONFIGMAP, "namespace": self.namespace},
                                                "data": data}, self.namespace)
            else:
                self.client.replace(CONFIGMAPS, BUDGET_CONFIGMAP, {**current, "data": {**(current.get("data") or {}),
                                                                                        **data}}, self.namespace)
        except (errors.Conflict, errors.AlreadyExists):
            return False
        except (errors.ApiError, errors.TransportError) as exc:
            raise ClaimError(f"ConfigMap {self.namespace}/{BUDGET_CONFIGMAP} not written: {exc}") from exc
        return True

    def _pruned(self, admitted: dict[str, float]) -> dict[str, float]:
        """Without the nodes a fresh read shows done (only those the informer shows done are asked)."""
        kept = dict(admitted)
        for name in [n for n in admitted if self.looks_done(n)]:
            self.requests += 1
            try:
                # A LIST without resourceVersion is a quorum read, as a GET is (and nodes' list is granted).
                found = self.client.list(NODES, field_selector=f"metadata.name={name}").get("items") or []
            except (errors.ApiError, errors.TransportError) as exc:
                log.debug("budget claims: node %s unreadable, its claim kept: %s", name, exc)
                continue
            if not found or is_done(safety.node_view(found[0])):
                kept.pop(name)
        return kept


def _admitted_of(configmap: Mapping[str, Any] | None) -> dict[str, float]:
    """The admitted set as stored; an unreadable value is an empty set only if a person emptied it."""
    raw = ((configmap or {}).get("data") or {}).get(ADMITTED_KEY) or "{}"
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise ClaimError(f"ConfigMap {BUDGET_CONFIGMAP} key {ADMITTED_KEY}: not JSON ({exc}); fix or delete "
                         f"the key") from exc
    if not isinstance(parsed, dict) or not all(isinstance(v, int | float) for v in parsed.values()):
        raise ClaimError(f"ConfigMap {BUDGET_CONFIGMAP} key {ADMITTED_KEY}: expected {{node: seconds}}, "
                         f"got {raw[:80]!r}")
    return {str(k): float(v) for k, v in parsed.items()}
