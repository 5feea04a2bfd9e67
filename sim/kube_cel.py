"""A small CEL evaluator: the subset `x-kubernetes-validations` rules of this project's CRDs use, and a
little more (enough for typical structural rules), with CEL's semantics where they differ from Python's.

Supported: literals (int, double, 'string' / "string", true, false, null, [lists]), `self` / `oldSelf`
and field selection, indexing, `! - * / % + - < <= > >= == != in && || ?:`, the macro `has(a.b)`,
`size(x)` / `x.size()`, `x.startsWith(s)`, `x.endsWith(s)`, `x.contains(s)`, `x.matches(re)`,
`int(x)`, `string(x)`, the macros `l.exists(v, p)` and `l.all(v, p)` over lists (map keys for maps; used by
admission webhooks' matchConditions, sim.kube_webhooks). Anything else is a CelError naming what is not supported.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class CelError(Exception):
    """A rule that does not parse, or an evaluation error (no such key, no such overload)."""


_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+\.\d+|\d+)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:.,()\[\]])
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
)""", re.VERBOSE)


@dataclass(frozen=True)
class Tok:
    kind: str  # num | str | op | id | end
    text: str


def tokenize(text: str) -> list[Tok]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None:
            raise CelError(f"Syntax error: unexpected character {text[pos:].strip()[0]!r} in {text!r}")
        kind = match.lastgroup or ""
        out.append(Tok(kind, match.group(kind)))
        pos = match.end()
    return [*out, Tok("end", "")]


Node = tuple[Any, ...]  # ("lit", v) ("id", name) ("sel", obj, field) ("has", sel) ("idx", obj, key)
#                         ("call", name, target | None, args) ("un", op, x) ("bin", op, a, b) ("cond", c, a, b)
#                         ("list", items)

