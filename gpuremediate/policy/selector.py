"""Kubernetes label selectors (the string form of ``kubectl -l``), parsed and matched without I/O.

Grammar, as apimachinery's ``labels.Parse``: comma-separated requirements, each one of
``key``, ``!key``, ``key=value``, ``key==value``, ``key!=value``, ``key in (v1,v2)``,
``key notin (v1,v2)``. An empty selector matches every node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuremediate.vocab.schema import excerpt

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY_RE = re.compile(rf"({_PREFIX}/)?{_NAME}")
_VALUE_RE = re.compile(rf"({_NAME})?")
_SET_RE = re.compile(r"^(?P<key>[^\s!=(),<>]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQ_RE = re.compile(r"^(?P<key>[^\s!=(),<>]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),<>]*)$")
_EXISTS_RE = re.compile(r"^(?P<neg>!?)\s*(?P<key>[^\s!=(),<>]+)$")

OP_EXISTS = "exists"
OP_NOT_EXISTS = "!"
OP_IN = "in"
OP_NOT_IN = "notin"


class SelectorError(ValueError):
    """A label selector that Kubernetes would reject; the message says which part and why."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # OP_EXISTS, OP_NOT_EXISTS, OP_IN, OP_NOT_IN ("=" is in with one value, "!=" notin)
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == OP_EXISTS:
            return self.key in labels
        if self.op == OP_NOT_EXISTS:
            return self.key not in labels
        if self.op == OP_IN:
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@dataclass(frozen=True)
class Selector:
    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(req.matches(labels) for req in self.requirements)


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside parentheses."""
    parts: list[str] = []
    depth, start = 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' at position {index}")
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth != 0:
        raise SelectorError("unbalanced '(': missing ')'")
    parts.append(text[start:])
    return [part.strip() for part in parts]


def check_label_key(key: str) -> str:
    name = key.rsplit("/", 1)[-1]
    if not _KEY_RE.fullmatch(key) or len(name) > 63 or len(key) - len(name) > 254:
        raise SelectorError(f"invalid label key {excerpt(key, repr)}")
    return key


def _check_value(value: str) -> str:
    if len(value) > 63 or not _VALUE_RE.fullmatch(value):
        raise SelectorError(f"invalid label value {excerpt(value, repr)}")
    return value


def _parse_requirement(part: str) -> Requirement:
    if match := _SET_RE.match(part):
        values = [value.strip() for value in match["values"].split(",")]
        if values == [""]:
            raise SelectorError(f"{excerpt(part, repr)}: a set needs at least one value")
        op = OP_IN if match["op"] == "in" else OP_NOT_IN
        return Requirement(check_label_key(match["key"]), op, frozenset(_check_value(v) for v in values))
    if match := _EQ_RE.match(part):
        op = OP_NOT_IN if match["op"] == "!=" else OP_IN
        return Requirement(check_label_key(match["key"]), op, frozenset({_check_value(match["value"])}))
    if match := _EXISTS_RE.match(part):
        op = OP_NOT_EXISTS if match["neg"] else OP_EXISTS
        return Requirement(check_label_key(match["key"]), op)
    raise SelectorError(f"cannot parse requirement {excerpt(part, repr)}")


def parse_selector(text: str) -> Selector:
    """Parse a label selector; raises SelectorError naming the bad requirement."""
    if not text.strip():
        return Selector(text=text, requirements=())
    parts = _split_top_level(text)
    if "" in parts:
        raise SelectorError("empty requirement (stray comma)")
    return Selector(text=text, requirements=tuple(_parse_requirement(part) for part in parts))
