"""``[recovery_action]``: the driver's own verdict on a GPU, DCGM field 1523 (issue 29).

``DCGM_FI_DEV_GPU_RECOVERY_ACTION`` (its deprecated name ``DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION`` is read too) holds
NVML's ``nvmlDeviceGpuRecoveryAction_t`` for the GPU (drivers R570 and later): 0 NONE, 1 GPU_RESET (a fault a
reset clears), 2 NODE_REBOOT (the OS may be inconsistent: a reset is not enough), 3 DRAIN_P2P (stop peer-to-peer
traffic, then the driver says more), 4 DRAIN_AND_RESET (the GPU runs at reduced capacity: running work is safe,
reset when it is done), 5 RECOVER_IMEX_DOMAIN (R595), 6 BUS_RESET and 7 SYSTEM_REBOOT (R615; their numbers from
NVIDIA's cuda-python bindings, not yet a released nvml.h). Each non-zero value is a finding with the policy's
action for it; a value the table does not know (a newer driver's) gets ``unknown_action``. The finding lasts while
the driver reports the value: it clears with the fault (its fingerprint names GPU and value, so the same verdict
again after a clear is new).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuremediate.signals.model import GpuReading
from gpuremediate.vocab.findings import ACTION_CORDON, ACTION_NONE, ACTION_REBOOT, ACTION_RESET_GPU, Finding
from gpuremediate.vocab.schema import setting

KIND_RECOVERY_ACTION = "recovery-action"
FIELD = "DCGM_FI_DEV_GPU_RECOVERY_ACTION"
DEPRECATED_FIELD = "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"
NAMES = {1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET", 5: "RECOVER_IMEX_DOMAIN",
         6: "BUS_RESET", 7: "SYSTEM_REBOOT"}
MEANINGS = {
    1: "a fault a GPU reset clears",
    2: "the fault may have left the OS inconsistent: a GPU reset is not enough",
    3: "peer-to-peer traffic must stop before the driver can say more",
    4: "the GPU runs at reduced capacity: running work is safe, a reset restores it",
    5: "the IMEX domain must be recovered (its daemons restarted) before multi-node work runs again",
    6: "the GPU's PCIe bus must be reset",
    7: "the system must be rebooted",
}
MAX_VALUE = 255  # an enum: beyond it a blank or garbage, not a verdict


@dataclass(frozen=True)
class RecoveryActionPolicy:
    enabled: bool = setting(True, "act on the driver's recovery action for a GPU (DCGM field 1523, drivers R570+)")
    gpu_reset_action: str = setting(ACTION_RESET_GPU, "for 1 GPU_RESET", action=True)
    node_reboot_action: str = setting(ACTION_REBOOT, "for 2 NODE_REBOOT", action=True)
    drain_p2p_action: str = setting(ACTION_CORDON, "for 3 DRAIN_P2P (no new work; the driver then reports another "
                                    "value once peer-to-peer traffic stopped)", action=True)
    drain_and_reset_action: str = setting(ACTION_RESET_GPU, "for 4 DRAIN_AND_RESET (not urgent: a maintenance "
                                          "window may hold it, running work is safe)", action=True)
    recover_imex_domain_action: str = setting(ACTION_CORDON, "for 5 RECOVER_IMEX_DOMAIN (no new work until a person "
                                              "or the IMEX operator recovers the domain)", action=True)
    bus_reset_action: str = setting(ACTION_REBOOT, "for 6 BUS_RESET (a node reboot resets the bus)", action=True)
    system_reboot_action: str = setting(ACTION_REBOOT, "for 7 SYSTEM_REBOOT", action=True)
    unknown_action: str = setting(ACTION_NONE, "for a value this table does not know (a newer driver's): an Event, "
                                  "until the policy says more", action=True)

    def action_for(self, value: int) -> str:
        return {1: self.gpu_reset_action, 2: self.node_reboot_action, 3: self.drain_p2p_action,
                4: self.drain_and_reset_action, 5: self.recover_imex_domain_action, 6: self.bus_reset_action,
                7: self.system_reboot_action}.get(value, self.unknown_action)


def recovery_value(reading: GpuReading) -> int | None:
    """The GPU's recovery action, or None (not exported, a blank, not a whole number in range)."""
    raw = reading.extra.get(FIELD, reading.extra.get(DEPRECATED_FIELD))
    if raw is None or raw != raw or not 0 <= raw <= MAX_VALUE or raw != int(raw):
        return None
    return int(raw)


def recovery_action_findings(node: str, readings: Iterable[GpuReading], policy: RecoveryActionPolicy) -> list[Finding]:
    if not policy.enabled:
        return []
    found: dict[str, Finding] = {}
    for reading in readings:
        value = recovery_value(reading)
        if not value:
            continue
        action = policy.action_for(value)
        name = NAMES.get(value, f"value {value}")
        meaning = MEANINGS.get(value, "a value this controller does not know")
        message = f"the driver asks for {name} on GPU {reading.key}: {meaning} ({action})."
        finding = Finding(node, KIND_RECOVERY_ACTION, name, (reading.key,), action,
                          f"{KIND_RECOVERY_ACTION}:{reading.key}:{value}", message, urgent=value != 4)
        found.setdefault(finding.fingerprint, finding)
    return list(found.values())
