"""Fleet-scale benchmark (issue 16): the controller against N GPU nodes x 8 GPUs.

    make bench-scale                 # N = 1000, 2500, 5000
    make bench-scale N=200           # one quick run
    .venv/bin/python bench/scale.py --direct 1000   # direct exporter scraping at 1000 nodes

Prometheus mode, a fleet shaped as a user's (issue 21): a real Prometheus (Debian's package) scraping, every
15 s, ``--endpoints`` targets (10: several dcgm-exporter Services or federation shards) that together serve
N nodes x 8 GPUs x 7 series (every field the policy reads), each series with its exporter's own instance and
job kept by ``honor_labels``, and XIDs as dcgm-exporter >= 3.3 writes them (a new series whose err_code and
err_msg labels hold the XID). The API emulator holds the N Nodes; the controller runs as its own process with
default flags (``gpuremediate run --source prometheus --prometheus-url URL``). Each of ``--modes`` (raw: no
recording rules; recorded: gpuremediate's rules loaded into that Prometheus) gets a fresh controller: a window
of Prometheus alone, the controller's first good read, a window with it, the curl floor of its full read's
queries, then ``--faults`` XIDs one after the other. Printed per mode: read time and its ratio to the floor,
read errors, Prometheus' CPU seconds a minute alone / with the controller / the difference the controller
caused, "Prometheus has it -> cordon" and fault to cordon (P50, P90, max), the controller's CPU, RSS and API
requests a minute.

Direct mode (``--direct N [--workers 8 16 32 64] [--shards 2] [--servers 3]``): the N exporters (gpu-sim's
8-GPU body, one loopback address per node) are served by ``--servers`` processes of their own, the emulator
holds their exporter pods, and each of ``--shards`` controller processes reads its shard ``--cycles`` times
at once: printed are the read per cycle (the slowest shard) and each one's CPU seconds per cycle, so the
figures are the controller's, not the exporters'. The parse cost of one 8-GPU scrape is timed alone.

The cordon burst through the real sources (issue 27; ``make bench-burst-sources``):

    .venv/bin/python bench/scale.py 5000 --burst 750 --faults 3 --modes raw   # a real Prometheus, one replica
    .venv/bin/python bench/scale.py --direct 5000 --burst 750 [--spread 10] [--shards 2]

Each burst node must be cordoned once, by its shard's owner, with its record; printed are P50 / P90 / max from
the source having the fault (Prometheus' evaluation time of its first answer holding it; the moment the exporter
serves it) to the cordon, cordons a second first to last and at their peak, the breaker's state (a burst past
its threshold: ``bench/scale.py 1500 --burst 750``), and how long each node's Event trailed its cordon.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import promlab  # noqa: E402
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP  # noqa: E402
from gpuremediate.config import Settings  # noqa: E402
from gpuremediate.kube.client import KubeClient  # noqa: E402
from gpuremediate.kube.config import ClusterConfig, StaticToken  # noqa: E402
from gpuremediate.kube.handover import shard_index_of  # noqa: E402
from gpuremediate.kube.resources import NAMESPACES, NODES, PODS  # noqa: E402
from gpuremediate.kube.shards import shard_of  # noqa: E402
from gpuremediate.signals import (  # noqa: E402
    dcgm,
    degradation_fields,
    exposition,
    prom_degradation,
    recording,
    sources,
    trends,
)
from gpuremediate.vocab.degradation import DegradationPolicy  # noqa: E402
from gpuremediate.vocab.record import RECORD_ANNOTATION, NodeRecord, record_from_node  # noqa: E402
from sim.gpusim import new_node, render  # noqa: E402
from sim.kubeapi import KubeAPIServer  # noqa: E402

CONTROLLER_USER = "system:serviceaccount:gpuremediate-system:gpuremediate"
CONTROLLER_TOKEN = "bench-scale-controller"
PROM_SCRAPE_S = 15
LOGS = Path(os.environ.get("BENCH_SCALE_LOGS", "/tmp/gpuremediate-bench-scale"))  # controller.log, kubeconfig
IMAGES_PER_NODE = 40  # what a kubelet reports; the node informer must not keep it


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the cluster


def node_body(name: str) -> dict[str, Any]:
    images = [{"names": [f"registry.example.com/team/image-{i}@sha256:{i:064x}"], "sizeBytes": 10**9 + i}
              for i in range(IMAGES_PER_NODE)]
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name},
                     "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "192"}, "allocatable": {"nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "nodeInfo": {"bootID": f"boot-{name}", "kubeletVersion": "v1.36.0"}, "images": images},
    }


# A GPU Node as a real fleet's kubelet, cloud provider, GPU operator and NFD leave it (issue 48: the bytes per cached
# Node are measured on this, not on node_body's toy). Shapes, from: the kubelet's node status setters and its
# well-known labels (k8s.io/api core/v1 NodeStatus, NodeSystemInfo; kubernetes.io/docs/reference/labels-annotations-
# taints); GPU feature discovery's "Generated Labels" (NVIDIA/k8s-device-plugin docs/gpu-feature-discovery/README.md)
# and the GPU operator's gpu.deploy.* / upgrade labels; node-feature-discovery's feature labels
# (kubernetes-sigs/node-feature-discovery docs/usage/features.md: cpu-cpuid.<flag>, cpu-model.*, kernel-version.*,
# pci-<vendor>.present, system-os_release.*, storage-*, memory-*) and its nfd.node.kubernetes.io/feature-labels
# annotation; our agent's conditions (gpuremediate/agent/health.py). Per node, as in a fleet: name and hostname,
# uid, resourceVersion, creation and condition times, machineID, systemUUID, bootID, providerID, podCIDR, the node
# IP and CSI node id, gfd.timestamp. Shared by the fleet: everything else (one instance type, one AMI, one driver).
# An H100 HGX node (p5.48xlarge-like); a GB200 NVL72 tray would add gpu.clique and gpu.imex-domain (shared per rack).
CPUID_FLAGS = ("ADX", "AESNI", "AVX", "AVX2", "AVX512BF16", "AVX512BITALG", "AVX512BW", "AVX512CD", "AVX512DQ",
               "AVX512F", "AVX512IFMA", "AVX512VBMI", "AVX512VBMI2", "AVX512VL", "AVX512VNNI", "AVX512VPOPCNTDQ",
               "CMPXCHG8", "FMA3", "FSRM", "FXSR", "FXSROPT", "GFNI", "HYPERVISOR", "IBPB", "LAHF", "MOVBE",
               "OSXSAVE", "RDPRU", "SHA", "SPEC_CTRL_SSBD", "SSE4", "SSE42", "SSSE3", "STIBP", "SYSCALL", "SYSEE",
               "VAES", "VPCLMULQDQ", "WBNOINVD", "X87", "XGETBV1", "XSAVE", "XSAVEC", "XSAVEOPT", "XSAVES")
NFD_LABELS = {
    **{f"cpu-cpuid.{flag}": "true" for flag in CPUID_FLAGS},
    "cpu-hardware_multithreading": "true", "cpu-model.family": "25", "cpu-model.id": "1",
    "cpu-model.vendor_id": "AMD", "kernel-config.NO_HZ": "true", "kernel-config.NO_HZ_IDLE": "true",
    "kernel-version.full": "6.1.119-129.201.amzn2023.x86_64", "kernel-version.major": "6",
    "kernel-version.minor": "1", "kernel-version.revision": "119", "memory-numa": "true",
    "pci-10de.present": "true", "pci-1d0f.present": "true", "storage-nonrotationaldisk": "true",
    "system-os_release.ID": "amzn", "system-os_release.VERSION_ID": "2023",
    "system-os_release.VERSION_ID.major": "2023",
}
GFD_LABELS = {
    "cuda.driver-version.full": "570.124.06", "cuda.driver-version.major": "570", "cuda.driver-version.minor": "124",
    "cuda.driver-version.revision": "06", "cuda.driver.major": "570", "cuda.driver.minor": "124",
    "cuda.driver.rev": "06", "cuda.runtime-version.full": "12.8", "cuda.runtime-version.major": "12",
    "cuda.runtime-version.minor": "8", "cuda.runtime.major": "12", "cuda.runtime.minor": "8",
    "gpu.compute.major": "9", "gpu.compute.minor": "0", "gpu.count": "8", "gpu.family": "hopper",
    "gpu.machine": "p5.48xlarge", "gpu.memory": "81559", "gpu.mode": "compute", "gpu.present": "true",
    "gpu.product": "NVIDIA-H100-80GB-HBM3", "gpu.replicas": "1", "gpu.sharing-strategy": "none",
    "mig.capable": "true", "mig.strategy": "single", "mig.config": "all-disabled", "mig.config.state": "success",
    **{f"gpu.deploy.{c}": "true" for c in ("container-toolkit", "dcgm", "dcgm-exporter", "device-plugin",
                                            "driver", "gpu-feature-discovery", "mig-manager",
                                            "node-status-exporter", "operator-validator")},
    "gpu-driver-upgrade-state": "upgrade-done",
}
NODE_CAPACITY = {"cpu": "192", "ephemeral-storage": "30428928Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                 "memory": "2097146316Ki", "nvidia.com/gpu": "8", "pods": "110", "vpc.amazonaws.com/efa": "32"}
NODE_ALLOCATABLE = {**NODE_CAPACITY, "cpu": "191450m", "ephemeral-storage": "27967694026",
                    "memory": "2088093132Ki"}
NODE_CONDITIONS = (  # type, status, reason, message: the kubelet's four, node-problem-detector's, our agent's two
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ("KernelDeadlock", "False", "KernelHasNoDeadlock", "kernel has no deadlock"),
    ("GPUHealthy", "True", "NoGPUFault", "8 GPU(s) without a fault"),
    ("GPUDriverResponsive", "True", "NvidiaSmiAnswered", "nvidia-smi answered"),
)


def _at(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_796_000_000 + seconds))


def realistic_node_body(name: str, i: int) -> dict[str, Any]:
    """Node ``name`` (the fleet's ``i``-th) as the API server serves it, kubelet's bulk (images, managedFields)
    included: what ``strip_node`` meets in a real fleet."""
    zone = "us-east-1" + "abc"[i % 3]
    instance = f"i-0{i:016x}"
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    started, beat = i % 86_400, 3_000_000 + i % 300  # joined over a day; status written within the 5-minute period
    kubelet_times = {"lastHeartbeatTime": _at(beat), "lastTransitionTime": _at(started + 40)}
    labels = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "p5.48xlarge",
        "beta.kubernetes.io/os": "linux", "failure-domain.beta.kubernetes.io/region": "us-east-1",
        "failure-domain.beta.kubernetes.io/zone": zone, "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": zone, "topology.k8s.aws/zone-id": "use1-az" + "246"[i % 3],
        "eks.amazonaws.com/capacityType": "CAPACITY_BLOCK", "eks.amazonaws.com/nodegroup": "gpu-p5",
        "eks.amazonaws.com/nodegroup-image": "ami-0a1b2c3d4e5f60718", "k8s.io/cloud-provider-aws": "3f4e5d6c7b8a",
        **{f"nvidia.com/{k}": v for k, v in GFD_LABELS.items()},
        "nvidia.com/gfd.timestamp": str(1_796_000_000 + beat),
        **{f"feature.node.kubernetes.io/{k}": v for k, v in NFD_LABELS.items()},
    }
    annotations = {
        "alpha.kubernetes.io/provided-node-ip": ip,
        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": instance, "efs.csi.aws.com": instance},
                                                      separators=(",", ":")),
        "nfd.node.kubernetes.io/feature-labels": ",".join(sorted(NFD_LABELS)),
        "nfd.node.kubernetes.io/extended-resources": "",
        "node.alpha.kubernetes.io/ttl": "0",
        "nvidia.com/gpu-driver-upgrade-enabled": "true",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    }
    def owns(manager: str, k: str) -> bool:  # each label is one manager's: NFD's master writes GFD's too
        if k.startswith(("feature.node.kubernetes.io/", "nvidia.com/")):
            return manager == ("gpu-operator" if k.startswith("nvidia.com/gpu.deploy.") else "nfd-master")
        return manager == "kubelet"

    managed = [{"manager": m, "operation": "Update", "apiVersion": "v1", "time": _at(beat), "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in labels if owns(m, k)}}}}
               for m in ("kubelet", "nfd-master", "gpu-operator")]
    managed[0]["fieldsV1"]["f:status"] = {"f:conditions": {}, "f:nodeInfo": {"f:bootID": {}}}
    others_times = {"lastHeartbeatTime": _at(beat + 7), "lastTransitionTime": _at(started + 95)}  # NPD, agent
    conditions = [{"type": t, "status": s, "reason": r, "message": m, **(kubelet_times if k < 4 else others_times)}
                  for k, (t, s, r, m) in enumerate(NODE_CONDITIONS)]
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": f"{i:08x}-5c1e-4a7b-9d2f-{i:012x}", "resourceVersion": str(10**6 + i),
                     "creationTimestamp": _at(started), "labels": labels, "annotations": annotations,
                     "managedFields": managed},
        "spec": {"podCIDR": f"100.{64 + (i >> 16)}.{(i >> 8) & 255}.0/24",
                 "podCIDRs": [f"100.{64 + (i >> 16)}.{(i >> 8) & 255}.0/24"],
                 "providerID": f"aws:///{zone}/{instance}",
                 "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": dict(NODE_CAPACITY), "allocatable": dict(NODE_ALLOCATABLE), "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name},
                          {"type": "InternalDNS", "address": f"ip-{ip.replace('.', '-')}.ec2.internal"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"ec2{i:029x}", "systemUUID": f"ec2{i:05x}-0000-4000-8000-{i:012x}",
                         "bootID": f"{i:08x}-b007-4d00-8000-{started:012x}",
                         "kernelVersion": "6.1.119-129.201.amzn2023.x86_64",
                         "osImage": "Amazon Linux 2023.6.20250115", "containerRuntimeVersion": "containerd://1.7.25",
                         "kubeletVersion": "v1.32.0-eks-aeac579", "kubeProxyVersion": "v1.32.0-eks-aeac579",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": [{"names": [f"registry.example.com/team/image-{k}@sha256:{k:064x}"], "sizeBytes": 10**9 + k}
                       for k in range(IMAGES_PER_NODE)],
            "runtimeHandlers": [{"name": h, "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}}
                                for h in ("nvidia", "runc", "")],
        },
    }


def emulator_with_nodes(names: list[str]) -> tuple[KubeAPIServer, KubeClient]:
    srv = KubeAPIServer().start()
    srv.add_token(CONTROLLER_TOKEN, CONTROLLER_USER)
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=5000,
                        burst=5000)
    for ns in ("gpuremediate-system", "gpuremediate-jobs", "gpu-operator"):
        client.create(NAMESPACES, {"metadata": {"name": ns}})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: client.create(NODES, node_body(n)), names))
    return srv, client


# ---------------------------------------------------------------- Prometheus mode


USER_FAMILIES = (*promlab.POLICY_FAMILIES, "DCGM_FI_DEV_ROW_REMAP_PENDING",
                 "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")  # 7 series per GPU: every field the policy reads
XID_FAMILY = "DCGM_FI_DEV_XID_ERRORS"
XID_79_MSG = "GPU has fallen off the bus."
# --degradation (issue 29): what a standard dcgm-exporter deployment adds for the degradation detector, every GPU
# busy at its clock (a few MHz apart), counters high but flat, and one slow GPU per degradation run.
DEGRADATION_FAMILIES = ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", *degradation_fields.NVLINK_ERRORS, trends.SBE_TOTAL,
                        trends.REMAPPED_ROWS, trends.RETIRED_PENDING)
DEGRADATION = False  # --degradation
DEGRADATION_RUN = "+degradation"
DEGRADATION_FIRST = False  # --degradation-first
PROFILE = False  # --profile
EXPORTER_DELAY_S = 0.0  # --exporter-delay-ms: how long each exporter takes to answer (direct mode)
SLOW_CLOCK_MHZ = 1300.0
DEGRADATION_POLICY = """[degradation]
enabled = true
trends = true
hold_s = 60
"""


def families() -> tuple[str, ...]:
    return (*USER_FAMILIES, *DEGRADATION_FAMILIES) if DEGRADATION else USER_FAMILIES


def degradation_value(name: str, node: str, gpu: int, slow: frozenset[str]) -> float:
    if name == "DCGM_FI_DEV_SM_CLOCK":
        return SLOW_CLOCK_MHZ if node in slow and gpu == 5 else 1980.0 - ((sum(map(ord, node)) + gpu) % 4) * 15
    return {"DCGM_FI_DEV_GPU_UTIL": 92.0, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0.0, trends.RETIRED_PENDING: 0.0,
            trends.SBE_TOTAL: 1200.0 + gpu, trends.REMAPPED_ROWS: 3.0}.get(name, 17.0)


def exporter_ip(i: int) -> str:
    return f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}"


class FleetEndpoint:
    """One scrape target exposing some nodes' dcgm-exporter series as a federation endpoint does (each series
    with its exporter's own ``instance``/``job``, kept by ``honor_labels``). The XID series has dcgm-exporter
    >= 3.3's shape: ``err_code="0", err_msg="No Error"`` while quiet, and an XID is a NEW series with the code
    in its labels (the quiet one goes stale). ``inject_xid`` re-renders only the endpoint's live nodes."""

    def __init__(self, names: list[str], live: list[str], ips: dict[str, str], slow: frozenset[str]) -> None:
        self.names, self.live, self.ips, self.slow = names, live, ips, slow
        self.xid: dict[str, tuple[int, int]] = {}
        self.lock = threading.Lock()
        self.static = self._render([n for n in names if n not in live])
        self.body = self.static + self._render(live)
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with endpoint.lock:
                    body = endpoint.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _render(self, names: list[str]) -> bytes:
        out: list[str] = []
        for name in families():
            for node in names:
                for gpu in range(8):
                    labels = promlab.gpu_labels(node, gpu, self.ips[node])
                    value: float = {"DCGM_FI_DEV_GPU_TEMP": 40 + gpu, "DCGM_FI_DEV_MEMORY_TEMP": 45 + gpu}.get(name, 0)
                    if name in DEGRADATION_FAMILIES:
                        value = degradation_value(name, node, gpu, self.slow)
                    if name == XID_FAMILY:
                        gpu_xid, code = self.xid.get(node, (-1, 0))
                        if gpu_xid == gpu:
                            labels.update(err_code=str(code), err_msg=XID_79_MSG)
                            value = code
                        else:
                            labels.update(err_code="0", err_msg="No Error")
                    out.append(f"{name}{{{promlab._label_text(labels)}}} {value}")
        return ("\n".join(out) + "\n").encode()

    def inject_xid(self, node: str, gpu: int, code: int) -> None:
        self.inject_many([node], gpu, code)

    def inject_many(self, nodes: list[str], gpu: int, code: int) -> None:
        """XIDs on several of the endpoint's live nodes at once (one re-render, one new body)."""
        for node in nodes:
            self.xid[node] = (gpu, code)
        body = self.static + self._render(self.live)
        with self.lock:
            self.body = body

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Fleet:
    """N nodes' exporters behind ``endpoints`` scrape targets (several dcgm-exporter Services or federation
    shards), the fault nodes spread over them."""

    def __init__(self, names: list[str], live: list[str], endpoints: int, slow: frozenset[str] = frozenset()) -> None:
        ips = {name: exporter_ip(i) for i, name in enumerate(names)}
        groups: list[list[str]] = [[] for _ in range(max(1, endpoints))]
        for i, name in enumerate(names):
            groups[i % len(groups)].append(name)
        self.endpoints = [FleetEndpoint(group, [n for n in group if n in live], ips, slow) for group in groups]
        self.by_node = {name: ep for ep in self.endpoints for name in ep.names}

    @property
    def body_bytes(self) -> int:
        return sum(len(ep.body) for ep in self.endpoints)

    def inject_xid(self, node: str, gpu: int, code: int) -> None:
        self.by_node[node].inject_xid(node, gpu, code)

    def inject_many(self, nodes: list[str], gpu: int, code: int) -> None:
        """XIDs on many live nodes at once: each endpoint's body changes once (a burst Prometheus scrapes whole)."""
        for ep in self.endpoints:
            mine = [node for node in nodes if self.by_node[node] is ep]
            if mine:
                ep.inject_many(mine, gpu, code)

    def stop(self) -> None:
        for ep in self.endpoints:
            ep.stop()


@contextmanager
def prometheus_with_fleet(addresses: list[str], scrape_interval_s: int,
                          workdir: Path) -> Iterator[promlab.PromServer]:
    found = promlab.binaries()
    if found is None:
        raise SystemExit("prometheus/promtool not installed: apt-get install -y prometheus")
    targets = [promlab.Target(address) for address in addresses]
    with promlab.PromServer(workdir, found[0], targets=targets, scrape_interval=f"{scrape_interval_s}s",
                            honor_labels=True) as server:
        yield server


TRACE_MEMORY = False  # --trace-memory: the controller under bench/traced_controller.py
CONTROLLER_FLAGS: list[str] = []  # --controller-flag: beyond the defaults (none by default: default flags)
CONTROLLER_LOG_LEVEL = "warning"  # --log-level: info adds the fast path's split (controller.log)


def prometheus_source(url: str) -> tuple[str, ...]:
    return ("--source", "prometheus", "--prometheus-url", url)


def controller_process(kubeconfig: Path, source: tuple[str, ...], metrics_port: int,
                       flags: tuple[str, ...] = (), log_name: str = "controller.log") -> subprocess.Popen[bytes]:
    """``gpuremediate run`` in a process of its own, reading GPU health with ``source``'s flags."""
    entry = [str(ROOT / "bench" / "traced_controller.py")] if TRACE_MEMORY else ["-m", "gpuremediate"]
    if PROFILE:  # bench/sampled_controller.py: where the CPU goes, per run
        entry = [str(ROOT / "bench" / "sampled_controller.py")]
        os.environ["BENCH_PROFILE_OUT"] = str(kubeconfig.parent / f"profile-{metrics_port}.txt")
    return subprocess.Popen(
        [sys.executable, *entry, "run", "--kubeconfig", str(kubeconfig), *source,
         "--metrics-addr", f"127.0.0.1:{metrics_port}", "--log-level", CONTROLLER_LOG_LEVEL, *CONTROLLER_FLAGS, *flags],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(kubeconfig.parent / log_name, "ab"))


class RssSampler:
    """The controller's RSS every half second (VmRSS), and its peak (VmHWM)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _status(self, key: str) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1]) / 1024.0
        return 0.0

    def _run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                self.samples.append((time.monotonic(), self._status("VmRSS")))
            except OSError:
                return

    def peak_mb(self) -> float:
        try:
            return self._status("VmHWM")
        except OSError:
            return max((mb for _, mb in self.samples), default=0.0)

    def median_mb(self, since: float, until: float) -> float:
        window = [mb for t, mb in self.samples if since <= t <= until]
        return statistics.median(window) if window else 0.0

    def max_mb(self, since: float, until: float) -> float:
        return max((mb for t, mb in self.samples if since <= t <= until), default=0.0)


def _samples(metrics_port: int) -> list[Any]:
    """The controller's /metrics, parsed."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        return list(exposition.parse(resp.read().decode(), strict=False).samples)


def controller_metrics(metrics_port: int) -> dict[str, float]:
    """The controller's own metrics of the Prometheus source (summed over other labels), and its mode."""
    values: dict[str, float] = {}
    for s in _samples(metrics_port):
        if s.label("source") in ("prometheus", None) or s.name == "gpuremediate_prometheus_mode":
            key = s.name + (f"{{mode={s.label('mode')}}}" if s.label("mode") else "")
            values[key] = values.get(key, 0.0) + s.value
    return values


def api_requests(metrics_port: int) -> dict[str, tuple[float, float, float]]:
    """The controller's API requests so far by verb: (count, seconds on the wire, seconds waiting on its rate
    limit), from gpuremediate_api_request_duration_seconds and gpuremediate_api_rate_limiter_duration_seconds."""
    out: dict[str, list[float]] = {}
    slot = {"gpuremediate_api_request_duration_seconds_count": 0, "gpuremediate_api_request_duration_seconds_sum": 1,
            "gpuremediate_api_rate_limiter_duration_seconds_sum": 2}
    for s in _samples(metrics_port):
        if s.name in slot:
            out.setdefault(s.label("verb") or "?", [0.0, 0.0, 0.0])[slot[s.name]] += s.value
    return {verb: (v[0], v[1], v[2]) for verb, v in out.items()}


def api_requests_between(before: dict[str, tuple[float, float, float]],
                         after: dict[str, tuple[float, float, float]]) -> dict[str, dict[str, float]]:
    """Per verb between two ``api_requests``: how many, their mean time on the wire and mean wait, in ms."""
    out: dict[str, dict[str, float]] = {}
    for verb, (count, took, waited) in sorted(after.items()):
        count0, took0, waited0 = before.get(verb, (0.0, 0.0, 0.0))
        if count > count0:
            n = count - count0
            out[verb] = {"count": n, "mean_ms": round((took - took0) * 1000 / n, 1),
                         "rate_limit_wait_mean_ms": round((waited - waited0) * 1000 / n, 1)}
    return out


def scrape_stats(metrics_port: int) -> tuple[float, float, float]:
    """(count, sum, errors) of the controller's reads of the Prometheus source."""
    values = controller_metrics(metrics_port)
    return (values.get("gpuremediate_scrape_seconds_count", 0.0), values.get("gpuremediate_scrape_seconds_sum", 0.0),
            values.get("gpuremediate_scrape_errors_total", 0.0))


def good_reads(metrics_port: int) -> float:
    count, _, failed = scrape_stats(metrics_port)
    return count - failed


def wait(cond: Callable[[], object], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if cond():
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def prometheus_cpu_per_min(prom: promlab.PromServer, window_s: float) -> float:
    """Prometheus' CPU seconds a minute over the next ``window_s`` seconds."""
    pid = prom.proc.pid if prom.proc else 0
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(window_s)
    return (cpu_seconds(pid) - before) * 60.0 / (time.monotonic() - started)


def full_read_queries(recorded: bool) -> list[str]:
    """The queries of one full read, as the source sends them (freshness and readings, at once)."""
    return [sources.freshness_query(recorded=recorded), sources.policy_query(recorded=recorded)]


def curl_floor_s(url: str, queries: list[str], times: int = 5) -> float:
    """The median wall time of the queries sent at once, gzip-compressed, bodies read and not decoded: the
    fastest any client could read what the source reads."""
    def one(query: str) -> None:
        request = urllib.request.Request(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}),
                                         headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=300) as resp:
            resp.read()
    took = []
    with ThreadPoolExecutor(len(queries)) as pool:
        for _ in range(times):
            started = time.monotonic()
            list(pool.map(one, queries))
            took.append(time.monotonic() - started)
    return statistics.median(took)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_prometheus(n: int, steady_s: float, faults: int, endpoints: int, modes: list[str]) -> dict[str, Any]:
    """The controller with default flags on a user-shaped Prometheus, once per mode ("raw": no recording
    rules; "recorded": gpuremediate's rules loaded), side by side on one Prometheus and one emulator. With
    --degradation each mode runs again with ``[degradation]`` on (its own controller, fault nodes and slow GPU):
    what the detection adds to the controller is the difference."""
    runs = [run for mode in modes for run in (mode, *((f"{mode}{DEGRADATION_RUN}",) if DEGRADATION else ()))]
    if DEGRADATION_FIRST:  # the order's own effect (a second controller meets the first one's faults and records)
        runs = [run for mode in modes for run in (*((f"{mode}{DEGRADATION_RUN}",) if DEGRADATION else ()), mode)]
    live_by_run = {run: [f"gpu-live-{run.replace('+', '-')}-{i}" for i in range(faults)] for run in runs}
    slow_by_run = {run: f"gpu-slow-{run.replace('+', '-')}" for run in runs if run.endswith(DEGRADATION_RUN)}
    live = [node for nodes in live_by_run.values() for node in nodes]
    names = [f"gpu-{i:05d}" for i in range(n - len(live) - len(slow_by_run))] + list(slow_by_run.values()) + live
    log(f"N={n}: emulator with {n} Nodes")
    srv, client = emulator_with_nodes(names)
    started = time.monotonic()
    fleet = Fleet(names, live, endpoints, frozenset(slow_by_run.values()))
    log(f"N={n}: {endpoints} endpoints, {fleet.body_bytes / 1e6:.0f} MB a scrape, rendered in "
        f"{time.monotonic() - started:.0f} s")
    LOGS.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"nodes": n, "gpus": n * 8, "series": n * 8 * len(families()),
                              "endpoints": endpoints, "prometheus_scrape_interval_s": PROM_SCRAPE_S,
                              "controller_flags": CONTROLLER_FLAGS or "defaults"}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, \
                prometheus_with_fleet([ep.address for ep in fleet.endpoints], PROM_SCRAPE_S,
                                      Path(tmp)) as prom:
            wait(lambda: prom_has_nodes(prom.url) >= n, 900, "Prometheus to scrape the fleet")
            for run in runs:
                result[run] = run_mode(run, prom, srv, client, fleet, live_by_run[run], steady_s,
                                       slow_by_run.get(run))
            if "raw" in result and "recorded" in result:  # the rules' evaluations: Prometheus' cost of them alone
                alone = [result[m]["prometheus_cpu_s_per_min_alone"] for m in ("recorded", "raw")]
                result["recording_rules_cpu_s_per_min"] = round(alone[0] - alone[1], 1)
            for mode in modes:
                if f"{mode}{DEGRADATION_RUN}" in result:
                    result[f"{mode}_degradation_adds"] = degradation_cost(result[mode],
                                                                          result[f"{mode}{DEGRADATION_RUN}"])
    finally:
        fleet.stop()
        srv.stop()
    return result


