"""The client against an API server: the emulator by default, a real cluster with GPUREMEDIATE_TEST_KUBECONFIG."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.resources import CONFIGMAPS, CRDS, LEASES, NODES, PDBS, PODS
from gpuremediate.kube.watch import WatchEvent, resumable_watch
from gpuremediate.kube.workqueue import WorkQueue
from sim.waiting import wait_for

from .conftest import KubeTarget

# Every ConfigMap a test makes carries this label, and watches and informers select by it: a real
# namespace also holds kube-controller-manager's kube-root-ca.crt (the emulator's target has one too).
TEST_LABEL = {"gpuremediate.io/test": "kube"}
TEST_SELECTOR = "gpuremediate.io/test=kube"
GONE_ON_A_REAL_SERVER = ("a real server's watch cache holds far more history than a test can write, and how "
                         "far back it reaches depends on the server: no write count pushes a resourceVersion "
                         "out of it deterministically (the emulator's window is known: watch_history)")


def cm(name: str, namespace: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(TEST_LABEL)}, "data": dict(data)}


def writes_past_the_watch_window(kube_target: KubeTarget) -> int:
    """How many writes push resourceVersion 1 out of the emulator's watch history (skip on a real server)."""
    server = kube_target.require_emulator(GONE_ON_A_REAL_SERVER)
    return int(server.store.history.maxlen) + 5


def pod(name: str, namespace: str, labels: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}}, "spec": spec}


