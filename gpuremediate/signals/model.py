"""What every metric source produces: per-GPU readings grouped by node.

A reading field is ``None`` when the source did not report it (series absent, placeholder value,
``[N/A]``): missing is never the same as zero, and never unhealthy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from gpuremediate.signals.fabric_model import GpuFabric

K = TypeVar("K")
V = TypeVar("V")

# DCGM's blank values (dcgm_structs.h, "DCGM_BLANK_VALUES"): a field DCGM could not read holds one of
# them. DCGM_INT32_BLANK 0x7ffffff0, DCGM_INT64_BLANK 0x7ffffffffffffff0, DCGM_FP64_BLANK 2**47
# (140737488355328.0); NOT_FOUND, NOT_SUPPORTED and NOT_PERMISSIONED are BLANK + 1, + 2, + 3, and
# DCGM_*_IS_BLANK(v) is ``v >= BLANK`` (for int32: the 16 values up to INT32_MAX).
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT32_MAX = 0x7FFFFFFF
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
# Old exporters' "not supported" integers (>= 9.22e18, the int64 blanks): missing, never a reading.
PLACEHOLDER_MIN = 9.22e18

# What a GPU can physically report. Outside it a value is a blank or garbage: missing, never a fault.
MAX_TEMP_C = 200.0  # GPUs shut down near 100 C; a sensor that reads 0 C is absent (no memory sensor)
MAX_XID = 65535  # the catalog runs to 172, room for new ones; 4294967295 (uint32 -1) or a blank is no XID
MAX_COUNT = DCGM_INT32_BLANK - 1  # error counters are 32-bit: the int32 blanks start just above
MAX_CLOCK_MHZ = 10000.0  # no GPU clocks its SMs near 10 GHz; 0 is a clock not read
MAX_TOTAL = 2.0**53  # 64-bit totals (NVLink error counters) as exact floats; beyond is garbage


def is_dcgm_blank(value: float) -> bool:
    """One of DCGM's blank values of any width (or NaN / infinity): no reading."""
    if not math.isfinite(value):
        return True
    return value >= DCGM_FP64_BLANK or DCGM_INT32_BLANK <= value <= DCGM_INT32_MAX


def plausible_temp(value: float | None) -> float | None:
    """A temperature in Celsius, or None when missing, a blank, 0 (no sensor) or beyond any GPU's range."""
    if value is None or not math.isfinite(value) or not 0 < value <= MAX_TEMP_C:
        return None
    return float(value)


def plausible_count(value: float | None) -> float | None:
    """An error counter from 0 to MAX_COUNT, else None (missing, blank, garbage)."""
    if value is None or not math.isfinite(value) or not 0 <= value <= MAX_COUNT:
        return None
    return float(value)


def plausible_flag(value: float | None) -> float | None:
    """A yes/no field (row remap pending / failure): 0 or 1, else None."""
    if value is None or value not in (0, 1):
        return None
    return float(value)


def plausible_clock(value: float | None) -> float | None:
    """A clock in MHz above 0 and up to MAX_CLOCK_MHZ, else None."""
    if value is None or not math.isfinite(value) or not 0 < value <= MAX_CLOCK_MHZ:
        return None
    return float(value)


def plausible_share(value: float | None, top: float) -> float | None:
    """A utilisation from 0 to ``top`` (100 for a percentage, 1 for a DCGM_FI_PROF_* ratio), else None."""
    if value is None or not math.isfinite(value) or not 0 <= value <= top:
        return None
    return float(value)


def plausible_bits(value: float | None) -> int | None:
    """A bitmask (the clock event reasons): a whole number from 0 below 2**32, else None."""
    if value is None or not math.isfinite(value) or not 0 <= value < 2**32 or value != int(value):
        return None
    return int(value)


def plausible_total(value: float | None) -> float | None:
    """A 64-bit counter's total from 0 to MAX_TOTAL, else None."""
    if value is None or not math.isfinite(value) or not 0 <= value <= MAX_TOTAL:
        return None
    return float(value)


def plausible_xid(value: float | int | None) -> int | None:
    """An XID code: a whole number from 1 to MAX_XID, else None (0 means no XID; larger are blanks)."""
    if value is None or not math.isfinite(value) or not 1 <= value <= MAX_XID or value != int(value):
        return None
    return int(value)


