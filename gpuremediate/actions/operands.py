"""The GPU Operator's operands on one node: taking them off through their deploy labels, and back.

The operator deploys an operand (device plugin, DCGM, dcgm-exporter, GPU Feature Discovery) on a node while
``nvidia.com/gpu.deploy.<operand>`` is ``"true"``. Taking it off is setting that label to ``off_value``; the
previous values are kept ON THE NODE, in the annotation ``gpuremediate.io/operand-labels``, written by the
same resourceVersion-guarded merge patch that changes the labels and the record (one patch: either all of it
lands or none). A controller restarted at any point finds, on the node, which labels it changed and what
they held. The restore puts back only the labels that still hold the value we set (a person or another tool
that changed one since then is not overwritten) and removes the annotation, in one patch with the record.

Annotation value (compact JSON)::

    {"off": "false", "previous": {"nvidia.com/gpu.deploy.device-plugin": "true", ...}}

``previous`` maps each label we changed to its value before (``null``: the label was absent).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuremediate.actions.nodes import Node, NodeWriter, labels_of, name_of
from gpuremediate.kube import errors
from gpuremediate.kube.patch import merge_patch
from gpuremediate.kube.resources import NODES
from gpuremediate.vocab.record import NodeRecord, node_patch

log = logging.getLogger(__name__)

OPERAND_ANNOTATION = "gpuremediate.io/operand-labels"


class OperandAnnotationError(ValueError):
    """The operand-labels annotation cannot be read (a person edited it)."""


@dataclass(frozen=True)
class SavedLabels:
    """What the operands-off patch changed: the value it set, and each label's value before (None: absent)."""

    off: str
    previous: Mapping[str, str | None]

    def encode(self) -> str:
        return json.dumps({"off": self.off, "previous": dict(sorted(self.previous.items()))},
                          sort_keys=True, separators=(",", ":"))


def saved_labels(node: Mapping[str, Any]) -> SavedLabels | None:
    """The annotation on the node (None: absent); raises OperandAnnotationError naming what is wrong."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(OPERAND_ANNOTATION)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OperandAnnotationError(f"{OPERAND_ANNOTATION} is not JSON: {exc}") from None
    off = data.get("off") if isinstance(data, dict) else None
    previous = data.get("previous") if isinstance(data, dict) else None
    if not isinstance(off, str) or not isinstance(previous, dict):
        raise OperandAnnotationError(f"{OPERAND_ANNOTATION} must be {{\"off\": string, \"previous\": object}}")
    for label, value in previous.items():
        if value is not None and not isinstance(value, str):
            raise OperandAnnotationError(f"{OPERAND_ANNOTATION}: previous[{label!r}] must be a string or null")
    return SavedLabels(off=off, previous=previous)


def off_patch(node: Node, record: NodeRecord, labels: Iterable[str], off_value: str,
              earlier: SavedLabels | None = None) -> tuple[dict[str, Any], SavedLabels]:
    """The one merge patch that sets ``labels`` to ``off_value``, saves their values, and writes ``record``.
    ``earlier``: an annotation already on the node (a sequence whose record was lost): the labels it names that
    still hold its value keep their saved previous value (never our own "false" saved as the value to restore)."""
    current = labels_of(node)
    previous: dict[str, str | None] = {label: current.get(label) for label in labels}
    if earlier is not None:
        previous.update({label: value for label, value in earlier.previous.items()
                         if current.get(label) == earlier.off})
    saved = SavedLabels(off=off_value, previous=previous)
    patch = _record_patch(node, record)
    patch["metadata"]["labels"].update({label: off_value for label in saved.previous})
    patch["metadata"]["annotations"][OPERAND_ANNOTATION] = saved.encode()
    return patch, saved


@dataclass(frozen=True)
class Restore:
    patch: dict[str, Any]
    restored: tuple[str, ...]  # labels put back to their previous value
    left: tuple[str, ...]  # labels someone changed since we set them: left as they are


def restore_patch(node: Node, record: NodeRecord | None, saved: SavedLabels | None) -> Restore:
    """The one merge patch that puts back the labels still holding our value, drops the annotation and writes
    ``record`` (None: the labels and the annotation only, still guarded by the node's resourceVersion). With no
    annotation (restored already, or never taken off) only the record is written."""
    patch = _record_patch(node, record) if record is not None else _guarded_patch(node)
    if saved is None:
        return Restore(patch, (), ())
    current = labels_of(node)
    restored = tuple(label for label in sorted(saved.previous) if current.get(label) == saved.off)
    left = tuple(label for label in sorted(saved.previous) if label not in restored)
    patch["metadata"]["labels"].update({label: saved.previous[label] for label in restored})  # None deletes
    patch["metadata"]["annotations"][OPERAND_ANNOTATION] = None
    return Restore(patch, restored, left)


def _record_patch(node: Node, record: NodeRecord) -> dict[str, Any]:
    rv = str((node.get("metadata") or {}).get("resourceVersion", "")) or None
    return node_patch(record, resource_version=rv, owner=node)


def _guarded_patch(node: Node) -> dict[str, Any]:
    rv = str((node.get("metadata") or {}).get("resourceVersion", ""))
    return {"metadata": {"labels": {}, "annotations": {}, **({"resourceVersion": rv} if rv else {})}}


def write_node(writer: NodeWriter, node: Node, patch: Mapping[str, Any]) -> Node | None:
    """Send a record patch that also carries labels and annotations; None on a 409 (re-read, decide again).
    In dry-run it goes to the writer's overlay, like every record write (nothing is sent)."""
    name = name_of(node)
    if writer.dry_run:
        writer.view.overlay(name, patch)
        body = {k: v for k, v in patch.items() if k != "metadata"}
        meta = {k: v for k, v in patch["metadata"].items() if k != "resourceVersion"}
        return merge_patch(node, {**body, "metadata": meta})
    try:
        result: Node = writer.client.patch(NODES, name, dict(patch))
    except errors.Conflict:
        log.info("node changed since read; deciding again", extra={"node": name})
        return None
    writer.view.remember_write(str((node.get("metadata") or {}).get("resourceVersion", "")), result)
    return result