def test_crud_and_error_types(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    created = client.create(CONFIGMAPS, cm("a", ns, k="v"))
    assert created["metadata"]["resourceVersion"]
    with pytest.raises(errors.AlreadyExists):
        client.create(CONFIGMAPS, cm("a", ns))
    with pytest.raises(errors.NotFound) as missing:
        client.get(CONFIGMAPS, "missing", ns)
    assert missing.value.details.get("kind") == "configmaps"
    with pytest.raises(errors.Invalid):
        client.create(CONFIGMAPS, cm("Bad_Name", ns))
    with pytest.raises(errors.BadRequest):
        client.list(CONFIGMAPS, ns, field_selector="data.k=v")
    with pytest.raises(errors.Invalid):  # a failing JSON-patch test op is 422
        client.patch(CONFIGMAPS, "a", [{"op": "test", "path": "/data/k", "value": "other"}], ns, patch_type="json")
    patched = client.patch(CONFIGMAPS, "a", {"data": {"k": None, "n": "1"}}, ns)
    assert patched["data"] == {"n": "1"}
    dry = client.create(CONFIGMAPS, cm("dry", ns), dry_run=True)
    assert "resourceVersion" not in dry["metadata"]
    with pytest.raises(errors.NotFound):
        client.get(CONFIGMAPS, "dry", ns)
    client.delete(CONFIGMAPS, "a", ns)
    with pytest.raises(errors.NotFound):
        client.delete(CONFIGMAPS, "a", ns)


def test_conflict_on_stale_resource_version(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    first = client.create(CONFIGMAPS, cm("c", ns, v="1"))
    client.replace(CONFIGMAPS, "c", {**first, "data": {"v": "2"}})
    with pytest.raises(errors.Conflict) as stale:
        client.replace(CONFIGMAPS, "c", {**first, "data": {"v": "3"}})
    assert not isinstance(stale.value, errors.AlreadyExists)
    with pytest.raises(errors.Conflict):
        client.delete(CONFIGMAPS, "c", ns, preconditions={"resourceVersion": first["metadata"]["resourceVersion"]})
    assert client.get(CONFIGMAPS, "c", ns)["data"] == {"v": "2"}


def test_server_side_apply_conflict_and_force(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    client.patch(CONFIGMAPS, "ssa", cm("ssa", ns, shared="a"), ns, patch_type="apply", field_manager="a")
    with pytest.raises(errors.Conflict):
        client.patch(CONFIGMAPS, "ssa", cm("ssa", ns, shared="b"), ns, patch_type="apply", field_manager="b")
    forced = client.patch(CONFIGMAPS, "ssa", cm("ssa", ns, shared="b"), ns, patch_type="apply",
                          field_manager="b", force=True)
    assert forced["data"]["shared"] == "b"


def test_finalizers_hold_deletion(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    body = cm("fin", ns)
    body["metadata"]["finalizers"] = ["example.com/hold"]
    client.create(CONFIGMAPS, body)
    held = client.delete(CONFIGMAPS, "fin", ns)
    assert held["kind"] == "ConfigMap" and held["metadata"]["deletionTimestamp"]
    assert client.get(CONFIGMAPS, "fin", ns)["metadata"]["deletionTimestamp"]
    client.patch(CONFIGMAPS, "fin", {"metadata": {"finalizers": None}}, ns)
    wait_for(lambda: _gone(lambda: client.get(CONFIGMAPS, "fin", ns)), describe="finalized object to go")


def _gone(call: Callable[[], Any]) -> bool:
    try:
        call()
    except errors.NotFound:
        return True
    return False


def test_pagination_and_selectors(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    for i in range(7):
        body = cm(f"p{i}", ns)
        body["metadata"]["labels"] = {"case": "page", "parity": "even" if i % 2 == 0 else "odd"}
        client.create(CONFIGMAPS, body)
    first = client.list_page(CONFIGMAPS, ns, label_selector="case=page", limit=3)
    assert len(first["items"]) == 3 and first["metadata"]["continue"]
    everything = client.list(CONFIGMAPS, ns, label_selector="case=page", limit=3)
    assert sorted(i["metadata"]["name"] for i in everything["items"]) == [f"p{i}" for i in range(7)]
    assert "continue" not in everything["metadata"]
    odd = client.list(CONFIGMAPS, ns, label_selector="case=page,parity in (odd)", limit=2)
    assert sorted(i["metadata"]["name"] for i in odd["items"]) == ["p1", "p3", "p5"]
    named = client.list(CONFIGMAPS, ns, field_selector="metadata.name=p4")
    assert [i["metadata"]["name"] for i in named["items"]] == ["p4"]
    with pytest.raises(errors.BadRequest):
        client.list(CONFIGMAPS, ns, label_selector="env in (prod")


def test_watch_resume_from_last_resource_version(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    rv = client.list(CONFIGMAPS, ns)["metadata"]["resourceVersion"]
    client.create(CONFIGMAPS, cm("w1", ns))
    seen: list[WatchEvent] = []
    with client.watch(CONFIGMAPS, ns, resource_version=rv, label_selector=TEST_SELECTOR, timeout_seconds=5) as stream:
        for event in stream:
            if event.type != "BOOKMARK":
                seen.append(event)
                break
    assert [(e.type, e.object["metadata"]["name"]) for e in seen] == [("ADDED", "w1")]
    client.patch(CONFIGMAPS, "w1", {"data": {"x": "1"}}, ns)
    client.create(CONFIGMAPS, cm("w2", ns))
    with client.watch(CONFIGMAPS, ns, resource_version=seen[-1].resource_version, label_selector=TEST_SELECTOR,
                      timeout_seconds=5) as stream:
        resumed = [e for _, e in zip(range(2), stream, strict=False)]
    assert [e.object["metadata"]["name"] for e in resumed] == ["w1", "w2"]  # nothing replayed, nothing lost
    assert int(resumed[0].resource_version) > int(seen[-1].resource_version)
    assert resumed[0].object["data"] == {"x": "1"}


def test_watch_from_a_resource_version_reports_modified(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    created = client.create(CONFIGMAPS, cm("m1", ns))
    client.patch(CONFIGMAPS, "m1", {"data": {"x": "1"}}, ns)
    with client.watch(CONFIGMAPS, ns, resource_version=created["metadata"]["resourceVersion"],
                      label_selector=TEST_SELECTOR, timeout_seconds=5) as stream:
        first = next(stream)
    assert (first.type, first.object["data"]) == ("MODIFIED", {"x": "1"})


def test_watch_from_too_old_resource_version_raises_gone(kube_target: KubeTarget) -> None:
    writes = writes_past_the_watch_window(kube_target)
    client, ns = kube_target.client(), kube_target.namespace
    for i in range(writes):
        client.create(CONFIGMAPS, cm(f"old{i}", ns))
    with pytest.raises(errors.Gone):
        for _ in client.watch(CONFIGMAPS, ns, resource_version="1", timeout_seconds=5):
            pass


def test_resumable_watch_relists_on_gone(kube_target: KubeTarget) -> None:
    writes = writes_past_the_watch_window(kube_target)
    client, ns = kube_target.client(), kube_target.namespace
    for i in range(writes):
        client.create(CONFIGMAPS, cm(f"r{i}", ns))
    stopped = threading.Event()
    relists: list[str] = []
    events: list[WatchEvent] = []

    def relist() -> str:
        rv = str(client.list(CONFIGMAPS, ns)["metadata"]["resourceVersion"])
        relists.append(rv)
        client.create(CONFIGMAPS, cm("after-relist", ns))
        return rv

    def on_event(event: WatchEvent) -> None:
        events.append(event)
        stopped.set()

    resumable_watch(client, CONFIGMAPS, ns, resource_version="1", on_event=on_event, relist=relist,
                    stopped=stopped, label_selector=TEST_SELECTOR, timeout_seconds=5)
    assert len(relists) == 1
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("ADDED", "after-relist")]


def test_eviction_429_with_pdb_then_201(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    node = f"evict-node-{ns}"
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        for name in ("a", "b"):
            client.create(PODS, pod(f"pdb-{name}", ns, {"app": "pdb"}, node))
            client.patch(PODS, f"pdb-{name}", {"status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"}]}}, ns, subresource="status")
        client.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                             "metadata": {"name": "pdb", "namespace": ns},
                             "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "pdb"}}}})
        wait_for(lambda: (client.get(PDBS, "pdb", ns).get("status") or {}).get("disruptionsAllowed") == 1,
                 describe="PDB status from the disruption controller")
        client.evict("pdb-a", ns, dry_run=True)
        assert "deletionTimestamp" not in client.get(PODS, "pdb-a", ns)["metadata"]
        assert client.evict("pdb-a", ns)["status"] == "Success"
        with pytest.raises(errors.TooManyRequests) as refused:
            client.evict("pdb-b", ns)
        assert refused.value.causes and refused.value.causes[0]["reason"] == "DisruptionBudget"
        with pytest.raises(errors.NotFound):
            client.evict("no-such-pod", ns)
    finally:
        client.delete(NODES, node)


GADGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gadgets.kubetest.example.com"},
    "spec": {
        "group": "kubetest.example.com",
        "scope": "Namespaced",
        "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
        "versions": [{
            "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
            }}},
        }],
    },
}


