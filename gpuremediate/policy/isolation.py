"""``[isolation]``: whether a fault takes its node out or only its GPU (issue 26), and the rule that decides it.

``scope = "node"`` (the default) is what the controller always did: cordon, drain, repair, validate the node.
``scope = "gpu"`` takes one faulty GPU out instead, where that is safe: the finding names exactly one GPU, every
rung of its ladder is a per-GPU reset (``reset-gpu``), the node's GPUs can be reset one at a time (not a
``[gpu_operator] whole_node_products`` board), the node has no MIG, and the same GPU was not isolated already
within the repeat-offender window (it failed again after its return). Anything else is node-level, and
:func:`node_level_reason` says why. Whether the cluster can isolate it (DRA device taints served, the GPU in a
ResourceSlice) is only known to the drain, which falls back to node-level the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuremediate.policy.gpu_operator import PRODUCT_LABEL, SCOPE_NODE, GpuOperatorPolicy
from gpuremediate.policy.workflow import Rung, one_of
from gpuremediate.vocab.findings import ACTION_RESET_GPU, Finding
from gpuremediate.vocab.record import SCOPE_GPU, HistoryEntry
from gpuremediate.vocab.schema import dns_subdomain, duration, setting

ISOLATION_SCOPES = ("node", "gpu")
WITHOUT_DRA_DEVICE_PLUGIN = "device-plugin"
WITHOUT_DRA_CHOICES = ("node", WITHOUT_DRA_DEVICE_PLUGIN)
BEFORE_GA_CHOICES = ("node", "gpu")
VALIDATE_BY_CLAIM = "claim"
VALIDATION_CHOICES = (VALIDATE_BY_CLAIM, "privileged")
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


@dataclass(frozen=True)
class IsolationPolicy:
    scope: str = setting("node", "node (cordon and drain the node for any fault) | gpu (a fault on one GPU whose "
                         "repair is a per-GPU reset takes only that GPU out with a DRA DeviceTaintRule: the node "
                         "stays schedulable; anything else, or a cluster without DRA device taints, is node-level)",
                         check=one_of(*ISOLATION_SCOPES))
    before_ga: str = setting("node", "node (where DeviceTaintRule is served only before GA — resource.k8s.io/v1beta2 "
                             "or v1alpha3, Kubernetes 1.36 and older — a GPU fault is node-level: that kube-scheduler "
                             "does not honour NoSchedule device taints, so new pods could be handed the bad GPU) | "
                             "gpu (isolate the GPU anyway: its holders are still deleted by NoExecute, and a new pod "
                             "given the GPU is deleted again)", check=one_of(*BEFORE_GA_CHOICES))
    validation: str = setting(VALIDATE_BY_CLAIM, "how an isolated GPU is validated while the node's other GPUs run: "
                              "claim (the validation Job takes exactly that GPU through a ResourceClaim of "
                              "device_class that tolerates our taint, placed on the node by kube-scheduler; its "
                              "container sees that GPU alone, so the default `dcgmi diag` checks it) | privileged "
                              "(the Job runs on the node with GPU_IDS = that GPU and asks for no GPU: it needs the "
                              "node access [validation.job] gives it)", check=one_of(*VALIDATION_CHOICES))
    device_class: str = setting("gpu.nvidia.com", "the DeviceClass of the validation claim (NVIDIA's DRA driver "
                                "installs gpu.nvidia.com)", check=dns_subdomain)
    without_dra: str = setting("node", "where the cluster has no DRA device taints (no DeviceTaintRule served, or the "
                               "GPU in no ResourceSlice): node (the fault is node-level) | device-plugin (GPUs offered "
                               "as nvidia.com/gpu by NVIDIA's device plugin: only the pods the exporter maps to that "
                               "GPU are evicted, and the node stays schedulable only while its allocatable "
                               "nvidia.com/gpu shows the GPU gone, the device plugin having marked it unhealthy; "
                               "validation is node-level, the node cordoned for it, unless validation = "
                               '"privileged")', check=one_of(*WITHOUT_DRA_CHOICES))
    device_plugin_wait_s: float = setting(120.0, 'without_dra = "device-plugin": how long the node allocatable '
                                          "nvidia.com/gpu may stay at its capacity after the fault (the device plugin "
                                          "not marking the GPU unhealthy) before the fault goes node-level (cordon "
                                          "and the usual drain)", check=duration(1))

    @property
    def gpu_level(self) -> bool:
        return self.scope == SCOPE_GPU

    @property
    def by_device_plugin(self) -> bool:
        """A GPU the cluster cannot isolate with a DeviceTaintRule is left to the device plugin's health."""
        return self.without_dra == WITHOUT_DRA_DEVICE_PLUGIN


def node_level_reason(
    finding: Finding, labels: Mapping[str, str], capacity: Mapping[str, Any], *, ladder: Sequence[Rung],
    gpu_operator: GpuOperatorPolicy, history: Sequence[HistoryEntry], now: float, window_s: float,
) -> str:
    """Why ``finding`` on this node (its labels, its ``status.capacity``) is node-level under ``scope = "gpu"``;
    "" when its one GPU may be isolated alone."""
    if len(finding.gpus) != 1:
        return "the finding names no GPU" if not finding.gpus else f"the finding names {len(finding.gpus)} GPUs"
    wider = [rung.action for rung in ladder if rung.action != ACTION_RESET_GPU]
    if finding.action != ACTION_RESET_GPU or wider:
        return f"its repair is not a per-GPU reset only ({', '.join(dict.fromkeys([finding.action, *wider]))})"
    if gpu_operator.reset_scope(labels) == SCOPE_NODE:
        return f"{labels.get(PRODUCT_LABEL) or 'this node'}'s GPUs reset only together"
    if labels.get(MIG_STRATEGY_LABEL, "none") not in ("", "none") or any(
            str(name).startswith(MIG_RESOURCE_PREFIX) for name in capacity):
        return "the node has MIG GPUs"
    gpu = finding.gpus[0]
    again = [h for h in history if h.scope == SCOPE_GPU and gpu in h.gpus and now - h.at <= window_s]
    if again:
        return f"GPU {gpu} was isolated before ({len(again)} time(s) within the repeat window) and failed again"
    return ""
