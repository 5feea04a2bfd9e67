"""Slow GPUs and degraded links, judged against peers, once per detect pass (issue 29; docs/degradation.md).

One detector per controller. Each GPU keeps a few numbers (its last busy clock, timers, two link counters), never
a history: memory is bounded by the fleet, not by time. A busy GPU is an *outlier* when its SM clock is below
``slow_ratio`` of its peers' median and below it by more than ``mad_k`` robust deviations, against two sets of
peers at once: the fleet's (same model, node group, job, optional ``peer_label``) and its own node's GPUs of the
same job. A node, rack or job running slow together is therefore not an outlier; idle GPUs are never judged.
An outlier for ``hold_s`` is ``slow-gpu``; it clears after ``clear_hold_s`` without being one. A PCIe replay or
NVLink error counter that keeps rising (no gap over ``link_gap_s``) for ``link_hold_s`` by at least its minimum
is ``link-degraded``; it clears after ``link_clear_s`` without a new error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuremediate.signals.degradation_fields import (
    ACTIVITY_FIELDS,
    GPU_UTIL,
    IDLE_BIT,
    NVLINK_ERRORS,
    PCIE_REPLAYS,
    REASON_FIELDS,
    SLOWDOWN_BITS,
    SM_CLOCK,
    PeerStats,
    peer_stats,
)
from gpuremediate.signals.model import (
    SOURCE_OK,
    GpuReading,
    NodeReadings,
    PodRef,
    plausible_bits,
    plausible_clock,
    plausible_count,
    plausible_share,
    plausible_total,
)
from gpuremediate.signals.trends import CODE_PENDING, CODE_ROWS, CODE_SBE, Trends
from gpuremediate.vocab.degradation import TREND_MAINTENANCE, DegradationPolicy
from gpuremediate.vocab.findings import (
    ACTION_CORDON,
    ACTION_NONE,
    KIND_LINK_DEGRADED,
    KIND_SLOW_GPU,
    KIND_TREND,
    Finding,
)

STALE_S = 180.0  # a peer's clock older than this (or three scrape intervals) is not a peer's clock any more
READS_APART = 1.5  # an outlier seen again within this many read intervals was one the whole time
WAVE_S = 5.0  # passes closer than this are waves of one cycle (the exporter source's stragglers)
CODE_PCIE, CODE_NVLINK = "pcie", "nvlink"
JOB_CACHE = 100_000
ROLE_WORDS = frozenset({"worker", "master", "launcher", "chief", "ps", "evaluator", "leader", "driver"})
_SUFFIX = re.compile(r"\d+|(?=[a-z0-9]*\d)[a-z0-9]{5}|(?=[a-z0-9]*\d)[a-z0-9]{8,10}")


def job_of_pod(pod: PodRef) -> str:
    """The job a pod belongs to, from its name: Kubernetes' generated suffixes (indices, ReplicaSet and pod hashes)
    and a training operator's role word are dropped (``train-worker-3`` and ``train-master-0`` are one job)."""
    parts = pod.name.split("-")
    while len(parts) > 1 and _SUFFIX.fullmatch(parts[-1]):
        parts.pop()
    if len(parts) > 1 and parts[-1] in ROLE_WORDS:
        parts.pop()
    return f"{pod.namespace}/{'-'.join(parts)}"


@dataclass(frozen=True)
class NodeContext:
    """What the detector needs to know of a node beside its readings."""

    group: str  # its policy group ("" for the top-level policy)
    policy: DegradationPolicy
    domain: str = ""  # the value of the policy's peer_label on the node


class _Link:
    """One counter's episode: rising since when, from which total, last risen when, found when."""

    __slots__ = ("base", "found", "risen", "since", "total")

    def __init__(self, total: float, now: float) -> None:
        self.total = total
        self.base = total
        self.since: float | None = None
        self.risen = now  # quiet since it was first seen: a restart does not make an old link quiet for long
        self.found: float | None = None

    def step(self, total: float, now: float, minimum: int, hold_s: float, gap_s: float, clear_s: float) -> None:
        if total < self.total:  # a reset (driver reload): a new base, nothing learnt
            self.total = self.base = total
            self.since = None
            return
        if total > self.total:
            if self.since is None or now - self.risen > gap_s:
                self.since, self.base = now, self.total
            self.risen = now
        self.total = total
        if self.found is not None:
            if now - self.risen >= clear_s:
                self.found = self.since = None
            return
        if self.since is not None and now - self.risen > gap_s:
            self.since = None
        elif (self.since is not None and minimum and now - self.since >= hold_s
              and self.total - self.base >= minimum):
            self.found = now


