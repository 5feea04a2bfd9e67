"""Nobody advances ``quarantined``: a person does (``gpuremediate release NODE``). This loop only
notices a person taking such a node back by uncordoning it — the base loop's check, before any
reconcile — so that we stop treating the node as ours (and never uncordon it after a later release
if the person cordons it again)."""

from __future__ import annotations

from gpuremediate.actions.nodes import Node
from gpuremediate.loops.base import NodeLoop
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord


class QuarantineLoop(NodeLoop):
    name = "quarantine"
    owned = frozenset({states.QUARANTINED})

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:
        return None