def degradation_cost(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """What ``[degradation]`` on added to the same controller on the same fleet: CPU a minute, steady RSS, and
    the Prometheus CPU its queries caused."""
    def share(key: str) -> float | None:
        return round(on[key] / off[key] - 1.0, 3) if off[key] else None
    return {"controller_cpu_share": share("controller_cpu_s_per_min"), "rss_steady_share": share("rss_steady_mb"),
            "read_s": [off["read_s"], on["read_s"]],
            "prometheus_cpu_s_per_min_caused": [off["prometheus_cpu_s_per_min_caused"],
                                                on["prometheus_cpu_s_per_min_caused"]]}


def load_recording_rules(prom: promlab.PromServer, timeout_s: float = 300) -> float:
    """gpuremediate's recording rules loaded into Prometheus; seconds until their first evaluation."""
    rules = prom.workdir / "gpuremediate-recording.rules.yml"
    rules.write_text(recording.rules_file())
    prom.rule_files = [rules]
    prom.reload()
    return wait(lambda: query_result(prom.url, sources.RULES_INFO), timeout_s, "the recording rules' first evaluation")


def run_mode(run: str, prom: promlab.PromServer, srv: KubeAPIServer, client: KubeClient, fleet: Fleet,
             live: list[str], steady_s: float, slow: str | None = None) -> dict[str, Any]:
    mode = run.removesuffix(DEGRADATION_RUN)
    recorded = mode == "recorded"
    if recorded:
        load_recording_rules(prom)
    log(f"{run}: Prometheus alone for {steady_s:g} s")
    idle_cpu = prometheus_cpu_per_min(prom, steady_s)
    kubeconfig = LOGS / "kubeconfig"
    srv.write_kubeconfig(kubeconfig, token=CONTROLLER_TOKEN)
    metrics_port = promlab.free_port()
    flags: tuple[str, ...] = ()
    if slow is not None:
        policy = LOGS / "degradation-policy.toml"
        policy.write_text(DEGRADATION_POLICY)
        flags = ("--policy", str(policy))
    started = time.monotonic()
    proc = controller_process(kubeconfig, prometheus_source(prom.url), metrics_port, flags)
    try:
        rss = RssSampler(proc.pid)
        first_read_s = wait(lambda: good_reads(metrics_port) >= 1, 900, "the controller's first good read")
        errors_before_first = scrape_stats(metrics_port)[2]
        log(f"{run}: first read after {first_read_s:.0f} s; controller steady for {steady_s:g} s")
        before_reqs = len(srv.requests)
        c0, s0, e0 = scrape_stats(metrics_port)
        ctl_cpu_0 = cpu_seconds(proc.pid)
        t0 = time.monotonic()
        busy_cpu = prometheus_cpu_per_min(prom, steady_s)
        t1 = time.monotonic()
        c1, s1, e1 = scrape_stats(metrics_port)
        ctl_cpu = cpu_seconds(proc.pid) - ctl_cpu_0
        steady = Counter(" ".join(filter(None, (r[1], r[3], r[4]))) for r in list(srv.requests)[before_reqs:]
                         if r[0] == CONTROLLER_USER)
        floor_s = curl_floor_s(prom.url, full_read_queries(recorded))
        fault_query_s = query_seconds(prom.url, sources.fault_query(recorded=recorded))
        slow_found: dict[str, float] = {}
        if slow is not None:  # the slow GPU: found after the policy's hold, its node cordoned (no drain)
            wait(lambda: client.get(NODES, slow)["spec"].get("unschedulable"), 600, f"{slow}'s slow-gpu cordon")
            plan = prom_degradation.plan_for([DegradationPolicy(enabled=True, trends=True)])
            assert plan is not None
            slow_found = {"slow_gpu_cordoned_after_s": round(time.monotonic() - started, 1),
                          "degradation_query_s": round(query_seconds(prom.url, prom_degradation.nodes_query(
                              plan, dcgm.NODE_LABEL_CANDIDATES, full=True)), 3)}
        timed = [fault_to_cordon(fleet, prom.url, client, node) for node in live]
        to_cordon = [c for c, _ in timed]
        prom_to_cordon = [c - p for c, p in timed]
        metrics = controller_metrics(metrics_port)
        read_s = (s1 - s0) / max(1.0, c1 - c0)
        return {
            "source_mode": next((k.split("=", 1)[1][:-1] for k, v in metrics.items()
                                 if k.startswith("gpuremediate_prometheus_mode{") and v == 1), "?"),
            "first_good_read_after_s": round(first_read_s, 1), "read_errors_before_it": int(errors_before_first),
            "reads": int(c1 - c0), "read_errors": int(e1 - e0), "read_s": round(read_s, 2),
            "curl_floor_s": round(floor_s, 2), "read_over_floor": round(read_s / floor_s, 2) if floor_s else None,
            "fault_query_s": round(fault_query_s, 3),
            "prometheus_cpu_s_per_min_alone": round(idle_cpu, 1),
            "prometheus_cpu_s_per_min_with_controller": round(busy_cpu, 1),
            "prometheus_cpu_s_per_min_caused": round(busy_cpu - idle_cpu, 1),
            "controller_cpu_s_per_min": round(ctl_cpu * 60.0 / (t1 - t0), 1),
            "fault_to_cordon_s": {"p50": round(percentile(to_cordon, 0.5), 1),
                                  "p90": round(percentile(to_cordon, 0.9), 1), "max": round(max(to_cordon), 1)},
            "prometheus_has_it_to_cordon_s": {"p50": round(percentile(prom_to_cordon, 0.5), 2),
                                              "p90": round(percentile(prom_to_cordon, 0.9), 2),
                                              "max": round(max(prom_to_cordon), 2)},
            "rss_peak_mb": round(rss.peak_mb(), 1), "rss_steady_mb": round(rss.median_mb(t0, t1), 1),
            "api_per_min_steady": {verb: round(count * 60.0 / (t1 - t0), 1) for verb, count in sorted(steady.items())},
            **slow_found,
        }
    finally:
        proc.terminate()
        proc.wait(20)


def query_result(url: str, query: str) -> list[Any]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}), timeout=60) as r:
        return list(json.loads(r.read())["data"]["result"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def query_seconds(url: str, query: str, times: int = 5) -> float:
    """The median wall time of an instant query (Prometheus' evaluation plus the transfer)."""
    took = []
    for _ in range(times):
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}), timeout=60) as r:
            r.read()
        took.append(time.monotonic() - started)
    return statistics.median(took)


