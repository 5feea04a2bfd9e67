"""Mutating admission webhooks, called on create as kube-apiserver's MutatingAdmissionWebhook plugin does.

The contract (Kubernetes API reference, "Dynamic Admission Control" and "kube-apiserver Admission (v1)",
https://kubernetes.io/docs/reference/config-api/apiserver-admission.v1/): for each webhook of each
MutatingWebhookConfiguration (admissionregistration.k8s.io/v1), in name order, whose ``rules`` (operations,
apiGroups, apiVersions, resources, scope), ``namespaceSelector`` (the namespace's labels), ``objectSelector`` (the
object's labels) and ``matchConditions`` (CEL over ``object``, ``oldObject``, ``request``) all match, the server
POSTs an ``admission.k8s.io/v1`` AdmissionReview whose ``request`` carries uid, kind, resource, requestKind,
requestResource, name, namespace, operation, userInfo, object, oldObject, dryRun and options, within
``timeoutSeconds`` (default 10). The response must echo the uid; ``allowed: false`` refuses the request (its
``status``, code 403 by default); ``patchType: JSONPatch`` with a base64 RFC 6902 ``patch`` mutates the object,
the next webhook seeing the mutated object. A webhook that cannot be called, times out or answers badly is
skipped under ``failurePolicy: Ignore`` and refuses the request (500, "failed calling webhook") under ``Fail``
(the v1 default). ``clientConfig.service`` is called at https://<name>.<namespace>.svc:<port><path> with the
certificate checked against ``caBundle`` for the name <name>.<namespace>.svc; the emulator has no cluster DNS, so a
test tells it where each Service listens (``routes``); ``clientConfig.url`` is called as written.

How this differs from kube-apiserver is listed in e2e/README.md ("The emulator's differences").
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim import kube_cel
from sim import kube_errors as errs
from sim.kube_patch import PatchError, json_patch
from sim.kube_resources import ResourceType
from sim.kube_selectors import match_label_selector_object
from sim.kube_store import Obj, Store

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by kube-apiserver (v1.22 GA)
DEFAULT_TIMEOUT_S = 10


class CallFailed(Exception):
    """The webhook could not be called or answered badly: failurePolicy decides."""


@dataclass
class Dispatcher:
    """``routes``: "<namespace>/<service>:<port>" -> "host:port" where that Service's endpoints listen."""

    routes: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str, float]] = field(default_factory=list)  # (webhook, outcome, seconds), last 10,000

    def admit(self, store: Store, configs_rt: ResourceType, ns_rt: ResourceType, rt: ResourceType, obj: Obj,
              namespace: str, operation: str, user: str, groups: tuple[str, ...], dry: bool) -> Obj:
        """The object after every matching webhook, or an ApiError refusing it."""
        configs = sorted(store.list_all(configs_rt.key), key=lambda c: c["metadata"]["name"])
        for config in configs:
            for hook in config.get("webhooks") or []:
                request = _request(rt, obj, namespace, operation, user, groups, dry)
                if not self._matches(store, ns_rt, hook, rt, obj, namespace, request):
                    continue
                obj = self._call(hook, request, obj)
        return obj

    def _matches(self, store: Store, ns_rt: ResourceType, hook: Mapping[str, Any], rt: ResourceType, obj: Obj,
                 namespace: str, request: dict[str, Any]) -> bool:
        if not any(rule_matches(rule, rt, request["operation"]) for rule in hook.get("rules") or []):
            return False
        if rt.namespaced or rt.resource == "namespaces":
            name = namespace or (obj.get("metadata") or {}).get("name", "")
            ns = store.get(ns_rt.key, "", name) if rt.namespaced else obj
            labels = {**((ns or {}).get("metadata", {}).get("labels") or {}), NAMESPACE_NAME_LABEL: name}
            if not match_label_selector_object(hook.get("namespaceSelector"), labels):
                return False
        if not match_label_selector_object(hook.get("objectSelector"), (obj.get("metadata") or {}).get("labels")):
            return False
        return self._conditions_hold(hook, request)

    def _conditions_hold(self, hook: Mapping[str, Any], request: dict[str, Any]) -> bool:
        """All matchConditions true. One that errs: Fail refuses the request, Ignore skips the webhook (as the
        API server does); one false: the webhook is skipped."""
        scope = {"object": request["object"], "oldObject": request["oldObject"], "request": request}
        for condition in hook.get("matchConditions") or []:
            try:
                if kube_cel.evaluate(kube_cel.compile_rule(condition["expression"]), scope) is not True:
                    return False
            except kube_cel.CelError as exc:
                if _policy(hook) == "Fail":
                    raise _internal(f'failed calling webhook "{hook["name"]}": matchCondition '
                                    f'"{condition.get("name")}" evaluation error: {exc}') from None
                return False
        return True

    def _call(self, hook: Mapping[str, Any], request: dict[str, Any], obj: Obj) -> Obj:
        started = time.monotonic()
        try:
            response = self._post(hook, request)
            if not response.get("allowed"):
                self._record(hook, "denied", started)
                raise _denied(hook, response)
            patched = _apply(response, obj)
        except CallFailed as exc:
            self._record(hook, "failed", started)
            if _policy(hook) == "Ignore":
                return obj
            raise _internal(f'failed calling webhook "{hook["name"]}": {exc}') from None
        self._record(hook, "patched" if patched is not obj else "allowed", started)
        return patched

    def _record(self, hook: Mapping[str, Any], outcome: str, started: float) -> None:
        self.calls.append((str(hook.get("name")), outcome, time.monotonic() - started))
        del self.calls[:-10_000]

    def _post(self, hook: Mapping[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        host, port, server_name, path = self._target(hook.get("clientConfig") or {})
        timeout = float(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "request": request}).encode()
        deadline = time.monotonic() + timeout
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            tls = _context(hook.get("clientConfig") or {}).wrap_socket(sock, server_hostname=server_name)
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
            conn.sock = tls
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json", "Accept": "application/json"})
                tls.settimeout(max(0.001, deadline - time.monotonic()))
                answer = conn.getresponse()
                data = answer.read()
            finally:
                conn.close()
        except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
            url = f"https://{server_name}:{port}{path}"
            why = "context deadline exceeded" if isinstance(exc, (TimeoutError, socket.timeout)) else str(exc)
            raise CallFailed(f'failed to call webhook: Post "{url}": {why}') from None
        if answer.status != 200:
            raise CallFailed(f"received invalid webhook response: status {answer.status}")
        return _response(data, request["uid"])

    def _target(self, client: Mapping[str, Any]) -> tuple[str, int, str, str]:
        """(host, port to connect to, the name the certificate must carry, the path)."""
        service = client.get("service")
        if service:
            port = int(service.get("port") or 443)
            key = f"{service['namespace']}/{service['name']}:{port}"
            if key not in self.routes:
                raise CallFailed(f'failed to call webhook: service "{service["namespace"]}/{service["name"]}" '
                                 f"has no endpoints (no route for {key})")
            host, _, where = self.routes[key].rpartition(":")
            return host, int(where), f"{service['name']}.{service['namespace']}.svc", service.get("path") or "/"
        url = urllib.parse.urlsplit(str(client.get("url") or ""))
        if url.scheme != "https" or not url.hostname:
            raise CallFailed(f"clientConfig needs a service or an https url, got {client.get('url')!r}")
        path = url.path or "/"
        return url.hostname, url.port or 443, url.hostname, path + (f"?{url.query}" if url.query else "")


def rule_matches(rule: Mapping[str, Any], rt: ResourceType, operation: str, subresource: str = "") -> bool:
    """A RuleWithOperations: "*" matches all; resources "pods" is not "pods/status", "*/*" is both."""
    def has(values: Any, value: str) -> bool:
        return "*" in (values or []) or value in (values or [])
    resource = f"{rt.resource}/{subresource}" if subresource else rt.resource
    resources = rule.get("resources") or []
    resource_ok = resource in resources or "*/*" in resources or (not subresource and "*" in resources) or \
        (bool(subresource) and f"{rt.resource}/*" in resources)
    scope = rule.get("scope") or "*"
    scope_ok = scope == "*" or scope == ("Namespaced" if rt.namespaced else "Cluster")
    return has(rule.get("operations"), operation) and has(rule.get("apiGroups"), rt.group) and \
        has(rule.get("apiVersions"), rt.version) and resource_ok and scope_ok


def _request(rt: ResourceType, obj: Obj, namespace: str, operation: str, user: str, groups: tuple[str, ...],
             dry: bool) -> dict[str, Any]:
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    gvr = {"group": rt.group, "version": rt.version, "resource": rt.resource}
    return {"uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": (obj.get("metadata") or {}).get("name", ""), "namespace": namespace if rt.namespaced else "",
            "operation": operation, "userInfo": {"username": user, "groups": list(groups)}, "object": obj,
            "oldObject": None, "dryRun": dry,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}


def _policy(hook: Mapping[str, Any]) -> str:
    return str(hook.get("failurePolicy") or "Fail")


def _context(client: Mapping[str, Any]) -> ssl.SSLContext:
    bundle = client.get("caBundle")
    if not bundle:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
    except (ValueError, ssl.SSLError) as exc:
        raise CallFailed(f"failed to call webhook: caBundle unusable: {exc}") from None


def _response(data: bytes, uid: str) -> dict[str, Any]:
    try:
        review = json.loads(data)
    except ValueError as exc:
        raise CallFailed(f"received invalid webhook response: {exc}") from None
    response = review.get("response") if isinstance(review, dict) else None
    if review.get("apiVersion") != "admission.k8s.io/v1" or review.get("kind") != "AdmissionReview" \
            or not isinstance(response, dict):
        raise CallFailed("received invalid webhook response: expected an admission.k8s.io/v1 AdmissionReview")
    if response.get("uid") != uid:
        raise CallFailed(f"expected response.uid={uid!r}, got {response.get('uid')!r}")
    return response


def _denied(hook: Mapping[str, Any], response: Mapping[str, Any]) -> errs.ApiError:
    status = response.get("status") or {}
    message = f'admission webhook "{hook["name"]}" denied the request'
    if status.get("message"):
        message += f": {status['message']}"
    code = int(status.get("code") or 403)
    return errs.ApiError(code, errs.status(code, message, status.get("reason") or "Forbidden"))


def _internal(message: str) -> errs.ApiError:
    return errs.ApiError(500, errs.status(500, f"Internal error occurred: {message}", "InternalError"))


def _apply(response: Mapping[str, Any], obj: Obj) -> Obj:
    if not response.get("patch"):
        return obj
    if response.get("patchType") != "JSONPatch":
        raise CallFailed(f"unsupported patch type {response.get('patchType')!r}")
    try:
        ops = json.loads(base64.b64decode(response["patch"]))
        if not isinstance(ops, list):
            raise ValueError("the patch is not a list of operations")
        patched = json_patch(obj, ops)
    except (ValueError, PatchError) as exc:
        raise CallFailed(f"JSONPatch could not be applied: {exc}") from None
    if not isinstance(patched, dict):
        raise CallFailed("JSONPatch made the object something other than an object")
    return patched
