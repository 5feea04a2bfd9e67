"""gpu-sim: a dcgm-exporter stand-in with fault injection (standard library only).

Serves ``/metrics`` exactly as dcgm-exporter writes it (HELP/TYPE lines, label set, integer
fields as integers, doubles with 6 decimals; the XID series absent until a first XID) for N
GPUs per node. One process can serve many nodes, each on its own loopback IP and the same
port, or one node (DaemonSet: node name from ``NODE_NAME``).

Faults come in over HTTP (``POST /inject``, ``/reset``, ``/reboot``, ``/down``, ``/kernel-xid``,
``/driver-hang``, ``/gpu-lost``), from the CLI (``gpu-sim inject ...`` against a running sim) or from a
JSON scenario timeline.

For the node agent (``gpuremediate agent``) gpu-sim also plays the host, with ``files_dir`` (``--files-dir``):
per node a kernel log ``kmsg`` in /dev/kmsg's record format (``4,SEQ,USEC,-;NVRM: Xid (PCI:…): N, …``, USEC
on CLOCK_MONOTONIC as the kernel's), a ``boot_id`` that changes on a reboot (the log then starts again),
and an ``nvidia-smi`` stand-in answering ``--query-gpu`` and ``-L`` from gpu-sim's state (it hangs while a
driver hang is injected; a GPU lost after an XID 79 is named in nvidia-smi's "Unable to determine the device
handle" line and it exits 15, as the real one does; one lost without a trace is just not listed).
``kernel_xid`` logs every occurrence (a repeated XID of the same code is a new line), ``driver_hang`` hangs
nvidia-smi, ``gpu_lost`` takes a GPU off the bus.
``POST /validate`` (``gpu-sim validate``) plays the validation Job: it fails while a GPU of the
node still shows a fault (the kind overlay's repair and validation Jobs use these commands).
This file is copied alone into the gpu-sim image: it imports nothing outside the stdlib.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.nic_sysfs import NicTree

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_DRIVER = "570.133.20"
# PCI buses of the eight GPUs on an HGX H100 baseboard.
HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

FAULTS = ("xid", "dbe", "row-remap-failure", "row-remap-pending", "uncorrectable-rows", "temp", "memory-temp",
          "fabric-failure", "fabric-stuck", "fabric-manager-down", "imex-down", "sbe")
# NVL72 (issue 28): a rack is one NVLink domain of 18 compute trays x 4 GPUs. The fabric fields as dcgm-exporter
# shows them (docs/operations.md "NVLink domains" cites NVIDIA's names): DCGM_FI_DEV_FABRIC_MANAGER_STATUS is
# dcgmFabricManagerStatus_t (1 NotStarted, 2 InProgress, 3 Success, 4 Failure), the cluster UUID and the IMEX
# domain status are string fields (labels on every series), DCGM_FI_IMEX_DAEMON_STATUS 5 is READY.
NVL72_TRAYS = 18
NVL72_GPUS = 4
NVL72_MODEL = "NVIDIA GB200"
FM_NOT_STARTED, FM_IN_PROGRESS, FM_SUCCESS, FM_FAILURE = 1, 2, 3, 4
IMEX_READY, IMEX_WAITING_FOR_PEERS = 5, 2
NODE_FAULTS = ("fabric-manager-down", "imex-down")  # the node's, whatever GPU is named
FABRIC_FIELDS = ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE",
                 "DCGM_FI_DEV_FABRIC_CLIQUE_ID", "DCGM_FI_IMEX_DAEMON_STATUS")
SMI_FABRIC_STATES = {FM_NOT_STARTED: "Not Started", FM_IN_PROGRESS: "In Progress", FM_SUCCESS: "Completed",
                     FM_FAILURE: "Completed"}
DOWN_MODES = ("refuse", "500", "hang")
SCENARIO_ACTIONS = (*FAULTS, "reset", "reboot", "down", "up")

# XID -> err_msg, from NVIDIA's XID catalog (descriptions as the catalog words them).
XID_MESSAGES: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "GPU memory remapping event",
    64: "GPU memory remapping failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained memory error",
    95: "Uncontained memory error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # gauge | counter
    help: str
    attr: str  # GpuState attribute holding the value
    is_float: bool = False


# In dcgm-exporter's order (default counters, plus the ECC / remap fields the policy reads).
FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "sm_clock"),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "mem_clock"),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "memory_temp"),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "gpu_temp"),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power_w", True),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "energy_mj",
    ),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "pcie_replays"),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "util"),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "mem_util"),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "zero"),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "zero"),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "xid"),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "fb_free"),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "fb_used"),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "fb_reserved"),
    Field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.", "sbe_vol"
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.", "dbe_vol"
    ),
    Field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors.", "sbe_agg"
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors.", "dbe_agg"
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "zero",
    ),
    Field("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", "zero"),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "remap_uncorrectable",
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        "remap_correctable",
    ),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "remap_failure"),
    Field("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending.", "remap_pending"),
    Field("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "gauge", "The status of the fabric manager.", "fabric_status"),
    Field("DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE", "gauge", "The fabric manager error code.", "fabric_error"),
    Field("DCGM_FI_DEV_FABRIC_CLIQUE_ID", "gauge", "The ID of the fabric clique.", "fabric_clique"),
    Field("DCGM_FI_IMEX_DAEMON_STATUS", "gauge", "IMEX daemon status.", "imex_daemon"),
    Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", "gr_active", True
    ),
    Field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "tensor_active",
        True,
    ),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "dram_active",
        True,
    ),
)


class SimError(ValueError):
    """A request the simulator cannot honour (unknown node, GPU, fault, bad value)."""


@dataclass
class MigInstance:
    """A MIG GPU instance: dcgm-exporter writes it as its own series (GPU_I_ID, GPU_I_PROFILE), keeping the
    parent's gpu and UUID labels and device fields; a pod on the instance is on that series only."""

    gi_id: int
    profile: str  # e.g. "1g.10gb"
    pod: tuple[str, str, str] | None = None  # (namespace, pod, container)


@dataclass
class GpuState:
    index: int
    uuid: str
    pci_bus_id: str
    gpu_temp: int = 34
    memory_temp: int = 41
    xid: int | None = None  # None: the series is absent, as before a first XID
    sbe_vol: int = 0
    dbe_vol: int = 0
    sbe_agg: int = 0
    dbe_agg: int = 0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_failure: int = 0
    remap_pending: int = 0
    sm_clock: int = 1980
    mem_clock: int = 2619
    power_w: float = 71.254
    util: int = 0
    mem_util: int = 0
    fb_total: int = 81559
    fb_used: int = 0
    fb_reserved: int = 479
    pcie_replays: int = 0
    zero: int = 0
    gr_active: float = 0.0
    tensor_active: float = 0.0
    dram_active: float = 0.0
    booted_at: float = field(default_factory=time.monotonic)
    pod: tuple[str, str, str] | None = None  # (namespace, pod, container) using this GPU
    mig: list[MigInstance] = field(default_factory=list)  # MIG mode on: one series per instance, none for the GPU
    lost: bool = False  # fell off the bus: gone from the exporter and nvidia-smi's rows until a reboot
    lost_named: bool = False  # the driver saw it fall (XID 79): nvidia-smi names it lost; else it is just not listed
    fabric_status: int = FM_SUCCESS  # dcgmFabricManagerStatus_t of this GPU (NVL72 nodes only)
    fabric_error: int = 0
    fabric_clique: int = 0  # set from the node's NodeFabric

    @property
    def fb_free(self) -> int:
        return self.fb_total - self.fb_used - self.fb_reserved

    @property
    def energy_mj(self) -> int:
        return 4_742_776 + int((time.monotonic() - self.booted_at) * self.power_w * 1000)

    def reset(self) -> None:
        """A GPU reset: XID gauge gone, volatile ECC zeroed, pending remaps applied, its fabric registered again."""
        self.xid = None
        self.fabric_status, self.fabric_error = FM_SUCCESS, 0
        self.sbe_vol = 0
        self.dbe_vol = 0
        self.remap_pending = 0
        self.booted_at = time.monotonic()


