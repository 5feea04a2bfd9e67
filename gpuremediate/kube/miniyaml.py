"""A small, strict YAML-subset loader (stdlib only): kubeconfig files, manifests, apply-patch bodies.

Supported: block mappings and sequences (including a sequence at the same indentation as its parent
key, as kubectl writes it), plain / single-quoted / double-quoted scalars typed by the YAML 1.2 core
schema (int, float, bool, null, else string) and folded over several lines as kustomize writes them,
literal `|` and folded `>` block scalars with chomping and indentation indicators, flow collections
`[...]` / `{...}` (on one line or several), comments, a byte-order mark, multi-document streams
(`---`, `...`), and plain JSON documents. Mapping keys are always strings (as in Kubernetes, where
YAML becomes JSON). Anything else (anchors, aliases, tags, complex keys, directives, flow pairs,
duplicate keys) raises YamlError naming the line.

`dump(value)` writes JSON-shaped data (dicts with string keys, lists, str, int, float, bool, None) as
block YAML that this loader, and YAML 1.1 loaders such as PyYAML, read back as the same value: a string
is plain only where no loader could read it as anything else, else double-quoted with escapes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["YamlError", "dump", "load", "load_all", "loads"]


class YamlError(ValueError):
    """The text is not in the supported YAML subset; `line` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_TRUES = frozenset({"true", "True", "TRUE"})
_FALSES = frozenset({"false", "False", "FALSE"})
_INT = re.compile(r"[-+]?[0-9]+")
_OCT = re.compile(r"0o[0-7]+")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"([-+]?)\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")
_DOC_START = re.compile(r"---(\s.*)?")
_DOC_END = re.compile(r"\.\.\.(\s.*)?")
_KEY_COLON = re.compile(r":(\s|$)")
_BAD_PLAIN_START = frozenset("&*!%@`,]}?:-|>")
_ESCAPES = {
    "0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f",
    "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0",
    "L": "\u2028", "P": "\u2029",
}
_HEX_ESCAPE_LEN = {"x": 2, "u": 4, "U": 8}


def _resolve_plain(text: str) -> Any:
    """Type a plain scalar by the YAML 1.2 core schema."""
    if text in _NULLS:
        return None
    if text in _TRUES:
        return True
    if text in _FALSES:
        return False
    if _INT.fullmatch(text):
        # A leading zero ("0123") stays text: read into a string field (a kubeconfig token, a port name)
        # Go's YAML keeps the digits as written, and int("0123") would silently drop the zero.
        digits = text.lstrip("+-")
        return text if len(digits) > 1 and digits.startswith("0") else int(text)
    if _OCT.fullmatch(text):
        return int(text[2:], 8)
    if _HEX.fullmatch(text):
        return int(text[2:], 16)
    if _FLOAT.fullmatch(text):
        return float(text)
    inf = _INF.fullmatch(text)
    if inf:
        return -math.inf if inf.group(1) == "-" else math.inf
    if _NAN.fullmatch(text):
        return math.nan
    return text


@dataclass
class _Line:
    number: int
    text: str


def _indent_of(line: _Line) -> int:
    stripped = line.text.lstrip(" ")
    if stripped.startswith("\t"):
        raise YamlError(line.number, "tab in indentation (use spaces)")
    return len(line.text) - len(stripped)


def _is_insignificant(line: _Line) -> bool:
    stripped = line.text.strip(" \t")
    return stripped == "" or stripped.startswith("#")


def _unquoted(text: str) -> tuple[list[tuple[int, str]], bool]:
    """The (index, char) of every character outside quoted scalars, and whether every quote was closed.

    A quote opens a scalar only where one can start (the line start, or after whitespace, '[', '{', ','
    or ':'); inside, ``''`` (single quotes) and a backslash escape (double quotes) do not close it.
    """
    outside: list[tuple[int, str]] = []
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote == '"' and ch == "\\":
            i += 2
            continue
        if quote:
            if ch == quote:
                if quote == "'" and text[i + 1 : i + 2] == "'":
                    i += 2
                    continue
                quote = ""
        elif ch in "\"'" and (i == 0 or text[i - 1] in " \t[{,:"):
            quote = ch
        else:
            outside.append((i, ch))
        i += 1
    return outside, not quote