def fault_to_cordon(endpoint: Fleet | FleetProcess, prom_url: str, client: KubeClient,
                    node: str) -> tuple[float, float]:
    """An XID 79 on ``node``: (seconds to its cordon, seconds until Prometheus had it)."""
    endpoint.inject_xid(node, 3, 79)
    injected = time.monotonic()
    in_prom = FaultInProm(prom_url, node)
    cordon_s = wait(lambda: in_prom.check() and client.get(NODES, node)["spec"].get("unschedulable"), 300,
                    f"{node}'s cordon")
    return cordon_s, (in_prom.seen_at or injected) - injected


def evaluated_at(point: list[Any]) -> float:
    """The monotonic moment Prometheus evaluated an instant query's answer (``value[0]``, wall-clock seconds):
    under load the answer arrives seconds later, and stamping its arrival counted that delay as Prometheus'."""
    return float(point[0]) - time.time() + time.monotonic()


class FaultInProm:
    """When Prometheus first answers with the injected XID (its own scrape delay, not the controller's)."""

    def __init__(self, url: str, node: str) -> None:
        self.url, self.node = url, node
        self.seen_at: float | None = None

    def check(self) -> bool:
        if self.seen_at is None:
            query = urllib.parse.urlencode({"query": f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{self.node}"}} != 0'})
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=10) as resp:
                if result := json.loads(resp.read())["data"]["result"]:
                    self.seen_at = evaluated_at(result[0]["value"])
        return True


def prom_has_nodes(url: str) -> int:
    query = urllib.parse.urlencode({"query": "count(count by (Hostname) (DCGM_FI_DEV_GPU_TEMP))"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=30) as resp:
        result = json.loads(resp.read())["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


# ---------------------------------------------------------------- sharded Prometheus mode


SHARD_NAMESPACE = "gpuremediate-system"


def replica_user(i: int) -> str:
    return f"{CONTROLLER_USER}-r{i}"


def replica_token(i: int) -> str:
    return f"{CONTROLLER_TOKEN}-r{i}"


def serve_fleet(names: list[str], live: list[str], endpoints: int, conn: Any) -> None:
    """The Fleet in a process of its own (--shards): the emulator's process then holds the emulator alone, so
    its CPU is the emulator's. Answers inject commands ``(nodes, gpu, code)`` until None."""
    fleet = Fleet(names, live, endpoints)
    conn.send(([ep.address for ep in fleet.endpoints], fleet.body_bytes))
    while (msg := conn.recv()) is not None:
        nodes, gpu, code = msg
        fleet.inject_many(nodes, gpu, code)
        conn.send(True)
    fleet.stop()


class FleetProcess:
    """``Fleet``'s interface (inject_xid, inject_many, stop) served by a spawned process (serve_fleet)."""

    def __init__(self, names: list[str], live: list[str], endpoints: int) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.conn, child = spawn.Pipe()
        self.proc = spawn.Process(target=serve_fleet, args=(names, live, endpoints, child), daemon=True)
        self.proc.start()
        if not self.conn.poll(1800):
            raise SystemExit("the fleet's process did not start")
        self.addresses, self.body_bytes = self.conn.recv()
        self.lock = threading.Lock()

    @property
    def pid(self) -> int:
        return int(self.proc.pid or 0)

    def inject_many(self, nodes: list[str], gpu: int, code: int) -> None:
        with self.lock:
            self.conn.send((nodes, gpu, code))
            self.conn.recv()

    def inject_xid(self, node: str, gpu: int, code: int) -> None:
        self.inject_many([node], gpu, code)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()


class CordonWatch:
    """Every Node's cordons as the emulator's store makes them (a listener: no API request): per node, when
    spec.unschedulable went false -> true, how often, and whether that write carried the record; and when the
    first Event about it was written (the report a person reads, which follows the cordon)."""

    def __init__(self, srv: KubeAPIServer) -> None:
        self.key = srv.type_for("", "nodes").key
        self.events_key = srv.type_for("", "events").key
        self.cordons: dict[str, list[tuple[float, bool]]] = {}
        self.events: dict[str, list[tuple[float, str]]] = {}  # node -> (when, reason) of each Event about it
        srv.store.listeners.append(self._event)

    def reported_since_cordon(self, node: str) -> bool:
        cordoned = self.cordons[node][0][0]
        return any(at >= cordoned for at, _ in self.events.get(node, []))

    def _event(self, event: Any) -> None:
        if event.key == self.events_key and event.type == "ADDED":
            involved = event.obj.get("involvedObject") or {}
            if involved.get("kind") == "Node":
                self.events.setdefault(involved.get("name", ""), []).append(
                    (time.monotonic(), event.obj.get("reason", "")))
            return
        if event.key != self.key or event.type != "MODIFIED" or event.prev is None:
            return
        if (event.obj.get("spec") or {}).get("unschedulable") and not (event.prev.get("spec") or {}).get(
                "unschedulable"):
            annotations = event.obj["metadata"].get("annotations") or {}
            self.cordons.setdefault(event.obj["metadata"]["name"], []).append(
                (time.monotonic(), RECORD_ANNOTATION in annotations))


LEADER_LEASE = Settings.lease_name  # --lease-name's default: the one "shard" of an unsharded replica (--leader-elect)


def shard_holders(srv: KubeAPIServer, shards: int) -> dict[int, str]:
    """Shard -> the holder of its Lease (read from the store: no API request counted); unsharded (``shards``
    1, the replicas with ``--leader-elect``), shard 0 is the leader Lease's."""
    leases = srv.store.list_all(srv.type_for("coordination.k8s.io", "leases").key, SHARD_NAMESPACE)
    held: dict[int, str] = {}
    for lease in leases:
        name = lease["metadata"]["name"]
        index = (0 if name == LEADER_LEASE else None) if shards == 1 else shard_index_of(name)
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        if index is not None and index < shards and holder:
            held[index] = holder
    return held


def fair(holders: dict[int, str], shards: int, replicas: list[str]) -> bool:
    if shards == 1:  # one leader; the other replicas stand by
        return len(holders) == 1
    counts = Counter(holders.values())
    per = [counts.get(r, 0) for r in replicas]
    return len(holders) == shards and max(per) - min(per) <= 1 and min(per) >= 1


class ProcessCpu:
    """CPU seconds of named processes between marks (phases), and their RSS sampled all along."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.rss = {who: RssSampler(pid) for who, pid in self.pids.items()}
        self.phases: dict[str, dict[str, Any]] = {}
        self._open: tuple[str, float, dict[str, float]] | None = None

    def add(self, who: str, pid: int) -> None:
        self.pids[who] = pid
        self.rss[who] = RssSampler(pid)

    def _cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for who, pid in self.pids.items():
            with contextlib.suppress(OSError):
                out[who] = cpu_seconds(pid)
        return out

    def begin(self, phase: str) -> None:
        self.end()
        self._open = (phase, time.monotonic(), self._cpu())

    def end(self) -> None:
        if self._open is None:
            return
        phase, t0, cpu0 = self._open
        self._open = None
        t1, cpu1 = time.monotonic(), self._cpu()
        minutes = max(1e-9, (t1 - t0) / 60.0)
        used = {who: (cpu1[who] - cpu0.get(who, 0.0)) / minutes for who in cpu1}
        total = sum(used.values())
        self.phases[phase] = {
            "seconds": round(t1 - t0, 1), "cpu_s_per_min": {who: round(v, 1) for who, v in used.items()},
            "cpu_share": {who: round(v / total, 3) for who, v in used.items()} if total else {},
            "rss_mb_median": {who: round(s.median_mb(t0, t1)) for who, s in self.rss.items()},
            "rss_mb_max": {who: round(s.max_mb(t0, t1)) for who, s in self.rss.items()}}
        log(f"phase {phase}: {t1 - t0:.0f} s, CPU s/min " + ", ".join(f"{w} {v:.1f}" for w, v in used.items()))


def pick_nodes(prefix: str, count: int, shards: int, start: int = 0) -> list[str]:
    """``count`` node names spread evenly over the shards (round robin on shard_of)."""
    by_shard: dict[int, list[str]] = {s: [] for s in range(shards)}
    i = start
    while sum(len(v) for v in by_shard.values()) < count:
        name = f"{prefix}-{i:05d}"
        i += 1
        s = shard_of(name, shards)
        if len(by_shard[s]) < -(-count // shards):
            by_shard[s].append(name)
    picked = [n for group in zip(*by_shard.values(), strict=False) for n in group]
    rest = [n for group in by_shard.values() for n in group if n not in set(picked)]
    return (picked + rest)[:count]


def node_writers(srv: KubeAPIServer, users: dict[str, str], since: int) -> dict[str, Counter[str]]:
    """Node name -> {replica: writes (patch/update of nodes/<name>, not /status)} from the audit."""
    out: dict[str, Counter[str]] = {}
    for user, verb, _group, resource, sub, _ns, name in list(srv.requests)[since:]:
        if resource == "nodes" and not sub and verb in ("patch", "update") and name and user in users:
            out.setdefault(name, Counter())[users[user]] += 1
    return out


def check_cordons(srv: KubeAPIServer, watch: CordonWatch, nodes: list[str], owner_of: Callable[[str], str],
                  users: dict[str, str], since: int) -> dict[str, Any]:
    """Each node cordoned exactly once, written by its shard's owner only, its record on it."""
    writers = node_writers(srv, users, since)
    key = srv.type_for("", "nodes").key
    problems: list[str] = []
    ok = 0
    for node in nodes:
        cordons = watch.cordons.get(node, [])
        by = writers.get(node, Counter())
        obj = srv.store.get(key, "", node) or {}
        record = record_from_node(obj)
        fine = True
        if len(cordons) != 1:
            problems.append(f"{node}: cordoned {len(cordons)} times")
            fine = False
        if set(by) != {owner_of(node)}:
            problems.append(f"{node}: written by {dict(by)}, owner {owner_of(node)}")
            fine = False
        if cordons and not cordons[0][1]:
            problems.append(f"{node}: the cordon carried no record")
            fine = False
        if not isinstance(record, NodeRecord) or not record.cordoned_by_us:
            problems.append(f"{node}: record {record!r:.120}")
            fine = False
        ok += fine
    return {"nodes": len(nodes), "ok": ok, "problems": problems[:20], "problem_count": len(problems),
            "node_writes_by_replica": dict(sum((writers.get(n, Counter()) for n in nodes), Counter()))}


def peak_rate(moments: list[float], window_s: float = 2.0) -> float:
    """The most events a second within any ``window_s`` (what the controller reaches while faults wait for it;
    first-to-last is bounded by how fast the source hands them over)."""
    ordered, most, lo = sorted(moments), 0, 0
    for hi, t in enumerate(ordered):
        while t - ordered[lo] > window_s:
            lo += 1
        most = max(most, hi - lo + 1)
    return round(most / window_s, 1)


def reports_written(watch: CordonWatch, nodes: list[str], timeout_s: float = 180.0) -> None:
    """Wait (at most ``timeout_s``) for an Event about each cordoned node: stopping a replica drops what is queued."""
    with contextlib.suppress(SystemExit):
        wait(lambda: all(watch.reported_since_cordon(n) for n in nodes if n in watch.cordons), timeout_s,
             "the burst's Events")


def report_lag(watch: CordonWatch, nodes: list[str]) -> dict[str, Any]:
    """How long after its cordon each node's first Event since was written (the reports follow the actions), and
    the reasons of the Events about the nodes before their cordon."""
    lags, before = [], Counter[str]()
    for node in nodes:
        if node not in watch.cordons:
            continue
        cordoned = watch.cordons[node][0][0]
        before.update(reason for at, reason in watch.events.get(node, []) if at < cordoned)
        if after := [at for at, _ in watch.events.get(node, []) if at >= cordoned]:
            lags.append(after[0] - cordoned)
    return {"nodes_with_an_event": len(lags), "cordon_to_event_s": spread_of(lags) if lags else None,
            "events_before_the_cordon": dict(before)}


def spread_of(seconds: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(seconds, 0.5), 2), "p90": round(percentile(seconds, 0.9), 2),
            "max": round(max(seconds), 2)}


def breaker_held(srv: KubeAPIServer, watch: CordonWatch, quiet_s: float = 30.0) -> Callable[[], bool]:
    """True once the breaker is open and no cordon has landed for ``quiet_s``: the rest of a burst never will."""
    def held() -> bool:
        last = max((c[0][0] for c in list(watch.cordons.values())), default=0.0)  # the watch adds meanwhile
        return time.monotonic() - last > quiet_s and breaker_state(srv)["open"]
    return held


def burst_to_cordon(fleet: FleetProcess, prom_url: str, watch: CordonWatch, nodes: list[str],
                    timeout_s: float, held: Callable[[], bool]) -> dict[str, Any]:
    """``nodes`` fault at once (one XID 79 each, every endpoint's body changed once): per node the seconds from
    Prometheus answering with it to its cordon (one query for all of them, every half second); until every
    node is cordoned, or ``held`` (the breaker stopped the rest)."""
    fleet.inject_many(nodes, 3, 79)
    injected = time.monotonic()
    seen: dict[str, float] = {}
    pending, wanted = set(nodes), frozenset(nodes)
    query = urllib.parse.urlencode({"query": f"count by (Hostname) ({XID_FAMILY} != 0)"})
    while time.monotonic() - injected < timeout_s:
        if len(seen) < len(nodes):
            with contextlib.suppress(OSError, ValueError, KeyError), \
                    urllib.request.urlopen(f"{prom_url}/api/v1/query?{query}", timeout=30) as resp:
                for r in json.loads(resp.read())["data"]["result"]:
                    if r["metric"].get("Hostname", "") in wanted:  # not the faults before the burst
                        seen.setdefault(r["metric"]["Hostname"], evaluated_at(r["value"]))
        pending = {n for n in pending if n not in watch.cordons}
        if (not pending and len(seen) >= len(nodes)) or (len(seen) >= len(nodes) and held()):
            break
        time.sleep(0.5)
    result = cordon_figures(watch, {n: seen.get(n, injected) for n in nodes}, "prometheus_has_it")
    cordoned = [watch.cordons[n][0][0] for n in nodes if n in watch.cordons]
    result["seen_by_prometheus"] = len(seen)
    if cordoned:
        result.update({"fault_to_cordon_s": spread_of([t - injected for t in cordoned]),
                       "prometheus_had_all_after_s": round(max(seen.values()) - injected, 1) if seen else None})
    return result


def cordon_figures(watch: CordonWatch, has_it: dict[str, float], source: str) -> dict[str, Any]:
    """From the moment the source had each node's fault (``has_it``) to its cordon: P50/P90/max as
    ``<source>_to_cordon_s``, cordons a second first to last and at their peak, and from the first fault."""
    cordoned = {n: watch.cordons[n][0][0] for n in has_it if n in watch.cordons}
    result: dict[str, Any] = {"nodes": len(has_it), "cordoned": len(cordoned),
                              "not_cordoned": sorted(set(has_it) - set(cordoned))[:10]}
    if cordoned:
        first, last = min(cordoned.values()), max(cordoned.values())
        result.update({f"{source}_to_cordon_s": spread_of([t - has_it[n] for n, t in cordoned.items()]),
                       "cordons_per_s_first_to_last": round(len(cordoned) / max(1e-3, last - first), 1),
                       "cordons_per_s_peak_2s": peak_rate(list(cordoned.values())),
                       "cordons_per_s_from_first_fault": round(len(cordoned) / max(1e-3, last - min(has_it.values())),
                                                               1)})
    return result


def burst_settled(result: dict[str, Any], srv: KubeAPIServer, watch: CordonWatch, nodes: list[str],
                  owner_of: Callable[[str], str], users: dict[str, str], since: int, cpu: ProcessCpu) -> None:
    """The burst's end: its Events written (or 180 s), 10 s more for a second cordon or a stray write to show,
    then each node checked (cordoned once, by its owner, with its record), the breaker's state and the Events'
    lag put in ``result``."""
    reports_written(watch, nodes)
    time.sleep(10)
    cpu.end()
    result.update({"check": check_cordons(srv, watch, nodes, owner_of, users, since),
                   "breaker": breaker_state(srv), "reports": report_lag(watch, nodes)})


def breaker_state(srv: KubeAPIServer) -> dict[str, Any]:
    """The breaker as the replicas left it in its ConfigMap (read from the store): open or not, why, when, and
    the faults it counted; with the cordons a burst made before and after it opened."""
    cm = srv.store.get(srv.type_for("", "configmaps").key, SHARD_NAMESPACE, BREAKER_CONFIGMAP) or {}
    state = json.loads((cm.get("data") or {}).get("state") or "{}")
    look = state.get("look") or {}
    return {"open": bool(state.get("open")), "reason": state.get("reason", ""),
            "faults_counted": len(state.get("faults") or []), "opened_at": state.get("opened_at"),
            "look": {"held": len(look.get("nodes") or []), "outcome": look.get("outcome"),
                     "opened_at": look.get("opened_at"), "ended_at": look.get("ended_at"),
                     "reason": look.get("reason")} if look else None}


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


REPLICA_METRICS = ("gpuremediate_shards_held", "gpuremediate_api_errors_total", "gpuremediate_fenced_writes_total",
                   "gpuremediate_nodes_unknown", "gpuremediate_scrape_errors_total",
                   "gpuremediate_scrape_seconds_count", "gpuremediate_fleet_health_unknown")


def replica_gauges(port: int) -> dict[str, float]:
    """A replica's own view at the end: shards held, API errors, fenced writes, unknown nodes, reads."""
    try:
        values = controller_metrics(port)
    except OSError as exc:
        return {"unreachable": 1.0, "error": float(bool(exc))}
    out = {key.removeprefix("gpuremediate_"): v for key, v in values.items() if key in REPLICA_METRICS}
    out.update({key: v for key, v in values.items() if key.startswith("gpuremediate_prometheus_mode{") and v})
    return out


def sharded_table(result: dict[str, Any]) -> str:
    """The per-replica table and the phases' CPU split, for people (stderr; the JSON line is on stdout)."""
    lines = [f"N={result['nodes']} shards={result['shards']} replicas={result['replicas']}",
             "replica          shards  reads read_s errors cpu_s/min rss_steady rss_peak lease/min other/min"]
    for r in result.get("steady", []):
        lines.append(f"{r['replica']:<16} {','.join(map(str, r['shards'])):<7} {r['reads']:>5} {r['read_s']:>6} "
                     f"{r['read_errors']:>6} {r['cpu_s_per_min']:>9} {r['rss_steady_mb']:>10} {r['rss_peak_mb']:>8} "
                     f"{r['api_per_min_lease']:>9} {r['api_per_min_other']:>9}")
    for phase, v in result.get("phases", {}).items():
        lines.append(f"{phase:<24} {v['seconds']:>6} s  CPU s/min " + ", ".join(
            f"{who} {cpu} ({v['cpu_share'].get(who, 0) * 100:.0f} %)" for who, cpu in v["cpu_s_per_min"].items()) +
            f"; Prometheus RSS median {v['rss_mb_median'].get('prometheus')} MB, max "
            f"{v['rss_mb_max'].get('prometheus')} MB")
    return "\n".join(lines)


def stop_replicas(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def log_warnings(path: Path) -> dict[str, int]:
    """A replica's WARNING/ERROR lines counted by message (the fields after it left out), most first."""
    counts: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 2)  # "HH:MM:SS LEVEL   message  field=value ..."
            if len(parts) == 3 and parts[1] in ("WARNING", "ERROR", "CRITICAL"):
                message = parts[2].lstrip().split("  ", 1)[0]
                counts[f"{parts[1]} {''.join('N' if c.isdigit() else c for c in message)[:160]}"] += 1
    return dict(counts.most_common(12))


def replica_up(srv: KubeAPIServer, proc: subprocess.Popen[bytes], identity: str, port: int,
               shards: int) -> tuple[float, float]:
    """Wait as a rollout does: the replica ready (/readyz), then holding a shard; (seconds to each)."""
    def gone() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"{identity} exited {proc.returncode}: see its log in {LOGS}")
        return False
    ready_s = wait(lambda: gone() or http_ok(f"http://127.0.0.1:{port}/readyz"), 1800, f"{identity} ready")
    owns_s = wait(lambda: gone() or identity in shard_holders(srv, shards).values(), 1800,
                  f"{identity} to hold a shard")
    return ready_s, owns_s


def replica_cluster(names: list[str], replicas: int) -> tuple[KubeAPIServer, KubeClient, list[str], dict[str, str],
                                                               CordonWatch]:
    """The emulator with ``names``, a token of its own for each replica: (server, admin client, the replicas'
    identities, user -> identity, the cordons' watch)."""
    srv, client = emulator_with_nodes(names)
    identities = [f"gpuremediate-{i}" for i in range(replicas)]
    users = {replica_user(i): identities[i] for i in range(replicas)}
    for i in range(replicas):
        srv.add_token(replica_token(i), replica_user(i))
    return srv, client, identities, users, CordonWatch(srv)


def run_sharded(n: int, shards: int, replicas: int, steady_s: float, faults: int, burst: int,
                endpoints: int, mode: str = "raw") -> dict[str, Any]:
    """``replicas`` controllers with ``--shards S`` (each its own identity, token, metrics port and log) on one
    Prometheus and one emulator, started one after another as a rollout does; then a steady window, ``faults``
    XIDs one after the other and ``burst`` at once, each cordon checked against its shard's owner."""
    fault_nodes = pick_nodes("gpu-fault", faults, shards)
    burst_nodes = pick_nodes("gpu-burst", burst, shards)
    live = fault_nodes + burst_nodes
    names = [f"gpu-{i:05d}" for i in range(n - len(live))] + live
    log(f"N={n}: emulator with {n} Nodes")
    srv, client, identities, users, watch = replica_cluster(names, replicas)
    started = time.monotonic()
    fleet = FleetProcess(names, live, endpoints)
    log(f"N={n}: {endpoints} endpoints (pid {fleet.pid}), {fleet.body_bytes / 1e6:.0f} MB a scrape, rendered in "
        f"{time.monotonic() - started:.0f} s")
    LOGS.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"nodes": n, "gpus": n * 8, "series": n * 8 * len(families()), "endpoints": endpoints,
                              "shards": shards, "replicas": replicas, "fault_count": faults, "burst_size": burst,
                              "mode": mode,
                              "controller_flags": CONTROLLER_FLAGS or "defaults", "logs": str(LOGS)}
    procs: list[subprocess.Popen[bytes]] = []
    ports = [promlab.free_port() for _ in range(replicas)]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, \
                prometheus_with_fleet(fleet.addresses, PROM_SCRAPE_S, Path(tmp)) as prom:
            cpu = ProcessCpu({"emulator": os.getpid(), "fleet": fleet.pid,
                              "prometheus": prom.proc.pid if prom.proc else 0})
            cpu.begin("prometheus_first_scrape")
            took = wait(lambda: prom_has_nodes(prom.url) >= n, 1800, "Prometheus to scrape the fleet")
            log(f"Prometheus has the fleet after {took:.0f} s")
            if mode == "recorded":
                took = load_recording_rules(prom, 900)
                log(f"recording rules evaluated after {took:.0f} s")
            cpu.begin("prometheus_alone")
            time.sleep(min(steady_s, 60.0))
            sharded_phases(result, shards, steady_s, srv, client, fleet, prom, cpu, procs, ports, identities,
                           users, watch, fault_nodes, burst_nodes)
            cpu.end()
            result["phases"] = cpu.phases
            result["replica_metrics_at_end"] = {identities[i]: replica_gauges(port) for i, port in enumerate(ports)}
            result["alive"] = {identities[i]: proc.poll() is None for i, proc in enumerate(procs)}
            stop_replicas(procs)  # before Prometheus stops: their last reads would fail and be logged
            result["log_warnings"] = {identities[i]: log_warnings(LOGS / f"controller-{i}.log")
                                      for i in range(len(procs))}
    finally:
        stop_replicas(procs)
        fleet.stop()
        srv.stop()
    return result


