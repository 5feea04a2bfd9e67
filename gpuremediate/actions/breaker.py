"""Where the circuit breaker lives: ConfigMap ``gpuremediate-breaker`` in the controller's namespace.

It survives controller restarts and leader changes. A person closes it with
``gpuremediate breaker reset`` or by annotating the ConfigMap ``gpuremediate.io/breaker-reset=<anything>``
(the controller sees the annotation, resets, and removes it; a read-only store, the CLI's ``status``, only
reports it).

The same ConfigMap holds the pause switch (data key ``pause`` beside ``state``): ``gpuremediate pause
--reason TEXT`` / ``gpuremediate resume``, or the annotation ``gpuremediate.io/pause=<reason>`` that a tool
(an upgrade pipeline) can set and remove; while either says paused, no new work starts.

The controller's store watches the one ConfigMap (``start``): reads are served from what the watch last
delivered (no GET at steady state) and a person's change is seen as soon as the API server sends it.
It also carries what the detect loop says about its GPU-health source when it cannot read it (data key
``source``: never read since start, or too slow for its interval), so ``gpuremediate status`` shows a banner;
the key is absent while reads succeed.

Writes are resourceVersion-guarded replaces; ``update`` re-reads and applies its change again on a 409, so
several writers (shards) each add their faults without losing another's.
"""

from __future__ import annotations

import getpass
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CONFIGMAPS
from gpuremediate.policy.safety import CircuitBreaker, Pause

log = logging.getLogger(__name__)

BREAKER_CONFIGMAP = "gpuremediate-breaker"
RESET_ANNOTATION = "gpuremediate.io/breaker-reset"
PAUSE_ANNOTATION = "gpuremediate.io/pause"
PAUSE_KEY = "pause"
SOURCE_KEY = "source"
SOURCE_NEVER_READ = "never-read"  # no read of the GPU-health source has succeeded since the controller started
SOURCE_SLOW = "slow"  # a read takes longer than the interval it is asked every
UPDATE_ATTEMPTS = 5  # one write and four re-reads after a 409: more means a writer that never lets go


