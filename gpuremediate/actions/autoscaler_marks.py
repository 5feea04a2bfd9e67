"""The marks that keep node autoscalers off a node while gpuremediate works on it. Pure builders.

While a node is in remediation (any state but ``healthy``) it carries two Node annotations:

- ``karpenter.sh/do-not-disrupt: "true"``: Karpenter reads it on a Node (or NodeClaim, or Pod) and blocks its
  voluntary disruption, consolidation and drift (karpenter.sh, "Well-Known Annotations"; it does not block
  expiration, Karpenter's own node repair or a forceful termination);
- ``cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"``: the Cluster Autoscaler never scales the
  node down (cluster-autoscaler FAQ, "How can I prevent Cluster Autoscaler from scaling down a particular
  node?").

They ride in the record's own merge patch (annotations merge by key: only ours change), so the state change
and the marks land together. They are taken off when the node is healthy again (back in service, or released
by a person), and only those the record says we added (``NodeRecord.marked_by_us``): a mark a person or another
tool put there before us stays, whatever its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord

KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
CA_SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
MARKS: Mapping[str, str] = {KARPENTER_DO_NOT_DISRUPT: "true", CA_SCALE_DOWN_DISABLED: "true"}


@dataclass(frozen=True)
class MarksChange:
    marked_by_us: tuple[str, ...]  # the marks ours after the write (sorted)
    annotations: dict[str, str | None]  # the merge-patch annotations: a value sets, None removes; {} no change


def in_remediation(record: NodeRecord | None) -> bool:
    return record is not None and record.state != states.HEALTHY


def marks_change(node: Mapping[str, Any], record: NodeRecord, ours_before: tuple[str, ...]) -> MarksChange:
    """What to write so the node carries the marks while ``record`` is in remediation and drops ours after.
    ``ours_before``: the marks the record on the node, as read, says we added."""
    present = dict((node.get("metadata") or {}).get("annotations") or {})
    patch: dict[str, str | None] = {}
    ours: list[str] = []
    wanted = in_remediation(record)
    for key, value in MARKS.items():
        mine = key in ours_before
        if wanted:
            if key in present:
                if mine:
                    ours.append(key)  # there by us: stays ours (so it is taken off at the end)
            elif not mine:
                patch[key] = value
                ours.append(key)
            # ours but gone: someone took it off mid-flow; not put back (theirs to decide), no longer ours
        elif mine and key in present:
            patch[key] = None
    return MarksChange(tuple(sorted(ours)), patch)
