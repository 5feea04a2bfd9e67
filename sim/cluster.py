"""A whole simulated GPU cluster in one process: the API emulator, gpu-sim serving one dcgm-exporter
per node, and the node simulator whose Jobs have real effects on the simulated GPUs.

Used by the demo and the e2e scenarios (target ``emulator``). A repair Job that succeeds does what
the real one would: ``reset-gpu`` resets the GPUs named in its ``GPU_IDS``; ``reboot`` makes the
node NotReady, then Ready with a new bootID, with its GPUs reset and its exporter restarted. A
validation Job succeeds or fails as ``set_validation(node, ok)`` says.

With ``agents=True`` every node also runs the node agent (``gpuremediate agent``, a thread per node in this
process): it reads the node's kernel log and nvidia-smi stand-in that gpu-sim writes (``GpuSim.kernel_xid``,
``driver_hang``, ``gpu_lost``) and publishes its NodeConditions, as the DaemonSet does. A reboot gives the
node a new boot id, so its agent reads the new boot's log from the start, as a restarted agent pod would.

With ``kubeconfig=`` it uses that API server instead of starting the emulator (a bare control plane:
kube-apiserver + kube-controller-manager without kubelets, the envtest/KWOK way): the node simulator plays
the kubelets and what the cluster needs is made if absent (namespaces, ServiceAccounts, the exporters'
DaemonSet and pods), so a second start on the same server finds them and goes on.

The cluster is busy by default, as a real one is: ``sim.busy.BusyWriter`` writes the Nodes all the time
(annotations, labels, heartbeats, the not-ready / unschedulable taints), so the controller's guarded node
patches meet 409s. ``GPUREMEDIATE_SIM_BUSY=0`` (or ``busy_writes_per_s=0``) turns it off. The node
simulator and the busy writer authenticate as users of their own (``BACKGROUND_USERS``), so an audit of
the API server's requests can tell their writes from the controller's.
"""

from __future__ import annotations

import contextlib
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuremediate.agent.run import Agent, AgentSettings
from gpuremediate.kube import errors, miniyaml
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import DAEMONSETS, NAMESPACES, PDBS, PODS, SERVICEACCOUNTS
from gpuremediate.policy.config import default_policy
from gpuremediate.signals.nvidiasmi import NvidiaSmiSource
from sim.busy import BusyWriter, writes_from_env
from sim.gpusim import GpuSim
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim

EXPORTER_NAMESPACE = "gpu-operator"
EXPORTER_LABEL = {"app": "nvidia-dcgm-exporter"}
EXPORTER_DAEMONSET = "nvidia-dcgm-exporter"
NAMESPACES_NEEDED = ("gpuremediate-system", "gpuremediate-jobs", EXPORTER_NAMESPACE, "workloads", "default")
JOB_LABEL = "gpuremediate.io/job"
SERVICEACCOUNTS_FILE = Path(__file__).resolve().parent.parent / "manifests" / "base" / "serviceaccounts.yaml"
NODESIM_USER = "system:node-sim"
BUSY_USER = "system:busy-writer"
AGENT_USER = "system:serviceaccount:gpuremediate-agent:gpuremediate-agent"
BACKGROUND_USERS = frozenset({NODESIM_USER, BUSY_USER, AGENT_USER})


@dataclass(frozen=True)
class AgentOptions:
    """The simulated nodes' agents: faster than the DaemonSet's defaults, so scenarios stay short."""

    interval_s: float = 0.5
    smi_timeout_s: float = 0.5
    hang_after: int = 2
    window_s: float = 300.0
    heartbeat_s: float = 30.0


@dataclass
class RunningAgent:
    agent: Agent
    stop: threading.Event
    thread: threading.Thread


def node_name(index: int) -> str:
    return f"gpu-node-{index}"


def install_service_accounts(client: KubeClient) -> None:
    """The ServiceAccounts of manifests/base (the controller's, the Jobs'): a pod naming one that does
    not exist is refused by the ServiceAccount admission plugin."""
    for doc in miniyaml.load_all(SERVICEACCOUNTS_FILE.read_text(encoding="utf-8")):
        if isinstance(doc, dict) and doc.get("kind") == "ServiceAccount":
            with contextlib.suppress(errors.AlreadyExists):
                client.create(SERVICEACCOUNTS, doc, doc["metadata"]["namespace"])


def daemonset(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """A DaemonSet for simulated pods to name as their owner. Where a real DaemonSet controller runs, it
    finds each GPU node served by the pod made there first, and OnDelete keeps it from replacing them."""
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": dict(labels)}, "updateStrategy": {"type": "OnDelete"},
                     "template": {"metadata": {"labels": dict(labels)},
                                  "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                                           "containers": [{"name": "exporter", "image": "gpu-sim:dev"}],
                                           "tolerations": [{"operator": "Exists"}]}}}}


