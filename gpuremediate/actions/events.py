"""Kubernetes Events on Nodes: one per transition and per change of blocked reason; and on namespaced objects (a pod
a GPU fault moved, its Job: ``object_event``), in the object's namespace.

Node events live in the ``default`` namespace with an involvedObject that has no namespace (a real
API server rejects any other combination, see kube-apiserver exchange 26). A repeat of the same
(node, reason, message) within ``aggregate_s`` bumps ``count`` on the existing Event instead of
creating another, as client-go's recorder does.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import EVENTS
from gpuremediate.obs.event_queue import COMPONENT

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass(frozen=True)
class ObjectRef:
    """A namespaced object an Event is about (the Event lives in its namespace)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return self.uid or f"{self.api_version}/{self.kind}/{self.namespace}/{self.name}"

    def involved(self) -> dict[str, str]:
        found = {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name}
        return {**found, "uid": self.uid} if self.uid else found


@dataclass
class _Seen:
    name: str
    count: int
    first: float
    last: float


class EventRecorder:
    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str = "default",
        host: str | None = None,
        dry_run: bool = False,
        aggregate_s: float = 600.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.host = host or os.environ.get("POD_NAME", "") or os.uname().nodename
        self.dry_run = dry_run
        self.aggregate_s = aggregate_s
        self._seen: dict[tuple[str, str, str], _Seen] = {}
        self._lock = threading.Lock()
        # Set by the controller: the Event is written off the caller's thread, after the actions (obs.event_queue
        # EventQueue.submit at background priority); it carries the time it was asked for. None: written here.
        self.defer: Callable[[Callable[[], None]], object] | None = None

    def node_event(self, node: str, reason: str, message: str, type_: str = NORMAL, uid: str = "") -> None:
        """Record an Event about a Node. Never raises: an event is not worth failing a reconcile."""
        if self.dry_run:
            message = f"(dry-run) {message}"
        log.info("event", extra={"node": node, "reason": reason, "event_type": type_, "event_message": message})
        now = time.time()
        if self.defer is not None:
            self.defer(lambda: self._write(node, reason, message, type_, uid, now))
        else:
            self._write(node, reason, message, type_, uid, now)

    def object_event(self, ref: ObjectRef, reason: str, message: str, type_: str = NORMAL) -> None:
        """An Event about a namespaced object (not aggregated: callers say each thing once). Never raises."""
        log.info("event", extra={"object": f"{ref.kind} {ref.namespace}/{ref.name}", "reason": reason,
                                 "event_type": type_, "event_message": message})
        now = time.time()
        if self.defer is not None:
            self.defer(lambda: self._write_object(ref, reason, message, type_, now))
        else:
            self._write_object(ref, reason, message, type_, now)

    def _write_object(self, ref: ObjectRef, reason: str, message: str, type_: str, now: float) -> None:
        body = self._body(f"{ref.name}.{secrets.token_hex(8)}", ref.namespace, ref.involved(), reason, message,
                          type_, now)
        try:
            self.client.create(EVENTS, body, ref.namespace)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("could not record event", extra={"object": f"{ref.kind} {ref.namespace}/{ref.name}",
                                                         "reason": reason, "error": str(exc)})

    def _body(self, name: str, namespace: str, involved: dict[str, str], reason: str, message: str, type_: str,
              now: float) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": COMPONENT, "host": self.host},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.host,
            "firstTimestamp": _rfc3339(now),
            "lastTimestamp": _rfc3339(now),
            "count": 1,
        }

    def _write(self, node: str, reason: str, message: str, type_: str, uid: str, now: float) -> None:
        key = (node, reason, message)
        with self._lock:
            seen = self._seen.get(key)
        try:
            if seen and now - seen.last < self.aggregate_s:
                self._bump(seen, now)
            else:
                self._create(key, node, uid, reason, message, type_, now)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("could not record event", extra={"node": node, "reason": reason, "error": str(exc)})

    def _create(
        self, key: tuple[str, str, str], node: str, uid: str, reason: str, message: str, type_: str, now: float
    ) -> None:
        name = f"{node}.{secrets.token_hex(8)}"
        involved = {"apiVersion": "v1", "kind": "Node", "name": node}
        if uid:
            involved["uid"] = uid
        self.client.create(EVENTS, self._body(name, self.namespace, involved, reason, message, type_, now),
                           self.namespace)
        with self._lock:
            self._seen[key] = _Seen(name, 1, now, now)
            self._forget_old(now)

    def _bump(self, seen: _Seen, now: float) -> None:
        seen.count += 1
        seen.last = now
        patch = {"count": seen.count, "lastTimestamp": _rfc3339(now)}
        try:
            self.client.patch(EVENTS, seen.name, patch, self.namespace)
        except errors.NotFound:
            seen.last = 0.0  # the event was garbage-collected; the next one creates a fresh Event

    def _forget_old(self, now: float) -> None:
        stale = [k for k, s in self._seen.items() if now - s.last > self.aggregate_s]
        for k in stale:
            del self._seen[k]
