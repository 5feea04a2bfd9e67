"""Issue 47: the replace providers (Cluster API Machine, Karpenter NodeClaim) and the once-per-node delete with its
history in ConfigMap gpuremediate-replaced, against the emulated API server with the two kinds as CRDs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.plugins.remediation import install_crd
from gpuremediate.actions.replace import (
    MACHINE_ANNOTATION,
    MACHINE_NAMESPACE_ANNOTATION,
    NODECLAIMS,
    PROVIDER_CLUSTER_API,
    PROVIDER_KARPENTER,
    NoTarget,
    Target,
    find_target,
    machines,
)
from gpuremediate.actions.replaced import DELETED, LIMIT, Entry, ReplacedHistory, Replacer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES
from sim.kubeapi import KubeAPIServer

NS = "gpuremediate-system"
CAPI_NS = "capi-workers"
MACHINE = machines("v1beta1")


def _crd(group: str, version: str, kind: str, plural: str, scope: str) -> dict[str, Any]:
    anything = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": scope,
                     "names": {"kind": kind, "listKind": kind + "List", "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": version, "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": anything}}]}}


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    for ns in (NS, CAPI_NS):
        client.create(NAMESPACES, {"metadata": {"name": ns}})
    install_crd(client, _crd("cluster.x-k8s.io", "v1beta1", "Machine", "machines", "Namespaced"),
                "cluster.x-k8s.io/v1beta1", "Machine")
    install_crd(client, _crd("karpenter.sh", "v1", "NodeClaim", "nodeclaims", "Cluster"), "karpenter.sh/v1",
                "NodeClaim")
    try:
        yield client
    finally:
        srv.stop()


def _machine(kube: KubeClient, name: str, owned: bool = True) -> dict[str, Any]:
    owners = [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": "gpu-workers-abc",
               "uid": "ms-uid", "controller": True, "blockOwnerDeletion": True}] if owned else []
    return kube.create(MACHINE, {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                                 "metadata": {"name": name, "namespace": CAPI_NS, "ownerReferences": owners},
                                 "spec": {"clusterName": "c1", "bootstrap": {}, "infrastructureRef": {}}}, CAPI_NS)


def _capi_node(machine: str, uid: str = "node-uid-1") -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "uid": uid, "annotations": {MACHINE_ANNOTATION: machine,
                                                                      MACHINE_NAMESPACE_ANNOTATION: CAPI_NS}},
            "spec": {"providerID": "aws:///us-east-1a/i-0abc"}}


def test_a_cluster_api_node_is_replaced_by_deleting_its_owned_machine_once(kube: KubeClient) -> None:
    _machine(kube, "gpu-workers-abc-x1")
    history = ReplacedHistory(kube, NS)
    replacer = Replacer(kube, history)
    outcome = replacer.replace(_capi_node("gpu-workers-abc-x1"), "xid-79 on GPU 3", 1000.0)
    assert outcome.done and "Machine capi-workers/gpu-workers-abc-x1 deleted" in outcome.detail
    assert kube.list(MACHINE, CAPI_NS)["items"] == []
    [entry] = history.entries()
    assert entry.state == DELETED and entry.provider == PROVIDER_CLUSTER_API and entry.node == "gpu-1"
    assert entry.provider_id == "aws:///us-east-1a/i-0abc" and entry.fault == "xid-79 on GPU 3"
    # a new Machine under the same name (its MachineSet's replacement) is never deleted by a second call
    _machine(kube, "gpu-workers-abc-x1")
    again = replacer.replace(_capi_node("gpu-workers-abc-x1"), "xid-79 on GPU 3", 1001.0)
    assert again.done and "not again" in again.detail
    assert len(kube.list(MACHINE, CAPI_NS)["items"]) == 1


def test_a_machine_without_an_owner_is_never_deleted(kube: KubeClient) -> None:
    _machine(kube, "lonely", owned=False)
    outcome = Replacer(kube, ReplacedHistory(kube, NS)).replace(_capi_node("lonely"), "xid-79", 1000.0)
    assert not outcome.done and "no controller owner" in outcome.detail
    assert len(kube.list(MACHINE, CAPI_NS)["items"]) == 1
    assert ReplacedHistory(kube, NS).entries() == []


def test_a_karpenter_node_is_replaced_by_deleting_its_nodeclaim(kube: KubeClient) -> None:
    claim = kube.create(NODECLAIMS, {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                                     "metadata": {"name": "gpu-pool-7xk2p"}, "spec": {}})
    node = {"metadata": {"name": "ip-10-0-1-5", "uid": "n-1", "ownerReferences": [
        {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "gpu-pool-7xk2p",
         "uid": claim["metadata"]["uid"]}]}}
    found = find_target(kube, node)
    assert isinstance(found, Target) and found.provider == PROVIDER_KARPENTER and found.namespace is None
    outcome = Replacer(kube, ReplacedHistory(kube, NS)).replace(node, "xid-95", 1000.0)
    assert outcome.done and kube.list(NODECLAIMS)["items"] == []


def test_a_dry_run_says_would_replace_and_deletes_nothing(kube: KubeClient) -> None:
    _machine(kube, "m1")
    outcome = Replacer(kube, ReplacedHistory(kube, NS), dry_run=True).replace(_capi_node("m1"), "xid-79", 1000.0)
    assert not outcome.done and outcome.detail.startswith("would replace: delete Machine capi-workers/m1")
    assert len(kube.list(MACHINE, CAPI_NS)["items"]) == 1 and ReplacedHistory(kube, NS).entries() == []


def test_killed_between_the_record_and_the_delete_the_next_run_deletes_that_object_only(kube: KubeClient) -> None:
    machine = _machine(kube, "m2")
    history = ReplacedHistory(kube, NS)
    entry = Entry("gpu-1", "node-uid-1", "", PROVIDER_CLUSTER_API, f"Machine {CAPI_NS}/m2", machine["metadata"]["uid"],
                  "xid-79", 1000.0)
    history.update(lambda entries: [*entries, entry])  # the first run wrote this, then died
    outcome = Replacer(kube, history).replace(_capi_node("m2"), "xid-79", 1001.0)
    assert outcome.done and kube.list(MACHINE, CAPI_NS)["items"] == []
    assert [e.state for e in history.entries()] == [DELETED]


def test_a_node_owned_by_nothing_known_has_no_built_in_target(kube: KubeClient) -> None:
    found = find_target(kube, {"metadata": {"name": "bare-metal-1"}})
    assert isinstance(found, NoTarget) and found.provider == "" and MACHINE_ANNOTATION in found.why


def test_the_history_is_bounded(kube: KubeClient) -> None:
    history = ReplacedHistory(kube, NS)
    many = [Entry(f"n{i}", f"u{i}", "", PROVIDER_KARPENTER, f"NodeClaim c{i}", f"c{i}", "x", float(i), DELETED)
            for i in range(LIMIT + 5)]
    history.update(lambda _entries: many)
    kept = history.entries()
    assert len(kept) == LIMIT and kept[0].node == "n5" and kept[-1].node == f"n{LIMIT + 4}"


def test_the_delete_is_pinned_to_the_object_found(kube: KubeClient) -> None:
    from gpuremediate.actions.replace import delete_target
    _machine(kube, "m3")
    stale = Target(PROVIDER_CLUSTER_API, MACHINE, "m3", CAPI_NS, "an-older-uid")
    assert delete_target(kube, stale) is False
    assert len(kube.list(MACHINE, CAPI_NS)["items"]) == 1


def test_killed_after_the_delete_before_the_entry_was_marked_the_next_run_sends_no_second_delete(
        kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Machine drains its node before it goes (its finalizer): a run killed after its delete, before marking the
    entry, finds it still there with a deletionTimestamp. That delete went: the next run marks the entry, and sends
    none (e2e/test_replace.py's restart scenario saw two)."""
    machine = _machine(kube, "m3")
    kube.patch(MACHINE, "m3", {"metadata": {"finalizers": ["machine.cluster.x-k8s.io"]}}, CAPI_NS)
    history = ReplacedHistory(kube, NS)
    entry = Entry("gpu-1", "node-uid-1", "", PROVIDER_CLUSTER_API, f"Machine {CAPI_NS}/m3", machine["metadata"]["uid"],
                  "xid-79", 1000.0)
    history.update(lambda entries: [*entries, entry])
    kube.delete(MACHINE, "m3", CAPI_NS)  # the first run's delete; then it died
    assert kube.get(MACHINE, "m3", CAPI_NS)["metadata"].get("deletionTimestamp")
    deletes: list[str] = []
    real_delete = kube.delete
    monkeypatch.setattr(kube, "delete", lambda res, name, *a, **k: (deletes.append(name), real_delete(res, name, *a,
                                                                                                      **k))[1])
    outcome = Replacer(kube, history).replace(_capi_node("m3"), "xid-79", 1001.0)
    assert outcome.done and "already being deleted: not deleted again" in outcome.detail, outcome.detail
    assert deletes == []
    assert [e.state for e in history.entries()] == [DELETED]