@dataclass
class NodeFabric:
    """An NVL72 compute tray's NVLink domain, its Fabric Manager / NVLink management software and IMEX."""

    cluster_uuid: str
    clique_id: int
    fm_running: bool = True
    imex_daemon: int = IMEX_READY
    imex_domain: str = "UP"

    @property
    def clique(self) -> str:
        """GPU Feature Discovery's ``nvidia.com/gpu.clique`` value."""
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass
class NodeState:
    name: str
    ip: str
    gpus: list[GpuState]
    model: str = DEFAULT_MODEL
    driver: str = DEFAULT_DRIVER
    down: str | None = None  # one of DOWN_MODES
    delay_s: float = 0.0  # slow exporter: answer /metrics after this long
    padding_bytes: int = 0  # oversized scrape: this many bytes of comment lines appended
    hostname_label: str = "Hostname"  # newest exporters write "hostname"
    driver_hung: bool = False  # nvidia-smi (the agent's view) does not answer
    kmsg_seq: int = -1  # the last kernel-log record's SEQ this boot
    kmsg: list[str] = field(default_factory=list)  # this boot's kernel-log records
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    kmsg_written: threading.Event = field(default_factory=threading.Event)  # a record (or a new boot) since the wait
    holders: set[str] = field(default_factory=set)  # clients with the GPUs open (operands): a reset is refused
    fabric: NodeFabric | None = None  # an NVL72 tray (set_fabric); None: no NVLink domain, no fabric series

    @property
    def present(self) -> list[GpuState]:
        return [g for g in self.gpus if not g.lost]

    def gpu(self, index: int) -> GpuState:
        if not 0 <= index < len(self.gpus):
            raise SimError(f"node {self.name!r} has no GPU {index} (it has {len(self.gpus)})")
        return self.gpus[index]


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID for a simulated GPU, shaped like NVML's."""
    h = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _pci_bus_id(index: int) -> str:
    bus = HGX_BUSES[index] if index < len(HGX_BUSES) else f"{0xC0 + index:02X}"
    return f"00000000:{bus}:00.0"


def new_node(name: str, gpus: int, ip: str, model: str = DEFAULT_MODEL, driver: str = DEFAULT_DRIVER) -> NodeState:
    if gpus < 1:
        raise SimError(f"a node needs at least one GPU, got {gpus}")
    states = [
        GpuState(
            index=i,
            uuid=gpu_uuid(name, i),
            pci_bus_id=_pci_bus_id(i),
            gpu_temp=33 + (i * 3) % 7,
            memory_temp=40 + (i * 5) % 6,
        )
        for i in range(gpus)
    ]
    return NodeState(name=name, ip=ip, gpus=states, model=model, driver=driver)


# ---------------------------------------------------------------- exposition


def _labels(node: NodeState, gpu: GpuState, mig: MigInstance | None = None) -> str:
    parts = [
        f'gpu="{gpu.index}"',
        f'UUID="{gpu.uuid}"',
        f'pci_bus_id="{gpu.pci_bus_id}"',
        f'device="nvidia{gpu.index}"',
        f'modelName="{node.model}"',
        *([f'GPU_I_PROFILE="{mig.profile}"', f'GPU_I_ID="{mig.gi_id}"'] if mig is not None else []),
        f'{node.hostname_label}="{node.name}"',
        f'DCGM_FI_DRIVER_VERSION="{node.driver}"',
        *([f'DCGM_FI_DEV_FABRIC_CLUSTER_UUID="{node.fabric.cluster_uuid}"',
           f'DCGM_FI_IMEX_DOMAIN_STATUS="{node.fabric.imex_domain}"'] if node.fabric is not None else []),
    ]
    user = gpu.pod if mig is None else mig.pod
    if user is not None:
        namespace, pod, container = user
        parts += [f'container="{container}"', f'namespace="{namespace}"', f'pod="{pod}"']
    return ",".join(parts)


def _value(f: Field, gpu: GpuState) -> str:
    v = getattr(gpu, f.attr)
    return f"{float(v):.6f}" if f.is_float else str(int(v))


def _fabric_value(f: Field, node: NodeState, gpu: GpuState) -> int:
    """A fabric field as the tray's state makes it: a stopped Fabric Manager leaves every GPU Not Started."""
    assert node.fabric is not None
    if f.attr == "fabric_status":
        return gpu.fabric_status if node.fabric.fm_running else FM_NOT_STARTED
    if f.attr == "fabric_clique":
        return node.fabric.clique_id
    if f.attr == "imex_daemon":
        return node.fabric.imex_daemon
    return gpu.fabric_error


def _series_lines(f: Field, node: NodeState) -> list[str]:
    if f.name in FABRIC_FIELDS:
        if node.fabric is None:
            return []  # not an NVLink-domain node: its exporter has no fabric series
        return [f"{f.name}{{{_labels(node, g)}}} {_fabric_value(f, node, g)}" for g in node.present]
    lines = []
    for gpu in node.present:
        instances: list[MigInstance | None] = [*gpu.mig] or [None]
        for mig in instances:
            labels = _labels(node, gpu, mig)
            if f.attr == "xid":
                if gpu.xid is None:
                    continue
                msg = XID_MESSAGES.get(gpu.xid, "Unknown Error")
                labels += f',err_code="{gpu.xid}",err_msg="{msg}"'
            lines.append(f"{f.name}{{{labels}}} {_value(f, gpu)}")
    return lines


def render(node: NodeState) -> str:
    """The /metrics body for one node, as dcgm-exporter writes it."""
    out: list[str] = []
    for f in FIELDS:
        series = _series_lines(f, node)
        if not series:
            continue
        out.append(f"# HELP {f.name} {f.help}")
        out.append(f"# TYPE {f.name} {f.type}")
        out.extend(series)
    body = "\n".join(out) + "\n"
    if node.padding_bytes > 0:
        body += _padding(node.padding_bytes)
    return body


