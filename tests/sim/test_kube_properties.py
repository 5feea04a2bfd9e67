"""Property tests for the patch algebra and the label-selector parser."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kube_patch import json_patch, merge_diff, merge_patch
from sim.kube_selectors import labels_match, parse_label_selector

KEYS = st.sampled_from(["a", "b", "c", "d"])
SCALARS = st.one_of(st.integers(-5, 5), st.text("xyz", max_size=3), st.booleans())
DOCS = st.recursive(SCALARS, lambda inner: st.dictionaries(KEYS, inner, max_size=3)
                    | st.lists(SCALARS, max_size=3), max_leaves=8)
OBJECTS = st.dictionaries(KEYS, DOCS, max_size=4)
SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(OBJECTS, OBJECTS)
def test_merge_patch_of_a_diff_reproduces_the_target(source: dict[str, Any], target: dict[str, Any]) -> None:
    assert merge_patch(source, merge_diff(source, target)) == target


@SETTINGS
@given(OBJECTS, KEYS, DOCS)
def test_json_patch_add_then_remove_round_trips(doc: dict[str, Any], key: str, value: Any) -> None:
    doc = {k: v for k, v in doc.items() if k != key}
    added = json_patch(doc, [{"op": "add", "path": f"/{key}", "value": value}])
    assert added[key] == value
    assert json_patch(added, [{"op": "test", "path": f"/{key}", "value": copy.deepcopy(value)},
                              {"op": "remove", "path": f"/{key}"}]) == doc


LABEL_KEYS = st.sampled_from(["env", "tier", "app"])
LABEL_VALUES = st.sampled_from(["prod", "dev", "web", "x1"])
REQUIREMENT = st.one_of(
    st.tuples(st.just("="), LABEL_KEYS, st.lists(LABEL_VALUES, min_size=1, max_size=1)),
    st.tuples(st.just("!="), LABEL_KEYS, st.lists(LABEL_VALUES, min_size=1, max_size=1)),
    st.tuples(st.just("in"), LABEL_KEYS, st.lists(LABEL_VALUES, min_size=1, max_size=3)),
    st.tuples(st.just("notin"), LABEL_KEYS, st.lists(LABEL_VALUES, min_size=1, max_size=3)),
    st.tuples(st.just("exists"), LABEL_KEYS, st.just([])),
    st.tuples(st.just("!"), LABEL_KEYS, st.just([])))


def _text(req: tuple[str, str, list[str]]) -> str:
    op, key, values = req
    if op == "exists":
        return key
    if op == "!":
        return f"!{key}"
    if op in ("in", "notin"):
        return f"{key} {op} ({','.join(values)})"
    return f"{key}{op}{values[0]}"


def _reference(req: tuple[str, str, list[str]], labels: dict[str, str]) -> bool:
    op, key, values = req
    return {"=": lambda: labels.get(key) == values[0], "!=": lambda: labels.get(key) != values[0],
            "in": lambda: labels.get(key) in values, "notin": lambda: labels.get(key) not in values,
            "exists": lambda: key in labels, "!": lambda: key not in labels}[op]()


@SETTINGS
@given(st.lists(REQUIREMENT, min_size=1, max_size=4), st.dictionaries(LABEL_KEYS, LABEL_VALUES))
def test_selector_matching_equals_a_reference_evaluator(reqs: list[tuple[str, str, list[str]]],
                                                       labels: dict[str, str]) -> None:
    selector = parse_label_selector(",".join(_text(r) for r in reqs))
    assert labels_match(selector, labels) == all(_reference(r, labels) for r in reqs)
