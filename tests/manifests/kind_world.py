"""A stand-in for the kind cluster of e2e/kind/run.sh, to drive e2e.harness.KubeconfigCluster offline.

The API emulator (sim.kubeapi) plus what the harness uses of a real cluster beyond it:

- the subresources it reaches gpu-sim and the controller through: the pod proxy
  (``/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH``, forwarded to the pod's IP as the API server
  does), the service proxy of ``gpuremediate-metrics`` and pod logs;
- apps/v1 Deployments stored, and the controllers kind's kube-controller-manager runs for the kind
  overlay (FakeKindControllers): the Deployment's pods, one gpu-sim pod per GPU node (DaemonSet),
  each namespace's default ServiceAccount;
- sim.nodesim as the kubelet (pods Running and Ready, graceful deletions finished), and a real
  sim.gpusim.GpuSim serving each node's "pod IP".
"""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import CONFIGMAPS, DAEMONSETS, DEPLOYMENTS, NAMESPACES, PODS, SERVICEACCOUNTS, Resource
from sim.cluster import daemonset
from sim.gpusim import GpuSim
from sim.kube_http import Handler, Request
from sim.kube_resources import ResourceType
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim

SYSTEM_NS, JOBS_NS, EXPORTER_NS = "gpuremediate-system", "gpuremediate-jobs", "gpu-operator"
CONTROLLER_LABELS = {"app.kubernetes.io/name": "gpuremediate", "app.kubernetes.io/component": "controller"}
GPUSIM_LABELS = {"app": "nvidia-dcgm-exporter", "app.kubernetes.io/name": "gpu-sim"}
GPUSIM_CONTAINER_PORT = 9400  # manifests/overlays/kind/gpu-sim.yaml
POD_PROXY = re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<pod>[^/:]+):(?P<port>\d+)/proxy/(?P<rest>.*)")
POD_LOG = re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<pod>[^/]+)/log")
METRICS_PROXY = f"/api/v1/namespaces/{SYSTEM_NS}/services/gpuremediate-metrics:metrics/proxy/metrics"
SPEC_STATUS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})


def ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


class KindAPI(KubeAPIServer):
    """The emulator with Deployments stored and the proxy/log subresources the harness uses."""

    def __init__(self, gpusim_port: int) -> None:
        super().__init__()
        deployments = ResourceType("apps", "v1", "deployments", "Deployment", True, subresources=("status",),
                                   generation=True, create_status="clear", top_fields=SPEC_STATUS)
        self.types[("apps", "v1", "deployments")] = deployments
        self.gpusim_port = gpusim_port
        self.proxied: list[tuple[str, str]] = []  # (method, path) of every proxy/log request
        self.lookup: KubeClient | None = None

    def handle(self, h: Handler, req: Request) -> None:
        # Answers go out in several writes: without this, Nagle + delayed ACKs cost ~40 ms a request.
        h.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pod_proxy, pod_log = POD_PROXY.fullmatch(req.path), POD_LOG.fullmatch(req.path)
        if req.path != METRICS_PROXY and pod_proxy is None and pod_log is None:
            super().handle(h, req)
            return
        # Recorded before the answer goes out: the client may look at it as soon as it has its answer.
        self.proxied.append((req.method, req.raw_path))
        if pod_proxy is not None:
            self._pod_proxy(h, req, pod_proxy["ns"], pod_proxy["pod"], int(pod_proxy["port"]), pod_proxy["rest"])
        elif pod_log is not None:
            previous = " (previous)" if req.query.get("previous") == "true" else ""
            h.send_bytes(200, f"log of {pod_log['pod']}{previous}\n".encode(), {"Content-Type": "text/plain"})
        else:
            self._metrics(h)

    def _pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        assert self.lookup is not None
        return list(self.lookup.list(PODS, namespace, label_selector=selector)["items"])

    def _metrics(self, h: Handler) -> None:
        pods = [p for p in live(self._pods(SYSTEM_NS, "app.kubernetes.io/name=gpuremediate")) if ready(p)]
        if not pods:
            h.send_json(503, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                              "reason": "ServiceUnavailable",
                              "message": 'no endpoints available for service "gpuremediate-metrics"'})
            return
        text = f"# served by {pods[0]['metadata']['name']}\ngpuremediate_leader 1\n"
        h.send_bytes(200, text.encode(), {"Content-Type": "text/plain; version=0.0.4"})

    def _pod_proxy(self, h: Handler, req: Request, namespace: str, name: str, port: int, rest: str) -> None:
        assert self.lookup is not None
        try:
            pod = self.lookup.get(PODS, name, namespace)
        except errors.NotFound:
            h.send_json(404, {"kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound",
                              "message": f'pods "{name}" not found'})
            return
        if port != GPUSIM_CONTAINER_PORT:  # nothing listens there: the API server answers 503
            h.send_json(503, {"kind": "Status", "status": "Failure", "code": 503, "message": "connection refused"})
            return
        url = f"http://{pod['status']['podIP']}:{self.gpusim_port}/{rest}"
        forwarded = urllib.request.Request(url, data=req.body or None, method=req.method,
                                           headers={"Content-Type": req.headers.get("content-type", "")})
        try:
            with urllib.request.urlopen(forwarded, timeout=5) as resp:
                code, body = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            code, body = e.code, e.read()
        h.send_bytes(code, body)


