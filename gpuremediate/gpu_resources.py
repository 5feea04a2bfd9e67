"""The node's GPU resources: which extended resources are GPUs, what a pod holds, what validation must hold.

The NVIDIA device plugin names what it offers by the node's MIG strategy (GPU feature discovery's label
``nvidia.com/mig.strategy``):

- ``none`` (no MIG): every GPU is one ``nvidia.com/gpu``.
- ``single``: every GPU is split the same way and each MIG device is one ``nvidia.com/gpu``; the
  capacity counts MIG devices, not GPUs (``nvidia.com/gpu.product`` gets a ``-MIG-1g.10gb`` suffix).
- ``mixed``: each MIG profile is its own resource, ``nvidia.com/mig-<profile>`` (``nvidia.com/mig-1g.10gb``,
  ``nvidia.com/mig-3g.40gb``); GPUs left whole stay ``nvidia.com/gpu``.

So "a GPU pod" is a pod asking for any of the ``[gpu_resources] names`` (default ``nvidia.com/gpu`` and
every ``nvidia.com/mig-*``; a trailing ``*`` matches a prefix). The kubelet reports a device plugin's
resources as ``capacity`` = every device it lists and ``allocatable`` = the healthy ones: a GPU the plugin
marked unhealthy (a critical XID) is in capacity, not in allocatable, and the kubelet admits no pod that asks
for it. Validation holds every GPU slice of the node, so it asks for the capacity of each GPU resource, and
cannot run while allocatable is short of it (``validation_hold``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.vocab.schema import PolicyError, _show, duration, is_dns_subdomain, setting, string_list

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
DEFAULT_NAMES = (GPU, MIG_PREFIX + "*")
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"  # GPU feature discovery: none | single | mixed
GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # GPU feature discovery: the physical GPUs, whatever MIG does
MAX_NAME = 63  # the name part of a qualified name

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_NAME_START = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]*")
RESOURCE_WANTED = ("expected an extended resource name <domain>/<name> (a qualified name, e.g. nvidia.com/gpu), "
                   "or such a name's start ending in * (e.g. nvidia.com/mig-*)")


def resource_pattern_problem(pattern: str) -> str:
    """Why ``pattern`` is not a GPU resource name or prefix pattern ("" when it is one)."""
    prefix, slash, name = pattern.partition("/")
    if not slash or not is_dns_subdomain(prefix):
        return "the domain before '/' must be a DNS subdomain (an extended resource always has one)"
    if name.endswith("*"):
        start = name[:-1]
        if start and (not _NAME_START.fullmatch(start) or len(start) >= MAX_NAME):
            return "what comes before '*' must start a name: letters, digits, '-', '_', '.'"
        return ""
    if len(name) > MAX_NAME or not _NAME.fullmatch(name):
        return f"the name after '/' must be at most {MAX_NAME} letters, digits, '-', '_', '.' (alphanumeric at ends)"
    return ""


def check_resource_pattern(value: Any, path: str) -> None:
    problem = resource_pattern_problem(value)
    if problem:
        raise PolicyError(f"{path}: {RESOURCE_WANTED}, got {_show(value)}: {problem}")


@dataclass(frozen=True)
class GpuResourcesPolicy:
    """``[gpu_resources]``: which extended resources are GPUs (drain scopes, validation)."""

    names: tuple[str, ...] = field(default=DEFAULT_NAMES, metadata={
        "doc": "extended resources that are GPUs or GPU slices; a trailing * matches a prefix (nvidia.com/mig-* "
               "is every MIG profile of the mixed strategy)",
        "parse": string_list(check_resource_pattern)})
    allocatable_wait_s: float = setting(
        300.0, "seconds validation waits for every GPU resource to be allocatable (the device plugin registering "
        "after a reboot) before it fails naming the GPUs the device plugin holds back as unhealthy", check=duration(0))

    def validate(self, path: str) -> None:
        if not self.names:
            raise PolicyError(f"{path}.names: must name at least one resource (e.g. {GPU!r})")


def is_gpu_resource(name: str, patterns: Iterable[str] = DEFAULT_NAMES) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


def count_of(value: Any) -> int | None:
    """An extended resource quantity (a whole number: "8"); None when it is not one."""
    text = str(value).strip()
    return int(text) if text.isascii() and text.isdigit() else None


def gpu_count(node: Mapping[str, Any]) -> int:
    """The node's GPUs: its ``nvidia.com/gpu`` capacity (allocatable leaves out the GPUs the device plugin
    marked unhealthy; they are still there). With the mixed MIG strategy that capacity counts only the GPUs
    left whole: GPU feature discovery's ``nvidia.com/gpu.count`` (the GPUs) says, when set. With the single
    strategy both count MIG devices (GFD overrides gpu.count there), and so does this. A DRA node has no GPU
    capacity: then the label, when set, else 0 (unknown)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    labelled = count_of(labels.get(GPU_COUNT_LABEL, ""))
    if mig_strategy(node) == "mixed" and labelled is not None:
        return labelled
    status = node.get("status") or {}
    for section in ("capacity", "allocatable"):
        value = (status.get(section) or {}).get(GPU)
        if value is not None:
            return count_of(value) or 0
    return labelled or 0


