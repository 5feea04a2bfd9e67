"""The replay engine: the controller's own loops, on a simulated clock, over a history of metrics.

Nothing here decides anything about a node. Each simulated instant the engine hands readings to
the real ``DetectLoop.check_node`` (policy evaluation, dedupe, ``decide.on_findings``, the thermal
clear, the breaker trip, the excluded / unknown reports) and reconciles the nodes in draining,
repairing and validating with the real ``DrainLoop`` (breaker, budget, admission order, eviction,
timeout), ``RemediateLoop`` (Jobs, attempts, reboot by bootID, repeat offender via decide) and
``ValidateLoop``. They talk to ``ReplayCluster`` instead of an API server. The engine only watches
what they write (transitions, ``blocked``) and the Events they send.

With ``[degradation]`` on in a policy, the detect loop's degradation detector takes every node's readings each
instant (its peers are the fleet's); the engine keeps the stretch of each finding it holds, and the controller's
trend maintenance runs as a dry run, so a trend under ``trend_action = "maintenance"`` says which
MaintenanceRequest it would file and when its drain would start.

With ``[workload]`` on in a policy (the default) the history's failed pods (``History.pods``) go to the detect loop's
own workload signal at their failure time (``WorkloadSignal.seen``, as the controller's Failed pods watch feeds it),
and the detect loop counts them as in the controller; the engine keeps the stretch of each node's
``workload-gpu-errors`` finding.

Time moves in steps of the scrape interval while anything is in flight (a node outside healthy
and quarantined, a thermal timer running, a pod terminating, a Job running, a degradation hold or
clear running); when the fleet is
quiet it jumps to the next change in the history, so a quiet month costs little.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.actions.events import EventRecorder, ObjectRef
from gpuremediate.actions.nodes import NodeView, NodeWriter, gpu_count, is_gpu_node, name_of
from gpuremediate.config import Settings
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import Resource
from gpuremediate.loops.base import LoopContext, NodeLoop
from gpuremediate.loops.detect import DetectLoop
from gpuremediate.loops.drain import DrainLoop
from gpuremediate.loops.remediate import RemediateLoop
from gpuremediate.loops.trend_maintenance import TrendMaintenance, drain_start
from gpuremediate.loops.validate import ValidateLoop
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.policy.conditions import conditions_of
from gpuremediate.policy.config import Policy, PolicyFile
from gpuremediate.policy.degradation import DegradationDetector
from gpuremediate.policy.evaluate import PolicyMemory, evaluate
from gpuremediate.policy.workload import KIND_WORKLOAD
from gpuremediate.replay.cluster import Durations, Node, ReplayCluster, SimClock, replay_node
from gpuremediate.replay.history import Cursor, History, format_time
from gpuremediate.replay.result import (
    BELOW_THRESHOLD,
    BREAKER_HELD,
    EXCLUDED,
    NOTICE,
    UNKNOWN,
    BreakerTrip,
    Maintenance,
    Move,
    ReplayResult,
    Sighting,
    Span,
    Unacted,
    Wait,
)
from gpuremediate.signals.model import SOURCE_OK, NodeReadings
from gpuremediate.signals.nic import NetworkReadings
from gpuremediate.signals.prom_nic import wanted_counters
from gpuremediate.signals.workload import PREFLIGHT
from gpuremediate.state import maintenance as mr
from gpuremediate.vocab import states
from gpuremediate.vocab.degradation import DegradationPolicy
from gpuremediate.vocab.findings import KIND_TREND, NETWORK_KINDS, Finding
from gpuremediate.vocab.record import BLOCK_BREAKER, NodeRecord, RecordError, record_from_node

log = logging.getLogger(__name__)

IN_FLIGHT = frozenset({states.CORDONED, states.DRAINING, states.REPAIRING, states.VALIDATING})
MAX_STEPS_PER_INSTANT = 5  # a loop returning 0.0 ("again now") is reconciled again in the same instant


class ReplayError(ValueError):
    """A replay that cannot be run as asked; the message says why."""


@dataclass
class ReplayOptions:
    step_s: float = 30.0  # the controller's scrape interval
    durations: Durations = field(default_factory=Durations)


class _Source:
    """DetectLoop needs a Source; the engine hands it readings node by node instead, and node_exporter's NIC readings
    as the Prometheus source serves them (``ServesNetwork``: ``network_counters`` None when no policy judges them)."""

    def __init__(self) -> None:
        self.network_counters: tuple[str, ...] | None = None
        self.network_readings: dict[str, NetworkReadings] = {}

    def read(self) -> list[NodeReadings]:
        return []


class _Informer:
    """The informer the NodeView reads: the simulated cluster's nodes."""

    def __init__(self, cluster: ReplayCluster) -> None:
        self.cluster = cluster

    def get(self, name: str, namespace: str | None = None) -> Node | None:
        return self.cluster.nodes.get(name)

    def list(self) -> list[Node]:
        return list(self.cluster.nodes.values())