_MACROS = ("exists", "all")
_BINARY = [("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%")]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.toks, self.i = text, tokenize(text), 0

    def peek(self) -> Tok:
        return self.toks[self.i]

    def take(self, text: str | None = None) -> Tok:
        tok = self.toks[self.i]
        if text is not None and tok.text != text:
            raise CelError(f"Syntax error: expected {text!r}, found {tok.text or 'the end'!r} in {self.text!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.expr()
        if self.peek().kind != "end":
            raise CelError(f"Syntax error: unexpected {self.peek().text!r} in {self.text!r}")
        return node

    def expr(self) -> Node:
        cond = self.binary(0)
        if self.peek().text == "?":
            self.take("?")
            then = self.expr()
            self.take(":")
            return ("cond", cond, then, self.expr())
        return cond

    def binary(self, level: int) -> Node:
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek().text in _BINARY[level] and self.peek().kind in ("op", "id"):
            op = self.take().text
            left = ("bin", op, left, self.binary(level + 1))
        return left

    def unary(self) -> Node:
        if self.peek().text in ("!", "-") and self.peek().kind == "op":
            op = self.take().text
            return ("un", op, self.unary())
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while self.peek().text in (".", "["):
            if self.take().text == "[":
                key = self.expr()
                self.take("]")
                node = ("idx", node, key)
                continue
            name = self.take().text
            if self.peek().text != "(":
                node = ("sel", node, name)
                continue
            args = self.args()
            node = self._macro(name, node, args) if name in _MACROS else ("call", name, node, args)
        return node

    def _macro(self, name: str, target: Node, args: list[Node]) -> Node:
        if len(args) != 2 or args[0][0] != "id":
            raise CelError(f"{name}() takes a variable name and a predicate, in {self.text!r}")
        return ("macro", name, target, args[0][1], args[1])

    def args(self) -> list[Node]:
        self.take("(")
        out: list[Node] = []
        while self.peek().text != ")":
            out.append(self.expr())
            if self.peek().text != ")":
                self.take(",")
        self.take(")")
        return out

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == "num":
            return ("lit", float(tok.text) if "." in tok.text else int(tok.text))
        if tok.kind == "str":
            return ("lit", bytes(tok.text[1:-1], "utf-8").decode("unicode_escape"))
        if tok.text == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if tok.text == "[":
            items: list[Node] = []
            while self.peek().text != "]":
                items.append(self.expr())
                if self.peek().text != "]":
                    self.take(",")
            self.take("]")
            return ("list", items)
        if tok.kind == "id":
            if tok.text in ("true", "false", "null"):
                return ("lit", {"true": True, "false": False, "null": None}[tok.text])
            if self.peek().text == "(":
                args = self.args()
                if tok.text == "has":
                    if len(args) != 1 or args[0][0] != "sel":
                        raise CelError(f"invalid argument to has() macro in {self.text!r}")
                    return ("has", args[0])
                return ("call", tok.text, None, args)
            return ("id", tok.text)
        raise CelError(f"Syntax error: unexpected {tok.text or 'end of rule'!r} in {self.text!r}")


def compile_rule(text: str) -> Node:
    return _Parser(text).parse()


def uses_old_self(node: Node) -> bool:
    if node[0] == "id":
        return bool(node[1] == "oldSelf")
    return any(uses_old_self(part) for part in _children(node))


def _children(node: Node) -> list[Node]:
    out: list[Node] = []
    for part in node[1:]:
        if isinstance(part, tuple):
            out.append(part)
        elif isinstance(part, list):
            out += [p for p in part if isinstance(p, tuple)]
    return out


def evaluate(node: Node, scope: dict[str, Any]) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "id":
        if node[1] not in scope:
            raise CelError(f"undeclared reference to '{node[1]}'")
        return scope[node[1]]
    if kind == "list":
        return [evaluate(item, scope) for item in node[1]]
    if kind == "sel":
        target = evaluate(node[1], scope)
        if not isinstance(target, dict):
            raise CelError(f"no such key: {node[2]}")
        if node[2] not in target:
            raise CelError(f"no such key: {node[2]}")
        return target[node[2]]
    if kind == "has":
        target = evaluate(node[1][1], scope)
        return isinstance(target, dict) and node[1][2] in target
    if kind == "idx":
        return _index(evaluate(node[1], scope), evaluate(node[2], scope))
    if kind == "un":
        value = evaluate(node[2], scope)
        if node[1] == "!":
            return not _bool(value, "!")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CelError("no such overload: -_")
        return -value
    if kind == "cond":
        return evaluate(node[2] if _bool(evaluate(node[1], scope), "?:") else node[3], scope)
    if kind == "bin":
        return _binary(node[1], node[2], node[3], scope)
    if kind == "macro":
        return _macro(node, scope)
    if kind == "call":
        return _call(node[1], None if node[2] is None else evaluate(node[2], scope),
                     [evaluate(a, scope) for a in node[3]])
    raise CelError(f"unsupported expression {kind}")


def _macro(node: Node, scope: dict[str, Any]) -> bool:
    """``exists``/``all`` with CEL's error absorption: a decisive element wins over an element that errs."""
    _, name, target_node, var, body = node
    target = evaluate(target_node, scope)
    if not isinstance(target, (list, dict)):
        raise CelError(f"no such overload: {name}")
    decisive = name == "exists"
    error: CelError | None = None
    for item in target:
        try:
            if _bool(evaluate(body, {**scope, var: item}), name) == decisive:
                return decisive
        except CelError as err:
            error = error or err
    if error is not None:
        raise error
    return not decisive


def _bool(value: Any, op: str) -> bool:
    if not isinstance(value, bool):
        raise CelError(f"no such overload: {op}")
    return value


def _logical(op: str, left: Node, right: Node, scope: dict[str, Any]) -> bool:
    """CEL's commutative && and ||: an error on one side is absorbed when the other side decides."""
    decisive = op == "||"
    try:
        first = _bool(evaluate(left, scope), op)
    except CelError as err:
        if _bool(evaluate(right, scope), op) == decisive:
            return decisive
        raise err from None
    if first == decisive:
        return decisive
    return _bool(evaluate(right, scope), op)


def _binary(op: str, left_node: Node, right_node: Node, scope: dict[str, Any]) -> Any:
    if op in ("&&", "||"):
        return _logical(op, left_node, right_node, scope)
    a, b = evaluate(left_node, scope), evaluate(right_node, scope)
    if op == "==":
        return _equal(a, b)
    if op == "!=":
        return not _equal(a, b)
    if op == "in":
        if isinstance(b, list):
            return any(_equal(a, item) for item in b)
        if isinstance(b, dict):
            return a in b
        raise CelError("no such overload: _in_")
    _same_kind(a, b, op)
    operations: dict[str, Callable[[Any, Any], Any]] = {
        "<": lambda x, y: x < y, "<=": lambda x, y: x <= y, ">": lambda x, y: x > y, ">=": lambda x, y: x >= y,
        "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
        "/": _divide, "%": _modulo}
    return operations[op](a, b)


def _divide(a: Any, b: Any) -> Any:
    if b == 0:
        raise CelError("division by zero")
    return int(a / b) if isinstance(a, int) else a / b


def _modulo(a: Any, b: Any) -> Any:
    if b == 0:
        raise CelError("modulus by zero")
    return a - b * int(a / b)


def _same_kind(a: Any, b: Any, op: str) -> None:
    def kind(v: Any) -> str:
        if isinstance(v, bool):
            return "bool"
        if isinstance(v, (int, float)):
            return "number"
        return type(v).__name__
    if kind(a) != kind(b) or kind(a) in ("bool", "dict", "NoneType") or (kind(a) == "list" and op not in ("+",)):
        raise CelError(f"no such overload: _{op}_")


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


def _index(target: Any, key: Any) -> Any:
    if isinstance(target, list) and isinstance(key, int) and not isinstance(key, bool):
        if not 0 <= key < len(target):
            raise CelError(f"index out of bounds: {key}")
        return target[key]
    if isinstance(target, dict) and key in target:
        return target[key]
    raise CelError(f"no such key: {key}")


def _call(name: str, target: Any, args: list[Any]) -> Any:
    if target is not None:
        args = [target, *args]
    if name == "size" and len(args) == 1 and isinstance(args[0], (str, list, dict)):
        return len(args[0])
    if name in ("startsWith", "endsWith", "contains", "matches") and len(args) == 2 \
            and all(isinstance(a, str) for a in args):
        text, other = args
        return {"startsWith": text.startswith, "endsWith": text.endswith, "contains": lambda s: s in text,
                "matches": lambda s: re.search(s, text) is not None}[name](other)
    if name == "int" and len(args) == 1 and isinstance(args[0], (int, float, str)) and not isinstance(args[0], bool):
        try:
            return int(args[0])
        except ValueError:
            raise CelError(f"cannot convert {args[0]!r} to int") from None
    if name == "string" and len(args) == 1:
        return args[0] if isinstance(args[0], str) else str(args[0]).lower() if isinstance(args[0], bool) \
            else str(args[0])
    raise CelError(f"found no matching overload for '{name}'")
