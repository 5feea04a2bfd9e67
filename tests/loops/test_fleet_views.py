"""The per-version caches behind admission: a node's view is made again when its Node object changes, and only then."""

from __future__ import annotations

import copy
import json
from typing import Any

from gpuremediate.actions.nodes import NodeView as NodeCacheView
from gpuremediate.loops.drain import FleetViews
from gpuremediate.policy import safety
from gpuremediate.vocab import states
from gpuremediate.vocab.record import (
    OUTCOME_REPAIRED,
    RECORD_ANNOTATION,
    Fault,
    HistoryEntry,
    NodeRecord,
    encode,
)


def node(name: str, record: NodeRecord | None = None, gpus: int = 8, rv: str = "1") -> dict[str, Any]:
    annotations = {RECORD_ANNOTATION: encode(record)} if record is not None else {}
    return {"metadata": {"name": name, "resourceVersion": rv, "annotations": annotations, "labels": {}},
            "spec": {}, "status": {"capacity": {"nvidia.com/gpu": str(gpus)} if gpus else {},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def waiting_record() -> NodeRecord:
    fault = Fault(kind="xid", code="79", gpus=("GPU-1",), fingerprint="f1", action="reboot", first_seen=10.0,
                  last_seen=10.0, message="fell off the bus")
    return NodeRecord(state=states.DRAINING, since=10.0, fault=fault, cordoned_by_us=True)


def test_views_follow_each_new_version_of_a_node() -> None:
    views = FleetViews()
    a, b = node("a"), node("b")
    first, waiting = views.of([a, b])
    assert [v.name for v in first] == ["a", "b"] and waiting == []
    assert [v.state for v in first] == [states.HEALTHY, states.HEALTHY]

    b2 = node("b", waiting_record(), rv="2")  # b faulted: a new object
    second, waiting = views.of([a, b2])
    assert second[0] is first[0]  # a did not change: its view is reused
    assert second[1].state == states.DRAINING and second[1].waiting and waiting == ["b"]

    third, waiting = views.of([a])  # b is gone
    assert [v.name for v in third] == ["a"] and waiting == []


def test_a_view_is_made_from_the_object_not_from_its_name() -> None:
    views = FleetViews()
    a = node("a", waiting_record())
    assert views.of([a])[1] == ["a"]
    edited = copy.deepcopy(a)  # same name and resourceVersion, another object (a replaced cache entry)
    edited["metadata"]["annotations"][RECORD_ANNOTATION] = json.dumps({"v": 1, "state": "healthy"})
    view = views.of([edited])
    assert view[1] == [] and view[0][0].state == states.HEALTHY
    assert view[0][0] == safety.node_view(edited)


class _Informer:
    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}

    def get(self, name: str) -> dict[str, Any] | None:
        return self.objects.get(name)

    def get_stored(self, name: str) -> dict[str, Any] | None:
        return self.objects.get(name)

    def list(self) -> list[dict[str, Any]]:
        return list(self.objects.values())


def test_gpu_nodes_filter_each_version_and_keep_the_name_order() -> None:
    calls: list[str] = []

    def has_gpus(obj: Any) -> bool:
        calls.append(obj["metadata"]["name"])
        return bool(obj["status"]["capacity"])

    informer = _Informer([node("b"), node("a"), node("cpu", gpus=0)])
    view = NodeCacheView(informer, has_gpus)  # type: ignore[arg-type]
    assert [n["metadata"]["name"] for n in view.gpu_nodes()] == ["a", "b"]
    assert sorted(calls) == ["a", "b", "cpu"]
    calls.clear()
    assert [n["metadata"]["name"] for n in view.gpu_nodes()] == ["a", "b"]
    assert calls == []  # nothing changed: nothing filtered again

    informer.objects["a"] = node("a", gpus=0, rv="2")  # a lost its GPUs
    informer.objects["cpu"] = node("cpu", rv="2")  # and cpu gained some
    assert [n["metadata"]["name"] for n in view.gpu_nodes()] == ["b", "cpu"]
    assert sorted(calls) == ["a", "cpu"]


def test_cleared_views_are_made_again() -> None:
    views = FleetViews()
    a = node("a")
    first = views.of([a])[0][0]
    views.clear()
    again = views.of([a])[0][0]
    assert again == first and again is not first


class _WatchedInformer(_Informer):
    """The informer's handlers too: the store replayed to on_add, then each event as the watch brings it."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        super().__init__(objects)
        self.handlers: list[Any] = []
        self.lists = 0
        self.gets = 0

    def get(self, name: str) -> dict[str, Any] | None:
        self.gets += 1
        return super().get(name)

    def list(self) -> list[dict[str, Any]]:
        self.lists += 1
        return super().list()

    def add_handler(self, on_add: Any = None, on_update: Any = None, on_delete: Any = None) -> None:
        self.handlers.append((on_add, on_update, on_delete))
        for obj in list(self.objects.values()):
            on_add(obj)

    def put(self, obj: dict[str, Any]) -> None:
        old = self.objects.get(obj["metadata"]["name"])
        self.objects[obj["metadata"]["name"]] = obj
        for on_add, on_update, _ in self.handlers:
            if old is None:
                on_add(obj)
            else:
                on_update(old, obj)

    def delete(self, name: str) -> None:
        obj = self.objects.pop(name)
        for _, _, on_delete in self.handlers:
            on_delete(obj)


def test_a_shard_s_gpu_nodes_come_from_the_index_the_watch_keeps() -> None:
    shard = {"a": 0, "b": 1, "c": 0, "cpu": 0, "d": 0}.__getitem__
    informer = _WatchedInformer([node("c"), node("a"), node("b"), node("cpu", gpus=0)])
    view = NodeCacheView(informer, lambda obj: bool(obj["status"]["capacity"]))  # type: ignore[arg-type]
    view.index_shards(shard)
    assert [n["metadata"]["name"] for n in view.gpu_nodes_of(frozenset({0}), shard)] == ["a", "c"]
    assert view.gpu_count() == 3 and informer.lists == 0  # neither walked the cache
    informer.put(node("d"))  # joins shard 0
    informer.put(node("a", gpus=0, rv="2"))  # lost its GPUs
    informer.put(node("cpu", rv="2"))  # gained some
    informer.delete("c")
    assert [n["metadata"]["name"] for n in view.gpu_nodes_of(frozenset({0}), shard)] == ["cpu", "d"]
    assert [n["metadata"]["name"] for n in view.gpu_nodes_of(frozenset({0, 1}), shard)] == ["b", "cpu", "d"]
    assert view.gpu_count() == 3 and informer.lists == 0


def _labelled(name: str, rack: str | None, gpus: int = 8, rv: str = "1") -> dict[str, Any]:
    made = node(name, gpus=gpus, rv=rv)
    if rack is not None:
        made["metadata"]["labels"] = {"rack": rack}
    return made


def _walked(view: NodeCacheView, wanted: dict[str, set[str]]) -> list[str]:
    """What ``gpu_nodes_with`` must answer, by a walk of every GPU node."""
    return [n["metadata"]["name"] for n in view.gpu_nodes()
            if any(n["metadata"]["labels"].get(label) in values for label, values in wanted.items())]


def test_a_label_s_members_come_from_the_index_the_watch_keeps_and_match_a_full_walk() -> None:
    informer = _WatchedInformer([_labelled("a", "r1"), _labelled("b", "r2"), _labelled("c", "r1"),
                                 _labelled("cpu", "r1", gpus=0), _labelled("none", None)])
    view = NodeCacheView(informer, lambda obj: bool(obj["status"]["capacity"]))  # type: ignore[arg-type]
    view.index_shards({"a": 0, "b": 1, "c": 0, "cpu": 0, "none": 1, "d": 1}.__getitem__)
    view.index_labels(["rack"])  # after the shards' index: filled from the store once, then by the events
    indexed = informer.lists
    names = lambda wanted: [n["metadata"]["name"] for n in view.gpu_nodes_with(wanted)]  # noqa: E731
    assert names({"rack": {"r1"}}) == ["a", "c"] and informer.lists == indexed  # the index, not a walk
    informer.put(_labelled("d", "r1"))  # joins r1
    informer.put(_labelled("a", "r2", rv="2"))  # moved to another rack
    informer.put(_labelled("cpu", "r1", gpus=0, rv="2"))  # still no GPUs: never a member
    informer.put(_labelled("b", None, rv="2"))  # lost its label
    informer.put(_labelled("c", "r1", gpus=0, rv="2"))  # lost its GPUs
    informer.delete("none")
    lists = informer.lists
    assert names({"rack": {"r1"}}) == ["d"] and names({"rack": {"r2"}}) == ["a"]
    assert names({"rack": {"r1", "r2"}}) == ["a", "d"] and names({"rack": {"r3"}}) == []
    assert informer.lists == lists  # still no walk
    informer.put(_labelled("c", "r2", rv="3"))  # its GPUs back, in r2
    informer.put(_labelled("b", "r2", rv="3"))
    for wanted in ({"rack": {"r1"}}, {"rack": {"r2"}}, {"rack": {"r1", "r2"}}):
        assert names(wanted) == _walked(view, wanted), wanted
    assert view.gpu_count() == 4


def test_a_label_not_indexed_is_found_by_a_walk() -> None:
    informer = _WatchedInformer([_labelled("a", "r1"), _labelled("b", "r2")])
    view = NodeCacheView(informer, lambda obj: bool(obj["status"]["capacity"]))  # type: ignore[arg-type]
    view.index_labels(["zone"])  # a reloaded policy's label is not among these
    assert [n["metadata"]["name"] for n in view.gpu_nodes_with({"rack": {"r2"}})] == ["b"]
    assert informer.lists == 1


def _out(name: str, rv: str = "1", *, unschedulable: bool = False, ready: bool = True,
         record: NodeRecord | None = None, rack: str = "r1") -> dict[str, Any]:
    made = node(name, record, rv=rv)
    made["metadata"]["labels"] = {"rack": rack}
    made["spec"] = {"unschedulable": True} if unschedulable else {}
    made["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return made


def _same_verdicts(view: NodeCacheView, candidate: str) -> None:
    """The budget over the indexed notable nodes and the fleet's size says what it says over every GPU node."""
    budget, domains = safety.Budget(2), [safety.DomainBudget("rack", 1)]
    every = [safety.node_view(n) for n in view.gpu_nodes()]
    nodes = view.budget_nodes()
    assert nodes is not None
    seen = [safety.node_view(n) for n in nodes]
    if candidate not in {v.name for v in seen}:
        seen.append(next(v for v in every if v.name == candidate))
    size = view.fleet_size()
    assert safety.budget_check(seen, candidate, budget, domains, size) == \
        safety.budget_check(every, candidate, budget, domains)


def test_the_budget_s_nodes_come_from_the_index_the_watch_keeps_and_decide_as_a_full_walk() -> None:
    informer = _WatchedInformer([_out("a"), _out("b", record=waiting_record(), unschedulable=True),
                                 _out("c", unschedulable=True), _out("d", ready=False, rack="r2"),
                                 _out("e", rack="r2"), node("cpu", gpus=0)])
    view = NodeCacheView(informer, lambda obj: bool(obj["status"]["capacity"]))  # type: ignore[arg-type]
    view.index_labels(["rack"])
    view.index_budget()
    indexed = informer.lists
    names = lambda: [n["metadata"]["name"] for n in view.budget_nodes() or []]  # noqa: E731
    assert names() == ["b", "c", "d"]  # waiting, cordoned by a person, NotReady: a and e only count toward sizes
    assert view.fleet_size().nodes == 5 and view.fleet_size().members("rack", "r1") == 3
    assert informer.lists == indexed  # not one walk of the cache
    _same_verdicts(view, "b")  # (which walks it, to compare)
    indexed = informer.lists
    informer.put(_out("a", rv="2", unschedulable=True))  # a person cordoned a
    informer.put(_out("c", rv="2"))  # and uncordoned c
    informer.put(_out("d", rv="2", ready=False, rack="r2", unschedulable=True) | {"status": {"capacity": {}}})
    informer.delete("e")
    assert names() == ["a", "b"] and view.fleet_size().nodes == 3  # d lost its GPUs, e is gone
    assert view.fleet_size().members("rack", "r2") == 0
    assert informer.lists == indexed
    _same_verdicts(view, "b")

    written = _out("c", rv="3", record=waiting_record(), unschedulable=True)
    view.remember_write("2", written)  # our own write, not in the cache yet: the budget counts it at once
    assert names() == ["a", "b", "c"]
    informer.put(written)
    assert names() == ["a", "b", "c"]
    _same_verdicts(view, "c")


def test_our_write_counts_while_the_cache_has_stored_it_and_not_yet_indexed_it() -> None:
    """The informer stores an event before its handlers run: a reader between the two drops our write (the cache
    has it) while the index does not show it yet. A node we just quarantined must still count (review of issue 48)."""
    informer = _WatchedInformer([_out("a"), _out("b")])
    view = NodeCacheView(informer, lambda obj: bool(obj["status"]["capacity"]))  # type: ignore[arg-type]
    view.index_budget()
    held = NodeRecord(state=states.QUARANTINED, since=10.0, cordoned_by_us=True)
    written = _out("a", rv="2", record=held, unschedulable=True)
    view.remember_write("1", written)
    informer.objects["a"] = written  # stored; its handler has not run yet
    assert view.get("a") is written  # the reader that drops our write: the cache has it now
    assert [n["metadata"]["name"] for n in view.budget_nodes() or []] == ["a"]
    _same_verdicts(view, "b")


def _clustered(views: list[safety.NodeView], faulted: set[str]) -> list[tuple[str, str, str]]:
    return [(t.label, t.value, t.reason) for t in safety.clustered_domains(views, faulted, ["rack"], 50, 2, 0, 60)]


def test_a_domain_s_views_come_from_the_indexes_and_decide_as_the_nodes_views() -> None:
    """The breaker's domains may be zones, most of whose Nodes a sharded replica keeps packed: the views of members
    in service are made from the indexes (no Node read), the notable ones from the objects the index keeps."""
    informer = _WatchedInformer([_out("a"), _out("b", record=waiting_record(), unschedulable=True),
                                 _out("c", unschedulable=True), _out("d", ready=False, rack="r2"),
                                 _out("e", rack="r2"), _out("f"), node("cpu", gpus=0)])
    view = NodeCacheView(informer, lambda obj: bool(obj["status"]["capacity"]))  # type: ignore[arg-type]
    view.index_labels(["rack"])
    view.index_budget()
    lists, gets = informer.lists, informer.gets
    wanted = {"rack": {"r1", "r2"}}
    views = view.views_with(wanted)
    assert (informer.lists, informer.gets) == (lists, gets)  # not a Node read
    full = [safety.node_view(n) for n in view.gpu_nodes_with(wanted)]
    assert [v.name for v in views] == [v.name for v in full] == ["a", "b", "c", "d", "e", "f"]
    for made, whole in zip(views, full, strict=True):
        assert (made.out_of_service, made.state, made.waiting, made.ready, made.unschedulable, made.describe()) == \
            (whole.out_of_service, whole.state, whole.waiting, whole.ready, whole.unschedulable, whole.describe())
        assert made.labels["rack"] == whole.labels["rack"]
    for faulted in ({"a", "b"}, {"d", "e"}, {"a", "b", "c", "f"}, {"a"}):
        assert _clustered(views, faulted) == _clustered(full, faulted), faulted

    written = _out("f", rv="2", record=waiting_record(), unschedulable=True)
    view.remember_write("1", written)  # our write, not in the cache yet: its view is the written Node's
    assert next(v for v in view.views_with(wanted) if v.name == "f").waiting
    assert [v.name for v in view.views_with({"rack": {"r2"}})] == ["d", "e"]


def test_the_fleet_s_last_return_comes_from_the_index_and_our_writes() -> None:
    def returned(at: float) -> NodeRecord:
        entry = HistoryEntry(at=at, kind="xid", code="79", action="reboot", outcome=OUTCOME_REPAIRED)
        return NodeRecord(state=states.HEALTHY, since=at, history=(entry,))

    informer = _WatchedInformer([_out("a", record=returned(100.0)), _out("b", record=returned(300.0)), _out("c")])
    view = NodeCacheView(informer, lambda obj: bool(obj["status"]["capacity"]))  # type: ignore[arg-type]
    view.index_budget()
    lists = informer.lists
    assert view.last_return() == 300.0
    informer.delete("b")
    assert view.last_return() == 100.0
    view.remember_write("1", _out("c", rv="2", record=returned(500.0)))  # we returned c: the gate sees it at once
    assert view.last_return() == 500.0 and informer.lists == lists
    unindexed = NodeCacheView(_WatchedInformer([_out("a", record=returned(100.0)), _out("c")]),
                              lambda obj: bool(obj["status"]["capacity"]))  # type: ignore[arg-type]
    assert unindexed.last_return() == 100.0  # no index: a walk says the same
