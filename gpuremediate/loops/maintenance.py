"""The maintenance loop: MaintenanceRequests (NVSentinel ADR-049 shape) into the node pipeline.

One thread, an informer on the requests, a work queue of request names, a resync every
``settings.resync_s``. Per request:

1. first sight: the finalizer ``gpuremediate.io/maintenance-cleanup``;
2. a bad spec → phase Rejected, condition ``HealthEventEmitted=False/Invalid`` naming the field;
   a missing (or non-GPU) node → ``Invalid``, re-checked every resync;
3. the claim: annotation ``gpuremediate.io/maintenance-request=<name>/<uid>`` on the Node, written
   with the node's resourceVersion (the API server decides a race); a node claimed by another
   live request → ``Blocked``, unless that request has not started (its fault is not in the node's
   record) and this one starts earlier: then the claim is taken over (a startTime in year 9999 held
   its node for ever); a claim whose request is gone (checked with a GET) is taken over;
4. at ``startTime - prepare_lead_s`` (at once without startTime), on a healthy node: the fault
   ``maintenance/<name>/<uid>`` enters the record (healthy → maintenance → draining, cordoned);
   the drain loop drains (within the budget unless ``respect_budget = false``), then the
   recommended action decides: none → held in ``maintenance``; reset/reboot/custom → repairing
   → validating → healthy; quarantine → quarantined for a person;
5. the request's status follows the node record (phase, conditions, preparedAt...);
6. deletion: ``decide.maintenance_request_deleted`` clears the fault, the claim is released, then
   the finalizer goes. Nodes still carrying the fault (or the claim) of a request that no longer
   exists — its finalizer removed by hand — are cleaned up by the resync.

A bad request never crashes the loop: API errors are retried with backoff, anything else is
logged and retried the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpuremediate.actions.events import WARNING
from gpuremediate.actions.maintenance import RequestWriter, claim_of, finalizers_of
from gpuremediate.actions.nodes import Node, is_excluded, name_of, node_unschedulable_of
from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.resources import Resource
from gpuremediate.kube.shards import acting_for
from gpuremediate.kube.workqueue import WorkQueue, run_worker
from gpuremediate.loops.base import LoopContext
from gpuremediate.loops.drain import DRAIN_ACTION
from gpuremediate.loops.drain_scope import drain_scope
from gpuremediate.signals.model import NodeReadings
from gpuremediate.state import decide
from gpuremediate.state import maintenance as mr
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import BUILTIN_ACTIONS
from gpuremediate.vocab.record import NodeRecord, RecordError, record_from_node, start_action

log = logging.getLogger(__name__)

CONFLICT_RETRY_S = 0.2
Obj = dict[str, Any]
Step = tuple[mr.Progress | None, float | None]  # (status to write, seconds until the next reconcile)


def resolve_gpus(entities: tuple[str, ...], readings: NodeReadings | None) -> tuple[str, ...]:
    """GPU keys (as the readings name them) of a request's GPU entities, matched by UUID or index.

    Unknown entities are dropped; none known gives () — the fault is about every GPU, so a drain
    of scope ``impacted`` never misses a pod because an entity could not be matched.
    """
    if readings is None or not entities:
        return ()
    wanted = set(entities)
    return tuple(sorted({g.key for g in readings.gpus if g.uuid in wanted or g.gpu in wanted}))


class MaintenanceLoop:
    name = "maintenance"

    def __init__(self, ctx: LoopContext, res: Resource, *, cancel: Callable[[str, str], None] | None = None) -> None:
        self.ctx = ctx
        self.res = res
        self.informer = Informer(ctx.client, res)
        self.queue = WorkQueue(base_delay=0.5, max_delay=60.0)
        self.requests = RequestWriter(ctx.client, res, ctx.nodes, event_namespace=ctx.settings.event_namespace,
                                      host=ctx.settings.who, dry_run=ctx.settings.dry_run)
        self._cancel = cancel
        self._warned: set[str] = set()  # uids already evented as forgotten (once per process)
        self._thread: threading.Thread | None = None
        self.informer.add_handler(on_add=self._on_request, on_update=lambda _old, new: self._on_request(new),
                                  on_delete=self._on_request)

    @classmethod
    def discover(cls, ctx: LoopContext, *, cancel: Callable[[str, str], None] | None = None,
                 quiet: bool = False) -> MaintenanceLoop | None:
        """The loop when the API server serves MaintenanceRequests in ``--maintenance-group``, else None (said in
        the log unless ``quiet``: the controller asks again while it runs)."""
        api_version = f"{ctx.settings.maintenance_group}/{mr.VERSION}"
        try:
            res = ctx.client.resolve(api_version, mr.KIND, fresh=quiet)  # asked again: what the server says now
        except errors.NotFound:
            if not quiet:
                log.info("maintenance requests disabled until the API server serves MaintenanceRequests (asked "
                         "again every minute)", extra={"api_version": api_version})
            return None
        except (errors.ApiError, errors.TransportError) as exc:
            if not quiet:
                log.warning("maintenance requests disabled: discovery failed (asked again every minute)",
                            extra={"api_version": api_version, "error": str(exc)})
            return None
        return cls(ctx, res, cancel=cancel)

    # ---- wiring -----------------------------------------------------------------------------------------

    def start(self) -> None:
        self.informer.start()
        self._thread = threading.Thread(target=self._run, name="loop-maintenance", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.queue.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
        self.informer.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _on_request(self, obj: Obj) -> None:
        self.queue.add(mr.identity(obj)[0])

    def on_node(self, node: Node) -> None:
        """Node informer handler: queue the requests that name this node or hold its claim."""
        name = name_of(node)
        holder = mr.parse_claim(claim_of(node))
        for obj in self.informer.list():
            if mr.node_name_of(obj) == name or (holder and mr.identity(obj)[0] == holder[0]):
                self.queue.add(mr.identity(obj)[0])

    def resync(self) -> None:
        now = self.ctx.clock()
        requests = self.informer.list()
        for obj in requests:
            self.queue.add(mr.identity(obj)[0])
        self._report_ages(requests, now)
        if self.informer.has_synced():
            self._sweep_orphans(now)

    # ---- the loop ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        if not self.informer.wait_for_sync(60.0):
            log.error("maintenance request cache did not sync; retrying in the loop")
        run_worker(self.queue, self.reconcile, self.ctx.stop, what="maintenance", resync=self.resync,
                   resync_s=self.ctx.settings.resync_s, on_api_error=self.ctx.metrics.count_api_error)

    def reconcile(self, name: str) -> float | None:
        obj = self.informer.get(name)
        if obj is None:
            return None
        node = mr.node_name_of(obj)
        if not self.ctx.owns(node):
            return None  # --shards: the replica holding the shard of the node it names handles the request
        with acting_for(node):  # its writes are fenced by that shard
            return self._reconcile(obj)

    def _reconcile(self, obj: Obj) -> float | None:
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return self._cleanup(obj) if mr.FINALIZER in finalizers_of(obj) else None
        if mr.FINALIZER not in finalizers_of(obj):
            added = self.requests.add_finalizer(obj)
            if added is None:
                return CONFLICT_RETRY_S
            obj = added
            self._write_status(obj, mr.waiting("Initializing", "request seen; checking it"))
        status = obj.get("status") or {}
        if status.get("phase") in mr.TERMINAL_PHASES and not self._still_held(obj):
            return self._release_finished(obj)
        try:
            request = self._checked(mr.parse_request(obj))
        except mr.RequestError as exc:
            self._write_status(obj, mr.rejected(exc))
            return None
        progress, requeue = self._advance(obj, request)
        if progress is not None:
            self._write_status(obj, progress)
        return requeue

    # ---- one request --------------------------------------------------------------------------------------

    def _checked(self, request: mr.Request) -> mr.Request:
        """A CUSTOM action must be one the policy defines (``[actions.<name>]``)."""
        known = getattr(self.ctx.policy.cluster, "actions", None)
        if request.action not in BUILTIN_ACTIONS and known is not None and request.action not in known:
            raise mr.RequestError(f"spec.healthEvent.customRecommendedAction: {request.action!r} is not a custom "
                                  f"action of the policy (no [actions.{request.action}])")
        return request

    def _advance(self, obj: Obj, request: mr.Request) -> Step:
        resync = self.ctx.settings.resync_s
        node = self.ctx.nodes.get(request.node)
        if node is None or not self.ctx.nodes.node_filter(node):
            what = "does not exist" if node is None else "is not a GPU node this controller manages"
            return mr.waiting("Invalid", f"node {request.node} {what}; re-checked every {resync:g}s"), resync
        if is_excluded(node):
            return mr.waiting("Blocked", f"node {request.node} is labelled gpuremediate.io/exclude=true"), resync
        holder = claim_of(node)
        if holder != request.claim and not _finished(record_from_node(node), request):
            if holder and self._request_alive(holder) and not self._yields_to(holder, request, node):
                other = mr.parse_claim(holder)
                who = f"MaintenanceRequest {other[0]} (uid {other[1]})" if other else f"claim {holder!r}"
                return mr.waiting("Blocked", f"node {request.node} is held by {who}; one request per node"), resync
            claimed = self.requests.claim(node, request.claim)
            if claimed is None:
                return mr.waiting("Initializing", "claiming the node (it changed; retrying)"), CONFLICT_RETRY_S
            node = claimed
        record = record_from_node(node)
        if isinstance(record, RecordError):
            return mr.waiting("NodeBusy", f"the node's record is unreadable ({record}); a person decides"), resync
        if record is not None and _knows(record, request):
            return self._follow(obj, request, node, record)
        if (obj.get("status") or {}).get("startedAt"):
            return None, None  # entered before, and the record has forgotten it since: the status stands
        return self._maybe_enter(request, node, record)

    def _maybe_enter(self, request: mr.Request, node: Node, record: NodeRecord | None) -> Step:
        now, resync = self.ctx.clock(), self.ctx.settings.resync_s
        lead = self.ctx.policy.cluster.maintenance.prepare_lead_s
        prepare_at = request.prepare_at(lead)
        if prepare_at is not None and now < prepare_at:
            text = (f"preparation starts at {mr.rfc3339(prepare_at)} (startTime {mr.rfc3339(request.start or 0)} "
                    f"less prepare_lead_s {lead:g}s)")
            return mr.waiting("WaitingForStartTime", text), min(prepare_at - now, resync)
        if record is not None and record.state != states.HEALTHY:
            text = f"node {request.node} is {record.state} ({record.reason}); preparation starts once it is healthy"
            return mr.waiting("NodeBusy", text), resync
        gpus = resolve_gpus(request.gpus, self.ctx.readings.get(request.node))
        fault = mr.fault_for(request, gpus, now)
        entered = decide.enter_maintenance(record, fault, node_unschedulable_of(node), now)
        if self.ctx.writer.apply(node, entered) is None:
            return mr.waiting("Initializing", "entering the pipeline (the node changed; retrying)"), CONFLICT_RETRY_S
        log.info("maintenance request entered the pipeline", extra={"request": request.name, "node": request.node})
        return None, 0.0

    def _follow(self, obj: Obj, request: mr.Request, node: Node, record: NodeRecord) -> Step:
        """The node carries (or has finished) this request's fault: advance it where we own it, report."""
        now = self.ctx.clock()
        ours = record.fault is not None and record.fault.fingerprint == request.fingerprint
        if ours and record.state == states.MAINTENANCE:
            if decide.person_uncordoned(record, node_unschedulable_of(node)):
                if self._apply(node, decide.on_person_uncordoned(record, now)) is None:
                    return None, CONFLICT_RETRY_S
                return None, 0.0
            if not decide.is_maintenance_held(record):
                return self._start(node, record, now)
        status = obj.get("status") or {}
        prepared_at = _time_or(status.get("preparedAt"), record.since if mr.drained_states(request, record) else None)
        started_at = _time_or(status.get("startedAt"), record.fault.first_seen if ours and record.fault else now)
        progress = mr.observe(request, record, prepared_at, started_at)
        if progress.phase in mr.TERMINAL_PHASES and self.requests.release(node, request.claim) is None:
            return None, CONFLICT_RETRY_S  # the phase never runs ahead of the claim: reported once it is released
        return progress, self.ctx.settings.resync_s

    def _start(self, node: Node, record: NodeRecord, now: float) -> Step:
        """Preparation: cordon and hand the node to the drain loop (admitted here when the budget is ignored)."""
        decision = decide.start_maintenance(record, node_unschedulable_of(node), now)
        settings = self.ctx.policy.cluster.maintenance
        if not settings.respect_budget:
            policy = self.ctx.policy_for(node)
            detail = drain_scope(policy, node, decision.record).detail
            decision = dataclasses.replace(decision, record=start_action(decision.record, DRAIN_ACTION, "", 1, now,
                                                                         policy.drain.timeout_s, detail))
        if self._apply(node, decision) is None:
            return None, CONFLICT_RETRY_S
        return None, 0.0

    def _yields_to(self, holder: str, request: mr.Request, node: Node) -> bool:
        """A claim held by a request that has not started (its fault never entered the node's record) yields to
        one that starts earlier; a started one keeps the node until it is done. The claim's write is guarded by
        the node's resourceVersion, as the holder's entering the pipeline is: one of the two wins."""
        parsed = mr.parse_claim(holder)
        obj = self.informer.get(parsed[0]) if parsed is not None else None
        if parsed is None or obj is None or mr.identity(obj)[1] != parsed[1]:
            return False  # not in the cache (yet): it keeps the claim
        try:
            other = mr.parse_request(obj)
        except mr.RequestError:
            return False
        record = record_from_node(node)
        if (isinstance(record, NodeRecord) and _knows(record, other)) or (obj.get("status") or {}).get("startedAt"):
            return False
        if not request.starts_before(other):
            return False
        log.info("maintenance request takes the claim of one that starts later", extra={
            "request": request.name, "node": request.node, "from": other.name})
        return True

    def _apply(self, node: Node, decision: decide.Decision) -> Node | None:
        written = self.ctx.writer.apply(node, decision)
        if written is not None and decision.cancel is not None and self._cancel is not None:
            self._cancel(decision.cancel.kind, decision.cancel.name)
        return written

    def _still_held(self, obj: Obj) -> bool:
        """The node's record still works on this request's fault (held, draining, repairing, validating): a
        terminal phase in the status is not ours (a person wrote it) and must not release the claim; the
        status is rewritten from the record instead."""
        node = self.ctx.nodes.get(mr.node_name_of(obj))
        record = record_from_node(node) if node is not None else None
        if not isinstance(record, NodeRecord) or record.fault is None:
            return False
        name, uid = mr.identity(obj)
        return record.fault.fingerprint == mr.fingerprint(name, uid) and record.state in (
            states.MAINTENANCE, states.DRAINING, states.REPAIRING, states.VALIDATING)

    def _release_finished(self, obj: Obj) -> float | None:
        """A finished request holds no claim (the node is free for the next request)."""
        name, uid = mr.identity(obj)
        node = self.ctx.nodes.get(mr.node_name_of(obj))
        if node is not None and self.requests.release(node, mr.claim_value(name, uid)) is None:
            return CONFLICT_RETRY_S
        return None

    # ---- deletion -----------------------------------------------------------------------------------------

    def _cleanup(self, obj: Obj) -> float | None:
        """The request is being deleted: clear its fault, release the claim, then drop the finalizer."""
        name, uid = mr.identity(obj)
        if not self._end_on_node(mr.node_name_of(obj), name, uid):
            return CONFLICT_RETRY_S
        if self.requests.remove_finalizer(obj) is None:
            return CONFLICT_RETRY_S
        log.info("maintenance request finished; finalizer removed", extra={"request": name})
        return None

    def _end_on_node(self, node_name: str, name: str, uid: str) -> bool:
        """Clear request (name, uid)'s fault and claim on the node; False when a guarded write lost."""
        node = self.ctx.nodes.get(node_name) if node_name else None
        if node is None:
            return True
        record = record_from_node(node)
        if isinstance(record, NodeRecord):
            decision = decide.maintenance_request_deleted(record, mr.fingerprint(name, uid), self.ctx.clock())
            if decision.changed:
                written = self._apply(node, decision)
                if written is None:
                    return False
                node = written
        return self.requests.release(node, mr.claim_value(name, uid)) is not None

    # ---- requests that no longer exist ------------------------------------------------------------------

    def _request_alive(self, claim: str) -> bool:
        """Does the request a claim names exist (same uid)? The cache first, then the API server."""
        parsed = mr.parse_claim(claim)
        if parsed is None:
            return False
        name, uid = parsed
        cached = self.informer.get(name)
        if cached is not None and mr.identity(cached)[1] == uid:
            return True
        try:
            live = self.ctx.client.get(self.res, name)
        except errors.NotFound:
            return False
        return mr.identity(live)[1] == uid

    def _sweep_orphans(self, now: float) -> None:
        """Nodes holding the fault or the claim of a request that is gone (finalizer removed by hand)."""
        for node in self.ctx.owned_gpu_nodes():
            for name, uid in _request_refs(node):
                if not self._request_alive(mr.claim_value(name, uid)):
                    log.warning("maintenance request gone without cleanup; clearing its work",
                                extra={"node": name_of(node), "request": name, "uid": uid})
                    self._end_on_node(name_of(node), name, uid)

    # ---- status and reporting -----------------------------------------------------------------------------

    def _write_status(self, obj: Obj, progress: mr.Progress) -> None:
        old = obj.get("status") or {}
        meta = obj.get("metadata") or {}
        body = mr.status_body(progress, old, int(meta.get("generation") or 0), self.ctx.clock())
        if body != old:
            self.requests.write_status(obj, body)
            if body.get("phase") != old.get("phase"):
                log.info("maintenance request phase", extra={"request": meta.get("name"), "phase": body["phase"]})

    def _report_ages(self, requests: list[Obj], now: float) -> None:
        ages = []
        warn_after = self.ctx.policy.cluster.maintenance.warn_age_s
        for obj in requests:
            created = (obj.get("metadata") or {}).get("creationTimestamp")
            try:
                age = max(0.0, now - mr.parse_time(created, "metadata.creationTimestamp"))
            except mr.RequestError:
                continue
            name, uid = mr.identity(obj)
            ages.append(({"name": name}, age))
            if age > warn_after and uid not in self._warned:
                self._warned.add(uid)
                phase = (obj.get("status") or {}).get("phase", "")
                self.requests.event(obj, "MaintenanceRequestForgotten",
                                    f"MaintenanceRequest {name} is {age / 3600:.1f}h old (phase {phase or 'unknown'}); "
                                    "delete it once the maintenance is over", WARNING)
        self.ctx.metrics.maintenance_request_age.replace_all(ages)


