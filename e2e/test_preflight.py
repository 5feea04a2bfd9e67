"""The preflight (issue 46) end to end: the controller serves its mutating webhook over HTTPS (a test certificate
made with openssl), the emulator calls it as kube-apiserver would from the kustomize component's
MutatingWebhookConfiguration (sim.kube_webhooks) and a real kube-apiserver (target ``apiserver``) calls it too;
NodeSim plays the init container from gpu-sim's GPUs, and a failed preflight makes the node's ``preflight-failed``
finding, cordoned and repaired per the policy."""

from __future__ import annotations

import base64
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import WORKLOAD_NS, Cluster, target_name
from gpuremediate.fleet import explain_node
from gpuremediate.kube import errors, miniyaml
from gpuremediate.kube.resources import NAMESPACES, PODS, Resource
from gpuremediate.vocab.preflight import CONTAINER_NAME, KIND_PREFLIGHT
from sim.gpusim import gpu_uuid

ROOT = Path(__file__).resolve().parents[1]
SERVICE = "gpuremediate-preflight"
SERVICE_NS = "gpuremediate-system"
CONFIGS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                   "MutatingWebhookConfiguration", False)
OPTED_IN = "train"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Preflight:
    """The cluster, and the namespace opted in for this scenario (its own name: on a real server a deleted
    namespace takes a while to go, and the next scenario's must not be that one)."""

    cluster: Cluster
    namespace: str


@pytest.fixture
def preflight(cluster: Cluster, tmp_path: Path) -> Iterator[Preflight]:
    """The controller with its webhook on, the webhook configuration installed, a namespace opted in. The emulator
    routes the configuration's Service to the controller's port; a real kube-apiserver (target ``apiserver``, no
    Service network) calls the same webhook by ``clientConfig.url`` on loopback, its certificate naming both."""
    cluster.require("serve the controller's webhook to the API server (the emulator's routes or loopback)")
    if target_name() not in ("emulator", "apiserver") or shutil.which("openssl") is None:
        pytest.skip("needs the emulator or a local control plane (the webhook on loopback) and openssl")
    certs = tmp_path / "webhook-tls"
    certs.mkdir()
    name = f"{SERVICE}.{SERVICE_NS}.svc"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name},IP:127.0.0.1", "-keyout", str(certs / "tls.key"),
                    "-out", str(certs / "tls.crt")], check=True, capture_output=True)
    port = free_port()
    sim: Any = cluster.sim  # type: ignore[attr-defined]  # EmulatorCluster (and ApiserverCluster)
    sim.controller_flags = ["--preflight-webhook-port", str(port), "--preflight-webhook-cert-dir", str(certs),
                            "--preflight-image", "gpuremediate:e2e"]
    config = miniyaml.loads((ROOT / "manifests/components/preflight/mutatingwebhookconfiguration.yaml").read_text())
    client = config["webhooks"][0]["clientConfig"]
    if target_name() == "emulator":
        sim.api.webhooks.routes[f"{SERVICE_NS}/{SERVICE}:443"] = f"127.0.0.1:{port}"
    else:
        client["url"] = f"https://127.0.0.1:{port}{client.pop('service')['path']}"
    client["caBundle"] = base64.b64encode((certs / "tls.crt").read_bytes()).decode()
    cluster.kube.create(CONFIGS, config)
    namespace = f"{OPTED_IN}-{secrets.token_hex(3)}"
    cluster.kube.create(NAMESPACES, {"metadata": {"name": namespace,
                                                  "labels": {"gpuremediate.io/preflight": "enabled"}}})
    sim._wait_for_default_service_account(namespace)
    yield Preflight(cluster, namespace)
    cluster.stop_controller()
    assert cluster.log_problems() == []


def gpu_pod(cluster: Cluster, name: str, node: str, namespace: str, **meta: Any) -> dict[str, Any]:
    return cluster.kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "train", "image": cluster.workload_image(),
                                 "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}, namespace)


def init_names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"].get("initContainers") or []]


def phase(cluster: Cluster, name: str, namespace: str) -> str:
    try:
        return str((cluster.kube.get(PODS, name, namespace).get("status") or {}).get("phase"))
    except errors.NotFound:
        return "gone"


