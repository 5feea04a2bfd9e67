"""``[gpu_operator]``: how a ``reset-gpu`` repair runs on a node whose GPUs the NVIDIA GPU Operator serves.

On such a node the device plugin, DCGM, dcgm-exporter and GPU Feature Discovery hold the GPUs open, so a
bare ``nvidia-smi --gpu-reset`` is refused ("In use by another client"). The operator deploys each operand
on a node only while the node label ``nvidia.com/gpu.deploy.<operand>`` is ``"true"`` (every operand
DaemonSet's nodeSelector); setting it to ``"false"`` removes the operand's pod, and setting it back
redeploys it. That is the GPU Operator team's guidance NVSentinel's janitor follows (see
``gpuremediate.loops.gpu_reset`` for the sequence and the references). Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuremediate.policy.selector import SelectorError, _check_value, check_label_key
from gpuremediate.vocab.schema import PolicyError, _show, between, dns_label, setting, shell_words

DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery's label, e.g. "Tesla-V100-SXM2-32GB"
SCOPES = ("auto", "gpu", "node")
SCOPE_GPU = "gpu"
SCOPE_NODE = "node"

# The GPU Operator's operands that hold a GPU, by the suffix of their deploy label, with the ``app`` label of
# their pods (as NVSentinel's janitor registry lists them: janitor/pkg/gpuservices/manager.go).
DEFAULT_OPERANDS = (
    "device-plugin=nvidia-device-plugin-daemonset",
    "dcgm=nvidia-dcgm",
    "dcgm-exporter=nvidia-dcgm-exporter",
    "gpu-feature-discovery=gpu-feature-discovery",
)

# Pre-Ampere NVLink GPUs (P100/V100 SXM2, V100 SXM3 in NVSwitch DGX-2/HGX-2) reset only as a whole NVLink
# group, in one command; Ampere and later NVLink GPUs, and Hopper and later NVSwitch systems, reset one by one.
DEFAULT_WHOLE_NODE_PRODUCTS = ("*SXM2*", "*SXM3*")

# Persistence mode counts as a client of the GPU (the reset is refused while it is on): switched off on the
# GPUs that have it, the reset, then switched back on where it was (NVSentinel's gpu_reset.sh does the same).
# Shell variables ($GPU_IDS), not $(GPU_IDS): the script reads the Job's environment itself.
DEFAULT_COMMAND = (
    "sh -c 'rc=0; pm=\"\"; for i in `echo \"$GPU_IDS\" | tr , \" \"`; do "
    "if [ \"`nvidia-smi -i $i --query-gpu=persistence_mode --format=csv,noheader`\" = Enabled ]; then "
    "nvidia-smi -pm 0 -i $i && pm=\"$pm $i\"; fi; done; "
    "nvidia-smi --gpu-reset -i \"$GPU_IDS\" || rc=$?; "
    "for i in $pm; do nvidia-smi -pm 1 -i $i; done; exit $rc'"
)


def _parse_operands(raw: Any, path: str, _current: Any) -> tuple[str, ...]:
    """``operands = ["<operand>=<app>", ...]``: the deploy-label suffix and the ``app`` label of its pods."""
    if not isinstance(raw, list) or not raw:
        raise PolicyError(f"{path}: expected a non-empty array of \"<operand>=<pod app label>\", got {_show(raw)}")
    for index, item in enumerate(raw):
        sub = f"{path}[{index}]"
        operand, sep, app = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not sep or not operand or not app:
            raise PolicyError(f"{sub}: expected \"<operand>=<pod app label>\", e.g. "
                              f"\"device-plugin=nvidia-device-plugin-daemonset\", got {_show(item)}")
        try:
            check_label_key(DEPLOY_LABEL_PREFIX + operand)
        except SelectorError as exc:
            raise PolicyError(f"{sub}: {DEPLOY_LABEL_PREFIX}{operand} is not a label key: {exc}") from None
    return tuple(raw)


def _parse_patterns(raw: Any, path: str, _current: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        raise PolicyError(f"{path}: expected an array of non-empty glob patterns, got {_show(raw)}")
    return tuple(raw)


def _label_value(value: Any, path: str) -> None:
    try:
        _check_value(value)
    except SelectorError as exc:
        raise PolicyError(f"{path}: {exc}") from None
    if not value:
        raise PolicyError(f"{path}: must not be empty (an empty label value is a value too, but not \"off\")")


@dataclass(frozen=True)
class GpuOperatorPolicy:
    enabled: bool = setting(True, "for reset-gpu, take the GPU Operator's operands off the node first (on nodes "
                            "that carry a nvidia.com/gpu.deploy.<operand> = \"true\" label; others get the bare "
                            "reset Job)")
    namespace: str = setting("gpu-operator", "namespace of the operands' pods", check=dns_label)
    operands: tuple[str, ...] = field(default=DEFAULT_OPERANDS, metadata={
        "doc": "operands taken off, as \"<operand>=<app>\": the label nvidia.com/gpu.deploy.<operand> and the app "
               "label of its pods", "parse": _parse_operands})
    off_value: str = setting("false", "the deploy label's value while the reset runs", check=_label_value)
    gone_timeout_s: float = setting(300.0, "seconds for the operands' pods to leave the node", check=between(1, 86400))
    back_timeout_s: float = setting(600.0, "seconds for the operands to run again and the exporter to serve "
                                    "fresh readings after the restore", check=between(1, 86400))
    scope: str = setting("auto", "auto (whole node when nvidia.com/gpu.product matches whole_node_products) | "
                         "gpu (the faulty GPUs) | node (every GPU in one command)")
    whole_node_products: tuple[str, ...] = field(default=DEFAULT_WHOLE_NODE_PRODUCTS, metadata={
        "doc": "glob patterns of nvidia.com/gpu.product values whose GPUs reset only all together (pre-Ampere "
               "NVLink: SXM2/SXM3)", "parse": _parse_patterns})
    command: str = setting(DEFAULT_COMMAND, "the reset Job's command (image, ServiceAccount, timeout: "
                           "[remediation.reset_gpu]); $GPU_IDS holds the GPU indexes (or UUIDs)", check=shell_words)

    def validate(self, path: str) -> None:
        if self.scope not in SCOPES:
            raise PolicyError(f"{path}.scope: expected one of {', '.join(SCOPES)}, got {_show(self.scope)}")
        if self.off_value == "true":
            raise PolicyError(f"{path}.off_value: \"true\" deploys the operands; use \"false\"")

    @property
    def apps(self) -> Mapping[str, str]:
        """Deploy label → the ``app`` label of that operand's pods."""
        pairs = (item.partition("=") for item in self.operands)
        return MappingProxyType({DEPLOY_LABEL_PREFIX + operand: app for operand, _, app in pairs})

    def operands_on(self, labels: Mapping[str, str]) -> list[str]:
        """The deploy labels of the operands deployed on a node with these labels (value "true")."""
        return [label for label in self.apps if labels.get(label) == "true"]

    def applies(self, labels: Mapping[str, str]) -> bool:
        """Whether a reset on this node needs the sequence: enabled, and at least one operand deployed."""
        return self.enabled and bool(self.operands_on(labels))

    def reset_scope(self, labels: Mapping[str, str]) -> str:
        """gpu or node: whether the faulty GPUs can be reset alone on this node."""
        if self.scope != "auto":
            return self.scope
        product = labels.get(PRODUCT_LABEL, "")
        whole = any(fnmatch.fnmatchcase(product, pattern) for pattern in self.whole_node_products)
        return SCOPE_NODE if product and whole else SCOPE_GPU

    def app_of(self, deploy_label: str) -> str | None:
        """The pod app label of the operand a deploy label controls (None: not an operand of ours)."""
        return self.apps.get(deploy_label)