def roll_out(result: dict[str, Any], srv: KubeAPIServer, source: tuple[str, ...], shards: int, cpu: ProcessCpu,
             procs: list[subprocess.Popen[bytes]], ports: list[int], identities: list[str]) -> dict[int, str]:
    """Start the replicas one after another as a rollout does (each ready and holding a shard before the next),
    then wait for a fair split; ``result["rollout"]`` says how long each took. Returns shard -> holder."""
    rollout: list[dict[str, Any]] = []
    rollout_started = time.monotonic()
    for i, identity in enumerate(identities):
        kubeconfig = LOGS / f"kubeconfig-{i}"
        srv.write_kubeconfig(kubeconfig, token=replica_token(i))
        (LOGS / f"controller-{i}.log").unlink(missing_ok=True)  # this run's lines only (log_warnings counts them)
        t_start = time.monotonic()
        mode_flags = ("--shards", str(shards)) if shards > 1 else ("--leader-elect",)
        proc = controller_process(kubeconfig, source, ports[i], (*mode_flags, "--identity", identity),
                                  log_name=f"controller-{i}.log")
        procs.append(proc)
        cpu.add(identity, proc.pid)
        ready_s, owns_s = replica_up(srv, proc, identity, ports[i], shards)
        holders = shard_holders(srv, shards)
        rollout.append({"replica": identity, "ready_after_s": round(ready_s, 1),
                        "holds_a_shard_after_s": round(time.monotonic() - t_start, 1),
                        "holders_then": dict(Counter(holders.values()))})
        log(f"{identity}: ready after {ready_s:.0f} s, holds a shard after {owns_s + ready_s:.0f} s; "
            f"holders {dict(Counter(holders.values()))}")
    fair_s = wait(lambda: fair(shard_holders(srv, shards), shards, identities), 1800, "a fair split")
    holders = shard_holders(srv, shards)
    log(f"fair split {dict(Counter(holders.values()))} {fair_s:.0f} s after the last start")
    result["rollout"] = {"replicas": rollout, "fair_after_last_start_s": round(fair_s, 1),
                         "from_first_start_s": round(time.monotonic() - rollout_started, 1),
                         "shards_by_holder": dict(Counter(holders.values())),
                         "holders": {str(k): v for k, v in sorted(holders.items())}}
    return holders


