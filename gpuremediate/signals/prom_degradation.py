"""Degradation findings through the Prometheus source (issue 29): Prometheus does the fleet's part.

The fields the degradation detector reads are dense (every GPU, every scrape: SM clock, load, clock event
reasons, link and ECC counters); shipping them at every read would add several times today's answer at 5,000
nodes. Instead Prometheus is asked which nodes hold anything not ordinary, and only those nodes' fields come back:

- **the nodes query** (each full read, beside the readings query): the *slow suspects*, nodes with a busy GPU whose
  SM clock is below the loosest ``slow_ratio`` of the fastest busy GPU of the same model on its node (the
  detector's own node-local test, below ``slow_ratio`` of the median of the node's GPUs of its job, cannot pass
  otherwise: that median is never above the node's maximum); nodes with a link counter that changed within the
  link window (each series against itself ``W`` ago: two samples a series, no range read); and every FULL_EVERY
  reads, nodes whose trend counters changed within their window, with pages pending retirement (now or ten
  minutes ago), and series younger than their window (a new node, a restarted exporter pod) that changed within
  the last ten minutes;
- **the fields query**, for those nodes alone: every field of the plan for every GPU (a suspect's node-local
  peers are its node's GPUs);
- **the peers query**, only while there are suspects, at most every PEERS_TTL_S: per GPU model, the median of the
  busy GPUs' SM clocks, their median absolute deviation and their count (PromQL's ``quantile(0.5)`` interpolates
  as ``statistics.median`` does).

A GPU that is not shipped looks idle and quiet to the detector: not an outlier, no new error, which is what the
queries say of it. What differs from the exporter source (docs/degradation.md): the fleet's peers are per model
across everything Prometheus holds (node groups, jobs and ``peer_label`` are the controller's knowledge, not
Prometheus'); the node-local test, the holds and the trends are the same code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpuremediate.signals.degradation_fields import (
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
from gpuremediate.vocab.degradation import DegradationPolicy

KEY = ("gpu", "GPU_I_ID", "UUID")
MODEL = "modelName"
NAME_LABEL = "gpuremediate_metric"  # as the readings query names its series (sources.NAME_LABEL)
SUSPECTS = "gpuremediate:slow_suspect_gpus:count"
CHANGED = "gpuremediate:changed_gpu_counters:count"
PEER_MEDIAN = "gpuremediate:peer_sm_clock:median"
PEER_MAD = "gpuremediate:peer_sm_clock:mad"
PEER_COUNT = "gpuremediate:peer_sm_clock:count"
PEER_SERIES = (PEER_MEDIAN, PEER_MAD, PEER_COUNT)
SUSPECT_FIELDS = (SM_CLOCK, GPU_UTIL, *ACTIVITY_FIELDS, *REASON_FIELDS)
FULL_EVERY = 5  # reads between two looks at the trend counters (windows of an hour to a day) and young series
PEERS_TTL_S = 300.0  # the fleet's peers are asked again after this long (medians of thousands move slowly)
SHIP_MARGIN_S = 600.0  # a counter is shipped this long past the detector's own window: it sees the window close
YOUNG_S = 600.0  # a series younger than its window is compared with its value this long ago
PENDING_RECENT_S = 600.0  # pages pending retirement shipped this long after they are gone (the finding clears)
MAX_FIELD_NODES = 1000  # nodes whose fields one read brings; more wait for a later read (logged)


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


def busy_clocks(plan: DegradationPlan, node_labels: Sequence[str]) -> str:
    """Each busy GPU's SM clock series (raw: no aggregation of the fleet's series)."""
    gpu = (*node_labels, *KEY)
    loaded = [f"{GPU_UTIL} >= {plan.busy_util_pct:g}",
              *(f"{name} >= {plan.busy_activity:g}" for name in ACTIVITY_FIELDS)]
    return f"({SM_CLOCK} and on ({_by(gpu)}) ({' or '.join(loaded)}))"


def suspects_expr(plan: DegradationPlan, node_labels: Sequence[str]) -> str:
    """Per node, its busy GPUs below ``slow_ratio`` of its fastest busy GPU of the same model."""
    busy = busy_clocks(plan, node_labels)
    node_model = _by((*node_labels, MODEL))
    slow = f"{busy} < on ({node_model}) group_left () ({plan.slow_ratio:g} * max by ({node_model}) ({busy}))"
    return _named(f"count by ({_by(node_labels)}) ({slow})", SUSPECTS)


def peers_query(plan: DegradationPlan, node_labels: Sequence[str]) -> str:
    """The fleet's busy SM clocks per model: median, median absolute deviation, count."""
    busy = busy_clocks(plan, node_labels)
    median = f"quantile by ({MODEL}) (0.5, {busy})"
    mad = f"quantile by ({MODEL}) (0.5, abs({busy} - on ({MODEL}) group_left () {median}))"
    return " or ".join((_named(median, PEER_MEDIAN), _named(mad, PEER_MAD),
                        _named(f"count by ({MODEL}) ({busy})", PEER_COUNT)))


