"""Typed errors for Kubernetes API failures: one exception class per meaning of the HTTP status."""

from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """Base of everything the kube client raises."""


class TransportError(KubeError):
    """The request did not complete: connection refused or reset, TLS failure, or a timeout."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent  # False when the failure happened before the request reached the wire


class ConfigError(KubeError):
    """The kubeconfig or in-cluster configuration is unusable."""


class ApiError(KubeError):
    """The API server answered with an error status; `status` is its Status object (or a synthesized one)."""

    def __init__(self, code: int, status: dict[str, Any], retry_after: float | None = None) -> None:
        self.code = code
        self.status = status
        self.retry_after = retry_after
        super().__init__(f"{code} {self.reason or 'Error'}: {self.message}")

    @property
    def reason(self) -> str:
        return str(self.status.get("reason") or "")

    @property
    def message(self) -> str:
        return str(self.status.get("message") or "")

    @property
    def details(self) -> dict[str, Any]:
        details = self.status.get("details")
        return details if isinstance(details, dict) else {}

    @property
    def causes(self) -> list[dict[str, Any]]:
        causes = self.details.get("causes")
        return causes if isinstance(causes, list) else []


class BadRequest(ApiError):
    """400."""


class Unauthorized(ApiError):
    """401: credentials missing, expired or wrong."""


class Forbidden(ApiError):
    """403: authenticated but RBAC says no."""


class NotFound(ApiError):
    """404."""


class MethodNotAllowed(ApiError):
    """405."""


class NotAcceptable(ApiError):
    """406."""


class Conflict(ApiError):
    """409: stale resourceVersion, failed precondition, or a server-side-apply field conflict."""


class AlreadyExists(Conflict):
    """409 with reason AlreadyExists."""


class Gone(ApiError):
    """410: the resourceVersion or continue token is too old (reason Expired)."""


class UnsupportedMediaType(ApiError):
    """415."""


class Invalid(ApiError):
    """422: validation failed; `causes` names the fields."""


class TooManyRequests(ApiError):
    """429: throttled, or an eviction refused by a PodDisruptionBudget."""


class ServerError(ApiError):
    """5xx."""


class NotLeader(ApiError):
    """A write refused before it left the process: this replica's leader lease is not valid by its own clock.

    Raised by the client's write fence (``KubeClient.write_fence``); ``code`` is 0 because no server answered.
    """

    def __init__(self, method: str, path: str, why: str) -> None:
        super().__init__(0, {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotLeader",
            "code": 0, "message": f"{method} {path} not sent: {why}",
        })
        self.method = method
        self.path = path


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    406: NotAcceptable,
    409: Conflict,
    410: Gone,
    415: UnsupportedMediaType,
    422: Invalid,
    429: TooManyRequests,
}


def parse_retry_after(header: str | None, status: dict[str, Any]) -> float | None:
    """Seconds from the Retry-After header (delta-seconds form) or details.retryAfterSeconds."""
    if header:
        try:
            return max(0.0, float(header.strip()))
        except ValueError:
            pass
    details = status.get("details")
    if isinstance(details, dict):
        seconds = details.get("retryAfterSeconds")
        if isinstance(seconds, int | float) and seconds > 0:
            return float(seconds)
    return None


def status_from_body(code: int, body: bytes, http_reason: str = "") -> dict[str, Any]:
    """The Status object of an error body; a synthesized one when the body is not a JSON Status."""
    try:
        parsed = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, ValueError):
        parsed = None
    if isinstance(parsed, dict) and parsed.get("kind") == "Status":
        return parsed
    text = body.decode("utf-8", "replace").strip()[:500]
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": text or http_reason or f"HTTP {code}",
        "reason": "",
        "code": code,
    }


def error_class(code: int, status: dict[str, Any]) -> type[ApiError]:
    if code == 409 and status.get("reason") == "AlreadyExists":
        return AlreadyExists
    if code >= 500:
        return ServerError
    return _BY_CODE.get(code, ApiError)


def api_error(
    code: int, body: bytes, *, retry_after_header: str | None = None, http_reason: str = ""
) -> ApiError:
    """The typed exception for an HTTP error response."""
    status = status_from_body(code, body, http_reason)
    return error_from_status(code, status, retry_after_header)


def error_from_status(code: int, status: dict[str, Any], retry_after_header: str | None = None) -> ApiError:
    cls = error_class(code, status)
    return cls(code, status, parse_retry_after(retry_after_header, status))