class _Events(EventRecorder):
    """Keeps the Events the loops send (simulated time), sends nothing."""

    def __init__(self, clock: SimClock) -> None:
        super().__init__(cast(KubeClient, None), host="replay")
        self.clock = clock
        self.sent: list[tuple[float, str, str, str]] = []  # (at, node, reason, message)
        self.objects: list[tuple[float, str, str]] = []  # (at, "Kind namespace/name", reason): pods, their Jobs

    def object_event(self, ref: ObjectRef, reason: str, message: str, type_: str = "Normal") -> None:
        self.objects.append((self.clock(), f"{ref.kind} {ref.namespace}/{ref.name}", reason))

    def node_event(self, node: str, reason: str, message: str, type_: str = "Normal", uid: str = "",
                   **_: Any) -> None:
        self.sent.append((self.clock(), node, reason, message))


class _Immediate:
    """Stands in for the detect loop's EventQueue: writes at once, in the simulated instant, no thread."""

    def __init__(self, recorder: _Events) -> None:
        self.recorder = recorder

    def node_event(self, node: str, reason: str, message: str, type_: str = "Normal", uid: str = "",
                   **_: Any) -> bool:
        self.recorder.node_event(node, reason, message, type_, uid)
        return True

    def submit(self, write: Callable[[], None], **_: Any) -> bool:
        write()
        return True

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def stop(self, timeout: float = 0.0) -> None:
        return None


class _NoRequests:
    """The trend maintenance's view of MaintenanceRequests: a replay starts with none, and files none (dry run)."""

    def has_synced(self) -> bool:
        return True

    def list(self) -> list[dict[str, Any]]:
        return []


class _TrendMaintenance(TrendMaintenance):
    """The controller's trend maintenance as a dry run (it files nothing, says what it would file, once per
    request): the replay keeps each request it would have filed, with the drain's start in the trend window."""

    def __init__(self, client: KubeClient, res: Resource, metrics: ControllerMetrics, policy: PolicyFile,
                 events: _Events, filed: list[Maintenance]) -> None:
        super().__init__(client, res, cast(Informer, _NoRequests()), metrics,
                         lambda node, reason, message, type_: events.node_event(node, reason, message, type_),
                         lambda: policy.cluster.maintenance.prepare_lead_s, dry_run=True)
        self.filed = filed

    def schedule(self, node: str, findings: Sequence[Finding], readings: NodeReadings | None,
                 policy: DegradationPolicy, now: float, served_at: float = 0.0) -> str:
        name = super().schedule(node, findings, readings, policy, now, served_at)
        if name and all(m.name != name for m in self.filed):
            trends = tuple(sorted(f.fingerprint for f in findings if f.kind == KIND_TREND))
            self.filed.append(Maintenance(node, name, now, drain_start(policy, now), trends))
        return name


@dataclass
class _PodRun:
    """A node's GPU failures fed since it last had none that could count (the replay's own bookkeeping)."""

    first: float
    last: float
    pods: int = 0
    found: bool = False  # they made a workload-gpu-errors finding
    peak: int = 0  # the most failures within the window while found


class _NicCursor:
    """Walks the history's node_exporter NIC readings forward: each node's current readings (None: none read)."""

    def __init__(self, history: History) -> None:
        self._events = sorted(((at, node, readings) for node, changes in history.network.items()
                               for at, readings in changes), key=lambda e: (e[0], e[1]))
        self._next = 0
        self.current: dict[str, NetworkReadings | None] = {}
        self.changed_at: dict[str, float] = {}

    def advance(self, now: float) -> set[str]:
        changed = set()
        while self._next < len(self._events) and self._events[self._next][0] <= now:
            at, node, readings = self._events[self._next]
            self.current[node], self.changed_at[node] = readings, at
            changed.add(node)
            self._next += 1
        return changed

    def next_change(self) -> float | None:
        return self._events[self._next][0] if self._next < len(self._events) else None


def _groups(policy: PolicyFile) -> list[Policy]:
    return [policy.defaults, *(g.policy for g in policy.groups)]


def network_counters(policy: PolicyFile) -> tuple[str, ...] | None:
    """The counters node_exporter's NIC readings are judged on, as the detect loop asks its source; None when no
    node group has ``[network] prometheus`` (the readings are then not judged)."""
    return wanted_counters((p.network.enabled and p.network.prometheus, p.network.error_counters)
                           for p in _groups(policy))


def uses_workload(policy: PolicyFile) -> bool:
    """Some node group counts pods failing with GPU errors (``[workload]``, on by default)."""
    return any(p.workload.enabled for p in (policy.defaults, *(g.policy for g in policy.groups)))


def uses_preflight(policy: PolicyFile) -> bool:
    """Some node group reads failed preflights (``[preflight]``, on by default): the pods are fed for them too."""
    return any(p.preflight.enabled for p in (policy.defaults, *(g.policy for g in policy.groups)))


def uses_degradation(policy: PolicyFile) -> bool:
    """Some node group finds slow GPUs, degraded links or trends (``[degradation]``)."""
    return any(p.degradation.enabled or p.degradation.trends for p in (policy.defaults, *(g.policy for g in
                                                                                         policy.groups)))


