"""gpuremediate.kube.miniyaml: kubeconfigs, manifests and apply bodies, and clear errors for everything else."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.kube import miniyaml
from gpuremediate.kube.miniyaml import YamlError, load, load_all, loads

# -- a small block-style dumper, used to round-trip generated data ----------------------------
# plain: strings go out unquoted whenever the loader itself reads them back unchanged (else JSON-quoted);
# kubectl_lists: a sequence under a key sits at the key's indentation; compact_items: "- key: v" / "- - x".

_SAFE_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_KEYWORDS = {"null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE", "~"}
_LITERAL_LINE = re.compile(r"(\S(.*\S)?)?")


def _reads_back_plain(text: str) -> bool:
    if not text or text != text.strip() or "#" in text:
        return False
    try:
        return loads(f"k: {text}") == {"k": text} and loads(f"{text}: 1") == {text: 1} and loads(text) == text
    except YamlError:
        return False


def _string(text: str, plain: bool) -> str:
    if plain and _reads_back_plain(text):
        return text
    if not plain and _SAFE_PLAIN.fullmatch(text) and text not in _KEYWORDS:
        return text
    return json.dumps(text, ensure_ascii=not plain)


def _scalar(value: Any, plain: bool) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ".inf" if value == math.inf else "-.inf" if value == -math.inf else repr(value)
    return _string(value, plain)


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


class _Dumper:
    def __init__(self, *, plain: bool, kubectl_lists: bool, compact_items: bool) -> None:
        self.plain = plain
        self.kubectl_lists = kubectl_lists
        self.compact_items = compact_items

    def block(self, value: Any, indent: int) -> list[str]:
        pad = " " * indent
        out: list[str] = []
        if isinstance(value, dict) and value:
            for key, item in value.items():
                out.extend(self.entry(pad + _string(key, self.plain) + ":", item, indent, in_mapping=True))
            return out
        if isinstance(value, list) and value:
            for item in value:
                out.extend(self.entry(pad + "-", item, indent, in_mapping=False))
            return out
        return [pad + self.inline(value)]

    def inline(self, value: Any) -> str:
        if isinstance(value, dict):
            return "{}"
        if isinstance(value, list):
            return "[]"
        return _scalar(value, self.plain)

    def entry(self, prefix: str, item: Any, indent: int, *, in_mapping: bool) -> list[str]:
        if isinstance(item, dict | list) and item:
            if self.kubectl_lists and in_mapping and isinstance(item, list):
                return [prefix, *self.block(item, indent)]
            nested = self.block(item, indent + 2)
            if self.compact_items and not in_mapping:
                return [prefix + " " + nested[0][indent + 2 :], *nested[1:]]
            return [prefix, *nested]
        if isinstance(item, str) and _literal_ok(item):
            first, *rest = _literal(item, indent)
            return [prefix + " " + first, *rest]
        return [prefix + " " + self.inline(item)]


def dump(value: Any, *, plain: bool = False, kubectl_lists: bool = False, compact_items: bool = False) -> str:
    dumper = _Dumper(plain=plain, kubectl_lists=kubectl_lists, compact_items=compact_items)
    return "\n".join(dumper.block(value, 0)) + "\n"


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 is not 1.0 is not True)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


_text = st.text(st.characters(codec="utf-8"), max_size=20)
_plain_like = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_./-]{0,12}", fullmatch=True)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False),
    _text,
    _plain_like,
    st.sampled_from(["true", "null", "12", "1.5", "0x1f", "a: b", "- x", "# no", "multi\nline\n", "k\n\nv"]),
)
_keys = st.one_of(_plain_like, _text)


def _nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
        max_leaves=20,
    )


_json_like = _nested(_scalars)
_strict_json = _nested(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False,
                                                                                    allow_infinity=False), _text))


@settings(max_examples=200, deadline=None)
@given(_json_like, st.booleans(), st.booleans(), st.booleans())
def test_dumped_block_yaml_loads_back_to_the_same_data(
    value: Any, plain: bool, kubectl_lists: bool, compact_items: bool
) -> None:
    text = dump(value, plain=plain, kubectl_lists=kubectl_lists, compact_items=compact_items)
    assert _same(loads(text), value), text


@settings(max_examples=50, deadline=None)
@given(st.lists(_json_like, min_size=1, max_size=3))
def test_multi_document_streams_load_every_document(values: list[Any]) -> None:
    stream = "".join("---\n" + dump(v) for v in values)
    assert load_all(stream) == values


@settings(max_examples=50, deadline=None)
@given(st.one_of(st.dictionaries(_keys, _strict_json, max_size=4), st.lists(_strict_json, max_size=4)), st.booleans())
def test_json_documents_load_as_json(value: Any, indented: bool) -> None:
    text = json.dumps(value, indent=2 if indented else None, allow_nan=False)
    assert _same(loads(text), value)
    assert load_all(text) == [value]


def test_python_json_extensions_are_yaml_strings() -> None:
    # NaN / Infinity are not JSON: such a text is read as YAML, where they are plain strings
    assert loads('{"a": NaN, "b": [Infinity, -Infinity]}') == {"a": "NaN", "b": ["Infinity", "-Infinity"]}


# -- the subset, by example ---------------------------------------------------------------------


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


def test_byte_order_mark_crlf_and_a_leading_marker() -> None:
    expected = {"apiVersion": "v1", "users": [{"name": "u"}]}
    assert loads("\ufeff---\r\napiVersion: v1\r\nusers:\r\n- name: u\r\n") == expected
    assert loads('\ufeff{"apiVersion": "v1"}') == {"apiVersion": "v1"}


def test_core_schema_typing_of_plain_scalars() -> None:
    doc = loads(
        "a: 1\nb: -2.5\nc: 1e3\nd: true\ne: False\nf: ~\ng: null\nh: 0o17\ni: 0x1F\n"
        "j: .inf\nk: yes\nl: 1.2.3\nm: '1'\nn: \"true\"\no:\np: True\nq: NULL\nr: -.Inf\ns: 1_000\nu: 007\n"
    )
    assert doc == {
        "a": 1, "b": -2.5, "c": 1000.0, "d": True, "e": False, "f": None, "g": None, "h": 15,
        "i": 31, "j": math.inf, "k": "yes", "l": "1.2.3", "m": "1", "n": "true", "o": None,
        "p": True, "q": None, "r": -math.inf, "s": "1_000", "u": "007",  # a leading zero stays text (see below)
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
    assert loads(text) == {
        "rules": [{"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["get"]}, [1, 2]],
        "empty": {},
        "flow": {"a": [1, {"b": "c"}], "d e": "f"},
    }


def test_block_scalars_with_chomping_and_folding() -> None:
    text = (
        "a: |\n  x\n   y\n\nb: |-\n  x\nc: |+\n  x\n\n\n"
        "d: >\n  one\n  two\n\n  three\n    kept\n  four\ne: |2\n    indented\n"
    )
    assert loads(text) == {
        "a": "x\n y\n",
        "b": "x",
        "c": "x\n\n\n",
        "d": "one two\nthree\n  kept\nfour\n",
        "e": "  indented\n",
    }


def test_comments_quotes_and_hashes_inside_values() -> None:
    text = (
        "# head\na: x#y  # comment\nb: 'it''s # not a comment'\nc: \"tab\\there \\u00e9\"\nurl: http://h:80/p\n"
        "f: ['it''s # in a flow', \"q # \\\" too\"]  # comment\n"
    )
    assert loads(text) == {
        "a": "x#y", "b": "it's # not a comment", "c": "tab\there é", "url": "http://h:80/p",
        "f": ["it's # in a flow", 'q # " too'],
    }


def test_documents_split_on_markers_and_skip_empty_leading_text() -> None:
    assert load_all("# only a comment\n---\na: 1\n---\n---\n- b\n...\n") == [{"a": 1}, None, ["b"]]
    assert load_all("a: 1\n...\nb: 2\n") == [{"a": 1}, {"b": 2}]
    assert loads("") is None
    assert load_all("") == []
    assert loads("# nothing\n---\n") is None


def test_multi_line_plain_and_quoted_scalars_fold_as_yaml_does() -> None:
    text = "a: this is\n  continued\n\n  para\nb: 'x\n  y'\nc: \"p\\\n  q  r\n\n  s\"\nd:\n- long\n  item\n- x\n"
    assert loads(text) == {"a": "this is continued\npara", "b": "x y", "c": "pq  r\ns", "d": ["long item", "x"]}


def test_multi_line_flow_collection() -> None:
    assert loads("a: [1,\n  2, # two\n  3]\nb: 4\n") == {"a": [1, 2, 3], "b": 4}
    assert loads("{\n  \"a\": [1,\n    2],\n  b: c\n}\n") == {"a": [1, 2], "b": "c"}


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a: 1\na: 2\n", 2, "duplicate key"),
        ("a: {b: 1, b: 2}\n", 1, "duplicate key"),
        ('{"a": 1,\n "a": 2}\n', 1, "duplicate key"),
        ("a: &x 1\n", 1, "anchors"),
        ("a: *x\n", 1, "anchors"),
        ("a: 1\nb: *ref\n", 2, "anchors"),
        ("a: !!str 1\n", 1, "anchors, aliases and tags"),
        ("\ta: 1\n", 1, "tab"),
        ("a:\n\tb: 1\n", 2, "tab"),
        ("a: 1\n   b: 2\n", 2, "mapping values"),
        ("a: b\n  c: d\n", 2, "unexpected indentation"),
        ("a: [1]\n  b: 2\n", 2, "indentation"),
        ("a: b: c\n", 1, "mapping values"),
        ('a: "open\n', 1, "unterminated"),
        ("a: 'open\n", 1, "unterminated quoted"),
        ("a: [1, 2\n", 1, "unterminated flow"),
        ("a: [b: 1]\n", 1, "single-pair mappings"),
        ("? complex\n", 1, "complex"),
        ("%YAML 1.2\n---\na: 1\n", 1, "directives"),
        ("--- a: 1\n", 1, "document marker"),
        ("a:\n  - 1\n  b: 2\n", 3, "expected"),
        ("x:\n  y: 1\n - z\n", 3, "unexpected"),
        ("a: |x\n  t\n", 1, "block scalar header"),
        ("a: \"bad \\q\"\n", 1, "escape"),
        ("a: @x\n", 1, "cannot start with '@'"),
        ("a: 1\n---\nb: 2\n", 2, "several documents"),
        ("a: 1\n...\n\nb: 2\n", 4, "several documents"),
    ],
)
def test_unsupported_or_malformed_input_names_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(YamlError) as caught:
        loads(text)
    assert caught.value.line == line
    assert words in str(caught.value)
    assert str(caught.value).startswith(f"line {line}:")


def test_loads_refuses_a_stream_of_several_documents_that_load_all_reads() -> None:
    with pytest.raises(YamlError, match="expected one, found 3"):
        loads("a: 1\n---\nb: 2\n---\n")
    assert load_all("a: 1\n---\nb: 2\n---\n") == [{"a": 1}, {"b": 2}, None]
    assert load is loads


def test_digits_with_a_leading_zero_stay_text() -> None:
    doc = loads("token: 0123\nport: 8080\nzero: 0\nneg: -012\n")
    assert doc == {"token": "0123", "port": 8080, "zero": 0, "neg": "-012"}


# -- dump: the emitter behind `status -o yaml` / `explain -o yaml` -----------------------------

_JSON_SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**63)
                 | st.floats(allow_nan=False, allow_infinity=True) | st.text(max_size=12))
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


def _pyyaml() -> Any:
    """PyYAML where it happens to be installed (never a dependency): a second, independent reader."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        return None
    return yaml


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_dump_reads_back_as_the_same_value(value: Any) -> None:
    text = miniyaml.dump(value)
    assert loads(text) == value, text
    yaml = _pyyaml()
    if yaml is not None:
        assert yaml.safe_load(text) == value, text


def test_dump_writes_plain_words_and_quotes_what_could_read_as_something_else() -> None:
    doc = {"node": "gpu-node-1", "state": "quarantined", "yes": "no", "on": "null", "n": "1e3",
           "code": "079", "blocked": "pdb: work/llm", "gpus": 8, "since": 1e16, "nested": [{"a": []}, ["x"]],
           "text": "two\nlines \u2028 \x85 \"q\" \\", "empty": {}}
    text = miniyaml.dump(doc)
    assert "node: gpu-node-1\n" in text and "state: quarantined\n" in text and "gpus: 8\n" in text
    assert '"yes": "no"\n' in text and '"on": "null"\n' in text and '"n": "1e3"\n' in text and 'code: "079"\n' in text
    assert 'blocked: "pdb: work/llm"\n' in text and "since: 1.0e+16\n" in text
    assert "nested:\n  - a: []\n  - - x\n" in text and "empty: {}\n" in text
    assert loads(text) == doc
    assert miniyaml.dump([]) == "[]\n" and miniyaml.dump("x") == "x\n" and loads(miniyaml.dump(None)) is None
    with pytest.raises(TypeError, match="mapping key must be a string"):
        miniyaml.dump({1: "a"})
