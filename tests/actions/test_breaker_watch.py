"""The breaker ConfigMap through a watch: no GET at steady state, an outside reset or pause seen at once,
replaces that stay resourceVersion-guarded, and ``update`` correct with several writers (shards)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuremediate import cli
from gpuremediate.actions import breaker as breaker_mod
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP, PAUSE_ANNOTATION, RESET_ANNOTATION, BreakerStore
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import CONFIGMAPS, NAMESPACES
from gpuremediate.policy.safety import CircuitBreaker
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "gpuremediate-system"
OPENED = CircuitBreaker(open=True, opened_at=1.0, reason="3 of 4 nodes faulted", faults=(("a", 1.0),))


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[KubeAPIServer, KubeClient, str]]:
    srv = KubeAPIServer().start()
    kubeconfig = str(srv.write_kubeconfig(tmp_path / "kubeconfig"))
    client = KubeClient(load_config(kubeconfig))
    client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    try:
        yield srv, client, kubeconfig
    finally:
        client.close()
        srv.stop()


@pytest.fixture()
def watching(api: tuple[KubeAPIServer, KubeClient, str]) -> Iterator[BreakerStore]:
    _, client, _ = api
    BreakerStore(client, NS).save(OPENED)
    store = BreakerStore(client, NS).start()
    assert store._informer is not None and store._informer.wait_for_sync(5)
    try:
        yield store
    finally:
        store.stop()


def _configmap_gets(srv: KubeAPIServer) -> int:
    return sum(1 for r in list(srv.requests) if r[1] == "get" and r[3] == "configmaps")


def test_a_watching_store_reads_no_api_at_steady_state(api: tuple[KubeAPIServer, KubeClient, str],
                                                        watching: BreakerStore) -> None:
    srv, _, _ = api
    wait_for(lambda: watching.latest() == OPENED, describe="the watch's first list")
    before = _configmap_gets(srv)
    for _ in range(20):  # twenty detect cycles, the drain loop's reads between them
        watching.refresh()
        assert watching.latest() == OPENED
        assert not watching.latest_pause().paused
    assert _configmap_gets(srv) == before


def test_the_watch_sees_and_applies_an_outside_reset_annotation(api: tuple[KubeAPIServer, KubeClient, str],
                                                                 watching: BreakerStore) -> None:
    _, client, _ = api
    client.patch(CONFIGMAPS, BREAKER_CONFIGMAP, {"metadata": {"annotations": {RESET_ANNOTATION: "alice"}}}, NS)
    wait_for(lambda: not watching.latest().is_open, timeout=1.0, describe="the reset annotation applied",
             seen=watching.latest)
    assert f"{RESET_ANNOTATION}=alice" in watching.latest().reset_by
    wait_for(lambda: RESET_ANNOTATION not in (client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)["metadata"]
                                              .get("annotations") or {}), describe="the annotation removed")


def test_the_watch_sees_a_cli_reset_and_a_tool_pause(api: tuple[KubeAPIServer, KubeClient, str],
                                                      watching: BreakerStore) -> None:
    _, client, kubeconfig = api
    assert cli.main(["breaker", "reset", "--kubeconfig", kubeconfig, "--namespace", NS]) == 0
    wait_for(lambda: not watching.latest().is_open, timeout=1.0, describe="the CLI's reset", seen=watching.latest)
    client.patch(CONFIGMAPS, BREAKER_CONFIGMAP, {"metadata": {"annotations": {PAUSE_ANNOTATION: "upgrade"}}}, NS)
    wait_for(lambda: watching.latest_pause().paused, timeout=1.0, describe="the tool's pause",
             seen=watching.latest_pause)
    assert watching.latest_pause().reason == "upgrade"


def test_an_own_write_is_not_undone_by_the_watch_and_stays_guarded(api: tuple[KubeAPIServer, KubeClient, str],
                                                                   watching: BreakerStore) -> None:
    _, client, _ = api
    for node in ("b", "c", "d"):  # writes faster than their echoes: an older echo must not roll back a newer write
        watching.update(lambda b, node=node: b.record_fault(node, 2.0))  # type: ignore[misc]
        assert [n for n, _ in watching.latest().faults][-1] == node
    wait_for(lambda: not watching._echoes, describe="every echo seen")
    assert [n for n, _ in watching.latest().faults] == ["a", "b", "c", "d"]
    stale = BreakerStore(client, NS)
    stale.load()
    watching.update(lambda b: b.record_fault("e", 3.0))
    with pytest.raises(errors.Conflict):  # save stays a guarded replace
        stale.save(CircuitBreaker())


def test_update_rereads_on_a_409_and_keeps_both_writers_faults(api: tuple[KubeAPIServer, KubeClient, str]) -> None:
    _, client, _ = api
    shard_a, shard_b = BreakerStore(client, NS), BreakerStore(client, NS)
    assert shard_a.latest() == shard_b.latest() == CircuitBreaker()  # both read before either writes
    shard_a.update(lambda b: b.record_fault("node-a", 1.0))
    shard_a.update(lambda b: b.record_fault("node-a2", 1.5))
    applied: list[CircuitBreaker] = []

    def record_b(b: CircuitBreaker) -> CircuitBreaker:
        applied.append(b)
        return b.record_fault("node-b", 2.0)

    before, after = shard_b.update(record_b)  # its create meets the existing ConfigMap: 409, read, again
    assert len(applied) == 2 and applied[0] == CircuitBreaker()
    assert [n for n, _ in before.faults] == ["node-a", "node-a2"]
    assert [n for n, _ in after.faults] == ["node-a", "node-a2", "node-b"]
    assert [n for n, _ in BreakerStore(client, NS).load().faults] == ["node-a", "node-a2", "node-b"]


class _AlwaysConflicting:
    """A client whose every write loses to another writer."""

    def __init__(self) -> None:
        self.writes = 0

    def get(self, *_: Any) -> dict[str, Any]:
        return {"metadata": {"name": BREAKER_CONFIGMAP, "resourceVersion": str(self.writes)}, "data": {}}

    def replace(self, *_: Any) -> dict[str, Any]:
        self.writes += 1
        raise errors.Conflict(409, {"reason": "Conflict", "message": "the object has been modified"})


def test_update_gives_up_after_bounded_attempts() -> None:
    client = _AlwaysConflicting()
    store = BreakerStore(client, NS)  # type: ignore[arg-type]
    with pytest.raises(errors.Conflict):
        store.update(lambda b: b.record_fault("x", 1.0))
    assert client.writes == breaker_mod.UPDATE_ATTEMPTS


def test_read_only_commands_leave_the_reset_annotation_for_the_controller(
        api: tuple[KubeAPIServer, KubeClient, str], capsys: pytest.CaptureFixture[str]) -> None:
    srv, client, kubeconfig = api
    BreakerStore(client, NS).save(OPENED)
    client.patch(CONFIGMAPS, BREAKER_CONFIGMAP, {"metadata": {"annotations": {RESET_ANNOTATION: "bob"}}}, NS)
    reader = BreakerStore(client, NS, read_only=True)
    assert reader.load() == OPENED and reader.reset_requested == "bob"
    with pytest.raises(RuntimeError, match="read-only"):
        reader.save(CircuitBreaker())
    writes = sum(1 for r in srv.requests if r[1] in ("update", "create", "patch") and r[3] == "configmaps")
    assert cli.main(["breaker", "status", "--kubeconfig", kubeconfig, "--namespace", NS]) == 0
    assert cli.main(["status", "--kubeconfig", kubeconfig, "--namespace", NS]) == 0
    out = capsys.readouterr().out
    assert "circuit breaker: open" in out and "reset requested (annotation gpuremediate.io/breaker-reset=bob)" in out
    assert "CIRCUIT BREAKER OPEN" in out  # status's line
    assert sum(1 for r in srv.requests if r[1] in ("update", "create", "patch") and r[3] == "configmaps") == writes
    annotations = client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)["metadata"].get("annotations") or {}
    assert annotations.get(RESET_ANNOTATION) == "bob"
    assert not BreakerStore(client, NS).load().is_open  # the controller's store does consume it


def test_a_dry_run_store_watches_but_never_writes(api: tuple[KubeAPIServer, KubeClient, str]) -> None:
    srv, client, _ = api
    BreakerStore(client, NS).save(OPENED)
    store = BreakerStore(client, NS, dry_run=True).start()
    try:
        wait_for(lambda: store.latest() == OPENED, describe="the watch's list")
        writes = sum(1 for r in srv.requests if r[1] in ("update", "create") and r[3] == "configmaps")
        store.update(lambda b: b.record_fault("z", 5.0))
        assert [n for n, _ in store.latest().faults] == ["a", "z"]
        assert sum(1 for r in srv.requests if r[1] in ("update", "create") and r[3] == "configmaps") == writes
    finally:
        store.stop()


class _Recording:
    """A ConfigMap server in memory: every replace bumps the resourceVersion; get answers the current one."""

    def __init__(self, cm: dict[str, Any]) -> None:
        self.cm = cm
        self.gets = 0

    def get(self, *_: Any) -> dict[str, Any]:
        self.gets += 1
        return self.cm

    def replace(self, _res: Any, _name: str, body: dict[str, Any], _ns: str) -> dict[str, Any]:
        assert body["metadata"]["resourceVersion"] == self.cm["metadata"]["resourceVersion"]  # guarded
        meta = {**body["metadata"], "resourceVersion": str(int(body["metadata"]["resourceVersion"]) + 1)}
        self.cm = {**body, "metadata": meta}
        return self.cm


class _Synced:
    def has_synced(self) -> bool:
        return True


def _faults(store: BreakerStore) -> list[str]:
    return [n for n, _ in store.latest().faults]


def test_events_sent_before_an_own_write_never_roll_it_back() -> None:
    first = {"metadata": {"name": BREAKER_CONFIGMAP, "resourceVersion": "1"},
             "data": {"state": breaker_mod.json.dumps(OPENED.to_dict())}}
    client = _Recording(first)
    store = BreakerStore(client, NS)  # type: ignore[arg-type]
    store._informer = _Synced()  # type: ignore[assignment]  # as if watching: the test delivers the events
    store._observe(first)
    store.update(lambda b: b.record_fault("b", 2.0))
    second = client.cm
    store.update(lambda b: b.record_fault("c", 3.0))
    store._observe(second)  # the echo of the first write, after the second
    assert _faults(store) == ["a", "b", "c"] and client.gets == 0
    store._observe(first)  # an event from before both writes: settled by one GET
    assert _faults(store) == ["a", "b", "c"] and client.gets == 1
    store._observe(client.cm)
    assert _faults(store) == ["a", "b", "c"] and not store._echoes
    store.refresh()
    assert client.gets == 1  # synced: refresh reads nothing


def _annotate_reset(client: KubeClient, by: str) -> None:
    client.patch(CONFIGMAPS, BREAKER_CONFIGMAP, {"metadata": {"annotations": {RESET_ANNOTATION: by}}}, NS)


def test_a_fault_written_after_a_409_applies_the_reset_it_found(api: tuple[KubeAPIServer, KubeClient, str]) -> None:
    _, client, _ = api
    store = BreakerStore(client, NS)  # no watch: the 409 path alone
    store.save(OPENED)
    _annotate_reset(client, "alice")  # a person, after our last read: our next write meets a 409
    _, after = store.update(lambda b: b.record_fault("n1", 2.0))
    stored = client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)
    assert RESET_ANNOTATION not in (stored["metadata"].get("annotations") or {})  # consumed by that write...
    assert not after.is_open and f"{RESET_ANNOTATION}=alice" in after.reset_by  # ...and applied by it
    assert not BreakerStore(client, NS, read_only=True).load().is_open
    assert any(node == "n1" for node, _ in after.faults)  # the fault counts after the reset


def test_a_reset_the_watch_could_not_write_is_written_by_the_next_refresh(
        api: tuple[KubeAPIServer, KubeClient, str]) -> None:
    _, admin, kubeconfig = api
    BreakerStore(admin, NS).save(OPENED)
    _annotate_reset(admin, "alice")
    client, allowed = KubeClient(load_config(kubeconfig)), [False]

    def fence(method: str, path: str) -> None:  # a sharded replica whose shards have not settled yet
        if not allowed[0]:
            raise errors.NotLeader(method, path, "no shard yet")

    client.write_fence = fence
    store = BreakerStore(client, NS).start()
    try:
        wait_for(lambda: store.reset_requested == "alice", describe="the watch's first list")
        assert store.latest().is_open  # its write was refused
        allowed[0] = True
        store.refresh()
        assert not store.latest().is_open and store.reset_requested is None
        assert not BreakerStore(admin, NS, read_only=True).load().is_open
    finally:
        store.stop()
        client.close()
