"""The ``Drainer`` interface: one step of one way of draining a node, and the narrow context it gets.

The drain loop (``loops.drain``) admits the drain (pause, breakers, budget, gates), records it as the action in
progress, then each step runs the first variant of the table in ``loops.drainers`` that takes it (a DrainRequest
for a drain plugin, else the built-in eviction drain), hands it a ``DrainContext`` and turns the ``StepResult`` it
returns into the record's next state (``Done``: drain complete; ``Failed``: the drain failed, the node is
quarantined). A variant never sees the loop and never writes that transition; it writes only its own progress
(a block it is waiting on, its request created, a fallback) through ``writer``.

A variant module imports this module (and ``loops.step``), never ``loops.drain``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuremediate.actions.nodes import Node
from gpuremediate.loops.step import StepContext, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.vocab.record import NodeRecord


class DrainContext(StepContext, Protocol):
    """What a drain step may use: the shared context (the node writer, the API client for evictions, deletes and
    custom resources, Events, metrics, the clock, its node's policy: [drain], [customDrain] ...) and the drain's
    pods."""

    def targets(self, node: Node, record: NodeRecord, confirm: bool = False) -> list[Mapping[str, Any]]:
        """The pods this drain must see gone: from the node's pod watch, or with ``confirm`` from a LIST."""

    def stop_watching(self, node: str) -> None:
        """The node's pods need not be watched any more (its drain is over)."""

    def requeue(self, node: str) -> None:
        """A step for the node soon (from any thread: an eviction sent in an earlier step has its answer)."""


class Drainer(Protocol):
    def step(self, ctx: DrainContext, node: Node, record: NodeRecord) -> StepResult:
        """One step of an admitted drain: read, decide, write its own progress, return what the loop does next."""


@dataclass(frozen=True)
class DrainRow:
    """One row of the table: ``matches`` picks the variant for a step (rows are tried in order, the first that
    matches runs; the loop makes each variant once and keeps it); ``guarded``: it calls a plugin's kind, so a 403
    blocks the node (``blocked: permission``) rather than failing the step."""

    kind: str
    matches: Callable[[Policy, NodeRecord], bool]
    make: Callable[[], Drainer]
    guarded: bool = False