def degradation_pending(detector: DegradationDetector) -> bool:
    """The detector would change without a new reading: a GPU's hold or clear running (slow-gpu), a link episode
    open or found, a trend window still holding errors. The engine then visits every interval, as the controller
    does; otherwise it may jump to the history's next change (a steady outlier stays one). Its GPU state is the
    detector's own; should it change shape, every interval is visited (slower, never wrong)."""
    now = detector.now
    try:
        for gpu in detector.gpus.values():
            if gpu.found is None and gpu.outlier_since is not None and gpu.last_outlier == now:
                return True  # an outlier counting down its hold
            if gpu.found is not None and gpu.calm_since is not None:
                return True  # calm again, counting down its clear hold
            if any(link is not None and (link.since is not None or link.found is not None)
                   for link in (gpu.pcie, gpu.nvlink)):
                return True
            trends = gpu.trends
            if trends is not None and any(w is not None and w.sum > 0 for w in (trends.sbe, trends.rows)):
                return True
    except AttributeError:
        return True
    return False


def check_supported(policy: PolicyFile) -> None:
    """Custom drains and custom actions run through plugins the replay cannot simulate."""
    refs = policy.custom_action_refs()
    if refs:
        raise ReplayError(f"replay does not simulate custom remediation actions ({refs[0][0]} = {refs[0][1]!r}); "
                          "map them to reset-gpu / reboot / quarantine in a copy of the policy to replay it")
    for group in (policy.defaults, *(g.policy for g in policy.groups)):
        if group.customDrain.enabled:
            raise ReplayError("replay does not simulate a custom drain plugin (customDrain.enabled = true); "
                              "set it to false in a copy of the policy to replay the built-in drain")


def fleet_nodes(history: History, node_list: Sequence[Mapping[str, Any]] | None) -> tuple[list[Node], list[str]]:
    """The GPU nodes to replay, and notes: the Node list's GPU nodes (when given) plus any node the
    history has that the list lacks (made up: no labels, the GPUs its scrapes showed)."""
    notes: list[str] = []
    given = {name_of(n): n for n in node_list or [] if is_gpu_node(n)}
    nodes = [replay_node(n, 0) for n in given.values()]
    extra = [name for name in history.nodes if name not in given]
    if node_list is not None and extra:
        notes.append(f"{len(extra)} node(s) in the history but not in the Node list, replayed without labels: "
                     + ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else ""))
    silent = sorted(set(given) - set(history.nodes))
    if silent:
        notes.append(f"{len(silent)} GPU node(s) of the Node list have no metrics in the history (unknown "
                     "throughout): " + ", ".join(silent[:5]) + (" ..." if len(silent) > 5 else ""))
    nodes += [replay_node({"metadata": {"name": name}}, history.gpus_seen(name) or 1) for name in extra]
    return sorted(nodes, key=name_of), notes


