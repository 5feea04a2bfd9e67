"""``[taint]``: the taint the controller puts on the nodes it holds (the section's type; ``actions.node_status``
adds it to and takes it off a Node)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuremediate.vocab.schema import PolicyError, _show, one_of, setting

DEFAULT_TAINT_KEY = "gpuremediate.io/unhealthy"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# A qualified name: optional DNS-subdomain prefix "/" name of at most 63 characters.
_QUALIFIED_NAME = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def taint_key(value: Any, path: str) -> None:
    if not isinstance(value, str) or len(value) > 316 or not _QUALIFIED_NAME.fullmatch(value):
        raise PolicyError(f"{path}: expected a taint key (a qualified name such as {DEFAULT_TAINT_KEY}), "
                          f"got {_show(value)}")


def _taint_value(value: Any, path: str) -> None:
    if not _LABEL_VALUE.fullmatch(value):
        raise PolicyError(f"{path}: expected a label value (at most 63 of A-Z a-z 0-9 - _ .), got {_show(value)}")


@dataclass(frozen=True)
class TaintPolicy:
    """``[taint]``: a taint on the nodes we hold, alongside (or instead of) the cordon."""

    enabled: bool = setting(False, "taint the nodes the controller holds (any state but healthy)")
    key: str = setting(DEFAULT_TAINT_KEY, "the taint's key", check=taint_key)
    value: str = setting("", "the taint's value", check=_taint_value)
    effect: str = setting("NoSchedule", "NoSchedule | PreferNoSchedule | NoExecute (NoExecute evicts every pod "
                          "that does not tolerate it, outside the drain's rules)", check=one_of(*TAINT_EFFECTS))
    instead_of_cordon: bool = setting(False, "true: taint and do not set spec.unschedulable (needs enabled)")

    def validate(self, path: str) -> None:
        if self.instead_of_cordon and not self.enabled:
            raise PolicyError(f"{path}.instead_of_cordon: needs {path}.enabled = true (else nothing keeps "
                              "pods off the node)")

    def as_taint(self) -> dict[str, str]:
        taint = {"key": self.key, "effect": self.effect}
        if self.value:
            taint["value"] = self.value
        return taint
