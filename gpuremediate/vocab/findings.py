"""What the policy concludes from readings: findings with a recommended action."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Built-in actions. Any other action string names a custom remediation (``actions.<name>``).
ACTION_NONE = "none"  # event only
ACTION_CORDON = "cordon"  # soft fault (thermal): unschedulable, workloads stay
ACTION_RESET_GPU = "reset-gpu"
ACTION_REBOOT = "reboot"
ACTION_QUARANTINE = "quarantine"  # needs a person (RMA)
BUILTIN_ACTIONS = (ACTION_NONE, ACTION_CORDON, ACTION_RESET_GPU, ACTION_REBOOT, ACTION_QUARANTINE)
# Drain, then validate, with no repair between: only [degradation] recommends it (a slow GPU may need no repair).
ACTION_DRAIN = "drain"
# Replace the node (its Cluster API Machine or Karpenter NodeClaim deleted, or a provider's resource): issue 47.
ACTION_REPLACE = "replace"

# Finding kinds
KIND_XID = "xid"
KIND_ECC_DBE = "ecc-dbe"
KIND_ROW_REMAP_FAILURE = "row-remap-failure"
KIND_ROW_REMAP_PENDING = "row-remap-pending"
KIND_UNCORRECTABLE_ROWS = "uncorrectable-rows"
KIND_THERMAL = "thermal"
KIND_GPU_LOST = "gpu-lost"  # the driver cannot reach a GPU (nvidia-smi exit 15, "GPU is lost")
KIND_SLOW_GPU = "slow-gpu"  # [degradation]: an outlier against its peers' clocks
KIND_LINK_DEGRADED = "link-degraded"  # [degradation]: PCIe replays or NVLink errors rising
KIND_TREND = "trend"  # [degradation] trends: error counters climbing before a failure
# [network]: an RDMA NIC port (InfiniBand or RoCE) the agent reads from sysfs; the finding's code names the NIC.
KIND_NIC_DOWN = "nic-down"  # not ACTIVE/LinkUp (or the device gone)
KIND_NIC_DEGRADED = "nic-degraded"  # up, but trained below its expected rate
KIND_NIC_FLAPPING = "nic-flapping"  # link_downed / carrier_changes rising
KIND_NIC_ERRORS = "nic-errors"  # error counters rising faster than a threshold over a window
NETWORK_KINDS = (KIND_NIC_DOWN, KIND_NIC_DEGRADED, KIND_NIC_FLAPPING, KIND_NIC_ERRORS)


@dataclass(frozen=True)
class Finding:
    node: str
    kind: str  # one of KIND_*
    code: str  # XID number as text, or the metric's short name; "" when not applicable
    gpus: tuple[str, ...]  # GPU keys (UUID, else node/gpuN) the finding is about
    action: str  # one of BUILTIN_ACTIONS or a custom action name
    fingerprint: str  # stable identity of this fault occurrence (same stale value -> same fingerprint)
    message: str  # one readable sentence: what was seen and why this action
    urgent: bool = True  # False: may wait for a maintenance window (e.g. row remap pending)

    @property
    def needs_repair(self) -> bool:
        return self.action not in (ACTION_NONE, ACTION_CORDON)


# Higher is worse. A custom action ranks between reset-gpu and cordon.
_ACTION_RANK = {ACTION_NONE: 0, ACTION_CORDON: 1, ACTION_RESET_GPU: 3, ACTION_REBOOT: 4, ACTION_QUARANTINE: 5}
_CUSTOM_RANK = 2


def severity(finding: Finding) -> tuple[int, bool]:
    return _ACTION_RANK.get(finding.action, _CUSTOM_RANK), finding.urgent


def by_severity(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first: quarantine > reboot > reset-gpu > custom > cordon > none; urgent before non-urgent."""
    return sorted(findings, key=lambda f: (-severity(f)[0], not f.urgent, f.fingerprint))


def worst(findings: Iterable[Finding]) -> Finding | None:
    ranked = by_severity(findings)
    return ranked[0] if ranked else None