def _strip_comment(text: str) -> str:
    """Cut a `#` comment that starts outside quotes after whitespace (or at the start)."""
    for i, ch in _unquoted(text)[0]:
        if ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i]
    return text


def _parse_double_quoted(text: str, start: int, lineno: int) -> tuple[str, int]:
    """Decode a double-quoted scalar beginning at text[start]; return (value, index after it)."""
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return _join_surrogates("".join(out)), i + 1
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(text):
            break
        code = text[i + 1]
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            i += 2
        elif code in _HEX_ESCAPE_LEN:
            digits = text[i + 2 : i + 2 + _HEX_ESCAPE_LEN[code]]
            if len(digits) != _HEX_ESCAPE_LEN[code] or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise YamlError(lineno, f"bad escape \\{code}{digits} in double-quoted scalar")
            out.append(chr(int(digits, 16)))
            i += 2 + len(digits)
        else:
            raise YamlError(lineno, f"unknown escape \\{code} in double-quoted scalar")
    raise YamlError(lineno, "unterminated double-quoted scalar")


def _join_surrogates(text: str) -> str:
    if not any("\ud800" <= ch <= "\udfff" for ch in text):
        return text
    try:
        return text.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        return text


def _parse_single_quoted(text: str, start: int, lineno: int) -> tuple[str, int]:
    out: list[str] = []
    i = start + 1
    while i < len(text):
        if text[i] == "'":
            if text[i + 1 : i + 2] == "'":
                out.append("'")
                i += 2
                continue
            return "".join(out), i + 1
        out.append(text[i])
        i += 1
    raise YamlError(lineno, "unterminated single-quoted scalar")


