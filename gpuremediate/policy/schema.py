"""The building blocks of the policy file's declarative schema: settings, checks, errors."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from gpuremediate.policy.findings import BUILTIN_ACTIONS

ACTION_NAME_RE = re.compile(r"[a-z0-9-]+")

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


# --- schema helpers --------------------------------------------------------------------------------


def setting(default: Any, doc: str, *, check: Check | None = None, action: bool = False) -> Any:
    """A scalar setting. ``action=True`` marks an action name (checked, and reported to hooks)."""
    checks = check_action if action else check
    return field(default=default, metadata={"doc": doc, "check": checks, "action": action})
