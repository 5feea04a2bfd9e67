"""sim.miniyaml: the YAML subset the manifests use, and clear errors for everything else."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.miniyaml import YamlError, load, load_all

# -- a tiny block-style dumper, used to round-trip generated data ---------------------------

_SAFE_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_KEYWORDS = {"null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE", "~"}
_LITERAL_LINE = re.compile(r"(\S(.*\S)?)?")


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ".inf" if value == math.inf else "-.inf" if value == -math.inf else repr(value)
    if _SAFE_PLAIN.fullmatch(value) and value not in _KEYWORDS:
        return value
    return json.dumps(value)


def _literal_ok(text: str) -> bool:
    lines = text.split("\n")
    return (
        "\n" in text
        and lines[0] != ""
        and all(_LITERAL_LINE.fullmatch(line) and line.isprintable() for line in lines)
    )


def _literal(text: str, indent: int) -> list[str]:
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    chomp = "-" if trailing == 0 else "" if trailing == 1 else "+"
    pad = " " * (indent + 2)
    lines = [pad + line if line else "" for line in body.split("\n")]
    return ["|" + chomp, *lines, *([""] * (trailing - 1))]


def _dump(value: Any, indent: int = 0, compact: bool = False) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict) and value:
        out: list[str] = []
        for key, item in value.items():
            out.extend(_entry(pad + json.dumps(key) + ":", item, indent, compact, in_mapping=True))
        return out
    if isinstance(value, list) and value:
        out = []
        for item in value:
            out.extend(_entry(pad + "-", item, indent, compact, in_mapping=False))
        return out
    return [pad + _inline(value)]


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def _entry(prefix: str, item: Any, indent: int, compact: bool, *, in_mapping: bool) -> list[str]:
    if isinstance(item, (dict, list)) and item:
        if compact and in_mapping and isinstance(item, list):
            # kubectl style: a sequence at the same indentation as its key
            return [prefix, *_dump(item, indent, compact)]
        nested = _dump(item, indent + 2, compact)
        if compact and not in_mapping:
            # "- key: value" / "- - item": the collection starts on the dash's line
            return [prefix + " " + nested[0][indent + 2 :], *nested[1:]]
        return [prefix, *nested]
    if isinstance(item, str) and _literal_ok(item):
        first, *rest = _literal(item, indent)
        return [prefix + " " + first, *rest]
    return [prefix + " " + _inline(item)]


def dump(value: Any, compact: bool = False) -> str:
    return "\n".join(_dump(value, 0, compact)) + "\n"


_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False),
    _text,
    st.sampled_from(["true", "null", "12", "1.5", "0x1f", "a: b", "- x", "# no", "multi\nline\n", "k\n\nv"]),
)
_json_like = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(_json_like, st.booleans())
def test_dumped_block_yaml_loads_back_to_the_same_data(value: Any, compact: bool) -> None:
    assert load(dump(value, compact)) == value


@settings(max_examples=50, deadline=None)
@given(st.lists(_json_like, min_size=1, max_size=3))
def test_multi_document_streams_load_every_document(values: list[Any]) -> None:
    stream = "".join("---\n" + dump(v) for v in values)
    assert load_all(stream) == values


# -- the subset, by example ---------------------------------------------------------------------


def test_core_schema_typing_of_plain_scalars() -> None:
    doc = load(
        "a: 1\nb: -2.5\nc: 1e3\nd: true\ne: False\nf: ~\ng: null\nh: 0o17\ni: 0x1F\n"
        "j: .inf\nk: yes\nl: 1.2.3\nm: '1'\nn: \"true\"\no:\n"
    )
    assert doc == {
        "a": 1, "b": -2.5, "c": 1000.0, "d": True, "e": False, "f": None, "g": None, "h": 15,
        "i": 31, "j": math.inf, "k": "yes", "l": "1.2.3", "m": "1", "n": "true", "o": None,
    }


def test_compact_sequences_and_nested_collections() -> None:
    text = """
rules:
- apiGroups: [""]
  resources: [nodes, "nodes/status"]
  verbs:
    - get
- - 1
  - 2
empty: {}
flow: {a: [1, {b: c}], "d e": 'f'}
"""
    assert load(text) == {
        "rules": [{"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["get"]}, [1, 2]],
        "empty": {},
        "flow": {"a": [1, {"b": "c"}], "d e": "f"},
    }


def test_block_scalars_with_chomping_and_folding() -> None:
    text = (
        "a: |\n  x\n   y\n\nb: |-\n  x\nc: |+\n  x\n\n\n"
        "d: >\n  one\n  two\n\n  three\n    kept\n  four\ne: |2\n    indented\n"
    )
    assert load(text) == {
        "a": "x\n y\n",
        "b": "x",
        "c": "x\n\n\n",
        "d": "one two\nthree\n  kept\nfour\n",
        "e": "  indented\n",
    }


def test_comments_quotes_and_hashes_inside_values() -> None:
    text = "# head\na: x#y  # comment\nb: 'it''s # not a comment'\nc: \"tab\\there \\u00e9\"\nurl: http://h:80/p\n"
    assert load(text) == {"a": "x#y", "b": "it's # not a comment", "c": "tab\there é", "url": "http://h:80/p"}


def test_documents_split_on_markers_and_skip_empty_leading_text() -> None:
    assert load_all("# only a comment\n---\na: 1\n---\n---\n- b\n...\n") == [{"a": 1}, None, ["b"]]
    assert load("") is None


def test_multi_line_plain_and_quoted_scalars_fold_as_yaml_does() -> None:
    text = "a: this is\n  continued\n\n  para\nb: 'x\n  y'\nc: \"p\\\n  q  r\n\n  s\"\nd:\n- long\n  item\n- x\n"
    assert load(text) == {"a": "this is continued\npara", "b": "x y", "c": "pq  r\ns", "d": ["long item", "x"]}


def test_multi_line_flow_collection() -> None:
    assert load("a: [1,\n  2, # two\n  3]\nb: 4\n") == {"a": [1, 2, 3], "b": 4}


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a: 1\na: 2\n", 2, "duplicate key"),
        ("a: &x 1\n", 1, "anchors"),
        ("a: *x\n", 1, "anchors"),
        ("a: !!str 1\n", 1, "tags"),
        ("a:\n\tb: 1\n", 2, "tab"),
        ("a: 1\n   b: 2\n", 1, "mapping values"),
        ("a: [1]\n  b: 2\n", 2, "indentation"),
        ("a: b: c\n", 1, "mapping values"),
        ('a: "open\n', 1, "unterminated"),
        ("a: [1, 2\n", 1, "unterminated flow"),
        ("? complex\n", 1, "complex"),
        ("%YAML 1.2\n---\na: 1\n", 1, "directives"),
        ("a:\n  - 1\n  b: 2\n", 3, "expected"),
        ("x:\n  y: 1\n - z\n", 3, "unexpected"),
        ("a: |x\n  t\n", 1, "block scalar header"),
        ("a: \"bad \\q\"\n", 1, "escape"),
        ("a: {b: 1, b: 2}\n", 1, "duplicate key"),
    ],
)
def test_unsupported_or_malformed_input_names_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(YamlError) as caught:
        load_all(text)
    assert caught.value.line == line
    assert words in str(caught.value)
    assert str(caught.value).startswith(f"line {line}:")


def test_load_refuses_a_stream_of_several_documents() -> None:
    with pytest.raises(YamlError, match="expected one document, found 2"):
        load("a: 1\n---\nb: 2\n")
