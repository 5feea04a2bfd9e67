"""The operand-labels patches: what they change, what they save on the node, what they leave alone."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gpuremediate.actions.operands import (
    OPERAND_ANNOTATION,
    OperandAnnotationError,
    SavedLabels,
    off_patch,
    restore_patch,
    saved_labels,
)
from gpuremediate.kube.patch import merge_patch
from gpuremediate.vocab import states
from gpuremediate.vocab.record import RECORD_ANNOTATION, NodeRecord, decode

DP = "nvidia.com/gpu.deploy.device-plugin"
EXP = "nvidia.com/gpu.deploy.dcgm-exporter"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
RECORD = NodeRecord(state=states.REPAIRING, since=1.0)


def node(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "resourceVersion": "7", "labels": labels, "annotations": annotations or {}}}


def test_off_sets_the_labels_saves_their_values_and_writes_the_record_in_one_guarded_patch() -> None:
    before = node({DP: "true", EXP: "true", "other": "x"})
    patch, saved = off_patch(before, RECORD, [DP, EXP, GFD], "false")
    assert patch["metadata"]["resourceVersion"] == "7"
    assert {k: patch["metadata"]["labels"][k] for k in (DP, EXP, GFD)} == {DP: "false", EXP: "false", GFD: "false"}
    assert saved.previous == {DP: "true", EXP: "true", GFD: None}  # None: the label was absent
    assert json.loads(patch["metadata"]["annotations"][OPERAND_ANNOTATION]) == {
        "off": "false", "previous": {DP: "true", EXP: "true", GFD: None}}
    assert decode(patch["metadata"]["annotations"][RECORD_ANNOTATION]) == dataclasses.replace(RECORD, node="n1")
    after = merge_patch(before, {k: v for k, v in patch.items()})
    assert saved_labels(after) == saved


def test_restore_puts_back_only_labels_still_holding_our_value_and_drops_the_annotation() -> None:
    saved = SavedLabels(off="false", previous={DP: "true", EXP: "true", GFD: None})
    changed = node({DP: "false", EXP: "paused-by-admin", GFD: "false"}, {OPERAND_ANNOTATION: saved.encode()})
    restore = restore_patch(changed, RECORD, saved)
    after = merge_patch(changed, restore.patch)
    labels = after["metadata"]["labels"]
    assert labels[DP] == "true"
    assert labels[EXP] == "paused-by-admin"  # a person's change since: left as it is
    assert GFD not in labels  # it was absent before: absent again
    assert OPERAND_ANNOTATION not in after["metadata"]["annotations"]
    assert restore.restored == (DP, GFD) and restore.left == (EXP,)


def test_restore_without_an_annotation_writes_only_the_record() -> None:
    restore = restore_patch(node({DP: "false"}), RECORD, None)
    assert set(restore.patch["metadata"]["labels"]) == {"gpuremediate.io/state"}
    assert OPERAND_ANNOTATION not in restore.patch["metadata"]["annotations"]


@pytest.mark.parametrize(("text", "problem"), [
    ("{not json", "is not JSON"),
    ('{"off": 1, "previous": {}}', 'must be {"off": string, "previous": object}'),
    ('{"off": "false", "previous": {"a": 3}}', "previous['a'] must be a string or null"),
    ("[]", 'must be {"off": string, "previous": object}'),
])
def test_a_broken_annotation_is_named(text: str, problem: str) -> None:
    with pytest.raises(OperandAnnotationError) as err:
        saved_labels(node({}, {OPERAND_ANNOTATION: text}))
    assert problem in str(err.value)


def test_an_earlier_annotation_keeps_the_values_to_restore_of_labels_still_off() -> None:
    earlier = SavedLabels(off="false", previous={DP: "true", EXP: "true"})
    before = node({DP: "false", EXP: "paused-by-admin", GFD: "true"}, {OPERAND_ANNOTATION: earlier.encode()})
    _, saved = off_patch(before, RECORD, [GFD], "false", earlier)
    assert saved.previous == {DP: "true", GFD: "true"}  # EXP was changed by someone since: not ours any more


def test_every_gpu_index_comes_from_the_readings_then_gfd_then_capacity() -> None:
    from gpuremediate.loops.gpu_reset import all_gpu_indexes

    plain = {"metadata": {"labels": {}}, "status": {"capacity": {"nvidia.com/gpu": "2"}}}
    assert all_gpu_indexes(plain, ["10", "2", "1", "2"]) == ["1", "2", "10"]
    assert all_gpu_indexes(plain, []) == ["0", "1"]
    gfd = {"metadata": {"labels": {"nvidia.com/gpu.count": "4"}}, "status": {"capacity": {"nvidia.com/gpu": "0"}}}
    assert all_gpu_indexes(gfd, []) == ["0", "1", "2", "3"]
    assert all_gpu_indexes({"metadata": {}, "status": {}}, []) == []
    huge = {"metadata": {"labels": {"nvidia.com/gpu.count": "9" * 63}}, "status": {}}
    assert all_gpu_indexes(huge, []) == []  # a garbage label is no GPU list (it was range(10**63))
