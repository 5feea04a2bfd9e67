"""The detect loop: every scrape interval, readings → findings → transitions for healthy and
cordoned nodes. It owns those two states; the other loops own the rest.

Two sources per node: the metrics (exporter or Prometheus) and the node's NodeConditions (the agent's and
other tools', through the policy's ``[conditions]`` table); ``signals.conditions.merge_node`` puts their
findings in one list, worst first.

Unknown is not unhealthy: a node whose exporter is down, stale or missing is reported (metric,
Event on change, log) and left alone — unless a condition gives an actionable finding (the agent says the
driver hangs): then it is acted on. Either way the metrics' handled fingerprints are not pruned while the
metrics are unknown, so a stale XID does not come back as "new" when the exporter does.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.nodes import Node, is_excluded, name_of, node_unschedulable_of
from gpuremediate.kube import errors
from gpuremediate.kube.resources import EVENTS
from gpuremediate.kube.shards import acting_for
from gpuremediate.loops.base import LoopContext, state_of
from gpuremediate.obs import notify
from gpuremediate.obs.event_queue import EventQueue, own_pod, pod_event_body
from gpuremediate.policy import safety
from gpuremediate.policy.evaluate import PolicyMemory, PolicyMemoryError, evaluate
from gpuremediate.policy.findings import ACTION_CORDON, ACTION_NONE, KIND_THERMAL, Finding
from gpuremediate.signals.conditions import condition_view, merge_node
from gpuremediate.signals.model import SOURCE_OK, NodeReadings
from gpuremediate.signals.sources import FaultFastPath, Source
from gpuremediate.state import decide, states
from gpuremediate.state.record import BLOCK_BREAKER, NodeRecord, RecordError, block, record_from_node

log = logging.getLogger(__name__)

FLEET_MIN_NODES = 5  # below this, every node's unknown is evented on its own
FLEET_UNKNOWN_FRACTION = 0.5  # more than this share unknown at once: one fleet Event instead of per node
BREAKER_DETAIL = "circuit breaker open: no new work"  # decide.on_findings' words for the open breaker


class DetectLoop:
    name = "detect"
    owned = decide.DETECT_STATES

    def __init__(self, ctx: LoopContext, source: Source) -> None:
        self.ctx = ctx
        self.source = source
        self.breakers = ctx.breakers
        self.memory: dict[str, PolicyMemory] = {}
        self.unknown: dict[str, str] = {}  # node -> why its health is unknown
        self.evented_unknown: set[str] = set()  # nodes that got a GPUHealthUnknown Event (they get Known back)
        self.fleet_unknown = False  # most nodes unknown: one Event on the controller, none per node
        self.source_error = ""  # why the last read failed as a whole ("" when it did not)
        # Events are written by a worker: a storm of them never delays detection.
        self.events = EventQueue(ctx.events, ctx.metrics.events_dropped)
        self.excluded_seen: set[tuple[str, str]] = set()
        self.cycles = 0
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._monotonic = time.monotonic  # the fast path's poll clock (a test's own)

    # ---- thread --------------------------------------------------------------------------------------

    def start(self) -> None:
        start_source = getattr(self.source, "start", None)
        if callable(start_source):
            start_source()  # e.g. the exporter source's pod informer, so the first cycle finds it synced
        self._thread = threading.Thread(target=self._run, name="loop-detect", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        stop_source = getattr(self.source, "stop", None)
        if callable(stop_source):
            stop_source()
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
            if self._wake.is_set():
                return

    def _between_cycles(self, deadline: float) -> None:
        """Wait for the next cycle; a source with a fault fast path (``fault_poll_s``) is polled meanwhile: at
        once (a fault that came during the full read waits no poll more), then one poll every ``fault_poll_s``
        from start to start (a poll's own time, at 5,000 nodes mostly Prometheus', is not added to the wait)."""
        poll = self.source.fault_poll_s if isinstance(self.source, FaultFastPath) else None
        next_poll = self._monotonic()
        while (now := self._monotonic()) < deadline and not self._wake.is_set():
            if poll and now >= next_poll:
                next_poll = now + poll
                self._fast_cycle_logged()
            elif self._wake.wait(min(deadline, next_poll) - now if poll else deadline - now):
                return

    def _fast_cycle_logged(self) -> dict[str, NodeReadings]:
        try:
            return self.fast_cycle()
        except Exception as exc:  # the next full cycle reads every node anyway
            log.warning("fault fast path failed; the next cycle reads every node", extra={"error": str(exc)})
            return {}

    def fast_cycle(self) -> dict[str, NodeReadings]:
        """The nodes whose fault series changed since the last read (the source's ``changed_nodes``), read
        and checked at once: a fault is acted on about one poll after Prometheus has it, not one interval.
        Returns the readings it checked."""
        source = self.source
        started = time.monotonic()
        changed = source.changed_nodes() if isinstance(source, FaultFastPath) else set()
        owned = [n for n in self.ctx.owned_gpu_nodes() if name_of(n) in changed] if changed else []
        if not owned or not isinstance(source, FaultFastPath):
            return {}
        asked = time.monotonic()
        by_node = {r.node: r for r in source.read(nodes=sorted(name_of(n) for n in owned))}
        read = time.monotonic()
        fleet = len(self.ctx.nodes.gpu_nodes())
        for node in (n for n in owned if name_of(n) in by_node):
            self._check_guarded(node, by_node[name_of(node)], fleet)
        log.info("fault fast path: changed nodes read and checked", extra={  # rare: only when a fault changes
            "nodes": len(by_node), "fault_query_s": round(asked - started, 3), "read_s": round(read - asked, 3),
            "check_s": round(time.monotonic() - read, 3)})
        return by_node

    # ---- one cycle -----------------------------------------------------------------------------------

    def cycle(self) -> None:
        readings = self._read()
        by_node = {r.node: r for r in readings}
        fleet = self.ctx.nodes.gpu_nodes()
        nodes = self.ctx.owned_gpu_nodes()  # with --shards, only the shards held now; the breaker counts the fleet
        self._forget_others(nodes)
        self.breakers.refresh()  # a person's reset (CLI or annotation) is seen: the watch's, or a GET
        self._fleet_state(nodes, by_node)
        for node in nodes:
            self._check_guarded(node, by_node.get(name_of(node)), len(fleet))
        self._gauges(nodes, fleet)
        self.cycles += 1

    def _check_guarded(self, node: Node, readings: NodeReadings | None, total_nodes: int) -> None:
        """``check_node`` with its writes fenced by the node's shard; one node's API failure is not the fleet's
        (the next cycle retries it)."""
        try:
            with acting_for(name_of(node)):
                self.check_node(node, readings, total_nodes)
        except (errors.ApiError, errors.TransportError) as exc:
            self.ctx.metrics.count_api_error(exc)
            log.warning("detect: node step failed; next cycle retries it",
                        extra={"node": name_of(node), "error": str(exc)})

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

    def _read(self) -> list[NodeReadings]:
        started = time.monotonic()
        source = self.ctx.settings.source
        try:
            readings = self._read_polling()
        except Exception as exc:
            if not self.source_error:
                log.error("reading GPU metrics failed; every node's health is unknown", extra={"error": str(exc)})
            self.source_error = f"reading GPU metrics failed: {exc}"
            self.ctx.metrics.scrape_errors.inc(source=source)
            return []
        finally:
            if getattr(self.source, "observer", None) is None:  # sources with an observer time each scrape
                self.ctx.metrics.scrape_seconds.observe(time.monotonic() - started, source=source)
        if self.source_error:
            log.info("reading GPU metrics works again")
        self.source_error = ""
        return readings

    def _read_polling(self) -> list[NodeReadings]:
        """The full read; with a fault fast path it runs in a thread of its own and this one polls meanwhile
        (at 5,000 nodes a read takes seconds: a fault that came during it is acted on one poll later, not
        after it). A node a poll read is newer than in the full read (asked earlier): its polled readings
        are the cycle's."""
        poll = self.source.fault_poll_s if isinstance(self.source, FaultFastPath) else None
        if not poll:
            return self.source.read()
        outcome: list[list[NodeReadings] | Exception] = []
        done = threading.Event()

        def read() -> None:
            try:
                outcome.append(self.source.read())
            except Exception as exc:  # raised again in the detect thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=read, name="detect-read", daemon=True).start()
        polled: dict[str, NodeReadings] = {}
        next_poll = self._monotonic() + poll
        while not done.wait(max(0.0, next_poll - self._monotonic())):
            next_poll = self._monotonic() + poll
            if not self._wake.is_set():  # stopping: the read is waited for, as it always was
                polled.update(self._fast_cycle_logged())
        result = outcome[0]
        if isinstance(result, Exception):
            raise result
        return [polled.pop(r.node, r) for r in result] + list(polled.values())

    def check_node(self, node: Node, readings: NodeReadings | None, total_nodes: int) -> None:
        name = name_of(node)
        now = self.ctx.clock()
        policy = self.ctx.policy_for(node)
        view = condition_view(node, policy.conditions, now)
        if readings is None or readings.status != SOURCE_OK:
            reason = (readings.reason if readings is not None else self._why_no_readings()) or "unknown"
            verdict = merge_node((), False, reason, view)
            if verdict.unknown:
                self._report_unknown(name, verdict.unknown)
                return
            self._acted_on_while_unknown(name)
            readings = None
        else:
            self._known_again(name)
            self.ctx.readings[name] = readings
        record = record_from_node(node)
        if isinstance(record, RecordError):
            self._apply(node, decide.on_malformed(record, node_unschedulable_of(node), now))
            return
        memory = self._memory_for(name, record)
        metric_findings: Sequence[Finding] = ()
        if readings is not None:
            result = evaluate(readings, policy, memory, now)
            self.memory[name] = memory = result.memory
            metric_findings = result.findings
        verdict = merge_node(metric_findings, readings is not None, "", view)
        if is_excluded(node):
            self._report_excluded(name, verdict.findings)
            return
        if record is not None and record.state not in self.owned:
            return  # another loop owns it; its findings wait until it is back
        self._decide(node, record, verdict.findings, memory, total_nodes, now, metrics_known=verdict.metrics_known)

    def _decide(
        self,
        node: Node,
        record: NodeRecord | None,
        findings: Sequence[Finding],
        memory: PolicyMemory,
        total_nodes: int,
        now: float,
        metrics_known: bool = True,
    ) -> None:
        unschedulable = node_unschedulable_of(node)
        if record is not None and decide.person_uncordoned(record, unschedulable):
            self._apply(node, decide.on_person_uncordoned(record, now))
            return
        # Metrics unknown: only the conditions are current, so only their fingerprints may be forgotten.
        keep = None if metrics_known else decide.keep_metric_fingerprints
        pruned = decide.prune_handled(record, findings, keep) if record is not None else None
        if pruned is not None and _thermal_cleared(pruned, findings):
            decision = decide.thermal_cleared(pruned, now)
        else:
            opts = self._options(node, pruned, findings, total_nodes, now)
            held = self._held(node)
            decision = _name_hold(record, decide.on_findings(pruned, findings, unschedulable, now, opts), held, now)
        if decision.transition is not None or (pruned is not None and pruned != record):
            stored = dataclasses.replace(decision.record, policy_memory=memory.to_dict())
            decision = dataclasses.replace(decision, record=stored, changed=True)
        if self._apply(node, decision) is not None:  # counted once written: a 409 decides (and counts) again
            self._count_fault(decision)

    def _options(
        self, node: Node, record: NodeRecord | None, findings: Sequence[Finding], total_nodes: int, now: float
    ) -> decide.DecideOptions:
        cluster = self.ctx.policy.cluster
        actionable = [f for f in decide.new_findings(record, findings) if f.action != ACTION_NONE]
        if record is not None and record.state == states.CORDONED:
            actionable = [f for f in actionable if f.action != ACTION_CORDON]
        if actionable and cluster.breaker.enabled and self._held(node) is None:  # a held fault counts once let go
            self._trip_breaker(name_of(node), total_nodes, now)
        return decide.DecideOptions(
            repeat_count=cluster.repeat_offender.count,
            repeat_window_s=cluster.repeat_offender.window_s,
            breaker_open=self._held(node) is not None,
        )

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
        return (BLOCK_BREAKER, why) if why else None

    def _trip_breaker(self, name: str, total_nodes: int, now: float) -> None:
        cfg = self.ctx.policy.cluster.breaker
        views = [safety.node_view(n) for n in self.ctx.nodes.gpu_nodes()] if cfg.domain_labels else []

        def with_fault(breaker: safety.CircuitBreaker) -> safety.CircuitBreaker:  # again on a 409 (another shard)
            after = breaker.record_fault(name, now).evaluate(total_nodes, now, cfg.threshold_percent, cfg.window_s,
                                                             cfg.min_nodes)
            return after.evaluate_domains(views, now, cfg.domain_labels, cfg.domain_threshold_percent,
                                          cfg.window_s, cfg.domain_min_nodes) if cfg.domain_labels else after
        before, after = self.breakers.update(with_fault)
        if after.is_open:
            log.error("circuit breaker opened: no new remediation until a person resets it",
                      extra={"reason": after.reason})
            self.events.node_event(name, "GPURemediationBreakerOpen",
                                       f"circuit breaker opened: {after.reason}; run `gpuremediate breaker reset`",
                                       WARNING)
            self._notify(notify.Notification(notify.KIND_BREAKER_OPEN, "", "breaker-open", after.reason, now))
        for trip in after.domains[len(before.domains):]:
            text = (f"domain breaker opened for {trip.label}={trip.value} (the faults' common label): {trip.reason}; "
                    f"no new work there until `gpuremediate breaker reset`")
            log.error("domain breaker opened", extra={"label": trip.label, "value": trip.value, "reason": trip.reason})
            self.events.node_event(name, "GPURemediationDomainBreakerOpen", text, WARNING)
            self._notify(notify.Notification(notify.KIND_BREAKER_OPEN, "", f"{trip.label}={trip.value}", text, now))

    def _notify(self, note: notify.Notification) -> None:
        if self.ctx.writer.notifier is not None and not self.ctx.settings.dry_run:
            self.ctx.writer.notifier.notify(note)  # queued: never waits for the receiver

    def _apply(self, node: Node, decision: decide.Decision) -> Node | None:
        return self.ctx.writer.apply(node, decision)  # None on a 409: decided again next cycle

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
        """One Event per transition into unknown (rate-limited), none while the whole fleet is unknown."""
        if name not in self.unknown:
            log.warning("GPU health unknown", extra={"node": name, "reason": reason})
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
        if now_fleet == self.fleet_unknown:
            return
        self.fleet_unknown = now_fleet
        self.ctx.metrics.fleet_unknown.set(1.0 if now_fleet else 0.0)
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

    def _gauges(self, nodes: Sequence[Node], fleet: Sequence[Node]) -> None:
        """Node states of the nodes this replica acts on; the budget of the whole fleet."""
        counts = dict.fromkeys(states.STATES, 0)
        blocked: dict[str, int] = {}
        for node in nodes:
            state = state_of(node)
            counts[state] = counts.get(state, 0) + 1
            record = record_from_node(node)
            if isinstance(record, NodeRecord) and record.blocked is not None:
                blocked[record.blocked.reason] = blocked.get(record.blocked.reason, 0) + 1
        self.ctx.metrics.nodes.replace_all(({"state": s}, float(n)) for s, n in counts.items())
        self.ctx.metrics.blocked_nodes.replace_all(({"reason": r}, float(n)) for r, n in blocked.items())
        self.ctx.metrics.unknown_nodes.set(float(len(self.unknown)))
        views = [safety.node_view(n) for n in fleet]
        budget = safety.Budget(self.ctx.policy.cluster.budget.as_budget_value())
        self.ctx.metrics.budget_in_use.set(float(sum(1 for v in views if v.out_of_service)))
        self.ctx.metrics.budget_limit.set(float(budget.limit(len(views))))
        self.ctx.metrics.circuit_breaker_open.set(1.0 if self.breakers.latest().is_open else 0.0)
        if self.ctx.shards is not None:
            self._shard_gauges(nodes)

    def _shard_gauges(self, nodes: Sequence[Node]) -> None:
        assert self.ctx.shards is not None
        per_shard = dict.fromkeys(self.ctx.shards.owned(), 0)
        for node in nodes:
            index = self.ctx.shards.shard_index(name_of(node))
            if index in per_shard:
                per_shard[index] += 1
        self.ctx.metrics.shards_held.set(float(len(per_shard)))
        self.ctx.metrics.shard_nodes.replace_all(({"shard": str(i)}, float(n)) for i, n in sorted(per_shard.items()))


def _name_hold(stored: NodeRecord | None, decision: decide.Decision, held: tuple[str, str] | None,
               now: float) -> decide.Decision:
    """The decision's generic breaker block said as what holds this node (a pause, a domain breaker)."""
    blocked = decision.record.blocked
    if held is None and decision.transition is None and blocked is not None and blocked.reason == safety.BLOCK_PAUSED:
        after = dataclasses.replace(decision.record, blocked=None)  # resumed, and the fault is gone
        return dataclasses.replace(decision, record=after, changed=after != stored)
    if held is None or decision.transition is not None or blocked is None or blocked.reason != BLOCK_BREAKER:
        return decision
    before = dataclasses.replace(decision.record, blocked=stored.blocked if stored is not None else None)
    after = block(before, *held, now)
    return dataclasses.replace(decision, record=after,
                               changed=after != (stored if stored is not None else decide.fresh_record(after.since)))


def _thermal_cleared(record: NodeRecord, findings: Sequence[Finding]) -> bool:
    """Cordoned for heat, and the thermal rule no longer asks for the cordon (hysteresis inside it)."""
    if record.state != states.CORDONED or record.fault is None or record.fault.kind != KIND_THERMAL:
        return False
    return not any(f.kind == KIND_THERMAL and f.action == ACTION_CORDON for f in findings)