def test_crd_create_and_custom_resource_status_patch(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    kube_target.require_emulator("a CRD is cluster-wide; not created on a shared real cluster")
    client.create(CRDS, GADGET_CRD)
    gadgets = wait_for(lambda: _resolve_or_none(client, "kubetest.example.com/v1", "Gadget"), describe="discovery")
    assert (gadgets.plural, gadgets.namespaced) == ("gadgets", True)
    created = client.create(gadgets, {"apiVersion": "kubetest.example.com/v1", "kind": "Gadget",
                                      "metadata": {"name": "g1", "namespace": ns}, "spec": {"x": 1}})
    assert created["metadata"]["generation"] == 1
    patched = client.patch(gadgets, "g1", {"status": {"phase": "Ready"}}, ns, subresource="status")
    assert patched["status"] == {"phase": "Ready"} and patched["metadata"]["generation"] == 1
    ignored = client.patch(gadgets, "g1", {"status": {"phase": "Other"}}, ns)
    assert ignored["status"] == {"phase": "Ready"}  # status through the main endpoint is dropped
    with pytest.raises(errors.UnsupportedMediaType):
        client.patch(gadgets, "g1", {"spec": {"x": 2}}, ns, patch_type="strategic")


def _resolve_or_none(client: Any, api_version: str, kind: str) -> Any:
    try:
        return client.resolve(api_version, kind)
    except errors.NotFound:
        return None


def test_unauthorized_and_forbidden(kube_target: KubeTarget) -> None:
    server = kube_target.require_emulator("needs extra identities")
    from gpuremediate.kube.client import KubeClient
    from gpuremediate.kube.config import ClusterConfig, StaticToken

    bad = KubeClient(ClusterConfig(server=server.url, token_source=StaticToken("wrong")))
    with pytest.raises(errors.Unauthorized):
        bad.list(NODES)
    server.add_token("reader-token", "reader")
    server.enforce_rbac("reader", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}])
    reader = KubeClient(ClusterConfig(server=server.url, token_source=StaticToken("reader-token")))
    assert reader.list(CONFIGMAPS, kube_target.namespace, label_selector=TEST_SELECTOR)["items"] == []
    with pytest.raises(errors.Forbidden):
        reader.list(NODES)
    with pytest.raises(errors.Forbidden):
        reader.create(CONFIGMAPS, cm("nope", kube_target.namespace))