def replica_steady(cpu: ProcessCpu, identity: str, requests: list[Any], i: int, cpu_s: float, t0: float,
                   t1: float) -> dict[str, Any]:
    """Replica ``i``'s CPU, RSS and API requests (Lease, others by verb) a minute over a steady window."""
    mine = [r for r in requests if r[0] == replica_user(i)]
    lease = sum(1 for r in mine if r[3] == "leases")
    others = Counter(" ".join(filter(None, (r[1], r[3], r[4]))) for r in mine if r[3] != "leases")
    per_min = 60.0 / (t1 - t0)
    return {"cpu_s_per_min": round(cpu_s * per_min, 1),
            "rss_steady_mb": round(cpu.rss[identity].median_mb(t0, t1), 1),
            "rss_peak_mb": round(cpu.rss[identity].peak_mb(), 1),
            "api_per_min_lease": round(lease * per_min, 1),
            "api_per_min_other": round(sum(others.values()) * per_min, 1),
            "api_other_by_verb_per_min": {k: round(v * per_min, 1) for k, v in sorted(others.items())}}


def sharded_phases(result: dict[str, Any], shards: int, steady_s: float, srv: KubeAPIServer,
                   client: KubeClient, fleet: FleetProcess, prom: promlab.PromServer, cpu: ProcessCpu,
                   procs: list[subprocess.Popen[bytes]], ports: list[int], identities: list[str],
                   users: dict[str, str], watch: CordonWatch, fault_nodes: list[str], burst_nodes: list[str]) -> None:
    """The rollout, the steady window, the faults and the burst, each phase's figures put in ``result`` as it
    ends: a phase that cannot finish (a wait timed out, ^C) leaves the ones before it, and says why."""
    try:
        cpu.begin("rollout")
        holders = roll_out(result, srv, prometheus_source(prom.url), shards, cpu, procs, ports, identities)
        first_reads = wait(lambda: all(scrape_stats(port)[0] >= 1 for port in ports), 1800,
                           "every replica's first read")
        result["good_reads_before_steady"] = {identities[i]: good_reads(port) for i, port in enumerate(ports)}
        log(f"every replica has read (+{first_reads:.0f} s; good reads {result['good_reads_before_steady']}); "
            f"steady for {steady_s:g} s")
        # steady window
        cpu.begin("steady")
        before = len(srv.requests)
        stats0 = [scrape_stats(port) for port in ports]
        cpu0 = [cpu_seconds(proc.pid) for proc in procs]
        t0 = time.monotonic()
        time.sleep(steady_s)
        t1 = time.monotonic()
        stats1 = [scrape_stats(port) for port in ports]
        cpu1 = [cpu_seconds(proc.pid) for proc in procs]
        requests = list(srv.requests)[before:]
        cpu.end()
        per_replica: list[dict[str, Any]] = []
        for i, identity in enumerate(identities):
            (c0, s0, e0), (c1, s1, e1) = stats0[i], stats1[i]
            per_replica.append({
                "replica": identity, "shards": sorted(k for k, v in holders.items() if v == identity),
                "reads": int(c1 - c0), "read_s": round((s1 - s0) / max(1.0, c1 - c0), 2),
                "read_errors": int(e1 - e0), "read_errors_total": int(e1),
                **replica_steady(cpu, identity, requests, i, cpu1[i] - cpu0[i], t0, t1)})
        result["steady"] = per_replica

        def owner_of(node: str) -> str:
            return holders.get(shard_of(node, shards), "?")

        # faults one after the other
        cpu.begin("faults")
        since = len(srv.requests)
        timed = []
        for node in fault_nodes:
            timed.append(fault_to_cordon(fleet, prom.url, client, node))
            log(f"{node} (shard {shard_of(node, shards)}, {owner_of(node)}): cordoned {timed[-1][0]:.1f} s "
                f"after the fault, {timed[-1][0] - timed[-1][1]:.2f} s after Prometheus had it")
        time.sleep(5)  # a second cordon or a stray write would show
        cpu.end()
        if timed:
            prom_to = [c - p for c, p in timed]
            result["faults"] = {
                "prometheus_has_it_to_cordon_s": [round(v, 2) for v in prom_to],
                "fault_to_cordon_s": [round(c, 1) for c, _ in timed],
                "owners": {node: owner_of(node) for node in fault_nodes},
                "check": check_cordons(srv, watch, fault_nodes, owner_of, users, since)}
        # the burst
        if burst_nodes:
            cpu.begin("burst")
            since = len(srv.requests)
            log(f"burst: {len(burst_nodes)} nodes at once, per shard "
                f"{dict(sorted(Counter(shard_of(n, shards) for n in burst_nodes).items()))}")
            result["burst"] = burst_to_cordon(fleet, prom.url, watch, burst_nodes, 900, breaker_held(srv, watch))
            burst_settled(result["burst"], srv, watch, burst_nodes, owner_of, users, since, cpu)
            result["burst"]["per_shard"] = dict(sorted(Counter(shard_of(n, shards)
                                                               for n in burst_nodes).items()))
        final = shard_holders(srv, shards)
        result["holders_changed"] = final != holders
    except (SystemExit, KeyboardInterrupt) as exc:
        log(f"stopped: {exc!r}")
        result["aborted"] = str(exc) or type(exc).__name__


