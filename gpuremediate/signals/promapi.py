"""Prometheus' HTTP API answer envelope (``{"status", "data", "errorType", "error"}``), read once for every
caller: the source's instant queries, replay's range queries, the drain gate's alerts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def api_data(body: bytes, error: type[Exception], what: str,
             decode: Callable[[bytes], Any] = json.loads) -> dict[str, Any]:
    """The ``data`` object of a successful answer; ``error`` naming what Prometheus said otherwise (``what``:
    the request, e.g. "Prometheus query"; ``decode``: the JSON decoding, json.loads by default)."""
    try:
        doc = decode(body)
    except ValueError as exc:
        raise error(f"Prometheus answered with something that is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        detail = doc.get("error") if isinstance(doc, dict) else None
        kind = doc.get("errorType") if isinstance(doc, dict) else None
        raise error(f"{what} failed: {kind or 'error'}: {detail or 'status is not success'}")
    data = doc.get("data")
    return data if isinstance(data, dict) else {}
