"""The building blocks of the policy file's declarative schema: settings, checks, errors."""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import Field, field, fields, is_dataclass, replace
from typing import Any, TypeVar, get_type_hints

from gpuremediate.vocab.findings import BUILTIN_ACTIONS

ACTION_NAME_RE = re.compile(r"[a-z0-9-]+")
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_DURATION_S = 366 * 86400.0

Check = Callable[[Any, str], None]


class PolicyError(ValueError):
    """A bad policy file; the message starts with the key path of what is wrong."""


EXCERPT_CHARS = 80  # the most of a bad value an error repeats (quoted, escapes counted); beyond, its size


def excerpt(text: str, quote: Callable[[str], str] = json.dumps) -> str:
    """``text`` quoted for an error message; one whose quoted form is longer than EXCERPT_CHARS (quotes aside)
    is cut to the longest start that fits, with its size: a 20 KB bad value is named, not repeated."""
    limit = EXCERPT_CHARS + 2
    if len(text) <= EXCERPT_CHARS and len(shown := quote(text)) <= limit:
        return shown
    low, high = 0, EXCERPT_CHARS  # every character quotes to one or more
    while low < high:
        middle = (low + high + 1) // 2
        if len(quote(text[:middle])) <= limit:
            low = middle
        else:
            high = middle - 1
    return f"{quote(text[:low])}… ({len(text.encode('utf-8', 'surrogatepass'))} bytes)"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return excerpt(value)
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)


def _join(path: str, key: str) -> str:
    if len(key) > EXCERPT_CHARS:  # a key of the file's own (a name, a table): no key of ours is that long
        key = f"{key[:EXCERPT_CHARS]}…({len(key.encode('utf-8', 'surrogatepass'))} bytes)"
    return f"{path}.{key}" if path else key


# --- validators ------------------------------------------------------------------------------------


def check_action(value: Any, path: str) -> None:
    if value in BUILTIN_ACTIONS:
        return
    if not ACTION_NAME_RE.fullmatch(value):
        raise PolicyError(f"{path}: expected a built-in action {list(BUILTIN_ACTIONS)} or a custom name "
                          f"matching [a-z0-9-]+, got {_show(value)}")


def at_least(minimum: float) -> Check:
    def check(value: Any, path: str) -> None:
        if value < minimum:
            raise PolicyError(f"{path}: must be at least {minimum:g}, got {_show(value)}")

    return check


def between(minimum: float, maximum: float) -> Check:
    def check(value: Any, path: str) -> None:
        if not minimum <= value <= maximum:
            raise PolicyError(f"{path}: must be between {minimum:g} and {maximum:g}, got {_show(value)}")

    return check


def duration(minimum: float) -> Check:
    """Seconds from ``minimum`` up to MAX_DURATION_S: beyond that no timer of the controller makes sense and
    time arithmetic overflows (a deadline of 1e300 s)."""
    return between(minimum, MAX_DURATION_S)


DNS_LABEL_WANTED = "expected a DNS label (lower-case letters, digits, '-', at most 63)"
DNS_SUBDOMAIN_WANTED = "expected a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253)"


def is_dns_label(name: str) -> bool:
    """An RFC 1123 label, as Kubernetes wants a namespace name."""
    return len(name) <= 63 and DNS_LABEL_RE.fullmatch(name) is not None


def is_dns_subdomain(name: str) -> bool:
    """An RFC 1123 subdomain, as Kubernetes wants most object names and API groups."""
    return len(name) <= 253 and all(DNS_LABEL_RE.fullmatch(part) for part in name.split("."))


def dns_label(value: Any, path: str) -> None:
    """A namespace name."""
    if not is_dns_label(value):
        raise PolicyError(f"{path}: {DNS_LABEL_WANTED}, got {_show(value)}")


def dns_subdomain(value: Any, path: str) -> None:
    """A ServiceAccount or other object name, an API group."""
    if not is_dns_subdomain(value):
        raise PolicyError(f"{path}: {DNS_SUBDOMAIN_WANTED}, got {_show(value)}")


