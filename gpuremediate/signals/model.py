"""What every metric source produces: per-GPU readings grouped by node.

A reading field is ``None`` when the source did not report it (series absent, placeholder value,
``[N/A]``): missing is never the same as zero, and never unhealthy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Old exporters' "not supported" integers (>= 9.22e18): missing, never a reading.
PLACEHOLDER_MIN = 9.22e18

SOURCE_OK = "ok"
SOURCE_UNKNOWN = "unknown"  # exporter unreachable, stale, unparseable: reported, never remediated


@dataclass(frozen=True)
class PodRef:
    """A pod the exporter attributes to a GPU (dcgm-exporter's pod/namespace/container labels)."""

    namespace: str
    name: str


@dataclass(frozen=True)
class GpuReading:
    node: str
    gpu: str  # the exporter's ``gpu`` label: the device index, as text
    uuid: str | None = None
    pci_bus_id: str | None = None
    model: str | None = None
    mig_instance: str | None = None  # GPU_I_ID when the series is per MIG instance
    xid: int | None = None  # DCGM_FI_DEV_XID_ERRORS: the LAST XID seen, sticky until exporter restart
    # DCGM_EXP_XID_ERRORS_COUNT{xid=...}: per XID, in a window
    xid_counts: Mapping[int, float] = field(default_factory=dict, hash=False)
    ecc_dbe_volatile: float | None = None  # DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
    row_remap_failure: float | None = None  # DCGM_FI_DEV_ROW_REMAP_FAILURE
    row_remap_pending: float | None = None  # DCGM_FI_DEV_ROW_REMAP_PENDING
    uncorrectable_remapped_rows: float | None = None  # DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
    gpu_temp: float | None = None  # DCGM_FI_DEV_GPU_TEMP, Celsius
    memory_temp: float | None = None  # DCGM_FI_DEV_MEMORY_TEMP, Celsius
    pods: tuple[PodRef, ...] = ()
    extra: Mapping[str, float] = field(default_factory=dict, hash=False)  # any other field, by DCGM field name

    @property
    def key(self) -> str:
        """The stable identity of this GPU: its UUID when known, else node/index."""
        return self.uuid or f"{self.node}/gpu{self.gpu}"


@dataclass(frozen=True)
class NodeReadings:
    node: str
    source: str  # "exporter", "prometheus", "nvidia-smi"
    status: str = SOURCE_OK  # SOURCE_OK or SOURCE_UNKNOWN
    reason: str = ""  # why status is unknown, in words
    observed_at: float = 0.0  # unix seconds of the scrape / query
    gpus: tuple[GpuReading, ...] = ()
    malformed_lines: int = 0  # lines the lenient parser skipped
    meta: Mapping[str, str] = field(default_factory=dict, hash=False)  # e.g. driver version, exporter pod name
