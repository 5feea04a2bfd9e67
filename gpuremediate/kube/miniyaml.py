"""A small, strict YAML-subset loader, enough for kubeconfig files written by kubectl, kind and cloud CLIs.

Supported: block mappings and sequences (including the `key:\\n- item` style with the dash at the key's
indentation), plain / single-quoted / double-quoted scalars, single-line flow collections (`[]`, `{}`,
`[a, b]`, `{k: v}`), comments, a leading `---`, and plain JSON documents. Anything else (anchors, aliases,
tags, block scalars `|` `>`, multi-line scalars, several documents) raises YamlError naming the line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


class YamlError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass
class _Line:
    number: int
    indent: int
    text: str  # without indentation and trailing comment


_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_OCT_HEX = re.compile(r"0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DQ_ESCAPES = {
    "0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r",
    "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0",
    "L": "\u2028", "P": "\u2029",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def loads(text: str) -> Any:
    """Parse one YAML (subset) or JSON document."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("{") and _is_json(stripped):
        return json.loads(stripped)
    lines = _logical_lines(text)
    if not lines:
        return None
    parser = _Parser(lines)
    value = parser.block(lines[0].indent)
    if parser.pos < len(lines):
        extra = lines[parser.pos]
        raise YamlError(extra.number, f"unexpected content {extra.text!r} (bad indentation?)")
    return value


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _logical_lines(text: str) -> list[_Line]:
    out: list[_Line] = []
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        if number == 1:
            raw = raw.lstrip("\ufeff")
        body = raw.rstrip()
        content = body.lstrip(" ")
        indent = len(body) - len(content)
        if content.startswith("\t"):
            raise YamlError(number, "tab used for indentation")
        content = _strip_comment(content, number).rstrip()
        if not content:
            continue
        if content in ("---", "...") or content.startswith("--- "):
            if content == "---" and not out:
                continue
            raise YamlError(number, "several documents (or document markers) are not supported")
        if content.startswith("%"):
            raise YamlError(number, "directives are not supported")
        out.append(_Line(number, indent, content))
    return out


def _strip_comment(content: str, number: int) -> str:
    quote = ""
    i = 0
    while i < len(content):
        ch = content[i]
        if quote:
            if quote == '"' and ch == "\\":
                i += 2
                continue
            if ch == quote:
                if quote == "'" and content[i + 1 : i + 2] == "'":
                    i += 2
                    continue
                quote = ""
        elif ch in "\"'" and (i == 0 or content[i - 1] in " \t[{,:-?"):
            quote = ch
        elif ch == "#" and (i == 0 or content[i - 1] in " \t"):
            return content[:i]
        i += 1
    return content


class _Parser:
    def __init__(self, lines: list[_Line]) -> None:
        self.lines = lines
        self.pos = 0

    def block(self, indent: int) -> Any:
        line = self.lines[self.pos]
        if _is_seq_item(line.text):
            return self.sequence(indent)
        if _split_key(line.text, line.number) is not None:
            return self.mapping(indent)
        self.pos += 1
        value = scalar_or_flow(line.text, line.number)
        self._no_deeper(indent, "after a scalar value (multi-line scalars are not supported)")
        return value

    def _no_deeper(self, indent: int, why: str) -> None:
        if self.pos < len(self.lines) and self.lines[self.pos].indent > indent:
            bad = self.lines[self.pos]
            raise YamlError(bad.number, f"unexpected indentation {why}")

    def mapping(self, indent: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            if line.indent < indent:
                break
            if line.indent > indent:
                raise YamlError(line.number, "unexpected indentation inside a mapping")
            if _is_seq_item(line.text):
                break
            split = _split_key(line.text, line.number)
            if split is None:
                raise YamlError(line.number, f"expected 'key: value', found {line.text!r}")
            key, rest = split
            if key in result:
                raise YamlError(line.number, f"duplicate key {key!r}")
            self.pos += 1
            result[key] = self._value_after_key(indent, rest, line.number)
        return result

    def _value_after_key(self, indent: int, rest: str, number: int) -> Any:
        if rest:
            if rest[0] in "|>":
                raise YamlError(number, "block scalars ('|' and '>') are not supported")
            value = scalar_or_flow(rest, number)
            self._no_deeper(indent, "after a value on the key's line (multi-line scalars are not supported)")
            return value
        if self.pos >= len(self.lines):
            return None
        nxt = self.lines[self.pos]
        if nxt.indent > indent:
            return self.block(nxt.indent)
        if nxt.indent == indent and _is_seq_item(nxt.text):
            return self.sequence(indent)
        return None

    def sequence(self, indent: int) -> list[Any]:
        result: list[Any] = []
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            if line.indent < indent or (line.indent == indent and not _is_seq_item(line.text)):
                break
            if line.indent > indent:
                raise YamlError(line.number, "unexpected indentation inside a sequence")
            if not _is_seq_item(line.text):
                break
            rest = line.text[1:].lstrip(" ")
            if not rest:
                self.pos += 1
                nxt = self.lines[self.pos] if self.pos < len(self.lines) else None
                result.append(self.block(nxt.indent) if nxt and nxt.indent > indent else None)
                continue
            # "- key: value" or "- - x": re-read the rest as a block that starts at its own column.
            column = line.indent + (len(line.text) - len(rest))
            if _is_seq_item(rest) or _split_key(rest, line.number) is not None:
                self.lines[self.pos] = _Line(line.number, column, rest)
                result.append(self.block(column))
                continue
            self.pos += 1
            result.append(scalar_or_flow(rest, line.number))
            self._no_deeper(indent, "after a sequence item (multi-line scalars are not supported)")
        return result


def _is_seq_item(text: str) -> bool:
    return text == "-" or text.startswith("- ")


def _split_key(text: str, number: int) -> tuple[str, str] | None:
    """(key, rest) when the line is `key: rest`; None when it is not a mapping entry."""
    if text[0] in "\"'":
        value, end = _quoted(text, 0, number)
        after = text[end:].lstrip(" ")
        if after.startswith(":") and (len(after) == 1 or after[1] == " "):
            return value, after[1:].strip()
        return None
    if text[0] in "[{":
        return None
    if text[0] in "&*!":
        raise YamlError(number, "anchors, aliases and tags are not supported")
    if text.startswith("? "):
        raise YamlError(number, "complex mapping keys are not supported")
    match = re.search(r":( |$)", text)
    if match is None:
        return None
    key = text[: match.start()].rstrip()
    if not key:
        raise YamlError(number, "empty mapping key")
    return key, text[match.end() :].strip()


def scalar_or_flow(text: str, number: int) -> Any:
    if text[0] in "[{":
        value, end = _flow(text, 0, number)
        if text[end:].strip():
            raise YamlError(number, f"unexpected text after a flow collection: {text[end:]!r}")
        return value
    if text[0] in "\"'":
        value, end = _quoted(text, 0, number)
        if text[end:].strip():
            raise YamlError(number, f"unexpected text after a quoted string: {text[end:]!r}")
        return value
    if text[0] in "&*!":
        raise YamlError(number, "anchors, aliases and tags are not supported")
    if text[0] in "|>":
        raise YamlError(number, "block scalars ('|' and '>') are not supported")
    if _is_seq_item(text) or text in ("?", ":") or text.startswith(("? ", ": ")):
        raise YamlError(number, f"a block collection cannot start on this line: {text!r}")
    if text[0] in "@`%":
        raise YamlError(number, f"a plain scalar cannot start with {text[0]!r}")
    if re.search(r":( |$)", text):
        raise YamlError(number, f"a mapping is not allowed here: {text!r}")
    return plain_scalar(text)


def plain_scalar(text: str) -> Any:
    """Resolve a plain scalar by the YAML 1.2 core schema."""
    if text in ("null", "Null", "NULL", "~"):
        return None
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    if _INT.fullmatch(text):
        return int(text)
    if _OCT_HEX.fullmatch(text):
        return int(text[2:], 8 if text[1] == "o" else 16)
    if _FLOAT.fullmatch(text):
        return float(text)
    lowered = text.lower()
    if lowered in (".inf", "+.inf", "-.inf"):
        return float("-inf") if lowered.startswith("-") else float("inf")
    if lowered == ".nan":
        return float("nan")
    return text


def _quoted(text: str, start: int, number: int) -> tuple[str, int]:
    quote = text[start]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if quote == "'":
            if ch == "'":
                if text[i + 1 : i + 2] == "'":
                    out.append("'")
                    i += 2
                    continue
                return "".join(out), i + 1
            out.append(ch)
            i += 1
            continue
        if ch == '"':
            return "".join(out), i + 1
        if ch == "\\":
            i = _escape(text, i + 1, out, number)
            continue
        out.append(ch)
        i += 1
    raise YamlError(number, "unterminated quoted string (multi-line strings are not supported)")


def _escape(text: str, i: int, out: list[str], number: int) -> int:
    code = text[i : i + 1]
    if code in _DQ_ESCAPES:
        out.append(_DQ_ESCAPES[code])
        return i + 1
    if code in _HEX_ESCAPES:
        digits = text[i + 1 : i + 1 + _HEX_ESCAPES[code]]
        if len(digits) != _HEX_ESCAPES[code] or not all(c in "0123456789abcdefABCDEF" for c in digits):
            raise YamlError(number, f"bad escape \\{code}{digits}")
        value = int(digits, 16)
        i += 1 + len(digits)
        if code == "u" and 0xD800 <= value < 0xDC00 and text[i : i + 2] == "\\u":
            low = int(text[i + 2 : i + 6], 16)
            value = 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
            i += 6
        out.append(chr(value))
        return i
    raise YamlError(number, f"unknown escape sequence \\{code}")


def _flow(text: str, i: int, number: int) -> tuple[Any, int]:
    opener = text[i]
    closer = "]" if opener == "[" else "}"
    items: list[Any] = []
    mapping: dict[str, Any] = {}
    i = _skip_spaces(text, i + 1)
    while True:
        if i >= len(text):
            raise YamlError(number, f"unterminated flow collection (missing {closer!r}; multi-line is unsupported)")
        if text[i] == closer:
            return (items if opener == "[" else mapping), i + 1
        key_or_item, i = _flow_node(text, i, number, stop=",:" + closer if opener == "{" else "," + closer)
        i = _skip_spaces(text, i)
        if opener == "{":
            if i >= len(text) or text[i] != ":":
                raise YamlError(number, "flow mapping entries need 'key: value'")
            value, i = _flow_node(text, _skip_spaces(text, i + 1), number, stop="," + closer)
            mapping[str(key_or_item)] = value
            i = _skip_spaces(text, i)
        else:
            items.append(key_or_item)
        if i < len(text) and text[i] == ",":
            i = _skip_spaces(text, i + 1)
        elif i < len(text) and text[i] != closer:
            raise YamlError(number, f"expected ',' or {closer!r} in a flow collection, found {text[i]!r}")


def _flow_node(text: str, i: int, number: int, stop: str) -> tuple[Any, int]:
    if i >= len(text):
        raise YamlError(number, "unterminated flow collection")
    if text[i] in "[{":
        return _flow(text, i, number)
    if text[i] in "\"'":
        return _quoted(text, i, number)
    end = i
    while end < len(text) and text[end] not in stop:
        if text[end] in "[]{}":
            raise YamlError(number, f"unexpected {text[end]!r} in a flow collection")
        end += 1
    token = text[i:end].strip()
    if not token:
        raise YamlError(number, "empty entry in a flow collection")
    if token[0] in "&*!":
        raise YamlError(number, "anchors, aliases and tags are not supported")
    return plain_scalar(token), end


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] == " ":
        i += 1
    return i