def image_reference(value: Any, path: str) -> None:
    if not value or any(c.isspace() for c in value) or any(ord(c) < 32 for c in value):
        raise PolicyError(f"{path}: expected a container image reference, got {_show(value)}")


def shell_words(value: Any, path: str) -> None:
    """A command the Job runs, split like a shell (shlex) now rather than at the first attempt."""
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise PolicyError(f"{path}: cannot split {_show(value)} like a shell: {exc}") from None
    if not words:
        raise PolicyError(f"{path}: must not be empty")


# --- schema helpers --------------------------------------------------------------------------------


def setting(default: Any, doc: str, *, check: Check | None = None, action: bool = False) -> Any:
    """A scalar setting. ``action=True`` marks an action name (checked, and reported to hooks)."""
    checks = check_action if action else check
    return field(default=default, metadata={"doc": doc, "check": checks, "action": action})


# --- the generic walker: a TOML table onto a section dataclass ----------------------------------------

MAX_INTEGER = 2**53  # every integer setting ends up in JSON (a Job, a record): keep it exact there
T = TypeVar("T")


def coerce(hint: Any, raw: Any, path: str) -> Any:
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        raise PolicyError(f"{path}: expected true or false, got {_show(raw)}")
    if hint is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            if abs(raw) > MAX_INTEGER:
                raise PolicyError(f"{path}: out of range, got {_show(raw)}")
            return raw
        raise PolicyError(f"{path}: expected an integer, got {_show(raw)}")
    if hint is float:
        if isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
            return float(raw)
        raise PolicyError(f"{path}: expected a number, got {_show(raw)}")
    if hint is str:
        if isinstance(raw, str):
            return raw
        raise PolicyError(f"{path}: expected a string, got {_show(raw)}")
    raise TypeError(f"{path}: the schema has no rule for type {hint!r}")


def _field_value(spec: Field[Any], hint: Any, current: Any, raw: Any, path: str) -> Any:
    parse = spec.metadata.get("parse")
    if parse is not None:
        return parse(raw, path, current)
    if is_dataclass(current):
        return merge_section(current, raw, path)
    value = coerce(hint, raw, path)
    check = spec.metadata.get("check")
    if check is not None:
        check(value, path)
    return value


def merge_section(base: T, raw: Any, path: str) -> T:
    """``base`` with the keys of the TOML table ``raw`` applied; unknown keys and bad values raise."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: expected a table, got {_show(raw)}")
    specs = {spec.name: spec for spec in fields(base)}  # type: ignore[arg-type]
    hints = get_type_hints(type(base))
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in specs:
            raise PolicyError(f"{_join(path, key)}: unknown key (known: {', '.join(specs)})")
        changes[key] = _field_value(specs[key], hints[key], getattr(base, key), value, _join(path, key))
    merged = replace(base, **changes)  # type: ignore[type-var]
    validate = getattr(merged, "validate", None)
    if callable(validate):
        validate(path)
    return merged


def one_of(*allowed: str) -> Any:
    def check(value: Any, path: str) -> None:
        if value not in allowed:
            raise PolicyError(f"{path}: expected one of {', '.join(allowed)}, got {excerpt(str(value), repr)}")

    return check


def string_list(check_item: Callable[[Any, str], None]) -> Callable[[Any, str, Any], tuple[str, ...]]:
    """A ``parse`` for an array of strings, each checked (errors name the index)."""

    def parse(raw: Any, path: str, _current: Any) -> tuple[str, ...]:
        if not isinstance(raw, list):
            raise PolicyError(f"{path}: expected an array of strings, got {_show(raw)}")
        for index, item in enumerate(raw):
            if not isinstance(item, str):
                raise PolicyError(f"{path}[{index}]: expected a string, got {_show(item)}")
            check_item(item, f"{path}[{index}]")
        return tuple(raw)

    return parse