def test_a_failed_preflight_names_the_gpu_and_the_node_is_repaired(preflight: Preflight) -> None:
    cluster, ns = preflight.cluster, preflight.namespace
    good, bad = cluster.nodes[0], cluster.nodes[1]
    cluster.start_controller()
    cluster.exporter_down(bad)  # the exporter says nothing of it: only the preflight can find the fault
    cluster.sim.gpusim.inject_dbe(bad, 2, 1)  # type: ignore[attr-defined]  # in process: its listener refuses

    healthy = gpu_pod(cluster, "on-good", good, ns)
    assert init_names(healthy) == [CONTAINER_NAME]
    assert healthy["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    cluster.wait(lambda: phase(cluster, "on-good", ns) == "Running", 15, "the healthy node's pod running")

    assert init_names(gpu_pod(cluster, "on-bad", bad, ns)) == [CONTAINER_NAME]
    cluster.wait(lambda: cluster.unschedulable(bad), 30, f"{bad} cordoned for its failed preflight",
                 seen=lambda: cluster.summary(bad))
    record = cluster.record(bad)
    assert record is not None and record.fault is not None and record.fault.kind == KIND_PREFLIGHT, record
    assert gpu_uuid(bad, 2) in record.fault.message, record.fault.message
    played = {(node, code) for node, code, _ in cluster.sim.preflights}  # type: ignore[attr-defined]
    assert {(good, 0), (bad, 1)} <= played, played
    cluster.wait(lambda: cluster.record(bad) is not None and cluster.record(bad).state == "healthy"  # type: ignore
                 and not cluster.unschedulable(bad), 60, f"{bad} repaired and validated",
                 seen=lambda: cluster.summary(bad))
    assert not cluster.unschedulable(good) and phase(cluster, "on-good", ns) == "Running"


def test_opted_out_daemonset_and_other_namespaces_untouched_and_a_down_webhook_blocks_nothing(
        preflight: Preflight) -> None:
    cluster, ns = preflight.cluster, preflight.namespace
    node = cluster.nodes[0]
    cluster.start_controller()
    skipped = gpu_pod(cluster, "opted-out", node, ns, annotations={"gpuremediate.io/preflight": "skip"})
    owner = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "controller": True,
              "uid": "0b6f3c8e-4e7a-4f39-9d1e-5c1f3a7b2d10"}]
    daemon = gpu_pod(cluster, "daemon-pod", node, ns, ownerReferences=owner)
    elsewhere = gpu_pod(cluster, "not-opted-in", node, WORKLOAD_NS)
    assert [init_names(p) for p in (skipped, daemon, elsewhere)] == [[], [], []]
    assert init_names(gpu_pod(cluster, "checked", node, ns)) == [CONTAINER_NAME]  # the webhook is up

    cluster.stop_controller()  # the webhook with it: failurePolicy Ignore lets pods be created as they are
    during = gpu_pod(cluster, "webhook-down", node, ns)
    assert init_names(during) == []
    cluster.wait(lambda: phase(cluster, "webhook-down", ns) == "Running", 15,
                 "the pod made while the webhook is down")


def test_an_xid_79_fails_the_preflight_naming_the_lost_gpu_and_the_node_is_acted_on(preflight: Preflight) -> None:
    """The GPU falls off the bus (the kernel logs XID 79; nvidia-smi names it lost, exit 15) with the exporter down
    and no agent: only the preflight can tell. It fails the pod's init container naming the GPU (never "fit" on
    fewer GPUs than the pod was given), the node gets preflight-failed, is cordoned and repaired (a reboot brings
    a lost GPU back) and is healthy again."""
    cluster, ns = preflight.cluster, preflight.namespace
    bad = cluster.nodes[1]
    cluster.start_controller()
    cluster.exporter_down(bad)
    cluster.sim.gpusim.gpu_lost(bad, 3)  # type: ignore[attr-defined]  # in process: XID 79 in its kernel log

    pod = gpu_pod(cluster, "on-lost", bad, ns)
    assert "--expect-gpus" in pod["spec"]["initContainers"][0]["args"]
    cluster.wait(lambda: cluster.unschedulable(bad), 30, f"{bad} cordoned for its failed preflight",
                 seen=lambda: cluster.summary(bad))
    played = [(code, message) for node, code, message in cluster.sim.preflights  # type: ignore[attr-defined]
              if node == bad]
    assert played and played[0][0] == 1 and "gpu-lost" in played[0][1], played
    bus = cluster.sim.gpusim.node(bad).gpus[3].pci_bus_id[-12:].lower()  # type: ignore[attr-defined]
    assert f"GPU pci{bus}: gpu-lost: " in played[0][1], played
    record = cluster.record(bad)
    assert record is not None and record.fault is not None and record.fault.kind == KIND_PREFLIGHT, record
    assert bus in record.fault.message, record.fault.message
    told = explain_node(cluster.kube, bad)  # type: ignore[arg-type]  # the record as the annotation keeps it
    assert f"  Failed preflight: pod {ns}/on-lost at " in told and f"GPU(s) pci{bus} (gpu-lost" in told, told
    cluster.wait(lambda: cluster.record(bad) is not None and cluster.record(bad).state == "healthy"  # type: ignore
                 and not cluster.unschedulable(bad), 120, f"{bad} repaired and validated",
                 seen=lambda: cluster.summary(bad))
    assert len(cluster.sim.gpusim.node(bad).present) == 8  # type: ignore[attr-defined]  # back on the bus
