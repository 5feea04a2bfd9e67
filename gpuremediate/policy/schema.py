"""The building blocks of the policy file's declarative schema: settings, checks, errors."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from gpuremediate.policy.findings import BUILTIN_ACTIONS

ACTION_NAME_RE = re.compile(r"[a-z0-9-]+")
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_DURATION_S = 366 * 86400.0

Check = Callable[[Any, str], None]


class PolicyError(ValueError):
    """A bad policy file; the message starts with the key path of what is wrong."""


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)


def _join(path: str, key: str) -> str:
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


def dns_label(value: Any, path: str) -> None:
    """An RFC 1123 label: a namespace name."""
    if len(value) > 63 or not DNS_LABEL_RE.fullmatch(value):
        raise PolicyError(f"{path}: expected a DNS label (lower-case letters, digits, '-', at most 63), "
                          f"got {_show(value)}")


def dns_subdomain(value: Any, path: str) -> None:
    """An RFC 1123 subdomain: a ServiceAccount or other object name, an API group."""
    if len(value) > 253 or not all(DNS_LABEL_RE.fullmatch(part) for part in value.split(".")):
        raise PolicyError(f"{path}: expected a DNS subdomain (lower-case letters, digits, '-' and '.', at most "
                          f"253), got {_show(value)}")


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
