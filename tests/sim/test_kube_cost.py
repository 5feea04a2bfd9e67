"""What the emulator copies per request: a selective list costs what it returns, not the bucket (issue 16
item 8: every field-selector list deep-copied all 50,000 pods)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubeapi_support import Raw

from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

PODS = 120


def _pod(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"p{i}", "namespace": "cost"},
            "spec": {"nodeName": f"n{i % 40}", "containers": [{"name": "c", "image": "x"}]}}


@pytest.fixture
def crowded(srv: KubeAPIServer) -> Raw:
    raw = Raw(srv)
    assert raw("POST", "/api/v1/namespaces", {"metadata": {"name": "cost"}}).status == 201
    pods = srv.type_for("", "pods")
    for i in range(PODS):
        srv.store.create(pods, _pod(i), "cost")
    wait_for(srv.controllers.queue.empty, 10, "the emulator's controllers to settle", interval=0.02)
    return raw


def _copies_of_cost_pods(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen = [0]
    real = copy.deepcopy

    def counting(value: Any, memo: Any = None) -> Any:
        if isinstance(value, dict) and (value.get("metadata") or {}).get("namespace") == "cost":
            seen[0] += 1
        return real(value, memo)
    monkeypatch.setattr(copy, "deepcopy", counting)
    return seen


@pytest.mark.parametrize("path", ["/api/v1/namespaces/cost/pods?fieldSelector=spec.nodeName%3Dn7",
                                  "/api/v1/pods?fieldSelector=spec.nodeName%3Dn7",
                                  "/api/v1/namespaces/cost/pods?labelSelector=absent%3Dyes"])
def test_a_selective_list_copies_only_what_it_returns(crowded: Raw, monkeypatch: pytest.MonkeyPatch,
                                                      path: str) -> None:
    copies = _copies_of_cost_pods(monkeypatch)
    reply = crowded("GET", path)
    assert reply.status == 200
    returned = len(reply.body["items"])
    assert returned == (0 if "absent" in path else PODS // 40)
    assert copies[0] <= 2 * returned, f"{copies[0]} pod copies for a list that returned {returned}"
