"""Webhook notifications for what needs a person: a node quarantined, the breaker open, a drain blocked
for long, a repair that failed.

The loops never wait for a receiver: :meth:`WebhookNotifier.notify` puts the notification on a bounded
queue (a full queue drops it, counted) and one worker thread posts it with a timeout and a few retries
(backoff; a 4xx other than 408/429 is not retried: the receiver refused the body). Two bodies:

- ``json``: ``{"kind", "node", "reason", "message", "time", "cluster"}`` for any receiver;
- ``slack``: ``{"text": "..."}``, which Slack incoming webhooks and most chat tools accept.

The URL is a secret (it embeds a token for Slack): it is read from a Secret, never from a flag.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuremediate.state import states

log = logging.getLogger(__name__)

KIND_QUARANTINED = "quarantined"
KIND_REPAIR_FAILED = "repair-failed"
KIND_BREAKER_OPEN = "breaker-open"
KIND_DRAIN_BLOCKED = "drain-blocked"
FORMATS = ("json", "slack")
_RETRIED_4XX = (408, 429)


class NotifyError(ValueError):
    """The notifier cannot be set up (bad format, URL or Secret); the message names what is wrong."""


@dataclass(frozen=True)
class Notification:
    kind: str
    node: str  # "" for fleet-wide ones (the breaker)
    reason: str
    message: str
    at: float


def for_transition(node: str, from_state: str, to_state: str, reason: str, message: str,
                   at: float) -> Notification | None:
    """The notification a node transition calls for, or None: only what needs a person."""
    if to_state == states.QUARANTINED:
        return Notification(KIND_QUARANTINED, node, reason, message, at)
    if reason == states.REPAIR_FAILED:
        return Notification(KIND_REPAIR_FAILED, node, reason, message, at)
    return None


def body(note: Notification, fmt: str, cluster: str = "") -> bytes:
    if fmt == "slack":
        where = f" on {note.node}" if note.node else ""
        prefix = f"[{cluster}] " if cluster else ""
        text = f"{prefix}gpuremediate: {note.kind}{where} ({note.reason}): {note.message}"
        return json.dumps({"text": text}).encode()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(note.at))
    return json.dumps({"kind": note.kind, "node": note.node, "reason": note.reason, "message": note.message,
                       "time": stamp, "cluster": cluster}).encode()


def url_from_secret(secret: Mapping[str, Any], key: str = "url") -> str:
    """The webhook URL in a Secret object's ``data`` (base64) or ``stringData``."""
    name = (secret.get("metadata") or {}).get("name", "?")
    data = secret.get("data") or {}
    if key in data:
        try:
            url = base64.b64decode(str(data[key]), validate=True).decode().strip()
        except (ValueError, UnicodeDecodeError) as exc:
            raise NotifyError(f"Secret {name}: data.{key} is not base64 text: {exc}") from None
    else:
        url = str((secret.get("stringData") or {}).get(key, "")).strip()
    if not url:
        raise NotifyError(f"Secret {name}: no key {key!r} holding the webhook URL")
    check_url(url, f"Secret {name} key {key}")
    return url


def check_url(url: str, what: str) -> None:
    if not url.startswith(("https://", "http://")):
        raise NotifyError(f"{what}: the webhook URL must start with https:// or http://")


Post = Callable[[str, bytes, float], int]


def post(url: str, data: bytes, timeout_s: float) -> int:
    """POST ``data`` as JSON; the HTTP status (an HTTP error status is returned, not raised)."""
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "gpuremediate"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # the scheme is checked: http(s) only
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class WebhookNotifier:
    def __init__(
        self, url: str, *, fmt: str = "json", cluster: str = "", timeout_s: float = 5.0, retries: int = 3,
        backoff_s: float = 1.0, queue_size: int = 1000, sender: Post = post,
        sleep: Callable[[float], object] = time.sleep, on_result: Callable[[str, str], object] | None = None,
    ) -> None:
        """``on_result(kind, result)``: told of each notification's fate (sent, failed, dropped), e.g. a metric."""
        if fmt not in FORMATS:
            raise NotifyError(f"notification format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
        check_url(url, "notification webhook")
        self.url, self.fmt, self.cluster = url, fmt, cluster
        self.timeout_s, self.retries, self.backoff_s = timeout_s, max(0, retries), backoff_s
        self.sender, self.sleep, self.on_result = sender, sleep, on_result
        self._queue: queue.Queue[Notification | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self.sent = self.failed = self.dropped = 0

    def start(self) -> WebhookNotifier:
        self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        with contextlib.suppress(queue.Full):  # else the daemon thread dies with the process
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def notify(self, note: Notification) -> bool:
        """Queue ``note``; False (and counted) when the queue is full. Never blocks."""
        try:
            self._queue.put_nowait(note)
            return True
        except queue.Full:
            self.dropped += 1
            self._told(note, "dropped")
            log.warning("notification dropped: the queue is full", extra={"kind": note.kind, "node": note.node})
            return False

    def _run(self) -> None:
        while (note := self._queue.get()) is not None:
            if self.deliver(note):
                self.sent += 1
                self._told(note, "sent")
            else:
                self.failed += 1
                self._told(note, "failed")

    def _told(self, note: Notification, result: str) -> None:
        if self.on_result is not None:
            self.on_result(note.kind, result)

    def deliver(self, note: Notification) -> bool:
        """Post one notification with retries; True when the receiver took it (2xx)."""
        data = body(note, self.fmt, self.cluster)
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status = self.sender(self.url, data, self.timeout_s)
            except OSError as exc:  # refused, reset, timed out, DNS
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if 200 <= status < 300:
                return True
            problem = f"HTTP {status}"
            if 400 <= status < 500 and status not in _RETRIED_4XX:
                break
        log.warning("notification not delivered", extra={"kind": note.kind, "node": note.node, "error": problem})
        return False
