"""Custom drain (NVSentinel's drain-plugin contract): the drain loop evicts nothing itself.

Per fault it creates one request (default ``DrainRequest``, ``nvsentinel.nvidia.com/v1alpha1``)
named ``drain-<node>-<eventID>`` and labelled ``nvsentinel.nvidia.com/node-name=<node>``, whose
spec lists exactly the pods the built-in drain would evict, then waits for the plugin's
completion condition. Done → the drain is complete (record written first), then the request is
deleted. Past ``customDrain.timeout`` → quarantined, or the request is deleted and the built-in
drain takes over (``onTimeout = "builtin"``). The timeout counts from the request's own
``creationTimestamp`` (recorded as ``action.created_at``, with the deadline): a first create just
after the CRD is Established takes seconds on a real server; until the request exists, from the
drain's start.

A plugin's CRD may be permissive: ``status.conditions`` entries that are not objects are reported
once (an Event) and ignored, never a crash.

Restarts: the name is derived from the fault, and the request is looked up (by label, then name)
before any create, so a restarted controller reuses the request it already made.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpuremediate.actions.custom import (
    FAULT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    NVSENTINEL_NODE_LABEL,
    CustomResources,
    Ref,
    base_body,
    condition,
    condition_is,
    created_at,
    dns_name,
    fault_event_id,
    label_value,
)
from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.actions.pods import pod_key
from gpuremediate.loops.drainer import DrainContext
from gpuremediate.loops.step import CONFLICT, Done, Failed, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.workflow import CustomDrainPolicy, DrainPolicy
from gpuremediate.vocab.record import (
    BLOCK_WINDOW,
    Fault,
    NodeRecord,
    block,
    mark_created,
    start_action,
    unblock,
)

log = logging.getLogger(__name__)

DEFERRED_CONDITION = "DrainDeferred"  # set by a drain plugin that holds the drain back (NVSentinel's example)
FALLBACK = "builtin-fallback"  # action.detail once a timed-out custom drain fell back to the built-in one


def fell_back(record: NodeRecord) -> bool:
    return record.action is not None and record.action.detail == FALLBACK


def request_name(node: str, record: NodeRecord) -> str:
    return dns_name("drain", node, fault_event_id(record))


def pods_by_namespace(pods: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for pod in pods:
        namespace, name = pod_key(pod)
        grouped.setdefault(namespace, []).append(name)
    return {ns: sorted(names) for ns, names in sorted(grouped.items())}


def entities(fault: Fault | None) -> list[dict[str, str]]:
    """The fault's GPUs as NVSentinel entities: a UUID as GPU_UUID, a ``node/gpuN`` key as GPU N."""
    found = []
    for key in fault.gpus if fault else ():
        if key.startswith("GPU-"):
            found.append({"type": "GPU_UUID", "value": key})
        else:
            found.append({"type": "GPU", "value": key.rsplit("gpu", 1)[-1]})
    return found


def context(record: NodeRecord) -> dict[str, Any]:
    """The optional DrainRequest context fields (a plugin's CRD prunes what it does not declare)."""
    fault = record.fault
    if fault is None:
        return {"healthEventID": fault_event_id(record)}
    return {
        "checkName": f"gpuremediate/{fault.kind}",
        "recommendedAction": fault.action,
        "errorCode": [fault.code] if fault.code else [],
        "healthEventID": fault_event_id(record),
        "entitiesImpacted": entities(fault),
        "reason": fault.message,
    }


