"""What the emulator copies per request: a selective list costs what it returns, not the bucket (issue 16
item 8: every field-selector list deep-copied all 50,000 pods)."""

from __future__ import annotations

from typing import Any

import pytest
from kubeapi_support import Raw

from sim import kube_store
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
    real = kube_store.clone

    def counting(value: Any) -> Any:
        if isinstance(value, dict) and (value.get("metadata") or {}).get("namespace") == "cost":
            seen[0] += 1
        return real(value)
    monkeypatch.setattr(kube_store, "clone", counting)
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


class _CountingHistory(list):  # type: ignore[type-arg]
    """A history that counts the events a reader walks."""

    walked = 0

    def __iter__(self) -> Any:
        for event in super().__iter__():
            type(self).walked += 1
            yield event

    def __reversed__(self) -> Any:
        for event in super().__reversed__():
            type(self).walked += 1
            yield event


def test_a_watch_keeping_up_walks_the_events_it_is_sent_not_the_history() -> None:
    from sim.kube_store import Store, WatchEvent
    store = Store(history=5000)
    events = [WatchEvent(rv, "/configmaps", "ADDED", {"metadata": {"name": f"c{rv}"}}) for rv in range(1, 5001)]
    store.history = _CountingHistory(events)  # type: ignore[assignment]
    assert [e.rv for e in store.events_after(4997)] == [4998, 4999, 5000]
    assert _CountingHistory.walked <= 4, "a watch 3 events behind walked the history"
    assert store.events_after(5000) == []
    assert [e.rv for e in store.events_after(0)] == list(range(1, 5001))
    assert [e.rv for e in store.events_after(2500)][:2] == [2501, 2502]


def test_restored_objects_are_stored_as_created_with_no_watch_event(srv: KubeAPIServer) -> None:
    raw = Raw(srv)
    nodes = srv.type_for("", "nodes")
    before = srv.store.current_rv()
    assert srv.store.restore(nodes, ({"metadata": {"name": f"r{i}", "labels": {"i": str(i)}}} for i in range(3))) == 3
    listed = raw("GET", "/api/v1/nodes?labelSelector=i")
    assert listed.status == 200
    items = {item["metadata"]["name"]: item for item in listed.body["items"]}
    assert sorted(items) == ["r0", "r1", "r2"]
    assert len({item["metadata"]["uid"] for item in items.values()}) == 3
    assert all(int(item["metadata"]["resourceVersion"]) > before for item in items.values())
    assert srv.store.events_after(before) == []
    too_old = raw("GET", f"/api/v1/nodes?watch=true&resourceVersion={before}&timeoutSeconds=1")
    assert "Expired" in str(too_old.body) or too_old.status == 410, too_old
    with pytest.raises(Exception, match="already exists"):
        srv.store.restore(nodes, [{"metadata": {"name": "r1"}}])


def test_a_stored_objects_clone_is_deep_and_takes_what_marshal_cannot() -> None:
    from collections import OrderedDict
    stored = {"metadata": {"name": "n", "labels": {"a": "1"}}, "spec": {"taints": [{"key": "k"}]}, "x": 1.5}
    copied = kube_store.clone(stored)
    copied["metadata"]["labels"]["a"] = "2"
    copied["spec"]["taints"].append({"key": "j"})
    assert stored == {"metadata": {"name": "n", "labels": {"a": "1"}}, "spec": {"taints": [{"key": "k"}]}, "x": 1.5}
    odd = {"metadata": OrderedDict(name="n"), "items": [object]}
    again = kube_store.clone(odd)
    assert again == odd and again["metadata"] is not odd["metadata"]
