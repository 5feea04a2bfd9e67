"""The drain scope a fault's repairs need: the configured ``[drain].scope``, widened to every pod a rung of the
fault's escalation ladder would end without an eviction (or that a MaintenanceRequest hands over).

A drain of scope ``impacted`` (or ``gpu``) leaves pods on the node; a reboot ends every one of them, and a reset
of every GPU (a fault naming no GPU, or a node whose GPUs reset only together) ends the pods on the other GPUs.
Those pods would be killed without their PodDisruptionBudgets being asked. So the drain takes what the widest
rung needs, computed from the policy, the node and the record alone (the same answer on every replica and after
a restart). A custom action keeps the configured scope: what it ends is its plugin's to say. A GPU isolated by the
device plugin (``[isolation] without_dra = "device-plugin"``) narrows it to ``impacted``: that GPU's pods, and the
node stays schedulable.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuremediate.actions.nodes import Node, labels_of
from gpuremediate.actions.pods import SCOPE_ALL, SCOPE_GPU, SCOPE_IMPACTED
from gpuremediate.policy.config import Policy
from gpuremediate.policy.fabric import KIND_DOMAIN
from gpuremediate.policy.gpu_operator import PRODUCT_LABEL, SCOPE_NODE
from gpuremediate.state.decide import MAINTENANCE_KIND
from gpuremediate.vocab.findings import ACTION_NONE, ACTION_QUARANTINE, ACTION_REBOOT, ACTION_RESET_GPU
from gpuremediate.vocab.record import NodeRecord

WIDTH = {SCOPE_IMPACTED: 0, SCOPE_GPU: 1, SCOPE_ALL: 2}
DETAIL_PREFIX = "scope "  # the drain action's detail when the scope was widened: "scope all: <why>"


@dataclass(frozen=True)
class DrainScope:
    scope: str
    why: str = ""  # set when the scope is wider than the configured one: the rung that needs it

    @property
    def detail(self) -> str:
        """What the drain action records of it ("" when the configured scope stands)."""
        return f"{DETAIL_PREFIX}{self.scope}: {self.why}" if self.why else ""


def drain_scope(policy: Policy, node: Node, record: NodeRecord) -> DrainScope:
    """The scope to drain ``node`` with before the repairs of ``record.fault``."""
    chosen = DrainScope(policy.drain.scope)
    if record.fault is None:
        return chosen
    isolation = record.isolation
    if isolation is not None and isolation.at_gpu and isolation.by_device_plugin:
        # Its ladder is the GPU's reset alone (policy.isolation.node_level_reason): nothing wider is needed.
        alone = f"GPU {isolation.uuid} alone is isolated (by the device plugin): only its pods"
        return chosen if chosen.scope == SCOPE_IMPACTED else DrainScope(SCOPE_IMPACTED, alone)
    if record.fault.kind == MAINTENANCE_KIND and record.fault.action in (ACTION_NONE, ACTION_QUARANTINE):
        held = "a MaintenanceRequest hands the node over (held for its maintenance, or for a person)"
        return chosen if chosen.scope == SCOPE_ALL else DrainScope(SCOPE_ALL, held)
    if record.fault.kind == KIND_DOMAIN:
        whole = "a domain action hands the whole NVLink domain over (a rack maintenance, or a person)"
        return chosen if chosen.scope == SCOPE_ALL else DrainScope(SCOPE_ALL, whole)
    rungs = policy.remediation.ladder_for(record.fault.action)
    for number, rung in enumerate(rungs, start=1):
        needed = _needs(policy, node, record, rung.action)
        if needed is None or WIDTH[needed[0]] <= WIDTH[chosen.scope]:
            continue
        where = f" (rung {number} of the ladder for {record.fault.action})" if len(rungs) > 1 else ""
        chosen = DrainScope(needed[0], f"{needed[1]}{where}")
    return chosen


def _needs(policy: Policy, node: Node, record: NodeRecord, action: str) -> tuple[str, str] | None:
    """(scope, why) a repair action needs, None when any scope will do."""
    if action == ACTION_REBOOT:
        return SCOPE_ALL, "a reboot ends every pod on the node"
    if action != ACTION_RESET_GPU:
        return None
    assert record.fault is not None
    if not record.fault.gpus:
        return SCOPE_GPU, "the fault names no GPU: reset-gpu resets every GPU"
    gop, labels = policy.gpu_operator, labels_of(node)
    if gop.applies(labels) and gop.reset_scope(labels) == SCOPE_NODE:
        product = labels.get(PRODUCT_LABEL, "")
        return SCOPE_GPU, f"{product or 'this node'}'s GPUs reset only together: reset-gpu resets every GPU"
    return None
