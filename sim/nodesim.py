"""A kubelet stand-in for many nodes, talking to any API server through `KubeClient`.

It registers Nodes (Ready, GPU capacity, a bootID), makes pods bound to its nodes Running and Ready,
runs Job pods for a set time and ends them Succeeded or Failed, finishes graceful deletions (a grace-0
delete after min(grace, grace_cap_s)), and can reboot a node (NotReady for a while, then Ready with a
new bootID). Pods bound to a node it does not know stay Pending.

A node can be given MIG (``set_mig``: the single or mixed strategy, as the device plugin and GPU feature
discovery show it in capacity, allocatable and labels) and GPUs the device plugin calls unhealthy
(``set_unhealthy``: in capacity, not in allocatable). Such a node admits pods as a kubelet does: one asking
for more of an extended resource than allocatable leaves is Failed with reason ``OutOf<resource>``.

It plays the preflight init container the webhook adds (``gpuremediate-preflight``, issue 46) as a kubelet runs
an init container: before the pod's containers, through the ``preflight`` hook (node, pod) -> (exit code,
termination message) that a simulated cluster sets (sim.cluster: ``gpuremediate preflight``'s check against
gpu-sim's nvidia-smi); no hook: it passes. Exit 0: the pod runs on, the init container Completed. Otherwise the
init container is terminated with that exit code and message: a ``restartPolicy: Never`` pod is Failed; any other
stays Pending (``Init:CrashLoopBackOff``: state waiting, lastState terminated, restartCount 1), as the kubelet
leaves it (NodeSim does not run the check again).

With ``dra=True`` it also publishes each node's ResourceSlice as NVIDIA's DRA driver for GPUs would (driver
``gpu.nvidia.com``, pool = node, devices ``gpu-0``.. with the ``uuid`` gpu-sim uses: sim.nodesim_dra); off by default.

As a kubelet does, it renews each node's Lease in ``kube-node-lease`` (holderIdentity = node name,
leaseDurationSeconds 40, every ``lease_renew_s``: the kubelet's 0.25 x duration), and posts the Ready
condition's lastHeartbeatTime every ``heartbeat_s``; a node that is down (rebooting) does neither, so a
node lifecycle controller sees its Lease lapse.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.leader import micro_time
from gpuremediate.kube.resources import LEASES, NODES, PODS, RESOURCE_SLICES
from gpuremediate.vocab.preflight import CONTAINER_NAME as PREFLIGHT_CONTAINER
from sim import nodesim_dra
from sim.kube_controllers import is_ready
from sim.kube_store import now_time
from sim.ticker import Ticker

KUBELET_VERSION = "v1.28.7"
GPU = "nvidia.com/gpu"
PRODUCT = "NVIDIA-H100-80GB-HBM3"  # GPU feature discovery's nvidia.com/gpu.product
NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40  # the kubelet's nodeLeaseDurationSeconds default


@dataclass
class JobOutcome:
    succeed: bool = True
    duration_s: float = 0.5


@dataclass(frozen=True)
class PodIP:
    """The IP pods of one name prefix get (an exporter's: where gpu-sim serves that node)."""
    namespace: str
    name_prefix: str
    ip: str
    node: str | None = None

    def matches(self, pod: dict[str, Any], node: str) -> bool:
        meta = pod["metadata"]
        return (meta.get("namespace") == self.namespace and str(meta.get("name", "")).startswith(self.name_prefix)
                and self.node in (None, node))


@dataclass
class SimNode:
    name: str
    index: int
    gpus: int
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    down_until: float = 0.0
    ip_counter: int = 1
    ready_since: str = field(default_factory=now_time)  # the Ready condition's lastTransitionTime
    lease_renewed: float = 0.0  # monotonic time of the last renewal (0: never)
    heartbeat_at: float = 0.0  # monotonic time of the last status heartbeat
    mig_strategy: str = ""  # "" (no MIG), "single" or "mixed"
    mig_profiles: tuple[str, ...] = ()  # the GPU instances of each MIG GPU, e.g. ("3g.40gb", "1g.10gb")
    mig_gpus: int = 0  # how many GPUs are in MIG mode (mixed: the rest stay whole)
    unhealthy: dict[str, int] = field(default_factory=dict)  # resource -> devices the device plugin holds back
    admits: bool = False  # checks extended resources at admission (nodes given MIG or unhealthy GPUs)

    def gpu_capacity(self) -> dict[str, int]:
        """The GPU resources the device plugin lists, as the kubelet puts them in capacity."""
        if self.mig_strategy == "single":
            return {GPU: self.mig_gpus * len(self.mig_profiles)}
        out = {GPU: self.gpus - self.mig_gpus, **{f"nvidia.com/mig-{p}": n for p, n in _profile_counts(self).items()}}
        return {name: count for name, count in out.items() if count > 0}

    def gpu_allocatable(self) -> dict[str, int]:
        return {name: max(0, count - self.unhealthy.get(name, 0)) for name, count in self.gpu_capacity().items()}

    def gfd_labels(self) -> dict[str, str]:
        """What GPU feature discovery labels (its README: single overrides gpu.count and gpu.product)."""
        if not self.mig_strategy:
            return {"nvidia.com/gpu.count": str(self.gpus), "nvidia.com/gpu.product": PRODUCT}
        labels = {"nvidia.com/mig.strategy": self.mig_strategy, "nvidia.com/mig.config.state": "success"}
        if self.mig_strategy == "single":
            profile = self.mig_profiles[0]
            return {**labels, "nvidia.com/mig.config": f"all-{profile}",
                    "nvidia.com/gpu.count": str(self.gpu_capacity()[GPU]),
                    "nvidia.com/gpu.product": f"{PRODUCT}-MIG-{profile}"}
        counts = {f"nvidia.com/mig-{p}.count": str(n) for p, n in _profile_counts(self).items()}
        return {**labels, **counts, "nvidia.com/mig.config": "custom", "nvidia.com/gpu.count": str(self.gpus),
                "nvidia.com/gpu.product": PRODUCT}

    @property
    def down(self) -> bool:
        return time.monotonic() < self.down_until


class NodeSim(Ticker):
    thread_name = "nodesim"

    def __init__(self, client: KubeClient, grace_cap_s: float = 2.0, tick_s: float = 0.1, *,
                 lease_renew_s: float = 10.0, heartbeat_s: float = 10.0, dra: bool = False) -> None:
        super().__init__(tick_s)
        self.client = client
        self.dra = dra  # publish a ResourceSlice per node (sim.nodesim_dra)
        self.grace_cap_s = grace_cap_s
        self.lease_renew_s = lease_renew_s
        self.heartbeat_s = heartbeat_s
        self.nodes: dict[str, SimNode] = {}
        self.outcomes: dict[str, JobOutcome] = {}
        self.pulls: dict[str, float] = {}  # node or node/kind -> seconds a Job pod waits (its image pulling)
        self.pending_since: dict[str, float] = {}  # pod uid -> when it was first seen pending here
        self.pod_ips: list[PodIP] = []
        self.started_at: dict[str, float] = {}
        self.terminating_since: dict[str, float] = {}
        # Hooks for a simulated cluster: decide a Job pod's outcome, and act on it (e.g. reset gpu-sim's GPUs).
        self.job_succeeds: Callable[[str, dict[str, Any]], bool] | None = None
        self.on_job_finished: Callable[[str, dict[str, Any], bool], None] | None = None
        self.preflight: Callable[[str, dict[str, Any]], tuple[int, str]] | None = None
        self._lock = threading.Lock()

    # --- configuration -----------------------------------------------------------------------------
    def add_node(self, name: str, gpus: int = 8, labels: dict[str, str] | None = None,
                 taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Register the node (``taints``: a kubelet's ``--register-with-taints``)."""
        with self._lock:
            index = max((n.index for n in self.nodes.values()), default=0) + 1  # unique after a removal too
            node = self.nodes.setdefault(name, SimNode(name, index, gpus))
        body = self._node_body(node, labels or {})
        if taints:
            body["spec"]["taints"] = list(taints)
        try:
            created = self.client.create(NODES, body)
        except errors.AlreadyExists:
            created = self._register_again(body)
        node.heartbeat_at = time.monotonic()
        with contextlib.suppress(errors.ApiError, errors.TransportError):
            self._renew_lease(node)  # the loop retries
        if self.dra:
            self.publish_resource_slice(name, created["metadata"]["uid"])
        return created

    def remove_node(self, name: str) -> None:
        """The machine is gone: no more Lease, heartbeats or pods for it (its Node is someone else's to delete)."""
        with self._lock:
            self.nodes.pop(name, None)

    # --- DRA: the ResourceSlice NVIDIA's kubelet plugin publishes -------------------------------------
    def resource_slices(self, node: str) -> list[dict[str, Any]]:
        """The node's slices of gpu.nvidia.com (the field selectors a kubelet plugin's controller uses)."""
        selector = f"spec.nodeName={node},spec.driver={nodesim_dra.DRIVER}"
        return list(self.client.list(RESOURCE_SLICES, field_selector=selector)["items"])

    def publish_resource_slice(self, node: str, node_uid: str | None = None) -> dict[str, Any]:
        """Create the node's slice, or bring the one there up to date (a new pool generation when its devices
        differ), as the driver does at start-up; extra slices of the pool are deleted."""
        sim = self.nodes[node]
        uid = node_uid or self.client.get(NODES, node)["metadata"]["uid"]
        existing = self.resource_slices(node)
        for extra in existing[1:]:
            with contextlib.suppress(errors.NotFound):
                self.client.delete(RESOURCE_SLICES, extra["metadata"]["name"])
        if not existing:
            return self.client.create(RESOURCE_SLICES, nodesim_dra.resource_slice(node, uid, sim.gpus))
        current = existing[0]
        generation = int(current["spec"]["pool"].get("generation") or 0)
        wanted = nodesim_dra.resource_slice(node, uid, sim.gpus, generation)
        owners = wanted["metadata"]["ownerReferences"]
        if current["spec"] == wanted["spec"] and current["metadata"].get("ownerReferences") == owners:
            return current
        if current["spec"] != wanted["spec"]:
            wanted["spec"]["pool"]["generation"] = generation + 1
        metadata = {**current["metadata"], "ownerReferences": owners}
        return self.client.replace(RESOURCE_SLICES, current["metadata"]["name"],
                                   {**current, "metadata": metadata, "spec": wanted["spec"]})

    def _register_again(self, body: dict[str, Any]) -> dict[str, Any]:
        """A Node kept from an earlier run on the same server (a bare control plane outlives its scenarios)
        takes this node's shape again: its status as posted now, and none of the GPU labels or extended
        resources (MIG slices, GPU Operator deploy labels, a product) this node does not have."""
        name = body["metadata"]["name"]
        old = self.client.get(NODES, name)
        wanted = body["metadata"]["labels"]
        stale_labels = {k: None for k in (old["metadata"].get("labels") or {})
                        if k.startswith("nvidia.com/") and k not in wanted}
        status: dict[str, Any] = dict(body["status"])
        for section in ("capacity", "allocatable"):
            gone = {k: None for k in (old.get("status") or {}).get(section) or {}
                    if "/" in k and k not in status[section]}
            status[section] = {**gone, **status[section]}
        self.client.patch(NODES, name, {"metadata": {"labels": {**stale_labels, **wanted}}})
        return self.client.patch(NODES, name, {"status": status}, subresource="status")

    def _node_body(self, node: SimNode, labels: dict[str, str]) -> dict[str, Any]:
        all_labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux",
                      "kubernetes.io/arch": "amd64", "nvidia.com/gpu.present": "true",
                      "nvidia.com/gpu.count": str(node.gpus), **labels}
        capacity, allocatable = self._resources(node)
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": all_labels},
                "spec": {}, "status": {
                    "capacity": capacity, "allocatable": allocatable,
                    "conditions": self._conditions(ready=True, since=node.ready_since),
                    "addresses": [{"type": "InternalIP", "address": f"10.0.0.{node.index}"},
                                  {"type": "Hostname", "address": node.name}],
                    "nodeInfo": self._node_info(node)}}

    @staticmethod
    def _resources(node: SimNode) -> tuple[dict[str, str], dict[str, str]]:
        base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        capacity = {**base, **{k: str(v) for k, v in node.gpu_capacity().items()}}
        return capacity, {**base, **{k: str(v) for k, v in node.gpu_allocatable().items()}}

    def set_mig(self, node: str, strategy: str, profiles: tuple[str, ...], *, mig_gpus: int | None = None) -> None:
        """MIG on ``mig_gpus`` of the node's GPUs (default all), each split into ``profiles``, shown with the
        device plugin's ``strategy``: single (every MIG device one nvidia.com/gpu; all GPUs alike) or mixed
        (nvidia.com/mig-<profile> per profile, whole GPUs stay nvidia.com/gpu). Capacity, allocatable and GFD's
        labels change as the operator's MIG manager and device plugin would leave them."""
        sim = self.nodes[node]
        chosen = sim.gpus if mig_gpus is None else mig_gpus
        if strategy not in ("single", "mixed") or not profiles or not 0 < chosen <= sim.gpus:
            raise ValueError(f"set_mig: strategy single|mixed, profiles and 1..{sim.gpus} GPUs, got "
                             f"{strategy!r}, {profiles!r}, {chosen}")
        if strategy == "single" and (len(set(profiles)) != 1 or chosen != sim.gpus):
            raise ValueError("set_mig: the single strategy needs every GPU split into one profile")
        resources_before, labels_before = set(sim.gpu_capacity()), set(sim.gfd_labels())
        sim.mig_strategy, sim.mig_profiles, sim.mig_gpus, sim.admits = strategy, tuple(profiles), chosen, True
        labels: dict[str, str | None] = {**dict.fromkeys(sorted(labels_before - set(sim.gfd_labels()))),
                                         **sim.gfd_labels()}
        self._publish_resources(sim, resources_before - set(sim.gpu_capacity()))
        self.client.patch(NODES, sim.name, {"metadata": {"labels": labels}})

    def set_unhealthy(self, node: str, resource: str, count: int) -> None:
        """The device plugin marks ``count`` devices of ``resource`` unhealthy (a critical XID): they stay in
        capacity and leave allocatable, so the kubelet admits no pod asking for them."""
        sim = self.nodes[node]
        sim.unhealthy[resource], sim.admits = count, True
        self._publish_resources(sim, set())

    def _publish_resources(self, sim: SimNode, gone: set[str]) -> None:
        """Capacity and allocatable as the kubelet posts them; resources in ``gone`` removed (merge patch null)."""
        capacity, allocatable = self._resources(sim)
        removed: dict[str, str | None] = dict.fromkeys(sorted(gone))
        status = {"capacity": {**removed, **capacity}, "allocatable": {**removed, **allocatable}}
        self.client.patch(NODES, sim.name, {"status": status}, subresource="status")

    @staticmethod
    def _node_info(node: SimNode) -> dict[str, str]:
        return {"machineID": uuid.uuid5(uuid.NAMESPACE_DNS, node.name).hex, "systemUUID": node.name,
                "bootID": node.boot_id, "kernelVersion": "5.15.0-sim", "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.13", "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION, "operatingSystem": "linux", "architecture": "amd64"}

    @staticmethod
    def _conditions(ready: bool, since: str) -> list[dict[str, Any]]:
        now = now_time()
        out = [{"type": t, "status": "False", "lastHeartbeatTime": now, "lastTransitionTime": since,
                "reason": f"KubeletHasSufficient{r}", "message": f"kubelet has sufficient {r.lower()}"}
               for t, r in (("MemoryPressure", "Memory"), ("DiskPressure", "Disk"), ("PIDPressure", "PID"))]
        out.append({"type": "Ready", "status": "True" if ready else "False", "lastHeartbeatTime": now,
                    "lastTransitionTime": since, "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "kubelet is posting ready status" if ready else "node is rebooting"})
        return out

    def set_job_outcome(self, node: str, succeed: bool = True, duration_s: float = 0.5, *,
                        kind: str | None = None) -> None:
        """How the node's Job pods end; ``kind`` (the ``gpuremediate.io/job`` label: validate, reset-gpu...) for
        that kind's only, over the node's."""
        self.outcomes[node if kind is None else f"{node}/{kind}"] = JobOutcome(succeed, duration_s)

    def set_image_pull(self, node: str, seconds: float, *, kind: str | None = None) -> None:
        """The node's Job pods (of ``kind`` only, if given) stay Pending this long before they start, as while a
        kubelet pulls their image."""
        self.pulls[node if kind is None else f"{node}/{kind}"] = seconds

    def _pulling(self, node: SimNode, pod: dict[str, Any]) -> bool:
        kind = (pod["metadata"].get("labels") or {}).get(JOB_KIND_LABEL, "")
        pull = self.pulls.get(f"{node.name}/{kind}", self.pulls.get(node.name, 0.0)) if _job_owned(pod) else 0.0
        first = self.pending_since.setdefault(pod["metadata"]["uid"], time.monotonic())
        return time.monotonic() - first < pull

    def set_pod_ip(self, namespace: str, pod_name_prefix: str, ip: str, *, node: str | None = None) -> None:
        """Pods in ``namespace`` named ``pod_name_prefix``... get ``ip`` (only on ``node`` if given). Where
        several prefixes match, the longest wins: ``exporter-gpu-node-10`` is not gpu-node-1's."""
        self.pod_ips.append(PodIP(namespace, pod_name_prefix, ip, node))

    def reboot(self, node: str, down_s: float = 1.0) -> None:
        """NotReady now; after down_s Ready again with a new bootID (the loop brings it back)."""
        sim = self.nodes[node]
        sim.down_until = time.monotonic() + down_s
        sim.ready_since = now_time()
        self._patch_node_status(sim, ready=False)

    def _patch_node_status(self, node: SimNode, ready: bool) -> None:
        status = {"conditions": self._conditions(ready, node.ready_since), "nodeInfo": self._node_info(node)}
        self.client.patch(NODES, node.name, {"status": status}, patch_type="strategic", subresource="status")
        node.heartbeat_at = time.monotonic()

    # --- what a kubelet posts on its own: the node Lease and status heartbeats ----------------------
    def _renew_lease(self, node: SimNode) -> None:
        """GET, then create or PUT the Lease with a new renewTime (the kubelet's nodelease controller)."""
        try:
            lease = self.client.get(LEASES, node.name, NODE_LEASE_NAMESPACE)
        except errors.NotFound:
            self.client.create(LEASES, self._lease_body(node), NODE_LEASE_NAMESPACE)
        else:
            spec = lease.setdefault("spec", {})
            spec.update(holderIdentity=node.name, leaseDurationSeconds=LEASE_DURATION_S, renewTime=micro_time())
            self.client.replace(LEASES, node.name, lease, NODE_LEASE_NAMESPACE)
        node.lease_renewed = time.monotonic()

    def _lease_body(self, node: SimNode) -> dict[str, Any]:
        owner: list[dict[str, Any]] = []
        with contextlib.suppress(errors.NotFound):
            uid = self.client.get(NODES, node.name)["metadata"]["uid"]
            owner = [{"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": uid}]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node.name, "namespace": NODE_LEASE_NAMESPACE, "ownerReferences": owner},
                "spec": {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_DURATION_S,
                         "renewTime": micro_time()}}

    def _keep_alive(self) -> None:
        """Renew the Lease and post a heartbeat for each node that is up and due (a failed one is retried
        next tick: a 409 on the Lease means someone wrote it in between)."""
        now = time.monotonic()
        for node in list(self.nodes.values()):
            if node.down:
                continue
            if now - node.lease_renewed >= self.lease_renew_s:
                with contextlib.suppress(errors.Conflict, errors.AlreadyExists):
                    self._renew_lease(node)
            if now - node.heartbeat_at >= self.heartbeat_s:
                self._patch_node_status(node, ready=True)

    # --- the loop ----------------------------------------------------------------------------------
    def tick(self) -> None:
        self._finish_reboots()
        self._keep_alive()
        for pod in self.client.list(PODS)["items"]:
            node = self.nodes.get(pod.get("spec", {}).get("nodeName", ""))
            if node is not None:
                with contextlib.suppress(errors.NotFound, errors.Conflict):
                    self._sync_pod(node, pod)

    def _finish_reboots(self) -> None:
        for node in self.nodes.values():
            if node.down_until and not node.down:
                node.down_until = 0.0
                node.boot_id = str(uuid.uuid4())
                node.ready_since = now_time()
                self._patch_node_status(node, ready=True)

    def _sync_pod(self, node: SimNode, pod: dict[str, Any]) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            self._finish_deletion(pod)
            return
        phase = status.get("phase", "Pending")
        if node.down:
            if phase == "Running" and is_ready(pod):
                self._patch_status(pod, {"conditions": _pod_conditions(False)})
            return
        if phase == "Pending" and node.admits:
            refused = self._admission_refusal(node, pod)
            if refused is not None:
                self._patch_status(pod, {"phase": "Failed", "reason": refused[0], "message": refused[1]})
                return
        if phase == "Pending" and self._pulling(node, pod):
            return
        if phase == "Pending" and self._preflight_holds(node, pod):
            return
        if phase == "Pending" or (phase == "Running" and not is_ready(pod)):
            self._run_pod(node, pod)
        elif phase == "Running" and _job_owned(pod):
            self._maybe_end_job_pod(node, pod)

    def _admission_refusal(self, node: SimNode, pod: dict[str, Any]) -> tuple[str, str] | None:
        """(reason, message) when the kubelet's admission would refuse the pod: it asks for more of an
        extended resource than allocatable leaves beside the node's running pods (lifecycle/predicate.go)."""
        allocatable = node.gpu_allocatable()
        listed = self.client.list(PODS, None, field_selector=f"spec.nodeName={node.name}")["items"]
        others = [p for p in listed if (p.get("status") or {}).get("phase") == "Running"
                  and p["metadata"]["uid"] != pod["metadata"]["uid"]]
        for name, wanted in _extended_requests(pod).items():
            used = sum(_extended_requests(p).get(name, 0) for p in others)
            if wanted > allocatable.get(name, 0) - used:
                return (f"OutOf{name}", f"Pod was rejected: Node didn't have enough resource: {name}, requested: "
                        f"{wanted}, used: {used}, capacity: {allocatable.get(name, 0)}")
        return None

    def _preflight_holds(self, node: SimNode, pod: dict[str, Any]) -> bool:
        """True when the pod's preflight init container failed (now or before): its containers do not start."""
        if not any(c.get("name") == PREFLIGHT_CONTAINER for c in pod["spec"].get("initContainers") or []):
            return False
        seen = [c for c in (pod.get("status") or {}).get("initContainerStatuses") or []
                if c.get("name") == PREFLIGHT_CONTAINER]
        if seen:
            return not seen[0].get("ready")
        code, message = self.preflight(node.name, pod) if self.preflight is not None else (0, "")
        if code == 0:
            return False
        self._fail_preflight(node, pod, code, message)
        return True

    def _fail_preflight(self, node: SimNode, pod: dict[str, Any], code: int, message: str) -> None:
        now = now_time()
        ended = {"terminated": {"exitCode": code, "reason": "Error", "message": message, "startedAt": now,
                                "finishedAt": now}}
        never = pod["spec"].get("restartPolicy") == "Never"
        status: dict[str, Any] = {"name": PREFLIGHT_CONTAINER, "ready": False, "image": "", "imageID": "",
                                  "started": False}
        if never:
            status.update(restartCount=0, state=ended)
        else:
            status.update(restartCount=1, lastState=ended,
                          state={"waiting": {"reason": "CrashLoopBackOff",
                                             "message": f"back-off 10s restarting failed container="
                                                        f"{PREFLIGHT_CONTAINER} pod={pod['metadata']['name']}"}})
        initialized = {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
                       "message": f"containers with incomplete status: [{PREFLIGHT_CONTAINER}]",
                       "lastTransitionTime": now}
        self._patch_status(pod, {"phase": "Failed" if never else "Pending", "hostIP": f"10.0.0.{node.index}",
                                 "startTime": now, "conditions": [initialized], "initContainerStatuses": [status]})

    def _finish_deletion(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        first = self.terminating_since.setdefault(uid, time.monotonic())
        grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
        if time.monotonic() - first >= min(grace, self.grace_cap_s):
            self.client.delete(PODS, pod["metadata"]["name"], pod["metadata"]["namespace"], grace_period_seconds=0)

    def _run_pod(self, node: SimNode, pod: dict[str, Any]) -> None:
        now = now_time()
        statuses = [{"name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""),
                     "imageID": "", "started": True, "state": {"running": {"startedAt": now}}}
                    for c in pod.get("spec", {}).get("containers") or []]
        ip = self._pod_ip(node, pod)
        status = {"phase": "Running", "hostIP": f"10.0.0.{node.index}", "podIP": ip, "podIPs": [{"ip": ip}],
                  "startTime": now, "conditions": _pod_conditions(True), "containerStatuses": statuses}
        inits = pod.get("spec", {}).get("initContainers") or []
        if inits:  # each ran to completion before the containers started
            status["initContainerStatuses"] = [
                {"name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""), "imageID": "",
                 "started": False, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                            "startedAt": now, "finishedAt": now}}}
                for c in inits]
        self._patch_status(pod, status)
        self.started_at[pod["metadata"]["uid"]] = time.monotonic()

    def _pod_ip(self, node: SimNode, pod: dict[str, Any]) -> str:
        existing = (pod.get("status") or {}).get("podIP")
        if existing:
            return str(existing)
        matches = [rule for rule in self.pod_ips if rule.matches(pod, node.name)]
        if matches:
            return max(matches, key=lambda rule: len(rule.name_prefix)).ip
        node.ip_counter += 1
        return f"10.244.{node.index}.{node.ip_counter}"

    def _maybe_end_job_pod(self, node: SimNode, pod: dict[str, Any]) -> None:
        kind = (pod["metadata"].get("labels") or {}).get(JOB_KIND_LABEL, "")
        outcome = self.outcomes.get(f"{node.name}/{kind}") or self.outcomes.get(node.name, JobOutcome())
        started = self.started_at.setdefault(pod["metadata"]["uid"], time.monotonic())
        if time.monotonic() - started < outcome.duration_s:
            return
        message = ""
        if self.preflight is not None and any(c.get("name") == PREFLIGHT_CONTAINER
                                              for c in pod["spec"].get("containers") or []):
            code, message = self.preflight(node.name, pod)  # an idle-node check: the preflight as the Job's
            succeed = code == 0
        else:
            succeed = self.job_succeeds(node.name, pod) if self.job_succeeds is not None else outcome.succeed
            code = 0 if succeed else 1
        phase = "Succeeded" if succeed else "Failed"
        now = now_time()
        statuses = [{"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                     "imageID": "", "started": False,
                     "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                              "startedAt": now, "finishedAt": now,
                                              **({"message": message} if message else {})}}}
                    for c in pod.get("spec", {}).get("containers") or []]
        self._patch_status(pod, {"phase": phase, "conditions": _pod_conditions(False, "PodCompleted"),
                                 "containerStatuses": statuses})
        if self.on_job_finished is not None:
            self.on_job_finished(node.name, pod, succeed)

    def _patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        self.client.patch(PODS, pod["metadata"]["name"], {"status": status}, pod["metadata"]["namespace"],
                          patch_type="strategic", subresource="status")


