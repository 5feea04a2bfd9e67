"""Label and field selectors with the parser messages of k8s.io/apimachinery (labels/selector.go)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sim.kube_errors import ApiError, bad_request

_SPECIAL = "!(),=<>"
_OPERATORS = ("!=", "==", "=", "in", "notin", ">", "<")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present:
            return False
        try:
            number, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.op == ">" else number < bound


LabelSelector = tuple[Requirement, ...]


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in _SPECIAL:
            two = text[i:i + 2]
            if two in ("!=", "=="):
                out.append(two)
                i += 2
            else:
                out.append(ch)
                i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL:
                j += 1
            out.append(text[i:j])
            i = j
    return out


def _is_ident(tok: str) -> bool:
    return bool(tok) and tok not in _SPECIAL and tok not in ("!=", "==")


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.pos = 0

    def peek(self) -> str:
        return self.toks[self.pos] if self.pos < len(self.toks) else ""

    def take(self) -> str:
        tok = self.peek()
        self.pos += 1
        return tok

    def parse(self) -> LabelSelector:
        reqs: list[Requirement] = []
        while True:
            tok = self.peek()
            if tok == "":
                return tuple(reqs)
            if not (tok == "!" or (_is_ident(tok) and tok not in ("in", "notin"))):
                raise ValueError(f"found '{tok}', expected: !, identifier, or 'end of string'")
            try:
                reqs.append(self.requirement())
            except _ReqError as exc:
                raise ValueError(f"unable to parse requirement: {exc}") from None
            nxt = self.take()
            if nxt == "":
                return tuple(reqs)
            if nxt != ",":
                raise ValueError(f"found '{nxt}', expected: ',' or 'end of string'")
            if self.peek() == "":
                raise ValueError("found '', expected: identifier after ','")

    def requirement(self) -> Requirement:
        negated = self.peek() == "!"
        if negated:
            self.take()
        key = self.take()
        if not _is_ident(key):
            raise _ReqError(f"found '{key}', expected: identifier")
        if negated:
            return Requirement(key, "!")
        if self.peek() in ("", ","):
            return Requirement(key, "exists")
        op = self.take()
        if op not in _OPERATORS:
            raise _ReqError(f"found '{op}', expected: {', '.join(_OPERATORS)}")
        op = "=" if op == "==" else op
        if op in ("in", "notin"):
            return Requirement(key, op, self.value_set())
        value = self.peek()
        if value in ("", ","):
            return Requirement(key, op, ("",))
        if not _is_ident(value):
            raise _ReqError(f"found '{value}', expected: identifier")
        self.take()
        return Requirement(key, op, (value,))

    def value_set(self) -> tuple[str, ...]:
        tok = self.take()
        if tok != "(":
            raise _ReqError(f"found '{tok}', expected: '('")
        values: list[str] = []
        while True:
            tok = self.take()
            if tok == ")":
                return tuple(values)
            if _is_ident(tok):
                values.append(tok)
                tok = self.take()
                if tok == ")":
                    return tuple(values)
                if tok != ",":
                    raise _ReqError(f"found '{tok}', expected: ',' or ')'")
            elif tok == ",":
                values.append("")
            else:
                raise _ReqError(f"found '{tok}', expected: ',' or ')'")


class _ReqError(Exception):
    pass


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a labelSelector query value; ApiError 400 with the upstream message when malformed."""
    try:
        return _Parser(text).parse()
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def labels_match(selector: LabelSelector, labels: Mapping[str, str] | None) -> bool:
    return all(req.matches(labels or {}) for req in selector)


