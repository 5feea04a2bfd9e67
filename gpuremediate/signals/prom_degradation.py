"""Degradation findings through the Prometheus source (issue 29): Prometheus does the fleet's part.

The fields the degradation detector reads are dense (every GPU, every scrape: SM clock, load, clock event
reasons, link and ECC counters); shipping them at every read would add several times today's answer at 5,000
nodes. Instead one query per full read asks Prometheus for what is not ordinary, and the detector judges that:

- **slow suspects**: nodes with a busy GPU whose SM clock is below the loosest ``slow_ratio`` of the fastest busy
  GPU of the same model on its node. The detector's own node-local test (below ``slow_ratio`` of the median of
  the node's GPUs of its job) cannot pass otherwise: that median is never above the node's maximum. For those
  nodes alone a second query brings every GPU's clock, load and event reasons;
- **the fleet's peers**: per GPU model, the median of the busy GPUs' SM clocks, their median absolute deviation
  and their count (PromQL's ``quantile(0.5)`` interpolates as ``statistics.median`` does);
- **link and trend counters**: only the GPUs whose counter changed within a window longer than the detector's
  clear hold or trend window (``max(X) != max(X offset W)``, two samples a series and no range read; a series
  younger than W, where it changed within the last ten minutes), and pages pending retirement where there are
  some, or were recently.

A GPU that is not shipped looks idle and quiet to the detector: not an outlier, no new error, which is what the
queries say of it. What differs from the exporter source (docs/degradation.md): the fleet's peers are per model
across everything Prometheus holds (node groups, jobs and ``peer_label`` are the controller's knowledge, not
Prometheus'); the node-local test, the holds and the trends are the same code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpuremediate.policy.degradation import DegradationPolicy
from gpuremediate.signals.degradation import (
    ACTIVITY_FIELDS,
    GPU_UTIL,
    MAD_SCALE,
    NVLINK_ERRORS,
    PCIE_REPLAYS,
    REASON_FIELDS,
    SM_CLOCK,
    PeerStats,
)
from gpuremediate.signals.exposition import Sample
from gpuremediate.signals.trends import BUCKETS, REMAPPED_ROWS, RETIRED_PENDING, SBE_TOTAL

KEY = ("gpu", "GPU_I_ID", "UUID")
MODEL = "modelName"
NAME_LABEL = "gpuremediate_metric"  # as the readings query names its series (sources.NAME_LABEL)
SUSPECTS = "gpuremediate:slow_suspect_gpus:count"
PEER_MEDIAN = "gpuremediate:peer_sm_clock:median"
PEER_MAD = "gpuremediate:peer_sm_clock:mad"
PEER_COUNT = "gpuremediate:peer_sm_clock:count"
PEER_SERIES = (PEER_MEDIAN, PEER_MAD, PEER_COUNT)
SUSPECT_FIELDS = (SM_CLOCK, GPU_UTIL, *ACTIVITY_FIELDS, *REASON_FIELDS)
SHIP_MARGIN_S = 600.0  # a counter is shipped this long past the detector's own window: it sees the window close
YOUNG_S = 600.0  # a series younger than its window is compared with its value this long ago
PENDING_RECENT_S = 600.0  # pages pending retirement shipped this long after they are gone (the finding clears)
MAX_SUSPECT_NODES = 1000  # one query's node matcher; more are read at the next read (logged)


@dataclass(frozen=True)
class DegradationPlan:
    """What the Prometheus source asks for, from every policy group's ``[degradation]`` (the loosest of each)."""

    slow: bool
    slow_ratio: float
    busy_util_pct: float
    busy_activity: float
    link_window_s: float  # 0: no link counters
    sbe_window_s: float  # 0: no single-bit ECC trend
    rows_window_s: float  # 0: no remapped-rows trend
    pending: bool


def plan_for(policies: Iterable[DegradationPolicy]) -> DegradationPlan | None:
    """The plan for these policies; None when none of them finds anything (the default: no query at all)."""
    slow = [p for p in policies if p.enabled]
    trends = [p for p in policies if p.trends]
    if not slow and not trends:
        return None
    links = [p for p in slow if p.pcie_replays_min or p.nvlink_errors_min]
    return DegradationPlan(
        slow=bool(slow),
        slow_ratio=max((p.slow_ratio for p in slow), default=0.0),
        busy_util_pct=min((p.busy_util_pct for p in slow), default=100.0),
        busy_activity=min((p.busy_activity for p in slow), default=1.0),
        link_window_s=max((max(p.link_clear_s, p.link_gap_s) for p in links), default=0.0),
        sbe_window_s=max((_trend_window(p.sbe_window_s) for p in trends if p.sbe_min), default=0.0),
        rows_window_s=max((_trend_window(p.rows_window_s) for p in trends if p.rows_new_min), default=0.0),
        pending=bool(trends),
    )


def _trend_window(window_s: float) -> float:
    return window_s * (1 + 1 / BUCKETS)  # the detector's ring empties a slice after the window


@runtime_checkable
class ServesPeers(Protocol):
    """A source that asks Prometheus for the degradation detector's part (PrometheusSource)."""

    degradation_plan: DegradationPlan | None
    fleet_peers: Mapping[str, PeerStats] | None


# ---- the queries --------------------------------------------------------------------------------------


def _named(expr: str, name: str) -> str:
    return f'label_replace({expr}, "{NAME_LABEL}", "{name}", "", "")'


def _by(labels: Sequence[str]) -> str:
    return ", ".join(labels)


def _gpu_max(metric: str, node_labels: Sequence[str], offset_s: float = 0.0, extra: Sequence[str] = ()) -> str:
    offset = f" offset {int(offset_s)}s" if offset_s else ""
    return f"max by ({_by((*node_labels, *KEY, *extra))}) ({metric}{offset})"


