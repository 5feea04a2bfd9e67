"""Which Prometheus alerts fire: ``GET /api/v1/alerts`` (the drain gate's blocking alerts).

The answer is cached for ``ttl_s`` so that many drain admissions cost one request; a failed read is
remembered for the same time, with its reason (the gate then holds: the safe side).
"""

from __future__ import annotations

import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from gpuremediate.signals.promapi import api_data

MAX_BODY = 8 * 1024 * 1024


class AlertsError(ValueError):
    """The alerts API answered something unusable; the message says what."""


def firing_names(body: bytes) -> set[str]:
    """The ``alertname`` of every firing alert in an ``/api/v1/alerts`` response."""
    alerts = api_data(body, AlertsError, "alerts query").get("alerts")
    if not isinstance(alerts, list):
        raise AlertsError("alerts response has no data.alerts list")
    names = set()
    for alert in alerts:
        if isinstance(alert, dict) and alert.get("state") == "firing":
            name = (alert.get("labels") or {}).get("alertname")
            if isinstance(name, str) and name:
                names.add(name)
    return names


Fetch = Callable[[str, float], bytes]


class AlertsReader:
    def __init__(self, url: str, *, token: str | None = None, ca_file: str | None = None, timeout_s: float = 5.0,
                 ttl_s: float = 15.0, fetch: Fetch | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not url.startswith(("http://", "https://")):
            raise AlertsError(f"blocking alerts: the Prometheus URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/") + "/api/v1/alerts"
        self.token, self.timeout_s, self.ttl_s, self.clock = token, timeout_s, ttl_s, clock
        self._context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._fetch = fetch or self._http
        self._lock = threading.Lock()
        self._cached: tuple[float, set[str] | None, str] | None = None

    def firing(self) -> tuple[set[str] | None, str]:
        """(firing alert names, "") or (None, why they could not be read)."""
        with self._lock:
            now = self.clock()
            if self._cached is None or now - self._cached[0] >= self.ttl_s:
                self._cached = (now, *self._read())
            return self._cached[1], self._cached[2]

    def _read(self) -> tuple[set[str] | None, str]:
        try:
            return firing_names(self._fetch(self.url, self.timeout_s)), ""
        except (AlertsError, OSError) as exc:
            return None, f"{self.url}: {exc}"

    def _http(self, url: str, timeout_s: float) -> bytes:
        headers: dict[str, Any] = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=self._context) as response:
                body: bytes = response.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            raise AlertsError(f"HTTP {exc.code}: {exc.read(2048).decode(errors='replace')}") from None
        if len(body) > MAX_BODY:
            raise AlertsError(f"alerts response larger than {MAX_BODY} bytes")
        return body
