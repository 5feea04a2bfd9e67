"""Writes for MaintenanceRequests: the request's finalizer and status, the node's claim, Events.

Every write that decides something is guarded by a resourceVersion, so the API server — not a
possibly stale informer — decides a race: two requests claiming one node, a finalizer added
while the request is being deleted. A guarded write that loses returns None (re-read, decide
again). In dry-run mode nothing is sent: claims go into the node view's in-memory overlay, the
request's finalizer and status are only logged.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from gpuremediate.actions.nodes import Node, NodeView, name_of
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import EVENTS, NODES, Resource
from gpuremediate.state.maintenance import CLAIM_ANNOTATION, FINALIZER, KIND, identity

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def claim_of(node: Mapping[str, Any]) -> str:
    """The node's claim annotation (``<request name>/<uid>``), or ""."""
    return str(((node.get("metadata") or {}).get("annotations") or {}).get(CLAIM_ANNOTATION, ""))


def finalizers_of(obj: Mapping[str, Any]) -> list[str]:
    return list((obj.get("metadata") or {}).get("finalizers") or [])


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class RequestWriter:
    def __init__(
        self, client: KubeClient, res: Resource, nodes: NodeView, *, event_namespace: str = "default",
        host: str = "gpuremediate", dry_run: bool = False,
    ) -> None:
        self.client = client
        self.res = res
        self.nodes = nodes
        self.event_namespace = event_namespace
        self.host = host
        self.dry_run = dry_run

    # ---- the request ---------------------------------------------------------------------------------

    def add_finalizer(self, obj: Obj) -> Obj | None:
        return self._set_finalizers(obj, [*finalizers_of(obj), FINALIZER])

    def remove_finalizer(self, obj: Obj) -> Obj | None:
        return self._set_finalizers(obj, [f for f in finalizers_of(obj) if f != FINALIZER])

    def _set_finalizers(self, obj: Obj, finalizers: list[str]) -> Obj | None:
        name = identity(obj)[0]
        if self.dry_run:
            log.info("dry-run: would set the request's finalizers", extra={"request": name, "finalizers": finalizers})
            return obj
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": _rv(obj)}}
        try:
            return self.client.patch(self.res, name, patch)
        except errors.Conflict:
            return None
        except errors.NotFound:
            return obj  # gone already: nothing left to hold

    def write_status(self, obj: Obj, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource (the conditions list is replaced whole)."""
        name = identity(obj)[0]
        if self.dry_run:
            log.info("dry-run: request status", extra={"request": name, "phase": status.get("phase")})
            return
        with contextlib.suppress(errors.NotFound):
            self.client.patch(self.res, name, {"status": status}, subresource="status")

    # ---- the node's claim ----------------------------------------------------------------------------

    def claim(self, node: Node, value: str) -> Node | None:
        """Take the node for a request; None when the node changed since it was read (409)."""
        return self._annotate(node, value)

    def release(self, node: Node, value: str) -> Node | None:
        """Drop the claim if (and only if) it still names ``value``."""
        if claim_of(node) != value:
            return node
        return self._annotate(node, None)

    def _annotate(self, node: Node, value: str | None) -> Node | None:
        name, rv = name_of(node), _rv(node)
        patch: dict[str, Any] = {"metadata": {"annotations": {CLAIM_ANNOTATION: value}}}
        if self.dry_run:
            self.nodes.overlay(name, patch)
            return self.nodes.get(name)
        patch["metadata"]["resourceVersion"] = rv
        try:
            result = self.client.patch(NODES, name, patch)
        except errors.Conflict:
            log.info("node changed since read; claim decided again", extra={"node": name})
            return None
        self.nodes.remember_write(rv, result)
        return result

    # ---- events ----------------------------------------------------------------------------------------

    def event(self, obj: Mapping[str, Any], reason: str, message: str, type_: str) -> None:
        """An Event about the request (cluster-scoped: it lives in the event namespace). Never raises."""
        name, uid = identity(obj)
        if self.dry_run:
            message = f"(dry-run) {message}"
        log.info("event", extra={"request": name, "reason": reason, "event_message": message})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{secrets.token_hex(8)}", "namespace": self.event_namespace},
            "involvedObject": {"apiVersion": self.res.api_version, "kind": KIND, "name": name, "uid": uid},
            "reason": reason, "message": message[:1024], "type": type_,
            "source": {"component": "gpuremediate", "host": self.host},
            "reportingComponent": "gpuremediate", "reportingInstance": self.host,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            self.client.create(EVENTS, body, self.event_namespace)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("could not record event", extra={"request": name, "reason": reason, "error": str(exc)})