def busy_clocks(plan: DegradationPlan, node_labels: Sequence[str]) -> str:
    """Each busy GPU's SM clock, labelled by node, GPU and model."""
    gpu = (*node_labels, *KEY)
    loaded = [f"{_gpu_max(GPU_UTIL, node_labels)} >= {plan.busy_util_pct:g}",
              *(f"{_gpu_max(name, node_labels)} >= {plan.busy_activity:g}" for name in ACTIVITY_FIELDS)]
    busy = " or ".join(f"({part})" for part in loaded)
    return f"({_gpu_max(SM_CLOCK, node_labels, extra=(MODEL,))} and on ({_by(gpu)}) ({busy}))"


def suspects_expr(plan: DegradationPlan, node_labels: Sequence[str]) -> str:
    """Per node, its busy GPUs below ``slow_ratio`` of its fastest busy GPU of the same model."""
    busy = busy_clocks(plan, node_labels)
    node_model = _by((*node_labels, MODEL))
    slow = f"{busy} < on ({node_model}) group_left () ({plan.slow_ratio:g} * max by ({node_model}) ({busy}))"
    return _named(f"count by ({_by(node_labels)}) ({slow})", SUSPECTS)


def peers_exprs(plan: DegradationPlan, node_labels: Sequence[str]) -> list[str]:
    """The fleet's busy SM clocks per model: median, median absolute deviation, count."""
    busy = busy_clocks(plan, node_labels)
    median = f"quantile by ({MODEL}) (0.5, {busy})"
    mad = f"quantile by ({MODEL}) (0.5, abs({busy} - on ({MODEL}) group_left () {median}))"
    return [_named(median, PEER_MEDIAN), _named(mad, PEER_MAD), _named(f"count by ({MODEL}) ({busy})", PEER_COUNT)]


def _changed(metric: str, node_labels: Sequence[str], window_s: float) -> str:
    """The GPUs whose ``metric`` changed within ``window_s``; a series younger than that (a new node, a
    Prometheus keeping less) where it changed within YOUNG_S: never every young series of a fleet at once."""
    now, then = _gpu_max(metric, node_labels), _gpu_max(metric, node_labels, window_s)
    recent = _gpu_max(metric, node_labels, YOUNG_S)
    return f"(({now} != {then}) or (({now} unless {then}) != {recent}))"


def counter_exprs(plan: DegradationPlan, node_labels: Sequence[str]) -> list[str]:
    """The link and trend counters of the GPUs whose counter changed within its window; every NVLink counter of
    a GPU where one changed (the detector sums them)."""
    gpu = _by((*node_labels, *KEY))
    exprs = []
    if plan.link_window_s:
        window = plan.link_window_s + SHIP_MARGIN_S
        exprs.append(_named(_changed(PCIE_REPLAYS, node_labels, window), PCIE_REPLAYS))
        any_nvlink = " or ".join(_changed(name, node_labels, window) for name in NVLINK_ERRORS)
        exprs += [_named(f"{_gpu_max(name, node_labels)} and on ({gpu}) ({any_nvlink})", name)
                  for name in NVLINK_ERRORS]
    for metric, window_s in ((SBE_TOTAL, plan.sbe_window_s), (REMAPPED_ROWS, plan.rows_window_s)):
        if window_s:
            exprs.append(_named(_changed(metric, node_labels, window_s + SHIP_MARGIN_S), metric))
    if plan.pending:
        now, then = _gpu_max(RETIRED_PENDING, node_labels), _gpu_max(RETIRED_PENDING, node_labels, PENDING_RECENT_S)
        exprs.append(_named(f"({now} != 0) or ({now} and on ({gpu}) ({then} != 0))", RETIRED_PENDING))
    return exprs


def degradation_query(plan: DegradationPlan, node_labels: Sequence[str]) -> str:
    """One instant query: the slow suspects per node, the fleet's peers per model, the changed counters."""
    parts = [suspects_expr(plan, node_labels), *peers_exprs(plan, node_labels)] if plan.slow else []
    return " or ".join((*parts, *counter_exprs(plan, node_labels)))


def suspect_fields_query(node_labels: Sequence[str], matcher: str) -> str:
    """Every GPU's clock, load and event reasons on the nodes ``matcher`` selects (``{Hostname=~"a|b"}``)."""
    return " or ".join(_named(f"max by ({_by((*node_labels, *KEY))}) ({name}{matcher})", name)
                       for name in SUSPECT_FIELDS)


# ---- the answers --------------------------------------------------------------------------------------


def fleet_peers(samples: Iterable[Sample]) -> dict[str, PeerStats]:
    """The peers' statistics per model from the degradation query's answer."""
    by_model: dict[str, dict[str, float]] = {}
    for sample in samples:
        if sample.name in PEER_SERIES:
            by_model.setdefault(sample.label(MODEL) or "", {})[sample.name] = sample.value
    return {model: PeerStats(got[PEER_MEDIAN], MAD_SCALE * got[PEER_MAD], int(got[PEER_COUNT]))
            for model, got in by_model.items() if all(name in got for name in PEER_SERIES)}


def is_gpu_sample(sample: Sample) -> bool:
    """A counter of one GPU (merged into its node's readings), not a per-node or per-model series."""
    return sample.name not in PEER_SERIES and sample.name != SUSPECTS


def suspect_nodes(samples: Iterable[Sample], node_labels: Sequence[str]) -> dict[str, str]:
    """node -> the node label that names it, of every node with a slow suspect."""
    found: dict[str, str] = {}
    for sample in samples:
        if sample.name == SUSPECTS:
            named = next(((label, value) for label in node_labels if (value := sample.label(label))), None)
            if named:
                found[named[1]] = named[0]
    return found