class FakeKindControllers:
    """kube-controller-manager for what the kind overlay runs: the controller Deployment's pods,
    gpu-sim's DaemonSet pod on each GPU node, and every namespace's default ServiceAccount."""

    def __init__(self, client: KubeClient, nodes: list[str]) -> None:
        self.client = client
        self.nodes = nodes
        self.counter = itertools.count(1)
        self.errors: list[str] = []
        self.accounts_made: set[str] = set()  # namespaces whose default ServiceAccount exists
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-kcm", daemon=True)

    def start(self) -> FakeKindControllers:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.tick()
            except Exception as exc:  # kept for the test to show; the loop goes on as a controller's would
                self.errors.append(repr(exc))

    def tick(self) -> None:
        self._service_accounts()
        self._deployment()
        self._daemonset()

    def _service_accounts(self) -> None:
        for ns in self.client.list(NAMESPACES)["items"]:
            name = ns["metadata"]["name"]
            if name not in self.accounts_made:
                with contextlib.suppress(errors.AlreadyExists):
                    self.client.create(SERVICEACCOUNTS, {"metadata": {"name": "default", "namespace": name}}, name)
                self.accounts_made.add(name)

    def _deployment(self) -> None:
        try:
            want = int(self.client.get(DEPLOYMENTS, "gpuremediate", SYSTEM_NS)["spec"].get("replicas", 1))
        except errors.NotFound:
            return
        pods = live(self.client.list(PODS, SYSTEM_NS, label_selector="app.kubernetes.io/name=gpuremediate")["items"])
        for _ in range(want - len(pods)):
            self._pod(SYSTEM_NS, f"gpuremediate-{next(self.counter)}", CONTROLLER_LABELS, self.nodes[0],
                      DEPLOYMENTS, "gpuremediate")
        for pod in pods[want:]:
            with contextlib.suppress(errors.NotFound):
                self.client.delete(PODS, pod["metadata"]["name"], SYSTEM_NS)

    def _daemonset(self) -> None:
        pods = live(self.client.list(PODS, EXPORTER_NS, label_selector="app=nvidia-dcgm-exporter")["items"])
        covered = {p["spec"]["nodeName"] for p in pods}
        for node in self.nodes:
            if node not in covered:
                self._pod(EXPORTER_NS, f"gpu-sim-{node}-{next(self.counter)}", GPUSIM_LABELS, node,
                          DAEMONSETS, "gpu-sim")

    def _pod(self, namespace: str, name: str, labels: dict[str, str], node: str, owner: Resource,
             owner_name: str) -> None:
        """A pod owned by an object that exists (the garbage collector deletes a pod whose owner does not)."""
        uid = self.client.get(owner, owner_name, namespace)["metadata"]["uid"]
        self.client.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner.kind, "name": owner_name,
                                              "uid": uid, "controller": True}]},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "fake:dev"}]},
        }, namespace)


class KindWorld:
    """Four GPU nodes, the controller Deployment (2 replicas, as applied) and gpu-sim on every node."""

    def __init__(self, tmp: Path, nodes: int = 4) -> None:
        self.nodes = [f"kind-worker{i if i > 1 else ''}" for i in range(1, nodes + 1)]
        self.gpusim = GpuSim(port=0)
        self.ips = {node: f"127.0.0.{61 + i}" for i, node in enumerate(self.nodes)}
        for node in self.nodes:
            self.gpusim.add_node(node, gpus=8, ip=self.ips[node])
        self.gpusim.start()
        self.api = KindAPI(self.gpusim.port)
        self.api.start()
        self.kubeconfig = self.api.write_kubeconfig(tmp / "kubeconfig")
        self.client = KubeClient(load_config(self.kubeconfig), qps=500, burst=1000)
        self.api.lookup = KubeClient(load_config(self.kubeconfig), qps=500, burst=1000)
        for ns in (SYSTEM_NS, JOBS_NS, EXPORTER_NS, "workloads"):  # workloads: left by an earlier run
            self.client.create(NAMESPACES, {"metadata": {"name": ns}})
        self.nodesim = NodeSim(self.client, grace_cap_s=0.2, tick_s=0.05)
        for node in self.nodes:
            self.nodesim.add_node(node, gpus=8)
            self.nodesim.set_pod_ip(EXPORTER_NS, f"gpu-sim-{node}-", self.ips[node], node=node)
        self.client.create(CONFIGMAPS, {"metadata": {"name": "gpuremediate-policy", "namespace": SYSTEM_NS},
                                        "data": {"policy.toml": "# the kind overlay's\n"}}, SYSTEM_NS)
        self.client.create(DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment",
                                         "metadata": {"name": "gpuremediate", "namespace": SYSTEM_NS},
                                         "spec": {"replicas": 2}}, SYSTEM_NS)
        self.client.create(DAEMONSETS, daemonset("gpu-sim", EXPORTER_NS, GPUSIM_LABELS), EXPORTER_NS)
        self.controllers = FakeKindControllers(self.client, self.nodes).start()
        self.nodesim.start()
        self._wait_rolled_out()

    def _wait_rolled_out(self, timeout: float = 15.0) -> None:
        """As run.sh waits for the rollouts: every GPU node's gpu-sim pod Running before a scenario starts."""
        deadline = time.monotonic() + timeout
        selector = ",".join(f"{k}={v}" for k, v in GPUSIM_LABELS.items())
        while True:
            pods = self.client.list(PODS, EXPORTER_NS, label_selector=selector)["items"]
            if sum((p.get("status") or {}).get("phase") == "Running" for p in pods) >= len(self.nodes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"gpu-sim pods not Running on every node after {timeout}s: {len(pods)} pods")
            time.sleep(0.05)

    def stop(self) -> None:
        self.controllers.stop()
        self.nodesim.stop()
        self.client.close()
        assert self.api.lookup is not None
        self.api.lookup.close()
        self.api.stop()
        self.gpusim.stop()