class _Gpu:
    """One GPU's bounded state."""

    __slots__ = (
        "blank_since",
        "calm_since",
        "clock",
        "found",
        "last_outlier",
        "local",
        "median",
        "node",
        "nvlink",
        "outlier_since",
        "pcie",
        "peers",
        "ratio",
        "reasons",
        "seen",
        "trends",
    )

    def __init__(self, node: str) -> None:
        self.node = node
        self.peers: tuple[str, ...] = ()
        self.local: tuple[str, ...] = ()
        self.clock: float | None = None  # the last clock read while busy; None while idle or unread
        self.seen = 0.0
        self.outlier_since: float | None = None
        self.last_outlier: float | None = None
        self.calm_since: float | None = None
        self.found: float | None = None
        self.ratio = 1.0
        self.median = 0.0
        self.reasons = 0
        self.pcie: _Link | None = None
        self.nvlink: _Link | None = None
        self.trends: Trends | None = None
        self.blank_since: float | None = None  # read with no field at all since (Prometheus: nothing unusual)


def _busy(reading: GpuReading, policy: DegradationPolicy, reasons: int) -> bool:
    if reasons & IDLE_BIT:
        return False
    util = plausible_share(reading.extra.get(GPU_UTIL), 100.0)
    if util is not None and util >= policy.busy_util_pct:
        return True
    return any((share := plausible_share(reading.extra.get(name), 1.0)) is not None and share >= policy.busy_activity
               for name in ACTIVITY_FIELDS)


def _reasons(reading: GpuReading) -> int:
    for name in REASON_FIELDS:
        bits = plausible_bits(reading.extra.get(name))
        if bits is not None:
            return bits
    return 0


def _nvlink_total(extra: Mapping[str, float]) -> float | None:
    total: float | None = None
    for name in NVLINK_ERRORS:
        value = plausible_total(extra.get(name))
        if value is not None:
            total = value if total is None else total + value
    return total


