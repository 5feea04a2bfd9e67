"""KubeClient: the raw Kubernetes REST verbs over http.client, with retries, rate limiting and typed errors."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from gpuremediate import __version__
from gpuremediate.kube import errors, resources
from gpuremediate.kube.config import ClusterConfig
from gpuremediate.kube.resources import PODS, Resource
from gpuremediate.kube.server_time import ServerTime
from gpuremediate.kube.transport import ConnectionPool, RateLimiter
from gpuremediate.kube.watch import WatchStream

log = logging.getLogger(__name__)

PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}
DEFAULT_FIELD_MANAGER = "gpuremediate"

# How a request may be retried.
READ = "read"  # GET, LIST, watch start: always safe
IDEMPOTENT = "idempotent"  # a mutation that cannot apply twice (conditional PUT/DELETE, apply patch)
MUTATION = "mutation"  # retried only when it surely did not reach the server
EVICTION = "eviction"  # a mutation whose 429 is an answer for the caller, never retried here

# Called with (method, path) before every attempt of every request that is not a GET; raises to refuse it
# (errors.NotLeader). The controller installs its leader elector's fence here when it runs leader election.
WriteFence = Callable[[str, str], None]

# Called after every attempt that went on the wire, with (method, seconds from sending to the response's headers or
# the failure, seconds the attempt waited on the client's rate limiter first): as client-go's
# rest_client_request_duration_seconds and rest_client_rate_limiter_duration_seconds. Must not raise.
RequestObserver = Callable[[str, float, float], None]


@dataclass
class _Reply:
    status: int
    body: bytes
    headers: http.client.HTTPMessage


class KubeClient:
    def __init__(
        self,
        config: ClusterConfig,
        qps: float = 20.0,
        burst: int = 40,
        timeout: float = 30.0,
        user_agent: str = f"gpuremediate/{__version__}",
        *,
        max_retries: int = 5,
        backoff_base: float = 0.2,
        backoff_cap: float = 10.0,
        retry_after_cap: float = 30.0,
        watch_idle_timeout: float = 330.0,
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.user_agent = user_agent
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.retry_after_cap = retry_after_cap
        self.watch_idle_timeout = watch_idle_timeout
        self.limiter = RateLimiter(qps, burst)
        self.pool = ConnectionPool(config, timeout)
        self.server_time = ServerTime()  # the API server's clock, from its responses' Date
        self._discovered: dict[str, dict[str, Resource]] = {}
        self._discovery_lock = threading.Lock()
        self.write_fence: WriteFence | None = None
        self.observe_request: RequestObserver | None = None
        self._lane = threading.local()  # .background: this thread's requests yield to the others' (RateLimiter)

    @contextlib.contextmanager
    def background(self) -> Iterator[None]:
        """This thread's requests go at background priority while inside: they take a token only when no
        foreground request waits for one (reports of actions: Events, the GPURemediation condition)."""
        before = getattr(self._lane, "background", False)
        self._lane.background = True
        try:
            yield
        finally:
            self._lane.background = before

    def close(self) -> None:
        self.pool.close()

    # ---- verbs -------------------------------------------------------------------------------------------

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self._json("GET", res.path(namespace, name), retry=READ)

    def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        each: Callable[[dict[str, Any]], Any] | None = None,
        on_page: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """All pages, followed through `continue`; an expired continue token restarts as one unpaged list.

        ``each`` maps every item as its page arrives (the result's items are what it returns), so a large list
        is held whole only in that form: 20,000 Nodes as a kubelet writes them are hundreds of MB parsed.
        ``on_page`` is called after each page (progress, for a caller waiting on a long list)."""
        def mapped(page: dict[str, Any]) -> list[Any]:
            items = page.get("items") or []
            if on_page is not None:
                on_page()
            return [each(item) for item in items] if each is not None else list(items)

        page = self.list_page(res, namespace, label_selector=label_selector, field_selector=field_selector,
                              limit=limit)
        items = mapped(page)
        result = {k: v for k, v in page.items() if k != "items"}
        token = (page.get("metadata") or {}).get("continue")
        while token:
            try:
                page = self.list_page(res, namespace, label_selector=label_selector,
                                      field_selector=field_selector, limit=limit, continue_=token)
            except errors.Gone:
                log.info("continue token for %s expired; listing again without paging", res.plural)
                page = self.list_page(res, namespace, label_selector=label_selector, field_selector=field_selector)
                return {**{k: v for k, v in page.items() if k != "items"}, "items": mapped(page)}
            items.extend(mapped(page))
            token = (page.get("metadata") or {}).get("continue")
        result["metadata"] = {k: v for k, v in (result.get("metadata") or {}).items()
                              if k not in ("continue", "remainingItemCount")}
        result["items"] = items
        return result

    def list_page(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> dict[str, Any]:
        query = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit,
            "continue": continue_,
            "resourceVersion": resource_version,
            "resourceVersionMatch": resource_version_match,
        }
        return self._json("GET", res.path(namespace), query=query, retry=READ)

    def create(
        self, res: Resource, body: dict[str, Any], namespace: str | None = None, *, dry_run: bool = False
    ) -> dict[str, Any]:
        namespace = self._namespace_for(res, body, namespace)
        return self._json("POST", res.path(namespace), query=_dry(dry_run), body=body, retry=MUTATION)

    def replace(
        self,
        res: Resource,
        name: str,
        body: dict[str, Any],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        namespace = self._namespace_for(res, body, namespace)
        conditional = bool((body.get("metadata") or {}).get("resourceVersion"))
        return self._json("PUT", res.path(namespace, name, subresource), query=_dry(dry_run), body=body,
                          retry=IDEMPOTENT if conditional else MUTATION)

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        content_type = PATCH_CONTENT_TYPES.get(patch_type)
        if content_type is None:
            raise ValueError(f"patch_type {patch_type!r} is not one of {', '.join(PATCH_CONTENT_TYPES)}")
        if patch_type == "json" and not isinstance(patch, list):
            raise ValueError("a JSON patch must be a list of operations")
        if force is not None and patch_type != "apply":
            raise ValueError("force is only allowed with patch_type='apply'")
        if patch_type == "apply":
            field_manager = field_manager or DEFAULT_FIELD_MANAGER
        query: dict[str, Any] = {**_dry(dry_run), "fieldManager": field_manager}
        if force is not None:
            query["force"] = "true" if force else "false"
        return self._json("PATCH", res.path(namespace, name, subresource), query=query, body=patch,
                          content_type=content_type, retry=_patch_retry(patch_type, patch))

    def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        preconditions: dict[str, str] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            if propagation_policy not in ("Orphan", "Background", "Foreground"):
                raise ValueError(f"propagation_policy {propagation_policy!r} is not Orphan, Background or Foreground")
            options["propagationPolicy"] = propagation_policy
        if preconditions:
            unknown = set(preconditions) - {"uid", "resourceVersion"}
            if unknown:
                raise ValueError(f"unknown delete preconditions {sorted(unknown)}: only uid and resourceVersion")
            options["preconditions"] = dict(preconditions)
        if dry_run:
            options["dryRun"] = ["All"]
        return self._json("DELETE", res.path(namespace, name), query=_dry(dry_run), body=options,
                          retry=IDEMPOTENT if preconditions else MUTATION)

    def evict(
        self, pod_name: str, namespace: str, *, grace_period_seconds: int | None = None, dry_run: bool = False
    ) -> dict[str, Any]:
        """policy/v1 Eviction. A PodDisruptionBudget refusal raises TooManyRequests at once (no retry here)."""
        delete_options: dict[str, Any] = {}
        if grace_period_seconds is not None:
            delete_options["gracePeriodSeconds"] = grace_period_seconds
        if dry_run:
            delete_options["dryRun"] = ["All"]
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod_name, "namespace": namespace},
        }
        if delete_options:
            body["deleteOptions"] = delete_options
        return self._json("POST", PODS.path(namespace, pod_name, "eviction"), query=_dry(dry_run), body=body,
                          retry=EVICTION)

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
    ) -> WatchStream:
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true" if allow_bookmarks else None,
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "timeoutSeconds": timeout_seconds,
        }
        idle = (timeout_seconds + self.timeout) if timeout_seconds else self.watch_idle_timeout
        conn, response = self._send("GET", res.path(namespace), query=query, retry=READ, stream_timeout=idle)
        return WatchStream(conn, response)

    def resolve(self, api_version: str, kind: str, *, fresh: bool = False) -> Resource:
        """The Resource of apiVersion/kind: built-ins statically, anything else by discovery (cached; ``fresh``
        asks the server again, for a kind a CRD may have added to its group since)."""
        known = resources.builtin(api_version, kind)
        if known is not None:
            return known
        with self._discovery_lock:
            cached = None if fresh else self._discovered.get(api_version, {}).get(kind)
            if cached is not None:
                return cached
            found = self._discover(api_version)
        if kind not in found:
            raise errors.NotFound(404, {
                "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
                "message": f"the server has no kind {kind!r} in {api_version}",
                "details": {"group": resources.split_api_version(api_version)[0], "kind": kind},
            })
        return found[kind]

    def _discover(self, api_version: str) -> dict[str, Resource]:
        body = self._json("GET", resources.discovery_path(api_version), retry=READ)
        found = resources.from_api_resource_list(api_version, body)
        self._discovered[api_version] = found
        return found

    # ---- plumbing ----------------------------------------------------------------------------------------

    @staticmethod
    def _namespace_for(res: Resource, body: dict[str, Any], namespace: str | None) -> str | None:
        if namespace or not res.namespaced:
            return namespace
        from_body = (body.get("metadata") or {}).get("namespace")
        if not from_body:
            raise ValueError(f"{res.kind} is namespaced: pass namespace= or set metadata.namespace")
        return str(from_body)

    def _json(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry: str,
    ) -> dict[str, Any]:
        reply = self._call(method, path, query=query, body=body, content_type=content_type, retry=retry)
        try:
            parsed = json.loads(reply.body) if reply.body else {}
        except ValueError as exc:
            raise errors.TransportError(f"{method} {path}: the response is not JSON: {reply.body[:200]!r}") from exc
        if not isinstance(parsed, dict):
            raise errors.TransportError(f"{method} {path}: the response is not a JSON object")
        return parsed

    def _call(
        self, method: str, path: str, *, query: dict[str, Any] | None, body: Any, content_type: str, retry: str
    ) -> _Reply:
        conn, response = self._send(method, path, query=query, body=body, content_type=content_type, retry=retry)
        return self._finish(conn, response)

    def _finish(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> _Reply:
        try:
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise errors.TransportError(f"reading the response failed: {exc!r}") from exc
        if response.will_close:
            conn.close()
        else:
            self.pool.give_back(conn)
        self.server_time.note(response.headers.get("Date"))
        return _Reply(response.status, data, response.headers)

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry: str,
        stream_timeout: float | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send with retries; returns the connection and a 2xx response whose body is still unread."""
        url = self.config.path_prefix + path + _query_string(query)
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        attempt = 0
        refreshed_credentials = False
        while True:
            try:
                conn, response = self._attempt(method, path, url, payload, content_type, stream_timeout)
            except errors.TransportError as exc:
                if not self._may_retry_transport(exc, retry, attempt):
                    raise
                delay = self._backoff(attempt)
                log.debug("%s %s: %s; retrying in %.2fs", method, url, exc, delay)
            else:
                if response.status < 300:
                    return conn, response
                error = self._error(conn, response)
                if isinstance(error, errors.Unauthorized) and not refreshed_credentials:
                    refreshed_credentials = True
                    self.config.on_unauthorized()
                    continue
                if not self._may_retry_status(error, retry, attempt):
                    raise error
                delay = max(self._backoff(attempt), min(error.retry_after or 0.0, self.retry_after_cap))
                log.debug("%s %s: %s; retrying in %.2fs", method, url, error, delay)
            attempt += 1
            time.sleep(delay)

    def _attempt(
        self, method: str, path: str, url: str, payload: bytes | None, content_type: str,
        stream_timeout: float | None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        queued = time.monotonic()
        self.limiter.acquire(background=getattr(self._lane, "background", False))
        fence = self.write_fence
        if fence is not None and method != "GET":
            fence(method, path)  # last check before the wire: the rate limiter or a retry may have waited
        sent = time.monotonic()
        try:
            return self._exchange(method, url, payload, content_type, stream_timeout)
        finally:
            observe = self.observe_request
            if observe is not None:
                observe(method, time.monotonic() - sent, sent - queued)

    def _exchange(
        self, method: str, url: str, payload: bytes | None, content_type: str, stream_timeout: float | None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        auth = self.config.authorization()
        if auth:
            headers["Authorization"] = auth
        if payload is not None:
            headers["Content-Type"] = content_type
        conn = self.pool.take()
        try:
            conn.request(method, url, body=payload, headers=headers)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise errors.TransportError(f"{method} {url}: sending failed: {exc!r}", sent=False) from exc
        try:
            if stream_timeout is not None and conn.sock is not None:
                conn.sock.settimeout(stream_timeout)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise errors.TransportError(f"{method} {url}: no response: {exc!r}") from exc
        return conn, response

    def _error(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> errors.ApiError:
        reply = self._finish(conn, response)
        return errors.api_error(reply.status, reply.body, retry_after_header=reply.headers.get("Retry-After"),
                                http_reason=response.reason)

    def _may_retry_transport(self, exc: errors.TransportError, retry: str, attempt: int) -> bool:
        if attempt >= self.max_retries:
            return False
        return retry in (READ, IDEMPOTENT) or not exc.sent

    def _may_retry_status(self, error: errors.ApiError, retry: str, attempt: int) -> bool:
        if attempt >= self.max_retries:
            return False
        if error.code == 429:
            return retry != EVICTION
        if error.code >= 500:
            return retry in (READ, IDEMPOTENT)
        return False

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self.backoff_cap, self.backoff_base * (2**attempt))
        return random.uniform(ceiling / 2, ceiling)


def _dry(dry_run: bool) -> dict[str, Any]:
    return {"dryRun": "All"} if dry_run else {}


def _patch_retry(patch_type: str, patch: Any) -> str:
    if patch_type == "apply":
        return IDEMPOTENT
    conditional = isinstance(patch, dict) and bool((patch.get("metadata") or {}).get("resourceVersion"))
    if patch_type in ("merge", "strategic") and conditional:
        return IDEMPOTENT  # the resourceVersion in the patch acts as a precondition
    return MUTATION


def _query_string(query: dict[str, Any] | None) -> str:
    if not query:
        return ""
    pairs = [(k, _query_value(v)) for k, v in query.items() if v is not None and v != ""]
    return "?" + urlencode(pairs, quote_via=quote, safe="") if pairs else ""


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