# ---------------------------------------------------------------- direct mode


NODE_PLACEHOLDER = "node-placeholder"


def node_ip(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


@dataclass(frozen=True)
class ServedBurst:
    """A burst the exporter processes serve: a burst node's body carries XID 79 on GPU 3 from ``start`` (wall
    clock, shared by the processes; 0 until the bench sets it) plus the node's offset on."""

    template: str
    offsets: dict[str, float]  # node IP -> seconds after start
    start: Any  # multiprocessing Value("d")

    def faulty(self, ip: str) -> bool:
        offset, start = self.offsets.get(ip), self.start.value
        return offset is not None and start > 0 and time.time() >= start + offset


def faulty_template() -> str:
    state = new_node(NODE_PLACEHOLDER, 8, "127.0.0.1")
    state.gpu(3).xid = 79
    return render(state)


def serve_exporters(port: int, nodes_by_ip: dict[str, str], template: str, ready: Any,
                    burst: ServedBurst | None = None, delay_s: float = 0.0) -> None:
    """One exporter process: every node whose IP it is given, on one listening socket (0.0.0.0 with
    SO_REUSEPORT: the kernel spreads the connections over the processes; the node is the address the
    scraper connected to). Each answer is gpu-sim's 8-GPU body with the node's name put in (``burst``'s
    faulty one for a burst node once its fault is due)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if delay_s:
                time.sleep(delay_s)  # a real exporter's answer: the network, its own rendering
            ip = self.connection.getsockname()[0]
            node = nodes_by_ip.get(ip, "unknown")
            served = burst.template if burst is not None and burst.faulty(ip) else template
            body = served.replace(NODE_PLACEHOLDER, node).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            super().server_bind()

    server = Server(("0.0.0.0", port), Handler)
    ready.put(os.getpid())
    server.serve_forever()


def read_fleet(api_url: str, token: str, port: int, workers: int, cycles: int, shard: int, shards: int,
               out: Any) -> None:
    """One controller's reads (a process of its own): ``cycles`` reads of its shard, each timed and its CPU
    seconds counted (this process does nothing else)."""
    from gpuremediate.controller import ShardExporterSource
    from gpuremediate.kube.shards import shard_of
    client = KubeClient(ClusterConfig(server=api_url, token_source=StaticToken(token)), qps=500, burst=500)
    source = ShardExporterSource(client, port=port, workers=workers, timeout_s=10.0, sync_timeout_s=300.0,
                                 owns=lambda node: shards == 1 or shard_of(node, shards) == shard)
    source.start()
    source.read()  # warm: connections, the informer's first list
    walls, cpus, ok = [], [], 0
    for _ in range(cycles):
        cpu0, started = time.process_time(), time.monotonic()
        readings = source.read()
        walls.append(time.monotonic() - started)
        cpus.append(time.process_time() - cpu0)
        ok = sum(1 for r in readings if r.status == "ok")
    source.stop()
    out.put({"shard": shard, "read_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "ok": ok,
             "peak_rss_mb": round(peak_rss_mb(), 1)})


def collect(results: Any, readers: list[Any]) -> list[dict[str, Any]]:
    """Each reader's result; a reader that died (its traceback is above) ends the run instead of a hang."""
    got: list[dict[str, Any]] = []
    while len(got) < len(readers):
        try:
            got.append(results.get(timeout=5))
        except queue.Empty:
            if sum(1 for proc in readers if proc.is_alive()) < len(readers) - len(got):
                raise SystemExit("a controller process died before its result: see its traceback above") from None
    return got


def start_exporters(names: list[str], port: int, servers: int,
                    burst: ServedBurst | None = None) -> list[multiprocessing.process.BaseProcess]:
    """``servers`` processes serving the exporters of ``names`` (node i at node_ip(i)), started and listening."""
    spawn = multiprocessing.get_context("spawn")
    template = render(new_node(NODE_PLACEHOLDER, 8, "127.0.0.1"))
    by_ip = {node_ip(i): name for i, name in enumerate(names)}
    ready = spawn.Queue()
    exporters = [spawn.Process(target=serve_exporters, args=(port, by_ip, template, ready, burst, EXPORTER_DELAY_S),
                               daemon=True)
                 for _ in range(servers)]
    for proc in exporters:
        proc.start()
    for _ in exporters:
        ready.get(timeout=60)
    return exporters


def exporter_pods(client: KubeClient, names: list[str]) -> None:
    """A Running dcgm-exporter pod on each node, its IP the node's exporter address (node_ip)."""
    def pod(i: int) -> None:
        pod_name = f"dcgm-{names[i]}"
        client.create(PODS, {"metadata": {"name": pod_name, "labels": {"app": "nvidia-dcgm-exporter"}},
                             "spec": {"nodeName": names[i], "containers": [{"name": "e", "image": "x"}]}},
                      "gpu-operator")
        client.patch(PODS, pod_name, {"status": {"phase": "Running", "podIP": node_ip(i)}},
                     "gpu-operator", subresource="status")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(pod, range(len(names))))