class Replay:
    """One replay of ``history`` under ``policy``; ``run()`` once."""

    def __init__(self, history: History, policy: PolicyFile, node_list: Sequence[Mapping[str, Any]] | None = None,
                 options: ReplayOptions | None = None) -> None:
        check_supported(policy)
        self.history = history
        self.policy = policy
        self.options = options or ReplayOptions()
        if not self.options.step_s > 0 or not math.isfinite(self.options.step_s):
            raise ReplayError(f"--step must be > 0 seconds, got {self.options.step_s}")
        self.clock = SimClock(history.start)
        nodes, notes = fleet_nodes(history, node_list)
        self.cluster = ReplayCluster(nodes, self.clock, self.options.durations, self._on_write,
                                     dra_gpus=gpu_uuids(history) if isolates_gpus(policy) else None)
        self.result = ReplayResult(policy=policy.source, start=history.start, end=history.end,
                                   step_s=self.options.step_s, gpus={name_of(n): gpu_count(n) for n in nodes},
                                   notes=notes, changes=history.change_count())
        self.events = _Events(self.clock)
        self.ctx = self._context()
        self.source = _Source()
        self.detect = DetectLoop(self.ctx, self.source)
        self.detect.workers = 1  # one node at a time: a replay decides the same way every run
        self.loops: list[NodeLoop] = [DrainLoop(self.ctx), RemediateLoop(self.ctx), ValidateLoop(self.ctx)]
        self.cursor = Cursor(history)
        self._moved: set[str] = set()
        self._states: dict[str, str] = {}  # node -> its record's state, where not healthy (kept by _on_write)
        self._waiting: set[str] = set()  # draining, no drain started, blocked (budget, breaker)
        self._version = 0  # bumped whenever what budget admission reads changes (see _parked)
        self._seen_version: dict[str, int] = {}
        self._open_spans: dict[str, tuple[str, float, int | None, str]] = {}  # node -> (state, since, GPUs, fault)
        self._open_waits: dict[str, tuple[str, str, float]] = {}  # node -> (reason, detail, since)
        self._open_unknown: dict[str, tuple[str, float]] = {}  # node -> (reason, since)
        self._hot: dict[tuple[str, str], tuple[float, bool]] = {}  # (node, gpu) -> (hot since, cordon found)
        self._below_seen: set[tuple[str, str, str]] = set()
        self._events_read = 0
        self._excluded_seen: set[tuple[str, str]] = set()
        self._breaker_open = False
        self.detect.events = _Immediate(self.events)  # type: ignore[assignment]  # no worker thread in a replay
        self.degradation = uses_degradation(policy)
        self._open_findings: dict[str, Sighting] = {}  # fingerprint -> the degradation finding, while found
        self.workload = uses_workload(policy) or uses_preflight(policy)
        self.detect.workload_fed = self.workload  # the engine feeds the signal the history's pods, at their time
        self._pods_fed = 0  # history.pods[:_pods_fed] went to the signal
        self._workload_nodes: dict[str, _PodRun] = {}  # node -> its GPU failures fed, while they may count
        self._open_workload: dict[str, Sighting] = {}  # node -> its workload finding, while found
        self._workload_fingerprints: dict[str, str] = {}  # node -> its workload finding's fingerprint ("": none)
        self._workload_cordons: set[str] = set()  # cordoned for workload-gpu-errors (see _ticking)
        self._count_pods(history)
        self._conditions_fed = 0  # history.conditions[:_conditions_fed] are on their Nodes
        self._agent_written: set[tuple[str, str]] = set()  # (node, condition type) the history set
        self._conditions_elsewhere: set[str] = set()  # nodes the history's conditions name, not in the replay
        self._nic = _NicCursor(history)
        self.source.network_counters = network_counters(policy)
        self._nic_window = max((p.network.window_s for p in _groups(policy)), default=0.0)
        if history.network and self.source.network_counters is None:
            self.result.notes.append(f"node_exporter InfiniBand readings for {len(history.network)} node(s) not "
                                     "judged: [network] prometheus is off in every node group")
        res = Resource(self.ctx.settings.maintenance_group, mr.VERSION, "maintenancerequests", mr.KIND, False)
        self.detect.trend_maintenance = _TrendMaintenance(self.ctx.client, res, self.ctx.metrics, policy,
                                                          self.events, self.result.maintenances)

    def _count_pods(self, history: History) -> None:
        gpu = [p for p in history.pods if p.node]
        self.result.failed_pods = len(history.pods)
        self.result.gpu_failed_pods = sum(1 for p in gpu if p.node in self.cluster.nodes)
        elsewhere = sorted({p.node for p in gpu if p.node not in self.cluster.nodes})
        if elsewhere:
            self.result.notes.append(f"failed pods with GPU errors on {len(elsewhere)} node(s) not replayed (no "
                                     "metrics, not in the Node list): " + ", ".join(elsewhere[:5])
                                     + (" ..." if len(elsewhere) > 5 else ""))
        if history.pods and not uses_workload(self.ctx.policy):
            self.result.notes.append(f"{len(history.pods)} failed pod(s) in the history not counted: [workload] "
                                     "is off in every node group")

    def _context(self) -> LoopContext:
        client = cast(KubeClient, self.cluster)  # duck-typed: the calls the loops make
        settings = Settings(scrape_interval_s=self.options.step_s, resync_s=self.options.step_s, source="exporter")
        metrics = ControllerMetrics()
        view = NodeView(cast(Informer, _Informer(self.cluster)))
        writer = NodeWriter(client, view, self.events, metrics)
        breakers = BreakerStore(client, settings.namespace, dry_run=True)  # held in memory, never reset
        return LoopContext(client=client, settings=settings, policy=self.policy, metrics=metrics,
                           events=self.events, nodes=view, writer=writer, breakers=breakers, clock=self.clock)

    # ---- the run ----------------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        started = time.monotonic()
        step, end = self.options.step_s, self.history.end
        now = self.history.start
        visit = set(self.cluster.nodes)  # the first instant sees every node once
        while now <= end:
            self.clock.now = now
            self.cluster.advance()
            changed = self.cursor.advance(now) | self._feed_conditions(now) | self._feed_network(now)
            self._instant(visit | changed | self._ticking() | self._nic_pending(now), changed)
            self.result.steps += 1
            visit, self._moved = self._moved, set()
            now = self._next_instant(now, step, bool(visit))
        self._close(end)
        self.result.seconds = time.monotonic() - started
        return self.result

    def _instant(self, visit: set[str], changed: set[str]) -> None:
        self.detect.breakers.load()
        if self.degradation:
            visit = visit | self._feed_detector()
        if self.workload:
            visit = visit | self._feed_pods()
        self._heartbeat(visit)
        nodes = [node for name in sorted(visit) if (node := self.ctx.nodes.get(name)) is not None]
        readings = {name_of(node): scraped for node in nodes if (scraped := self._scraped_now(name_of(node)))}
        self.detect.check_nodes(nodes, readings)
        if self.degradation:
            self._watch_findings()
        self._note_breaker()
        self._watch_signals(visit, changed)
        for loop in self.loops:
            for name in self._in_states(loop.owned):
                if self._parked(name):
                    continue
                self._seen_version[name] = self._version
                for _ in range(MAX_STEPS_PER_INSTANT):
                    if loop.reconcile_name(name) != 0.0:
                        break
        self._read_events()

    def _feed_conditions(self, now: float) -> set[str]:
        """The history's condition changes due by ``now`` onto their Nodes (as the agent writes them: the transition
        time moves only when the status does); the nodes they changed."""
        changed = set()
        conditions = self.history.conditions
        while self._conditions_fed < len(conditions) and conditions[self._conditions_fed].at <= now:
            change = conditions[self._conditions_fed]
            self._conditions_fed += 1
            node = self.cluster.nodes.get(change.node)
            if node is None:
                self._conditions_elsewhere.add(change.node)
                continue
            before = next((c for c in conditions_of(node) if c.get("type") == change.condition["type"]), None)
            moved = before is None or before.get("status") != change.condition["status"]
            since = format_time(change.at) if moved or before is None else str(before.get("lastTransitionTime") or "")
            self.cluster.set_condition(change.node, {**change.condition, "lastTransitionTime": since,
                                                     "lastHeartbeatTime": format_time(now)})
            self._agent_written.add((change.node, change.condition["type"]))
            changed.add(change.node)
        return changed

    def _feed_network(self, now: float) -> set[str]:
        """node_exporter's NIC readings due by ``now`` into the source, as the Prometheus source's read leaves them:
        only nodes with GPU readings now (a node absent keeps its NIC findings: nothing was read for it); the nodes
        whose NIC readings changed."""
        if self.source.network_counters is None:
            return set()
        changed = self._nic.advance(now)
        ok = {name for name in self._nic.current if (r := self.cursor.readings(name)) is not None
              and r.status == SOURCE_OK}
        self.source.network_readings = {name: r for name, r in self._nic.current.items()
                                        if r is not None and name in ok}
        return changed & set(self.cluster.nodes)

    def _nic_pending(self, now: float) -> set[str]:
        """Nodes whose NIC judgement may change without a new reading: a NIC finding held (its clear hold, the
        stuck-down escalation) or a reading changed within ``[network] window_s`` (a counter rise leaving the
        window). They are judged every interval, as the controller judges every read."""
        if self.source.network_counters is None:
            return set()
        held = {name for name in self._nic.current if self.detect.network.kinds(name)}
        recent = {name for name, at in self._nic.changed_at.items() if now - at <= self._nic_window}
        return (held | recent) & set(self.cluster.nodes)

    def _heartbeat(self, visit: set[str]) -> None:
        """The replayed conditions of the nodes seen now are fresh (the agent keeps writing them), so the policy's
        ``max_age_s`` never drops them as stale."""
        beat = format_time(self.clock())
        for name, ctype in self._agent_written:
            if name in visit:
                for condition in self.cluster.nodes[name].get("status", {}).get("conditions") or []:
                    if isinstance(condition, dict) and condition.get("type") == ctype:
                        condition["lastHeartbeatTime"] = beat

    def _feed_detector(self) -> set[str]:
        """The degradation detector's peers are the fleet's: it takes every node's readings each pass, as in the
        controller (the detect loop's own ``update_degradation``). Only the nodes with a degradation finding, or
        one just gone, are assessed beside those visited anyway (assessing a quiet node decides nothing); the
        assessment feeds them again at the same instant, which changes nothing."""
        nodes = [node for name in sorted(self.cluster.nodes) if (node := self.ctx.nodes.get(name)) is not None]
        scraped_now = {name_of(node): scraped for node in nodes if (scraped := self._scraped_now(name_of(node)))}
        self.detect.update_degradation(nodes, scraped_now)
        found = {name for name in self.cluster.nodes if self.detect.degradation.findings(name)}
        return found | {f.node for f in self._open_findings.values()}

    def _feed_pods(self) -> set[str]:
        """The pods failed by now go to the workload signal (``seen``, as the watch's handlers call it); the nodes
        whose workload finding came, changed or went are assessed now (the others' decisions cannot change)."""
        now, pods = self.clock(), self.history.pods
        preflight: set[str] = set()  # nodes with a failed preflight now: assessed now (issue 46)
        while self._pods_fed < len(pods) and pods[self._pods_fed].at <= now:
            pod = pods[self._pods_fed]
            self._pods_fed += 1
            self.detect.workload.seen(pod.reduced)
            failure, node = pod.failure, self.cluster.nodes.get(pod.node)
            if failure is None or node is None:
                continue
            if failure.how == PREFLIGHT:
                preflight.add(failure.node)
                continue
            rules = self.ctx.policy_for(node).workload
            if rules.enabled and now - failure.at <= rules.window_s:  # it may count (one older never does)
                run = self._workload_nodes.setdefault(failure.node, _PodRun(failure.at, failure.at))
                run.last, run.pods = max(run.last, failure.at), run.pods + 1
        return self._watch_workload(now) | preflight

    def _watch_workload(self, now: float) -> set[str]:
        """Each node's workload finding now (what the detect loop's assessment finds at this instant): its stretch
        as a Sighting (one while the node has the finding, whichever failures make it); the nodes where it came,
        went or changed fingerprint (older failures left the window, newer ones still make it)."""
        moved = set()
        for name in sorted(self._workload_nodes):
            rules = self.ctx.policy_for(self.cluster.nodes[name]).workload
            found = self.detect.workload_findings(name, rules, now)
            fingerprint = found[0].fingerprint if found else ""
            if fingerprint != self._workload_fingerprints.get(name, ""):
                moved.add(name)
            self._workload_fingerprints[name] = fingerprint
            opened, run = self._open_workload.get(name), self._workload_nodes[name]
            if found:
                f, count = found[0], len(self.detect.workload.failures(name, now, rules.window_s))
                if opened is None:
                    self._open_workload[name] = Sighting(name, f.kind, f.code, (), f.action, now, now, f.message)
                elif count > run.peak:
                    self._open_workload[name] = replace(opened, message=f.message)  # the most pods at once
                run.found, run.peak = True, max(run.peak, count)
            elif opened is not None:
                self._close_workload(name, now, ongoing=False)
            if not found and now - run.last > rules.window_s:
                del self._workload_nodes[name]  # its failures are out of the window: nothing more can change
                if not run.found:
                    self._below_min_pods(name, run, rules.min_pods, rules.window_s)
        return moved

    def _below_min_pods(self, name: str, run: _PodRun, min_pods: int, window_s: float) -> None:
        """GPU failures on the node too few or too far apart for a finding: below the policy's threshold."""
        what = "a pod failed with a GPU error" if run.pods == 1 else \
            f"{run.pods} pods failed with GPU errors, never {min_pods} within {window_s:g}s"
        detail = f"{what} ([workload] min_pods {min_pods}, window_s {window_s:g}): no workload-gpu-errors finding"
        self.result.unacted.append(Unacted(name, BELOW_THRESHOLD, detail, run.first, run.last))

    def _close_workload(self, name: str, now: float, *, ongoing: bool) -> None:
        opened = self._open_workload.pop(name)
        self.result.workload_findings.append(replace(opened, end=now, ongoing=ongoing))

    def _scraped_now(self, name: str) -> NodeReadings | None:
        """The node's readings as a scrape at this instant sees them: the exporter serves its last saved scrape
        until the history's next one (the reset sequence waits for readings newer than its restore)."""
        readings = self.cursor.readings(name)
        return None if readings is None else replace(readings, observed_at=self.clock())

    def _in_states(self, owned: frozenset[str]) -> list[str]:
        return sorted(name for name, state in self._states.items() if state in owned)

    def _parked(self, name: str) -> bool:
        """Waiting for the budget or the breaker, and nothing that decides either changed since the drain loop
        last looked (no node changed state or started a drain, the breaker did not move): asking again
        would answer the same. This only saves time; a month of a waiting node is a million admissions."""
        return name in self._waiting and self._seen_version.get(name) == self._version

    def _ticking(self) -> set[str]:
        """Nodes the loops must see every interval: in flight (not parked, not a settled workload cordon), or with a
        thermal timer running."""
        busy = {name for name, state in self._states.items() if state in IN_FLIGHT and not self._parked(name)
                and not (name in self._workload_cordons and name not in self._workload_nodes)}
        return busy | {name for name, memory in self.detect.memory.items() if memory.thermal}

    def _next_instant(self, now: float, step: float, pending: bool) -> float:
        if pending or self._ticking() or self.cluster.busy() or self._workload_nodes or self._nic_pending(now) or (
                self.degradation and degradation_pending(self.detect.degradation)):
            return now + step
        pod = self.history.pods[self._pods_fed].at if self.workload and self._pods_fed < len(self.history.pods) \
            else None
        conditions = self.history.conditions
        condition = conditions[self._conditions_fed].at if self._conditions_fed < len(conditions) else None
        nic = self._nic.next_change() if self.source.network_counters is not None else None
        upcoming = min((t for t in (self.cursor.next_change(), pod, condition, nic) if t is not None), default=None)
        if upcoming is None:
            return self.history.end + step  # nothing more will happen
        start = self.history.start
        here, there = round((now - start) / step), math.ceil((upcoming - start) / step - 1e-9)
        return start + max(here + 1, there) * step

    # ---- what the loops wrote ----------------------------------------------------------------------

    def _on_write(self, before: Node, after: Node) -> None:
        name, now = name_of(after), self.clock()
        old, new = _record(before), _record(after)
        if new is None:
            return
        old_state = old.state if old is not None else states.HEALTHY
        if new.state != old_state or (old is None or old.action is None) != (new.action is None):
            self._version += 1  # a node entered or left service, or a drain started: budgets change
        if new.state == states.DRAINING and new.action is None and new.blocked is not None:
            self._waiting.add(name)
        else:
            self._waiting.discard(name)
        if new.state == states.CORDONED and new.fault is not None and new.fault.kind == KIND_WORKLOAD:
            # Held until a person uncordons it (nobody, in a replay): nothing but a new input (readings, pods, the
            # detector's findings: each makes the node visited) changes its decision, as for a quiet healthy node.
            self._workload_cordons.add(name)
        else:
            self._workload_cordons.discard(name)
        if new.state != states.HEALTHY:
            self._states[name] = new.state
        else:
            self._states.pop(name, None)
        if new.state != old_state:
            self.result.moves.append(Move(now, name, old_state, new.state, new.reason, new.message))
            self._moved.add(name)
        opened = self._open_spans.get(name)
        out = (new.state, _gpus_out(new), _fault_class(new))
        if new.state != old_state or (opened is not None and (opened[0], opened[2], opened[3]) != out):
            self._close_span(name, now)
            if new.state != states.HEALTHY:
                self._open_spans[name] = (new.state, now, out[1], out[2])
        old_block = old.blocked.reason if old is not None and old.blocked is not None else None
        new_block = new.blocked.reason if new.blocked is not None else None
        if new_block != old_block:
            self._close_wait(name, now)
            if new.blocked is not None:
                self._open_waits[name] = (new.blocked.reason, new.blocked.detail, now)

    def _close_span(self, name: str, now: float) -> None:
        opened = self._open_spans.pop(name, None)
        if opened is not None:
            state, since, gpus, fault = opened
            self.result.spans.append(Span(name, state, since, now, gpus=gpus, fault=fault))

    def _close_wait(self, name: str, now: float) -> None:
        opened = self._open_waits.pop(name, None)
        if opened is None:
            return
        reason, detail, since = opened
        self.result.waits.append(Wait(name, reason, detail, since, now))
        if reason == BLOCK_BREAKER:
            self.result.unacted.append(Unacted(name, BREAKER_HELD, detail, since, now))

    def _read_events(self) -> None:
        """What the loops reported: notices (the writer's Events), and the detect loop's own bookkeeping of
        unknown nodes, excluded faults and the breaker (its Events go through a rate-limited queue)."""
        for at, node, reason, message in self.events.sent[self._events_read:]:
            if reason == "GPUFaultNotice":
                self.result.unacted.append(Unacted(node, NOTICE, message, at, at))
        self._events_read = len(self.events.sent)
        now = self.clock()
        for node, why in sorted(self.detect.unknown.items()):
            if self._open_unknown.get(node, ("", 0.0))[0] != why:
                self._close_unknown(node, now)
                self._open_unknown[node] = (why, now)
        for node in [n for n in self._open_unknown if n not in self.detect.unknown]:
            self._close_unknown(node, now)
        for node, fingerprint in sorted(self.detect.excluded_seen - self._excluded_seen):
            detail = f"fault {fingerprint} on a node labelled gpuremediate.io/exclude=true: not acted on"
            self.result.unacted.append(Unacted(node, EXCLUDED, detail, now, now))
        self._excluded_seen = set(self.detect.excluded_seen)

    def _note_breaker(self) -> None:
        """A trip is what the detect loop saved into the breaker store (its Event goes through a queue)."""
        breaker = self.detect.breakers.latest()
        if breaker.is_open == self._breaker_open:
            return
        self._version += 1
        if breaker.is_open:
            node = breaker.faults[-1][0] if breaker.faults else ""
            self.result.trips.append(BreakerTrip(breaker.opened_at or self.clock(), node, breaker.reason))
        self._breaker_open = breaker.is_open

    def _close_unknown(self, node: str, now: float) -> None:
        opened = self._open_unknown.pop(node, None)
        if opened is not None:
            self.result.unacted.append(Unacted(node, UNKNOWN, opened[0], opened[1], now))

    def _watch_findings(self) -> None:
        """The detector's degradation findings now, node by node: each one's stretch (by fingerprint)."""
        now, found = self.clock(), set()
        for name in sorted(self.cluster.nodes):
            for f in self.detect.degradation.findings(name):
                found.add(f.fingerprint)
                if f.fingerprint not in self._open_findings:
                    self._open_findings[f.fingerprint] = Sighting(name, f.kind, f.code, tuple(f.gpus), f.action, now,
                                                                  now, f.message)
        for fingerprint in [fp for fp in self._open_findings if fp not in found]:
            self._close_finding(fingerprint, now, ongoing=False)

    def _close_finding(self, fingerprint: str, now: float, *, ongoing: bool) -> None:
        opened = self._open_findings.pop(fingerprint)
        self.result.findings.append(replace(opened, end=now, ongoing=ongoing))

    def _close(self, end: float) -> None:
        if self._conditions_elsewhere:
            names = sorted(self._conditions_elsewhere)
            self.result.notes.append(f"node conditions for {len(names)} node(s) not replayed (no metrics, not in the "
                                     "Node list): " + ", ".join(names[:5]) + (" ..." if len(names) > 5 else ""))
        for fingerprint in list(self._open_findings):
            self._close_finding(fingerprint, end, ongoing=True)
        self.result.findings.sort(key=lambda f: (f.start, f.node, f.kind, f.gpus))
        for name in list(self._open_workload):
            self._close_workload(name, end, ongoing=True)
        self.result.workload_findings.sort(key=lambda f: (f.start, f.node))
        for name in list(self._open_spans):
            self._close_span(name, end)
        for name in list(self._open_waits):
            self._close_wait(name, end)
        for name in list(self._open_unknown):
            self._close_unknown(name, end)
        self.result.unacted.sort(key=lambda u: (u.start, u.node, u.category))
        self.result.spans.sort(key=lambda s: (s.node, s.start))
        self.result.waits.sort(key=lambda w: (w.start, w.node))

    # ---- raw signals the policy did not count --------------------------------------------------------

    def _watch_signals(self, visit: set[str], changed: set[str]) -> None:
        for name in sorted(changed):
            readings = self.cursor.readings(name)
            node = self.cluster.nodes.get(name)
            if readings is not None and readings.status == SOURCE_OK and node is not None:
                self._below_threshold(node, readings)
        for name in sorted(visit | changed):
            self._thermal_episodes(name)

    def _below_threshold(self, node: Node, readings: NodeReadings) -> None:
        """A fault signal in the raw readings that the policy turns into no finding (a threshold, a rule
        switched off). The policy's own evaluate says which; thermal runs are followed separately."""
        policy = self.ctx.policy_for(node)
        found = {(gpu, f.kind) for f in evaluate(readings, policy, PolicyMemory(), self.clock()).findings
                 for gpu in f.gpus}
        for gpu in readings.gpus:
            for kind, value in _raw_signals(gpu):
                if (gpu.key, kind) in found:
                    continue
                key = (name_of(node), gpu.key, f"{kind}={value:g}")
                if key not in self._below_seen:
                    self._below_seen.add(key)
                    detail = f"GPU {gpu.key}: {kind}={value:g}, no finding under the policy (threshold or rule off)"
                    self.result.unacted.append(Unacted(name_of(node), BELOW_THRESHOLD, detail, self.clock(),
                                                       self.clock()))

    def _thermal_episodes(self, name: str) -> None:
        """A GPU that ran hot (its thermal timer started) and cooled before the cordon: below threshold."""
        now, memory = self.clock(), self.detect.memory.get(name)
        timers = memory.thermal if memory is not None else {}
        for key, timer in timers.items():
            since, cordoned = self._hot.get((name, key), (timer.hot_since or now, False))
            self._hot[(name, key)] = (since, cordoned or timer.cordoned_since is not None)
        for (node, key), (since, cordoned) in list(self._hot.items()):
            if node == name and key not in timers:
                del self._hot[(node, key)]
                if not cordoned:
                    detail = (f"GPU {key} ran hot from {format_time(since)}, cooled before the policy's hold time: "
                              "no cordon")
                    self.result.unacted.append(Unacted(node, BELOW_THRESHOLD, detail, since, now))


