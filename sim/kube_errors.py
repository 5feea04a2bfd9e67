"""Status bodies and the exception that carries one, shaped byte for byte like kube-apiserver v1.28.

Key order is kind, apiVersion, metadata, status, message, reason, details, code; `details` is left out
or kept empty exactly where the real server does (see the kube-apiserver README in shared/data).
"""

from __future__ import annotations

import json
from typing import Any

REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    406: "NotAcceptable", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
    429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}

_OMIT = object()


def encode(obj: Any) -> bytes:
    """Compact JSON as Go's encoding/json writes it (HTML-safe escapes, UTF-8, trailing newline)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (text + "\n").encode("utf-8")


def status(code: int, message: str, reason: str | None = None, details: Any = _OMIT,
           metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": metadata or {},
                            "status": "Failure", "message": message}
    if reason:
        body["reason"] = reason
    if details is not _OMIT:
        body["details"] = details
    body["code"] = code
    return body


class ApiError(Exception):
    """An error response: HTTP code, Status body, extra headers."""

    def __init__(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body
        self.headers = headers or {}
        self.raced = False  # a stale write the server itself retries (the client pinned no resourceVersion)
        self.plain: bytes | None = None  # a text/plain body instead of the Status (the server's mux 404)


def _named_details(name: str, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    return details


def qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> ApiError:
    msg = f'{qualified(resource, group)} "{name}" not found'
    return ApiError(404, status(404, msg, "NotFound", _named_details(name, group, resource)))


def page_not_found() -> ApiError:
    """What the server's path mux answers for a group/version it does not serve, or a path outside the API:
    text/plain, not a Status (capture 31 of kube-apiserver-1.36)."""
    err = ApiError(404, status(404, "404 page not found", "NotFound", {}))
    err.plain = b"404 page not found\n"
    return err


def unknown_resource() -> ApiError:
    return ApiError(404, status(404, "the server could not find the requested resource", "NotFound", {}))


def already_exists(resource: str, group: str, name: str) -> ApiError:
    msg = f'{qualified(resource, group)} "{name}" already exists'
    return ApiError(409, status(409, msg, "AlreadyExists", _named_details(name, group, resource)))


def conflict(resource: str, group: str, name: str, why: str) -> ApiError:
    msg = f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}'
    return ApiError(409, status(409, msg, "Conflict", _named_details(name, group, resource)))


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def stale(resource: str, group: str, name: str) -> ApiError:
    return conflict(resource, group, name, STALE)


def raced(resource: str, group: str, name: str) -> ApiError:
    """The stored object changed between a write's read and its commit."""
    err = stale(resource, group, name)
    err.raced = True
    return err


def bad_request(message: str) -> ApiError:
    return ApiError(400, status(400, message, "BadRequest"))


def gone(message: str, metadata: dict[str, Any] | None = None) -> ApiError:
    return ApiError(410, status(410, message, "Expired", metadata=metadata))


def unsupported_patch() -> ApiError:
    return ApiError(415, status(415, "415: Unsupported Media Type", "UnsupportedMediaType", {}))


def unsupported_body(accepted: str) -> ApiError:
    msg = f"the body of the request was in an unknown format - accepted media types include: {accepted}"
    return ApiError(415, status(415, msg, "UnsupportedMediaType"))


GENERIC_INVALID = "the server rejected our request due to an error in our request"


def generic_invalid() -> ApiError:
    return ApiError(422, status(422, GENERIC_INVALID, "Invalid", {}))


def cause(reason: str, message: str, field: str) -> dict[str, str]:
    return {"reason": reason, "message": message, "field": field}


def invalid(kind_label: str, name: str, group: str, kind: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid; kind_label is e.g. 'ConfigMap' or 'Gadget.capture.example.com'."""
    parts = list(dict.fromkeys(f"{c['field']}: {c['message']}" for c in causes))
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    msg = f'{kind_label} "{name}" is invalid: {joined}'
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = causes
    return ApiError(422, status(422, msg, "Invalid", details))


def invalid_options(kind: str, field: str, reason: str, message: str) -> ApiError:
    """422 for bad request options (CreateOptions, PatchOptions, ListOptions)."""
    return invalid(f"{kind}.meta.k8s.io", "", "meta.k8s.io", kind, [cause(reason, message, field)])


def forbidden(user: str, verb: str, resource: str, group: str, namespace: str | None,
              name: str | None) -> ApiError:
    subject = f'{resource} "{name}"' if name else resource
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    msg = f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group "{group}" {scope}'
    base = resource.split("/")[0]
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = base
    return ApiError(403, status(403, msg, "Forbidden", details), {"X-Content-Type-Options": "nosniff"})


def unauthorized() -> ApiError:
    return ApiError(401, status(401, "Unauthorized", "Unauthorized"))


def internal(message: str) -> ApiError:
    return ApiError(500, status(500, message))
