"""The Node cache holds one copy of what a fleet repeats (issue 48: a realistic GPU Node cost 19.8 KB cached, over
half of it label and condition values every Node repeats), the same content as before, and never a table of the
fleet's per-node values."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from bench.scale import node_body, realistic_node_body
from gpuremediate.kube import cache
from gpuremediate.kube.cache import NODE_STATUS_UNREAD, strip_metadata, strip_node


@pytest.fixture(autouse=True)
def empty_table() -> Iterator[None]:
    saved = dict(cache._shared_values)
    cache._shared_values.clear()
    yield
    cache._shared_values.clear()
    cache._shared_values.update(saved)


def decoded(node: dict[str, Any]) -> dict[str, Any]:
    """As the informer gets it: its own strings, decoded from a watch event."""
    return json.loads(json.dumps(node))


def reference_strip(node: dict[str, Any]) -> dict[str, Any]:
    """What strip_node kept before values were shared: the metadata and status filters alone."""
    out = copy.deepcopy(strip_metadata(node))
    out["status"] = {k: v for k, v in out.get("status", {}).items() if k not in NODE_STATUS_UNREAD}
    return out


def shapes(i: int) -> list[dict[str, Any]]:
    return [node_body(f"gpu-{i:06d}"), realistic_node_body(f"gpu-{i:06d}", i)]


@pytest.mark.parametrize("shape", [0, 1], ids=["toy", "realistic"])
def test_the_stripped_node_holds_what_it_held_and_leaves_the_original_alone(shape: int) -> None:
    node = decoded(shapes(7)[shape])
    before = copy.deepcopy(node)
    stripped = strip_node(node)
    assert stripped == reference_strip(before)
    assert node == before
    assert "managedFields" not in stripped["metadata"] and "images" not in stripped["status"]


def test_what_a_fleet_repeats_is_one_object_in_the_cache() -> None:
    first, second = (strip_node(decoded(realistic_node_body(f"gpu-{i:06d}", i))) for i in (3, 6))
    for path in (("metadata", "labels", "nvidia.com/gpu.product"),
                 ("metadata", "labels", "feature.node.kubernetes.io/cpu-cpuid.AVX512F"),
                 ("metadata", "annotations", "nfd.node.kubernetes.io/feature-labels"),
                 ("status", "conditions", 0, "message"), ("status", "conditions", 3, "reason"),
                 ("status", "nodeInfo", "kernelVersion"), ("status", "capacity", "memory"),
                 ("spec", "taints", 0, "effect")):
        a, b = at(first, path), at(second, path)
        assert a == b and a is b, path


def test_a_nodes_own_values_stay_out_of_the_table_and_repeat_once_inside_it() -> None:
    nodes = [strip_node(decoded(realistic_node_body(f"gpu-{i:06d}", i))) for i in range(60)]
    after_three = 0
    for i, node in enumerate(nodes):
        if i == 3:
            after_three = len(cache._shared_values)  # three zones seen: the fleet's vocabulary
        meta, info = node["metadata"], node["status"]["nodeInfo"]
        own = [meta["name"], meta["uid"], meta["resourceVersion"], meta["creationTimestamp"],
               meta["labels"]["nvidia.com/gfd.timestamp"], meta["annotations"]["csi.volume.kubernetes.io/nodeid"],
               meta["annotations"]["alpha.kubernetes.io/provided-node-ip"], info["bootID"], info["machineID"],
               info["systemUUID"], node["spec"]["providerID"], node["spec"]["podCIDR"],
               *(c[t] for c in node["status"]["conditions"] for t in ("lastHeartbeatTime", "lastTransitionTime"))]
        assert not [v for v in own if v in cache._shared_values]
        assert meta["labels"]["kubernetes.io/hostname"] is meta["name"]
        times = {id(c["lastHeartbeatTime"]) for c in node["status"]["conditions"]}
        assert len(times) == 2  # the kubelet's four conditions' one beat, the others' one
    assert len(cache._shared_values) == after_three  # 60 Nodes, no more than one Node's vocabulary


def test_a_flood_of_distinct_values_never_grows_the_table_past_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "SHARED_VALUES_CAP", 50)
    seen = 0
    for i in range(40):
        node = node_body(f"n{i}")
        node["metadata"]["labels"].update({f"example.com/serial-{k}": f"{i}-{k}" for k in range(7)})
        node["status"]["conditions"][0]["message"] = f"message {i}"
        stripped = strip_node(decoded(node))
        assert stripped == reference_strip(node)
        seen = max(seen, len(cache._shared_values))
        assert len(cache._shared_values) <= 50
    assert seen == 50  # it filled, started over, filled again
    assert cache.shared_value("example.com/after") == "example.com/after"  # and still shares what comes next
    assert cache.shared_value("".join(["example.com/", "after"])) is cache.shared_value("example.com/after")


def at(obj: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        obj = obj[step]
    return obj
