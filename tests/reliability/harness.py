"""What the reliability tests share: a recorder hooked into the API emulator, the invariant checker,
and the controllers they start and kill.

The recorder sees every change of a Node or Job *at the moment the emulator stores it* (the store's
listeners run under its lock, in the request's thread) together with the user whose request made
it, and every eviction at the moment the request arrives together with the node's record then.
The checker replays that log in resourceVersion order in its own thread (every 50 ms), so no
intermediate state escapes it, however briefly it lasted.

Invariants (``Checker``; each violation names its code):

``budget-slots``
    The nodes holding a budget slot never exceed the limit. A node holds a slot while the
    controller works on it after admission: ``draining`` with the drain started (``action.kind ==
    "drain"``), ``repairing`` or ``validating``. A node a person released from quarantine
    (``gpuremediate release``) goes to ``validating`` without admission — it was out of service
    already — and holds no slot for this count.
``budget-admission``
    When a node's drain starts, the *other* nodes out of service (``policy.safety.node_view``
    semantics: NotReady, unschedulable for any reason — a person's cordon included — or in
    draining/repairing/validating, except a node cordoned at once that waits for the budget)
    number fewer than the limit. Only nodes out of service for at least ``SETTLE_S`` before the
    drain started count: the controller cannot see a change that happened a moment ago (its
    informer lags) and cordons for fatal faults are immediate by design (design §4), so a node
    cordoned at the same moment as another's admission is not a violation.
``cordon-explained``
    A node whose ``spec.unschedulable`` was last set to true by the controller carries a readable
    record, not ``healthy``, with ``cordoned_by_us`` — for as long as the cordon stays — or, when its
    annotations are full (no record fits), no record and the ``gpuremediate.io/record-refused`` label.
``person-cordon-kept``
    The controller never sets ``spec.unschedulable`` back to false when a person (or anyone other
    than the controller) set it to true. ``person-cordon-removed-stale-record`` is the case where
    the record already (wrongly) claimed ``cordoned_by_us`` when the person cordoned (a known bug).
``eviction-without-fault``
    At the moment an eviction from the controller arrives, the pod's node has a record with an
    open fault whose drain has started (draining with the drain action, or a later state of the
    flow: repairing, validating, quarantined). Record first, then evict. Tolerated: a person
    uncordoned that node within ``PERSON_RACE_S`` before (a drain step in flight when the person
    took the node back). Evicting a DaemonSet pod is always a violation.
``job-twice`` / ``job-unrecorded``
    A Job the controller creates is created at most once (no second ADDED of the same name,
    across controller restarts too; at most one name per (kind, node, fingerprint, attempt)); and
    at that moment the node's record names it as the action in progress (record first, then Job).
    ``job-recreated-after-own-delete`` is the ``job-twice`` case where the controller itself had
    deleted that Job before (a timed-out attempt re-created under its name; each validation run and
    each attempt now has its own name, so this names a regression).

``cr-twice``
    A custom resource (a remediation CR, a DrainRequest: any kind served from a CRD) the controller
    creates is created at most once per name, across restarts too. ``cr-recreated-after-delete`` is
    the case where it had been deleted in between (by a person: that attempt failed, it is not re-run).
``write-after-renew-deadline``
    With leader election, no mutating request of a controller reaches the API server later than its
    last successful Lease write (acquire or renew, as the server stored it) plus the renew deadline
    plus ``FENCE_SLACK_S`` (a write that passed the fence just before the deadline is still on its
    way), nor before its first acquisition or after it released the Lease. Its own Lease calls are
    exempt.

A controller is killed by revoking its bearer token (nothing it sends afterwards reaches the API
server — a dead process) and stopping its threads; the next one gets a fresh token and user, so
the audit tells the instances apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuremediate.actions.held import held_by_us
from gpuremediate.actions.jobs import FAULT_ANNOTATION, JOB_LABEL, NODE_LABEL
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import LEASES, Resource
from gpuremediate.policy import safety
from gpuremediate.policy.config import PolicyFile, loads_policy
from gpuremediate.shutdown import Shutdown
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, RecordError, node_unschedulable, record_from_node
from sim.cluster import EXPORTER_NAMESPACE, SimCluster
from sim.kubeapi import KubeAPIServer

CONTROLLER_USER_PREFIX = "gpuremediate-controller-"
PERSON_USER = "alice"
PERSON_TOKEN = "person-token"
SETTLE_S = 1.0
PERSON_RACE_S = 2.0
LEASE_S, RENEW_DEADLINE_S, RETRY_S = 3.0, 2.0, 0.4  # leader election in these tests
FENCE_SLACK_S = 1.0
MUTATING_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
SLOT_STATES = frozenset({states.REPAIRING, states.VALIDATING})
DRAIN_STARTED_STATES = frozenset({states.REPAIRING, states.VALIDATING, states.QUARANTINED})

Obj = dict[str, Any]


def is_controller(user: str | None) -> bool:
    return bool(user) and str(user).startswith(CONTROLLER_USER_PREFIX)


def reliability_policy(max_unavailable: int) -> PolicyFile:
    """Short timers everywhere, so a whole flow (and its timeouts) fits in a few seconds."""
    return loads_policy(f"""