def _changed_nodes(metric: str, node_labels: Sequence[str], window_s: float, young: bool) -> list[str]:
    """Nodes with a ``metric`` series that changed within ``window_s`` (each series against itself: two samples a
    series, no range read); with ``young``, also those with a series younger than that (a new node, an exporter
    pod restarted, a Prometheus keeping less) that changed within YOUNG_S."""
    by = _by(node_labels)
    exprs = [f"count by ({by}) ({metric} != {metric} offset {int(window_s)}s)"]
    if young:
        exprs.append(f"count by ({by}) (({metric} unless {metric} offset {int(window_s)}s) != "
                     f"{metric} offset {int(YOUNG_S)}s)")
    return [_named(expr, CHANGED) for expr in exprs]


def link_metrics(plan: DegradationPlan) -> tuple[str, ...]:
    return (PCIE_REPLAYS, *NVLINK_ERRORS) if plan.link_window_s else ()


def trend_metrics(plan: DegradationPlan) -> tuple[tuple[str, float], ...]:
    return tuple((m, w) for m, w in ((SBE_TOTAL, plan.sbe_window_s), (REMAPPED_ROWS, plan.rows_window_s)) if w)


def nodes_query(plan: DegradationPlan, node_labels: Sequence[str], full: bool) -> str:
    """The nodes whose GPUs the detector must see this read: slow suspects and nodes whose link counters changed
    within the link window, every read; with ``full`` (every FULL_EVERY reads) also those whose trend counters
    changed within their window, with pages pending retirement, and the young series' changes."""
    parts = [suspects_expr(plan, node_labels)] if plan.slow else []
    for metric in link_metrics(plan):
        parts += _changed_nodes(metric, node_labels, plan.link_window_s + SHIP_MARGIN_S, full)
    if full:
        for metric, window_s in trend_metrics(plan):
            parts += _changed_nodes(metric, node_labels, window_s + SHIP_MARGIN_S, True)
        if plan.pending:
            by = _by(node_labels)
            parts += [_named(f"count by ({by}) ({RETIRED_PENDING} != 0)", CHANGED),
                      _named(f"count by ({by}) ({RETIRED_PENDING} offset {int(PENDING_RECENT_S)}s != 0)", CHANGED)]
    return " or ".join(parts)


def fields_query(plan: DegradationPlan, node_labels: Sequence[str], matcher: str) -> str:
    """Every field of the plan for every GPU of the nodes ``matcher`` selects (``{Hostname=~"a|b"}``)."""
    names = [*(SUSPECT_FIELDS if plan.slow else ()), *link_metrics(plan), *(m for m, _ in trend_metrics(plan)),
             *((RETIRED_PENDING,) if plan.pending else ())]
    return " or ".join(_named(f"max by ({_by((*node_labels, *KEY))}) ({name}{matcher})", name) for name in names)


# ---- the answers --------------------------------------------------------------------------------------


def fleet_peers(samples: Iterable[Sample]) -> dict[str, PeerStats]:
    """The peers' statistics per model from the degradation query's answer."""
    by_model: dict[str, dict[str, float]] = {}
    for sample in samples:
        if sample.name in PEER_SERIES:
            by_model.setdefault(sample.label(MODEL) or "", {})[sample.name] = sample.value
    return {model: PeerStats(got[PEER_MEDIAN], MAD_SCALE * got[PEER_MAD], int(got[PEER_COUNT]))
            for model, got in by_model.items() if all(name in got for name in PEER_SERIES)}


def marked_nodes(samples: Iterable[Sample], node_labels: Sequence[str]) -> tuple[dict[str, str], bool]:
    """(node -> the node label that names it, of every node the nodes query marked; whether any is a slow
    suspect: the fleet's peers are needed only then)."""
    found: dict[str, str] = {}
    suspects = False
    for sample in samples:
        named = next(((label, value) for label in node_labels if (value := sample.label(label))), None)
        if named and sample.name in (SUSPECTS, CHANGED):
            found[named[1]] = named[0]
            suspects = suspects or sample.name == SUSPECTS
    return found, suspects
