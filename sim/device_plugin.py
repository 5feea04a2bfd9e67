"""NVIDIA's device plugin's health check, for a simulated cluster (``SimCluster(device_plugin=...)``).

The real plugin (k8s-device-plugin, internal/rm/health.go) watches NVML's critical XID events and marks a GPU
unhealthy on any XID but the application ones it skips by default (13, 31, 43, 45, 68, 109): the kubelet then
keeps the GPU in ``status.capacity`` and takes it out of ``status.allocatable``, so no new pod is handed it.
Here a thread follows gpu-sim's GPUs and sets NodeSim's unhealthy count of ``nvidia.com/gpu`` per node to the
number of its GPUs whose XID is such a one (``NodeSim.set_unhealthy``). A reset GPU (no XID any more) counts
healthy again: the plugin is restarted by a reset sequence (the GPU Operator's), which lists its GPUs afresh.

``mode`` ``health`` is that; ``blind`` never marks a GPU unhealthy (a plugin with its health checks off,
``DP_DISABLE_HEALTHCHECKS=all``, or an XID it does not watch): allocatable stays at capacity.
"""

from __future__ import annotations

import threading

from sim.gpusim import GpuSim
from sim.nodesim import GPU, NodeSim

HEALTH, BLIND = "health", "blind"
MODES = (HEALTH, BLIND)
SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})  # the plugin's default: application errors, not the GPU's


class DevicePluginHealth:
    def __init__(self, gpusim: GpuSim, nodesim: NodeSim, nodes: list[str], mode: str = HEALTH,
                 tick_s: float = 0.1) -> None:
        if mode not in MODES:
            raise ValueError(f"device plugin mode {mode!r}: expected one of {', '.join(MODES)}")
        self.gpusim, self.nodesim, self.nodes, self.mode, self.tick_s = gpusim, nodesim, list(nodes), mode, tick_s
        self._shown: dict[str, int] = {}  # node -> the unhealthy count last published
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="device-plugin-sim", daemon=True)

    def start(self) -> DevicePluginHealth:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def unhealthy(self, node: str) -> int:
        """The GPUs of ``node`` the plugin calls unhealthy now."""
        if self.mode == BLIND:
            return 0
        state = self.gpusim.node(node)
        return sum(1 for g in state.gpus if g.xid is not None and g.xid not in SKIPPED_XIDS)

    def tick(self) -> None:
        for node in self.nodes:
            count = self.unhealthy(node)
            if self._shown.get(node, 0) != count:
                self.nodesim.set_unhealthy(node, GPU, count)
                self._shown[node] = count

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:  # a lost patch (the API server stopping): published again on the next tick
                self._shown.clear()
