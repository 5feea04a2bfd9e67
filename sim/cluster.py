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

With ``gpu_operator=True`` the nodes are GPU Operator nodes (``OperatorSim``): they carry the operands' deploy
labels ``nvidia.com/gpu.deploy.<operand>=true``, and the device plugin, DCGM, dcgm-exporter and GPU Feature
Discovery run as DaemonSet-like pods there while their label is ``"true"``: set to anything else, the pod is
deleted (graceful: the kubelet stand-in finishes the deletion), set back, it is created again after
``OperatorOptions.start_delay_s``. While an operand's pod exists it holds the node's GPUs (``GpuSim.hold``), so
a reset Job fails "In use by another client"; while the dcgm-exporter pod is gone, gpu-sim does not serve that
node. ``products`` sets ``nvidia.com/gpu.product`` per node; a product whose GPUs reset only all together
(``*SXM2*``, ``*SXM3*``: pre-Ampere NVLink) refuses a reset Job that names only some of them.

With ``nvl72=(18, 1)`` the cluster also has GB200 NVL72 racks (issue 28), one per entry, of that many compute
trays (``rack-<r>-tray-<t>``, 4 GPUs each) after the other nodes: gpu-sim serves their fabric fields (one NVLink
domain per rack) and NodeSim registers them with GPU Feature Discovery's ``nvidia.com/gpu.clique`` and product.