def match_label_selector_object(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A metav1.LabelSelector (matchLabels / matchExpressions); an empty selector matches everything."""
    labels = labels or {}
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}[expr["operator"]]
        if not Requirement(expr["key"], op, tuple(expr.get("values") or ())).matches(labels):
            return False
    return True


# --- field selectors ---------------------------------------------------------------------------------

FieldGetter = Callable[[dict[str, Any]], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: dict[str, Any]) -> str:
        cur: Any = obj
        for key in keys:
            cur = cur.get(key) if isinstance(cur, dict) else None
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return "" if cur is None else str(cur)
    return get


COMMON_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"), "metadata.namespace": _path("metadata", "namespace"),
}
POD_FIELDS: dict[str, FieldGetter] = {
    **COMMON_FIELDS, "spec.nodeName": _path("spec", "nodeName"),
    "spec.restartPolicy": _path("spec", "restartPolicy"), "spec.schedulerName": _path("spec", "schedulerName"),
    "spec.serviceAccountName": _path("spec", "serviceAccountName"), "status.phase": _path("status", "phase"),
    "status.podIP": _path("status", "podIP"), "status.nominatedNodeName": _path("status", "nominatedNodeName"),
}
NODE_FIELDS: dict[str, FieldGetter] = {**COMMON_FIELDS, "spec.unschedulable": _path("spec", "unschedulable")}
EVENT_FIELDS: dict[str, FieldGetter] = {
    **COMMON_FIELDS, "reason": _path("reason"), "type": _path("type"), "source": _path("source", "component"),
    "reportingComponent": _path("reportingComponent"),
    **{f"involvedObject.{k}": _path("involvedObject", k)
       for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
}
# resource.k8s.io/v1 ResourceSlice's field-label conversion (pkg/apis/resource/v1/conversion.go): spec.nodeName and
# spec.driver; anything else is "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: <field>".
RESOURCE_SLICE_FIELDS: dict[str, FieldGetter] = {
    **COMMON_FIELDS, "spec.nodeName": _path("spec", "nodeName"), "spec.driver": _path("spec", "driver"),
}
# Resources with their own field-label conversion answer "field label not supported"; the rest use the
# generic "is not a known field selector" message.
CUSTOM_FIELD_RESOURCES = {"pods": POD_FIELDS, "nodes": NODE_FIELDS, "events": EVENT_FIELDS,
                          "resourceslices": RESOURCE_SLICE_FIELDS}


@dataclass(frozen=True)
class FieldTerm:
    field: str
    op: str  # "=" or "!="
    value: str


def parse_field_selector(text: str, resource: str, group_version_kind: str = "") -> tuple[FieldTerm, ...]:
    """``group_version_kind`` (e.g. "resource.k8s.io/v1, Kind=ResourceSlice") is named in the refusal of an
    unsupported field where the real server names it (resource.k8s.io's conversion functions)."""
    supported = CUSTOM_FIELD_RESOURCES.get(resource, COMMON_FIELDS)
    terms: list[FieldTerm] = []
    for part in (p for p in text.split(",") if p.strip() != ""):
        term = _field_term(part)
        if term is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        if term.field not in supported:
            raise _unsupported_field(term.field, resource, group_version_kind)
        terms.append(term)
    return tuple(terms)


def _field_term(part: str) -> FieldTerm | None:
    for op in ("!=", "==", "="):
        if op in part:
            field, value = part.split(op, 1)
            return FieldTerm(field.strip(), "!=" if op == "!=" else "=", value.strip())
    return None


def _unsupported_field(field: str, resource: str, group_version_kind: str = "") -> ApiError:
    if resource == "resourceslices" and group_version_kind:
        return bad_request(f"field label not supported for {group_version_kind}: {field}")
    if resource in CUSTOM_FIELD_RESOURCES:
        return bad_request(f"field label not supported: {field}")
    return bad_request(f'"{field}" is not a known field selector: only "metadata.name", "metadata.namespace"')


def fields_match(terms: tuple[FieldTerm, ...], obj: dict[str, Any], resource: str) -> bool:
    getters = CUSTOM_FIELD_RESOURCES.get(resource, COMMON_FIELDS)
    for term in terms:
        actual = getters[term.field](obj)
        if (actual == term.value) != (term.op == "="):
            return False
    return True