class SimCluster:
    def __init__(
        self,
        nodes: int = 4,
        gpus: int = 8,
        *,
        grace_cap_s: float = 0.5,
        job_duration_s: float = 0.3,
        reboot_down_s: float = 1.0,
        ip_base: int = 11,
        busy_writes_per_s: float | None = None,
        kubeconfig: str | None = None,
        agents: bool | AgentOptions = False,
    ) -> None:
        self.node_names = [node_name(i) for i in range(1, nodes + 1)]
        self.gpus = gpus
        self.job_duration_s = job_duration_s
        self.reboot_down_s = reboot_down_s
        self.ip_base = ip_base
        self.busy_writes_per_s = writes_from_env() if busy_writes_per_s is None else busy_writes_per_s
        self.api = KubeAPIServer() if kubeconfig is None else None  # None: someone else's API server
        self._dir = tempfile.TemporaryDirectory(prefix="gpuremediate-sim-")
        self.gpusim = GpuSim(port=0, files_dir=str(Path(self._dir.name) / "hosts"))
        self.agent_options = agents if isinstance(agents, AgentOptions) else AgentOptions() if agents else None
        self.agents: dict[str, RunningAgent] = {}
        self.kubeconfig = kubeconfig or str(Path(self._dir.name) / "kubeconfig")
        self.client: KubeClient | None = None
        self.nodesim: NodeSim | None = None
        self.busy: BusyWriter | None = None
        self._exporter_owner = ""
        self._background_clients: list[KubeClient] = []
        self.validation_ok: dict[str, bool] = {}
        self.job_log: list[tuple[str, str, bool]] = []  # (node, job kind, succeeded)

    # ---- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> SimCluster:
        if self.api is not None:
            self.api.start()
            self.api.write_kubeconfig(self.kubeconfig)
        self.client = KubeClient(load_config(self.kubeconfig), qps=500, burst=1000)
        for i, name in enumerate(self.node_names):
            self.gpusim.add_node(name, gpus=self.gpus, ip=f"127.0.0.{self.ip_base + i}")
        self.gpusim.start()
        for ns in NAMESPACES_NEEDED:
            self._ensure_namespace(ns)
        install_service_accounts(self.kube)  # as applied from manifests/base: Job pods need theirs
        # The exporter pods' owner exists: the garbage collector deletes pods whose owner does not.
        self._exporter_owner = self._exporter_daemonset()
        self.nodesim = NodeSim(self._client_as(NODESIM_USER), grace_cap_s=0.5, tick_s=0.1)
        self.nodesim.on_job_finished = self._job_finished
        self.nodesim.job_succeeds = self.job_succeeds
        for name in self.node_names:
            # Each exporter pod exists before its node: a real DaemonSet controller finds the node served.
            self._exporter_pod(name)
            self.nodesim.add_node(name, gpus=self.gpus)
            self.nodesim.set_job_outcome(name, succeed=True, duration_s=self.job_duration_s)
        self.nodesim.start()
        self._wait_for_exporters()
        if self.agent_options is not None:
            agent_client = self._client_as(AGENT_USER)
            for name in self.node_names:
                self.agents[name] = self._start_agent(name, agent_client, self.agent_options)
        if self.busy_writes_per_s > 0:
            self.busy = BusyWriter(self._client_as(BUSY_USER), self.node_names, writes_per_s=self.busy_writes_per_s,
                                   taints=self.api is not None and not _emulator_taints_nodes(self.api)).start()
        return self

    def _exporter_daemonset(self) -> str:
        body = daemonset(EXPORTER_DAEMONSET, EXPORTER_NAMESPACE, EXPORTER_LABEL)
        try:
            return str(self.kube.create(DAEMONSETS, body, EXPORTER_NAMESPACE)["metadata"]["uid"])
        except errors.AlreadyExists:
            return str(self.kube.get(DAEMONSETS, EXPORTER_DAEMONSET, EXPORTER_NAMESPACE)["metadata"]["uid"])

    def _client_as(self, user: str) -> KubeClient:
        """A client authenticated as ``user`` (cluster-admin): a background component of its own. On
        someone else's API server, a client of the kubeconfig's own user."""
        if self.api is None:
            client = KubeClient(load_config(self.kubeconfig), qps=500, burst=1000)
            self._background_clients.append(client)
            return client
        token = secrets.token_hex(16)
        self.api.add_token(token, user, ("system:masters", "system:authenticated"))
        path = self.api.write_kubeconfig(Path(self._dir.name) / f"kubeconfig-{user.rsplit(':', 1)[-1]}", token)
        client = KubeClient(load_config(path), qps=500, burst=1000)
        self._background_clients.append(client)
        return client

    def _wait_for_exporters(self, timeout: float = 15.0) -> None:
        """Every node's exporter pod Running with its IP: the cluster starts out with GPU health known."""
        deadline = time.monotonic() + timeout
        while True:
            pods = self.kube.list(PODS, EXPORTER_NAMESPACE, label_selector="app=nvidia-dcgm-exporter")["items"]
            running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
                       and (p.get("status") or {}).get("podIP")]
            if len(running) >= len(self.node_names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(running)} of {len(self.node_names)} exporter pods Running after {timeout}s")
            time.sleep(0.05)

    def _start_agent(self, node: str, client: KubeClient, options: AgentOptions) -> RunningAgent:
        host = Path(self.gpusim.host_dir(node))
        settings = AgentSettings(
            node_name=node, kmsg_path=str(host / "kmsg"), state_path=str(host / "agent-state.json"),
            boot_id_path=str(host / "boot_id"), nvidia_smi=str(host / "nvidia-smi"),
            interval_s=options.interval_s, smi_timeout_s=options.smi_timeout_s, hang_after=options.hang_after,
            window_s=options.window_s, heartbeat_s=options.heartbeat_s)
        smi = NvidiaSmiSource(settings.nvidia_smi, node, options.smi_timeout_s,
                              runner=self.gpusim.nvidia_smi_runner(node))
        agent = Agent(settings, client, default_policy().for_node({}), smi=smi)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), name=f"agent-{node}", daemon=True)
        thread.start()
        return RunningAgent(agent, stop, thread)

    def _stop_agents(self) -> None:
        for running in self.agents.values():
            running.stop.set()
        for running in self.agents.values():
            running.thread.join(timeout=5.0)
        self.agents.clear()

    def stop(self) -> None:
        self._stop_agents()
        if self.busy is not None:
            self.busy.stop()
        if self.nodesim is not None:
            self.nodesim.stop()
        self.gpusim.stop()
        for client in [self.client, *self._background_clients]:
            if client is not None:
                client.close()
        if self.api is not None:
            self.api.stop()
        self._dir.cleanup()

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kube(self) -> KubeClient:
        assert self.client is not None, "start() the cluster first"
        return self.client

    @property
    def exporter_port(self) -> int:
        return self.gpusim.port

    def controller_args(self) -> list[str]:
        """``gpuremediate run`` flags that point the controller at this cluster."""
        return [
            "--kubeconfig", self.kubeconfig,
            "--exporter-namespace", EXPORTER_NAMESPACE,
            "--exporter-port", str(self.exporter_port),
        ]

    # ---- the world -----------------------------------------------------------------------------------

    def _ensure_namespace(self, name: str) -> None:
        with contextlib.suppress(errors.AlreadyExists):
            self.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def _exporter_pod(self, node: str) -> None:
        name = f"nvidia-dcgm-exporter-{node}"
        assert self.nodesim is not None
        # Bound to the node, by the DaemonSet's prefix: a pod a real DaemonSet controller makes there too.
        self.nodesim.set_pod_ip(EXPORTER_NAMESPACE, f"{EXPORTER_DAEMONSET}-", self.gpusim.node(node).ip, node=node)
        with contextlib.suppress(errors.AlreadyExists):  # kept from an earlier start on the same server
            self._create_exporter_pod(name, node)

    def _create_exporter_pod(self, name: str, node: str) -> None:
        self.kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": EXPORTER_NAMESPACE, "labels": dict(EXPORTER_LABEL),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                              "name": EXPORTER_DAEMONSET, "uid": self._exporter_owner,
                                              "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "exporter", "image": "gpu-sim:dev"}],
                     "tolerations": [{"operator": "Exists"}]},
        }, EXPORTER_NAMESPACE)

    def workload(self, name: str, node: str, *, gpus: int = 1, namespace: str = "workloads",
                 labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A Running pod bound to ``node`` asking for ``gpus`` GPUs."""
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        return self.kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": name}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "cuda:sample", "resources": resources}]},
        }, namespace)

    def pdb(self, name: str, selector: dict[str, str], *, min_available: int | str = 1,
            namespace: str = "workloads") -> dict[str, Any]:
        return self.kube.create(PDBS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}},
        }, namespace)

    def set_validation(self, node: str, ok: bool) -> None:
        self.validation_ok[node] = ok

    # ---- what Jobs do ----------------------------------------------------------------------------------

    def job_succeeds(self, node: str, pod: dict[str, Any]) -> bool:
        kind = (pod["metadata"].get("labels") or {}).get(JOB_LABEL, "")
        return self.validation_ok.get(node, True) if kind == "validate" else True

    def _job_finished(self, node: str, pod: dict[str, Any], succeeded: bool) -> None:
        kind = (pod["metadata"].get("labels") or {}).get(JOB_LABEL, "")
        self.job_log.append((node, kind, succeeded))
        if not succeeded:
            return
        if kind == "reset-gpu":
            for gpu in _gpu_ids(pod) or range(self.gpus):
                self.gpusim.reset_gpu(node, int(gpu))
        elif kind == "reboot":
            self.gpusim.reboot(node)
            assert self.nodesim is not None
            self.nodesim.reboot(node, down_s=self.reboot_down_s)


def _emulator_taints_nodes(api: KubeAPIServer) -> bool:
    """Whether the emulator runs kube-controller-manager's node lifecycle itself (sim.kube_nodes: the
    condition taints); where it does, the busy writer leaves them to it, as it does to a real one."""
    return hasattr(api.controllers, "nodes")


def _gpu_ids(pod: dict[str, Any]) -> list[str]:
    for container in pod.get("spec", {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "GPU_IDS" and env.get("value"):
                return [g for g in str(env["value"]).split(",") if g]
    return []
