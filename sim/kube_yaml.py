"""A minimal YAML reader for apply bodies: block mappings, block sequences, plain/quoted scalars.

Flow collections other than JSON-compatible ones, anchors, multi-documents and block scalars are not
supported (ValueError). JSON is tried first by callers, so JSON bodies never reach this.
"""

from __future__ import annotations

import json
from typing import Any


def parse_yaml(text: str) -> Any:
    lines = [(len(raw) - len(raw.lstrip(" ")), raw.strip()) for raw in text.splitlines()
             if raw.strip() and not raw.strip().startswith("#") and raw.strip() != "---"]
    if not lines:
        return None
    value, pos = _block(lines, 0, lines[0][0])
    if pos != len(lines):
        raise ValueError("unexpected indentation in YAML")
    return value


def _block(lines: list[tuple[int, str]], pos: int, indent: int) -> tuple[Any, int]:
    if lines[pos][1].startswith("- ") or lines[pos][1] == "-":
        return _sequence(lines, pos, indent)
    return _mapping(lines, pos, indent)


def _mapping(lines: list[tuple[int, str]], pos: int, indent: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while pos < len(lines) and lines[pos][0] == indent and not lines[pos][1].startswith("-"):
        key, _, rest = lines[pos][1].partition(":")
        key, rest = _scalar(key.strip()), rest.strip()
        pos += 1
        if rest:
            out[str(key)] = _scalar(rest)
        elif pos < len(lines) and (lines[pos][0] > indent or lines[pos][1].startswith("-")):
            out[str(key)], pos = _block(lines, pos, lines[pos][0])
        else:
            out[str(key)] = None
    return out, pos


def _sequence(lines: list[tuple[int, str]], pos: int, indent: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while pos < len(lines) and lines[pos][0] == indent and lines[pos][1].startswith("-"):
        rest = lines[pos][1][1:].strip()
        if not rest:
            value, pos = _block(lines, pos + 1, lines[pos + 1][0])
            out.append(value)
        elif ":" in rest and not rest.startswith(("'", '"', "{", "[")):
            inner = indent + 2
            lines[pos] = (inner, rest)
            value, pos = _mapping(lines, pos, inner)
            out.append(value)
        else:
            out.append(_scalar(rest))
            pos += 1
    return out, pos


def _scalar(text: str) -> Any:
    if text.startswith(("{", "[", '"')):
        return json.loads(text)
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1].replace("''", "'")
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    if text in ("null", "~", "Null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