def _knows(record: NodeRecord, request: mr.Request) -> bool:
    """The record carries this request's fault, or has finished it."""
    ours = record.fault is not None and record.fault.fingerprint == request.fingerprint
    return ours or request.fingerprint in record.handled


def _finished(record: NodeRecord | RecordError | None, request: mr.Request) -> bool:
    """The node's record has finished this request's fault: it never claims the node again (the request cache
    may not show the Completed status written a moment ago; a re-claim would hold a node nobody releases)."""
    if not isinstance(record, NodeRecord) or request.fingerprint not in record.handled:
        return False
    return record.fault is None or record.fault.fingerprint != request.fingerprint


def _request_refs(node: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(name, uid) of every request the node refers to: its claim, and an open maintenance fault
    in a state only a live request may keep (held, about to start, draining)."""
    refs: set[tuple[str, str]] = set()
    claim = mr.parse_claim(claim_of(node))
    if claim is not None:
        refs.add(claim)
    record = record_from_node(node)
    if isinstance(record, NodeRecord) and decide.is_maintenance_fault(record.fault) and record.fault is not None:
        parts = record.fault.fingerprint.split("/")
        if len(parts) == 3 and record.state in (states.MAINTENANCE, states.DRAINING):
            refs.add((parts[1], parts[2]))
    return refs


def _time_or(text: object, default: float | None) -> float | None:
    if not text:
        return default
    try:
        return mr.parse_time(text, "status")
    except mr.RequestError:
        return default

