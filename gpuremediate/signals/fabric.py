"""NVLink fabric readings of one GPU (issue 28): its fabric registration state, its NVLink domain, IMEX.

Every name and value here is NVIDIA's (docs/operations.md, "NVLink domains", cites the sources):

- nvidia-smi: ``--query-gpu`` fields ``fabric.state``, ``fabric.status``, ``fabric.cliqueId``,
  ``fabric.clusterUuid`` (``nvidia-smi --help-query-gpu``, driver 590) and the ``-q`` section ``Fabric`` with
  ``State``, ``Status``, ``CliqueId``, ``ClusterUUID``. States: ``Not Supported``, ``Not Started``,
  ``In Progress``, ``Completed`` (NVML's ``NVML_GPU_FABRIC_STATE_*``); the status is only meaningful once the
  state is ``Completed`` (NVML's ``nvmlGpuFabricInfo_t``): ``Success`` or the driver's error words (e.g.
  ``Insufficient Resources``).
- DCGM (dcgm-exporter): ``DCGM_FI_DEV_FABRIC_MANAGER_STATUS`` (170, ``dcgmFabricManagerStatus_t``: 0 NotSupported,
  1 NotStarted, 2 InProgress, 3 Success, 4 Failure, 5 Unrecognized, 6 NvmlTooOld; DCGM derives it from the
  GPU's NVML fabric state: Completed + success is Success, Completed + an error is Failure),
  ``DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE`` (171), ``DCGM_FI_DEV_FABRIC_CLUSTER_UUID`` (172, a string: the
  exporter sets it as a label), ``DCGM_FI_DEV_FABRIC_CLIQUE_ID`` (173), ``DCGM_FI_IMEX_DOMAIN_STATUS`` (1502, a
  string: UP, DOWN, DEGRADED, NOT_INSTALLED, NOT_CONFIGURED, UNAVAILABLE) and ``DCGM_FI_IMEX_DAEMON_STATUS``
  (1503: 0 INITIALIZING .. 5 READY .. 7 UNAVAILABLE; -1 NOT_INSTALLED, -2 NOT_CONFIGURED, -3 COMMAND_ERROR).
- GPU Feature Discovery: the node label ``nvidia.com/gpu.clique`` = ``<ClusterUUID>.<CliqueId>``.

Anything else (a blank, a placeholder, an unknown word, a number out of range, the all-zero cluster UUID of a GPU
in no NVLink domain) is missing: ``None``, never a fault.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpuremediate.signals.fabric_model import GpuFabric
from gpuremediate.signals.model import ascii_int, is_dcgm_blank

__all__ = ["GpuFabric", "from_dcgm", "from_smi"]

CLIQUE_LABEL = "nvidia.com/gpu.clique"  # GPU Feature Discovery: "<ClusterUUID>.<CliqueId>"

STATE_NOT_SUPPORTED = "not-supported"
STATE_NOT_STARTED = "not-started"
STATE_IN_PROGRESS = "in-progress"
STATE_COMPLETED = "completed"
STATUS_SUCCESS = "Success"
STATUS_FAILURE = "Failure"  # DCGM's DcgmFMStatusFailure: completed with an error (its code in field 171)

SMI_STATES: Mapping[str, str] = {"not supported": STATE_NOT_SUPPORTED, "not started": STATE_NOT_STARTED,
                                 "in progress": STATE_IN_PROGRESS, "completed": STATE_COMPLETED}

FIELD_FM_STATUS = "DCGM_FI_DEV_FABRIC_MANAGER_STATUS"  # 170
FIELD_FM_ERROR = "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE"  # 171
FIELD_CLUSTER_UUID = "DCGM_FI_DEV_FABRIC_CLUSTER_UUID"  # 172, a label on the exporter's series
FIELD_CLIQUE_ID = "DCGM_FI_DEV_FABRIC_CLIQUE_ID"  # 173
FIELD_IMEX_DOMAIN = "DCGM_FI_IMEX_DOMAIN_STATUS"  # 1502, a label on the exporter's series
FIELD_IMEX_DAEMON = "DCGM_FI_IMEX_DAEMON_STATUS"  # 1503
LABEL_FIELDS = (FIELD_CLUSTER_UUID, FIELD_IMEX_DOMAIN)

# dcgmFabricManagerStatus_t → (state, status); 5 Unrecognized and 6 NvmlTooOld say nothing about the fabric
DCGM_FM_STATUS: Mapping[int, tuple[str, str | None]] = {
    0: (STATE_NOT_SUPPORTED, None), 1: (STATE_NOT_STARTED, None), 2: (STATE_IN_PROGRESS, None),
    3: (STATE_COMPLETED, STATUS_SUCCESS), 4: (STATE_COMPLETED, STATUS_FAILURE),
}
IMEX_DAEMON_READY = 5
IMEX_DAEMON_NAMES: Mapping[int, str] = {
    0: "INITIALIZING", 1: "STARTING_AUTH_SERVER", 2: "WAITING_FOR_PEERS", 3: "WAITING_FOR_RECOVERY", 4: "INIT_GPU",
    5: "READY", 6: "SHUTTING_DOWN", 7: "UNAVAILABLE", -1: "NOT_INSTALLED", -2: "NOT_CONFIGURED", -3: "COMMAND_ERROR",
}
IMEX_DOMAIN_STATES = ("UP", "DOWN", "DEGRADED", "NOT_INSTALLED", "NOT_CONFIGURED", "UNAVAILABLE")
MAX_CLIQUE_ID = 0xFFFFFFFE  # a uint32; 0xFFFFFFFF is DCGM's invalid clique id
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def cluster_uuid(text: str | None) -> str | None:
    """A canonical UUID, lower case; None when missing, malformed or all zero (no NVLink domain)."""
    if text is None or not _UUID.fullmatch(text.strip()):
        return None
    value = text.strip().lower()
    return None if value == ZERO_UUID else value


def clique_id(value: float | int | str | None) -> int | None:
    """A clique id from 0 to MAX_CLIQUE_ID, else None."""
    if isinstance(value, str):
        value = ascii_int(value.strip())
    if value is None or is_dcgm_blank(float(value)) or value != int(value) or not 0 <= value <= MAX_CLIQUE_ID:
        return None
    return int(value)


def imex_daemon(value: float | None) -> int | None:
    """DCGM_FI_IMEX_DAEMON_STATUS, one of its listed values, else None."""
    if value is None or is_dcgm_blank(value) or value != int(value) or int(value) not in IMEX_DAEMON_NAMES:
        return None
    return int(value)


def imex_domain(text: str | None) -> str | None:
    word = (text or "").strip().upper()
    return word if word in IMEX_DOMAIN_STATES else None


def from_smi(state: str | None, status: str | None, clique: str | None, uuid: str | None) -> GpuFabric | None:
    """nvidia-smi's cells (already free of placeholders: None) → GpuFabric; None when it reports nothing."""
    known = SMI_STATES.get((state or "").strip().lower())
    words = (status or "").strip() or None
    fabric = GpuFabric(state=known, status=words if known == STATE_COMPLETED else None,
                       cluster_uuid=cluster_uuid(uuid), clique_id=clique_id(clique))
    return fabric if fabric.reported else None


def from_dcgm(values: Mapping[str, float], labels: Mapping[str, str]) -> GpuFabric | None:
    """dcgm-exporter's fabric fields (numbers by field name, the string fields as labels) → GpuFabric."""
    raw = values.get(FIELD_FM_STATUS)
    state, status = (None, None)
    if raw is not None and not is_dcgm_blank(raw) and raw == int(raw):
        state, status = DCGM_FM_STATUS.get(int(raw), (None, None))
    error = values.get(FIELD_FM_ERROR)
    if status == STATUS_FAILURE and error is not None and not is_dcgm_blank(error):
        status = f"{STATUS_FAILURE} (error code {int(error)})"
    fabric = GpuFabric(state=state, status=status, cluster_uuid=cluster_uuid(labels.get(FIELD_CLUSTER_UUID)),
                       clique_id=clique_id(values.get(FIELD_CLIQUE_ID)),
                       imex_daemon=imex_daemon(values.get(FIELD_IMEX_DAEMON)),
                       imex_domain=imex_domain(labels.get(FIELD_IMEX_DOMAIN)))
    return fabric if fabric.reported else None
