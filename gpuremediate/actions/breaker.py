"""Where the circuit breaker lives: ConfigMap ``gpuremediate-breaker`` in the controller's namespace.

It survives controller restarts and leader changes. A person closes it with
``gpuremediate breaker reset`` or by annotating the ConfigMap ``gpuremediate.io/breaker-reset=<anything>``
(the controller sees the annotation, resets, and removes it).

The same ConfigMap holds the pause switch (data key ``pause`` beside ``state``): ``gpuremediate pause
--reason TEXT`` / ``gpuremediate resume``, or the annotation ``gpuremediate.io/pause=<reason>`` that a tool
(an upgrade pipeline) can set and remove; while either says paused, no new work starts.
"""

from __future__ import annotations

import getpass
import json
import logging
import threading
import time
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CONFIGMAPS
from gpuremediate.policy.safety import CircuitBreaker, Pause

log = logging.getLogger(__name__)

BREAKER_CONFIGMAP = "gpuremediate-breaker"
RESET_ANNOTATION = "gpuremediate.io/breaker-reset"
PAUSE_ANNOTATION = "gpuremediate.io/pause"
PAUSE_KEY = "pause"


class BreakerStore:
    """Shared by the detect loop (loads it every cycle, trips it) and the drain loop (reads ``latest``)."""

    def __init__(self, client: KubeClient, namespace: str, *, dry_run: bool = False) -> None:
        self.client = client
        self.namespace = namespace
        self.dry_run = dry_run
        self._memory: CircuitBreaker | None = None  # dry-run: never written
        self._rv: str | None = None
        self._kept: dict[str, Any] = {}  # labels and annotations of the ConfigMap as read (a PUT replaces them)
        self._latest: CircuitBreaker | None = None  # as last loaded or saved
        self._pause = Pause()  # the data key, as last loaded or saved
        self._annotation_pause: Pause | None = None  # the tool's annotation, as last loaded
        self._lock = threading.RLock()  # _rv and _kept belong to one read-modify-write at a time

    def latest(self) -> CircuitBreaker:
        """The breaker as last loaded or saved (the detect loop reloads it every cycle); loads it once if never."""
        with self._lock:
            return self._latest if self._latest is not None else self.load()

    def latest_pause(self) -> Pause:
        """The pause as last loaded (every detect cycle): the annotation's when a tool set one, else the key's."""
        with self._lock:
            if self._latest is None:
                self.load()
            return self._annotation_pause or self._pause

    def holds_in_flight(self, in_flight: str) -> str:
        """Why a step under way waits ("" when it goes on): paused with ``[pause] in_flight = "hold"``."""
        pause = self.latest_pause()
        if not pause.paused or in_flight != "hold":
            return ""
        return f"paused by {pause.by or '?'}: {pause.reason or '-'} (in_flight = hold)"

    def load(self) -> CircuitBreaker:
        with self._lock:
            self._latest = self._load()
            return self._latest

    def _load(self) -> CircuitBreaker:
        if self.dry_run and self._memory is not None:
            return self._memory
        try:
            cm = self.client.get(CONFIGMAPS, BREAKER_CONFIGMAP, self.namespace)
        except errors.NotFound:
            self._rv = None
            self._kept = {}
            self._pause, self._annotation_pause = Pause(), None
            return CircuitBreaker()
        self._rv = str(cm["metadata"].get("resourceVersion", ""))
        self._kept = _kept_metadata(cm)
        self._pause = _parse_pause(cm)
        self._annotation_pause = _annotation_pause(cm)
        breaker = self._parse(cm)
        requested = (cm["metadata"].get("annotations") or {}).get(RESET_ANNOTATION)
        if requested is not None:
            breaker = breaker.reset(by=f"annotation {RESET_ANNOTATION}={requested}", now=time.time())
            self.save(breaker)
        return breaker

    def _parse(self, cm: dict[str, Any]) -> CircuitBreaker:
        text = (cm.get("data") or {}).get("state", "{}")
        try:
            return CircuitBreaker.from_dict(json.loads(text))
        except (ValueError, TypeError) as exc:
            # Unreadable: the safe side is "open" (start nothing new) until a person resets it.
            log.error("circuit breaker state unreadable; treating it as open", extra={"error": str(exc)})
            return CircuitBreaker(open=True, opened_at=time.time(), reason=f"breaker state unreadable: {exc}")

    def save(self, breaker: CircuitBreaker) -> None:
        with self._lock:
            self._save(breaker)
            self._latest = breaker

    def _save(self, breaker: CircuitBreaker) -> None:
        if self.dry_run:
            self._memory = breaker
            return
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": BREAKER_CONFIGMAP, "namespace": self.namespace, **self._kept},
            "data": {"state": json.dumps(breaker.to_dict(), sort_keys=True),
                     PAUSE_KEY: json.dumps(self._pause.to_dict(), sort_keys=True)},
        }
        if self._rv:
            body["metadata"]["resourceVersion"] = self._rv
            result = self.client.replace(CONFIGMAPS, BREAKER_CONFIGMAP, body, self.namespace)
        else:
            try:
                result = self.client.create(CONFIGMAPS, body, self.namespace)
            except errors.AlreadyExists:
                raise errors.Conflict(409, {"reason": "Conflict", "message": "breaker created concurrently"}) from None
        self._rv = str(result["metadata"].get("resourceVersion", ""))
        self._kept = _kept_metadata(result)

    def reset(self, by: str | None = None) -> CircuitBreaker:
        """A person closes the breaker (the CLI)."""
        with self._lock:
            self.load()
            breaker = CircuitBreaker().reset(by=by or getpass.getuser(), now=time.time())
            self.save(breaker)
            return breaker

    def set_pause(self, pause: Pause) -> Pause:
        """A person pauses or resumes (the CLI); the breaker's state is written back as read."""
        with self._lock:
            breaker = self.load()
            self._pause = pause
            self.save(breaker)
            return self.latest_pause()


def _parse_pause(cm: dict[str, Any]) -> Pause:
    text = (cm.get("data") or {}).get(PAUSE_KEY)
    if text is None:
        return Pause()
    try:
        return Pause.from_dict(json.loads(text))
    except (ValueError, TypeError, AttributeError) as exc:
        # Unreadable: the safe side is paused, until a person resumes (which writes a good value).
        log.error("pause state unreadable; treating it as paused", extra={"error": str(exc)})
        return Pause(paused=True, by="?", reason=f"pause state unreadable: {exc}")


def _annotation_pause(cm: dict[str, Any]) -> Pause | None:
    reason = ((cm.get("metadata") or {}).get("annotations") or {}).get(PAUSE_ANNOTATION)
    if reason is None:
        return None
    return Pause(paused=True, by=f"annotation {PAUSE_ANNOTATION}", reason=str(reason) or "-")


def _kept_metadata(cm: dict[str, Any]) -> dict[str, Any]:
    """What a replace must carry over: labels, and annotations except the reset request (consumed)."""
    meta = cm.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != RESET_ANNOTATION}
    kept: dict[str, Any] = {"annotations": annotations}
    if meta.get("labels"):
        kept["labels"] = dict(meta["labels"])
    return kept