def request_body(ref: Ref, node: str, record: NodeRecord, pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    labels = {
        NVSENTINEL_NODE_LABEL: label_value(node),
        NODE_LABEL: label_value(node),
        FAULT_LABEL: fault_event_id(record),
        MANAGED_BY_LABEL: MANAGED_BY,
    }
    body = base_body(ref, request_name(node, record), labels)
    body["spec"] = {"nodeName": node, "podsToDrain": pods_by_namespace(pods), **context(record)}
    return body


def requested(policy: Policy, record: NodeRecord) -> bool:
    """The table's row (``loops.drainers``): ``[customDrain]`` is on, and this drain did not fall back."""
    return policy.customDrain.enabled and not fell_back(record)


class DrainRequestDrain:
    """The ``Drainer`` for a drain plugin (issue 5 hook): a DrainRequest per fault (``loops.drainers``)."""

    def step(self, ctx: DrainContext, node: Node, record: NodeRecord) -> StepResult:
        return CustomDrain(ctx, ctx.policy.customDrain).step(node, record, ctx.policy.drain)


class CustomDrain:
    """One step of a custom drain for one node."""

    def __init__(self, ctx: DrainContext, policy: CustomDrainPolicy) -> None:
        self.ctx = ctx
        self.policy = policy
        self.ref = Ref(policy.api_version, policy.kind, policy.namespace)
        self.api = CustomResources(ctx.client, dry_run=ctx.writer.dry_run, permissions=ctx.permissions)

    def step(self, node: Node, record: NodeRecord, drain: DrainPolicy) -> StepResult:
        assert record.action is not None
        now = self.ctx.clock()
        name = request_name(name_of(node), record)
        existing = self._find(name_of(node), name)
        if existing is not None:
            self.ctx.check_shape(node, self.ref.kind, existing)
        if existing is not None and condition_is(existing, self.policy.statusConditionType,
                                                 self.policy.statusConditionStatus):
            return self._complete(node, record, name, now)
        if existing is not None and not record.action.created and not self.api.dry_run:
            # The deadline counts from the request's creation; a 409 is noted again on the next step.
            self.ctx.writer.write(node, mark_created(record, created_at(existing, now), self.policy.timeout))
            return InProgress(0.0)
        deadline = self.deadline(record)
        if now >= deadline:
            return self._timed_out(node, record, name, now, drain)
        if existing is None and record.action.created and not self.api.dry_run:
            # Someone else deleted it (the record says it was created): never created again under its name.
            return self._gave_up(node, record, name, now, drain,
                                 f"{self.ref.kind} {self.ref.namespace}/{name} was deleted before the drain completed")
        if existing is None:
            self._create(node, record, drain)
        else:
            self._note_deferral(node, record, existing, now)
        return InProgress(max(0.1, min(drain.retry_s, deadline - now)))

    def deadline(self, record: NodeRecord) -> float:
        """From the request's creation once it exists (recorded), else from the drain's start."""
        action = record.action
        assert action is not None
        if action.created and action.deadline is not None:
            return action.deadline
        return action.started + self.policy.timeout

    def _note_deferral(self, node: Node, record: NodeRecord, request: Mapping[str, Any], now: float) -> None:
        """A plugin that holds the drain back (the drain-window plugin's ``DrainDeferred=True``) shows as
        ``blocked: window`` on the node, with the plugin's message (e.g. when the window opens)."""
        deferred = condition(request, DEFERRED_CONDITION)
        if deferred is not None and deferred.get("status") == "True":
            after = block(record, BLOCK_WINDOW, str(deferred.get("message") or deferred.get("reason") or ""), now)
        elif record.blocked is not None and record.blocked.reason == BLOCK_WINDOW:
            after = unblock(record)
        else:
            return
        if after != record:
            self.ctx.writer.write(node, after)  # a 409 is simply noted again on the next step

    def _find(self, node: str, name: str) -> dict[str, Any] | None:
        """Our request for this fault, found by the node label then the name; completed leftovers
        of earlier drains of this node (a crash between completing and deleting) are removed."""
        mine = None
        for item in self.api.list(self.ref, {NVSENTINEL_NODE_LABEL: label_value(node)}):
            meta = item.get("metadata") or {}
            if meta.get("name") == name:
                mine = item
            elif (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY and condition_is(
                    item, self.policy.statusConditionType, self.policy.statusConditionStatus):
                self.api.delete(self.ref, str(meta.get("name")))
        return mine

    def _create(self, node: Node, record: NodeRecord, drain: DrainPolicy) -> None:
        pods = self.ctx.targets(node, record, confirm=True)  # once: a LIST, no watch
        body = request_body(self.ref, name_of(node), record, pods)
        self.api.ensure(self.ref, body)
        name = body["metadata"]["name"]
        verb = "would create" if self.api.dry_run else "created"
        self.ctx.events.node_event(name_of(node), "GPUDrainRequested",
                                   f"{verb} {self.ref.kind} {self.ref.namespace}/{name} for {len(pods)} pod(s); "
                                   "a drain plugin drains the node", NORMAL)
        log.info("drain request created", extra={"node": name_of(node), "request": name, "pods": len(pods)})

    def _complete(self, node: Node, record: NodeRecord, name: str, now: float) -> StepResult:
        assert record.action is not None
        # The record first (the loop writes it): a crash before the delete leaves a completed request, removed
        # next time.
        return Done(at=now, then=lambda: self.api.delete(self.ref, name))

    def _timed_out(self, node: Node, record: NodeRecord, name: str, now: float, drain: DrainPolicy) -> StepResult:
        # The request first: a crash before the record write finds no request and times out again.
        self.api.delete(self.ref, name)
        detail = (f"drain plugin did not set {self.policy.statusConditionType}={self.policy.statusConditionStatus} "
                  f"on {self.ref.kind} {self.ref.namespace}/{name} within {self.policy.timeout:g}s")
        return self._gave_up(node, record, name, now, drain, detail)

    def _gave_up(self, node: Node, record: NodeRecord, name: str, now: float, drain: DrainPolicy,
                 detail: str) -> StepResult:
        """The plugin's drain ended without completing: ``onTimeout`` decides (built-in drain, or quarantine)."""
        if self.policy.onTimeout == "builtin":
            fallback = start_action(record, record.action.kind if record.action else "drain", "", 1, now,
                                    drain.timeout_s, FALLBACK)
            if self.ctx.writer.write(node, fallback) is None:
                return CONFLICT
            self.ctx.events.node_event(name_of(node), "GPUDrainPluginTimedOut", f"{detail}; built-in drain takes over",
                                       WARNING)
            return InProgress(0.0)
        return Failed(detail, at=now)  # the loop records it and says GPUDrainTimedOut
