"""The controller's view on the Node, the Kubernetes way: the ``GPURemediation`` NodeCondition and,
when configured, the ``gpuremediate.io/unhealthy:NoSchedule`` taint. Pure builders of patch bodies.

Conditions: ``status.conditions`` merges by ``type`` under a strategic merge patch, so a
``PATCH nodes/<name>/status`` (``application/strategic-merge-patch+json``) that lists only our
condition leaves every other writer's condition alone (the kubelet's Ready, node-problem-detector's,
the agent's). This is how node-problem-detector writes its conditions.

Taints: ``spec.taints`` has no merge key (``+listType=atomic``): a merge patch and a strategic merge
patch both replace the whole list. So the new list is computed from the node as read (others' taints
kept as they are) and the patch carries that read's ``metadata.resourceVersion``: if anyone changed
the node in between, the API server answers 409 Conflict instead of losing their taint, and the caller
reads again and rebuilds (the Kubernetes node lifecycle controller's ``PatchNodeTaints`` does the same
for the same reason). The taint patch is a JSON merge patch body, so it can ride in the record's own
patch (``vocab.record.node_patch``) and land with the cordon and the record atomically.

Nothing here removes a condition or a taint the controller did not set: the condition is only ever
ours (set False when the node is healthy again, as node-problem-detector does), and the taint is only
removed when the record says we added it (``tainted_by_us``), never when a person set the same key.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuremediate.policy.network import NIC_TAINT_KEY
from gpuremediate.policy.taint import TaintPolicy
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import NETWORK_KINDS
from gpuremediate.vocab.record import NodeRecord, isolated_at_gpu

REMEDIATION_CONDITION = "GPURemediation"
STATUS_PATCH_TYPE = "strategic"  # KubeClient.patch(..., patch_type=..., subresource="status")


def rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# --- conditions ------------------------------------------------------------------------------------


def find_condition(node: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    status = node.get("status")
    listed = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(listed, list):
        return None
    return next((c for c in listed if isinstance(c, Mapping) and c.get("type") == ctype), None)


def build_condition(
    existing: Mapping[str, Any] | None, ctype: str, status: str, reason: str, message: str, now: float
) -> dict[str, Any]:
    """The condition as it should be now: ``lastTransitionTime`` moves only when the status changes,
    ``lastHeartbeatTime`` is now."""
    if status not in ("True", "False", "Unknown"):
        raise ValueError(f"condition {ctype}: status must be True, False or Unknown, got {status!r}")
    kept = existing is not None and existing.get("status") == status and existing.get("lastTransitionTime")
    since = str(existing["lastTransitionTime"]) if kept and existing is not None else rfc3339(now)
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": since}


def condition_changed(existing: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """Whether writing ``wanted`` changes more than the heartbeat."""
    if existing is None:
        return True
    return any(existing.get(k) != wanted.get(k) for k in ("status", "reason", "message", "lastTransitionTime"))


def conditions_patch(conditions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The strategic merge patch for ``nodes/<name>/status`` that sets exactly these conditions."""
    return {"status": {"conditions": [dict(c) for c in conditions]}}


def state_reason(state: str) -> str:
    """A record state as a CamelCase condition reason: ``draining`` → ``Draining``."""
    return "".join(part.capitalize() for part in re.split(r"[-_ ]", state) if part)


def remediation_condition(
    node: Mapping[str, Any], record: NodeRecord | None, now: float
) -> dict[str, Any] | None:
    """``GPURemediation``: True while we hold the node (any state but healthy), reason = the state,
    message = why. None when nothing would change but the heartbeat (no write needed)."""
    record = record or NodeRecord()
    held = record.state != states.HEALTHY
    why = record.message or record.reason or ("no open GPU fault" if not held else record.state)
    existing = find_condition(node, REMEDIATION_CONDITION)
    wanted = build_condition(existing, REMEDIATION_CONDITION, "True" if held else "False",
                             state_reason(record.state), why, now)
    if existing is None and not held:
        return None  # a node we never held gets no condition of ours
    return wanted if condition_changed(existing, wanted) else None


def taints_of(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = node.get("spec")
    listed = spec.get("taints") if isinstance(spec, Mapping) else None
    return [dict(t) for t in listed if isinstance(t, Mapping)] if isinstance(listed, list) else []


def _same_taint(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Key and effect identify a taint (the API server refuses two with the same pair)."""
    return a.get("key") == b.get("key") and a.get("effect") == b.get("effect")


@dataclass(frozen=True)
class TaintChange:
    patch: dict[str, Any] | None  # JSON merge patch body (with the read's resourceVersion), None: no write
    tainted_by_us: bool  # what the record should remember after this write


def taint_change(node: Mapping[str, Any], taint: Mapping[str, Any], want: bool, tainted_by_us: bool) -> TaintChange:
    """Add ``taint`` (``want``) or take ours off again, keeping every other taint exactly as read.

    A taint with the same key and effect that is already there and not ours is left alone both ways:
    adding finds it present (``tainted_by_us`` stays False), removing does not touch it.
    """
    current = taints_of(node)
    present = any(_same_taint(t, taint) for t in current)
    if want:
        if present:
            return TaintChange(None, tainted_by_us)
        return TaintChange(_taints_patch(node, [*current, dict(taint)]), True)
    if not present or not tainted_by_us:
        return TaintChange(None, False)
    return TaintChange(_taints_patch(node, [t for t in current if not _same_taint(t, taint)]), False)


def _taints_patch(node: Mapping[str, Any], taints: list[dict[str, Any]]) -> dict[str, Any]:
    version = (node.get("metadata") or {}).get("resourceVersion")
    if not version:
        raise ValueError("a taint patch needs the node's resourceVersion (read the node first): without it a "
                         "concurrent writer's taint could be lost")
    return {"metadata": {"resourceVersion": str(version)}, "spec": {"taints": taints}}


def nic_taints(taints: list[dict[str, Any]], record: NodeRecord | None) -> list[dict[str, Any]] | None:
    """``taints`` with the NIC taint (``gpuremediate.io/nic-degraded=<nic>:NoSchedule``) as the record wants it:
    on while the node is held for a NIC fault (the fault's code names the NIC), off otherwise; None: no change.
    The key is gpuremediate's own, so any taint of that key is ours to replace or take off."""
    held = record is not None and record.state != states.HEALTHY and record.fault is not None \
        and record.fault.kind in NETWORK_KINDS
    others = [t for t in taints if t.get("key") != NIC_TAINT_KEY]
    if not held or record is None or record.fault is None:
        return None if len(others) == len(taints) else others
    taint = {"key": NIC_TAINT_KEY, "value": _label_value(record.fault.code), "effect": "NoSchedule"}
    ours = [t for t in taints if t.get("key") == NIC_TAINT_KEY]
    return None if ours == [taint] else [*others, taint]


def _label_value(text: str) -> str:
    """A taint value is a label value: at most 63 of A-Z a-z 0-9 - _ . (an RDMA device name already is)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:63].strip("._-")
    return cleaned


def remediation_taint(
    node: Mapping[str, Any], record: NodeRecord | None, policy: TaintPolicy, tainted_by_us: bool
) -> TaintChange:
    """The taint while we hold the node, off again when it is healthy (only if we put it there). A GPU-level
    isolation holds one GPU, not the node: no node taint."""
    held = record is not None and record.state != states.HEALTHY and not isolated_at_gpu(record)
    return taint_change(node, policy.as_taint(), policy.enabled and held, tainted_by_us)