_RAW_FIELDS = (("xid", "xid"), ("ecc_dbe_volatile", "ecc-dbe"), ("row_remap_failure", "row-remap-failure"),
               ("row_remap_pending", "row-remap-pending"), ("uncorrectable_remapped_rows", "uncorrectable-rows"))


def _raw_signals(gpu: Any) -> list[tuple[str, float]]:
    found = []
    for attr, kind in _RAW_FIELDS:
        value = getattr(gpu, attr)
        if value is not None and value > 0:
            found.append((kind, float(value)))
    found += [("xid", float(code)) for code, count in gpu.xid_counts.items() if count > 0]
    return found


def isolates_gpus(policy: PolicyFile) -> bool:
    """Some node group isolates single GPUs: the replay's cluster then serves DRA (``replay.dra``)."""
    return any(group.isolation.gpu_level for group in (policy.defaults, *(g.policy for g in policy.groups)))


def gpu_uuids(history: History) -> dict[str, list[str]]:
    """Each node's GPU UUIDs by index, as its scrapes name them (what its DRA driver would publish)."""
    found: dict[str, dict[int, str]] = {}
    for node, changes in history.changes.items():
        by_index = found.setdefault(node, {})
        for change in changes:
            for gpu in change.readings.gpus:
                if gpu.uuid and gpu.gpu.isdigit():
                    by_index.setdefault(int(gpu.gpu), gpu.uuid)
    return {node: [uuids[i] for i in sorted(uuids)] for node, uuids in found.items()}


def _gpus_out(record: NodeRecord) -> int | None:
    """GPUs out of service while the record's flow lasts: the isolated GPU, or None for the whole node."""
    isolation = record.isolation
    return 1 if isolation is not None and isolation.at_gpu else None


def _fault_class(record: NodeRecord) -> str:
    """What opened the flow, for the GPU-hours by fault: ``xid 48``, ``ecc-dbe``, ``thermal``, ``nic-down mlx5_3``
    ..."""
    fault = record.fault
    if fault is None:
        return record.reason
    named = fault.kind == "xid" or fault.kind in NETWORK_KINDS  # xid 48; nic-down mlx5_3 (as status names it)
    return f"{fault.kind} {fault.code}" if fault.code and named else fault.kind


def _record(node: Node) -> NodeRecord | None:
    record = record_from_node(node)
    return None if isinstance(record, RecordError) else record


def replay(history: History, policy: PolicyFile, node_list: Sequence[Mapping[str, Any]] | None = None,
           options: ReplayOptions | None = None) -> ReplayResult:
    return Replay(history, policy, node_list, options).run()