def run_direct(n: int, cycles: int, workers: int, shards: int, servers: int) -> dict[str, Any]:
    """N exporters served by ``servers`` processes, read by ``shards`` controller processes at once."""
    names = [f"gpu-{i:05d}" for i in range(n)]
    srv, client = emulator_with_nodes(names)
    spawn = multiprocessing.get_context("spawn")
    port = promlab.free_port()
    template = render(new_node(NODE_PLACEHOLDER, 8, "127.0.0.1"))
    exporters: list[Any] = []
    readers: list[Any] = []
    try:
        exporters = start_exporters(names, port, servers)
        exporter_pods(client, names)
        results = spawn.Queue()
        readers = [spawn.Process(target=read_fleet, args=(srv.url, srv.admin_token, port, workers, cycles, shard,
                                                          shards, results), daemon=True) for shard in range(shards)]
        for proc in readers:
            proc.start()
        got = sorted(collect(results, readers), key=lambda r: r["shard"])
        per_parse = min(timeit.repeat(lambda: dcgm.readings_from_samples(
            exposition.parse(template, strict=False).samples, node="parse-cost", source="exporter",
            observed_at=0.0), number=50, repeat=3)) / 50
        return {"mode": "direct", "nodes": n, "workers": workers, "shards": shards, "exporter_processes": servers,
                "cycles": cycles, "read_s_per_cycle": round(max(r["read_s"] for r in got), 2),
                "cpu_s_per_cycle": [round(r["cpu_s"], 2) for r in got],
                "nodes_ok_last_cycle": sum(r["ok"] for r in got),
                "controller_peak_rss_mb": [r["peak_rss_mb"] for r in got],
                "parse_ms_per_scrape": round(per_parse * 1000, 2), "scrape_bytes": len(template)}
    finally:
        for proc in [*readers, *exporters]:
            proc.terminate()
            proc.join(10)
        srv.stop()