def test_token_file_rotation_against_server(kube_target: KubeTarget, tmp_path: Any) -> None:
    server = kube_target.require_emulator("needs extra identities")
    from gpuremediate.kube.client import KubeClient
    from gpuremediate.kube.config import ClusterConfig, FileToken

    server.add_token("old-token", "rotating")
    token_file = tmp_path / "token"
    token_file.write_text("old-token")
    client = KubeClient(ClusterConfig(server=server.url, token_source=FileToken(token_file)))
    client.list(NODES)
    stamp = token_file.stat().st_mtime_ns
    server.tokens.pop("old-token")
    server.add_token("new-token", "rotating")
    token_file.write_text("new-token")
    import os
    os.utime(token_file, ns=(stamp, stamp))  # same mtime: only the 401 makes the client re-read
    client.list(NODES)
    users = [r[0] for r in server.requests if r[3] == "nodes"]
    assert users[-2:] == ["rotating", "rotating"]


def test_transient_faults_are_retried(kube_target: KubeTarget) -> None:
    server = kube_target.require_emulator("fault injection")
    client, ns = kube_target.client(), kube_target.namespace
    client.create(CONFIGMAPS, cm("f", ns))
    server.inject(method="GET", path=r"/configmaps/f", count=2, status=503)
    server.inject(method="GET", path=r"/configmaps/f", count=1, action="reset")
    assert client.get(CONFIGMAPS, "f", ns)["metadata"]["name"] == "f"
    server.inject(method="POST", path=r"/configmaps", count=1, status=500)
    with pytest.raises(errors.ServerError):
        client.create(CONFIGMAPS, cm("g", ns))  # a create is never retried on 5xx
    server.inject(method="POST", path=r"/configmaps", count=1, status=429, retry_after=1)
    assert client.create(CONFIGMAPS, cm("g", ns))["metadata"]["name"] == "g"


def test_informer_and_workqueue(kube_target: KubeTarget) -> None:
    client, ns = kube_target.client(), kube_target.namespace
    client.create(CONFIGMAPS, cm("pre", ns))
    queue = WorkQueue(base_delay=0.01)
    deleted: list[str] = []
    informer = Informer(client, CONFIGMAPS, ns, label_selector=TEST_SELECTOR, watch_timeout_seconds=5)
    informer.add_handler(on_add=lambda o: queue.add(o["metadata"]["name"]),
                         on_update=lambda old, new: queue.add(new["metadata"]["name"]),
                         on_delete=lambda o: deleted.append(o["metadata"]["name"]))
    informer.start()
    try:
        assert informer.wait_for_sync(5)
        assert informer.get("pre", ns) is not None
        assert queue.get(timeout=2) == "pre"
        queue.done("pre")
        client.create(CONFIGMAPS, cm("new", ns))
        client.patch(CONFIGMAPS, "new", {"data": {"a": "1"}}, ns)
        assert queue.get(timeout=5) == "new"
        wait_for(lambda: (informer.get("new", ns) or {}).get("data") == {"a": "1"}, describe="update in the store")
        queue.done("new")
        client.delete(CONFIGMAPS, "pre", ns)
        wait_for(lambda: deleted == ["pre"], describe="delete handler")
        assert sorted(o["metadata"]["name"] for o in informer.list()) == ["new"]
    finally:
        informer.stop()
        queue.shutdown()
    assert not informer._thread or not informer._thread.is_alive()