def _quoted_end(text: str, start: int) -> int | None:
    """Index just past the quoted scalar starting at text[start], or None if it does not close."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        if quote == '"' and text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            if quote == "'" and text[i + 1 : i + 2] == "'":
                i += 2
                continue
            return i + 1
        i += 1
    return None


def _fold_lines(lines: list[str], *, escapable: bool) -> str:
    """Join the source lines of a multi-line flow scalar: a line break folds to a space,
    each empty line becomes a newline, and (double-quoted) a trailing backslash joins directly."""
    out = lines[0].rstrip(" \t")
    pending_breaks = 0
    for raw in lines[1:]:
        piece = raw.strip(" \t")
        if not piece:
            pending_breaks += 1
            continue
        if escapable and _ends_with_escape(out) and not pending_breaks:
            out = out[:-1] + raw.lstrip(" \t")
        else:
            out += ("\n" * pending_breaks if pending_breaks else " ") + piece
        pending_breaks = 0
    return out + "\n" * pending_breaks


def _ends_with_escape(text: str) -> bool:
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


def _parse_quoted(text: str, start: int, lineno: int) -> tuple[str, int]:
    if text[start] == '"':
        return _parse_double_quoted(text, start, lineno)
    return _parse_single_quoted(text, start, lineno)


def _expect_only_comment(rest: str, lineno: int) -> None:
    if _strip_comment(rest).strip(" \t"):
        raise YamlError(lineno, f"unexpected text after the value: {rest.strip()!r}")


def _split_key(content: str, lineno: int) -> tuple[str, str] | None:
    """If `content` starts a `key: value` pair, return (key, text after the colon)."""
    if content.startswith("? ") or content == "?":
        raise YamlError(lineno, "complex mapping keys ('?') are not supported")
    if content[:1] in "\"'":
        if _quoted_end(content, 0) is None:
            return None
        key, end = _parse_quoted(content, 0, lineno)
        after = content[end:].lstrip(" ")
        if after.startswith(":") and (len(after) == 1 or after[1] in " \t"):
            return key, after[1:]
        return None
    if content[:1] in "[{":
        return None
    body = _strip_comment(content)
    match = _KEY_COLON.search(body)
    if match is None:
        return None
    key = body[: match.start()].rstrip(" \t")
    if not key:
        raise YamlError(lineno, "empty mapping key")
    if key[0] in "&*!":
        raise YamlError(lineno, "anchors, aliases and tags are not supported")
    return key, content[match.start() + 1 :]


def _is_seq_item(content: str) -> bool:
    return content == "-" or content.startswith(("- ", "-\t"))


class _FlowParser:
    """Flow collections: `[a, "b", {c: 1}]`, `{a: 1, b: [x, y]}`."""

    def __init__(self, text: str, lineno: int) -> None:
        self.text = text
        self.i = 0
        self.lineno = lineno

    def parse(self) -> tuple[Any, str]:
        value = self._value()
        return value, self.text[self.i :]

    def _error(self, message: str) -> YamlError:
        return YamlError(self.lineno, f"{message} in flow collection {self.text.strip()!r}")

    def _skip_ws(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t":
            self.i += 1

    def _peek(self) -> str:
        self._skip_ws()
        return self.text[self.i : self.i + 1]

    def _value(self) -> Any:
        ch = self._peek()
        if ch == "[":
            return self._sequence()
        if ch == "{":
            return self._mapping()
        if ch in ("'", '"'):
            value, self.i = _parse_quoted(self.text, self.i, self.lineno)
            return value
        if ch and ch in "&*!":
            raise self._error("anchors, aliases and tags are not supported")
        return _resolve_plain(self._plain())

    def _plain(self) -> str:
        start = self.i
        while self.i < len(self.text):
            ch = self.text[self.i]
            if ch in ",[]{}":
                break
            if ch == ":" and self.text[self.i + 1 : self.i + 2] in ("", " ", ",", "]", "}"):
                break
            if ch == "#" and self.i > start and self.text[self.i - 1] in " \t":
                raise self._error("comment inside")
            self.i += 1
        return self.text[start : self.i].strip(" \t")

    def _sequence(self) -> list[Any]:
        self.i += 1
        items: list[Any] = []
        while True:
            if self._peek() == "]":
                self.i += 1
                return items
            if self._peek() in ("", ","):
                raise self._error("missing item")
            items.append(self._value())
            if self._peek() == ":":
                raise self._error("single-pair mappings are not supported")
            if not self._end_or_comma("]"):
                return items

    def _mapping(self) -> dict[str, Any]:
        self.i += 1
        result: dict[str, Any] = {}
        while True:
            if self._peek() == "}":
                self.i += 1
                return result
            key = self._key()
            if key in result:
                raise self._error(f"duplicate key {key!r}")
            if self._peek() != ":":
                raise self._error(f"expected ':' after key {key!r}")
            self.i += 1
            result[key] = None if self._peek() in (",", "}") else self._value()
            if not self._end_or_comma("}"):
                return result

    def _key(self) -> str:
        ch = self._peek()
        if ch in ("'", '"'):
            key, self.i = _parse_quoted(self.text, self.i, self.lineno)
            return key
        if ch in ("", ",", "[", "{"):
            raise self._error("expected a key")
        return self._plain()

    def _end_or_comma(self, closer: str) -> bool:
        """Consume ',' (True: more may follow) or the closer (False: done)."""
        ch = self._peek()
        if ch == ",":
            self.i += 1
            return True
        if ch == closer:
            self.i += 1
            return False
        raise self._error(f"expected ',' or '{closer}'")


def _flow_is_balanced(text: str) -> bool:
    outside, closed = _unquoted(text)
    depth = sum(1 if ch in "[{" else -1 for _, ch in outside if ch in "[{]}")
    return depth <= 0 and closed


class _Parser:
    """Recursive descent over the lines of one document."""

    def __init__(self, lines: list[_Line]) -> None:
        self.lines = lines
        self.pos = 0

    def parse_document(self) -> Any:
        self._skip_insignificant()
        if self._at_end():
            return None
        line = self.lines[self.pos]
        value = self._block_node_at(_indent_of(line))
        self._skip_insignificant()
        if not self._at_end():
            extra = self.lines[self.pos]
            raise YamlError(extra.number, f"unexpected content {extra.text.strip()!r} (bad indentation?)")
        return value

    # -- line bookkeeping -------------------------------------------------------------

    def _at_end(self) -> bool:
        return self.pos >= len(self.lines)

    def _skip_insignificant(self) -> None:
        while not self._at_end() and _is_insignificant(self.lines[self.pos]):
            self.pos += 1

    def _next_indent(self) -> int | None:
        self._skip_insignificant()
        return None if self._at_end() else _indent_of(self.lines[self.pos])

    # -- block nodes ------------------------------------------------------------------

    def _block_node_at(self, indent: int) -> Any:
        line = self.lines[self.pos]
        content = line.text[indent:]
        if _is_seq_item(content):
            return self._sequence(indent)
        if _split_key(content, line.number) is not None:
            return self._mapping(indent)
        self.pos += 1
        return self._inline_value(content, line, max(indent - 1, -1), compact_seq=False)

    def _line_at(self, indent: int) -> _Line | None:
        """The next significant line if it continues the collection at `indent`; None where that ends."""
        current = self._next_indent()
        if current is None or current < indent:
            return None
        line = self.lines[self.pos]
        if current > indent:
            raise YamlError(line.number, f"unexpected indentation: {line.text.strip()!r}")
        return line

    def _mapping(self, indent: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while (line := self._line_at(indent)) is not None:
            content = line.text[indent:]
            split = _split_key(content, line.number)
            if split is None:
                if _is_seq_item(content):
                    raise YamlError(line.number, "a sequence item where a mapping key was expected")
                raise YamlError(line.number, f"expected 'key: value', found {content.strip()!r}")
            key, rest = split
            if key in result:
                raise YamlError(line.number, f"duplicate key {key!r}")
            self.pos += 1
            result[key] = self._inline_value(rest, line, indent, compact_seq=True)
        return result

    def _sequence(self, indent: int) -> list[Any]:
        items: list[Any] = []
        while (line := self._line_at(indent)) is not None:
            content = line.text[indent:]
            if not _is_seq_item(content):
                break
            items.append(self._sequence_item(line, indent, content[1:]))
        return items

    def _sequence_item(self, line: _Line, indent: int, after_dash: str) -> Any:
        stripped = after_dash.lstrip(" ")
        if stripped.startswith("\t"):
            raise YamlError(line.number, "tab after '-' (use spaces)")
        if _strip_comment(stripped).strip() == "":
            self.pos += 1
            return self._nested_block(indent, compact_seq=False)
        column = indent + 1 + len(after_dash) - len(stripped)
        if _is_seq_item(stripped) or _split_key(stripped, line.number) is not None:
            # A collection starting on the dash's line: re-read this line as if it began at `column`.
            line.text = " " * column + stripped
            return self._block_node_at(column)
        self.pos += 1
        return self._inline_value(stripped, line, indent, compact_seq=False)

    def _nested_block(self, parent_indent: int, *, compact_seq: bool) -> Any:
        current = self._next_indent()
        if current is None:
            return None
        if current > parent_indent:
            return self._block_node_at(current)
        content = self.lines[self.pos].text[current:]
        if compact_seq and current == parent_indent and _is_seq_item(content):
            return self._sequence(current)
        return None

    # -- values on the same line as their key or dash -----------------------------------

    def _inline_value(self, rest: str, line: _Line, parent_indent: int, *, compact_seq: bool) -> Any:
        text = rest.strip(" \t")
        if _strip_comment(text).strip() == "":
            return self._nested_block(parent_indent, compact_seq=compact_seq)
        first = text[0]
        if first in "|>":
            return self._block_scalar(_strip_comment(text).strip(), line, parent_indent)
        if first in "[{":
            return self._flow(text, line)
        if first in "\"'":
            return self._quoted(text, line)
        return self._plain(_strip_comment(text).strip(" \t"), line, parent_indent)

    def _quoted(self, text: str, line: _Line) -> str:
        pieces = [text]
        while _quoted_end("\n".join(pieces), 0) is None:
            if self._at_end():
                raise YamlError(line.number, "unterminated quoted scalar")
            pieces.append(self.lines[self.pos].text)
            self.pos += 1
        joined = _fold_lines(pieces, escapable=text[0] == '"') if len(pieces) > 1 else text
        value, end = _parse_quoted(joined, 0, line.number)
        _expect_only_comment(joined[end:], line.number)
        return value

    def _continuation_lines(self, parent_indent: int) -> list[_Line]:
        """The following lines of a multi-line plain scalar (indented deeper than its parent)."""
        lines: list[_Line] = []
        probe = self.pos
        while probe < len(self.lines):
            text = self.lines[probe].text
            stripped = text.strip(" ")
            if stripped and (len(text) - len(text.lstrip(" ")) <= parent_indent or stripped.startswith("#")):
                break
            lines.append(self.lines[probe])
            probe += 1
        while lines and not lines[-1].text.strip(" "):
            lines.pop()
        self.pos += len(lines)
        return lines

    def _plain(self, first_line: str, line: _Line, parent_indent: int) -> Any:
        pieces = [first_line]
        for more in self._continuation_lines(parent_indent):
            piece = _strip_comment(more.text)
            if _KEY_COLON.search(piece):
                raise YamlError(more.number, f"mapping values are not allowed here: {piece.strip()!r} (unexpected "
                                f"indentation: it would continue the scalar of line {line.number})")
            pieces.append(piece)
        text = _fold_lines(pieces, escapable=False) if len(pieces) > 1 else first_line
        return self._typed_plain(text, line)

    def _typed_plain(self, text: str, line: _Line) -> Any:
        if text[0] in "&*!":
            raise YamlError(line.number, "anchors, aliases and tags are not supported")
        if text[0] in _BAD_PLAIN_START and (text[0] not in "-?:" or text[1:2] in ("", " ", "\t")):
            raise YamlError(line.number, f"a plain scalar cannot start with {text[0]!r}: {text!r}")
        if _KEY_COLON.search(text):
            raise YamlError(line.number, f"mapping values are not allowed here: {text!r}")
        return _resolve_plain(text)

    def _flow(self, text: str, line: _Line) -> Any:
        joined = _strip_comment(text)
        while not _flow_is_balanced(joined):
            if self._at_end():
                raise YamlError(line.number, "unterminated flow collection")
            joined += " " + _strip_comment(self.lines[self.pos].text).strip()
            self.pos += 1
        value, rest = _FlowParser(joined, line.number).parse()
        _expect_only_comment(rest, line.number)
        return value

    def _block_scalar(self, header: str, line: _Line, parent_indent: int) -> str:
        style, chomp, explicit = _parse_block_header(header, line.number)
        content_indent = parent_indent + explicit if explicit else None
        raw: list[str] = []
        while not self._at_end():
            text = self.lines[self.pos].text
            if text.strip(" ") == "":
                raw.append(text)
                self.pos += 1
                continue
            indent = len(text) - len(text.lstrip(" "))
            if content_indent is None:
                content_indent = indent
            if indent < content_indent or indent <= parent_indent:
                break
            raw.append(text)
            self.pos += 1
        width = content_indent if content_indent is not None else parent_indent + 1
        lines = [None if len(t) <= width and t.strip(" ") == "" else t[width:] for t in raw]
        return _assemble_block(lines, folded=style == ">", chomp=chomp)


def _parse_block_header(header: str, lineno: int) -> tuple[str, str, int]:
    match = re.fullmatch(r"([|>])(?:([1-9])([-+]?)|([-+])([1-9]?))?", header)
    if match is None:
        raise YamlError(lineno, f"bad block scalar header {header!r}")
    digit = match.group(2) or match.group(5) or ""
    chomp = match.group(3) or match.group(4) or ""
    return match.group(1), chomp, int(digit) if digit else 0


def _assemble_block(lines: list[str | None], *, folded: bool, chomp: str) -> str:
    """Join block scalar lines (None = empty line) the way YAML's scanner does."""
    content_at = [i for i, text in enumerate(lines) if text is not None]
    if not content_at:
        return "\n" * len(lines) if chomp == "+" else ""
    chunks: list[str] = ["\n"] * content_at[0]
    for n, i in enumerate(content_at):
        text = lines[i]
        assert text is not None
        chunks.append(text)
        following = content_at[n + 1] if n + 1 < len(content_at) else None
        if following is None:
            break
        empties = following - i - 1
        next_text = lines[following]
        assert next_text is not None
        plain_fold = folded and not text.startswith((" ", "\t")) and not next_text.startswith((" ", "\t"))
        if not plain_fold:
            chunks.append("\n")
        elif empties == 0:
            chunks.append(" ")
        chunks.append("\n" * empties)
    if chomp != "-":
        chunks.append("\n")
    if chomp == "+":
        chunks.append("\n" * (len(lines) - content_at[-1] - 1))
    return "".join(chunks)