def exporter_scrapes(port: int) -> tuple[float, float]:
    """(scrapes, failed scrapes) a replica has made of exporter pods so far (its own /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        samples = exposition.parse(resp.read().decode(), strict=False).samples
    mine = [s for s in samples if s.label("source") == "exporter"]
    return (sum(s.value for s in mine if s.name == "gpuremediate_scrape_seconds_count"),
            sum(s.value for s in mine if s.name == "gpuremediate_scrape_errors_total"))


def run_direct_burst(n: int, burst: int, spread_s: float, shards: int, servers: int,
                     steady_s: float) -> dict[str, Any]:
    """The cordon burst through direct scraping, the controller's default source: ``shards`` replicas with
    default flags (``--shards S``, or ``--leader-elect`` for one, as a Deployment runs them) read N exporters
    served by ``servers`` processes; after a steady window, ``burst`` of the exporters serve XID 79, one after
    the other over ``spread_s`` seconds. "The source has it" is the moment a node's exporter serves its fault.
    Every burst node must be cordoned once, by its shard's owner, with its record."""
    burst_nodes = pick_nodes("gpu-burst", burst, shards)
    names = [f"gpu-{i:05d}" for i in range(n - burst)] + burst_nodes
    log(f"direct N={n}: emulator with {n} Nodes")
    srv, client, identities, users, watch = replica_cluster(names, shards)
    due = {node: spread_s * k / max(1, burst - 1) for k, node in enumerate(burst_nodes)}  # seconds after the start
    ip_of = {name: node_ip(i) for i, name in enumerate(names)}
    start = multiprocessing.get_context("spawn").Value("d", 0.0)
    port, ports = promlab.free_port(), [promlab.free_port() for _ in identities]
    result: dict[str, Any] = {"mode": "direct", "nodes": n, "gpus": n * 8, "shards": shards,
                              "exporter_processes": servers, "burst_size": burst, "spread_s": spread_s,
                              "controller_flags": CONTROLLER_FLAGS or "defaults", "logs": str(LOGS)}
    LOGS.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    exporters: list[Any] = []
    try:
        exporters = start_exporters(names, port, servers,
                                    ServedBurst(faulty_template(), {ip_of[b]: due[b] for b in burst_nodes}, start))
        exporter_pods(client, names)
        cpu = ProcessCpu({"emulator": os.getpid(), **{f"exporters-{i}": p.pid for i, p in enumerate(exporters)}})
        cpu.begin("rollout")
        holders = roll_out(result, srv, ("--source", "exporter", "--exporter-port", str(port)), shards, cpu, procs,
                           ports, identities)
        took = wait(lambda: all(exporter_scrapes(p)[0] >= 2 * n / shards for p in ports), 1800,
                    "every replica's second read")
        log(f"every replica has read its nodes twice (+{took:.0f} s); steady for {steady_s:g} s")
        cpu.begin("steady")
        before, t0 = len(srv.requests), time.monotonic()
        scrapes0, cpu0 = [exporter_scrapes(p) for p in ports], [cpu_seconds(p.pid) for p in procs]
        time.sleep(steady_s)
        t1 = time.monotonic()
        scrapes1, cpu1 = [exporter_scrapes(p) for p in ports], [cpu_seconds(p.pid) for p in procs]
        requests = list(srv.requests)[before:]
        cpu.end()
        result["steady"] = [{
            "replica": identity, "shards": sorted(k for k, v in holders.items() if v == identity),
            "scrapes_per_min": round((scrapes1[i][0] - scrapes0[i][0]) * 60.0 / (t1 - t0)),
            "scrape_errors": int(scrapes1[i][1] - scrapes0[i][1]),
            **replica_steady(cpu, identity, requests, i, cpu1[i] - cpu0[i], t0, t1)}
            for i, identity in enumerate(identities)]
        cpu.begin("burst")
        since = len(srv.requests)
        log(f"burst: {burst} exporters serve XID 79 over {spread_s:g} s")
        start.value, began = time.time(), time.monotonic()
        held = breaker_held(srv, watch)
        with contextlib.suppress(SystemExit):
            wait(lambda: all(b in watch.cordons for b in burst_nodes) or held(), 600, "every burst node's cordon")
        result["burst"] = cordon_figures(watch, {b: began + due[b] for b in burst_nodes}, "source_has_it")
        burst_settled(result["burst"], srv, watch, burst_nodes, lambda node: holders.get(shard_of(node, shards), "?"),
                      users, since, cpu)
        result["phases"] = cpu.phases
    except (SystemExit, KeyboardInterrupt) as exc:
        log(f"stopped: {exc!r}")
        result["aborted"] = str(exc) or type(exc).__name__
    finally:
        stop_replicas(procs)
        result["log_warnings"] = {identities[i]: log_warnings(LOGS / f"controller-{i}.log") for i in range(len(procs))}
        for proc in exporters:
            proc.terminate()
            proc.join(10)
        srv.stop()
    return result


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) / 1024.0
    return 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sizes", nargs="*", type=int, help="fleet sizes (default: 1000 2500 5000; $N overrides)")
    p.add_argument("--direct", action="store_true", help="direct exporter scraping instead of Prometheus")
    p.add_argument("--steady", type=float, default=120.0,
                   help="each window (Prometheus alone, with the controller), seconds")
    p.add_argument("--endpoints", type=int, default=10, help="Prometheus mode: scrape targets serving the fleet")
    p.add_argument("--modes", nargs="+", default=["raw", "recorded"], choices=["raw", "recorded"],
                   help="Prometheus mode: without, with gpuremediate's recording rules (each its own controller); "
                        "--shards: one of them (default raw)")
    p.add_argument("--controller-flag", action="append", default=[],
                   help="Prometheus mode: a flag for the controller beyond the defaults (repeat)")
    p.add_argument("--cycles", type=int, default=5, help="direct mode: reads to time")
    p.add_argument("--workers", type=int, nargs="+", default=[16],
                   help="direct mode: scrape concurrency (several: a sweep)")
    p.add_argument("--shards", type=int, default=1,
                   help="direct mode: controller processes, each reading its shard; Prometheus mode (>1): "
                        "--replicas controllers with --shards S, started one by one (sharded run)")
    p.add_argument("--replicas", type=int, default=0, help="sharded Prometheus mode: controllers (default: S)")
    p.add_argument("--burst", type=int, default=0,
                   help="Prometheus mode: nodes faulting at once after --faults (spread over the shards; one "
                        "replica with --leader-elect unless --shards); direct mode: the cordon burst (--spread)")
    p.add_argument("--spread", type=float, default=10.0,
                   help="direct mode --burst: seconds over which the burst's exporters start serving their fault")
    p.add_argument("--servers", type=int, default=3, help="direct mode: processes serving the exporters")
    p.add_argument("--exporter-delay-ms", type=float, default=0.0,
                   help="direct mode: each exporter answers after this long (a fleet's network and dcgm-exporter's "
                        "own rendering; loopback answers in about 1 ms)")
    p.add_argument("--faults", type=int, default=10,
                   help="XIDs injected one after the other per mode, each on a node of its own (P50/P90 of them)")
    p.add_argument("--log-level", default="warning",
                   help="the controller's --log-level (info: the fast path's split of each fault, in controller.log)")
    p.add_argument("--degradation", action="store_true",
                   help="Prometheus mode: the fleet serves the degradation fields too, and each mode runs again "
                        "with [degradation] on: what the detection adds (issue 29)")
    p.add_argument("--degradation-first", action="store_true",
                   help="with --degradation: the [degradation] run of each mode before the plain one")
    p.add_argument("--profile", action="store_true",
                   help="run the controller under bench/sampled_controller.py (LOGS/profile-PORT.txt per run)")
    p.add_argument("--trace-memory", action="store_true",
                   help="run the controller under tracemalloc (bench/traced_controller.py; slower: not for timings)")
    args = p.parse_args()
    global TRACE_MEMORY, CONTROLLER_FLAGS, CONTROLLER_LOG_LEVEL, DEGRADATION, DEGRADATION_FIRST, PROFILE
    TRACE_MEMORY, CONTROLLER_FLAGS, CONTROLLER_LOG_LEVEL = args.trace_memory, args.controller_flag, args.log_level
    DEGRADATION, DEGRADATION_FIRST, PROFILE = args.degradation, args.degradation_first, args.profile
    global EXPORTER_DELAY_S
    EXPORTER_DELAY_S = args.exporter_delay_ms / 1000.0
    sizes = args.sizes or ([int(os.environ["N"])] if os.environ.get("N") else [1000, 2500, 5000])
    for n in sizes:
        if args.direct and args.burst:
            print(json.dumps(run_direct_burst(n, args.burst, args.spread, args.shards, args.servers, args.steady)),
                  flush=True)
        elif args.direct:
            for workers in args.workers:
                print(json.dumps(run_direct(n, args.cycles, workers, args.shards, args.servers)), flush=True)
        elif args.shards > 1 or args.burst:
            sharded = run_sharded(n, args.shards, args.replicas or args.shards, args.steady, args.faults,
                                  args.burst, args.endpoints, args.modes[0] if len(args.modes) == 1 else "raw")
            print(json.dumps(sharded), flush=True)
            print(sharded_table(sharded), file=sys.stderr, flush=True)
        else:
            print(json.dumps(run_prometheus(n, args.steady, args.faults, args.endpoints, args.modes)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
