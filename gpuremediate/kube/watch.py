"""Watch events, the stream that yields them, and a resumable watch loop."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpuremediate.kube import errors

if TYPE_CHECKING:
    from gpuremediate.kube.resources import Resource

log = logging.getLogger(__name__)

EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")


def parse_event(line: bytes) -> WatchEvent:
    """One line of a watch stream; an ERROR event raises its Status as a typed error (410 → Gone)."""
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise errors.TransportError(f"watch stream sent a line that is not JSON: {line[:200]!r}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("object"), dict):
        raise errors.TransportError(f"watch stream sent a malformed event: {line[:200]!r}")
    kind = raw.get("type")
    obj: dict[str, Any] = raw["object"]
    if kind == "ERROR":
        code = obj.get("code")
        raise errors.error_from_status(code if isinstance(code, int) else 500, obj)
    if kind not in EVENT_TYPES:
        raise errors.TransportError(f"watch stream sent an unknown event type {kind!r}")
    return WatchEvent(str(kind), obj)


class WatchStream(Iterator[WatchEvent]):
    """One watch response, read line by line; close() from another thread ends it."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._response = response
        self._closed = threading.Event()
        self._stopped = False

    def __iter__(self) -> WatchStream:
        return self

    def __next__(self) -> WatchEvent:
        while True:
            if self._closed.is_set():
                raise StopIteration
            try:
                line = self._response.readline()
            except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
                # AttributeError: http.client trips over its own fp when another thread closed the stream
                self.close()
                if self._stopped:
                    raise StopIteration from None
                raise errors.TransportError(f"watch stream broke: {exc!r}") from exc
            if not line:
                self.close()
                raise StopIteration
            if line.strip():
                try:
                    return parse_event(line)
                except errors.KubeError:
                    self.close()
                    raise

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()

    def stop(self) -> None:
        """close() for the owner that wants the iteration to end quietly."""
        self._stopped = True
        self.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class WatchSource(Protocol):
    """What resumable_watch needs of a client: start one watch. This module owns the interface and
    KubeClient implements it, so watch.py does not import the client (client.py imports watch.py)."""

    def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
    ) -> WatchStream: ...


def retry_delay(error_backoff: float, failures: int) -> float:
    """Seconds to wait after `failures` failed list or watch starts in a row: doubling, at most 30 s."""
    return min(30.0, error_backoff * 2 ** min(failures, 5))


def resumable_watch(
    client: WatchSource,
    res: Resource,
    namespace: str | None = None,
    *,
    resource_version: str,
    on_event: Callable[[WatchEvent], None],
    relist: Callable[[], str],
    stopped: threading.Event,
    label_selector: str | None = None,
    field_selector: str | None = None,
    timeout_seconds: int = 300,
    on_stream: Callable[[WatchStream | None], None] | None = None,
    error_backoff: float = 1.0,
) -> None:
    """Watch until `stopped` is set: each new stream resumes from the last resourceVersion seen
    (bookmarks included); a 410 Gone calls relist(), which returns the resourceVersion to watch from."""
    rv = resource_version
    failures = 0
    while not stopped.is_set():
        try:
            stream = client.watch(
                res, namespace, resource_version=rv, label_selector=label_selector,
                field_selector=field_selector, timeout_seconds=timeout_seconds,
            )
        except errors.Gone:
            rv = relist()
            continue
        except (errors.ApiError, errors.TransportError) as exc:
            failures += 1
            log.warning("watch of %s failed to start: %s", res.plural, exc)
            stopped.wait(retry_delay(error_backoff, failures))
            continue
        if on_stream:
            on_stream(stream)
        try:
            for event in stream:
                failures = 0
                if event.resource_version:
                    rv = event.resource_version
                if event.type != "BOOKMARK":
                    on_event(event)
                if stopped.is_set():
                    break
        except errors.Gone:
            rv = relist()
        except (errors.ApiError, errors.TransportError) as exc:
            if not stopped.is_set():
                log.warning("watch of %s broke: %s", res.plural, exc)
                stopped.wait(error_backoff)
        finally:
            stream.close()
            if on_stream:
                on_stream(None)