@dataclass
class _Document:
    start: int  # the line of its `---`, else of its first content
    lines: list[_Line]


def _split_documents(text: str) -> list[_Document]:
    documents: list[_Document] = []
    current: list[_Line] = []
    marker = 0  # the line of the `---` that opened `current`; 0 when none did
    for number, raw in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        body = raw.rstrip("\r")
        if body.startswith("%"):
            raise YamlError(number, "directives ('%...') are not supported")
        if _DOC_START.fullmatch(body) or _DOC_END.fullmatch(body):
            if _strip_comment(body[3:]).strip(" \t"):
                raise YamlError(number, f"content on a document marker line is not supported: {body!r}")
            _close_document(documents, current, marker)
            current = []
            marker = number if body.startswith("---") else 0
            continue
        current.append(_Line(number, body))
    _close_document(documents, current, marker)
    return documents


def _close_document(documents: list[_Document], lines: list[_Line], marker: int) -> None:
    content = [line.number for line in lines if not _is_insignificant(line)]
    if marker or content:
        documents.append(_Document(marker or content[0], lines))


def _as_json(text: str) -> tuple[bool, Any]:
    """(True, value) when the whole text is one JSON object or array (without duplicate keys)."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped.startswith(("{", "[")):
        return False, None
    try:
        return True, json.loads(stripped, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except ValueError:  # not JSON after all (or JSON that YAML reads differently): let the YAML parser say
        return False, None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key")
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_all(text: str) -> list[Any]:
    """Every document of a YAML stream, in order (an empty explicit document is None)."""
    is_json, value = _as_json(text)
    if is_json:
        return [value]
    return [_Parser(doc.lines).parse_document() for doc in _split_documents(text)]


def loads(text: str) -> Any:
    """The single YAML or JSON document of `text` (None when there is none)."""
    is_json, value = _as_json(text)
    if is_json:
        return value
    documents = _split_documents(text)
    if len(documents) > 1:
        raise YamlError(documents[1].start, f"several documents (expected one, found {len(documents)}; "
                                            "the second starts here)")
    return _Parser(documents[0].lines).parse_document() if documents else None


load = loads


# ---- the emitter ------------------------------------------------------------------------------

_PLAIN_SAFE = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*", re.ASCII)
# Plain words some YAML loader (1.1's booleans and nulls included) reads as something other than a string.
_NOT_STRINGS = frozenset({"y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
                          "OFF"}) | _NULLS | _TRUES | _FALSES
_SHORT_ESCAPES = {"\0": "\\0", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v",
                  "\f": "\\f", "\r": "\\r", "\x1b": "\\e", '"': '\\"', "\\": "\\\\"}


def _printable(char: str) -> bool:
    code = ord(char)
    if code in (0x2028, 0x2029, 0xFEFF):  # line and paragraph separators (line breaks to YAML 1.1), the BOM
        return False
    return 0x20 <= code < 0x7F or 0xA0 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or code >= 0x10000


def _quoted(text: str) -> str:
    out = []
    for char in text:
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif _printable(char):
            out.append(char)
        elif ord(char) <= 0xFF:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        if "." not in text and "e" in text:  # 1e+16: YAML 1.1 wants the dot (1.0e+16)
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, str):
        return value if _PLAIN_SAFE.fullmatch(value) and value not in _NOT_STRINGS else _quoted(value)
    raise TypeError(f"cannot write a {type(value).__name__} as YAML")


def _block(value: Any, indent: int) -> list[str]:
    """``value`` (a non-empty dict or list) as lines at ``indent``."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"a mapping key must be a string, got {type(key).__name__}")
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{_scalar(key)}:")
                lines += _block(item, indent + 2)
            else:
                lines.append(f"{pad}{_scalar(key)}: {_inline(item)}")
        return lines
    for item in value:
        if isinstance(item, (dict, list)) and item:
            nested = _block(item, indent + 2)
            lines.append(f"{pad}- {nested[0][indent + 2:]}")
            lines += nested[1:]
        else:
            lines.append(f"{pad}- {_inline(item)}")
    return lines


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    return _scalar(value)


def dump(value: Any) -> str:
    """``value`` as a YAML document (block style, keys in their order); tuples are written as lists."""
    value = _listed(value)
    if isinstance(value, (dict, list)) and value:
        return "\n".join(_block(value, 0)) + "\n"
    return _inline(value) + "\n"


def _listed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_listed(v) for v in value]
    return value