def _padding(nbytes: int) -> str:
    line = "# " + "x" * 1021 + "\n"
    return line * (nbytes // len(line) + 1)


# ---------------------------------------------------------------- the simulator


class _NodeServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], sim: GpuSim, node: str | None) -> None:
        self.sim = sim
        self.node = node  # None: the control listener (no /metrics)
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Drop every open connection (kept-alive ones included): a refusing exporter answers nobody. The
        request that took the node down (``POST /down`` on the node's own address) gets its answer first."""
        own = getattr(_HANDLING, "handler", None)
        with self._connections_lock:
            open_now, self._connections = list(self._connections), set()
        for conn in open_now:
            if own is not None and conn is own.request:
                own.close_connection = True
                continue
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class GpuSim:
    """Many simulated nodes in one process, each served on its own IP and the same port."""

    def __init__(self, port: int = 0, host: str | None = None, control_port: int | None = None,
                 files_dir: str | None = None, flat_files: bool = False) -> None:
        """``files_dir``: write each node's kmsg, boot_id and nvidia-smi stand-in under ``files_dir/<node>/``
        (``flat_files``: directly in ``files_dir``, for one node: the DaemonSet)."""
        self.files_dir = files_dir
        self.flat_files = flat_files
        self._requested_port = port
        self.port = port
        self._host = host  # bind every node on this address (DaemonSet mode: "0.0.0.0")
        self._control_port = control_port
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeState] = {}
        self._servers: dict[str, _NodeServer] = {}
        self._control: _NodeServer | None = None
        self._stopping = threading.Event()
        self._unhang = threading.Condition(self._lock)
        self._started = False
        self._scenario_threads: list[threading.Thread] = []
        self._nics: dict[str, NicTree] = {}  # the nodes given RDMA NICs (add_nics): their sysfs trees

    # --- nodes

    def add_node(
        self,
        name: str,
        gpus: int = 8,
        ip: str | None = None,
        model: str = DEFAULT_MODEL,
        driver: str = DEFAULT_DRIVER,
    ) -> NodeState:
        with self._lock:
            if name in self._nodes:
                raise SimError(f"node {name!r} already exists")
            ip = ip or self._host or f"127.0.0.{11 + len(self._nodes)}"
            if any(n.ip == ip for n in self._nodes.values()):
                raise SimError(f"IP {ip} already serves another node")
            node = new_node(name, gpus, ip, model, driver)
            self._nodes[name] = node
            self._write_host_files(node, new_boot=True)
            if self._started:
                self._serve(node)
            return node

    def renew_node(self, name: str) -> NodeState:
        """Another machine under ``name`` (a node replaced under the same name): fresh GPUs and a new boot on the
        same address (its listener kept), nothing of the old one's faults, down exporter or NICs."""
        with self._lock:
            old = self.node(name)
            node = new_node(name, len(old.gpus), old.ip, old.model, old.driver)
            for gpu in node.gpus:  # other boards: other UUIDs (a per-GPU record of the old ones never follows)
                gpu.uuid = gpu_uuid(f"{name}@{old.boot_id}", gpu.index)
            self._nodes[name] = node
            self._nics.pop(name, None)
            self._unhang.notify_all()
            self._write_host_files(node, new_boot=True)
            return node

    def nodes(self) -> list[str]:
        with self._lock:
            return list(self._nodes)

    def node(self, name: str) -> NodeState:
        with self._lock:
            try:
                return self._nodes[name]
            except KeyError:
                raise SimError(f"unknown node {name!r}") from None

    def url_for(self, node: str) -> str:
        return f"http://{self.node(node).ip}:{self.port}/metrics"

    def metrics(self, node: str) -> str:
        with self._lock:
            return render(self.node(node))

    # --- faults

    def inject(self, node: str, gpu: int, fault: str, value: float | None = None) -> None:
        """Apply one fault; ``value`` means the XID code, a count, or degrees Celsius."""
        appliers: dict[str, Callable[[GpuState, float | None], None]] = {
            "xid": _inject_xid,
            "dbe": _inject_dbe,
            "row-remap-failure": _inject_remap_failure,
            "row-remap-pending": _inject_remap_pending,
            "uncorrectable-rows": _inject_uncorrectable_rows,
            "temp": _set_gpu_temp,
            "memory-temp": _set_memory_temp,
            "sbe": _inject_sbe,
        }
        appliers |= {"fabric-failure": _fabric_failure, "fabric-stuck": _fabric_stuck}
        if fault not in appliers and fault not in NODE_FAULTS:
            raise SimError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
        with self._lock:
            state = self.node(node)
            if fault in NODE_FAULTS:
                _node_fabric_fault(state, fault, value)
            else:
                appliers[fault](state.gpu(gpu), value)
            self._write_smi_state(state)

    def set_fabric(self, node: str, cluster_uuid: str, clique_id: int) -> NodeFabric:
        """Make ``node`` a compute tray of the NVLink domain ``cluster_uuid``.``clique_id`` (healthy, IMEX READY)."""
        with self._lock:
            state = self.node(node)
            state.fabric = NodeFabric(cluster_uuid, clique_id)
            for g in state.gpus:
                g.fabric_clique = clique_id
            self._write_smi_state(state)
            return state.fabric

    def add_nvl72_rack(self, rack: str, trays: int = NVL72_TRAYS, gpus: int = NVL72_GPUS,
                       first_ip: int | None = None) -> list[str]:
        """A GB200 NVL72 rack: ``trays`` nodes ``<rack>-tray-<n>`` of ``gpus`` GPUs, one NVLink domain."""
        cluster = str(uuid.UUID(hashlib.sha256(rack.encode()).hexdigest()[:32]))
        names = [f"{rack}-tray-{i}" for i in range(1, trays + 1)]
        for i, name in enumerate(names):
            ip = None if first_ip is None else f"127.0.0.{first_ip + i}"
            self.add_node(name, gpus=gpus, ip=ip, model=NVL72_MODEL)
            self.set_fabric(name, cluster, 1)
        return names

    def inject_xid(self, node: str, gpu: int, xid: int) -> None:
        self.inject(node, gpu, "xid", xid)

    def inject_dbe(self, node: str, gpu: int, count: int = 1) -> None:
        self.inject(node, gpu, "dbe", count)

    def set_temp(self, node: str, gpu: int, celsius: float) -> None:
        self.inject(node, gpu, "temp", celsius)

    def set_memory_temp(self, node: str, gpu: int, celsius: float) -> None:
        self.inject(node, gpu, "memory-temp", celsius)

    def inject_row_remap_failure(self, node: str, gpu: int) -> None:
        self.inject(node, gpu, "row-remap-failure")

    def inject_row_remap_pending(self, node: str, gpu: int) -> None:
        self.inject(node, gpu, "row-remap-pending")

    def set_pod(self, node: str, gpu: int, namespace: str, pod: str, container: str = "main") -> None:
        """Attribute a GPU to a pod, as dcgm-exporter does in Kubernetes mode."""
        with self._lock:
            self.node(node).gpu(gpu).pod = (namespace, pod, container)

    def set_mig(self, node: str, gpu: int, profiles: Sequence[str]) -> None:
        """MIG mode on GPU ``gpu`` with one GPU instance per profile (GPU_I_ID 1, 2, ...); none: MIG off."""
        with self._lock:
            self.node(node).gpu(gpu).mig = [MigInstance(i, p) for i, p in enumerate(profiles, start=1)]

    def set_mig_pod(self, node: str, gpu: int, gi_id: int, namespace: str, pod: str, container: str = "main") -> None:
        """Attribute one MIG instance to a pod, as dcgm-exporter's pod mapper does from the MIG device ID."""
        with self._lock:
            found = [m for m in self.node(node).gpu(gpu).mig if m.gi_id == gi_id]
            if not found:
                raise SimError(f"node {node!r} GPU {gpu} has no MIG instance {gi_id}")
            found[0].pod = (namespace, pod, container)

    def reset_gpu(self, node: str, gpu: int) -> None:
        with self._lock:
            self.node(node).gpu(gpu).reset()
            self._write_smi_state(self.node(node))

    def restart_exporter(self, node: str) -> None:
        """The exporter restarts: its sticky XID gauge is forgotten; the GPUs are untouched."""
        with self._lock:
            for g in self.node(node).gpus:
                g.xid = None

    def reset_gpus(self, node: str, gpus: Sequence[int]) -> None:
        """Reset the listed GPUs; an empty list resets every GPU of the node (GPU_IDS unknown)."""
        with self._lock:
            state = self.node(node)
            for g in [state.gpu(i) for i in gpus] if gpus else state.gpus:
                g.reset()
            self._write_smi_state(state)

    def hold(self, node: str, client: str, held: bool = True) -> None:
        """A client (device plugin, DCGM, dcgm-exporter, persistence daemon) opens the node's GPUs, or closes them."""
        with self._lock:
            holders = self.node(node).holders
            if held:
                holders.add(client)
            else:
                holders.discard(client)

    def reset_refusal(self, node: str, gpus: Sequence[int]) -> str:
        """Why ``nvidia-smi --gpu-reset`` would refuse these GPUs now ("" : it would go on): NVML's
        NVML_ERROR_IN_USE while any client holds them."""
        with self._lock:
            state = self.node(node)
            if not state.holders:
                return ""
            first = state.gpu(gpus[0]) if gpus else state.gpus[0]
            return f"GPU {first.pci_bus_id}: In use by another client ({', '.join(sorted(state.holders))})"

    def problems(self, node: str) -> list[str]:
        """What a validation (dcgmi diag) would fail on: every GPU fault still visible, the tray's fabric."""
        with self._lock:
            state = self.node(node)
            hung = ["the driver does not answer (nvidia-smi hangs)"] if state.driver_hung else []
            fabric = _fabric_problems(state)
            return hung + fabric + [p for g in state.gpus for p in _gpu_problems(g)]

    def reboot(self, node: str) -> None:
        """The node reboots: every GPU is reset (a lost one is back on the bus), the driver answers again,
        the exporter restarts (up again if it was down), and the kernel log starts again under a new boot id."""
        with self._lock:
            state = self.node(node)
            for g in state.gpus:
                g.reset()
                g.lost = g.lost_named = False
            state.driver_hung = False
            if state.fabric is not None:  # a reboot starts the Fabric Manager / NVLink software and IMEX again
                state.fabric.fm_running, state.fabric.imex_daemon, state.fabric.imex_domain = True, IMEX_READY, "UP"
            state.kmsg, state.kmsg_seq, state.boot_id = [], -1, str(uuid.uuid4())
            if node in self._nics:  # the NICs are reset and their links train again
                self._nics[node].heal()
            self._unhang.notify_all()
            self._write_host_files(state, new_boot=True)
            state.kmsg_written.set()  # a follower waiting on the old boot's log looks at the boot id
            if state.down is not None:
                self.set_down(node, None)  # a new exporter process: whatever took the old one down is gone

    # --- the host's RDMA NICs (sim/nic_sysfs): a sysfs tree under host_dir/sys, the agent's --sysfs

    def add_nics(self, node: str) -> NicTree:
        """Give ``node`` one InfiniBand NIC (NDR, 400 Gb/s) beside each GPU, on its PCIe switch; faults are
        injected on the returned tree (port_down, flap, downtrain, add_errors, gone)."""
        from sim.nic_sysfs import NicTree, layout_for_buses  # in process only: the image's gpusim.py stands alone

        with self._lock:
            state = self.node(node)
            buses = [int(g.pci_bus_id.split(":")[1], 16) for g in state.gpus]
            nics, places = layout_for_buses(buses)
            tree = self._nics[node] = NicTree(os.path.join(self.host_dir(node), "sys"), nics, places)
            return tree

    def nics(self, node: str) -> NicTree:
        tree = self._nics.get(node)
        if tree is None:
            raise SimError(f"node {node!r} has no NICs (add_nics)")
        return tree

    # --- the host, as the node agent sees it: the kernel log and nvidia-smi

    def kernel_xid(self, node: str, gpu: int, xid: int) -> str:
        """An XID as the driver reports it: one kernel-log line per occurrence (the same code again is a new
        line) and, as dcgm-exporter shows only the last one, the XID gauge. Returns the record written."""
        if isinstance(xid, bool) or not isinstance(xid, int) or xid < 1:
            raise SimError(f"kernel_xid needs a positive XID code, got {xid!r}")
        with self._lock:
            state = self.node(node)
            target = state.gpu(gpu)
            target.xid = xid
            self._write_smi_state(state)
            return self._log(state, xid_line(target, xid))

    def driver_hang(self, node: str, hung: bool = True) -> None:
        """nvidia-smi stops answering (``hung``), or answers again. The exporter is separate: a real hang
        usually takes it down too (``set_down(node, "hang")``)."""
        with self._lock:
            state = self.node(node)
            state.driver_hung = hung
            self._unhang.notify_all()
            self._write_smi_state(state)

    def gpu_lost(self, node: str, gpu: int, log_xid: bool = True) -> None:
        """The GPU falls off the bus: gone from the exporter and from nvidia-smi's rows until a reboot. With
        ``log_xid`` the driver saw it fall: the kernel logs XID 79 and nvidia-smi names it ("Unable to determine
        the device handle for GPU...: GPU is lost", exit 15); without, it is just not listed (only a count tells)."""
        with self._lock:
            state = self.node(node)
            target = state.gpu(gpu)
            target.lost, target.lost_named = True, log_xid
            self._write_smi_state(state)
            if log_xid:
                self._log(state, xid_line(target, 79))

    def kmsg_lines(self, node: str) -> list[str]:
        with self._lock:
            return list(self.node(node).kmsg)

    def kmsg_waiter(self, node: str) -> Callable[[float], bool]:
        """How the node's agent, in process, waits for its kernel log as a follower of /dev/kmsg blocks in poll(2):
        woken by each record logged (and by a reboot), at most ``timeout_s``; one follower per node."""
        written = self.node(node).kmsg_written

        def wait(timeout_s: float) -> bool:
            woken = written.wait(timeout_s)
            written.clear()  # before reading: a record logged after this wakes the next wait
            return woken

        return wait

    def host_dir(self, node: str) -> str:
        """Where the node's kmsg, boot_id and nvidia-smi are (needs ``files_dir``)."""
        if self.files_dir is None:
            raise SimError("gpu-sim writes no host files: start it with files_dir (--files-dir)")
        self.node(node)
        return self.files_dir if self.flat_files else os.path.join(self.files_dir, node)

    def nvidia_smi_runner(self, node: str) -> Callable[[Sequence[str], float], subprocess.CompletedProcess[str]]:
        """An in-process nvidia-smi for ``signals.nvidiasmi`` (its ``runner``): the stand-in's answers without
        a process per call; during a driver hang it waits out the timeout and raises TimeoutExpired."""

        def run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
            deadline = time.monotonic() + timeout_s
            with self._lock:
                while self.node(node).driver_hung and not self._stopping.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise subprocess.TimeoutExpired(list(argv), timeout_s)
                    self._unhang.wait(timeout=min(left, 0.5))
                rc, out, err = smi_answer(smi_state(self.node(node)), list(argv[1:]))
            return subprocess.CompletedProcess(list(argv), rc, out, err)

        return run

    def _log(self, state: NodeState, message: str) -> str:
        state.kmsg_seq += 1
        record = kmsg_record(state.kmsg_seq, monotonic_us(), message)
        state.kmsg.append(record)
        if self.files_dir is not None:
            with open(os.path.join(self.host_dir(state.name), KMSG_FILE), "a", encoding="utf-8") as fh:
                fh.write(record)  # one write per record: a reader never sees half of one line it then skips
        state.kmsg_written.set()
        return record

    def _write_host_files(self, state: NodeState, new_boot: bool) -> None:
        if self.files_dir is None:
            return
        where = self.host_dir(state.name)
        os.makedirs(where, exist_ok=True)
        if new_boot:
            _write_atomic(os.path.join(where, KMSG_FILE), "")
            _write_atomic(os.path.join(where, BOOT_ID_FILE), state.boot_id + "\n")
        _write_atomic(os.path.join(where, SMI_FILE), smi_script(), mode=0o755)  # this gpu-sim's, never an old one
        self._write_smi_state(state)

    def _write_smi_state(self, state: NodeState) -> None:
        if self.files_dir is not None:
            _write_atomic(os.path.join(self.host_dir(state.name), SMI_STATE_FILE), json.dumps(smi_state(state)))

    # --- exporter health

    def set_down(self, node: str, mode: str | None) -> None:
        """``refuse`` (connection refused), ``500``, ``hang``; ``None`` brings it back."""
        if mode is not None and mode not in DOWN_MODES:
            raise SimError(f"unknown down mode {mode!r}; expected one of {', '.join(DOWN_MODES)}")
        with self._lock:
            state = self.node(node)
            previous, state.down = state.down, mode
            self._unhang.notify_all()
            if self._started and mode == "refuse" and previous != "refuse":
                self._unserve(node)
            elif self._started and previous == "refuse" and mode != "refuse":
                self._serve(state)

    def set_delay(self, node: str, seconds: float) -> None:
        with self._lock:
            self.node(node).delay_s = max(0.0, seconds)

    def set_padding(self, node: str, nbytes: int) -> None:
        with self._lock:
            self.node(node).padding_bytes = max(0, nbytes)

    def set_hostname_label(self, node: str, label: str) -> None:
        with self._lock:
            self.node(node).hostname_label = label

    # --- lifecycle

    def start(self) -> GpuSim:
        with self._lock:
            for _attempt in range(5):
                try:
                    self._start_listeners()
                except OSError:
                    if self._requested_port != 0:
                        raise
                    self._close_listeners()
                    continue
                self._started = True
                return self
            raise OSError("could not bind one port on every node IP after 5 attempts")

    def _start_listeners(self) -> None:
        self.port = self._requested_port
        for state in self._nodes.values():
            if state.down != "refuse":
                self._serve(state)
        if self._control_port is not None:
            self._control = self._listen(("127.0.0.1", self._control_port), None)

    def _serve(self, state: NodeState) -> None:
        self._servers[state.name] = self._listen((state.ip, self.port), state.name)

    def _listen(self, addr: tuple[str, int], node: str | None) -> _NodeServer:
        srv = _NodeServer(addr, self, node)
        if node is not None and self.port == 0:
            self.port = srv.server_address[1]
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        return srv

    def _unserve(self, node: str) -> None:
        srv = self._servers.pop(node, None)
        if srv is not None:
            srv.shutdown()
            srv.server_close()
            srv.close_connections()

    def _close_listeners(self) -> None:
        servers = list(self._servers.values())
        if self._control is not None:
            servers.append(self._control)
        self._servers.clear()
        self._control = None
        # Shut the listeners down together: each shutdown waits out one poll interval.
        stoppers = [threading.Thread(target=srv.shutdown) for srv in servers]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        for srv in servers:
            srv.server_close()

    @property
    def control_url(self) -> str | None:
        if self._control is None:
            return None
        return f"http://127.0.0.1:{self._control.server_address[1]}"

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._unhang.notify_all()
            self._close_listeners()
            self._started = False

    def __enter__(self) -> GpuSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- used by the handler

    def wait_while_hung(self, node: str) -> None:
        """Block a /metrics request while the node is in ``hang`` mode (until it is not, or stop)."""
        with self._lock:
            while self.node(node).down == "hang" and not self._stopping.is_set():
                self._unhang.wait(timeout=0.5)

    # --- scenarios

    def run_scenario(self, events: Sequence[ScenarioEvent]) -> threading.Thread:
        """Apply a timeline in a background thread; ``at`` is seconds from now."""
        t = threading.Thread(target=self._play, args=(list(events),), daemon=True)
        self._scenario_threads.append(t)
        t.start()
        return t

    def _play(self, events: list[ScenarioEvent]) -> None:
        t0 = time.monotonic()
        for ev in sorted(events, key=lambda e: e.at):
            if self._stopping.wait(max(0.0, t0 + ev.at - time.monotonic())):
                return
            try:
                self.apply(ev)
            except SimError as e:
                print(f"gpu-sim: scenario event at {ev.at}s failed: {e}", file=sys.stderr)

    def apply(self, ev: ScenarioEvent) -> None:
        if ev.fault == "reset":
            self.reset_gpu(ev.node, _need_gpu(ev))
        elif ev.fault == "reboot":
            self.reboot(ev.node)
        elif ev.fault == "down":
            self.set_down(ev.node, str(ev.mode or "refuse"))
        elif ev.fault == "up":
            self.set_down(ev.node, None)
        else:
            self.inject(ev.node, _need_gpu(ev), ev.fault, ev.value)