def test_informer_relists_on_gone_and_fires_deletes(kube_target: KubeTarget) -> None:
    server = kube_target.require_emulator("needs watch faults to open a gap longer than the watch history")
    client, ns = kube_target.client(), kube_target.namespace
    client.create(CONFIGMAPS, cm("doomed", ns))
    server.inject(method="GET", path=r"configmaps\?.*watch=", count=1, action="cut-watch", delay_s=0.0)
    server.inject(method="GET", path=r"configmaps\?.*watch=", count=1, action="delay", delay_s=1.5)
    deleted: list[str] = []
    added: list[str] = []
    informer = Informer(client, CONFIGMAPS, ns, label_selector=TEST_SELECTOR, watch_timeout_seconds=5)
    informer.add_handler(on_add=lambda o: added.append(o["metadata"]["name"]),
                         on_delete=lambda o: deleted.append(o["metadata"]["name"]))
    informer.start()
    try:
        assert informer.wait_for_sync(5)
        time.sleep(0.2)  # the second watch is now held back by the delay fault
        client.delete(CONFIGMAPS, "doomed", ns)
        for i in range(25):  # push the watch's resourceVersion out of the emulator's 20-event history
            client.create(CONFIGMAPS, cm(f"fill{i}", ns))
        wait_for(lambda: informer.relists >= 2, timeout=10, describe="relist after 410")
        wait_for(lambda: deleted == ["doomed"], describe="delete fired for the vanished object")
        assert informer.get("doomed", ns) is None and informer.get("fill24", ns) is not None
        assert len(informer.list()) == 25
    finally:
        informer.stop()


def test_leader_election_between_two_electors(kube_target: KubeTarget) -> None:
    from gpuremediate.kube.leader import LeaderElector

    ns = kube_target.namespace
    started: list[str] = []
    stopped: list[str] = []

    def elector(identity: str) -> LeaderElector:
        return LeaderElector(kube_target.client(), ns, "kube-test-leader", identity, lease_duration=1.0,
                             renew_deadline=0.6, retry_period=0.1,
                             on_started_leading=lambda: started.append(identity),
                             on_stopped_leading=lambda: stopped.append(identity))

    one, two = elector("one"), elector("two")
    threads = [threading.Thread(target=e.run, daemon=True) for e in (one, two)]
    threads[0].start()
    wait_for(lambda: one.is_leader, describe="first elector to lead")
    threads[1].start()
    time.sleep(0.5)
    assert not two.is_leader and started == ["one"]
    lease = kube_target.client().get(LEASES, "kube-test-leader", ns)
    assert lease["spec"]["holderIdentity"] == "one"
    assert lease["spec"]["renewTime"].endswith("Z") and "." in lease["spec"]["renewTime"]
    one.stop()
    threads[0].join(3)
    assert stopped == ["one"]
    wait_for(lambda: two.is_leader, timeout=3, describe="second elector to take over after release")
    lease = kube_target.client().get(LEASES, "kube-test-leader", ns)
    assert lease["spec"]["holderIdentity"] == "two" and lease["spec"]["leaseTransitions"] >= 1
    two.stop()
    threads[1].join(3)
    released = kube_target.client().get(LEASES, "kube-test-leader", ns)["spec"]
    assert released.get("holderIdentity", "") == "" and released["leaseDurationSeconds"] == 1


def test_lost_lease_calls_on_stopped_leading(kube_target: KubeTarget) -> None:
    from gpuremediate.kube.leader import LeaderElector

    client, ns = kube_target.client(), kube_target.namespace
    lost = threading.Event()
    elector = LeaderElector(client, ns, "kube-test-lost", "victim", lease_duration=1.0, renew_deadline=0.5,
                            retry_period=0.1, on_stopped_leading=lost.set)
    runner = threading.Thread(target=elector.run, daemon=True)
    runner.start()
    wait_for(lambda: elector.is_leader, describe="leadership")
    # another party takes the lease over behind our back
    lease = client.get(LEASES, "kube-test-lost", ns)
    lease["spec"]["holderIdentity"] = "usurper"
    client.replace(LEASES, "kube-test-lost", lease)
    assert lost.wait(3)
    runner.join(2)
    assert not elector.is_leader and not runner.is_alive()