The cluster is busy by default, as a real one is: ``sim.busy.BusyWriter`` writes the Nodes all the time
(annotations, labels, heartbeats, the not-ready / unschedulable taints), so the controller's guarded node
patches meet 409s. ``GPUREMEDIATE_SIM_BUSY=0`` (or ``busy_writes_per_s=0``) turns it off. The node
simulator and the busy writer authenticate as users of their own (``BACKGROUND_USERS``), so an audit of
the API server's requests can tell their writes from the controller's.
"""

from __future__ import annotations

import contextlib
import fnmatch
import secrets
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuremediate.agent.run import Agent, AgentSettings
from gpuremediate.kube import errors, miniyaml
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import DAEMONSETS, NAMESPACES, NODES, PDBS, PODS, SERVICEACCOUNTS
from gpuremediate.policy.config import default_policy, parse_policy
from gpuremediate.preflight import EXIT_UNKNOWN, run_preflight
from gpuremediate.signals.fabric import CLIQUE_LABEL
from gpuremediate.signals.nvidiasmi import NvidiaSmiSource
from gpuremediate.vocab.preflight import CONTAINER_NAME as PREFLIGHT_CONTAINER
from sim.busy import BusyWriter, writes_from_env
from sim.device_plugin import DevicePluginHealth
from sim.dra_claims import ensure_device_class
from sim.gpusim import NVL72_GPUS, NVL72_MODEL, GpuSim, gpu_uuid
from sim.kubeapi import KubeAPIServer
from sim.node_owners import OwnerSim
from sim.nodesim import NodeSim

EXPORTER_NAMESPACE = "gpu-operator"
EXPORTER_LABEL = {"app": "nvidia-dcgm-exporter"}
EXPORTER_DAEMONSET = "nvidia-dcgm-exporter"
NAMESPACES_NEEDED = ("gpuremediate-system", "gpuremediate-jobs", EXPORTER_NAMESPACE, "workloads", "default")
JOB_LABEL = "gpuremediate.io/job"
# manifests/base/serviceaccounts.yaml: in a checkout, the repository's; installed, the wheel's copy of it (setup.py
# copies it into the package at build time, so `gpuremediate demo` runs from anywhere).
SERVICEACCOUNTS_MANIFEST = Path("manifests") / "base" / "serviceaccounts.yaml"


def packaged_manifest(relative: Path) -> Path:
    """A file of manifests/ the simulated cluster reads: the package's copy where installed, else the repository's."""
    here = Path(__file__).resolve().parent
    packaged = here / relative
    return packaged if packaged.is_file() else here.parent / relative


SERVICEACCOUNTS_FILE = packaged_manifest(SERVICEACCOUNTS_MANIFEST)
NODESIM_USER = "system:node-sim"
BUSY_USER = "system:busy-writer"
AGENT_USER = "system:serviceaccount:gpuremediate-agent:gpuremediate-agent"
OPERATOR_USER = "system:serviceaccount:gpu-operator:gpu-operator"
OWNERS_USER = "system:serviceaccount:capi-system:capi-manager"  # sim.node_owners (Karpenter's too)
BACKGROUND_USERS = frozenset({NODESIM_USER, BUSY_USER, AGENT_USER, OPERATOR_USER, OWNERS_USER})
DEPLOY_LABEL = "nvidia.com/gpu.deploy."
PRODUCT_LABEL = "nvidia.com/gpu.product"
NVL72_PRODUCT = "NVIDIA-GB200"  # GPU feature discovery's nvidia.com/gpu.product of a GB200 NVL72 tray
# The GPU Operator's operands that hold the GPUs: deploy-label suffix -> (pod app label = DaemonSet name, the
# GPU client it runs). The exporter's DaemonSet is EXPORTER_DAEMONSET (its pods are served by gpu-sim).
OPERANDS: dict[str, tuple[str, str]] = {
    "device-plugin": ("nvidia-device-plugin-daemonset", "nvidia-device-plugin"),
    "dcgm": ("nvidia-dcgm", "nv-hostengine"),
    "dcgm-exporter": (EXPORTER_DAEMONSET, "dcgm-exporter"),
    "gpu-feature-discovery": ("gpu-feature-discovery", "gpu-feature-discovery"),
}
WHOLE_NODE_PRODUCTS = ("*SXM2*", "*SXM3*")  # pre-Ampere NVLink: every GPU of the group in one reset
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
# The operands' DaemonSets other than the exporter's (a server that outlives a GPU Operator cluster keeps them).
OPERAND_DAEMONSETS = tuple(app for app, _ in OPERANDS.values() if app != EXPORTER_DAEMONSET)
STUCK_FINALIZER = "sim.example.com/stuck"  # an operand pod stuck terminating (OperatorSim.stuck, real DaemonSets)


@dataclass(frozen=True)
class AgentOptions:
    """The simulated nodes' agents: faster than the DaemonSet's defaults, so scenarios stay short."""

    interval_s: float = 0.5
    smi_timeout_s: float = 0.5
    hang_after: int = 2
    window_s: float = 300.0
    heartbeat_s: float = 30.0
    policy: Mapping[str, Any] | None = None  # the agents' policy file as parsed TOML (None: the built-in policy)


@dataclass(frozen=True)
class OperatorOptions:
    """The simulated GPU Operator: how long a DaemonSet takes to start an operand's pod again, and the grace
    period of its pods (the kubelet stand-in finishes a deletion after min(grace, its cap))."""

    start_delay_s: float = 0.5
    grace_s: int = 1
    tick_s: float = 0.1
    # Operands the ClusterPolicy does not deploy: their deploy label is "true" (the operator labels every GPU
    # node so) but no DaemonSet runs them, like the chart's default dcgm.enabled=false.
    disabled: frozenset[str] = frozenset()


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


def daemonset(name: str, namespace: str, labels: dict[str, str],
              node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A DaemonSet for simulated pods to name as their owner. Where a real DaemonSet controller runs, it
    finds each GPU node served by the pod made there first, and OnDelete keeps it from replacing them."""
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": dict(labels)}, "updateStrategy": {"type": "OnDelete"},
                     "template": {"metadata": {"labels": dict(labels)},
                                  "spec": {"nodeSelector": dict(node_selector or GPU_NODE_SELECTOR),
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
        gpu_operator: bool | OperatorOptions = False,
        products: Mapping[str, str] | None = None,
        tls: bool = False,
        dra: bool = False,
        nvl72: tuple[int, ...] = (),
        device_plugin: str = "",
        node_owners: str = "",
        client_class: type[KubeClient] = KubeClient,
    ) -> None:
        """``tls``: the emulator serves https (a self-signed certificate; ``api.write_kubeconfig(path,
        embed_ca=True)`` writes a kubeconfig kubectl accepts with its bearer token). ``dra``: NodeSim publishes
        each node's ResourceSlice as NVIDIA's DRA driver does (sim.nodesim_dra) and the DeviceClass exists.
        ``device_plugin``: "" (allocatable stays as set), ``health`` (NVIDIA's device plugin takes a GPU with a
        critical XID out of allocatable nvidia.com/gpu until it is reset: sim.device_plugin) or ``blind`` (it
        never does). ``node_owners``: "" (nobody owns the nodes), ``cluster-api`` (a Machine of a MachineSet each) or
        ``karpenter`` (a NodeClaim each): sim.node_owners serves the kinds and replaces a deleted one by a new node
        (``owners.replaced``). ``client_class``: the client every part of the simulated cluster talks to the server
        with (the e2e harness's notes each create: e2e/ledger.py)."""
        self.client_class = client_class
        self.node_names = [node_name(i) for i in range(1, nodes + 1)]
        # NVL72 racks (issue 28): trays per rack (18 a full one; 1 a single-tray domain), after the other nodes
        self.racks = {f"rack-{r}": [f"rack-{r}-tray-{t}" for t in range(1, trays + 1)]
                      for r, trays in enumerate(nvl72, 1)}
        self.node_names += [tray for trays in self.racks.values() for tray in trays]
        self.gpus = gpus
        self.job_duration_s = job_duration_s
        self.reboot_down_s = reboot_down_s
        self.ip_base = ip_base
        self.busy_writes_per_s = writes_from_env() if busy_writes_per_s is None else busy_writes_per_s
        self.api = KubeAPIServer(tls=tls) if kubeconfig is None else None  # None: someone else's API server
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
        self.operator_options = gpu_operator if isinstance(gpu_operator, OperatorOptions) else \
            OperatorOptions() if gpu_operator else None
        self.operator: OperatorSim | None = None
        self.products = dict(products or {})
        self.reset_refusals: list[tuple[str, str]] = []  # (node, why the reset Job failed), as nvidia-smi says it
        self.controller_flags: list[str] = []  # more ``gpuremediate run`` flags a scenario asks for
        self.preflights: list[tuple[str, int, str]] = []  # (node, exit code, termination message), each played
        self.dra = dra
        self.device_plugin_mode = device_plugin
        self.device_plugin: DevicePluginHealth | None = None
        self.node_owners = node_owners
        self.owners: OwnerSim | None = None
        self.joined: list[str] = []  # nodes registered after the start (replacements)

    # ---- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> SimCluster:
        if self.api is not None:
            self.api.start()
            self.api.write_kubeconfig(self.kubeconfig)
        self.client = self.client_class(load_config(self.kubeconfig), qps=500, burst=1000)
        for i, name in enumerate(self.node_names):
            self._add_sim_node(name, f"127.0.0.{self.ip_base + i}")
        self.gpusim.start()
        for ns in NAMESPACES_NEEDED:
            self._ensure_namespace(ns)
        for ns in NAMESPACES_NEEDED:
            self._wait_for_default_service_account(ns)
        install_service_accounts(self.kube)  # as applied from manifests/base: Job pods need theirs
        # The exporter pods' owner exists: the garbage collector deletes pods whose owner does not.
        self._exporter_owner = self._exporter_daemonset()
        self.nodesim = NodeSim(self._client_as(NODESIM_USER), grace_cap_s=0.5, tick_s=0.1, dra=self.dra)
        if self.dra:
            ensure_device_class(self.kube)
        self.nodesim.on_job_finished = self._job_finished
        self.nodesim.job_succeeds = self.job_succeeds
        self.nodesim.preflight = self.run_preflight
        served = self._served_nodes()
        for name in self.node_names:
            # Each exporter pod exists before its node: a real DaemonSet controller finds the node served.
            self._exporter_pod(name, served)
            self.nodesim.add_node(name, gpus=self._gpus_of(name), labels=self._node_labels(name))
            self.nodesim.set_job_outcome(name, succeed=True, duration_s=self.job_duration_s)
        self.nodesim.start()
        if self.device_plugin_mode:
            self.device_plugin = DevicePluginHealth(self.gpusim, self.nodesim, self.node_names,
                                                    self.device_plugin_mode).start()
        self._wait_for_exporters()
        if self.operator_options is not None:
            # The operator's exporter follows its deploy label, set on every node by now (a real DaemonSet
            # controller would delete the exporter pods of nodes without it).
            self._exporter_node_selector({DEPLOY_LABEL + "dcgm-exporter": "true"})
            self.operator = OperatorSim(self, self._client_as(OPERATOR_USER), self.operator_options,
                                        daemonsets_run=self.api is None).start()
            self.operator.wait_running()
        if self.agent_options is not None:
            agent_client = self._client_as(AGENT_USER)
            for name in self.node_names:
                self.agents[name] = self._start_agent(name, agent_client, self.agent_options)
        if self.node_owners:
            self.owners = OwnerSim(self._client_as(OWNERS_USER), self.node_owners, self.join_node,
                                   self.leave_node).adopt(list(self.node_names)).start()
        if self.busy_writes_per_s > 0:
            self.busy = BusyWriter(self._client_as(BUSY_USER), self.node_names, writes_per_s=self.busy_writes_per_s,
                                   taints=self.api is not None and not _emulator_taints_nodes(self.api)).start()
        return self

    def _rack_of(self, node: str) -> str | None:
        return next((rack for rack, trays in self.racks.items() if node in trays), None)

    def _gpus_of(self, node: str) -> int:
        return NVL72_GPUS if self._rack_of(node) else self.gpus

    def _add_sim_node(self, name: str, ip: str) -> None:
        rack = self._rack_of(name)
        if rack is None:
            self.gpusim.add_node(name, gpus=self.gpus, ip=ip)
            return
        self.gpusim.add_node(name, gpus=NVL72_GPUS, ip=ip, model=NVL72_MODEL)
        self.gpusim.set_fabric(name, str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{rack}.gpu-sim")), 1)

    def _node_labels(self, node: str) -> dict[str, str]:
        labels = {DEPLOY_LABEL + operand: "true" for operand in OPERANDS} if self.operator_options else {}
        if node in self.products:
            labels[PRODUCT_LABEL] = self.products[node]
        fabric = self.gpusim.node(node).fabric
        if fabric is not None:  # GPU Feature Discovery's labels of an NVL72 tray
            labels |= {CLIQUE_LABEL: fabric.clique, PRODUCT_LABEL: NVL72_PRODUCT}
        return labels

    def _exporter_daemonset(self) -> str:
        """The exporters' DaemonSet (its uid), on every GPU node: one kept from an earlier cluster on the same
        server (a GPU Operator one's followed a deploy label) is set back to that, before any node loses the
        label."""
        body = daemonset(EXPORTER_DAEMONSET, EXPORTER_NAMESPACE, EXPORTER_LABEL)
        try:
            return str(self.kube.create(DAEMONSETS, body, EXPORTER_NAMESPACE)["metadata"]["uid"])
        except errors.AlreadyExists:
            return self._exporter_node_selector(GPU_NODE_SELECTOR)

    def _exporter_node_selector(self, selector: dict[str, str]) -> str:
        """The exporters' DaemonSet selecting the nodes ``selector`` names (its uid)."""
        ds = self.kube.get(DAEMONSETS, EXPORTER_DAEMONSET, EXPORTER_NAMESPACE)
        current = ds["spec"]["template"]["spec"].get("nodeSelector") or {}
        if current != selector:
            patch = {k: None for k in current if k not in selector} | selector
            ds = self.kube.patch(DAEMONSETS, EXPORTER_DAEMONSET,
                                 {"spec": {"template": {"spec": {"nodeSelector": patch}}}}, EXPORTER_NAMESPACE)
        return str(ds["metadata"]["uid"])

    def _served_nodes(self) -> set[str]:
        """Nodes an exporter pod (of any name: a real DaemonSet controller names its own) is bound to."""
        pods = self.kube.list(PODS, EXPORTER_NAMESPACE, label_selector="app=nvidia-dcgm-exporter")["items"]
        return {str(p["spec"].get("nodeName")) for p in pods if not p["metadata"].get("deletionTimestamp")}

    def _client_as(self, user: str) -> KubeClient:
        """A client authenticated as ``user`` (cluster-admin): a background component of its own. On
        someone else's API server, a client of the kubeconfig's own user."""
        if self.api is None:
            client = self.client_class(load_config(self.kubeconfig), qps=500, burst=1000)
            self._background_clients.append(client)
            return client
        token = secrets.token_hex(16)
        self.api.add_token(token, user, ("system:masters", "system:authenticated"))
        path = self.api.write_kubeconfig(Path(self._dir.name) / f"kubeconfig-{user.rsplit(':', 1)[-1]}", token)
        client = self.client_class(load_config(path), qps=500, burst=1000)
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
            window_s=options.window_s, heartbeat_s=options.heartbeat_s, sysfs_root=str(host / "sys"))
        smi = NvidiaSmiSource(settings.nvidia_smi, node, options.smi_timeout_s,
                              runner=self.gpusim.nvidia_smi_runner(node))
        policy = parse_policy(options.policy) if options.policy is not None else default_policy()
        agent = Agent(settings, client, policy.for_node({}), smi=smi,
                      kmsg_wait=self.gpusim.kmsg_waiter(node))
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
        if self.owners is not None:
            self.owners.stop()
        if self.operator is not None:
            self.operator.stop()
        if self.busy is not None:
            self.busy.stop()
        if self.device_plugin is not None:
            self.device_plugin.stop()
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
            *self.controller_flags,
        ]

    # ---- the world -----------------------------------------------------------------------------------

    def _ensure_namespace(self, name: str) -> None:
        with contextlib.suppress(errors.AlreadyExists):
            self.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def _wait_for_default_service_account(self, namespace: str, timeout: float = 30.0) -> None:
        """The namespace's ``default`` ServiceAccount exists: until kube-controller-manager's serviceaccount
        controller makes it, the ServiceAccount admission plugin refuses every pod there ("403 ... serviceaccount
        "default" not found"; it waits only ~1 s). A fresh control plane's first namespaces race it (issue 43)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.kube.get(SERVICEACCOUNTS, "default", namespace)
                return
            except errors.NotFound:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no ServiceAccount {namespace}/default after {timeout:.0f}s: is "
                                       "kube-controller-manager running (its serviceaccount controller)?") from None
                time.sleep(0.05)

    def _exporter_pod(self, node: str, served: set[str]) -> None:
        name = f"nvidia-dcgm-exporter-{node}"
        assert self.nodesim is not None
        # Bound to the node, by the DaemonSet's prefix: a pod a real DaemonSet controller makes there too.
        self.nodesim.set_pod_ip(EXPORTER_NAMESPACE, f"{EXPORTER_DAEMONSET}-", self.gpusim.node(node).ip, node=node)
        if node in served:  # kept from an earlier start on the same server
            return
        with contextlib.suppress(errors.AlreadyExists):
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

    def join_node(self, name: str, taints: list[dict[str, Any]]) -> None:
        """A new GPU node: gpu-sim serves it, the exporters' DaemonSet has a pod there, NodeSim registers it. A name
        gpu-sim serves already (a node replaced under its old name) gets a new machine there (``renew_node``)."""
        assert self.nodesim is not None
        if name in self.gpusim.nodes():
            self.gpusim.renew_node(name)
        else:
            self.gpusim.add_node(name, gpus=self.gpus, ip=f"127.0.0.{self.ip_base + len(self.gpusim.nodes())}")
        self._exporter_pod(name, set())
        self.nodesim.add_node(name, gpus=self.gpus, labels=self._node_labels(name), taints=taints)
        self.nodesim.set_job_outcome(name, succeed=True, duration_s=self.job_duration_s)
        self.joined.append(name)

    def leave_node(self, name: str) -> None:
        """The machine under ``name`` is gone: NodeSim stops playing its kubelet, and its pods are deleted as the
        pod garbage collector deletes those bound to a Node that no longer exists (no kubelet to finish them)."""
        assert self.nodesim is not None
        self.nodesim.remove_node(name)
        for pod in self.kube.list(PODS)["items"]:
            if pod["spec"].get("nodeName") == name:
                with contextlib.suppress(errors.NotFound):
                    self.kube.delete(PODS, pod["metadata"]["name"], pod["metadata"]["namespace"],
                                     grace_period_seconds=0)

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

    def run_preflight(self, node: str, pod: dict[str, Any]) -> tuple[int, str]:
        """The preflight init container on ``node``: ``gpuremediate preflight``'s check against gpu-sim's
        nvidia-smi for that node (every GPU of the node: the simulation assigns no device to a pod, so no GPU
        list, and ``--expect-gpus`` as the webhook wrote it) and the built-in policy; (exit code, termination
        message), ``--on-unknown pass`` read from its args."""
        source = NvidiaSmiSource(str(Path(self.gpusim.host_dir(node)) / "nvidia-smi"), node, 5.0,
                                 runner=self.gpusim.nvidia_smi_runner(node))
        args = next((c.get("args") or [] for c in (*(pod["spec"].get("initContainers") or []),
                                                   *(pod["spec"].get("containers") or []))
                     if c.get("name") == PREFLIGHT_CONTAINER), [])  # the idle-node check's is its container
        expected = args[args.index("--expect-gpus") + 1:][:1] if "--expect-gpus" in args else []
        outcome = run_preflight(source, default_policy().for_node({}), None,
                                expected=int(expected[0]) if expected and expected[0].isdigit() else 0)
        passes = outcome.exit_code == EXIT_UNKNOWN and "--on-unknown" in args \
            and args[args.index("--on-unknown") + 1:][:1] == ["pass"]
        self.preflights.append((node, outcome.exit_code, outcome.message))
        return (0, outcome.message) if passes else (outcome.exit_code, outcome.message)

    def job_succeeds(self, node: str, pod: dict[str, Any]) -> bool:
        kind = (pod["metadata"].get("labels") or {}).get(JOB_LABEL, "")
        if kind == "reset-gpu":
            gpus, unknown = self._gpu_indexes(node, pod)
            refusal = f"No GPU found with ID {unknown[0]!r}" if unknown else self.reset_refusal(node, gpus)
            if refusal:
                self.reset_refusals.append((node, refusal))
            return not refusal
        return self.validation_ok.get(node, True) if kind == "validate" else True

    def _gpu_indexes(self, node: str, pod: dict[str, Any]) -> tuple[list[int], list[str]]:
        """The Job's GPU_IDS as ``nvidia-smi -i`` reads them (an index or a UUID each), and those naming no GPU."""
        gpus = range(self._gpus_of(node))
        by_id = {**{str(i): i for i in gpus}, **{gpu_uuid(node, i): i for i in gpus}}
        ids = _gpu_ids(pod)
        return [by_id[g] for g in ids if g in by_id], [g for g in ids if g not in by_id]

    def reset_refusal(self, node: str, gpus: list[int]) -> str:
        """What nvidia-smi --gpu-reset would say refusing these GPUs ("" : it resets them): a client holds them,
        or the node's GPUs reset only all together and some are missing from the command."""
        held = self.gpusim.reset_refusal(node, gpus)
        if held:
            return held
        product = self.products.get(node, "")
        whole = any(fnmatch.fnmatchcase(product, pattern) for pattern in WHOLE_NODE_PRODUCTS)
        if whole and gpus and sorted(set(gpus)) != list(range(self.gpus)):
            return (f"GPU {gpus[0]}: the GPUs of its NVLink group ({product}) must be reset in the same command "
                    f"(asked for {','.join(map(str, gpus))} of {self.gpus})")
        return ""

    def _job_finished(self, node: str, pod: dict[str, Any], succeeded: bool) -> None:
        kind = (pod["metadata"].get("labels") or {}).get(JOB_LABEL, "")
        self.job_log.append((node, kind, succeeded))
        if not succeeded:
            return
        if kind == "reset-gpu":
            for gpu in self._gpu_indexes(node, pod)[0] or range(self._gpus_of(node)):
                self.gpusim.reset_gpu(node, gpu)
        elif kind == "reboot":
            self.gpusim.reboot(node)
            assert self.nodesim is not None
            self.nodesim.reboot(node, down_s=self.reboot_down_s)