def _gpu_problems(g: GpuState) -> list[str]:
    if g.lost:
        return [f"GPU {g.index}: fell off the bus"]
    checks = ((g.xid is not None, f"XID {g.xid}"), (g.dbe_vol > 0, f"{g.dbe_vol} volatile DBE"),
              (g.remap_failure > 0, "row remap failure"), (g.remap_pending > 0, "row remap pending"))
    return [f"GPU {g.index}: {what}" for failed, what in checks if failed]


def _fabric_problems(state: NodeState) -> list[str]:
    if state.fabric is None:
        return []
    if not state.fabric.fm_running:
        return ["the Fabric Manager / NVLink management software is not running"]
    return [f"GPU {g.index}: NVLink fabric not registered ({g.fabric_status})" for g in state.present
            if g.fabric_status != FM_SUCCESS]


def _fabric_failure(g: GpuState, value: float | None) -> None:
    g.fabric_status, g.fabric_error = FM_FAILURE, int(value) if value is not None else 3  # 3: DCGM_ST_NOT_SUPPORTED


def _fabric_stuck(g: GpuState, value: float | None) -> None:
    g.fabric_status = FM_IN_PROGRESS


def _node_fabric_fault(state: NodeState, fault: str, value: float | None) -> None:
    if state.fabric is None:
        raise SimError(f"node {state.name!r} is in no NVLink domain (set_fabric first)")
    if fault == "fabric-manager-down":
        state.fabric.fm_running = False
    else:  # imex-down: value is the daemon's status (default WAITING_FOR_PEERS)
        state.fabric.imex_daemon = IMEX_WAITING_FOR_PEERS if value is None else int(value)
        state.fabric.imex_domain = "DOWN"


