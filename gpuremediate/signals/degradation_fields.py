"""The GPU fields the degradation judge reads (its peers' clocks, throttle reasons, link counters) and the
peer statistics both readers of them compute: the fleet's from a Prometheus aggregation
(``signals.prom_degradation``), each node's from its readings (``policy.degradation``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
ACTIVITY_FIELDS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE")
# DCGM >= 3.2 names field 112 CLOCKS_EVENT_REASONS; older exporters CLOCK_THROTTLE_REASONS (dcgm_fields.h).
REASON_FIELDS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
PCIE_REPLAYS = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
NVLINK_ERRORS = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")
IDLE_BIT = 0x1  # DCGM_CLOCKS_EVENT_REASON_GPU_IDLE
# DCGM_CLOCKS_EVENT_REASON_*: the ones that slow a busy GPU, named in the finding's message
SLOWDOWN_BITS = ((0x4, "SW power cap"), (0x8, "HW slowdown"), (0x20, "SW thermal"), (0x40, "HW thermal"),
                 (0x80, "HW power brake"))
MAD_SCALE = 1.4826  # MAD → standard deviation of a normal sample


@dataclass(frozen=True)
class PeerStats:
    """A set of peers' busy SM clocks: their median, robust spread and count."""

    median: float
    spread: float  # MAD_SCALE x MAD
    count: int


def peer_stats(clocks: list[float]) -> PeerStats:
    median = statistics.median(clocks)
    return PeerStats(median, MAD_SCALE * statistics.median([abs(c - median) for c in clocks]), len(clocks))
