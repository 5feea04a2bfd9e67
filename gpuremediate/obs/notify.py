"""Webhook notifications for what needs a person: a node quarantined, the breaker open, a drain blocked
for long, a repair that failed; and, chosen in ``[notifications].events``, every repair's steps (a drain
started, a repair done, a node back in service: kured's one message per reboot).

The loops never wait for a receiver: :meth:`WebhookNotifier.notify` puts the notification on a bounded
queue (a full queue drops it, counted) and one worker thread posts it with a timeout and a few retries
(backoff; a 4xx other than 408/429 is not retried: the receiver refused the body). Kinds not chosen are
not queued. Two bodies:

- ``json``: ``{"kind", "node", "nodes", "from", "to", "reason", "message", "time", "cluster"}`` for any
  receiver (``nodes``: every node it is about, the faulted ones for the breaker; ``text``: the template's);
- ``slack``: ``{"text": "..."}``, which Slack incoming webhooks and most chat tools accept.

A ``template`` (``[notifications].template``) is the message people read, with named fields: ``{node}``
(the nodes, for the breaker), ``{from}``, ``{to}``, ``{reason}``, ``{message}``, ``{cluster}``, ``{kind}``,
``{time}``.

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
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpuremediate.policy.workflow import NOTIFY_DEFAULT_EVENTS
from gpuremediate.state.decide import UNREADABLE
from gpuremediate.vocab import states

log = logging.getLogger(__name__)

KIND_QUARANTINED = "quarantined"
KIND_REPAIR_FAILED = "repair-failed"
KIND_BREAKER_OPEN = "breaker-open"
KIND_DRAIN_BLOCKED = "drain-blocked"
KIND_DRAIN_STARTED = "drain-started"  # a drain admitted (budget, breaker, gates) and started
KIND_REPAIRED = "repaired"  # a repair done: on to validation
KIND_RETURNED = "returned"  # back in service (healthy again)
KINDS = (KIND_QUARANTINED, KIND_REPAIR_FAILED, KIND_BREAKER_OPEN, KIND_DRAIN_BLOCKED, KIND_DRAIN_STARTED,
         KIND_REPAIRED, KIND_RETURNED)
FORMATS = ("json", "slack")
MAX_NAMED = 20  # nodes named in a message (the breaker's); the rest counted
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
    nodes: tuple[str, ...] = ()  # a fleet-wide one's nodes: those whose faults opened the breaker
    from_state: str = ""  # a transition's states
    to_state: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        """Every node the notification is about."""
        return self.nodes or ((self.node,) if self.node else ())

    def named(self) -> str:
        """``gpu-a, gpu-b`` (at most MAX_NAMED, then how many more), "" for none."""
        names = self.names
        more = f" (+{len(names) - MAX_NAMED} more)" if len(names) > MAX_NAMED else ""
        return ", ".join(names[:MAX_NAMED]) + more


def for_transition(node: str, from_state: str, to_state: str, reason: str, message: str,
                   at: float, events: Collection[str] = NOTIFY_DEFAULT_EVENTS) -> Notification | None:
    """The notification a node transition calls for among ``events`` (default: only what needs a person)."""
    kind = ""
    if to_state == states.QUARANTINED:
        kind = KIND_QUARANTINED
    elif reason == states.REPAIR_FAILED:
        kind = KIND_REPAIR_FAILED
    elif from_state == states.REPAIRING and to_state == states.VALIDATING:
        kind = KIND_REPAIRED
    elif to_state == states.HEALTHY and from_state not in (states.HEALTHY, UNREADABLE):
        kind = KIND_RETURNED
    if kind not in events:
        return None
    return Notification(kind, node, reason, message, at, from_state=from_state, to_state=to_state)


DRAIN_KIND = "drain"  # the record's action kind while draining (loops/drain.py DRAIN_ACTION)


def drain_started(node: str, from_state: str, to_state: str, reason: str, message: str, at: float) -> Notification:
    """A drain admitted and started; ``reason``/``message``: the fault's, as the record says them."""
    return Notification(KIND_DRAIN_STARTED, node, reason, f"drain started: {message}" if message else "drain started",
                        at, from_state=from_state, to_state=to_state)


def render(note: Notification, template: str, cluster: str = "") -> str:
    """``template`` with the notification's named fields (checked when the policy was read)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(note.at))
    values = {"node": note.named(), "from": note.from_state, "to": note.to_state, "reason": note.reason,
              "message": note.message, "cluster": cluster, "kind": note.kind, "time": stamp}
    return template.format_map(values)


def body(note: Notification, fmt: str, cluster: str = "", template: str = "") -> bytes:
    text = render(note, template, cluster) if template else ""
    if fmt == "slack":
        if not text:
            where = f" on {note.named()}" if note.names else ""
            prefix = f"[{cluster}] " if cluster else ""
            text = f"{prefix}gpuremediate: {note.kind}{where} ({note.reason}): {note.message}"
        return json.dumps({"text": text}).encode()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(note.at))
    fields: dict[str, Any] = {"kind": note.kind, "node": note.node, "nodes": list(note.names),
                              "from": note.from_state, "to": note.to_state, "reason": note.reason,
                              "message": note.message, "time": stamp, "cluster": cluster}
    if text:
        fields["text"] = text
    return json.dumps(fields).encode()


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
        events: Collection[str] = NOTIFY_DEFAULT_EVENTS, template: str = "",
    ) -> None:
        """``on_result(kind, result)``: told of each notification's fate (sent, failed, dropped), e.g. a metric.
        ``events``: the kinds posted (others are not queued); ``template``: the message text (render)."""
        if fmt not in FORMATS:
            raise NotifyError(f"notification format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
        check_url(url, "notification webhook")
        self.url, self.fmt, self.cluster = url, fmt, cluster
        self.events, self.template = frozenset(events), template
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

    def wants(self, kind: str) -> bool:
        return kind in self.events

    def notify(self, note: Notification) -> bool:
        """Queue ``note``; False when its kind is not among the events, or (counted) when the queue is full.
        Never blocks."""
        if not self.wants(note.kind):
            return False
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
        data = body(note, self.fmt, self.cluster, self.template)
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
