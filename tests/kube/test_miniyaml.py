from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.kube.miniyaml import YamlError, loads

PLAIN_SAFE = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_./-]{0,12}", fullmatch=True).filter(
    lambda s: s.lower() not in ("null", "true", "false", "y", "n", "yes", "no", "on", "off", ".inf", ".nan")
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(st.characters(codec="utf-8"), max_size=12), PLAIN_SAFE,
)
keys = st.one_of(PLAIN_SAFE, st.text(st.characters(codec="utf-8"), min_size=1, max_size=8))
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


def dump(value: Any, indent: int = 0) -> str:
    """A block-style YAML emitter for the round trip (plain scalars where safe, JSON-quoted otherwise)."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            out.append(f"{pad}{scalar(key, as_key=True)}:{_tail(item, indent)}")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        return "".join(f"{pad}-{_tail(item, indent, in_seq=True)}" for item in value)
    return pad + scalar(value) + "\n"


def _tail(item: Any, indent: int, in_seq: bool = False) -> str:
    if isinstance(item, dict | list) and item:
        if in_seq:
            return "\n" + dump(item, indent + 2)
        return "\n" + dump(item, indent + (0 if isinstance(item, list) else 2))  # kubectl style for lists
    return " " + dump(item, 0)


def scalar(value: Any, as_key: bool = False) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    if value and value == value.strip() and "#" not in value and _reads_back_plain(value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _reads_back_plain(value: str) -> bool:
    try:
        return loads(f"k: {value}") == {"k": value}
    except YamlError:
        return False


@settings(max_examples=150, deadline=None)
@given(documents)
def test_round_trip_of_json_able_data(doc: Any) -> None:
    text = dump(doc)
    assert _same(loads(text), doc), text


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(keys, documents, max_size=4))
def test_json_documents_load_as_json(doc: dict[str, Any]) -> None:
    assert _same(loads(json.dumps(doc)), doc)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_kubectl_styles() -> None:
    text = """# comment
apiVersion: v1
clusters:
- cluster:
    server: https://h:6443   # trailing
  name: 'it''s'
users:
  - name: u
    user:
      exec:
        args: ["a", b, {c: 1}]
        env: ~
empty:
quoted: "a\\tb\\u00e9"
"""
    assert loads(text) == {
        "apiVersion": "v1",
        "clusters": [{"cluster": {"server": "https://h:6443"}, "name": "it's"}],
        "users": [{"name": "u", "user": {"exec": {"args": ["a", "b", {"c": 1}], "env": None}}}],
        "empty": None,
        "quoted": "a\tbé",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: |\n  x\n", "line 1: block scalars"),
        ("a: 1\nb: *ref\n", "line 2: anchors"),
        ("a: !!str 1\n", "line 1: anchors, aliases and tags"),
        ("a: b\n  c: d\n", "line 2: unexpected indentation"),
        ("a: 1\na: 2\n", "line 2: duplicate key"),
        ("a: [1,\n  2]\n", "line 1: unterminated flow"),
        ("a: 1\n---\nb: 2\n", "line 2: several documents"),
        ("a: 'open\n", "line 1: unterminated quoted"),
        ("\ta: 1\n", "line 1: tab"),
        ("a:\n  - 1\n  b: 2\n", "line 3"),
    ],
)
def test_unsupported_or_broken_input_names_the_line(text: str, message: str) -> None:
    with pytest.raises(YamlError, match=message):
        loads(text)
