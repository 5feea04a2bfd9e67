"""Writing the agent's conditions on its own Node, the node-problem-detector way.

``PATCH /api/v1/nodes/<name>/status`` with a strategic merge patch ``{"status": {"conditions": [...]}}``:
conditions merge by ``type``, so only the agent's own types are touched (the kubelet's Ready and other
tools' conditions stay). ``lastTransitionTime`` changes only when a status changes; ``lastHeartbeatTime``
is refreshed on every write. A write happens when something changed or when the heartbeat is due (the
controller ignores conditions whose heartbeat is too old: an agent that stopped is not trusted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuremediate.actions.node_status import (
    STATUS_PATCH_TYPE,
    build_condition,
    condition_changed,
    conditions_patch,
    find_condition,
)
from gpuremediate.agent.health import Wanted
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NODES

DEFAULT_HEARTBEAT_S = 300.0  # node-problem-detector's default heartbeat period (5 minutes)


def desired_conditions(node: Mapping[str, Any], wanted: Sequence[Wanted], now: float) -> list[dict[str, Any]]:
    return [build_condition(find_condition(node, w.type), w.type, w.status, w.reason, w.message, now)
            for w in wanted]


class ConditionPublisher:
    def __init__(self, client: KubeClient, node_name: str, heartbeat_s: float = DEFAULT_HEARTBEAT_S) -> None:
        self.client = client
        self.node_name = node_name
        self.heartbeat_s = heartbeat_s
        self.last_write = -math.inf
        self.last_wanted: tuple[Wanted, ...] | None = None  # what the Node was last seen or made to say

    def publish(self, node: Mapping[str, Any], wanted: Sequence[Wanted], now: float) -> bool:
        """Write the conditions if any changed or the heartbeat is due; True when a write was made."""
        conditions = desired_conditions(node, wanted, now)
        changed = any(condition_changed(find_condition(node, c["type"]), c) for c in conditions)
        if not changed and now - self.last_write < self.heartbeat_s:
            self.last_wanted = tuple(wanted)
            return False
        self.last_wanted = None  # unknown until the write has succeeded
        self.client.patch(NODES, self.node_name, conditions_patch(conditions), patch_type=STATUS_PATCH_TYPE,
                          subresource="status")
        self.last_write = now
        self.last_wanted = tuple(wanted)
        return True