class DegradationDetector:
    """Per-GPU state of the whole fleet (this replica's nodes), updated once per detect pass."""

    def __init__(self, job_of: Callable[[PodRef], str] = job_of_pod) -> None:
        self.job_of = job_of
        self._jobs: dict[PodRef, str] = {}  # job_of's answers, cleared when JOB_CACHE pods are held
        self.gpus: dict[str, _Gpu] = {}
        self.by_node: dict[str, dict[str, _Gpu]] = {}  # the same GPUs, per node: a node's findings without a scan
        self.contexts: dict[str, NodeContext] = {}
        self.now = 0.0  # the last pass
        self.interval = 0.0  # between the last two cycles

    # ---- one pass ----------------------------------------------------------------------------------

    def update(self, readings: Iterable[NodeReadings], context: Callable[[str], NodeContext | None],
               now: float, fleet_peers: Mapping[str, PeerStats] | None = None) -> None:
        """Take one pass's readings (a wave of them: nodes not in it keep their last clocks as peers) and judge
        the GPUs read in it. Unknown readings change nothing. ``fleet_peers``: the fleet's peers per GPU model,
        computed by Prometheus (signals/prom_degradation.py), instead of the GPUs this detector reads."""
        if now - self.now > WAVE_S:
            self.interval = now - self.now if self.now else 0.0
        self.now = now
        judged: list[tuple[_Gpu, DegradationPolicy]] = []
        for node in readings:
            ctx = context(node.node)
            if ctx is None or not (ctx.policy.enabled or ctx.policy.trends):
                self._drop(node.node)
                continue
            if node.status != SOURCE_OK:
                continue
            self.contexts[node.node] = ctx
            for reading in node.gpus:
                if reading.mig_instance is None:
                    gpu = self._observe(reading, ctx, now)
                    if ctx.policy.enabled:
                        judged.append((gpu, ctx.policy))
        if not judged:
            return
        peers, local = self._peer_stats(now)
        for gpu, policy in judged:
            if gpu.clock is None:  # idle or unread: never an outlier, its peers not needed
                fleet = None
            else:
                fleet = peers.get(gpu.peers) if fleet_peers is None else fleet_peers.get(gpu.peers[1])
            self._judge(gpu, policy, fleet, local.get(gpu.local), now)

    def _observe(self, reading: GpuReading, ctx: NodeContext, now: float) -> _Gpu:
        gpu = self.gpus.get(reading.key)
        if gpu is None or gpu.node != reading.node:
            if gpu is not None:
                self.by_node.get(gpu.node, {}).pop(reading.key, None)
            gpu = self.gpus[reading.key] = _Gpu(reading.node)
            self.by_node.setdefault(reading.node, {})[reading.key] = gpu
        if not reading.extra:  # no field read for it (the Prometheus source: nothing out of the ordinary)
            gpu.clock, gpu.seen = None, now  # idle and quiet: counters and trends as they were
            gpu.blank_since = now if gpu.blank_since is None else gpu.blank_since
            return gpu
        gpu.blank_since = None
        policy, reasons = ctx.policy, _reasons(reading)
        if policy.trends:
            gpu.trends = gpu.trends or Trends()
            gpu.trends.step(reading.extra, policy, now)
        if not policy.enabled:
            gpu.clock = None
            return gpu
        job = self._job(reading.pods)
        model = reading.model or ""
        gpu.peers = (ctx.group, model, ctx.domain, job)
        gpu.local = (reading.node, model, job)
        clock = plausible_clock(reading.extra.get(SM_CLOCK))
        gpu.clock = clock if clock is not None and _busy(reading, policy, reasons) else None
        gpu.seen, gpu.reasons = now, reasons
        gpu.pcie = self._link(gpu.pcie, plausible_count(reading.extra.get(PCIE_REPLAYS)), policy.pcie_replays_min,
                              policy, now)
        gpu.nvlink = self._link(gpu.nvlink, _nvlink_total(reading.extra), policy.nvlink_errors_min, policy, now)
        return gpu

    def _job(self, pods: tuple[PodRef, ...]) -> str:
        """The one job of the GPU's pods; "" without pods, or for pods of several jobs (no one set of peers)."""
        jobs = set()
        for pod in pods:
            job = self._jobs.get(pod)
            if job is None:
                if len(self._jobs) >= JOB_CACHE:
                    self._jobs.clear()
                job = self._jobs[pod] = self.job_of(pod)
            jobs.add(job)
        return jobs.pop() if len(jobs) == 1 else ""

    @staticmethod
    def _link(link: _Link | None, total: float | None, minimum: int, policy: DegradationPolicy,
              now: float) -> _Link | None:
        if total is None:
            return link  # missing is not a change
        if link is None:
            return _Link(total, now)
        link.step(total, now, minimum, policy.link_hold_s, policy.link_gap_s, policy.link_clear_s)
        return link

    def _peer_stats(self, now: float) -> tuple[dict[tuple[str, ...], PeerStats], dict[tuple[str, ...], list[float]]]:
        fleet: dict[tuple[str, ...], list[float]] = {}
        local: dict[tuple[str, ...], list[float]] = {}
        stale = max(STALE_S, 3 * self.interval)
        for gpu in self.gpus.values():
            if gpu.clock is not None and now - gpu.seen <= stale:
                fleet.setdefault(gpu.peers, []).append(gpu.clock)
                local.setdefault(gpu.local, []).append(gpu.clock)
        return {key: peer_stats(clocks) for key, clocks in fleet.items()}, local

    def _judge(self, gpu: _Gpu, policy: DegradationPolicy, peers: PeerStats | None, local: list[float] | None,
               now: float) -> None:
        outlier = self._outlier(gpu, policy, peers, local)
        if outlier:
            # a gap longer than the hold (idle, unread) starts the onset again; two reads in a row never are one,
            # however far apart (a hold as long as the read interval would otherwise never pass)
            gap = max(policy.hold_s, READS_APART * self.interval)
            if gpu.outlier_since is None or gpu.last_outlier is None or now - gpu.last_outlier > gap:
                gpu.outlier_since = now
            gpu.last_outlier, gpu.calm_since = now, None
            if gpu.found is None and now - gpu.outlier_since >= policy.hold_s:
                gpu.found = now
            return
        if gpu.clock is not None:  # busy and not an outlier: the onset starts again; idle keeps it
            gpu.outlier_since = None
        if gpu.calm_since is None:
            gpu.calm_since = now
        if gpu.found is not None and now - gpu.calm_since >= policy.clear_hold_s:
            gpu.found = None

    def _outlier(self, gpu: _Gpu, policy: DegradationPolicy, peers: PeerStats | None,
                 local: list[float] | None) -> bool:
        clock = gpu.clock
        if clock is None or peers is None or local is None:
            return False
        if peers.count - 1 < policy.min_peers or len(local) - 1 < policy.min_node_peers:
            return False
        if not self._below(clock, peers, policy) or not self._below(clock, peer_stats(local), policy):
            return False
        gpu.ratio, gpu.median = clock / peers.median, peers.median
        return True

    @staticmethod
    def _below(clock: float, stats: PeerStats, policy: DegradationPolicy) -> bool:
        return clock < policy.slow_ratio * stats.median and stats.median - clock > policy.mad_k * stats.spread

    # ---- what it found -----------------------------------------------------------------------------

    def findings(self, node: str) -> list[Finding]:
        """The node's degradation findings now (empty when it has none, or is not judged)."""
        ctx = self.contexts.get(node)
        if ctx is None:
            return []
        found: list[Finding] = []
        for key, gpu in self._of(node):
            if ctx.policy.trends and gpu.trends is not None:
                found += [_trend_finding(node, key, code, since, gpu.trends, ctx.policy)
                          for code, since in sorted(gpu.trends.found.items())]
            if not ctx.policy.enabled:
                continue
            if gpu.found is not None:
                found.append(_slow_finding(node, key, gpu, ctx.policy))
            for code, link, minimum in ((CODE_PCIE, gpu.pcie, ctx.policy.pcie_replays_min),
                                        (CODE_NVLINK, gpu.nvlink, ctx.policy.nvlink_errors_min)):
                if link is not None and link.found is not None:
                    found.append(_link_finding(node, key, code, link, minimum, ctx.policy))
        return found

    def cleared(self, node: str, kind: str, gpus: Iterable[str]) -> bool:
        """Whether a degradation fault of ``kind`` on these GPUs has cleared: each GPU seen calm (or quiet) for its
        clear hold, and none found now. A GPU this detector has not seen (a restart) has not cleared: its clear
        hold starts when it is seen."""
        ctx = self.contexts.get(node)
        if ctx is None:
            return False
        for key in gpus:
            gpu = self.gpus.get(key)
            if gpu is None or gpu.node != node or not self._gpu_cleared(gpu, kind, ctx.policy):
                return False
        return True

    def _gpu_cleared(self, gpu: _Gpu, kind: str, policy: DegradationPolicy) -> bool:
        if kind == KIND_TREND:
            if gpu.trends is None:  # never read: quiet (no counter changed, none pending) since first seen
                return (gpu.blank_since is not None
                        and self.now - gpu.blank_since >= max(policy.sbe_window_s, policy.rows_window_s))
            return not gpu.trends.found and gpu.trends.whole(policy, self.now)
        if kind == KIND_SLOW_GPU:
            return (gpu.found is None and gpu.calm_since is not None
                    and self.now - gpu.calm_since >= policy.clear_hold_s)
        links = [link for link in (gpu.pcie, gpu.nvlink) if link is not None]
        if not links:  # never read (a restart, then Prometheus found no change): quiet since it was first seen
            return gpu.blank_since is not None and self.now - gpu.blank_since >= policy.link_clear_s
        return all(link.found is None and self.now - link.risen >= policy.link_clear_s
                                   for link in links)

    def counts(self) -> Mapping[str, int]:
        """GPUs found now, by finding kind."""
        slow = sum(1 for gpu in self.gpus.values() if gpu.found is not None)
        link = sum(1 for gpu in self.gpus.values()
                   if any(lk is not None and lk.found is not None for lk in (gpu.pcie, gpu.nvlink)))
        trend = sum(1 for gpu in self.gpus.values() if gpu.trends is not None and gpu.trends.found)
        return {KIND_SLOW_GPU: slow, KIND_LINK_DEGRADED: link, KIND_TREND: trend}

    def _drop(self, node: str) -> None:
        if self.contexts.pop(node, None) is not None:
            self.forget(lambda name: name != node)

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop the GPUs of nodes ``keep`` refuses (gone, or another shard's)."""
        for key in [key for key, gpu in self.gpus.items() if not keep(gpu.node)]:
            del self.gpus[key]
        for name in [name for name in self.by_node if not keep(name)]:
            del self.by_node[name]
        for name in [name for name in self.contexts if not keep(name)]:
            del self.contexts[name]

    def _of(self, node: str) -> list[tuple[str, _Gpu]]:
        return sorted(self.by_node.get(node, {}).items())


def _slowdowns(bits: int) -> str:
    names = [name for bit, name in SLOWDOWN_BITS if bits & bit]
    return f"; clock event reasons: {', '.join(names)}" if names else ""


def _slow_finding(node: str, key: str, gpu: _Gpu, policy: DegradationPolicy) -> Finding:
    assert gpu.found is not None
    message = (f"GPU {key} ran at {gpu.ratio:.0%} of its peers' median SM clock ({gpu.median:.0f} MHz) under load "
               f"for {policy.hold_s:g} s{_slowdowns(gpu.reasons)}; {_what(policy.slow_action)}")
    return Finding(node, KIND_SLOW_GPU, "sm-clock", (key,), policy.slow_action,
                   f"{KIND_SLOW_GPU}:{key}:{gpu.found:.3f}", message)


def _link_finding(node: str, key: str, code: str, link: _Link, minimum: int, policy: DegradationPolicy) -> Finding:
    assert link.found is not None
    what = "PCIe replays" if code == CODE_PCIE else "NVLink errors"
    message = (f"GPU {key}: {what} rose by {link.total - link.base:.0f} (at least {minimum}) over "
               f"{policy.link_hold_s:g} s and more; {_what(policy.link_action)}")
    return Finding(node, KIND_LINK_DEGRADED, code, (key,), policy.link_action,
                   f"{KIND_LINK_DEGRADED}:{code}:{key}:{link.found:.3f}", message)


TREND_WORDS = {CODE_SBE: "single-bit ECC errors rose by {value:.0f} within {window:g} s (at least {minimum})",
               CODE_ROWS: "{value:.0f} new correctable remapped rows within {window:g} s (at least {minimum})",
               CODE_PENDING: "{value:.0f} page(s) pending retirement (retired at the next GPU reset)"}


TREND_THEN = {ACTION_CORDON: "cordoned (its pods stay): plan a drain and reset in a maintenance window",
              ACTION_NONE: "plan a drain and reset in a maintenance window (MaintenanceRequest)",
              TREND_MAINTENANCE: "a MaintenanceRequest drains and resets it in the next trend window"}


def _trend_finding(node: str, key: str, code: str, since: float, trends: Trends,
                   policy: DegradationPolicy) -> Finding:
    window = {CODE_SBE: trends.sbe, CODE_ROWS: trends.rows}.get(code)
    value = window.sum if window is not None else trends.pending
    span, minimum = ((policy.sbe_window_s, policy.sbe_min) if code == CODE_SBE
                     else (policy.rows_window_s, policy.rows_new_min))
    said = TREND_WORDS[code].format(value=value, window=span, minimum=minimum)
    then = TREND_THEN.get(policy.trend_action, TREND_THEN[ACTION_NONE])
    action = ACTION_CORDON if policy.trend_action == ACTION_CORDON else ACTION_NONE  # a maintenance is filed aside
    return Finding(node, KIND_TREND, code, (key,), action, f"{KIND_TREND}:{code}:{key}:{since:.3f}",
                   f"GPU {key}: {said}, a trend that precedes failures; {then}", urgent=False)


def _what(action: str) -> str:
    return {"cordon": "cordoned (its pods stay) until it recovers", "drain": "drained, then validated"}.get(
        action, "reported only")
