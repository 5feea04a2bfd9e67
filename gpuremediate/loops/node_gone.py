"""A Node deleted while its record says it is in a flow (someone else's doing: an autoscaler, a person, a cloud).

The record went with the Node, so nothing else would end the flow: the node informer's delete handler hands the
last state it saw here (off the informer's thread), and this

- says it: a Warning Event ``GPUNodeDeletedMidFlow`` on the Node (its name and uid: the Event outlives it), a log
  line and ``gpuremediate_nodes_deleted_mid_flow_total{state}``;
- cleans what the flow made for that node: its DrainRequests (``[customDrain]``), its DeviceTaintRules, and, once
  ``job_grace_s`` has passed with no Node of that name back, our Jobs on it (a validation Job's ResourceClaim is
  owned by its Job and goes with it). A deleted Node often comes back: ``kubectl delete node`` on a live machine, and
  its kubelet registers it again within seconds (a new uid, no record). The new flow then follows a reboot Job still
  running there (``JobLoop.start_job``); deleting that Job first would make the new flow start a second one and
  reboot the node twice;
- forgets what the controller kept about the name in memory, so a Node that joins later under the same name (a new
  uid) starts fresh, as its missing record says.

A Node deleted while no controller ran (a restart, a leader change, a rollout) is never seen deleted: ``sweep``,
once the loops start, finds the objects of ours that name a node the Node cache does not hold (the Jobs from the
Jobs watch, our DrainRequests and DeviceTaintRules from one list each, by our label) and handles each such node as
the watched delete does (its Jobs after ``job_grace_s`` from the sweep), with the Event saying it was found at
start; its record went with it, so the metric's ``state`` is ``unknown``.

The budget slot needs nothing: the budget counts the nodes the informer lists, and a sharded replica's claim in
``gpuremediate-budget`` is pruned once a fresh read finds no such node (``actions.budget_claims``). A node our own
``replace`` took away is not "someone else's": its objects are cleaned, and its flow ends as replaced
(``GPUNodeReplaced``, ``gpuremediate_nodes_replaced_total``).
In a dry run nothing is deleted.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpuremediate.actions.custom import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NVSENTINEL_NODE_LABEL,
    CustomResources,
    Ref,
    label_value,
)
from gpuremediate.actions.device_taints import DeviceTaints, DeviceTaintsNotServed
from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.jobs import delete_job, finished, job_node
from gpuremediate.actions.nodes import name_of
from gpuremediate.kube import errors
from gpuremediate.kube.shards import acting_for
from gpuremediate.loops.base import LoopContext
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_REPLACE
from gpuremediate.vocab.record import NodeRecord, record_from_node

log = logging.getLogger(__name__)

EVENT_REASON = "GPUNodeDeletedMidFlow"
STATE_UNKNOWN = "unknown"  # the metric's state for a node found gone at start (its record went with it)
JOB_GRACE_S = 120.0  # a kubelet registers its Node again within seconds; an autoscaler's node never comes back
REPLACED_REASON = "GPUNodeReplaced"


class NodeGone:
    def __init__(self, ctx: LoopContext, forget: Callable[[str], None],
                 replaced: Callable[[Mapping[str, Any], NodeRecord], None] | None = None) -> None:
        """``forget``: drops what the loops keep in memory under a node name; ``replaced``: told of a node our own
        ``replace`` took away."""
        self.ctx = ctx
        self.forget = forget
        self.replaced = replaced
        self.job_grace_s = JOB_GRACE_S
        self._watched: set[str] = set()  # deleted Nodes the watch handed over: the sweep leaves them to it

    def watched(self, name: str) -> None:
        """The watch saw ``name`` deleted (called on the informer's thread, before ``on_deleted`` is queued): the
        sweep leaves it to the handler, and what the loops keep under the name goes now, in the watch's order. A
        Node added again under the name is handed over after this, so what is gathered for it is not dropped by a
        cleanup that runs later on the queue."""
        self._watched.add(name)
        self.forget(name)

    def on_deleted(self, node: Mapping[str, Any]) -> None:
        """The informer's last view of a deleted Node. Never raises (it runs on the report queue's thread)."""
        name = name_of(node)
        if not self.ctx.owns(name):  # another replica's shard: a sweep once this replica takes it over looks
            self._watched.discard(name)
            return
        record = record_from_node(node)
        if not isinstance(record, NodeRecord) or record.state == states.HEALTHY:
            return
        ours = record.action is not None and record.action.kind == ACTION_REPLACE
        try:
            cleaned = self.clean(name, node, record) if ours else [*self._objects(name, node), *self._jobs_later(name)]
        except Exception as exc:  # one node's cleanup never stops the queue's thread
            log.exception("cleanup after a node's deletion failed", extra={"node": name, "error": str(exc)})
            cleaned = [f"cleanup failed ({exc})"]
        if ours:
            self.report_replaced(node, record, cleaned)
            if self.replaced is not None:
                self.replaced(node, record)
            return
        self.report(node, record, cleaned)

    def sweep(self, shards: frozenset[int] | None = None) -> list[str]:
        """At start: the nodes that objects of ours name and no Node has, each handled as a watched delete; returns
        their names. Reads the Node cache (it must have synced: an empty cache is not "every node gone"), the Jobs
        watch, and one list each of our DrainRequests and DeviceTaintRules. Never raises (the report queue's
        thread). ``shards``: only the nodes of those shards (a sharded replica took them over after its start: a
        node deleted while their previous holder was gone, or before it swept, is found here)."""
        if not self.ctx.nodes.informer.has_synced():
            log.warning("the node cache has not synced: no sweep for nodes deleted while the controller was down")
            return []
        try:
            found = self._found()
        except Exception as exc:  # said; the watched deletes still work
            log.exception("the sweep for nodes deleted while the controller was down failed",
                          extra={"error": str(exc)})
            return []
        present = {label_value(name) for name in self.ctx.nodes.informer.stored_keys()}  # a Node's key: its name
        gone = []
        for key, (name, deletes) in sorted(found.items()):
            if key in present or name in self._watched or not self.ctx.owns(name) or \
                    (shards is not None and self._shard_of(name) not in shards):
                continue
            gone.append(name)
            try:
                cleaned = [*(delete() for delete in deletes), *self._jobs_later(name)]
            except Exception as exc:
                log.exception("cleanup of a node deleted while the controller was down failed",
                              extra={"node": name, "error": str(exc)})
                cleaned = [f"cleanup failed ({exc})"]
            self.report_swept(name, cleaned)
        if shards is None:
            self._watched.clear()  # only a sweep reads it: the next one (a new term) starts from its own cache
        return gone

    def _shard_of(self, name: str) -> int:
        shard_set = self.ctx.shards
        return shard_set.shard_index(name) if shard_set is not None else 0

    def _found(self) -> dict[str, tuple[str, list[Callable[[], str]]]]:
        """Our objects by the node they name (key: its label value): the name, and a delete for each DrainRequest
        and DeviceTaintRule (each returns what it deleted, as the report names it). Jobs name a node while they
        run (a finished one of a node deleted when healthy is left to its TTL); a node's Jobs, finished or not,
        go after the grace (``_jobs_later``)."""
        found: dict[str, tuple[str, list[Callable[[], str]]]] = {}

        def note(name: str, delete: Callable[[], str] | None = None) -> None:
            key = label_value(name)
            entry = found.setdefault(key, (name, []))
            if len(name) > len(entry[0]):  # a full name over a label's cut-and-hashed value
                found[key] = entry = (name, entry[1])
            if delete is not None:
                entry[1].append(delete)

        for job in self.ctx.jobs.all():
            if job_node(job) and not finished(job):  # a finished one goes by its TTL (a healthy node's validation)
                note(job_node(job))
        dry = self.ctx.writer.dry_run
        api = CustomResources(self.ctx.client, dry_run=dry, permissions=self.ctx.permissions)
        for ref in self._drain_refs():
            ours = functools.partial(api.list, ref, {MANAGED_BY_LABEL: MANAGED_BY})
            for item in _listed(f"{ref.kind}s", ours):
                node = str((item.get("spec") or {}).get("nodeName") or
                           ((item.get("metadata") or {}).get("labels") or {}).get(NVSENTINEL_NODE_LABEL) or "")
                if node:
                    note(node, functools.partial(_delete_request, api, ref, name_of(item)))
        taints = DeviceTaints(self.ctx.client, dry_run=dry)
        for rule in _listed("DeviceTaintRules", taints.owned):
            if rule.node:
                note(rule.node, functools.partial(_release_rule, taints, rule.name))
        return found

    def _drain_refs(self) -> list[Ref]:
        """The DrainRequest kinds of every policy with ``[customDrain]`` on (a gone node's labels, and so its
        group, are unknown)."""
        policies = (self.ctx.policy.defaults, *(g.policy for g in self.ctx.policy.groups))
        refs = {Ref(p.customDrain.api_version, p.customDrain.kind, p.customDrain.namespace)
                for p in policies if p.customDrain.enabled}
        return sorted(refs, key=lambda r: (r.api_version, r.kind, r.namespace))

    def report_swept(self, name: str, cleaned: list[str]) -> None:
        did = "would clean" if self.ctx.writer.dry_run else "cleaned"
        message = (f"the Node was deleted while no gpuremediate controller ran (found at start: objects of ours name "
                   f"it and no Node has that name); its flow ends here; {did}: {', '.join(cleaned) or 'nothing left'}; "
                   f"a Node that joins under this name starts fresh")
        log.warning("node deleted while the controller was down", extra={"node": name, "detail": message})
        self.ctx.metrics.nodes_deleted_mid_flow.inc(state=STATE_UNKNOWN)
        self.ctx.events.node_event(name, EVENT_REASON, message, WARNING)

    def report(self, node: Mapping[str, Any], record: NodeRecord, cleaned: list[str]) -> None:
        name = name_of(node)
        uid = str((node.get("metadata") or {}).get("uid") or "")
        fault = record.fault.message if record.fault is not None else record.reason
        action = f", {record.action.kind} under way" if record.action is not None else ""
        did = "would clean" if self.ctx.writer.dry_run else "cleaned"
        message = (f"the Node was deleted by someone else while {record.state} ({fault}{action}): its flow ends "
                   f"here; {did}: {', '.join(cleaned) or 'nothing left'}; a Node that joins under this name "
                   f"starts fresh")
        log.warning("node deleted mid-flow", extra={"node": name, "state": record.state, "detail": message})
        self.ctx.metrics.nodes_deleted_mid_flow.inc(state=record.state)
        self.ctx.events.node_event(name, EVENT_REASON, message, WARNING, uid=uid)

    def report_replaced(self, node: Mapping[str, Any], record: NodeRecord, cleaned: list[str]) -> None:
        """Our own replace took the node away: its flow ends as replaced (a Normal Event on the old Node)."""
        name = name_of(node)
        uid = str((node.get("metadata") or {}).get("uid") or "")
        what = record.action.name if record.action is not None else "its owner's object"
        message = (f"replaced: {what} was deleted and the Node went away; its flow ends here (cleaned: "
                   f"{', '.join(cleaned) or 'nothing left'}); the new node starts fresh")
        log.warning("node replaced", extra={"node": name, "detail": message})
        self.ctx.metrics.nodes_replaced.inc()
        self.ctx.events.node_event(name, REPLACED_REASON, message, NORMAL, uid=uid)

    def clean(self, name: str, node: Mapping[str, Any], record: NodeRecord) -> list[str]:
        """Deletes what the flow made for ``name``; returns what it found (each as "kind name")."""
        return [*self._jobs(name), *self._objects(name, node)]

    def _objects(self, name: str, node: Mapping[str, Any]) -> list[str]:
        return [*self._drain_requests(name, node), *self._device_taint_rules(name)]

    def _jobs_later(self, name: str) -> list[str]:
        """The node's Jobs, deleted after ``job_grace_s`` unless a Node of that name is back by then (its flow
        follows or waits for them). Returns them as the report names them."""
        names = [name_of(job) for job in self.ctx.jobs.on_node(name)]
        if names:
            timer = threading.Timer(self.job_grace_s, self._jobs_if_still_gone, args=(name,))
            timer.daemon = True
            timer.start()
        return [f"Job {job} (in {self.job_grace_s:g} s unless the Node is back)" for job in names]

    def _jobs_if_still_gone(self, name: str) -> None:
        if self.ctx.stop.is_set():
            return
        if self.ctx.nodes.get(name) is not None:
            log.info("a deleted node is back: its Jobs are left to its new flow", extra={"node": name})
            return
        try:
            with acting_for(name):
                self._jobs(name)
        except Exception as exc:  # a timer's thread: said, never raised
            log.warning("deleting a deleted node's Jobs failed", extra={"node": name, "error": str(exc)})

    def _jobs(self, name: str) -> list[str]:
        dry = self.ctx.writer.dry_run
        names = [name_of(job) for job in self.ctx.jobs.on_node(name)]
        for job in names:
            delete_job(self.ctx.client, job, self.ctx.settings.jobs_namespace, dry_run=dry)
        return [f"Job {job}" for job in names]

    def _drain_requests(self, name: str, node: Mapping[str, Any]) -> list[str]:
        policy = self.ctx.policy_for(node).customDrain
        if not policy.enabled:
            return []
        ref = Ref(policy.api_version, policy.kind, policy.namespace)
        api = CustomResources(self.ctx.client, dry_run=self.ctx.writer.dry_run, permissions=self.ctx.permissions)
        found = []
        with contextlib.suppress(errors.NotFound):  # the kind is not served (any more)
            for item in api.list(ref, {NVSENTINEL_NODE_LABEL: label_value(name), MANAGED_BY_LABEL: MANAGED_BY}):
                api.delete(ref, name_of(item))
                found.append(f"{ref.kind} {name_of(item)}")
        return found

    def _device_taint_rules(self, name: str) -> list[str]:
        taints = DeviceTaints(self.ctx.client, dry_run=self.ctx.writer.dry_run)
        try:
            rules = taints.owned(name)
        except DeviceTaintsNotServed:
            return []
        for rule in rules:
            taints.release_rule(rule.name)
        return [f"DeviceTaintRule {rule.name}" for rule in rules]


def _delete_request(api: CustomResources, ref: Ref, name: str) -> str:
    api.delete(ref, name)
    return f"{ref.kind} {name}"


def _release_rule(taints: DeviceTaints, name: str) -> str:
    taints.release_rule(name)
    return f"DeviceTaintRule {name}"


def _listed(what: str, list_: Callable[[], list[Any]]) -> list[Any]:
    """One kind's objects for the sweep; none when the kind is not served, or cannot be listed (said: the other
    kinds are still swept)."""
    try:
        return list_()
    except (errors.NotFound, DeviceTaintsNotServed):
        return []
    except (errors.ApiError, errors.TransportError) as exc:
        log.warning("the sweep for deleted nodes cannot list %s", what, extra={"error": str(exc)})
        return []
