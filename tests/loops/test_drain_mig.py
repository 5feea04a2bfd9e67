"""The drain scopes on a mixed-strategy MIG node (issue 13): ``impacted`` drains the pods of every MIG
instance of the faulty GPU and no other, ``gpu`` drains every MIG pod. The readings come from a scrape
shaped as dcgm-exporter writes MIG series: one per GPU instance (``GPU_I_ID``, ``GPU_I_PROFILE``) with the
parent's ``gpu`` and ``UUID``, the pod on its instance's series (hand-made after NVIDIA/dcgm-exporter's
kubernetes_mig_test.go fixtures and the A30 scrape in NVIDIA/dcgm-exporter#317)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from gpuremediate.actions.pods import NodePods
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, PODS
from gpuremediate.loops.drain import DrainLoop
from gpuremediate.policy.config import PolicyFile, loads_policy
from gpuremediate.policy.evaluate import PolicyMemory, evaluate
from gpuremediate.signals.dcgm import readings_from_samples
from gpuremediate.signals.exposition import parse
from gpuremediate.signals.model import NodeReadings
from gpuremediate.vocab import states
from gpuremediate.vocab.record import Fault, NodeRecord
from sim.kubeapi import KubeAPIServer

NODE = "mig-node"
GPU2, GPU3 = "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49", "GPU-265c9814-6156-355b-e589-ff2064894f16"
# (gpu, UUID, GPU_I_ID, profile, pod or "", XID)
INSTANCES = [("2", GPU2, "1", "3g.40gb", "infer-a", 0), ("2", GPU2, "2", "1g.10gb", "", 0),
             ("3", GPU3, "1", "3g.40gb", "train-b", 0), ("3", GPU3, "2", "1g.10gb", "notebook-c", 79),
             ("3", GPU3, "3", "1g.10gb", "", 0)]
RESOURCE = {"3g.40gb": "nvidia.com/mig-3g.40gb", "1g.10gb": "nvidia.com/mig-1g.10gb"}


def scrape() -> str:
    lines = ["# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
             "# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]
    for gpu, uuid, gi, profile, pod, xid in INSTANCES:
        labels = (f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:1B:00.0",device="nvidia{gpu}",'
                  f'modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}",Hostname="{NODE}"')
        if pod:
            labels += f',container="main",namespace="w",pod="{pod}"'
        lines.append(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}")
    return "\n".join(lines) + "\n"


def readings() -> NodeReadings:
    [one] = readings_from_samples(parse(scrape()).samples, node=NODE, source="exporter", observed_at=1000.0)
    return one


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}})
    for _gpu, _uuid, _gi, profile, pod, _xid in INSTANCES:
        if pod:
            workload(client, pod, {RESOURCE[profile]: "1"})
    workload(client, "cpu-only", {"cpu": "1"})
    yield client
    client.close()
    srv.stop()


def workload(kube: KubeClient, name: str, limits: dict[str, str]) -> None:
    kube.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "w"},
                       "spec": {"nodeName": NODE, "containers": [
                           {"name": "main", "image": "cuda", "resources": {"limits": limits}}]}}, "w")


def loop_for(kube: KubeClient, policy: PolicyFile) -> DrainLoop:
    loop = DrainLoop.__new__(DrainLoop)
    loop.ctx = SimpleNamespace(  # type: ignore[assignment]
        client=kube, policy=policy, readings={NODE: readings()},
        policy_for=lambda node: policy.for_node(node["metadata"].get("labels") or {}))
    loop.node_pods = NodePods(kube, max_watches=0)  # no watch: each read a LIST
    return loop


def draining(gpus: tuple[str, ...], action: str = "reset-gpu") -> NodeRecord:
    fault = Fault(kind="xid", code="79", gpus=gpus, fingerprint="xid-79", action=action, first_seen=1.0,
                  last_seen=1.0, message="")
    return NodeRecord(state=states.DRAINING, since=2.0, reason="fault", fault=fault, cordoned_by_us=True)


def targets(kube: KubeClient, scope: str, record: NodeRecord) -> list[str]:
    policy = loads_policy(f'[drain]\nscope = "{scope}"\n')
    node: dict[str, Any] = {"metadata": {"name": NODE, "labels": {"nvidia.com/mig.strategy": "mixed"}}}
    chosen = loop_for(kube, policy).targets(node, record, policy.for_node({}).drain)
    return sorted(p["metadata"]["name"] for p in chosen)


def test_the_xid_on_one_instance_is_a_fault_of_the_parent_gpu() -> None:
    found = evaluate(readings(), PolicyFile().for_node({}), PolicyMemory(), 1000.0).findings
    assert [(f.code, f.gpus) for f in found] == [("79", (GPU3,))]


def test_impacted_drains_every_instance_of_the_faulty_gpu_and_nothing_else(kube: KubeClient) -> None:
    assert targets(kube, "impacted", draining((GPU3,))) == ["notebook-c", "train-b"]


def test_gpu_scope_drains_every_mig_pod(kube: KubeClient) -> None:
    assert targets(kube, "gpu", draining((GPU3,))) == ["infer-a", "notebook-c", "train-b"]


def test_a_fault_naming_no_gpu_impacts_every_instance(kube: KubeClient) -> None:
    assert targets(kube, "impacted", draining(())) == ["infer-a", "notebook-c", "train-b"]


def test_a_reboot_after_the_drain_takes_every_pod_whatever_the_scope(kube: KubeClient) -> None:
    """The reboot would end the pods an impacted drain leaves, without asking their PDBs."""
    assert targets(kube, "impacted", draining((GPU3,), "reboot")) == ["cpu-only", "infer-a", "notebook-c", "train-b"]