def _profile_counts(node: SimNode) -> dict[str, int]:
    counts: dict[str, int] = {}
    for profile in node.mig_profiles:
        counts[profile] = counts.get(profile, 0) + node.mig_gpus
    return counts


def _extended_requests(pod: dict[str, Any]) -> dict[str, int]:
    """Whole-number extended resources (``<domain>/<name>``) the pod's containers ask for (limits or requests)."""
    out: dict[str, int] = {}
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            for name, value in (resources.get(section) or {}).items():
                if "/" in name and str(value).isdigit():
                    out[name] = max(out.get(name, 0), int(str(value)))
    return out


JOB_KIND_LABEL = "gpuremediate.io/job"  # gpuremediate.actions.jobs.JOB_LABEL


def _job_owned(pod: dict[str, Any]) -> bool:
    return any(ref.get("kind") == "Job" for ref in pod["metadata"].get("ownerReferences") or [])


def _pod_conditions(ready: bool, reason: str | None = None) -> list[dict[str, Any]]:
    now = now_time()
    value = "True" if ready else "False"
    out = [{"type": t, "status": "True" if t in ("Initialized", "PodScheduled") else value,
            "lastProbeTime": None, "lastTransitionTime": now} for t in
           ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
    if reason:
        for cond in out:
            if cond["status"] == "False":
                cond["reason"] = reason
    return out