[thermal]
hold_s = 0.3
clear_hold_s = 0.5
[drain]
retry_s = 0.2
timeout_s = 4
[remediation]
max_attempts = 2
reboot_ready_timeout_s = 3
[remediation.reset_gpu]
timeout_s = 2
[remediation.reboot]
timeout_s = 2
[validation.job]
timeout_s = 2
[budget]
max_unavailable = "{max_unavailable}"
[breaker]
enabled = false
""", "reliability-policy")


def reliability_settings(cluster: SimCluster, leader_elect: bool = False) -> Settings:
    return Settings(
        leader_elect=leader_elect,
        lease_duration_s=LEASE_S,
        renew_deadline_s=RENEW_DEADLINE_S,
        retry_period_s=RETRY_S,
        metrics_host="127.0.0.1",
        metrics_port=0,
        scrape_interval_s=0.2,
        resync_s=0.3,
        scrape_timeout_s=1.0,
        exporter_namespace=EXPORTER_NAMESPACE,
        exporter_port=cluster.exporter_port,
        identity="reliability",
    )


# ---- the recorder ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NodeChange:
    rv: int
    at: float
    user: str
    name: str
    prev: Obj | None
    obj: Obj


@dataclasses.dataclass(frozen=True)
class JobEvent:
    """A Job stored for the first time (ADDED) or removed (``deleted``)."""

    rv: int
    at: float
    user: str
    name: str
    kind: str
    node: str
    fingerprint: str
    record: NodeRecord | RecordError | None  # the node's record when the Job was stored
    deleted: bool = False


@dataclasses.dataclass(frozen=True)
class Eviction:
    at: float
    user: str
    namespace: str
    pod: str
    node: str
    daemonset: bool
    record: NodeRecord | RecordError | None  # the node's record when the request arrived


@dataclasses.dataclass(frozen=True)
class Created:
    """A custom resource stored for the first time (ADDED) or removed (``deleted``)."""

    rv: int
    at: float
    user: str
    key: str
    namespace: str
    name: str
    deleted: bool = False


@dataclasses.dataclass(frozen=True)
class LeaseWrite:
    """A Lease stored: by whom, and whom it names as holder (empty: released)."""

    at: float
    user: str
    holder: str


@dataclasses.dataclass(frozen=True)
class Audit:
    at: float
    user: str
    verb: str
    resource: str
    subresource: str
    namespace: str | None
    name: str | None


class Recorder:
    """Hooks into one emulator: every node change, Job creation and eviction, with its user."""

    def __init__(self, api: KubeAPIServer) -> None:
        self.api = api
        self.nodes_key = api.type_for("", "nodes").key
        self.jobs_key = api.type_for("batch", "jobs").key
        self.pods_key = api.type_for("", "pods").key
        self.leases_key = api.type_for("coordination.k8s.io", "leases").key
        self.builtin_keys = {rt.key for rt in list(api.types.values())}  # a later key is a CRD's
        self.lock = threading.Lock()
        self.node_changes: list[NodeChange] = []
        self.jobs: list[JobEvent] = []
        self.created: list[Created] = []
        self.lease_writes: list[LeaseWrite] = []
        self.evictions: list[Eviction] = []
        self.audit: list[Audit] = []
        self._user = threading.local()
        self._original_audit = api._audit

    def install(self) -> Recorder:
        self.api.store.listeners.append(self._on_store_event)
        self.api._audit = self._on_audit  # type: ignore[method-assign]
        return self

    def _current_user(self) -> str:
        return str(getattr(self._user, "name", "") or "system")

    def _on_audit(self, req: Any, verb: str, group: str, resource: str, sub: str, ns: str | None,
                  name: str | None) -> None:
        self._original_audit(req, verb, group, resource, sub, ns, name)
        user = str(req.user)
        self._user.name = user  # the store events this request causes run in this thread
        entry = Audit(time.monotonic(), user, verb, resource, sub, ns, name)
        with self.lock:
            self.audit.append(entry)
        if verb == "create" and resource == "pods" and sub == "eviction" and ns and name:
            self._on_eviction(user, ns, name)

    def _on_eviction(self, user: str, namespace: str, name: str) -> None:
        pod = self.api.store.get(self.pods_key, namespace, name)
        node_name = str(((pod or {}).get("spec") or {}).get("nodeName", ""))
        owners = ((pod or {}).get("metadata") or {}).get("ownerReferences") or []
        node = self.api.store.get(self.nodes_key, "", node_name) if node_name else None
        record = record_from_node(node) if node is not None else None
        entry = Eviction(time.monotonic(), user, namespace, name, node_name,
                         any(o.get("kind") == "DaemonSet" for o in owners), record)
        with self.lock:
            self.evictions.append(entry)

    def _on_store_event(self, event: Any) -> None:  # under the store's lock
        if event.key == self.nodes_key and event.type != "DELETED":
            change = NodeChange(event.rv, time.monotonic(), self._current_user(), event.obj["metadata"]["name"],
                                event.prev, event.obj)
            with self.lock:
                self.node_changes.append(change)
        elif event.key == self.jobs_key and event.type in ("ADDED", "DELETED"):
            self._on_job(event)
        elif event.key == self.leases_key and event.type != "DELETED":
            holder = str((event.obj.get("spec") or {}).get("holderIdentity") or "")
            with self.lock:
                self.lease_writes.append(LeaseWrite(time.monotonic(), self._current_user(), holder))
        elif event.key not in self.builtin_keys and event.type in ("ADDED", "DELETED"):
            meta = event.obj["metadata"]
            entry = Created(event.rv, time.monotonic(), self._current_user(), event.key,
                            str(meta.get("namespace") or ""), str(meta["name"]), event.type == "DELETED")
            with self.lock:
                self.created.append(entry)

    def _on_job(self, event: Any) -> None:
        meta = event.obj["metadata"]
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        node_name = str(labels.get(NODE_LABEL, ""))
        node = self.api.store.get(self.nodes_key, "", node_name) if node_name else None
        job = JobEvent(event.rv, time.monotonic(), self._current_user(), meta["name"], str(labels.get(JOB_LABEL, "")),
                         node_name, str(annotations.get(FAULT_ANNOTATION, "")),
                         record_from_node(node) if node is not None else None, event.type == "DELETED")
        with self.lock:
            self.jobs.append(job)

    def tail_audit(self, count: int) -> list[Audit]:
        with self.lock:
            interesting = [a for a in self.audit if a.user != "kubernetes-admin" and a.verb not in ("watch",)]
        return interesting[-count:]


# ---- the checker ----------------------------------------------------------------------------------


@dataclasses.dataclass
class NodeTrack:
    obj: Obj
    out_since: float | None = None  # monotonic time it went out of service (node_view semantics)
    cordoned_by: str | None = None  # user who last set spec.unschedulable true
    released: bool = False  # a person released it from quarantine; in validating without admission
    cordon_over_stale_record: bool = False  # cordoned by someone else while the record said cordoned_by_us
    person_uncordons: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Violation:
    code: str
    at: float
    text: str


def in_slot(record: NodeRecord | RecordError | None) -> bool:
    if not isinstance(record, NodeRecord):
        return False
    if record.state in SLOT_STATES:
        return True
    return record.state == states.DRAINING and record.action is not None and record.action.kind == "drain"


def drain_started(record: NodeRecord | RecordError | None) -> bool:
    if not isinstance(record, NodeRecord) or record.fault is None:
        return False
    return in_slot(record) or record.state in DRAIN_STARTED_STATES


class Checker:
    """Replays the recorder's log and checks the invariants after every single change."""

    def __init__(self, recorder: Recorder, limit: int, initial_nodes: list[Obj], *,
                 renew_deadline: float | None = None) -> None:
        """``renew_deadline``: the controllers run leader election with it (the fence is checked)."""
        self.recorder = recorder
        self.limit = limit
        self.renew_deadline = renew_deadline
        self.nodes: dict[str, NodeTrack] = {}
        for node in initial_nodes:
            self.nodes[node["metadata"]["name"]] = NodeTrack(obj=node)
        self.violations: list[Violation] = []
        self.changes_seen = 0
        self._node_pos = self._job_pos = self._evict_pos = self._created_pos = 0
        self._lease_pos = self._audit_pos = 0
        self._cr_names: dict[tuple[str, str, str], int] = {}
        self._cr_deleted_by: dict[tuple[str, str, str], str] = {}
        self._renewed: dict[str, float | None] = {}  # user -> last Lease write naming a holder (None: released)
        self._job_names: dict[str, int] = {}
        self._deleted_by: dict[str, str] = {}
        self._attempt_names: dict[tuple[str, str, str, str], set[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="invariant-checker", daemon=True)

    def start(self) -> Checker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.process()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.process()

    def process(self) -> None:
        with self._lock:
            with self.recorder.lock:
                changes = self.recorder.node_changes[self._node_pos:]
                jobs = self.recorder.jobs[self._job_pos:]
                evictions = self.recorder.evictions[self._evict_pos:]
                created = self.recorder.created[self._created_pos:]
                leases = self.recorder.lease_writes[self._lease_pos:]
                audit = self.recorder.audit[self._audit_pos:]
            self._node_pos += len(changes)
            self._job_pos += len(jobs)
            self._evict_pos += len(evictions)
            self._created_pos += len(created)
            self._lease_pos += len(leases)
            self._audit_pos += len(audit)
            for change in changes:
                self._node_change(change)
            for job in jobs:
                self._job(job)
            for eviction in evictions:
                self._eviction(eviction)
            for entry in created:
                self._created(entry)
            if self.renew_deadline is not None:
                self._fence(leases, audit, self.renew_deadline)

    def _violate(self, code: str, at: float, text: str) -> None:
        self.violations.append(Violation(code, at, text))

    # ---- nodes ----------------------------------------------------------------------------------

    def _node_change(self, change: NodeChange) -> None:
        self.changes_seen += 1
        track = self.nodes.setdefault(change.name, NodeTrack(obj=change.prev or change.obj))
        before, after = change.prev or track.obj, change.obj
        track.obj = after
        self._cordon_flip(change, track, node_unschedulable(before), node_unschedulable(after))
        record_before, record_after = record_from_node(before), record_from_node(after)
        self._release(change, track, record_before, record_after)
        out = safety.node_view(after).out_of_service
        if not out:
            track.out_since = None
        elif track.out_since is None:
            track.out_since = change.at
        if not node_unschedulable(after) or not is_controller(track.cordoned_by):
            pass
        elif record_after is None and held_by_us(after):
            pass  # held: the label says why (actions/held.py)
        elif (not isinstance(record_after, NodeRecord) or record_after.state == states.HEALTHY
              or not record_after.cordoned_by_us):
            self._violate("cordon-explained", change.at,
                          f"{change.name} cordoned by {track.cordoned_by} but its record is {_brief(record_after)} "
                          f"(rv {change.rv}, written by {change.user})")
        self._budget(change, track, record_before, record_after)

    def _cordon_flip(self, change: NodeChange, track: NodeTrack, before: bool, after: bool) -> None:
        if after and not before:
            track.cordoned_by = change.user
            record = record_from_node(change.obj)
            track.cordon_over_stale_record = isinstance(record, NodeRecord) and record.cordoned_by_us
        elif before and not after:
            if is_controller(change.user) and not is_controller(track.cordoned_by):
                # Known bug: the record still claimed our cordon (a person's uncordon of a quarantined
                # node goes unnoticed) when the person cordoned; see test_regressions.py.
                stale = track.cordon_over_stale_record and not is_controller(track.cordoned_by)
                self._violate("person-cordon-removed-stale-record" if stale else "person-cordon-kept", change.at,
                              f"{change.user} uncordoned {change.name}, cordoned by {track.cordoned_by} "
                              f"(rv {change.rv}); record now {_brief(record_from_node(change.obj))}")
            if change.user == PERSON_USER:
                track.person_uncordons.append(change.at)
            track.cordoned_by = None

    def _release(self, change: NodeChange, track: NodeTrack, before: Any, after: Any) -> None:
        if (change.user == PERSON_USER and isinstance(before, NodeRecord) and isinstance(after, NodeRecord)
                and before.state == states.QUARANTINED and after.state == states.VALIDATING):
            track.released = True
        elif not in_slot(after):
            track.released = False

    def _slot_holders(self) -> list[str]:
        return sorted(name for name, t in self.nodes.items()
                      if in_slot(record_from_node(t.obj)) and not t.released)

    def _budget(self, change: NodeChange, track: NodeTrack, before: Any, after: Any) -> None:
        holders = self._slot_holders()
        if len(holders) > self.limit:
            self._violate("budget-slots", change.at,
                          f"{len(holders)} nodes hold a budget slot, limit {self.limit}: {', '.join(holders)} "
                          f"(after rv {change.rv} on {change.name} by {change.user})")
        if in_slot(before) or not in_slot(after) or track.released:
            return
        settled = [name for name, t in self.nodes.items()
                   if name != change.name and t.out_since is not None and t.out_since <= change.at - SETTLE_S]
        if len(settled) >= self.limit:
            self._violate("budget-admission", change.at,
                          f"drain of {change.name} started (rv {change.rv}) while {len(settled)} other node(s) were "
                          f"out of service for over {SETTLE_S}s: {', '.join(sorted(settled))}; limit {self.limit}")

    # ---- jobs and evictions -----------------------------------------------------------------------

    def _job(self, job: JobEvent) -> None:
        if job.deleted:
            self._deleted_by[job.name] = job.user
            return
        if not is_controller(job.user):
            return
        count = self._job_names[job.name] = self._job_names.get(job.name, 0) + 1
        if count > 1:
            # Known bug: the controller deleted the timed-out attempt's Job, the outcome write failed,
            # and the next reconcile found the Job missing (see test_regressions.py).
            code = "job-recreated-after-own-delete" if is_controller(self._deleted_by.get(job.name)) else "job-twice"
            self._violate(code, job.at, f"Job {job.name} created {count} times (last by {job.user}, rv {job.rv}); "
                          f"node record then: {_brief(job.record)}")
        attempt = job.name.rsplit("-", 1)[-1]
        names = self._attempt_names.setdefault((job.kind, job.node, job.fingerprint, attempt), set())
        names.add(job.name)
        if len(names) > 1:
            self._violate("job-twice", job.at, f"{len(names)} Jobs for attempt {attempt} of {job.kind} on {job.node} "
                          f"({job.fingerprint}): {', '.join(sorted(names))}")
        record = job.record
        named = (isinstance(record, NodeRecord) and record.action is not None and record.action.name == job.name
                 and record.action.kind == job.kind)
        if not named:
            self._violate("job-unrecorded", job.at, f"Job {job.name} created by {job.user} while the record of "
                          f"{job.node} was {_brief(record)}")

    def _eviction(self, ev: Eviction) -> None:
        if not is_controller(ev.user):
            return
        where = f"{ev.namespace}/{ev.pod} on {ev.node or '?'}"
        if ev.daemonset:
            self._violate("eviction-without-fault", ev.at, f"{ev.user} evicted DaemonSet pod {where}")
            return
        if drain_started(ev.record):
            return
        track = self.nodes.get(ev.node)
        if track is not None and any(ev.at - PERSON_RACE_S <= t <= ev.at for t in track.person_uncordons):
            return
        self._violate("eviction-without-fault", ev.at,
                      f"{ev.user} evicted {where} while the node's record was {_brief(ev.record)}")

    def _created(self, entry: Created) -> None:
        ident = (entry.key, entry.namespace, entry.name)
        if entry.deleted:
            self._cr_deleted_by[ident] = entry.user
            return
        if not is_controller(entry.user):
            return
        count = self._cr_names[ident] = self._cr_names.get(ident, 0) + 1
        if count > 1:
            deleted_by = self._cr_deleted_by.get(ident)
            code = "cr-recreated-after-delete" if deleted_by else "cr-twice"
            self._violate(code, entry.at, f"{entry.key} {entry.namespace}/{entry.name} created {count} times (last "
                          f"by {entry.user}, rv {entry.rv})" + (f"; deleted before by {deleted_by}"
                                                                  if deleted_by else ""))

    def _fence(self, leases: list[LeaseWrite], audit: list[Audit], renew_deadline: float) -> None:
        """Lease writes and requests in arrival order: each controller write within its lease's deadline."""
        timeline: list[tuple[float, int, LeaseWrite | Audit]] = [(w.at, 0, w) for w in leases]
        timeline += [(a.at, 1, a) for a in audit if is_controller(a.user) and a.verb in MUTATING_VERBS
                     and a.resource not in ("leases",)]
        for at, _, item in sorted(timeline, key=lambda t: (t[0], t[1])):
            if isinstance(item, LeaseWrite):
                if is_controller(item.user):
                    self._renewed[item.user] = at if item.holder else None
                continue
            renewed = self._renewed.get(item.user)
            if renewed is None:
                why = "before it acquired the lease" if item.user not in self._renewed else "after it released it"
            elif at > renewed + renew_deadline + FENCE_SLACK_S:
                why = f"{at - renewed:.2f}s after its last lease renewal (renew deadline {renew_deadline:g}s)"
            else:
                continue
            self._violate("write-after-renew-deadline", at, f"{item.user} {item.verb} {item.resource}"
                          f"{'/' + item.subresource if item.subresource else ''} {item.namespace or ''}/"
                          f"{item.name or ''} {why}")

    # ---- reporting ----------------------------------------------------------------------------------

    def report(self, recorder: Recorder, last: int = 25) -> str:
        lines = ["violations:"]
        lines += [f"  [{v.code}] t={v.at:.2f} {v.text}" for v in self.violations[:20]]
        lines.append("nodes now:")
        for name, track in sorted(self.nodes.items()):
            obj = track.obj
            lines.append(f"  {name}: unschedulable={node_unschedulable(obj)} (by {track.cordoned_by}) "
                         f"ready={safety.node_view(obj).ready} record={_brief(record_from_node(obj))}")
        lines.append(f"last {last} node changes:")
        with recorder.lock:
            changes = recorder.node_changes[-last:]
        for c in changes:
            lines.append(f"  t={c.at:.2f} rv={c.rv} {c.user} {c.name} unschedulable={node_unschedulable(c.obj)} "
                         f"{_brief(record_from_node(c.obj))}")
        lines.append(f"last {last} requests (controller, person, nodesim):")
        lines += [f"  t={a.at:.2f} {a.user} {a.verb} {a.resource}{'/' + a.subresource if a.subresource else ''} "
                  f"{a.namespace or ''}/{a.name or ''}" for a in recorder.tail_audit(last)]
        return "\n".join(lines)


def _brief(record: NodeRecord | RecordError | None) -> str:
    if record is None:
        return "none (untouched)"
    if isinstance(record, RecordError):
        return f"unreadable ({record})"
    fault = f"{record.fault.kind}:{record.fault.code}" if record.fault else "-"
    action = (f"{record.action.kind}/{record.action.name or '(not created)'}#{record.action.attempt}"
              if record.action else "-")
    blocked = record.blocked.reason if record.blocked else "-"
    return (f"{record.state} fault={fault} action={action} cordoned_by_us={record.cordoned_by_us} "
            f"was_unschedulable={record.was_unschedulable} blocked={blocked} stopped={record.stopped}")


# ---- controllers ------------------------------------------------------------------------------------


class StallableClient(KubeClient):
    """A client whose Lease calls block while ``stalled`` is set: the renewal thread is stuck (as in a
    SIGSTOP, a long GC pause), everything else of the controller runs on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stalled = threading.Event()
        self.resumed = threading.Event()

    def stall(self) -> None:
        self.resumed.clear()
        self.stalled.set()

    def resume(self) -> None:
        self.stalled.clear()
        self.resumed.set()

    def _lease_gate(self, res: Resource) -> None:
        if res is LEASES and self.stalled.is_set():
            self.resumed.wait(60)

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        self._lease_gate(res)
        return super().get(res, name, namespace)

    def create(self, res: Resource, body: dict[str, Any], namespace: str | None = None, **kwargs: Any) -> Obj:
        self._lease_gate(res)
        return super().create(res, body, namespace, **kwargs)

    def replace(self, res: Resource, name: str, body: dict[str, Any], namespace: str | None = None,
                **kwargs: Any) -> dict[str, Any]:
        self._lease_gate(res)
        return super().replace(res, name, body, namespace, **kwargs)


class Controllers:
    """Starts controllers in-process against a SimCluster, one at a time, each with its own token.

    With ``settings.leader_elect`` each runs ``Controller.run`` (leader election, the write fence) in a
    thread and acts once it holds the Lease; a killed one cannot release it, so its successor waits
    out the lease duration, as on a real cluster."""

    def __init__(self, cluster: SimCluster, policy: PolicyFile, settings: Settings) -> None:
        self.cluster = cluster
        self.policy = policy
        self.settings = settings
        self.current: Controller | None = None
        self.client: StallableClient | None = None
        self.generation = 0
        self._token = ""
        self._dir = tempfile.TemporaryDirectory(prefix="gpuremediate-reliability-")
        self._clients: list[KubeClient] = []
        self._stoppers: list[threading.Thread] = []
        self._shutdown: Shutdown | None = None
        self._runner: threading.Thread | None = None

    def start(self, clock: Callable[[], float] | None = None) -> Controller:
        """``clock``: the controller's clock (default: its own, a SteadyClock)."""
        assert self.current is None, "kill the running controller first"
        self.generation += 1
        self._token = f"controller-token-{self.generation}"
        self.cluster.api.add_token(self._token, f"{CONTROLLER_USER_PREFIX}{self.generation}")
        path = Path(self._dir.name) / f"kubeconfig-{self.generation}"
        self.cluster.api.write_kubeconfig(path, token=self._token)
        client = self.client = StallableClient(load_config(str(path)), qps=500, burst=1000, timeout=10.0)
        self._clients.append(client)
        settings = self.settings
        if settings.leader_elect:  # each its own holder identity, as each pod has its own name
            settings = dataclasses.replace(settings, identity=f"{settings.identity}-{self.generation}")
        controller = Controller(settings, self.policy, client=client, clock=clock)
        if settings.leader_elect:
            self._shutdown = Shutdown()
            self._runner = threading.Thread(target=controller.run, args=(self._shutdown,),
                                            name=f"controller-{self.generation}", daemon=True)
            self._runner.start()
        else:
            if not controller.start_caches(timeout=20.0):
                raise AssertionError(f"controller {self.generation}: node cache did not sync in 20 s")
            controller.start_loops()
        self.current = controller
        return controller

    def kill(self, graceful: bool = False) -> None:
        """Graceful: stop() first. Otherwise revoke the token first: nothing it sends lands any more."""
        controller, self.current = self.current, None
        if controller is None:
            return
        if self.client is not None:
            self.client.resume()
        shutdown, runner, self._shutdown, self._runner = self._shutdown, self._runner, None, None
        if graceful:
            if shutdown is not None and runner is not None:
                shutdown.request()  # run() stops the loops, then releases the Lease
                runner.join(20)
            else:
                controller.stop()
            self.cluster.api.tokens.pop(self._token, None)
            return
        self.cluster.api.tokens.pop(self._token, None)
        controller.acting = False
        controller.ctx.stop.set()
        stopper = threading.Thread(target=shutdown.request if shutdown is not None else controller.stop,
                                   name="controller-stop", daemon=True)
        stopper.start()
        self._stoppers.append(stopper)
        if runner is not None:
            self._stoppers.append(runner)

    def close(self) -> None:
        self.kill(graceful=False)
        for stopper in self._stoppers:
            stopper.join(10)
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._dir.cleanup()