@dataclass(frozen=True)
class SourceProblem:
    """The detect loop's word on its source, for ``status``: ``problem`` is SOURCE_NEVER_READ or SOURCE_SLOW."""

    problem: str
    detail: str
    since: float
    by: str = ""  # the replica that said it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceProblem:
        """Inverse of to_dict; raises ValueError naming the bad field."""
        try:
            return cls(problem=str(data["problem"]), detail=str(data.get("detail", "")), since=float(data["since"]),
                       by=str(data.get("by", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed source state: {exc}") from exc


class BreakerStore:
    """Shared by the detect loop (trips it through ``update``) and the drain loop (reads ``latest``).

    ``read_only``: a person's command that only reads (``status``): it never writes, so it does not consume
    the reset annotation (``reset_requested`` says one waits for the controller)."""

    def __init__(self, client: KubeClient, namespace: str, *, dry_run: bool = False, read_only: bool = False) -> None:
        self.client = client
        self.namespace = namespace
        self.dry_run = dry_run
        self.read_only = read_only
        self._memory: CircuitBreaker | None = None  # dry-run: never written
        self.on_dry_run_save: Callable[[CircuitBreaker], None] | None = None  # the dry-run journal's
        self._rv: str | None = None
        self._kept: dict[str, Any] = {}  # labels and annotations of the ConfigMap as read (a PUT replaces them)
        self._latest: CircuitBreaker | None = None  # as last read, watched or saved
        self._pause = Pause()  # the data key, as last read or saved
        self._annotation_pause: Pause | None = None  # the tool's annotation, as last read
        self._source: SourceProblem | None = None  # the data key, as last read or saved
        self.reset_requested: str | None = None  # the reset annotation's value, while one is on the ConfigMap
        self._echoes: list[str] = []  # resourceVersions we wrote that the watch has not sent back yet, oldest first
        self._informer: Informer | None = None
        self._lock = threading.RLock()  # _rv and _kept belong to one read-modify-write at a time

    # ---- the watch ---------------------------------------------------------------------------------------

    def start(self) -> BreakerStore:
        """Watch the ConfigMap: from now on ``latest``, ``latest_pause`` and ``refresh`` read no API."""
        if self._informer is not None:
            return self  # a leader that starts its loops again keeps the one watch
        # The object as the server sends it (no transform): a replace must carry every annotation back.
        informer = Informer(self.client, CONFIGMAPS, self.namespace,
                            field_selector=f"metadata.name={BREAKER_CONFIGMAP}", transform=lambda cm: cm)
        informer.add_handler(on_add=self._observe, on_update=lambda _old, new: self._observe(new),
                             on_delete=lambda _cm: self._observe(None))
        self._informer = informer.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._informer is not None:
            self._informer.stop(timeout)

    def refresh(self) -> None:
        """Once a detect cycle: a person's reset or pause is seen. Free while the watch is synced; a GET else.
        A reset the watch saw but could not write (a 409 run out, a shard not settled yet) is written now."""
        if self._informer is None or not self._informer.has_synced():
            self.load()
            return
        with self._lock:
            if self.reset_requested is not None and not self.read_only:
                self._consume_reset()

    def _observe(self, cm: dict[str, Any] | None) -> None:
        """What the watch delivered. An event older than a write of ours (sent before our write's echo)
        must not undo it: while echoes are due, only our latest echo is taken; anything unexpected is
        settled by one GET (the current object)."""
        rv = _rv_of(cm)
        with self._lock:
            if self.dry_run and self._memory is not None:
                return
            if self._echoes:
                if rv not in self._echoes:
                    self.load()  # a relist past our echo, or a stale event: ask the server which
                    return
                del self._echoes[:self._echoes.index(rv) + 1]
                if self._echoes:
                    return  # an echo of an older write of ours: a newer one is on its way
            self._adopt(cm)
            if self.reset_requested is not None and not self.read_only:
                self._consume_reset()

    # ---- reads -------------------------------------------------------------------------------------------

    def latest(self) -> CircuitBreaker:
        """The breaker as last read, watched or saved; loads it once if never."""
        with self._lock:
            return self._latest if self._latest is not None else self.load()

    def latest_pause(self) -> Pause:
        """The pause as last read: the annotation's when a tool set one, else the key's."""
        with self._lock:
            if self._latest is None:
                self.load()
            return self._annotation_pause or self._pause

    def latest_source(self) -> SourceProblem | None:
        """What the controller last said about its GPU-health source (None: it reads it)."""
        with self._lock:
            if self._latest is None:
                self.load()
            return self._source

    def holds_in_flight(self, in_flight: str) -> str:
        """Why a step under way waits ("" when it goes on): paused with ``[pause] in_flight = "hold"``."""
        pause = self.latest_pause()
        if not pause.paused or in_flight != "hold":
            return ""
        return f"paused by {pause.by or '?'}: {pause.reason or '-'} (in_flight = hold)"

    def load(self) -> CircuitBreaker:
        """GET the ConfigMap (a writing store also consumes a reset annotation it finds)."""
        with self._lock:
            if self.dry_run and self._memory is not None:
                return self._memory
            self._read()
            if self.reset_requested is not None and not self.read_only:
                self._consume_reset()
            assert self._latest is not None
            return self._latest

    def _read(self) -> None:
        try:
            cm: dict[str, Any] | None = self.client.get(CONFIGMAPS, BREAKER_CONFIGMAP, self.namespace)
        except errors.NotFound:
            cm = None
        self._echoes.clear()  # the server's current object: every write of ours is in it
        self._adopt(cm)

    def _adopt(self, cm: dict[str, Any] | None) -> None:
        if cm is None:
            self._rv, self._kept, self.reset_requested = None, {}, None
            self._pause, self._annotation_pause, self._source = Pause(), None, None
            self._latest = CircuitBreaker()
            return
        self._rv = _rv_of(cm)
        self._kept = _kept_metadata(cm)
        self._pause = _parse_pause(cm)
        self._annotation_pause = _annotation_pause(cm)
        self._source = _parse_source(cm)
        requested = (cm["metadata"].get("annotations") or {}).get(RESET_ANNOTATION)
        self.reset_requested = None if requested is None else str(requested)
        self._latest = self._parse(cm)

    def _parse(self, cm: dict[str, Any]) -> CircuitBreaker:
        text = (cm.get("data") or {}).get("state", "{}")
        try:
            return CircuitBreaker.from_dict(json.loads(text))
        except (ValueError, TypeError) as exc:
            # Unreadable: the safe side is "open" (start nothing new) until a person resets it.
            log.error("circuit breaker state unreadable; treating it as open", extra={"error": str(exc)})
            return CircuitBreaker(open=True, opened_at=time.time(), reason=f"breaker state unreadable: {exc}")

    # ---- writes ------------------------------------------------------------------------------------------

    def update(self, change: Callable[[CircuitBreaker], CircuitBreaker]) -> tuple[CircuitBreaker, CircuitBreaker]:
        """Apply ``change`` to the current breaker and save it; on a 409 (another writer was first) read
        the ConfigMap again and apply ``change`` to what it holds now. Returns (before, after) of the write
        that stuck; raises Conflict after UPDATE_ATTEMPTS writes."""
        with self._lock:
            for attempt in range(UPDATE_ATTEMPTS):
                # Every write drops the reset annotation (``_kept`` leaves it out): a pending reset is applied
                # in the same write, or the write would erase a person's reset without doing it.
                current = self.latest()
                before = self._with_pending_reset(current)
                after = change(before)
                if after == current and self.reset_requested is None:
                    return before, after  # nothing to write
                try:
                    self.save(after)
                    return before, after
                except errors.Conflict:
                    if attempt == UPDATE_ATTEMPTS - 1:
                        raise
                    self._read()  # the winner's version; its reset annotation is ours to apply below
        raise AssertionError("unreachable")

    def _with_pending_reset(self, breaker: CircuitBreaker) -> CircuitBreaker:
        if self.reset_requested is None or self.read_only:
            return breaker
        return breaker.reset(by=f"annotation {RESET_ANNOTATION}={self.reset_requested}", now=time.time())

    def _consume_reset(self) -> None:
        """The controller applies a person's reset annotation and removes it (``_kept`` leaves it out)."""
        try:
            self.update(lambda breaker: breaker)  # the pending reset is applied by the write itself
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("could not apply the breaker reset annotation; retried on the next read",
                        extra={"error": str(exc)})

    def save(self, breaker: CircuitBreaker) -> None:
        if self.read_only:
            raise RuntimeError("a read-only breaker store does not write")
        with self._lock:
            self._save(breaker)
            self._latest = breaker

    def _save(self, breaker: CircuitBreaker) -> None:
        if self.dry_run:
            self._memory = breaker
            if self.on_dry_run_save is not None:
                self.on_dry_run_save(breaker)
            self.reset_requested = None
            return
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": BREAKER_CONFIGMAP, "namespace": self.namespace, **self._kept},
            "data": {"state": json.dumps(breaker.to_dict(), sort_keys=True),
                     PAUSE_KEY: json.dumps(self._pause.to_dict(), sort_keys=True),
                     **({SOURCE_KEY: json.dumps(self._source.to_dict(), sort_keys=True)} if self._source else {})},
        }
        if self._rv:
            body["metadata"]["resourceVersion"] = self._rv
            result = self.client.replace(CONFIGMAPS, BREAKER_CONFIGMAP, body, self.namespace)
        else:
            try:
                result = self.client.create(CONFIGMAPS, body, self.namespace)
            except errors.AlreadyExists:
                raise errors.Conflict(409, {"reason": "Conflict", "message": "breaker created concurrently"}) from None
        self._rv = _rv_of(result)
        self._kept = _kept_metadata(result)
        self.reset_requested = None  # the body carried no reset annotation
        if self._informer is not None:
            self._echoes.append(self._rv)

    def reset(self, by: str | None = None) -> CircuitBreaker:
        """A person closes the breaker (the CLI)."""
        with self._lock:
            self._read()
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

    def set_source(self, problem: SourceProblem | None) -> None:
        """Say (or, with None, stop saying) that the GPU-health source cannot be read; the breaker's state and
        the pause are written back as they are. A 409 reads the ConfigMap again and writes once more."""
        with self._lock:
            for attempt in range(UPDATE_ATTEMPTS):
                breaker = self.latest()
                if self._source == problem:
                    return
                before, self._source = self._source, problem
                try:
                    self.save(self._with_pending_reset(breaker))
                    return
                except BaseException as exc:
                    self._source = before  # as the server still has it
                    if not isinstance(exc, errors.Conflict) or attempt == UPDATE_ATTEMPTS - 1:
                        raise
                self._read()


def _parse_source(cm: dict[str, Any]) -> SourceProblem | None:
    text = (cm.get("data") or {}).get(SOURCE_KEY)
    if text is None:
        return None
    try:
        return SourceProblem.from_dict(json.loads(text))
    except (ValueError, TypeError, AttributeError) as exc:
        return SourceProblem(SOURCE_NEVER_READ, f"source state unreadable: {exc}", 0.0)


def _rv_of(cm: dict[str, Any] | None) -> str:
    return str(((cm or {}).get("metadata") or {}).get("resourceVersion") or "")


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