@dataclass
class _Operand:
    """One operand's pod on one node, as its DaemonSet keeps it."""

    due_at: float = 0.0  # monotonic time its pod is (re)created at; 0: not scheduled
    holding: bool = False


class OperatorSim:
    """The GPU Operator's DaemonSets for the operands on every node (``SimCluster(gpu_operator=True)``): a pod
    runs on a node while the node's deploy label is "true" and holds its GPUs while it exists; the exporter's
    absence takes gpu-sim's endpoint for that node down. ``stuck(node, operand)`` keeps a pod from leaving
    (a pod stuck terminating), so a reset sequence's wait for the operands to go times out.

    On the emulator OperatorSim plays the DaemonSet controller too: it deletes and creates the operand pods
    as their labels change (named ``<daemonset>-<node>``). Where a real kube-controller-manager runs
    (``daemonsets_run``: someone else's API server), the DaemonSets do that themselves (the scheduler binds
    their pods, named by the DaemonSet controller); OperatorSim only follows their pods, and a stuck pod is
    one holding ``STUCK_FINALIZER`` (deleted, it stays terminating)."""

    def __init__(self, cluster: SimCluster, client: KubeClient, options: OperatorOptions, *,
                 daemonsets_run: bool = False) -> None:
        self.cluster = cluster
        self.client = client
        self.options = options
        self.daemonsets_run = daemonsets_run
        self.owners: dict[str, str] = {}  # DaemonSet name -> uid
        self.state: dict[tuple[str, str], _Operand] = {}
        self.stuck_pods: set[tuple[str, str]] = set()
        self.exporter_off: set[str] = set()  # nodes whose endpoint the operator took down
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator-sim", daemon=True)

    def start(self) -> OperatorSim:
        for operand, (app, _) in self.operands.items():
            body = daemonset(app, EXPORTER_NAMESPACE, {"app": app}, node_selector={DEPLOY_LABEL + operand: "true"})
            body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = self.options.grace_s
            try:
                self.owners[app] = str(self.client.create(DAEMONSETS, body, EXPORTER_NAMESPACE)["metadata"]["uid"])
            except errors.AlreadyExists:
                self.owners[app] = str(self.client.get(DAEMONSETS, app, EXPORTER_NAMESPACE)["metadata"]["uid"])
        if not self.daemonsets_run:
            for node in self.cluster.node_names:  # the operands run before the scenario starts
                for operand in self.operands:
                    self._create(node, operand)
        self._thread.start()
        return self

    @property
    def operands(self) -> dict[str, tuple[str, str]]:
        """The operands deployed: OPERANDS less the disabled ones."""
        return {k: v for k, v in OPERANDS.items() if k not in self.options.disabled}

    def wait_running(self, timeout: float = 15.0) -> None:
        """Every operand's pod Running on every node (and holding its GPUs)."""
        want = {(node, operand) for node in self.cluster.node_names for operand in self.operands}
        deadline = time.monotonic() + timeout
        while {key for key, state in self.state.items() if state.holding} != want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"operand pods not all Running after {timeout}s")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        if self.daemonsets_run:  # let a stuck pod go: the server outlives this cluster
            for node, operand in list(self.stuck_pods):
                self.stuck(node, operand, False)

    def stuck(self, node: str, operand: str, stuck: bool = True) -> None:
        if stuck:
            self.stuck_pods.add((node, operand))
        else:
            self.stuck_pods.discard((node, operand))
        if self.daemonsets_run:
            for pod in self._pods_of(self._operator_pods(), node, operand):
                self._finalize(pod, stuck)

    @staticmethod
    def pod_name(operand: str, node: str) -> str:
        return f"{OPERANDS[operand][0]}-{node}"

    def _run(self) -> None:
        while not self._stop.wait(self.options.tick_s):
            try:
                self.tick()
            except (errors.ApiError, errors.TransportError) as exc:
                self.errors.append(str(exc))

    def tick(self) -> None:
        if self.daemonsets_run:
            self._follow()
            return
        pods = {p["metadata"]["name"]: p for p in self.client.list(PODS, EXPORTER_NAMESPACE)["items"]}
        for node in self.client.list(NODES)["items"]:
            name = node["metadata"]["name"]
            if name not in self.cluster.node_names:
                continue
            labels = node["metadata"].get("labels") or {}
            for operand in self.operands:
                pod = pods.get(self.pod_name(operand, name))
                self._sync(name, operand, labels.get(DEPLOY_LABEL + operand) == "true", pod)

    def _operator_pods(self) -> list[dict[str, Any]]:
        return list(self.client.list(PODS, EXPORTER_NAMESPACE)["items"])

    def _pods_of(self, pods: list[dict[str, Any]], node: str, operand: str) -> list[dict[str, Any]]:
        """The operand's pods bound to ``node`` (its DaemonSet's pods: labelled with its app), oldest first."""
        app = OPERANDS[operand][0]
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == app
                and (p.get("spec") or {}).get("nodeName") == node]
        return sorted(mine, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))

    def _follow(self) -> None:
        """A real DaemonSet controller makes and removes the pods: hold the GPUs while one runs on the node
        (terminating included), serve the exporter while a running one is not terminating, keep stuck pods."""
        pods = self._operator_pods()
        for node in self.cluster.node_names:
            for operand in self.operands:
                mine = self._pods_of(pods, node, operand)
                if (node, operand) in self.stuck_pods:
                    for pod in mine:
                        self._finalize(pod, True)
                running = [p for p in mine if (p.get("status") or {}).get("phase") == "Running"]
                live = [p for p in running if not p["metadata"].get("deletionTimestamp")]
                self.state.setdefault((node, operand), _Operand())
                chosen = live or running
                self._hold(node, operand, chosen[0] if chosen else None)

    def _finalize(self, pod: dict[str, Any], stuck: bool) -> None:
        """Add or remove STUCK_FINALIZER (the other finalizers as they are)."""
        meta = pod["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != STUCK_FINALIZER]
        if stuck:
            finalizers.append(STUCK_FINALIZER)
        if finalizers == list(meta.get("finalizers") or []):
            return
        with contextlib.suppress(errors.NotFound):
            self.client.patch(PODS, meta["name"], {"metadata": {"finalizers": finalizers or None}},
                              EXPORTER_NAMESPACE)

    def _sync(self, node: str, operand: str, wanted: bool, pod: dict[str, Any] | None) -> None:
        state = self.state.setdefault((node, operand), _Operand())
        now = time.monotonic()
        if wanted and pod is None:
            if not state.due_at:
                state.due_at = now + self.options.start_delay_s
            elif now >= state.due_at:
                self._create(node, operand)
                state.due_at = 0.0
        elif not wanted:
            state.due_at = 0.0
            deleting = pod is not None and bool(pod["metadata"].get("deletionTimestamp"))
            if pod is not None and not deleting and (node, operand) not in self.stuck_pods:
                with contextlib.suppress(errors.NotFound):
                    self.client.delete(PODS, pod["metadata"]["name"], EXPORTER_NAMESPACE,
                                       grace_period_seconds=self.options.grace_s)
        self._hold(node, operand, pod)

    def _hold(self, node: str, operand: str, pod: dict[str, Any] | None) -> None:
        """A pod holds the GPUs from its start until it is gone (terminating included); the exporter serves
        only while its pod runs and is not terminating."""
        state = self.state[(node, operand)]
        running = pod is not None and (pod.get("status") or {}).get("phase") == "Running"
        if running != state.holding:
            self.cluster.gpusim.hold(node, OPERANDS[operand][1], running)
            state.holding = running
        if operand != "dcgm-exporter":
            return
        serving = running and pod is not None and not pod["metadata"].get("deletionTimestamp")
        if not serving and node not in self.exporter_off:
            self.exporter_off.add(node)
            self.cluster.gpusim.set_down(node, "refuse")
        elif serving and node in self.exporter_off:
            self.exporter_off.discard(node)
            self.cluster.gpusim.set_down(node, None)
            self.cluster.gpusim.restart_exporter(node)  # a new exporter process

    def _create(self, node: str, operand: str) -> None:
        app = OPERANDS[operand][0]
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.pod_name(operand, node), "namespace": EXPORTER_NAMESPACE,
                         "labels": {"app": app, "app.kubernetes.io/managed-by": "gpu-operator"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": app,
                                              "uid": self.owners[app], "controller": True}]},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": self.options.grace_s,
                     "containers": [{"name": operand, "image": f"{operand}:sim"}],
                     "tolerations": [{"operator": "Exists"}]},
        }
        with contextlib.suppress(errors.AlreadyExists):
            self.client.create(PODS, body, EXPORTER_NAMESPACE)


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
