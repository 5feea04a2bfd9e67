"""The GPU-level drain without DRA (``[isolation] without_dra = "device-plugin"``, issue 26): the device plugin's
own health takes the faulty GPU out, the node stays schedulable, and only that GPU's pods are evicted.

NVIDIA's device plugin marks a GPU unhealthy on most XIDs (all but the application ones it skips) and the
kubelet then lists it in ``status.capacity`` but not in ``status.allocatable``: no new pod is handed it. Nothing
the controller writes can pin that (no DeviceTaintRule without DRA), so the flow stays GPU-level only while the
node's allocatable ``nvidia.com/gpu`` shows the GPU gone. Each step, from the record's ``isolation`` (``via``
device-plugin, written by ``loops.drain_device_taint`` when no DRA device taint can take the GPU):

1. ``effect`` "": waiting for allocatable to drop below capacity, timed from ``effect_since``. Seen: ``effect``
   becomes ``unhealthy`` (an Event says the GPU is out, the node stays schedulable). Not seen within ``[isolation]
   device_plugin_wait_s``, or a node that offers no ``nvidia.com/gpu`` at all: node-level (cordon, the usual
   eviction drain), said in the record, the log and an Event.
2. ``unhealthy``: the eviction drain (``loops.drain_evict``) of the ``impacted`` scope (``loops.drain_scope``: the
   pods the exporter maps to that GPU; with no mapping every GPU pod). Should allocatable climb back to capacity
   meanwhile (the device plugin restarted, and offers the GPU again), the flow goes node-level the same way.

Repair is the GPU's own reset (``reset-gpu``), as on the DRA path. Validation cannot pin one GPU through the
device plugin: it is node-level (``loops.validate`` cordons the node for it and says so), unless ``[isolation]
validation = "privileged"``, whose Job asks for no GPU and checks that GPU alone.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from gpuremediate.actions.events import NORMAL
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.gpu_resources import GPU, count_of
from gpuremediate.loops.drain_device_taint import DETAIL_PREFIX, node_level
from gpuremediate.loops.drain_evict import EvictionDrain
from gpuremediate.loops.drainer import DrainContext
from gpuremediate.loops.step import CONFLICT, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.vocab.record import EFFECT_UNHEALTHY, Isolation, NodeRecord, isolated_at_gpu

log = logging.getLogger(__name__)


def by_device_plugin(policy: Policy, record: NodeRecord) -> bool:
    """The table row's ``matches``: the open fault's one GPU is left to the device plugin's health."""
    return isolated_at_gpu(record) and record.isolation is not None and record.isolation.by_device_plugin


def gpus_offered(node: Mapping[str, Any]) -> tuple[int, int] | None:
    """(allocatable, capacity) of ``nvidia.com/gpu`` as the kubelet posts them; None when the node lists none."""
    status = node.get("status") or {}
    capacity = count_of((status.get("capacity") or {}).get(GPU, ""))
    if not capacity:
        return None
    allocatable = count_of((status.get("allocatable") or {}).get(GPU, ""))  # not posted: as capacity
    return (capacity if allocatable is None else allocatable), capacity


class DevicePluginDrain:
    """The ``Drainer`` of a GPU-level isolation by the device plugin: a wait for allocatable, then the eviction drain
    of the GPU's pods (its own ``EvictionDrain``, which paces its evictions across steps)."""

    def __init__(self) -> None:
        self.evictions = EvictionDrain()

    def close(self) -> None:
        self.evictions.close()

    def keep_only(self, nodes: set[str]) -> None:
        self.evictions.keep_only(nodes)

    def before_admission(self, ctx: DrainContext, node: Node, record: NodeRecord) -> InProgress | None:
        """While the drain waits for admission: the GPU seen gone (or the wait over) is written at once, as the
        DRA path writes its NoSchedule rule. None: nothing written, go on."""
        isolation = record.isolation
        if isolation is None or not isolation.at_gpu or isolation.effect:
            return None
        result = self._confirm(ctx, node, record, isolation)
        return result if isinstance(result, InProgress) else None

    def step(self, ctx: DrainContext, node: Node, record: NodeRecord) -> StepResult:
        isolation = record.isolation
        assert isolation is not None and record.action is not None
        if not isolation.effect:
            return self._confirm(ctx, node, record, isolation) or self._note(ctx, node, record, isolation)
        offered = gpus_offered(node)
        if offered is None or offered[0] >= offered[1]:
            shown = "no nvidia.com/gpu" if offered is None else f"{offered[0]} of {offered[1]} nvidia.com/gpu"
            return node_level(ctx, node, record, isolation, f"the device plugin offers GPU {isolation.uuid} again "
                              f"while it is isolated (allocatable {shown})")
        return self.evictions.step(ctx, node, record)

    def _confirm(self, ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation) -> StepResult | None:
        """Allocatable shows the GPU gone: ``unhealthy`` written; the wait over, or no nvidia.com/gpu at all:
        node-level. None: still waiting."""
        name, offered = name_of(node), gpus_offered(node)
        if offered is None:
            return node_level(ctx, node, record, isolation, f"{name} offers no nvidia.com/gpu (no device plugin "
                              "serves its GPUs): the device plugin cannot hold the GPU out")
        allocatable, capacity = offered
        if allocatable < capacity:
            after = dataclasses.replace(isolation, effect=EFFECT_UNHEALTHY, effect_since=ctx.clock())
            if ctx.writer.write(node, dataclasses.replace(record, isolation=after)) is None:
                return CONFLICT
            log.info("GPU out of allocatable: isolated by the device plugin",
                     extra={"node": name, "gpu": isolation.uuid, "allocatable": allocatable, "capacity": capacity})
            ctx.events.node_event(name, "GPUIsolated", f"GPU {isolation.uuid} isolated by the device plugin "
                                  f"(allocatable nvidia.com/gpu {allocatable} of {capacity}); only its pods are "
                                  "evicted, the node stays schedulable", NORMAL)
            return InProgress(0.0)
        waited = ctx.clock() - (isolation.effect_since if isolation.effect_since is not None else ctx.clock())
        wait_s = ctx.policy.isolation.device_plugin_wait_s
        if waited >= wait_s:
            return node_level(ctx, node, record, isolation, f"allocatable nvidia.com/gpu stayed {allocatable} of "
                              f"{capacity} for {waited:.0f}s (device_plugin_wait_s {wait_s:g}): the device plugin "
                              f"did not mark GPU {isolation.uuid} unhealthy")
        return None

    @staticmethod
    def _note(ctx: DrainContext, node: Node, record: NodeRecord, isolation: Isolation) -> StepResult:
        """Waiting for the device plugin, in the drain action's detail (``explain`` prints it)."""
        assert record.action is not None
        detail = f"{DETAIL_PREFIX}waiting for the device plugin to take GPU {isolation.uuid} out of allocatable"
        if record.action.detail != detail:
            after = dataclasses.replace(record, action=dataclasses.replace(record.action, detail=detail))
            if ctx.writer.write(node, after) is None:
                return CONFLICT
        since = isolation.effect_since if isolation.effect_since is not None else ctx.clock()
        left = since + ctx.policy.isolation.device_plugin_wait_s - ctx.clock()
        return InProgress(max(0.1, min(ctx.policy.drain.retry_s, left)))
