"""A new node validated before it takes work (issue 47): ``[remediation.replace] startup_taint``.

A node provisioner can register its nodes with a taint that keeps work off until something removes it: Karpenter's
NodePool ``startupTaints`` ("Karpenter assumes that the taint is temporary and some other system will remove the
taint", karpenter.sh, Concepts: NodePools), a kubelet's ``--register-with-taints`` under Cluster API or a node
group. With ``startup_taint`` set to that key, a GPU node of the group that carries it and has no record (a new
Node, a replacement, the same name with a new uid), or a healthy one with no past flow (the detect loop may have
written one), is moved to ``validating`` (reason
``new-node``): the validate loop runs the same validation Job as after a repair (it tolerates every taint), and
the taint is taken off in the patch that writes ``healthy`` (``Decision.untaint``); a failure quarantines the node
with the reason and the taint stays. Until the record says ``validating`` nothing else of ours acts on the node
beyond what it does to any healthy node: its GPUs not yet readable (no exporter pod, no series) are health
"unknown", never a fault (the detect loop's rule).
"""

from __future__ import annotations

from gpuremediate.actions.node_status import taints_of
from gpuremediate.actions.nodes import Node, is_excluded, name_of
from gpuremediate.loops.base import NodeLoop
from gpuremediate.state import decide
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, RecordError, record_from_node


def startup_taint_of(node: Node, key: str) -> bool:
    """The node carries a taint of that key (any value or effect)."""
    return bool(key) and any(t.get("key") == key for t in taints_of(node))


class NewNodeLoop(NodeLoop):
    """Owns no state: it queues the GPU nodes carrying their group's startup taint with no record (or a healthy
    one with no past flow) and moves each to ``validating``."""

    name = "new-node"

    def startup_taint(self, node: Node) -> str:
        """The startup taint key this node waits under ("" when the policy names none or the node has none)."""
        key = self.ctx.policy_for(node).remediation.replace.startup_taint
        return key if startup_taint_of(node, key) else ""

    def _awaits_validation(self, node: Node) -> str:
        record = record_from_node(node)
        if isinstance(record, RecordError) or is_excluded(node):
            return ""
        if record is not None and (record.state != states.HEALTHY or record.fault is not None or record.history):
            return ""  # a node with a past of ours is no new node: the taint is someone's, not a registration's
        return self.startup_taint(node)

    def on_node(self, node: Node) -> None:
        if self.ctx.owns(name_of(node)) and self._awaits_validation(node):
            self.queue.add(name_of(node))

    def _reconcile_owned(self, name: str) -> float | None:
        node = self.ctx.nodes.get(name)
        if node is None:
            return None
        key = self._awaits_validation(node)
        if not key:
            return None
        record = record_from_node(node)
        assert not isinstance(record, RecordError)
        if self.apply(node, decide.new_node(record, key, self.ctx.clock())) is None:
            return self.retry_after_conflict()
        return None

    def reconcile(self, node: Node, record: NodeRecord) -> float | None:  # not reached: _reconcile_owned decides
        return None
