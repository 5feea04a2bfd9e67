"""The simulated node owners (sim.node_owners): Cluster API Machines of a MachineSet and Karpenter NodeClaims as
CRDs, and a deleted one replaced by a new node, as the gpuremediate replace rung reads and deletes them."""

from __future__ import annotations

import pytest

from gpuremediate.actions.replace import PROVIDER_CLUSTER_API, PROVIDER_KARPENTER, Target, delete_target, find_target
from gpuremediate.kube import errors
from gpuremediate.kube.resources import NODES, PODS
from sim.cluster import EXPORTER_NAMESPACE, SimCluster
from sim.node_owners import (
    CAPI_NAMESPACE,
    MACHINE_FINALIZER,
    MACHINES,
    MACHINESETS,
    NODECLAIM_FINALIZER,
    NODECLAIMS,
    OwnerSim,
)
from sim.waiting import wait_for

NODE = "gpu-node-1"


def _gone(cluster: SimCluster, node: str) -> bool:
    try:
        cluster.kube.get(NODES, node)
    except errors.NotFound:
        return True
    return False


def _replaced(cluster: SimCluster) -> str:
    owners = cluster.owners
    assert owners is not None
    wait_for(lambda: owners.replaced and owners.replaced[-1][1], 10, "the replacement node registered")
    return owners.replaced[-1][1]


@pytest.mark.parametrize("provider", [PROVIDER_CLUSTER_API, PROVIDER_KARPENTER])
def test_a_deleted_owner_takes_its_node_away_and_a_new_node_joins(provider: str) -> None:
    with SimCluster(nodes=2, gpus=2, busy_writes_per_s=0, node_owners=provider) as cluster:
        found = find_target(cluster.kube, cluster.kube.get(NODES, NODE))
        assert isinstance(found, Target), found
        assert found.provider == provider
        obj = cluster.kube.get(found.resource, found.name, found.namespace)
        assert obj["metadata"]["finalizers"] == [MACHINE_FINALIZER if provider == PROVIDER_CLUSTER_API
                                                 else NODECLAIM_FINALIZER]
        assert delete_target(cluster.kube, found)
        new = _replaced(cluster)
        assert _gone(cluster, NODE)
        assert cluster.owners is not None and cluster.owners.replaced == [(NODE, new)]
        with pytest.raises(errors.NotFound):  # the finalizer removed once the node went
            cluster.kube.get(found.resource, found.name, found.namespace)
        node = wait_for(lambda: cluster.kube.get(NODES, new), 5, "the new node")
        assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
        assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
        replacement = find_target(cluster.kube, node)
        assert isinstance(replacement, Target) and replacement.name != found.name
        exporters = cluster.kube.list(PODS, EXPORTER_NAMESPACE)["items"]
        assert {p["spec"]["nodeName"] for p in exporters} == {"gpu-node-2", new}


def test_the_machine_is_a_machinesets_and_the_node_carries_cluster_apis_annotations() -> None:
    with SimCluster(nodes=1, gpus=2, busy_writes_per_s=0, node_owners=PROVIDER_CLUSTER_API) as cluster:
        annotations = cluster.kube.get(NODES, NODE)["metadata"]["annotations"]
        machine = cluster.kube.get(MACHINES, annotations["cluster.x-k8s.io/machine"], CAPI_NAMESPACE)
        machineset = cluster.kube.get(MACHINESETS, "gpu-workers", CAPI_NAMESPACE)
        owner = machine["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("MachineSet", machineset["metadata"]["uid"],
                                                                       True)
        assert machine["status"]["nodeRef"]["name"] == NODE
        assert annotations["cluster.x-k8s.io/cluster-namespace"] == CAPI_NAMESPACE
        assert cluster.kube.get(NODES, NODE)["spec"]["providerID"] == machine["spec"]["providerID"]
        with pytest.raises(errors.ApiError):  # the schema's types hold (clusterName is a string)
            cluster.kube.create(MACHINES, {**machine, "metadata": {"name": "bad", "namespace": CAPI_NAMESPACE},
                                           "spec": {**machine["spec"], "clusterName": 7}}, CAPI_NAMESPACE)


def test_a_nodeclaim_owns_its_node_and_a_startup_taint_comes_with_the_replacement() -> None:
    taint = {"key": "gpuremediate.io/unvalidated", "effect": "NoSchedule"}
    with SimCluster(nodes=1, gpus=2, busy_writes_per_s=0) as cluster:
        owners = OwnerSim(cluster.kube, PROVIDER_KARPENTER, cluster.join_node, cluster.leave_node,
                          startup_taint=taint).adopt([NODE]).start()
        try:
            ref = cluster.kube.get(NODES, NODE)["metadata"]["ownerReferences"][0]
            claim = cluster.kube.get(NODECLAIMS, ref["name"])
            assert (ref["kind"], ref["uid"]) == ("NodeClaim", claim["metadata"]["uid"])
            assert claim["status"]["nodeName"] == NODE
            cluster.kube.delete(NODECLAIMS, ref["name"])
            wait_for(lambda: owners.replaced and owners.replaced[-1][1], 10, "the replacement")
            new = cluster.kube.get(NODES, owners.replaced[-1][1])
            assert new["spec"]["taints"] == [taint]
        finally:
            owners.stop()


@pytest.mark.parametrize("provider", [PROVIDER_CLUSTER_API, PROVIDER_KARPENTER])
def test_a_replacement_under_the_old_name_is_a_new_node_on_a_new_machine(provider: str) -> None:
    with SimCluster(nodes=2, gpus=2, busy_writes_per_s=0, node_owners=provider) as cluster:
        owners = cluster.owners
        assert owners is not None
        owners.same_name = True
        old = cluster.kube.get(NODES, NODE)
        old_gpus = [g.uuid for g in cluster.gpusim.node(NODE).gpus]
        cluster.gpusim.inject(NODE, 1, "dbe", 1)
        assert cluster.gpusim.problems(NODE)
        found = find_target(cluster.kube, old)
        assert isinstance(found, Target)
        assert delete_target(cluster.kube, found)
        assert _replaced(cluster) == NODE
        assert owners.replaced == [(NODE, NODE)]
        node = wait_for(lambda: _node_with_new_uid(cluster, old["metadata"]["uid"]), 10, "the node registered again")
        assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
        replacement = find_target(cluster.kube, node)  # its own owner object, not the deleted one
        assert isinstance(replacement, Target)
        assert replacement.name != found.name and replacement.uid != found.uid
        assert cluster.gpusim.problems(NODE) == []  # another machine: the old one's fault did not come along
        assert [g.uuid for g in cluster.gpusim.node(NODE).gpus] != old_gpus
        exporters = wait_for(lambda: [p for p in cluster.kube.list(PODS, EXPORTER_NAMESPACE)["items"]
                                      if p["spec"]["nodeName"] == NODE], 5, "the exporter pod on the new node")
        assert len(exporters) == 1


def _node_with_new_uid(cluster: SimCluster, old_uid: str) -> dict[str, object] | None:
    try:
        node = cluster.kube.get(NODES, NODE)
    except errors.NotFound:
        return None
    return node if node["metadata"]["uid"] != old_uid else None
