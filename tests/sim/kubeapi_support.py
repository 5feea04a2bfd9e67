"""Shared fixtures: a running emulator and a raw http.client helper."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sim.kubeapi import KubeAPIServer


@dataclass
class Reply:
    status: int
    reason: str
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


class Raw:
    """Plain http.client requests with the admin token (or another)."""

    def __init__(self, srv: KubeAPIServer, token: str | None = None) -> None:
        self.srv = srv
        self.token = srv.admin_token if token is None else token

    def __call__(self, method: str, path: str, body: Any = None, content_type: str | None = "application/json",
                 token: str | None = None) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=10)
        headers = {}
        tok = self.token if token is None else token
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        if content_type and body is not None:
            headers["Content-Type"] = content_type
        data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        return Reply(resp.status, resp.reason, {k: v for k, v in resp.getheaders()}, raw)


@pytest.fixture
def srv() -> Iterator[KubeAPIServer]:
    server = KubeAPIServer(bookmark_interval_s=0.3).start()
    server.too_large_rv_wait_s = 0.2
    yield server
    server.stop()


@pytest.fixture
def raw(srv: KubeAPIServer) -> Raw:
    return prepare(Raw(srv))


def prepare(r: Raw) -> Raw:
    """Namespace `capture` and node `capture-node-1`, as in the capture."""
    assert r("POST", "/api/v1/namespaces", {"metadata": {"name": "capture"}}).status == 201
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "capture-node-1",
            "labels": {"capture": "yes", "kubernetes.io/hostname": "capture-node-1"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "ok", "lastHeartbeatTime": "2026-11-29T21:18:23Z",
                                       "lastTransitionTime": "2026-11-29T21:18:23Z"}]}}
    assert r("POST", "/api/v1/nodes", node).status == 201
    return r


def make_ready(raw: Raw, ns: str, name: str) -> None:
    patch = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", patch,
               "application/merge-patch+json").status == 200
