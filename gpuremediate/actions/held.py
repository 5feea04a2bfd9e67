"""A Node whose record cannot be written: its annotations are full (the API server allows 256 KiB of
annotations in total, keys and values together, and another tool keeps nearly all of it).

The fault is still made safe, and visibly so, without an annotation of ours: the node is cordoned and
labelled ``gpuremediate.io/record-refused=<the fault's reason>`` (labels do not count toward the annotations'
limit), its ``GPURemediation`` condition (status, not an annotation) says why, and a Warning Event names the
annotations' size and their largest keys with the managers that wrote them. The label is the record of why
the node is cordoned. Each cycle the detect loop decides again: once the record fits, it is written as
usual (the held cordon counts as ours and the label goes in the same patch); if the fault is gone first, the
hold is lifted (docs/operations.md, "A Node whose annotations are full").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuremediate.kube import errors

HELD_LABEL = "gpuremediate.io/record-refused"
ANNOTATIONS_LIMIT_B = 256 * 1024  # apimachinery's TotalAnnotationSizeLimitB
HELD_REASON = "RecordNotWritable"


def annotations_full(exc: errors.ApiError) -> bool:
    """A 422 refusing the Node's annotations as too long (kube-apiserver's FieldValueTooLong)."""
    if exc.code != 422:
        return False
    if any(c.get("field") == "metadata.annotations" and c.get("reason") == "FieldValueTooLong" for c in exc.causes):
        return True
    return "metadata.annotations: Too long" in exc.message


def held_by_us(node: Mapping[str, Any]) -> bool:
    """We cordoned this node for a fault whose record did not fit (its label says so)."""
    return HELD_LABEL in ((node.get("metadata") or {}).get("labels") or {})


def label_value(fault_reason: str) -> str:
    """A label value (<= 63 of A-Z a-z 0-9 - _ .) naming the fault: ``xid-48``."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in fault_reason)[:63].strip("-_.")
    return cleaned or "fault"


def hold_patch(node: Mapping[str, Any], fault_reason: str) -> dict[str, Any]:
    """Cordon and label, guarded by the node's resourceVersion; no annotation is touched."""
    return {"metadata": {"labels": {HELD_LABEL: label_value(fault_reason)},
                         "resourceVersion": str((node.get("metadata") or {}).get("resourceVersion", ""))},
            "spec": {"unschedulable": True}}


def lift_patch(node: Mapping[str, Any]) -> dict[str, Any]:
    """The held cordon and its label taken off (the fault is gone before a record could be written)."""
    return {"metadata": {"labels": {HELD_LABEL: None},
                         "resourceVersion": str((node.get("metadata") or {}).get("resourceVersion", ""))},
            "spec": {"unschedulable": False}}


def annotation_sizes(node: Mapping[str, Any]) -> tuple[int, list[tuple[str, int]]]:
    """The annotations' total bytes (keys and values, as the API server counts them) and each key's, largest
    first."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    sizes = sorted(((str(k), len(str(k).encode()) + len(str(v).encode())) for k, v in annotations.items()),
                   key=lambda item: -item[1])
    return sum(size for _, size in sizes), sizes


def managers_of(node: Mapping[str, Any], key: str) -> list[str]:
    """Who wrote an annotation, from the Node's managedFields (empty when the server does not say)."""
    found = []
    for entry in (node.get("metadata") or {}).get("managedFields") or []:
        fields = (((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations") or {})
        if f"f:{key}" in fields:
            found.append(str(entry.get("manager") or "?"))
    return found


def describe_full(node: Mapping[str, Any], record_bytes: int) -> str:
    """``annotations hold 261,000 of 262,144 bytes (ours needs 1,210); largest: k (255,000 bytes, by tool)``."""
    total, sizes = annotation_sizes(node)
    largest = []
    for key, size in sizes[:3]:
        who = managers_of(node, key)
        largest.append(f"{key} ({size:,} bytes{', by ' + ', '.join(who) if who else ''})")
    return (f"the Node's annotations hold {total:,} of {ANNOTATIONS_LIMIT_B:,} bytes (our record needs "
            f"{record_bytes:,}); largest: {'; '.join(largest) or 'none'}")


def record_bytes(patch: Mapping[str, Any]) -> int:
    """What the patch's annotations add (keys and values)."""
    annotations = (patch.get("metadata") or {}).get("annotations") or {}
    return sum(len(str(k).encode()) + len(str(v or "").encode()) for k, v in annotations.items())


def would_overflow(node: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """The node's annotations with the patch's would pass the limit (asked before sending a write to a held
    node: the API server refused it before, and would every cycle)."""
    ours = (patch.get("metadata") or {}).get("annotations") or {}
    _, sizes = annotation_sizes(node)
    return sum(size for key, size in sizes if key not in ours) + record_bytes(patch) > ANNOTATIONS_LIMIT_B
