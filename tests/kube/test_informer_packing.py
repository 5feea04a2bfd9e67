"""A sharded replica's node cache keeps the other shards' Nodes packed (issue 48: every replica cached the whole
fleet's Nodes, 8.9 KB a realistic one, a replica 1 GB at 100,000 nodes). Packing changes what the cache costs, never
what it says: every read hands out the Node as an unpacked cache would, handlers hear whole objects, and a key the
cache is told to keep is whole in the store once ``repack`` returns."""

from __future__ import annotations

import json
import threading
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from bench.scale import realistic_node_body
from gpuremediate.kube.cache import Informer, strip_node
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.packed import Packer
from gpuremediate.kube.resources import NODES
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for


@pytest.fixture
def client() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    yield KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    srv.stop()


def realistic(i: int) -> dict[str, Any]:
    """A realistic GPU Node, without what the API server sets (it refuses a create that names them)."""
    node = realistic_node_body(f"gpu-{i:03d}", i)
    node["metadata"] = {k: v for k, v in node["metadata"].items()
                        if k not in ("uid", "resourceVersion", "creationTimestamp", "managedFields")}
    return node


def started(client: KubeClient, keep: set[str]) -> Informer:
    informer = Informer(client, NODES)
    informer.pack_unless(lambda name: name in keep)
    informer.start()
    assert informer.wait_for_sync(10)
    return informer


def test_a_packed_node_reads_as_the_whole_one(client: KubeClient) -> None:
    for i in range(6):
        client.create(NODES, realistic(i))
    whole = started(client, set(map(lambda i: f"gpu-{i:03d}", range(6))))
    packed = started(client, {"gpu-000"})
    try:
        for i in range(6):
            name = f"gpu-{i:03d}"
            assert packed.get(name) == whole.get(name) and packed.get(name)["metadata"]["name"] == name  # type: ignore[index]
        assert sorted(map(json.dumps, packed.list())) == sorted(map(json.dumps, whole.list()))
        assert sorted(packed.stored_keys()) == [f"gpu-{i:03d}" for i in range(6)]
        # kept: the one stored object, handed out as it is; packed: a new object each read
        assert packed.get("gpu-000") is packed.get("gpu-000")
        assert packed.get("gpu-001") is not packed.get("gpu-001")
    finally:
        packed.stop()
        whole.stop()


def test_handlers_hear_whole_objects_old_and_new(client: KubeClient) -> None:
    client.create(NODES, realistic(1))
    informer = started(client, set())
    heard: list[tuple[dict[str, Any], dict[str, Any]]] = []
    informer.add_handler(on_update=lambda old, new: heard.append((old, new)))
    try:
        client.patch(NODES, "gpu-001", {"metadata": {"labels": {"team.example/pool": "b"}}})
        wait_for(lambda: heard, 10)
        old, new = heard[0]
        assert "team.example/pool" not in old["metadata"]["labels"]
        assert new["metadata"]["labels"]["team.example/pool"] == "b"
        assert old["status"]["conditions"] == new["status"]["conditions"] and len(new["status"]["conditions"]) > 3
        assert informer.get("gpu-001") == new
    finally:
        informer.stop()


def test_a_key_taken_is_whole_once_repack_returns_and_one_let_go_is_packed_again(client: KubeClient) -> None:
    for i in range(4):
        client.create(NODES, realistic(i))
    keep: set[str] = set()
    informer = started(client, keep)
    try:
        before = informer.get("gpu-002")
        keep.add("gpu-002")  # its shard taken
        informer.repack()
        assert informer.get("gpu-002") is informer.get("gpu-002") and informer.get("gpu-002") == before
        client.patch(NODES, "gpu-002", {"spec": {"unschedulable": True}})
        wait_for(lambda: (informer.get("gpu-002") or {}).get("spec", {}).get("unschedulable") is True, 10)
        assert informer.get("gpu-002") is informer.get("gpu-002")  # an event of a kept key is stored whole
        keep.clear()  # given back
        informer.repack()
        assert informer.get("gpu-002") is not informer.get("gpu-002")
        assert informer.get("gpu-002")["spec"]["unschedulable"] is True  # type: ignore[index]
    finally:
        informer.stop()


def test_an_event_whose_form_was_chosen_before_a_repack_is_chosen_again(client: KubeClient) -> None:
    """The informer's thread chose to pack an event; the shard thread then took the key and repacked before the
    event was stored. The store must not keep it packed (it would be acted on packed until its next event)."""
    client.create(NODES, realistic(3))
    keep: set[str] = set()
    informer = Informer(client, NODES)
    informer.pack_unless(lambda name: name in keep)
    informer._relist()
    stored = threading.Event()
    real_form = informer._form

    def slow_form(key: str, obj: Any) -> Any:  # the event's form is chosen, then the key is taken and repacked
        form = real_form(key, obj)
        if not stored.is_set():
            stored.set()
            keep.add(key)
            informer.repack()
        return form

    informer._form = slow_form  # type: ignore[method-assign]
    from gpuremediate.kube.watch import WatchEvent
    node = client.patch(NODES, "gpu-003", {"spec": {"unschedulable": True}})
    informer._apply(WatchEvent("MODIFIED", node))
    assert informer.get("gpu-003") is informer.get("gpu-003")
    assert informer.get("gpu-003")["spec"]["unschedulable"] is True  # type: ignore[index]


def test_a_packed_realistic_node_costs_a_few_hundred_bytes() -> None:
    """What packing is for: the figure docs/sizing.md sizes a replica by (bench/scale_100k.py measures it)."""
    stripped = [strip_node(json.loads(json.dumps(realistic_node_body(f"gpu-{i:05d}", i)))) for i in range(500)]
    packer = Packer(strip_node)
    tracemalloc.start()  # (after the strips: the table of shared values may grow while they run, once, not per Node)
    before = tracemalloc.get_traced_memory()[0]
    kept = [packer.pack(node) for node in stripped]
    per_node = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    tracemalloc.stop()
    assert per_node < 600, per_node  # a dict: 8.9 KB
    assert packer.unpack(kept[7]) == stripped[7]