def _need_gpu(ev: ScenarioEvent) -> int:
    if ev.gpu is None:
        raise SimError(f"scenario event {ev.fault!r} at {ev.at}s needs a gpu")
    return ev.gpu


def _count(value: float | None, what: str) -> int:
    n = 1 if value is None else int(value)
    if n < 1:
        raise SimError(f"{what} count must be >= 1, got {value}")
    return n


def _inject_xid(g: GpuState, value: float | None) -> None:
    if value is None or int(value) < 1:
        raise SimError(f"fault 'xid' needs a positive XID code as value, got {value!r}")
    g.xid = int(value)


def _inject_dbe(g: GpuState, value: float | None) -> None:
    n = _count(value, "dbe")
    g.dbe_vol += n
    g.dbe_agg += n


def _inject_sbe(g: GpuState, value: float | None) -> None:
    """Single-bit ECC errors (corrected: a trend, never a fault by itself): ``value`` more, default 1."""
    count = 1 if value is None else int(value)
    if count < 0:
        raise SimError(f"fault 'sbe' needs a non-negative count as value, got {value!r}")
    g.sbe_vol += count
    g.sbe_agg += count


def _inject_remap_failure(g: GpuState, value: float | None) -> None:
    g.remap_failure = 1


def _inject_remap_pending(g: GpuState, value: float | None) -> None:
    g.remap_pending = 1


