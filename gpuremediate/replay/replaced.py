"""The replaced nodes of a replay's range, from the controller's history (ConfigMap ``gpuremediate-replaced``, issue
47): a node replaced is gone from the fleet with its record, so the replay reads what the controller kept and shows
each replacement in the range (the node, when, through what, the fault).

Where from: ``--replaced FILE`` (``kubectl -n gpuremediate-system get cm gpuremediate-replaced -o json``, or the
data key's JSON list itself), ``--scrapes DIR``'s ``DIR/replaced.json``, or the ConfigMap read through
``--kubeconfig``. The engine does not decide a replacement (its repairs succeed, so a ladder never reaches the
replace rung): what it shows is what the controller did."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuremediate.actions.replaced import REPLACED_CONFIGMAP, REPLACED_KEY, Entry, HistoryError, read_entries

FILE_IN_SCRAPES = "replaced.json"


@dataclass(frozen=True)
class Replaced:
    at: float
    node: str
    node_uid: str
    provider: str
    target: str
    fault: str
    provider_id: str
    state: str


def parse_replaced(text: str, where: str) -> list[Entry]:
    """A ConfigMap (its ``data.replaced``) or the list itself; a clear error naming ``where`` otherwise."""
    try:
        doc: Any = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    configmap = doc if isinstance(doc, dict) else {"data": {REPLACED_KEY: json.dumps(doc)}}
    if isinstance(doc, dict) and not isinstance((doc.get("data") or {}).get(REPLACED_KEY, "[]"), str):
        raise ValueError(f"{where}: data.{REPLACED_KEY} is not a string (the ConfigMap {REPLACED_CONFIGMAP})")
    try:
        return read_entries(configmap)
    except HistoryError as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_replaced(path: str) -> list[Entry]:
    try:
        return parse_replaced(Path(path).read_text(encoding="utf-8"), path)
    except OSError as exc:
        raise ValueError(f"{path}: not readable ({exc})") from None


def in_range(entries: Sequence[Entry], start: float, end: float) -> list[Replaced]:
    """The replacements within [start, end], oldest first."""
    return sorted((Replaced(e.at, e.node, e.node_uid, e.provider, e.target, e.fault, e.provider_id, e.state)
                   for e in entries if start <= e.at <= end), key=lambda r: (r.at, r.node))
