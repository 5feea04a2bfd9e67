"""The detect loop: every scrape interval, readings → findings → transitions for healthy and
cordoned nodes. It owns those two states; the other loops own the rest.

Two sources per node: the metrics (exporter or Prometheus) and the node's NodeConditions (the agent's and
other tools', through the policy's ``[conditions]`` table); ``policy.conditions.merge_node`` puts their
findings in one list, worst first.

Unknown is not unhealthy: a node whose exporter is down, stale or missing is reported (metric,
Event on change, log) and left alone — unless a condition gives an actionable finding (the agent says the
driver hangs): then it is acted on. Either way the metrics' handled fingerprints are not pruned while the
metrics are unknown, so a stale XID does not come back as "new" when the exporter does.

Every path a fault arrives by (a full read's waves, the Prometheus fast path's polls, the node conditions read
with them, replay's ``check_nodes``) goes through ``_check_batch``: the breaker counts the batch's new faults and
judges how fast they arrive (``CircuitBreaker.judge``) before any of them is acted on. Faster than the policy's
rate, new faults wait for a storm look (``[breaker] look_s``): the storm passes the threshold meanwhile and the
breaker opens with none of them cordoned, or the look ends and they go on at once (``_settle_look``). A new path
(failed preflights, issue 46) hands its faulted nodes to ``check_nodes`` and gets the same judgement.

A NodeCondition that turns to a fault (the agent's ``GPUHealthy=False`` the moment it read an Xid, issue 48) is not
left for the next cycle: the Node watch hands the node to ``condition_arrived`` and the loop's thread checks it
(``check_nodes``) ``CONDITION_WINDOW_S`` after the first such arrival, with every node that arrived meanwhile, as one
batch. In the loop's thread because every decision is made there (cycles, polls, looks: one node is never decided
twice at once); as one batch because a storm's conditions come over a few hundred milliseconds, one agent write each,
and the breaker must count them together before the first is cordoned, as it does a read's. A cycle does not hold
them back: its read, its waves and its assessing (seconds at 5,000 nodes) stop for arrivals that are due
(``_arrivals_if_due``); a node so checked is not decided again by the cycle from its older assessment.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuremediate.actions import preflight_notice
from gpuremediate.actions.breaker import SOURCE_NEVER_READ, SOURCE_SLOW, SourceProblem
from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.held import held_by_us
from gpuremediate.actions.jobs import delete_job
from gpuremediate.actions.nodes import (
    Node,
    is_excluded,
    labels_of,
    name_of,
    node_unschedulable_of,
    unschedulable_before_us,
)
from gpuremediate.kube import errors
from gpuremediate.kube.config import parse_rfc3339
from gpuremediate.kube.resources import EVENTS
from gpuremediate.kube.shards import acting_for
from gpuremediate.loops.base import LoopContext, state_of
from gpuremediate.loops.trend_maintenance import TrendMaintenance
from gpuremediate.loops.validate import VALIDATE
from gpuremediate.obs import notify
from gpuremediate.obs.event_queue import EventQueue, own_pod, pod_event_body
from gpuremediate.policy import safety
from gpuremediate.policy.conditions import KIND_CONDITION, condition_view, conditions_of, merge_node
from gpuremediate.policy.config import Policy
from gpuremediate.policy.degradation import DegradationDetector, NodeContext
from gpuremediate.policy.evaluate import PolicyMemory, PolicyMemoryError, evaluate
from gpuremediate.policy.fabric import (
    CLEARING_KINDS,
    KIND_DOMAIN,
    breaker_domain_labels,
    cleared_words,
    domain_finding,
    domain_trips,
    domains_out,
)
from gpuremediate.policy.isolation import node_level_reason
from gpuremediate.policy.network import NetworkJudges, condition_kind, condition_rules
from gpuremediate.policy.preflight import PreflightJudge, PreflightPolicy
from gpuremediate.policy.workload import WorkloadJudge, WorkloadPolicy
from gpuremediate.signals.model import SOURCE_OK, NodeReadings
from gpuremediate.signals.prom_degradation import ServesPeers, plan_for
from gpuremediate.signals.prom_nic import ServesNetwork, wanted_counters
from gpuremediate.signals.sources import FaultFastPath, InWaves, Source
from gpuremediate.signals.workload import FailedPodsWatch, WorkloadSignal
from gpuremediate.state import decide
from gpuremediate.vocab import states
from gpuremediate.vocab.degradation import TREND_MAINTENANCE, DegradationPolicy
from gpuremediate.vocab.findings import (
    ACTION_CORDON,
    ACTION_NONE,
    ACTION_RESET_GPU,
    KIND_LINK_DEGRADED,
    KIND_SLOW_GPU,
    KIND_THERMAL,
    KIND_TREND,
    NETWORK_KINDS,
    Finding,
)
from gpuremediate.vocab.record import (
    BLOCK_BREAKER,
    MAX_TIMESTAMP,
    NodeRecord,
    RecordError,
    block,
    gpu_held_out,
    isolated_at_gpu,
    record_from_node,
)

log = logging.getLogger(__name__)

FLEET_MIN_NODES = 5  # below this, every node's unknown is evented on its own
FLEET_UNKNOWN_FRACTION = 0.5  # more than this share unknown at once: one fleet Event instead of per node
BREAKER_DETAIL = "circuit breaker open: no new work"  # decide.on_findings' words for the open breaker
LOOK_DETAIL = "storm look"  # a held fault's blocked detail begins so while a look holds it
GAUGES_EVERY_S = 1.0  # a long batch updates the fleet gauges this often (a storm is seen as it happens)
DECIDE_WORKERS = 8  # a batch's decisions written this many at once (a burst of cordons; the client paces them)
SHARE_MIN_NODES = 20  # with --shards, a replica's own nodes count as a sample of the fleet from this many
FLOW_LIFT_HOLD = "lift-hold"
FLOW_PERSON_UNCORDONED = "person-uncordoned"
FLOW_THERMAL_CLEARED = "thermal-cleared"
FLOW_DEGRADATION_CLEARED = "degradation-cleared"
DEGRADATION_KINDS = (KIND_SLOW_GPU, KIND_LINK_DEGRADED, KIND_TREND)
FLOW_FINDINGS = "findings"

# Condition faults that arrive within this of the first are one batch. The agents of a storm write within a few
# hundred ms of each other: the first batch must already hold more than the look's limit (10 nodes) for the look or
# the breaker to hold it before any cordon; later arrivals join the look. A 750-node storm over 10 s brings 22 in
# 300 ms on average (10 or fewer about once in 300 storms); at 150 ms, 11 on average, and an API server that
# delivered the agents' writes evenly let the first 4 nodes of such a storm be cordoned in 2 of 7 runs.
# A lone fault waits this long at most: within the 0.5 s goal from the kernel line to the cordon.
CONDITION_WINDOW_S = 0.3
POLL_COST_SHARE = 20.0  # a fault poll is followed by at least this many times its own duration without one
T = TypeVar("T")


class PollPacer:
    """When the next fault poll may start. One ``period_s`` after the last one started; later when it was slow:
    at least ``POLL_COST_SHARE`` times Prometheus' time to answer it after its start, so polling keeps Prometheus
    busy at most 1/20 of the time however slow it gets (a 1.6 s fault query at 5,000 nodes was asked back to back,
    most of a core of someone else's Prometheus); after a failure, twice the last spacing, up to ``cap_s``.
    Polls never overlap: one thread asks them, one after the other."""

    def __init__(self, period_s: float, cap_s: float) -> None:
        self.period_s, self.cap_s = period_s, cap_s
        self.next_at = 0.0  # monotonic time the next poll is due (the past: at once)
        self.spacing_s = period_s  # the last poll's start to the next's
        self.failures = 0  # in a row

    def not_before(self, when: float) -> None:
        self.next_at = max(self.next_at, when)

    def at_once(self, now: float) -> None:
        """Due now (a full read just ended: a fault that came during it waits no period more), unless the last
        polls were slow or failed: then their spacing holds."""
        if self.failures == 0 and self.spacing_s <= self.period_s:
            self.next_at = min(self.next_at, now)

    def done(self, started: float, ended: float, failed: bool, prometheus_s: float | None = None) -> None:
        """A poll ran from ``started`` to ``ended``; ``prometheus_s``, where the source knows it, is Prometheus'
        own share of that (its time to answer): only that is spaced for. The rest is this process's reading and
        decoding, which waits for the interpreter while the replica's other threads hold it (at 100,000 nodes a
        0.18 s poll of a 0.05 s answer spaced the next 3.7 s away, and a fault waited 7 s for a poll)."""
        cost = max(0.0, ended - started) if prometheus_s is None else max(0.0, prometheus_s)
        spacing = max(self.period_s, POLL_COST_SHARE * cost)
        self.failures = self.failures + 1 if failed else 0
        if self.failures:
            spacing = max(spacing, min(self.cap_s, self.period_s * 2.0 ** self.failures))
        if spacing > self.period_s and spacing != self.spacing_s:
            log.info("fault fast path spaced out", extra={
                "next_in_s": round(spacing, 2), "poll_s": round(ended - started, 3), "failed": failed,
                **({"prometheus_s": round(prometheus_s, 3)} if prometheus_s is not None else {})})
        self.spacing_s = spacing
        self.next_at = started + spacing


@dataclass(frozen=True)
class Assessed:
    """A node read and judged, waiting for its decision (made once the batch's faults are counted)."""

    node: Node
    record: NodeRecord | None
    findings: tuple[Finding, ...]
    memory: PolicyMemory
    now: float
    metrics_known: bool
    hold_s: float = 0.0  # the node's [thermal].hold_s: a watched GPU's hold ends hold_s after it got hot


class DetectLoop:
    name = "detect"
    owned = decide.DETECT_STATES

    def __init__(self, ctx: LoopContext, source: Source) -> None:
        self.ctx = ctx
        self.source = source
        self.breakers = ctx.breakers
        self.memory: dict[str, PolicyMemory] = {}
        self.degradation = DegradationDetector()  # the fleet's peers: one per controller, fed once per pass
        self.network = NetworkJudges()  # [network] prometheus: node_exporter's InfiniBand series, judged here
        self.workload = WorkloadSignal()  # pods failing with GPU errors, by node (fed by the Failed pods' watch)
        self.workload_judge = WorkloadJudge(self.workload)
        self.preflight_judge = PreflightJudge(self.workload)  # failed preflights (issue 46), from the same watch
        self._preflight_told: set[str] = set()  # failed preflight pods (namespace/name) whose owners were told
        self._failed_pods: FailedPodsWatch | None = None  # started by start() where a group enables [workload]
        self.workload_fed = False  # the signal is fed (by that watch, or by the replay's history): it may count
        self.trend_maintenance: TrendMaintenance | None = None  # set once the maintenance loop runs (CRD served)
        self.maintenance_discovered = False  # the controller has asked whether MaintenanceRequests are served
        self._told_no_maintenance: set[str] = set()  # nodes told their trend cannot be scheduled (no CRD)
        self.unknown: dict[str, str] = {}  # node -> why its health is unknown
        self.evented_unknown: set[str] = set()  # nodes that got a GPUHealthUnknown Event (they get Known back)
        self.fleet_unknown = False  # most nodes unknown: one Event on the controller, none per node
        self.source_error = ""  # why the last read failed as a whole ("" when it did not)
        self.reads_ok = 0  # full reads of the source that succeeded since start
        self.reads_failed = 0  # full reads that failed since the last that succeeded
        # What the loop says about its source (never read since start, slower than its interval): an Event on the
        # controller's Pod, gpuremediate_source_problem, and the breaker ConfigMap's ``source`` key (status' banner).
        self.source_problem: SourceProblem | None = None
        self._problem_saved: SourceProblem | None = None  # as the ConfigMap holds it (a failed write is retried)
        self._started = time.monotonic()
        # Events are written by a worker: a storm of them never delays detection.
        self.events = EventQueue(ctx.events, ctx.metrics.events_dropped)
        self.excluded_seen: set[tuple[str, str]] = set()
        self.cycles = 0
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # wakes the wait between cycles: a stop, or a condition fault arrived
        self._read_now = threading.Event()  # the next cycle at once (read_soon)
        self._stopping = threading.Event()
        self._arrived: dict[str, float] = {}  # nodes whose conditions turned to a fault, since when (monotonic)
        self._arrived_lock = threading.Lock()  # the watch's thread adds, the loop's thread takes
        self._checking_arrivals = False  # an arrivals' batch is being checked (not interleaved into itself)
        self._monotonic = time.monotonic  # the fast path's poll clock (a test's own)
        self.workers = DECIDE_WORKERS  # replay decides one node at a time: 1
        self._state_counts: dict[str, int] = {}  # the nodes gauge as last computed, moved by each transition
        self._pace = PollPacer(0.0, 0.0)  # the fast path's (_poll_period sets it from the source)
        self._look_settled: float | None = None  # the opened_at of the last ended look whose held faults were decided
        self._read_judged_from = 0.0  # when the last full read that was judged in full began (the controller's clock)
        self._look_retry_at = 0.0  # monotonic: a look's end that failed to be written is tried again from then

    # ---- thread --------------------------------------------------------------------------------------

    def start(self) -> None:
        self._started = time.monotonic()
        self.ctx.metrics.fleet_unknown.set(1.0)  # nothing read yet: health unknown until the first read says
        policies = (self.ctx.policy.defaults, *(g.policy for g in self.ctx.policy.groups))
        if any(p.workload.enabled or p.preflight.enabled for p in policies):
            preflight = any(p.preflight.enabled for p in policies)
            self._failed_pods = FailedPodsWatch(self.ctx.client, self.workload, preflight=preflight)
            self._failed_pods.start()
            self.workload_fed = True
        start_source = getattr(self.source, "start", None)
        if callable(start_source):
            start_source()  # e.g. the exporter source's pod informer, so the first cycle finds it synced
        self._thread = threading.Thread(target=self._run, name="loop-detect", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        stop_source = getattr(self.source, "stop", None)
        if callable(stop_source):
            stop_source()
        if self._failed_pods is not None:
            self._failed_pods.stop()
        self.events.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        interval = self.ctx.settings.scrape_interval_s
        while not self.ctx.stop.is_set():
            started = time.monotonic()
            try:
                self.cycle()
            except (errors.ApiError, errors.TransportError) as exc:  # ordinary: one line, no traceback
                self.ctx.metrics.count_api_error(exc)
                log.warning("detect cycle failed; next cycle in one interval", extra={"error": str(exc)})
            except Exception:
                log.exception("detect cycle failed; next cycle in one interval")
            self._between_cycles(started + interval)
            if self._stopping.is_set():
                return

    def read_soon(self) -> None:
        """The next full read now, not one interval after the last (from another thread): shards gained, whose
        nodes this replica has not read (the fast path compares with a full read: before the first that held a
        shard, it is blind, and a replica whose first cycle came before its shards settled was, one interval)."""
        self._read_now.set()
        self._wake.set()

    def _between_cycles(self, deadline: float) -> None:
        """Wait for the next cycle; a source with a fault fast path (``fault_poll_s``) is polled meanwhile, as the
        pacer allows: at once when it is due (a fault that came during the full read waits no poll more), one
        poll every ``fault_poll_s`` from start to start, further apart when Prometheus is slow or failing."""
        poll = self._poll_period()
        while (now := self._monotonic()) < deadline and not self._stopping.is_set():
            if self._read_now.is_set():
                self._read_now.clear()
                return
            look_in = self._look_due_in()
            arrived_in = self._arrivals_due_in(now)
            if look_in is not None and look_in <= 0:
                self._settle_look_logged()
            elif arrived_in is not None and arrived_in <= 0:
                self._check_arrivals_logged()
            elif poll and now >= self._pace.next_at:
                self._fast_cycle_logged()
            elif self._wake.wait(min([deadline - now, *([self._pace.next_at - now] if poll else []),
                                      *([look_in] if look_in is not None else []),
                                      *([arrived_in] if arrived_in is not None else [])])):
                if self._stopping.is_set():
                    return
                self._wake.clear()  # a condition arrived: its window is counted from the dict, not from here

    # ---- conditions from the Node watch ----------------------------------------------------------------

    def condition_arrived(self, old: Node, new: Node) -> bool:
        """The Node watch's update (its thread): when ``new``'s conditions give an actionable finding ``old``'s
        did not (a condition turned to a fault), the node is checked within ``CONDITION_WINDOW_S``. True then."""
        if not self.ctx.owns(name_of(new)) or conditions_of(old) == conditions_of(new):
            return False
        now, policy = self.ctx.clock(), self.ctx.policy_for(new)
        rules, more = policy.conditions, condition_rules(policy.network)
        fresh = _actionable(condition_view(new, rules, now, more).findings)
        if not fresh or fresh <= _actionable(condition_view(old, rules, now, more).findings):
            return False
        with self._arrived_lock:
            self._arrived.setdefault(name_of(new), self._monotonic())
        self._wake.set()
        return True

    def _arrivals_due_in(self, now: float) -> float | None:
        with self._arrived_lock:
            first = min(self._arrived.values(), default=None)
        return None if first is None else first + CONDITION_WINDOW_S - now

    def _check_arrivals_logged(self) -> list[str]:
        self._checking_arrivals = True  # its own batch is not interrupted by arrivals: they wait for its end
        try:
            return self.check_arrivals()
        except (errors.ApiError, errors.TransportError) as exc:  # the next cycle reads their conditions anyway
            self.ctx.metrics.count_api_error(exc)
            log.warning("checking nodes whose conditions turned to a fault failed; the next cycle checks them",
                        extra={"error": str(exc)})
        except Exception:
            log.exception("checking nodes whose conditions turned to a fault failed; the next cycle checks them")
        finally:
            self._checking_arrivals = False
        return []

    def _arrivals_if_due(self) -> set[str]:
        """Within a cycle: the arrivals whose window is over, checked now (not after the cycle). The names checked."""
        if not self._arrived or self._checking_arrivals:
            return set()
        due_in = self._arrivals_due_in(self._monotonic())
        if due_in is None or due_in > 0:
            return set()
        return set(self._check_arrivals_logged())

    def _condition_findings(self, node: Node, now: float) -> list[Finding]:
        policy = self.ctx.policy_for(node)
        return list(condition_view(node, policy.conditions, now, condition_rules(policy.network)).findings)

    def check_arrivals(self) -> list[str]:
        """The nodes whose conditions turned to a fault, checked as one batch (``check_nodes``) on their conditions
        alone: the metrics wait for their own read (no readings: their fingerprints are neither judged nor pruned).
        A node whose conditions no longer give an actionable finding is left to the cycle. Returns those checked."""
        with self._arrived_lock:
            names, self._arrived = sorted(self._arrived), {}
        now = self.ctx.clock()
        nodes = [n for n in (self.ctx.nodes.get(name) for name in names) if n is not None]
        batch = [n for n in self.ctx.owned_of(nodes) if _actionable(self._condition_findings(n, now))]
        if not batch:
            return []
        started = time.monotonic()
        self.check_nodes(batch, {})
        log.info("conditions turned to a fault: checked", extra={  # rare: the moment agents report faults
            "nodes": len(batch), "check_s": round(time.monotonic() - started, 3)})
        return [name_of(n) for n in batch]

    def _poll_period(self) -> float | None:
        """The source's fault poll period (None: no fast path), handed to the pacer as it is now."""
        if not isinstance(self.source, FaultFastPath) or not self.source.fault_poll_s:
            return None
        self._pace.period_s = self.source.fault_poll_s
        self._pace.cap_s = max(self._pace.period_s, self.ctx.settings.scrape_interval_s)
        return self.source.fault_poll_s

    def _fast_cycle_logged(self) -> dict[str, NodeReadings]:
        try:
            return self.fast_cycle()
        except Exception as exc:  # the next full cycle reads every node anyway
            log.warning("fault fast path failed; the next cycle reads every node", extra={"error": str(exc)})
            self._pace.done(self._monotonic(), self._monotonic(), failed=True)
            return {}

    def fast_cycle(self) -> dict[str, NodeReadings]:
        """The nodes whose fault series changed since the last read (the source's ``changed_nodes``), read
        and checked at once: a fault is acted on about one poll after Prometheus has it, not one interval.
        Returns the readings it checked."""
        source = self.source
        started, polled_at = time.monotonic(), self._monotonic()
        changed = source.changed_nodes() if isinstance(source, FaultFastPath) else set()
        failed, answer_s = bool(getattr(source, "fault_error", "")), getattr(source, "fault_answer_s", None)
        self._pace.done(polled_at, self._monotonic(), failed=failed,  # a failed poll's whole time is Prometheus'
                        prometheus_s=answer_s if isinstance(answer_s, float) and not failed else None)
        mine = self.ctx.owned_gpu_nodes() if changed else []
        owned = [n for n in mine if name_of(n) in changed]
        if not owned or not isinstance(source, FaultFastPath):
            return {}
        asked = time.monotonic()
        log.info("fault fast path: fault series changed", extra={  # rare: the moment a poll shows a fault
            "nodes": len(owned), "fault_query_s": round(asked - started, 3)})
        by_node = {r.node: r for r in source.read(nodes=sorted(name_of(n) for n in owned))}
        read = time.monotonic()
        self._check_batch([n for n in owned if name_of(n) in by_node], by_node, self.ctx.nodes.gpu_count(), mine)
        log.info("fault fast path: changed nodes read and checked", extra={  # rare: only when a fault changes
            "nodes": len(by_node), "fault_query_s": round(asked - started, 3), "read_s": round(read - asked, 3),
            "check_s": round(time.monotonic() - read, 3)})
        return by_node

    # ---- one cycle -----------------------------------------------------------------------------------

    def cycle(self) -> None:
        """Read, then decide in batches: each wave of readings (the exporter source hands on most nodes first
        and each straggler as it answers; Prometheus, everything at once) is one batch, whose new faults the
        breaker counts together before any of them is acted on."""
        read_from = self.ctx.clock()
        fleet = self.ctx.nodes.gpu_count()
        nodes = self.ctx.owned_gpu_nodes()  # with --shards, only the shards held now; the breaker counts the fleet
        self._forget_others(nodes)
        owned = {name_of(n) for n in nodes}
        self.degradation.forget(owned.__contains__)  # nodes gone (or another shard's): their GPUs too
        self.network.forget(owned.__contains__)
        self.breakers.refresh()  # a person's reset (CLI or annotation) is seen: the watch's, or a GET
        if not self._state_counts:
            self._gauges()  # the counts a long batch then moves as it goes
        if isinstance(self.source, ServesPeers):  # the policy may have been reloaded since the last read
            self.source.degradation_plan = plan_for(p.degradation for p in self._policies())
        if isinstance(self.source, ServesNetwork):
            self.source.network_counters = wanted_counters((p.network.enabled and p.network.prometheus,
                                                            p.network.error_counters) for p in self._policies())
        seen: dict[str, NodeReadings] = {}
        for wave in self._read_waves():
            nodes = self.ctx.owned_of(nodes)  # less a shard given up while the read ran: its new holder's to decide
            by_node = {r.node: r for r in wave}
            if not seen:  # the first wave: nodes with no readings yet count as unknown for the fleet's state
                self._fleet_state(nodes, by_node)
            seen.update(by_node)
            self._check_batch([n for n in nodes if name_of(n) in by_node], by_node, fleet, nodes)
            self._arrivals_if_due()
        nodes = self.ctx.owned_of(nodes)
        if not seen:
            self._fleet_state(nodes, seen)
        self._check_batch([n for n in nodes if name_of(n) not in seen], {}, fleet, nodes)  # no readings at all
        self._read_judged_from = read_from  # a look waiting for a read begun after it opened may end now
        self._settle_look_logged()
        self._gauges()
        self._save_source_problem()
        self.cycles += 1
        self.ctx.metrics.detect_cycles.inc()  # after the gauges: a scrape that counts a cycle shows its gauges

    def check_nodes(self, batch: Sequence[Node], by_node: Mapping[str, NodeReadings]) -> None:
        """Decide for these nodes from these readings, as one batch (replay drives the loop through this). The
        hook for a path of faults of its own (failed preflights, issue 46; a condition watch, issue 48): its
        faults are counted and their arrival rate judged by the breaker (a storm look) as every read's are."""
        self._check_batch(batch, by_node, self.ctx.nodes.gpu_count(), self.ctx.owned_gpu_nodes())

    def _check_batch(self, batch: Sequence[Node], by_node: Mapping[str, NodeReadings], fleet: int,
                     owned: Sequence[Node]) -> None:
        """Assess every node of the batch, count the batch's new faults in the breaker at once (one write: a
        storm opens it before any of its nodes is cordoned), then decide each node. One node's API failure
        is not the batch's (the next cycle retries it); the fleet gauges follow a long batch as it goes.
        A storm look whose time is up is ended first: its held faults are decided before this batch's."""
        self._settle_look_logged()
        self.update_degradation(batch, by_node)
        pending: list[Assessed] = []
        checked: set[str] = set()  # arrivals checked meanwhile: decided from newer conditions than assessed here
        for node in batch:
            checked |= self._arrivals_if_due()
            assessed = self._guarded(node, functools.partial(self._assess, node, by_node.get(name_of(node))))
            if assessed is not None:
                pending.append(assessed)
        pending = [p for p in pending if (p.record is not None or p.findings or held_by_us(p.node)
                   or _watched(p.memory.to_dict())) and name_of(p.node) not in checked]  # else: nothing to decide
        faulted = [name_of(p.node) for p in pending if self._trips(p)]
        if faulted and not self._trip_guarded(faulted, fleet, owned, self.ctx.clock()):
            faulted_set = set(faulted)  # the breaker could not count them: none of them is acted on now
            pending = [p for p in pending if name_of(p.node) not in faulted_set]
        look = self.breakers.latest().looking
        if look is not None:  # held by the look: nothing written per node until it ends (_settle_look decides them)
            pending = [p for p in pending if not (look.holds(name_of(p.node)) and self._only_looked_at(p))]
        shown, moved = time.monotonic(), False
        for move in self._each(pending, lambda p: self._guarded(p.node, functools.partial(self._decide, p))):
            if isinstance(move, decide.Transition) and move.from_state in self._state_counts:
                self._state_counts[move.from_state] -= 1  # the state gauges follow the batch's own moves
                self._state_counts[move.to_state] = self._state_counts.get(move.to_state, 0) + 1
                moved = True
            if moved and time.monotonic() - shown > GAUGES_EVERY_S:
                self.ctx.metrics.nodes.replace_all(({"state": s}, float(n)) for s, n in self._state_counts.items())
                shown, moved = time.monotonic(), False

    def update_degradation(self, batch: Sequence[Node], by_node: Mapping[str, NodeReadings]) -> None:
        """Feed the pass's readings to the degradation detector before any node is assessed (its peers are the
        fleet's, not one node's)."""
        if not self.degradation.gpus and not any(p.degradation.enabled or p.degradation.trends
                                                 for p in self._policies()):
            return  # off everywhere (the default): no cost per node
        nodes = {name_of(node): node for node in batch}

        def context(name: str) -> NodeContext | None:
            node = nodes.get(name)
            if node is None:
                return None
            labels = labels_of(node)
            group = self.ctx.policy.group_for(labels)
            policy = (group.policy if group else self.ctx.policy.defaults).degradation
            return NodeContext(group.name if group else "", policy, labels.get(policy.peer_label, "")
                               if policy.peer_label else "")

        readings = [by_node[name] for name in nodes if name in by_node]
        if readings:
            peers = self.source.fleet_peers if isinstance(self.source, ServesPeers) else None
            self.degradation.update(readings, context, self.ctx.clock(), peers)

    def _policies(self) -> tuple[Policy, ...]:
        return (self.ctx.policy.defaults, *(group.policy for group in self.ctx.policy.groups))

    def _each(self, pending: Sequence[Assessed], step: Callable[[Assessed], object]) -> Iterator[object]:
        """``step`` for each node, ``workers`` at once when there are several (their writes are independent:
        each node's own, guarded by its resourceVersion); yields as each one ends."""
        if self.workers <= 1 or len(pending) <= 1:
            yield from map(step, pending)
            return
        with ThreadPoolExecutor(max_workers=min(self.workers, len(pending)), thread_name_prefix="decide") as pool:
            yield from pool.map(step, pending)

    def _guarded(self, node: Node, step: Callable[[], T]) -> T | None:
        """``step`` with its writes fenced by the node's shard; an API failure is logged and counted."""
        try:
            with acting_for(name_of(node)):
                return step()
        except (errors.ApiError, errors.TransportError) as exc:
            self.ctx.metrics.count_api_error(exc)
            log.warning("detect: node step failed; next cycle retries it",
                        extra={"node": name_of(node), "error": str(exc)})
            return None

    def forget_node(self, name: str) -> None:
        """A Node deleted: what was kept about its name goes (one that joins later under it starts fresh)."""
        for table in (self.memory, self.unknown, self.ctx.readings):
            table.pop(name, None)
        self.evented_unknown.discard(name)

    def _forget_others(self, owned: Sequence[Node]) -> None:
        """Nodes of shards no longer held: their holder reports and remembers them (the record keeps the policy
        memory, read again if the shard comes back)."""
        if self.ctx.shards is None:
            return
        mine = {name_of(n) for n in owned}
        for table in (self.memory, self.unknown, self.ctx.readings):  # readings: a drain taken over reads fresh ones
            for name in [n for n in table if n not in mine]:
                del table[name]
        self.evented_unknown &= mine

    def _read_waves(self) -> Iterator[list[NodeReadings]]:
        """The cycle's readings, in the source's waves (one wave for a source without them); a source that
        fails as a whole yields nothing more (the nodes not read are unknown, said once)."""
        if not isinstance(self.source, InWaves):
            yield self._read()
            return
        try:
            for wave in self.source.read_waves():
                self._count_malformed(wave)
                yield wave
        except Exception as exc:
            self._source_failed(exc)
            return
        self._source_ok()

    def _read(self) -> list[NodeReadings]:
        started = time.monotonic()
        source = self.ctx.settings.source
        try:
            readings = self._read_polling()
        except Exception as exc:
            self._source_failed(exc)
            return []
        finally:
            took = time.monotonic() - started
            if getattr(self.source, "observer", None) is None:  # sources with an observer time each scrape
                self.ctx.metrics.scrape_seconds.observe(took, source=source)
        self._source_ok(took)
        self._count_malformed(readings)
        return readings

    def _source_failed(self, exc: Exception) -> None:
        if not self.source_error:
            log.error("reading GPU metrics failed; every node's health is unknown", extra={"error": str(exc)})
        self.source_error = f"reading GPU metrics failed: {exc}"
        self.reads_failed += 1
        self.ctx.metrics.scrape_errors.inc(source=self.ctx.settings.source)
        if self.reads_ok == 0:
            self._never_read(exc)

    def _source_ok(self, took: float | None = None) -> None:
        if self.source_error:
            log.info("reading GPU metrics works again")
        self.source_error = ""
        self.reads_ok += 1
        self.reads_failed = 0
        problem = self.source_problem
        if problem is not None and problem.problem == SOURCE_NEVER_READ:
            message = (f"GPU health read from the {self.ctx.settings.source} source for the first time, "
                       f"{time.monotonic() - self._started:.0f} s after start")
            log.info(message)
            self._controller_event("GPUHealthSourceRead", message, NORMAL)
            self._say_problem(None)
        if took is not None and took > self.ctx.settings.scrape_interval_s:
            self._slow(took, done=True)
        elif problem is not None and problem.problem == SOURCE_SLOW:
            log.info("the GPU-health source keeps up with its interval again", extra={"read_s": round(took or 0, 2)})
            self._say_problem(None)

    def _timeout_words(self) -> str:
        timeout = getattr(self.source, "timeout_s", None)
        if not isinstance(timeout, int | float):
            return ""
        if self.ctx.settings.source != "prometheus":
            return f"; each scrape's timeout is {timeout:g} s (--scrape-timeout)"
        return (f"; the query timeout is {timeout:g} s for {self.ctx.nodes.gpu_count()} GPU nodes "
                f"(--prometheus-query-timeout)")

    def _never_read(self, exc: Exception) -> None:
        """The source has never been read since start: said at its first failure, loudly (the fleet's health has
        never been known: no fault anywhere would be seen)."""
        if self.source_problem is not None and self.source_problem.problem == SOURCE_NEVER_READ:
            return
        detail = (f"no read of the {self.ctx.settings.source} source has succeeded since the controller started "
                  f"({self.reads_failed} tried, {time.monotonic() - self._started:.0f} s ago): {exc}"
                  f"{self._timeout_words()}")
        log.error("GPU health never read: every node's health is unknown", extra={"detail": detail})
        self._controller_event("GPUHealthSourceNeverRead", detail, WARNING)
        self._say_problem(SourceProblem(SOURCE_NEVER_READ, detail, self.ctx.clock(), self.ctx.settings.who))

    def _slow(self, took: float, done: bool) -> None:
        """A read longer than the interval (or still running past it): the source cannot keep up. Said once, while
        it lasts; a never-read problem is the louder one and stays."""
        if self.source_problem is not None:
            return
        interval = self.ctx.settings.scrape_interval_s
        detail = (f"a read of the {self.ctx.settings.source} source {'took' if done else 'has taken'} {took:.1f} s"
                  f"{'' if done else ' so far'}, longer than --scrape-interval {interval:g} s{self._timeout_words()}")
        log.warning("the GPU-health source cannot keep up with its interval", extra={"detail": detail})
        self._controller_event("GPUHealthSourceSlow", detail, WARNING)
        self._say_problem(SourceProblem(SOURCE_SLOW, detail, self.ctx.clock(), self.ctx.settings.who))

    def _say_problem(self, problem: SourceProblem | None) -> None:
        self.source_problem = problem
        for kind in (SOURCE_NEVER_READ, SOURCE_SLOW):
            self.ctx.metrics.source_problem.set(1.0 if problem is not None and problem.problem == kind else 0.0,
                                                problem=kind)
        self._save_source_problem()

    def _save_source_problem(self) -> None:
        """The problem in the breaker ConfigMap for ``status`` (a write only when it changed; retried each cycle)."""
        if self.source_problem == self._problem_saved:
            return
        try:
            self.breakers.set_source(self.source_problem)
        except (errors.ApiError, errors.TransportError) as exc:
            self.ctx.metrics.count_api_error(exc)
            log.warning("could not record the source's state for status; retried next cycle", extra={"error": str(exc)})
            return
        self._problem_saved = self.source_problem

    def _count_malformed(self, readings: Sequence[NodeReadings]) -> None:
        malformed = sum(r.malformed_lines for r in readings)
        if malformed:
            self.ctx.metrics.scrape_malformed.inc(malformed, source=self.ctx.settings.source)

    def _read_polling(self) -> list[NodeReadings]:
        """The full read, in a thread of its own. This one watches it (a read still running one interval after it
        began is said at once: the source cannot keep up) and, with a fault fast path, polls meanwhile (at 5,000
        nodes a read takes seconds: a fault that came during it is acted on one poll later, not after it). A
        node a poll read is newer than in the full read (asked earlier): its polled readings are the cycle's."""
        poll = self._poll_period()
        outcome: list[list[NodeReadings] | Exception] = []
        done = threading.Event()

        def read() -> None:
            try:
                outcome.append(self.source.read())
            except Exception as exc:  # raised again in the detect thread
                outcome.append(exc)
            finally:
                done.set()

        started = time.monotonic()
        watch_until: float | None = started + self.ctx.settings.scrape_interval_s
        threading.Thread(target=read, name="detect-read", daemon=True).start()
        polled: dict[str, NodeReadings] = {}
        if poll:
            self._pace.not_before(self._monotonic() + poll)
        while True:
            waits = [watch_until - time.monotonic()] if watch_until is not None else []
            if poll:
                waits.append(self._pace.next_at - self._monotonic())
            if (look_in := self._look_due_in()) is not None:
                waits.append(look_in)
            waits.append(CONDITION_WINDOW_S)  # conditions that turn to a fault during the read: checked in time
            if done.wait(max(0.0, min(waits)) if waits else None):
                break
            self._arrivals_if_due()
            if look_in is not None and not self._stopping.is_set():
                self._settle_look_logged()  # a look's held faults go on at its end, not after the read
            if watch_until is not None and time.monotonic() >= watch_until:
                self._slow(time.monotonic() - started, done=False)
                watch_until = None
            if poll and not self._stopping.is_set() and self._monotonic() >= self._pace.next_at:  # stopping: the read
                polled.update(self._fast_cycle_logged())                                     # is waited for
        if poll:
            self._pace.at_once(self._monotonic())
        result = outcome[0]
        if isinstance(result, Exception):
            raise result
        return [polled.pop(r.node, r) for r in result] + list(polled.values())

    def _assess(self, node: Node, readings: NodeReadings | None) -> Assessed | None:
        """The node's findings (metrics and conditions), reported when unknown or excluded; None when there is
        nothing to decide here (unknown, excluded, another loop's state, a malformed record replaced)."""
        name = name_of(node)
        now = self.ctx.clock()
        policy = self.ctx.policy_for(node)
        view = condition_view(node, policy.conditions, now, condition_rules(policy.network))
        workload = [*self.workload_findings(name, policy.workload, now),
                    *self.preflight_findings(name, policy.preflight, now)]
        if readings is None or readings.status != SOURCE_OK:
            reason = (readings.reason if readings is not None else self._why_no_readings()) or "unknown"
            verdict = merge_node((), False, reason, view, workload)
            if verdict.unknown:
                self._report_unknown(name, verdict.unknown)
                return None
            self._acted_on_while_unknown(name)
            readings = None
        else:
            self._known_again(name)
            self.ctx.readings[name] = readings
        record = record_from_node(node)
        if isinstance(record, RecordError):
            self._apply(node, decide.on_malformed(record, node_unschedulable_of(node), now))
            return None
        if readings is not None and _read_before_return(readings, record):
            readings = None  # begun before the node came back from its repair: it shows the node before the repair
        memory = self._memory_for(name, record)
        metric_findings: Sequence[Finding] = ()
        if readings is not None:
            result = evaluate(readings, policy, memory, now, labels_of(node))
            self.memory[name] = memory = result.memory
            metric_findings = [*result.findings, *self.degradation.findings(name), *self._network_findings(
                name, policy, now)]
        verdict = merge_node(metric_findings, readings is not None, "", view, workload)
        if is_excluded(node):
            self._report_excluded(name, verdict.findings)
            return None
        self._schedule_trends(name, record, verdict.findings, readings, policy.degradation, now)
        domain = self._domain_finding(node)  # its NVLink domain's domain action, while the domain's trip stands
        findings = (*verdict.findings, domain) if domain is not None else tuple(verdict.findings)
        taken = domain is not None and record is not None and record.state == states.DRAINING \
            and bool(decide.new_findings(record, [domain]))  # a tray waiting or draining for its own fault
        if record is not None and record.state not in self.owned and not _isolated_in_flow(record) and not taken:
            return None  # another loop owns it; its findings wait until it is back (a GPU-level flow escalates)
        return Assessed(node, record, findings, memory, now, verdict.metrics_known, policy.thermal.hold_s)

    def _network_findings(self, name: str, policy: Policy, now: float) -> list[Finding]:
        """``[network] prometheus``: the node's NIC findings from node_exporter's series (signals/prom_nic.py)."""
        if not isinstance(self.source, ServesNetwork) or self.source.network_counters is None:
            return []
        return self.network.findings(name, self.source.network_readings.get(name), policy.network, now)

    def _schedule_trends(self, name: str, record: NodeRecord | None, findings: Sequence[Finding],
                         readings: NodeReadings | None, policy: DegradationPolicy, now: float) -> None:
        """``trend_action = "maintenance"``: the node's trends get a MaintenanceRequest (loops/trend_maintenance)."""
        if policy.trend_action != TREND_MAINTENANCE or not any(f.kind == KIND_TREND for f in findings):
            return
        if record is not None and record.state != states.HEALTHY:
            return  # a flow under way (its repair may cure the trend): looked at again once it is over
        if self.trend_maintenance is not None:
            served = max((h.at for h in record.history if h.kind == decide.MAINTENANCE_KIND), default=0.0) \
                if record is not None else 0.0
            self.trend_maintenance.schedule(name, findings, readings, policy, now, served)
        elif self.maintenance_discovered and name not in self._told_no_maintenance:
            self._told_no_maintenance.add(name)
            text = ("a failing trend cannot be scheduled: the API server serves no MaintenanceRequest (install "
                    "manifests/crds); it is reported only")
            log.error(text, extra={"node": name})
            self.events.node_event(name, "GPUTrendMaintenanceFailed", text, WARNING)

    def _domain_finding(self, node: Node) -> Finding | None:
        """The domain decision for this tray: its NVLink domain's breaker is open and ``[fabric] domain_action``
        handles the domain as one unit (None otherwise: the ordinary path, or the domain breaker's hold)."""
        if not self.ctx.policy.cluster.breaker.enabled:
            return None
        trips = self.breakers.latest().domains
        if not trips:
            return None
        rules = self.ctx.policy_for(node).fabric
        trip = domain_trips(trips, rules).get(labels_of(node).get(rules.domain_label, ""))
        if trip is None or _created_after(node, trip.opened_at):
            return None  # a Node made after the decision (a tray replaced since) is not part of it
        return domain_finding(name_of(node), trip, rules)

    def workload_findings(self, node: str, policy: WorkloadPolicy, now: float) -> list[Finding]:
        """The node's workload signal findings now (none while nothing feeds the signal)."""
        if not policy.enabled or not self.workload_fed:
            return []
        return self.workload_judge.findings(node, now, min_pods=policy.min_pods, window_s=policy.window_s,
                                      action=policy.action)

    def preflight_findings(self, node: str, policy: PreflightPolicy, now: float) -> list[Finding]:
        """The node's failed-preflight finding now; each failed pod and its owner told once (a Warning Event)."""
        if not policy.enabled or not self.workload_fed:
            return []
        found = self.preflight_judge.findings(node, now, policy)
        if found:
            for failure in self.preflight_judge.failed(node, now, policy.window_s):
                if failure.pod not in self._preflight_told:
                    if len(self._preflight_told) > 100_000:
                        self._preflight_told.clear()  # bounded: an old pod told twice at worst
                    self._preflight_told.add(failure.pod)
                    self.ctx.metrics.preflights_failed.inc()
                    self.events.submit(functools.partial(preflight_notice.tell, self.ctx.events, failure, found[0]))
        return found

    def _flow(self, a: Assessed) -> tuple[str, NodeRecord | None]:
        """Which step the node takes (FLOW_*), with its record pruned of the fingerprints no longer reported."""
        unschedulable = unschedulable_before_us(a.node)  # a held cordon (annotations full) is ours
        if a.record is None and held_by_us(a.node) and not any(f.action != ACTION_NONE for f in a.findings):
            return FLOW_LIFT_HOLD, None
        if a.record is not None and decide.person_uncordoned(a.record, unschedulable):
            return FLOW_PERSON_UNCORDONED, a.record
        # Metrics unknown: only the conditions are current, so only their fingerprints may be forgotten.
        keep = None if a.metrics_known else decide.keep_metric_fingerprints
        pruned = decide.prune_handled(a.record, a.findings, keep) if a.record is not None else None
        if pruned is not None and _thermal_cleared(pruned, a.findings) \
                and (a.metrics_known or _from_condition(pruned)):
            return FLOW_THERMAL_CLEARED, pruned
        if (pruned is not None and a.metrics_known and self._degradation_cleared(name_of(a.node), pruned)
                and not _other_degradation(a.findings, pruned)):
            return FLOW_DEGRADATION_CLEARED, pruned
        return FLOW_FINDINGS, pruned

    def _trips(self, a: Assessed) -> bool:
        """The node has a new fault the breaker counts: actionable, and nothing (pause, breaker) holds it (a
        held fault counts once let go)."""
        flow, pruned = self._flow(a)
        if flow != FLOW_FINDINGS or not self.ctx.policy.cluster.breaker.enabled:
            return False
        actionable = [f for f in decide.new_findings(pruned, a.findings) if f.action != ACTION_NONE
                      and f.kind != KIND_DOMAIN]  # a domain action is the breaker's own decision, not a new fault
        if pruned is not None and pruned.state == states.CORDONED:
            actionable = [f for f in actionable if f.action != ACTION_CORDON]
        return bool(actionable) and self._held(a.node) is None

    def _only_looked_at(self, a: Assessed) -> bool:
        """The node's new fault waits for the storm look, and nothing else holds it: no record is written for it
        during the look (a storm's 1,600 Node patches, Events and conditions would slow the judging of its next
        installments; the look in the breaker ConfigMap says what is held and why: ``status``, ``breaker status``,
        the metric, its Event). Whatever it decides at the look's end is written then."""
        held = self._held(a.node)
        return held is not None and held[1].startswith(LOOK_DETAIL) and self._flow(a)[0] == FLOW_FINDINGS

    def _decide(self, a: Assessed) -> decide.Transition | None:
        """Decide and write; the transition written, if any."""
        node, record, now = a.node, a.record, a.now
        flow, pruned = self._flow(a)
        if flow == FLOW_LIFT_HOLD:
            self.ctx.writer.lift_hold(node)  # the fault went before its record could be written
            return None
        if flow == FLOW_PERSON_UNCORDONED and record is not None:
            uncordoned = decide.on_person_uncordoned(record, now)
            return uncordoned.transition if self._apply(node, uncordoned) is not None else None
        if flow == FLOW_THERMAL_CLEARED and pruned is not None:
            kind = pruned.fault.kind if pruned.fault else ""
            words = f"{kind}: the NIC's port is healthy again" if kind in NETWORK_KINDS else cleared_words(kind)
            decision = decide.thermal_cleared(pruned, now, words)
        elif flow == FLOW_DEGRADATION_CLEARED and pruned is not None:
            decision = decide.degradation_cleared(pruned, now)
        elif (domain := self._domain_to_take(a, pruned)) is not None:
            decision = decide.on_domain_action(pruned, domain, unschedulable_before_us(node), now)
        else:
            held = self._held(node)
            decision = _name_hold(record, decide.on_findings(pruned, a.findings, unschedulable_before_us(node), now,
                                                              self._options(held, node, record)), held, now)
        memory, hold_ends = a.memory.to_dict(), _hold_ends(a.memory, a.hold_s)
        watching = hold_ends != (dict(record.thermal_hold_ends) if record is not None else {})
        if decision.transition is not None or (pruned is not None and pruned != record) or watching:
            # A GPU starting or ending its thermal hold is written too: `explain` shows what is watched, and
            # when its hold ends (the cordon, if it stays hot)
            stored = dataclasses.replace(decision.record, policy_memory=memory, thermal_hold_ends=hold_ends)
            decision = dataclasses.replace(decision, record=stored, changed=True)
        if self._apply(node, decision) is None:
            return None
        self._count_fault(decision)  # counted once written: a 409 decides (and counts) again
        fault = decision.record.fault
        if fault is not None and fault.kind == KIND_DOMAIN and (record is None or record.fault is None
                                                                 or record.fault.fingerprint != fault.fingerprint):
            self.ctx.metrics.domain_action_trays.inc(action=fault.action)
            self.events.node_event(name_of(node), "GPURemediationDomainAction", fault.message, WARNING)
        return decision.transition

    def _domain_to_take(self, a: Assessed, pruned: NodeRecord | None) -> Finding | None:
        """The domain finding when this tray is to be taken into its domain's action now: new for its record,
        and neither a pause nor the fleet-wide breaker stops new work (those hold it as any fault)."""
        domain = next((f for f in decide.new_findings(pruned, a.findings) if f.kind == KIND_DOMAIN), None)
        if domain is None or self.breakers.latest_pause().paused or self.breakers.latest().is_open:
            return None
        return domain

    def _degradation_cleared(self, name: str, record: NodeRecord) -> bool:
        """Cordoned for a degradation finding, and the detector has seen its GPUs recover (hysteresis inside it)."""
        fault = record.fault
        if record.state != states.CORDONED or fault is None or fault.kind not in DEGRADATION_KINDS:
            return False
        return self.degradation.cleared(name, fault.kind, fault.gpus)

    def _options(self, held: tuple[str, str] | None, node: Node, record: NodeRecord | None) -> decide.DecideOptions:
        cluster = self.ctx.policy.cluster
        return decide.DecideOptions(
            repeat_count=cluster.repeat_offender.count,
            repeat_window_s=cluster.repeat_offender.window_s,
            breaker_open=held is not None,
            isolation=self._isolation(node, record),
        )

    def _isolation(self, node: Node, record: NodeRecord | None) -> Callable[[Finding], str] | None:
        """``[isolation] scope = "gpu"``: why a finding on this node is node-level ("" = its GPU alone)."""
        policy = self.ctx.policy_for(node)
        if not policy.isolation.gpu_level:
            return None
        labels, capacity = labels_of(node), (node.get("status") or {}).get("capacity") or {}
        history, now = (record.history if record is not None else ()), self.ctx.clock()
        window_s = self.ctx.policy.cluster.repeat_offender.window_s

        def why(finding: Finding) -> str:
            return node_level_reason(finding, labels, capacity, ladder=policy.remediation.ladder_for(finding.action),
                                     gpu_operator=policy.gpu_operator, history=history, now=now, window_s=window_s)
        return why

    def _held(self, node: Node) -> tuple[str, str] | None:
        """Why no new work may start on this node (blocked reason, detail): a pause, the open breaker, or the
        breaker of one of its failure domains."""
        pause = self.breakers.latest_pause()
        if pause.paused:
            return safety.BLOCK_PAUSED, f"paused by {pause.by or '?'}: {pause.reason or '-'}"
        if not self.ctx.policy.cluster.breaker.enabled:
            return None
        breaker = self.breakers.latest()
        if breaker.is_open:
            return BLOCK_BREAKER, BREAKER_DETAIL
        why = breaker.blocks(safety.node_view(node)) if breaker.domains else ""
        if why:
            return BLOCK_BREAKER, why
        look = breaker.looking
        if look is not None and look.holds(name_of(node)):
            return BLOCK_BREAKER, f"{LOOK_DETAIL} until {_utc(look.until)}: {look.reason}"
        return None

    def _domain_views(self, labels: Sequence[str], faulted: Collection[str]) -> list[safety.NodeView]:
        """The views the domain breaker judges ``faulted`` by: the GPU nodes that share a value of one of ``labels``
        with one of them (a domain no fault is in cannot trip), from the Node view's label index, not the fleet."""
        wanted: dict[str, set[str]] = {label: set() for label in labels}
        for name in faulted:
            node = self.ctx.nodes.get(name)
            node_labels = labels_of(node) if node is not None else {}
            for label in labels:
                if label in node_labels:
                    wanted[label].add(str(node_labels[label]))
        wanted = {label: values for label, values in wanted.items() if values}
        return self.ctx.nodes.views_with(wanted) if wanted else []

    def _trip_guarded(self, names: Sequence[str], total_nodes: int, owned: Sequence[Node], now: float) -> bool:
        """``_trip_breaker``; False when the breaker's state could not be written (those faults wait a cycle)."""
        try:
            self._trip_breaker(names, total_nodes, owned, now)
        except (errors.ApiError, errors.TransportError) as exc:
            self.ctx.metrics.count_api_error(exc)
            log.warning("detect: the breaker could not count the new faults; they are acted on next cycle",
                        extra={"nodes": len(names), "error": str(exc)})
            return False
        return True

    def _trip_breaker(self, names: Sequence[str], total_nodes: int, owned: Sequence[Node], now: float) -> None:
        """Count a batch's new faults at once, in one write, and open the breaker when they pass its threshold:
        of the fleet (every replica's faults, through the shared ConfigMap), or, with --shards, of this
        replica's own nodes (a storm split across shards opens it in each, before either acts)."""
        cfg = self.ctx.policy.cluster.breaker
        domain_labels = breaker_domain_labels(cfg.domain_labels, self.ctx.policy.defaults.fabric)
        views: list[safety.NodeView] = []
        mine = {name_of(n) for n in owned} if self.ctx.shards is not None else set()

        rate = self._look_rate()

        def with_faults(breaker: safety.CircuitBreaker) -> safety.CircuitBreaker:  # again on a 409 (another shard)
            nonlocal views
            after = breaker.judge(names, total_nodes, now, cfg.threshold_percent, cfg.window_s, cfg.min_nodes, rate)
            if len(mine) >= SHARE_MIN_NODES:
                after = after.evaluate_share(mine, now, cfg.threshold_percent, cfg.window_s, cfg.min_nodes)
                after = after.end_look(now) if after.is_open else after
            if not domain_labels:
                return after
            views = self._domain_views(domain_labels, {node for node, at in after.faults if at >= now - cfg.window_s})
            return after.evaluate_domains(views, now, domain_labels, cfg.domain_threshold_percent,
                                          cfg.window_s, cfg.domain_min_nodes)
        before, after = self.breakers.update(with_faults)
        self.ctx.metrics.circuit_breaker_open.set(1.0 if after.is_open else 0.0)  # at once, not at the cycle's end
        first = names[0]
        look = after.looking
        if look is not None and (before.looking is None or before.looking.opened_at != look.opened_at):
            self._look_opened(look, first)
        ended = after.look
        if before.looking is not None and look is None and ended is not None \
                and ended.opened_at == before.looking.opened_at:
            self._look_ended(ended, now)  # the storm passed the threshold during the look
        held = after.looking
        if held is not None or before.looking is not None:
            self.ctx.metrics.breaker_look_held.set(float(len(held.nodes)) if held is not None else 0.0)
        if after.is_open and not before.is_open:
            log.error("circuit breaker opened: no new remediation until a person resets it",
                      extra={"reason": after.reason, "new_faults": len(names)})
            self.events.node_event(first, "GPURemediationBreakerOpen",
                                   f"circuit breaker opened: {after.reason} ({len(names)} new in one read); run "
                                   f"`gpuremediate breaker reset`", WARNING)
            self._controller_event("GPURemediationBreakerOpen", f"circuit breaker opened: {after.reason}", WARNING)
            faulted = tuple(sorted({node for node, _ in after.faults}))
            self._notify(notify.Notification(notify.KIND_BREAKER_OPEN, "", "breaker-open", after.reason, now,
                                             nodes=faulted))
        for trip in after.domains[len(before.domains):]:
            text = (f"domain breaker opened for {trip.label}={trip.value} (the faults' common label): {trip.reason}; "
                    f"no new work there until `gpuremediate breaker reset`")
            log.error("domain breaker opened", extra={"label": trip.label, "value": trip.value, "reason": trip.reason})
            self.events.node_event(first, "GPURemediationDomainBreakerOpen", text, WARNING)
            recent = {node for node, _ in after.faults}
            in_domain = tuple(sorted(v.name for v in views if v.labels.get(trip.label) == trip.value
                                     and v.name in recent))
            self._notify(notify.Notification(notify.KIND_BREAKER_OPEN, "", f"{trip.label}={trip.value}", text, now,
                                             nodes=in_domain or tuple(names)))

    # ---- the storm look ----------------------------------------------------------------------------

    def _look_rate(self) -> safety.LookRate | None:
        cfg = self.ctx.policy.cluster.breaker
        if not cfg.look_s:
            return None
        return safety.LookRate(nodes=cfg.look_nodes, percent=cfg.look_percent, window_s=cfg.look_window_s,
                               look_s=cfg.look_s, min_nodes=cfg.min_nodes)

    def _look_end_at(self, breaker: safety.CircuitBreaker, look: safety.Look) -> float:
        """When the look under way ends (the controller's clock): at once once the breaker is open; else at its
        ``until``, and for a source without a fault fast path (the faults come in full reads) not before a read
        begun after it opened has been judged, nor later than one --scrape-interval after ``until``."""
        if breaker.is_open:
            return look.opened_at
        fast = isinstance(self.source, FaultFastPath) and bool(self.source.fault_poll_s)
        if fast or self._read_judged_from >= look.opened_at:
            return look.until
        return look.until + self.ctx.settings.scrape_interval_s

    def _look_due_in(self) -> float | None:
        """Seconds until a look under way ends (None: none under way, or one ended whose faults wait for this
        replica's decision: 0)."""
        try:
            breaker = self.breakers.latest()  # the watch's; a GET only before anything was read (it may fail)
        except (errors.ApiError, errors.TransportError):
            return None  # the cycle reads it again (and says what failed); the wait between cycles goes on
        look = breaker.look
        if look is None:
            return None
        retry = max(0.0, self._look_retry_at - self._monotonic())
        if not look.looking:
            return retry if look.opened_at != self._look_settled else None
        return max(retry, self._look_end_at(breaker, look) - self.ctx.clock())

    def _settle_look_logged(self) -> None:
        if self._monotonic() < self._look_retry_at:
            return
        try:
            self._settle_look()
        except (errors.ApiError, errors.TransportError) as exc:
            self.ctx.metrics.count_api_error(exc)
            self._look_retry_at = self._monotonic() + 1.0
            log.warning("detect: the storm look could not be ended; retried in 1 s", extra={"error": str(exc)})

    def _settle_look(self) -> None:
        """End a look whose time is up (its faults stayed under the threshold: released; the breaker opened:
        held by it); once a look has ended, here or on another replica, the faults it held on this replica's
        nodes are decided again at once."""
        breaker = self.breakers.latest()
        look = breaker.look
        if look is None:
            return
        now = self.ctx.clock()
        if look.looking:
            if now < self._look_end_at(breaker, look):
                return
            opened_at = look.opened_at

            def end(current: safety.CircuitBreaker) -> safety.CircuitBreaker:
                under_way = current.looking
                return current.end_look(now) if under_way is not None and under_way.opened_at == opened_at \
                    else current

            before, breaker = self.breakers.update(end)
            look = breaker.look
            if look is None or look.looking:
                return
            if before.looking is not None and before.looking.opened_at == look.opened_at:
                self._look_ended(look, now)
        self.ctx.metrics.breaker_look_held.set(0.0)
        if look.opened_at == self._look_settled:
            return
        self._look_settled = look.opened_at
        mine = self.ctx.owned_gpu_nodes()
        # Decided again from their last readings; a node this replica has none for (it started, or took the shard
        # over, since) waits for the next read, which decides it as any other (never "unknown" for want of them).
        held = [n for n in mine if name_of(n) in look.node_set and name_of(n) in self.ctx.readings]
        if held:
            by_node = {name_of(n): self.ctx.readings[name_of(n)] for n in held}
            self._check_batch(held, by_node, self.ctx.nodes.gpu_count(), mine)

    def _look_opened(self, look: safety.Look, first: str) -> None:
        log.warning("storm look: new faults are held to see whether the storm passes the breaker's threshold",
                    extra={"reason": look.reason, "held": len(look.nodes),
                           "until_s": round(look.until - look.opened_at, 1)})
        self.ctx.metrics.breaker_looks.inc(outcome="opened")
        text = f"storm look: {look.reason}; held until {_utc(look.until)} (`gpuremediate breaker status`)"
        self.events.node_event(first, "GPURemediationBreakerLook", text, WARNING)
        self._controller_event("GPURemediationBreakerLook", text, WARNING)

    def _look_ended(self, look: safety.Look, now: float) -> None:
        if look.outcome == safety.LOOK_RELEASED:
            text = (f"storm look ended after {now - look.opened_at:.1f}s under the breaker's threshold: the "
                    f"{len(look.nodes)} faults it held go on now")
            log.info(text, extra={"held": len(look.nodes)})
        else:
            text = (f"storm look ended after {now - look.opened_at:.1f}s with the circuit breaker open: the "
                    f"{len(look.nodes)} faults it held stay held, none cordoned")
            log.error(text, extra={"held": len(look.nodes)})
        self.ctx.metrics.breaker_looks.inc(outcome="released" if look.outcome == safety.LOOK_RELEASED
                                           else "breaker-open")
        self.events.node_event(look.nodes[0] if look.nodes else "", "GPURemediationBreakerLookEnded", text,
                               NORMAL if look.outcome == safety.LOOK_RELEASED else WARNING)
        self._controller_event("GPURemediationBreakerLookEnded", text, NORMAL)

    def _notify(self, note: notify.Notification) -> None:
        if self.ctx.writer.notifier is not None and not self.ctx.settings.dry_run:
            self.ctx.writer.notifier.notify(note)  # queued: never waits for the receiver

    def _apply(self, node: Node, decision: decide.Decision) -> Node | None:
        written = self.ctx.writer.apply(node, decision)  # None on a 409: decided again next cycle
        if written is not None and decision.escalation is not None:
            self.ctx.events.node_event(name_of(node), "GPUIsolationEscalated", decision.escalation.message, WARNING)
        cancel = decision.cancel  # a GPU-level flow escalated mid-attempt: its reset or validation Job goes
        if written is not None and cancel is not None and cancel.kind in (ACTION_RESET_GPU, VALIDATE) \
                and not self.ctx.writer.dry_run:
            delete_job(self.ctx.client, cancel.name, self.ctx.settings.jobs_namespace)
        return written

    def _count_fault(self, decision: decide.Decision) -> None:
        move, fault = decision.transition, decision.record.fault
        # A repeat offender's fault is a new occurrence too (its transition reason just says why it is quarantined).
        new_fault = states.is_fault_reason(move.reason) or move.reason == states.REPEAT_OFFENDER if move else False
        if move is not None and fault is not None and new_fault:
            self.ctx.metrics.faults.inc(kind=fault.kind, code=fault.code)

    def _memory_for(self, name: str, record: NodeRecord | None) -> PolicyMemory:
        if name in self.memory:
            return self.memory[name]
        if record is None or not record.policy_memory:
            return PolicyMemory()
        try:
            return PolicyMemory.from_dict(record.policy_memory)
        except PolicyMemoryError as exc:
            log.warning("stored policy memory unreadable; starting fresh", extra={"node": name, "error": str(exc)})
            return PolicyMemory()

    # ---- reporting ---------------------------------------------------------------------------------

    def _why_no_readings(self) -> str:
        if self.source_error:
            return self.source_error
        return f"the {self.ctx.settings.source} source returned nothing for this node"

    def _report_unknown(self, name: str, reason: str) -> None:
        """One Event and one log line per transition into unknown (the Event rate-limited), neither while the
        whole fleet is unknown: the fleet's line says it (10,000 lines per failed read at 20,000 nodes in 4 shards)."""
        if name not in self.unknown:
            (log.debug if self.fleet_unknown else log.warning)("GPU health unknown",
                                                               extra={"node": name, "reason": reason})
            if not self.fleet_unknown and self.events.node_event(
                    name, "GPUHealthUnknown", f"GPU health unknown: {reason}", WARNING, limited=True):
                self.evented_unknown.add(name)
        self.unknown[name] = reason

    def _acted_on_while_unknown(self, name: str) -> None:
        """Metrics still unknown, but a condition is actionable: no longer reported unknown (no "readable
        again" Event either: they are not)."""
        self.unknown.pop(name, None)
        self.evented_unknown.discard(name)

    def _known_again(self, name: str) -> None:
        if self.unknown.pop(name, None) is not None and name in self.evented_unknown:
            self.evented_unknown.discard(name)
            self.events.node_event(name, "GPUHealthKnown", "GPU metrics readable again", NORMAL, limited=True)

    def _fleet_state(self, nodes: Sequence[Node], by_node: dict[str, NodeReadings]) -> None:
        """Most nodes unknown at once is the source's failure, said once on the controller, not per node."""
        unknown = [n for n in map(name_of, nodes) if (r := by_node.get(n)) is None or r.status != SOURCE_OK]
        now_fleet = len(nodes) >= FLEET_MIN_NODES and len(unknown) > len(nodes) * FLEET_UNKNOWN_FRACTION
        self.ctx.metrics.fleet_unknown.set(1.0 if now_fleet else 0.0)  # 1 from start until the first read said
        if now_fleet == self.fleet_unknown:
            return
        self.fleet_unknown = now_fleet
        if now_fleet:
            example = self.source_error or next(
                (r.reason for n in unknown if (r := by_node.get(n)) is not None and r.reason), "no readings")
            message = f"GPU health unknown on {len(unknown)} of {len(nodes)} GPU nodes: {example}"
            log.error(message)
            self._controller_event("GPUHealthUnknownFleet", message, WARNING)
        else:
            log.info("GPU health readable again on most nodes")
            self._controller_event("GPUHealthKnownFleet", "GPU health readable again on most GPU nodes", NORMAL)

    def _controller_event(self, reason: str, message: str, type_: str) -> None:
        pod = own_pod()
        if pod is None or self.ctx.settings.dry_run:
            return  # outside a Pod there is no object of ours to put it on; the log and the metric say it
        namespace, name = pod
        body = pod_event_body(namespace, name, reason, message, type_, self.ctx.clock())
        self.events.submit(lambda: self._create_event(namespace, body))

    def _create_event(self, namespace: str, body: dict[str, Any]) -> None:
        try:
            self.ctx.client.create(EVENTS, body, namespace)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("could not record event", extra={"reason": body["reason"], "error": str(exc)})

    def _report_excluded(self, name: str, findings: Sequence[Finding]) -> None:
        for finding in findings:
            key = (name, finding.fingerprint)
            if key not in self.excluded_seen:
                self.excluded_seen.add(key)
                self.events.node_event(
                    name, "GPUFaultExcludedNode",
                    f"{finding.message} (node labelled gpuremediate.io/exclude=true: not acting)", WARNING,
                )

    def _gauges(self) -> None:
        """Node states of the nodes this replica acts on; the budget of the whole fleet (as the node view
        shows them now, our own writes of this cycle included)."""
        nodes = self.ctx.owned_gpu_nodes()
        counts = dict.fromkeys(states.STATES, 0)
        blocked: dict[str, int] = {}
        isolated = 0
        nic: dict[str, int] = {}
        out: list[tuple[dict[str, str], float]] = []  # per node, for alerts that name them: not healthy only
        for node in nodes:
            state = state_of(node)
            counts[state] = counts.get(state, 0) + 1
            if state != states.HEALTHY:
                out.append(({"node": name_of(node), "state": state}, 1.0))
            record = record_from_node(node)
            if isinstance(record, NodeRecord) and record.blocked is not None:
                blocked[record.blocked.reason] = blocked.get(record.blocked.reason, 0) + 1
            if isinstance(record, NodeRecord) and gpu_held_out(record):
                isolated += 1
            for kind in self._nic_kinds(node):
                nic[kind] = nic.get(kind, 0) + 1
        self.ctx.metrics.isolated_gpus.set(float(isolated))
        found = self.degradation.counts()
        self.ctx.metrics.degradation_gpus.replace_all(({"kind": kind}, float(n)) for kind, n in found.items())
        self.ctx.metrics.nic_nodes.replace_all(({"kind": k}, float(n)) for k, n in nic.items())
        self.ctx.metrics.nodes.replace_all(({"state": s}, float(n)) for s, n in counts.items())
        self._state_counts = counts
        self.ctx.metrics.blocked_nodes.replace_all(({"reason": r}, float(n)) for r, n in blocked.items())
        self.ctx.metrics.unknown_nodes.set(float(len(self.unknown)))
        self.ctx.metrics.node_state.replace_all(out)
        self.ctx.metrics.node_unknown.replace_all(
            [] if self.fleet_unknown else (({"node": n}, 1.0) for n in sorted(self.unknown)))
        fleet, size = self.ctx.nodes.budget_fleet()  # the notable nodes: the others count toward the size only
        views = [safety.node_view(n) for n in fleet]
        self.ctx.metrics.domain_nodes_out.replace_all(
            domains_out(views, self.ctx.policy.defaults.fabric.domain_label))
        cfg = self.ctx.policy.cluster.budget
        budget = safety.Budget(cfg.as_budget_value(), cfg.count_held)
        self.ctx.metrics.budget_in_use.set(float(sum(v.share for v in views if safety.counts_against(v, budget))))
        self.ctx.metrics.budget_limit.set(float(budget.limit(len(views) if size is None else size.nodes)))
        breaker = self.breakers.latest()
        self.ctx.metrics.circuit_breaker_open.set(1.0 if breaker.is_open else 0.0)
        self.ctx.metrics.breaker_look_held.set(float(len(breaker.looking.nodes)) if breaker.looking else 0.0)
        mode = getattr(self.source, "mode", "")  # the Prometheus source: recording rules' output, or raw series
        if isinstance(mode, str) and mode:
            self.ctx.metrics.prometheus_mode.replace_all([({"mode": mode}, 1.0)])
        if self.ctx.shards is not None:
            self._shard_gauges(nodes)

    def _nic_kinds(self, node: Node) -> set[str]:
        """The NIC finding kinds the node has now: its agent's condition's, and node_exporter's judged here."""
        kinds = self.network.kinds(name_of(node))
        from_agent = condition_kind(node)
        return kinds | {from_agent} if from_agent is not None else kinds

    def _shard_gauges(self, nodes: Sequence[Node]) -> None:
        assert self.ctx.shards is not None
        per_shard = dict.fromkeys(self.ctx.shards.owned(), 0)
        for node in nodes:
            index = self.ctx.shards.shard_index(name_of(node))
            if index in per_shard:
                per_shard[index] += 1
        self.ctx.metrics.shards_held.set(float(len(per_shard)))
        self.ctx.metrics.shard_nodes.replace_all(({"shard": str(i)}, float(n)) for i, n in sorted(per_shard.items()))


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _created_after(node: Node, when: float) -> bool:
    """The Node object was created after ``when`` (its creationTimestamp; unknown: False)."""
    stamp = (node.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return False
    try:
        return parse_rfc3339(stamp) > when + 1.0  # whole seconds on the server's clock
    except errors.ConfigError:
        return False


def _read_before_return(readings: NodeReadings, record: NodeRecord | None) -> bool:
    """A read begun before the node's record came back to healthy (a repair faster than one read: the agent's
    condition path) shows the node before its repair: an XID the reboot cleared would open a second flow. Its
    metrics count as unknown for this pass (nothing judged, nothing pruned); the next read tells. With Prometheus
    the time is its evaluation's, so a server clock behind ours delays a new fault's read by that much, never more."""
    return record is not None and record.state == states.HEALTHY and 0.0 < readings.observed_at < record.since


def _isolated_in_flow(record: NodeRecord) -> bool:
    """A GPU-level flow under way: a new fault on the node escalates it (``decide.on_findings``)."""
    return isolated_at_gpu(record) and record.state in states.ACTIVE_STATES


def _name_hold(stored: NodeRecord | None, decision: decide.Decision, held: tuple[str, str] | None,
               now: float) -> decide.Decision:
    """The decision's generic breaker block said as what holds this node (a pause, a domain breaker)."""
    blocked = decision.record.blocked
    if held is None and decision.transition is None and blocked is not None and blocked.reason == safety.BLOCK_PAUSED:
        after = dataclasses.replace(decision.record, blocked=None, held=None)  # resumed, and the fault is gone
        return dataclasses.replace(decision, record=after, changed=after != stored)
    if held is None or decision.transition is not None or blocked is None or blocked.reason != BLOCK_BREAKER:
        return decision
    before = dataclasses.replace(decision.record, blocked=stored.blocked if stored is not None else None)
    after = block(before, *held, now)
    return dataclasses.replace(decision, record=after,
                               changed=after != (stored if stored is not None else decide.fresh_record(after.since)))


def _other_degradation(findings: Sequence[Finding], record: NodeRecord) -> bool:
    """Another degradation finding that acts stands on the node: its cordon stays (lifting it would cordon the
    node again one pass later)."""
    fault = record.fault.fingerprint if record.fault is not None else ""
    return any(f.kind in DEGRADATION_KINDS and f.action != ACTION_NONE and f.fingerprint != fault for f in findings)


def _from_condition(record: NodeRecord) -> bool:
    """The record's fault came from a NodeCondition (current whatever the metrics are); else from the metrics,
    whose absence while they are unknown says nothing (a NIC cordon from node_exporter's series stays)."""
    return record.fault is not None and record.fault.fingerprint.startswith(f"{KIND_CONDITION}:")


def _thermal_cleared(record: NodeRecord, findings: Sequence[Finding]) -> bool:
    """Cordoned for heat (or a fabric state that clears: an NVLink registration stuck, a Fabric Manager down; a NIC
    port the agent judges healthy again), and its rule no longer asks for the cordon (hysteresis, or the fabric's
    grace, inside it; the agent's [network] clear_after_s for a NIC). A finding of that kind asking for more than
    the cordon (a NIC port down past stuck_down_after_s: its reboot) is no clearing: it escalates."""
    kind = record.fault.kind if record.fault is not None else ""
    if record.state != states.CORDONED or kind not in (KIND_THERMAL, *CLEARING_KINDS, *NETWORK_KINDS):
        return False
    return not any(f.kind == kind and f.action != ACTION_NONE for f in findings)



def _hold_ends(memory: PolicyMemory, hold_s: float) -> dict[str, float]:
    """The GPUs running hot within their thermal hold, each with when the hold ends."""
    return {key: min(timer.hot_since + hold_s, MAX_TIMESTAMP) for key, timer in memory.thermal.items()
            if timer.hot_since is not None and timer.cordoned_since is None}


def _actionable(findings: Sequence[Finding]) -> frozenset[str]:
    return frozenset(f.fingerprint for f in findings if f.action != ACTION_NONE)


def _watched(policy_memory: Mapping[str, Any]) -> frozenset[str]:
    """The GPUs running hot within their thermal hold (not cordoned yet), from a record's policy memory."""
    timers = policy_memory.get("thermal") if isinstance(policy_memory, Mapping) else None
    if not isinstance(timers, Mapping):
        return frozenset()
    return frozenset(key for key, timer in timers.items() if isinstance(timer, Mapping) and timer.get("hot_since")
                     is not None and timer.get("cordoned_since") is None)