def pod_gpu_requests(pod: Mapping[str, Any], patterns: Iterable[str] = DEFAULT_NAMES) -> dict[str, int]:
    """GPU resource → how many the pod's containers (init containers included) ask for, limits or requests
    (for an extended resource a limit alone sets the request). A quantity that is not a whole number counts 1:
    the API server accepted the pod, so it holds something."""
    spec = pod.get("spec") or {}
    wanted = tuple(patterns)
    out: dict[str, int] = {}
    for container in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            for name, value in (resources.get(section) or {}).items():
                if is_gpu_resource(name, wanted):
                    count = count_of(value)
                    out[name] = max(out.get(name, 0), 1 if count is None else count)
    return {name: count for name, count in sorted(out.items()) if count > 0}


def requests_gpu(pod: Mapping[str, Any], patterns: Iterable[str] = DEFAULT_NAMES) -> bool:
    """The pod holds a GPU or a MIG slice (any of ``patterns``)."""
    return bool(pod_gpu_requests(pod, patterns))


def node_gpu_resources(node: Mapping[str, Any], section: str = "capacity",
                       patterns: Iterable[str] = DEFAULT_NAMES) -> dict[str, int]:
    """GPU resource → count in the node's ``status.capacity`` (or ``allocatable``); zero counts left out."""
    wanted = tuple(patterns)
    listed = ((node.get("status") or {}).get(section) or {}).items()
    counts = {name: count_of(value) or 0 for name, value in listed if is_gpu_resource(name, wanted)}
    return {name: count for name, count in sorted(counts.items()) if count > 0}


def mig_strategy(node: Mapping[str, Any]) -> str:
    """GPU feature discovery's ``nvidia.com/mig.strategy`` label: none, single or mixed ("" when absent)."""
    return str(((node.get("metadata") or {}).get("labels") or {}).get(MIG_STRATEGY_LABEL, ""))


@dataclass(frozen=True)
class GpuHold:
    """What a validation Job must ask for to hold every GPU slice of the node, and why it cannot yet."""

    requests: Mapping[str, int]  # the capacity of each GPU resource
    short: Mapping[str, tuple[int, int]]  # resource → (allocatable, capacity) where allocatable is less

    @property
    def problem(self) -> str:
        """Why the kubelet would not admit the Job ("" when it would)."""
        if not self.requests:
            return "the node reports no GPU resource in its capacity (the device plugin has not registered)"
        if not self.short:
            return ""
        parts = [f"{name} {alloc} of {cap} allocatable" for name, (alloc, cap) in sorted(self.short.items())]
        missing = sum(cap - alloc for alloc, cap in self.short.values())
        return (f"{'; '.join(parts)}: the device plugin holds back {missing} GPU device(s) as unhealthy, so no pod "
                "can hold every GPU")


def validation_hold(node: Mapping[str, Any], patterns: Iterable[str] = DEFAULT_NAMES) -> GpuHold:
    """Every GPU resource's capacity (single strategy: every MIG device as nvidia.com/gpu; mixed: each
    nvidia.com/mig-<profile>, and nvidia.com/gpu for whole GPUs), and where allocatable falls short of it."""
    wanted = tuple(patterns)
    capacity = node_gpu_resources(node, "capacity", wanted)
    allocatable = node_gpu_resources(node, "allocatable", wanted)
    short = {name: (allocatable.get(name, 0), cap) for name, cap in capacity.items()
             if allocatable.get(name, 0) < cap}
    return GpuHold(requests=capacity, short=short)