def ascii_int(text: str | None) -> int | None:
    """A label holding a non-negative decimal number (ASCII digits only: ``str.isdigit`` takes '²')."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    return int(text)

# One shared read-only empty mapping: most GPUs have no XID counts, messages or extra fields, and a fleet's
# 40,000 readings would otherwise hold 120,000 empty dicts.
EMPTY: Mapping[Any, Any] = MappingProxyType({})


def empty_mapping() -> Mapping[Any, Any]:
    """The default of the readings' mappings: the one shared EMPTY (a dataclass refuses it as a plain default)."""
    return EMPTY


def frozen_mapping(values: Mapping[K, V]) -> Mapping[K, V]:
    """A read-only copy, sorted by key; the shared EMPTY when there is nothing."""
    return MappingProxyType(dict(sorted(values.items()))) if values else EMPTY


SOURCE_OK = "ok"
SOURCE_UNKNOWN = "unknown"  # exporter unreachable, stale, unparseable: reported, never remediated


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod the exporter attributes to a GPU (dcgm-exporter's pod/namespace/container labels)."""

    namespace: str
    name: str


@dataclass(frozen=True, slots=True)  # slots: a fleet holds 40,000 of them
class GpuReading:
    node: str
    gpu: str  # the exporter's ``gpu`` label: the device index, as text
    uuid: str | None = None
    pci_bus_id: str | None = None
    model: str | None = None
    mig_instance: str | None = None  # GPU_I_ID when the series is per MIG instance
    xid: int | None = None  # DCGM_FI_DEV_XID_ERRORS: the LAST XID seen, sticky until exporter restart
    # DCGM_EXP_XID_ERRORS_COUNT{xid=...}: per XID, in a window
    xid_counts: Mapping[int, float] = field(default_factory=empty_mapping, hash=False)
    # the driver's text per XID (kernel log line, exporter err_msg): decodes NVLink5 XIDs 144-150 and 154
    xid_messages: Mapping[int, tuple[str, ...]] = field(default_factory=empty_mapping, hash=False)
    ecc_dbe_volatile: float | None = None  # DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
    row_remap_failure: float | None = None  # DCGM_FI_DEV_ROW_REMAP_FAILURE
    row_remap_pending: float | None = None  # DCGM_FI_DEV_ROW_REMAP_PENDING
    uncorrectable_remapped_rows: float | None = None  # DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
    gpu_temp: float | None = None  # DCGM_FI_DEV_GPU_TEMP, Celsius
    memory_temp: float | None = None  # DCGM_FI_DEV_MEMORY_TEMP, Celsius
    pods: tuple[PodRef, ...] = ()
    mig_devices: tuple[str, ...] = ()  # MIG device profiles (e.g. "1g.10gb") when MIG is on and listed
    extra: Mapping[str, float] = field(default_factory=empty_mapping, hash=False)  # any other field, by DCGM field name
    fabric: GpuFabric | None = None  # NVLink fabric state, domain and IMEX (signals.fabric); None: not reported

    def __post_init__(self) -> None:
        for name in ("xid_counts", "xid_messages", "extra"):  # an empty one from a builder: the shared EMPTY
            value = getattr(self, name)
            if not value and value is not EMPTY:
                object.__setattr__(self, name, EMPTY)

    @property
    def key(self) -> str:
        """The stable identity of this GPU: its UUID when known, else node/index."""
        return self.uuid or f"{self.node}/gpu{self.gpu}"


@dataclass(frozen=True, slots=True)
class LostGpu:
    """A GPU the driver reports lost ("GPU is lost", nvidia-smi exit 15): it needs a repair."""

    pci_bus_id: str  # normalised; "" when the driver did not name it
    reason: str  # the driver's words


@dataclass(frozen=True, slots=True)
class NodeReadings:
    node: str
    source: str  # "exporter", "prometheus", "nvidia-smi"
    status: str = SOURCE_OK  # SOURCE_OK or SOURCE_UNKNOWN
    reason: str = ""  # why status is unknown, in words
    observed_at: float = 0.0  # unix seconds of the scrape / query
    gpus: tuple[GpuReading, ...] = ()
    malformed_lines: int = 0  # lines the lenient parser skipped, and series whose labels could not be read
    problems: tuple[str, ...] = ()  # what was skipped beyond the parser's lines, in words
    lost_gpus: tuple[LostGpu, ...] = ()  # GPUs the driver cannot reach: no readings, a repair
    meta: Mapping[str, str] = field(default_factory=empty_mapping, hash=False)  # e.g. driver version, exporter pod name