def _inject_uncorrectable_rows(g: GpuState, value: float | None) -> None:
    g.remap_uncorrectable += _count(value, "uncorrectable-rows")


def _celsius(value: float | None, fault: str) -> int:
    if value is None or not -50 <= value <= 200:
        raise SimError(f"fault {fault!r} needs a temperature in Celsius as value, got {value!r}")
    return round(value)


def _set_gpu_temp(g: GpuState, value: float | None) -> None:
    g.gpu_temp = _celsius(value, "temp")


def _set_memory_temp(g: GpuState, value: float | None) -> None:
    g.memory_temp = _celsius(value, "memory-temp")


# ---------------------------------------------------------------- the host: kernel log, nvidia-smi

KMSG_FILE = "kmsg"
BOOT_ID_FILE = "boot_id"
SMI_FILE = "nvidia-smi"
SMI_STATE_FILE = "nvidia-smi.json"
KERN_WARNING = 4  # PRI of the driver's Xid lines: facility kern (0) * 8 + level warning (4)


def monotonic_us() -> int:
    """The kernel log's clock: CLOCK_MONOTONIC in microseconds (the agent's window is on it)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def kmsg_record(seq: int, usec: int, message: str) -> str:
    """One /dev/kmsg record (Documentation/ABI/testing/dev-kmsg): ``PRI,SEQ,USEC,FLAGS;MESSAGE``."""
    return f"{KERN_WARNING},{seq},{usec},-;{message}\n"


def xid_line(gpu: GpuState, xid: int) -> str:
    """The driver's line: the bus id as the kernel prints it (domain:bus:device), pid and name unknown."""
    domain, bus, device = gpu.pci_bus_id.split(".", 1)[0].split(":")
    what = XID_MESSAGES.get(xid, "Unknown Error")
    return f"NVRM: Xid (PCI:{domain[-4:]}:{bus}:{device}): {xid}, pid='<unknown>', name=<unknown>, {what}"


def _yes_no(value: int) -> str:
    return "Yes" if value else "No"


def smi_state(node: NodeState) -> dict[str, Any]:
    """What the nvidia-smi stand-in answers from: the GPUs on the bus, as nvidia-smi's query fields."""
    gpus = [{
        "index": str(g.index), "uuid": g.uuid, "name": node.model, "pci.bus_id": g.pci_bus_id,
        "driver_version": node.driver, "temperature.gpu": str(g.gpu_temp), "temperature.memory": str(g.memory_temp),
        "ecc.errors.uncorrected.volatile.total": str(g.dbe_vol),
        "ecc.errors.uncorrected.aggregate.total": str(g.dbe_agg),
        "retired_pages.double_bit.count": "[N/A]", "retired_pages.pending": "[N/A]",
        "mig.mode.current": "Enabled" if g.mig else "Disabled",
        "remapped_rows.correctable": str(g.remap_correctable),
        "remapped_rows.uncorrectable": str(g.remap_uncorrectable),
        "remapped_rows.pending": _yes_no(g.remap_pending), "remapped_rows.failure": _yes_no(g.remap_failure),
        **_smi_fabric(node, g),
    } for g in node.present]
    lost = [g.pci_bus_id for g in node.gpus if g.lost and g.lost_named]
    return {"hung": node.driver_hung, "gpus": gpus, "lost": lost}


def _smi_fabric(node: NodeState, g: GpuState) -> dict[str, str]:
    """nvidia-smi's fabric.* cells on an NVL72 tray; none elsewhere (the stand-in then refuses the fields)."""
    if node.fabric is None:
        return {}
    status = g.fabric_status if node.fabric.fm_running else FM_NOT_STARTED
    return {"fabric.state": SMI_FABRIC_STATES[status],
            "fabric.status": "Success" if status == FM_SUCCESS else "Insufficient Resources" if status == FM_FAILURE
            else "[N/A]", "fabric.cliqueId": str(node.fabric.clique_id),
            "fabric.clusterUuid": node.fabric.cluster_uuid}


def smi_answer(state: dict[str, Any], args: list[str]) -> tuple[int, str, str]:
    """nvidia-smi's exit code, stdout and stderr for ``args`` over ``state`` (``smi_state``): ``--query-gpu``
    with ``--format=csv,noheader,nounits``, and ``-L``. A lost GPU: the others' rows, then for each lost one
    the driver's line (bus id with a 4-digit domain, as NVML prints it) and exit 15 ("GPU has fallen off the bus",
    nvidia-smi(1) RETURN VALUE). Exit 6 when no GPU is on the bus and none is lost, as nvidia-smi's "No devices
    were found"; 2 for anything else."""
    gpus = state["gpus"]
    lost = "".join(f"Unable to determine the device handle for GPU{bus[-12:]}: GPU is lost.  Reboot the system "
                   "to recover this GPU\n" for bus in state.get("lost") or [])
    code = 15 if lost else 0
    query = [a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")]
    if query and "--format=csv,noheader,nounits" in args:
        fields = query[0].split(",")
        unknown = [f for f in fields if gpus and f not in gpus[0]]
        if unknown:
            return 2, "", f'Field "{unknown[0]}" is not a valid field to query.\n'
        if not gpus and not lost:
            return 6, "No devices were found\n", ""
        return code, "".join(", ".join(g[f] for f in fields) + "\n" for g in gpus) + lost, ""
    if args == ["-L"]:
        if not gpus and not lost:
            return 6, "No devices were found\n", ""
        return code, "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus) + lost, ""
    return 2, "", f"gpu-sim's nvidia-smi stand-in answers --query-gpu (csv,noheader,nounits) and -L only: {args}\n"


def smi_script_main(state_path: str, args: list[str]) -> int:
    """The stand-in's body: wait while the driver hangs (as nvidia-smi stuck in the driver does), answer."""
    while True:
        try:
            with open(state_path, encoding="utf-8") as fh:
                state = json.load(fh)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"gpu-sim's nvidia-smi: cannot read {state_path}: {exc}\n")
            return 9  # nvidia-smi's "the NVIDIA driver is not loaded"
        if not state.get("hung"):
            break
        time.sleep(0.2)
    code, out, err = smi_answer(state, args)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return int(code)


def smi_script() -> str:
    """The nvidia-smi stand-in, a stdlib-only Python script reading ``nvidia-smi.json`` next to it (the
    agent's container has Python, not gpu-sim): the two functions above, so its answers are the runner's."""
    body = inspect.getsource(smi_answer) + "\n\n" + inspect.getsource(smi_script_main)
    return ("#!/usr/bin/env python3\n# gpu-sim's nvidia-smi stand-in (written by sim/gpusim.py)\n"
            "from __future__ import annotations\n\nimport json\nimport os\nimport sys\nimport time\n\n\n" + body +
            "\n\nsys.exit(smi_script_main(os.path.join(os.path.dirname(os.path.abspath(__file__)), "
            f"{SMI_STATE_FILE!r}), sys.argv[1:]))\n")


def _write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """A reader sees the old file or the new one, never half of one (nor a script without its exec bit)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# ---------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class ScenarioEvent:
    at: float
    node: str
    fault: str  # a fault, or reset / reboot / down / up
    gpu: int | None = None
    value: float | None = None
    mode: str | None = None  # for "down"


def parse_scenario(data: Any) -> list[ScenarioEvent]:
    """Validate a scenario: a JSON list of {"at", "node", "gpu", "fault", "value"}."""
    if not isinstance(data, list):
        raise SimError(f"a scenario is a JSON list of events, got {type(data).__name__}")
    return [_parse_event(i, item) for i, item in enumerate(data)]


def _parse_event(i: int, item: Any) -> ScenarioEvent:
    where = f"scenario event #{i}"
    if not isinstance(item, dict):
        raise SimError(f"{where}: expected an object, got {type(item).__name__}")
    unknown = set(item) - {"at", "node", "gpu", "fault", "value", "mode"}
    if unknown:
        raise SimError(f"{where}: unknown keys {sorted(unknown)}")
    at, node, fault = item.get("at"), item.get("node"), item.get("fault")
    if not isinstance(at, int | float) or isinstance(at, bool) or at < 0:
        raise SimError(f"{where}: 'at' must be seconds >= 0, got {at!r}")
    if not isinstance(node, str) or not node:
        raise SimError(f"{where}: 'node' must be a node name, got {node!r}")
    if fault not in SCENARIO_ACTIONS:
        raise SimError(f"{where}: 'fault' must be one of {', '.join(SCENARIO_ACTIONS)}, got {fault!r}")
    gpu, value = item.get("gpu"), item.get("value")
    if gpu is not None and (not isinstance(gpu, int) or isinstance(gpu, bool)):
        raise SimError(f"{where}: 'gpu' must be an integer index, got {gpu!r}")
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
        raise SimError(f"{where}: 'value' must be a number, got {value!r}")
    return ScenarioEvent(float(at), node, fault, gpu, None if value is None else float(value), item.get("mode"))


def load_scenario(path: str) -> list[ScenarioEvent]:
    with open(path, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as e:
            raise SimError(f"{path}: not JSON: {e}") from None
    return parse_scenario(data)


# ---------------------------------------------------------------- HTTP


_HANDLING = threading.local()  # .handler: the request this thread is answering


class _Handler(BaseHTTPRequestHandler):
    server: _NodeServer
    protocol_version = "HTTP/1.1"
    server_version = "gpu-sim"

    def setup(self) -> None:
        super().setup()
        _HANDLING.handler = self

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests scrape a lot
        pass

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics" and self.server.node is not None:
            self._serve_metrics(self.server.node)
        elif path in ("/health", "/healthz"):
            self._send(200, "text/plain; charset=utf-8", b"OK\n")
        elif path == "/nodes":
            self._json(200, {"nodes": self.server.sim.nodes(), "port": self.server.sim.port})
        else:
            self._send(404, "text/plain; charset=utf-8", b"404 page not found\n")

    def _serve_metrics(self, node: str) -> None:
        sim = self.server.sim
        state = sim.node(node)
        if state.delay_s > 0:
            time.sleep(state.delay_s)
        if state.down == "hang":
            sim.wait_while_hung(node)
        if state.down == "refuse":  # a request that came in on a kept-alive connection as it went down
            self.close_connection = True
            return
        if state.down == "500":
            self._send(500, "text/plain; charset=utf-8", b"An error has occurred while serving metrics\n")
            return
        self._send(200, CONTENT_TYPE, sim.metrics(node).encode())

    def do_POST(self) -> None:
        routes: dict[str, Callable[[dict[str, Any]], object]] = {
            "/inject": self._post_inject,
            "/reset": self._post_reset,
            "/reboot": lambda b: self.server.sim.reboot(_str(b, "node")),
            "/restart-exporter": lambda b: self.server.sim.restart_exporter(_str(b, "node")),
            "/down": lambda b: self.server.sim.set_down(_str(b, "node"), b.get("mode")),
            "/kernel-xid": lambda b: self.server.sim.kernel_xid(_str(b, "node"), _int(b, "gpu"), _int(b, "xid")),
            "/driver-hang": lambda b: self.server.sim.driver_hang(_str(b, "node"), _bool(b, "hung", True)),
            "/gpu-lost": lambda b: self.server.sim.gpu_lost(_str(b, "node"), _int(b, "gpu"),
                                                            _bool(b, "log_xid", True)),
        }
        path = self.path.split("?", 1)[0]
        if path == "/validate":
            self._post_validate()
            return
        route = routes.get(path)
        if route is None:
            self._json(404, {"error": f"no such endpoint {self.path}"})
            return
        try:
            route(self._body())
        except SimError as e:
            self._json(400, {"error": str(e)})
            return
        self._json(200, {"ok": True})

    def _post_reset(self, body: dict[str, Any]) -> None:
        """``{"node", "gpu": 2}`` or ``{"node", "gpus": [0, 3]}`` (``[]``: every GPU)."""
        if "gpus" not in body:
            self.server.sim.reset_gpu(_str(body, "node"), _int(body, "gpu"))
            return
        gpus = body["gpus"]
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            raise SimError(f"'gpus' must be a list of GPU indexes, got {gpus!r}")
        self.server.sim.reset_gpus(_str(body, "node"), gpus)

    def _post_validate(self) -> None:
        try:
            problems = self.server.sim.problems(_str(self._body(), "node"))
        except SimError as e:
            self._json(400, {"error": str(e)})
            return
        self._json(200, {"ok": not problems, "problems": problems})

    def _post_inject(self, body: dict[str, Any]) -> None:
        value = body.get("value")
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise SimError(f"'value' must be a number, got {value!r}")
        self.server.sim.inject(_str(body, "node"), _int(body, "gpu"), _str(body, "fault"), value)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            raise SimError(f"request body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise SimError("request body must be a JSON object")
        return body

    def _json(self, code: int, obj: object) -> None:
        self._send(code, "application/json", json.dumps(obj).encode() + b"\n")

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper gave up (timeout); nothing to tell it


def _str(body: dict[str, Any], key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not v:
        raise SimError(f"{key!r} must be a non-empty string, got {v!r}")
    return v


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key, default)
    if not isinstance(v, bool):
        raise SimError(f"{key!r} must be true or false, got {v!r}")
    return v


def _int(body: dict[str, Any], key: str) -> int:
    v = body.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise SimError(f"{key!r} must be an integer, got {v!r}")
    return v


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-sim", description="dcgm-exporter stand-in with fault injection")
    p.add_argument("--port", type=int, default=9400, help="port every node is served on (default 9400)")
    p.add_argument("--host", help="bind address for a single node (DaemonSet: 0.0.0.0)")
    p.add_argument("--node", default=os.environ.get("NODE_NAME"), help="node name (default: $NODE_NAME)")
    p.add_argument("--nodes", type=int, default=0, help="serve N nodes gpu-node-1..N on 127.0.0.11.. instead")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--driver", default=DEFAULT_DRIVER)
    p.add_argument("--control-port", type=int, help="also serve the fault API on 127.0.0.1:PORT")
    p.add_argument("--nvl72-racks", type=int, default=0,
                   help="with --nodes: also serve N GB200 NVL72 racks of 18 trays x 4 GPUs (rack-R-tray-T)")
    p.add_argument("--clique", help="the one node is an NVL72 tray of this NVLink domain: <ClusterUUID>.<CliqueId>, "
                                    "as GPU Feature Discovery's nvidia.com/gpu.clique label")
    p.add_argument("--scenario", help="JSON timeline of faults to play once serving")
    p.add_argument("--files-dir", help="write the host's files for the node agent here (kmsg, boot_id, nvidia-smi; "
                                       "one directory per node with --nodes)")
    p.add_argument("--nics", action="store_true", help="give each node one InfiniBand NIC per GPU, a sysfs tree under "
                                                       "--files-dir's sys/ (sim/nic_sysfs.py; the agent's --sysfs)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    _client_parser(sub, "inject", "inject a fault into a running sim", with_gpu=True, with_fault=True)
    reset = _client_parser(sub, "reset", "reset GPUs (XID cleared, volatile ECC zeroed)")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument("--gpu", type=int, help="one GPU index")
    which.add_argument("--gpus", dest="gpu_list",
                       help="comma-separated GPU indexes, as a Job's $(GPU_IDS); empty: every GPU")
    _client_parser(sub, "reboot", "reboot a node (all GPUs reset, exporter restarted)")
    _client_parser(sub, "validate", "exit 0 when no GPU of the node shows a fault, else 1 (the validation Job)")
    down = _client_parser(sub, "down", "take a node's exporter down")
    down.add_argument("--mode", choices=(*DOWN_MODES, "up"), default="refuse")
    xid = _client_parser(sub, "kernel-xid", "log an XID in the node's kernel log (and the exporter's gauge)",
                         with_gpu=True)
    xid.add_argument("--xid", type=int, required=True)
    hang = _client_parser(sub, "driver-hang", "make nvidia-smi hang (--off: answer again)")
    hang.add_argument("--off", action="store_true")
    lost = _client_parser(sub, "gpu-lost", "a GPU falls off the bus (gone until a reboot; XID 79 logged)",
                          with_gpu=True)
    lost.add_argument("--no-xid", action="store_true", help="log no XID 79")
    return p


def _client_parser(
    sub: Any, name: str, help: str, with_gpu: bool = False, with_fault: bool = False
) -> argparse.ArgumentParser:
    c: argparse.ArgumentParser = sub.add_parser(name, help=help)
    c.add_argument("--url", required=True, help="any listener of the running sim, e.g. http://127.0.0.11:9400")
    c.add_argument("--node", required=True)
    if with_gpu:
        c.add_argument("--gpu", type=int, required=True)
    if with_fault:
        c.add_argument("--fault", choices=FAULTS, required=True)
        c.add_argument("--value", type=float, help="XID code, count, or degrees Celsius")
    return c


def _client_request(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"node": args.node}
    if getattr(args, "gpu", None) is not None:
        body["gpu"] = args.gpu
    if getattr(args, "gpu_list", None) is not None:
        body["gpus"] = _gpu_list(args.gpu_list)
    if args.command == "inject":
        body["fault"] = args.fault
        if args.value is not None:
            body["value"] = int(args.value) if args.value.is_integer() else args.value
    if args.command == "down":
        body["mode"] = None if args.mode == "up" else args.mode
    if args.command == "kernel-xid":
        body["xid"] = args.xid
    if args.command == "driver-hang":
        body["hung"] = not args.off
    if args.command == "gpu-lost":
        body["log_xid"] = not args.no_xid
    req = urllib.request.Request(
        args.url.rstrip("/") + "/" + args.command,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = resp.read().decode().strip()
            print(answer)
            return 1 if args.command == "validate" and not json.loads(answer).get("ok") else 0
    except urllib.error.HTTPError as e:
        print(f"gpu-sim: {e.code}: {e.read().decode().strip()}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as e:
        print(f"gpu-sim: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1


def _gpu_list(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        raise SimError(f"--gpus: expected comma-separated GPU indexes like 0,3 (or nothing), got {text!r}")
    return [int(p) for p in parts]


def sim_from_args(args: argparse.Namespace) -> GpuSim:
    if args.nodes > 0:
        sim = GpuSim(port=args.port, control_port=args.control_port, files_dir=args.files_dir)
        for i in range(1, args.nodes + 1):
            sim.add_node(f"gpu-node-{i}", gpus=args.gpus, model=args.model, driver=args.driver)
        for r in range(1, args.nvl72_racks + 1):
            sim.add_nvl72_rack(f"rack-{r}")
        return _with_nics(sim, args)
    if not args.node:
        raise SimError("no node name: pass --node, set NODE_NAME, or use --nodes N")
    sim = GpuSim(port=args.port, host=args.host or "0.0.0.0", control_port=args.control_port,
                 files_dir=args.files_dir, flat_files=True)
    sim.add_node(args.node, gpus=args.gpus, model=args.model, driver=args.driver)
    if args.clique:
        cluster, _, clique = args.clique.rpartition(".")
        if not cluster or not clique.isdigit():
            raise SimError(f"--clique: expected <ClusterUUID>.<CliqueId>, got {args.clique!r}")
        sim.set_fabric(args.node, cluster, int(clique))
    return _with_nics(sim, args)


def _with_nics(sim: GpuSim, args: argparse.Namespace) -> GpuSim:
    if args.nics:
        if not args.files_dir:
            raise SimError("--nics writes a sysfs tree under --files-dir: pass --files-dir")
        for name in sim.nodes():
            sim.add_nics(name)
    return sim


def serve(args: argparse.Namespace) -> int:
    events = load_scenario(args.scenario) if args.scenario else []
    sim = sim_from_args(args).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for name in sim.nodes():
        print(f"gpu-sim: {name} on {sim.url_for(name)}", flush=True)
    if events:
        sim.run_scenario(events)
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    sim.stop()
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    args = build_parser().parse_args(None if argv is None else list(argv))
    try:
        if args.command is None:
            return serve(args)
        return _client_request(args)
    except SimError as e:
        print(f"gpu-sim: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
