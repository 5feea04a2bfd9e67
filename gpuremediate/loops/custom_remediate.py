"""Custom remediation (NVSentinel's ``maintenance.actions`` contract): ``[actions.<name>]``.

One attempt = one resource, created from the action's structured template with a durable name
(action + node + event id + attempt) that is written into the record before the create, and
looked up before any create, so a restart never makes a second one. Its completion condition
decides: True → repaired (validate next); False → the attempt failed (a new resource for the next
attempt, up to ``maxAttempts``, then quarantined); absent/Unknown → in progress; past ``timeout``
→ the attempt failed, but the resource stays (its plugin may still be acting on the node), so it
keeps covering its equivalence group: the next attempt adopts it rather than duplicating it.

Equivalence (NVSentinel's rule): no new resource while one of the same effective group (group +
impacted entity when ``impactedEntityScope`` is set), or of a group that supersedes it, is in
progress for the node — or succeeded for the node's current fault. The attempt adopts that
resource instead and completes with it. Resources are found by the labels put on every one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from gpuremediate.actions.custom import (
    ACTION_LABEL,
    ATTEMPT_LABEL,
    ENTITY_LABEL,
    FAILED,
    FAULT_LABEL,
    GROUP_LABEL,
    IN_PROGRESS,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    SUCCEEDED,
    CustomResources,
    Ref,
    base_body,
    condition,
    created_at,
    dns_name,
    fault_event_id,
    label_value,
    outcome,
    render,
)
from gpuremediate.actions.events import NORMAL
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.loops.repair import RepairContext, RepairRequest
from gpuremediate.loops.step import CONFLICT, Done, Failed, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.workflow import CustomAction, Rung
from gpuremediate.vocab.record import ActionInProgress, NodeRecord, mark_created, start_action

log = logging.getLogger(__name__)

POLL_S = 1.0


def ref_of(action: CustomAction) -> Ref:
    return Ref(action.api_version, action.kind, action.namespace if action.scope == "Namespaced" else "")


def resource_name(action: str, node: str, record: NodeRecord, attempt: int) -> str:
    return dns_name(action, node, fault_event_id(record), str(attempt))


def entity_of(action: CustomAction, record: NodeRecord) -> str:
    """The impacted entity that narrows the equivalence group ("" when the group is node-wide)."""
    if not action.impactedEntityScope or record.fault is None:
        return ""
    return label_value(",".join(sorted(record.fault.gpus)) or "node")


def labels_for(name: str, action: CustomAction, node: str, record: NodeRecord, attempt: int) -> dict[str, str]:
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        NODE_LABEL: label_value(node),
        ACTION_LABEL: name,
        GROUP_LABEL: label_value(action.group_of(name)),
        FAULT_LABEL: fault_event_id(record),
        ATTEMPT_LABEL: str(attempt),
    }
    entity = entity_of(action, record)
    if entity:
        labels[ENTITY_LABEL] = entity
    return labels


def build_resource(name: str, action: CustomAction, node: str, record: NodeRecord, attempt: int,
                   gpu_uuids: list[str]) -> dict[str, Any]:
    """The action's template rendered (placeholders in string values only) under our name/labels."""
    ref = ref_of(action)
    values = {
        "nodeName": node, "healthEventID": fault_event_id(record), "action": name,
        "gpuUUIDs": ",".join(gpu_uuids), "attempt": str(attempt), "namespace": ref.namespace,
        "reason": record.fault.message if record.fault else "",
    }
    rendered: dict[str, Any] = render(action.template, values)
    labels = labels_for(name, action, node, record, attempt)
    body = base_body(ref, resource_name(name, node, record, attempt), labels)
    template_meta = rendered.pop("metadata", {})
    body["metadata"]["labels"] = {**template_meta.get("labels", {}), **labels}
    if template_meta.get("annotations"):
        body["metadata"]["annotations"] = dict(template_meta["annotations"])
    return {**rendered, **body}


def any_other(policy: Policy, node: Node, record: NodeRecord, kind: str) -> bool:
    """The table's last row (``loops.repairs``): a kind no built-in row took names an ``[actions.<kind>]``."""
    return True


class CustomResourceRepair:
    """The ``Repair`` for a custom action (a plugin's resource, issue 5 hook), with the rung's attempts and timeout
    where it sets them (``loops.repairs``)."""

    def step(self, ctx: RepairContext, node: Node, record: NodeRecord, request: RepairRequest) -> StepResult:
        return CustomRemediation(ctx, request.rung).step(node, record, request.kind)


class CustomRemediation:
    """One step of a custom remediation for one node."""

    def __init__(self, ctx: RepairContext, rung: Rung | None = None) -> None:
        self.rung = rung  # the escalation ladder rung running this action: its attempts and timeout win
        self.ctx = ctx
        self.actions: Mapping[str, CustomAction] = ctx.actions
        self.api = CustomResources(ctx.client, dry_run=ctx.writer.dry_run, permissions=ctx.permissions)

    def step(self, node: Node, record: NodeRecord, name: str) -> StepResult:
        action = self._for_rung(self.actions.get(name))
        current = record.action
        if action is None:
            return self._removed(name, current)
        if current is None or not current.name:
            return self._start(node, record, name, action, current.attempt if current else 1)
        return self._progress(node, record, name, action, current)

    def _removed(self, name: str, current: ActionInProgress | None) -> StepResult:
        """The action is not in the policy (never was, or a new policy dropped it mid-flow). An attempt of it in
        flight is ended: its resource of ours is deleted (nothing follows it any more, and left behind its plugin
        could still act on a node that moved on), then the attempt fails like any other."""
        ref = Ref.decode(current.detail) if current is not None and current.name else None
        if current is None or ref is None or self.api.dry_run:
            return Failed(f"no [actions.{name}] is configured", max_attempts=1)
        self.api.delete(ref, current.name)
        log.warning("custom action removed from the policy mid-flow; its resource deleted",
                    extra={"action": name, "resource": f"{ref.kind} {current.name}"})
        return Failed(f"[actions.{name}] was removed from the policy while {ref.kind} {current.name} was in flight: "
                      f"that resource was deleted", max_attempts=1)

    def _for_rung(self, action: CustomAction | None) -> CustomAction | None:
        """The action with the rung's attempts and timeout where the rung sets them."""
        if action is None or self.rung is None:
            return action
        return dataclasses.replace(action, maxAttempts=self.rung.attempts or action.maxAttempts,
                                   timeout=self.rung.timeout_s or action.timeout)

    # ---- starting an attempt ---------------------------------------------------------------------

    def _start(self, node: Node, record: NodeRecord, name: str, action: CustomAction, attempt: int) -> StepResult:
        now = self.ctx.clock()
        covering = self._covering(name_of(node), record, name, action)
        if covering is not None:
            ref, obj = covering
            other = str(obj["metadata"]["name"])
            adopted = start_action(record, name, other, attempt, now, action.timeout, ref.encode())
            if self.ctx.writer.write(node, adopted) is None:
                return CONFLICT
            self.ctx.events.node_event(name_of(node), "GPURemediationCovered",
                                       f"{name}: {ref.kind} {other} of an equivalent or superseding group is in "
                                       "progress or done; no new resource", NORMAL)
            return InProgress(POLL_S)
        _, uuids = self.ctx.jobs.gpu_ids(node, record)
        body = build_resource(name, action, name_of(node), record, attempt, uuids or self._fault_uuids(record))
        started = start_action(record, name, body["metadata"]["name"], attempt, now, action.timeout,
                               ref_of(action).encode())
        written = self.ctx.writer.write(node, started)
        if written is None:  # the name is in the record before the create
            return CONFLICT
        obj = self.api.ensure(ref_of(action), body)
        self.ctx.events.node_event(name_of(node), "GPURemediationRequested",
                                   f"{'would create' if self.api.dry_run else 'created'} {action.kind} "
                                   f"{body['metadata']['name']} (action {name}, attempt {attempt})", NORMAL)
        if not self.api.dry_run:  # its deadline counts from its creation; a 409: noted by the next step instead
            self.ctx.writer.write(written, mark_created(started, created_at(obj, now), action.timeout))
        return InProgress(POLL_S)

    @staticmethod
    def _fault_uuids(record: NodeRecord) -> list[str]:
        return sorted(g for g in (record.fault.gpus if record.fault else ()) if g.startswith("GPU-"))

    def _groups_covering(self, name: str, action: CustomAction) -> Iterator[tuple[str, bool]]:
        """(group, entity-scoped?) whose resources cover this action: its own, then superseding ones."""
        yield action.group_of(name), bool(action.impactedEntityScope)
        for group in action.supersedingEquivalenceGroups:
            yield group, False

    def _covering(self, node: str, record: NodeRecord, name: str,
                  action: CustomAction) -> tuple[Ref, dict[str, Any]] | None:
        fault = fault_event_id(record)
        entity = entity_of(action, record)
        found: list[tuple[int, Ref, dict[str, Any]]] = []
        for group, scoped in self._groups_covering(name, action):
            labels = {NODE_LABEL: label_value(node), GROUP_LABEL: label_value(group)}
            if scoped:
                labels[ENTITY_LABEL] = entity
            for ref in self._refs_of_group(group):
                for obj in self.api.list(ref, labels):
                    state = self._outcome(obj, action)
                    meta = obj.get("metadata") or {}
                    if meta.get("deletionTimestamp"):
                        continue
                    if state == IN_PROGRESS:
                        found.append((1, ref, obj))
                    elif state == SUCCEEDED and (meta.get("labels") or {}).get(FAULT_LABEL) == fault:
                        found.append((0, ref, obj))
        if not found:
            return None
        _, ref, obj = min(found, key=lambda f: (f[0], str(f[2]["metadata"]["name"])))
        return ref, obj

    def _refs_of_group(self, group: str) -> list[Ref]:
        refs = {ref_of(a) for n, a in self.actions.items() if a.group_of(n) == group}
        return sorted(refs, key=lambda r: r.encode())

    def _outcome(self, obj: Mapping[str, Any], fallback: CustomAction) -> str:
        creator = self.actions.get(str(((obj.get("metadata") or {}).get("labels") or {}).get(ACTION_LABEL, "")))
        return outcome(obj, (creator or fallback).completeConditionType)

    # ---- an attempt in progress --------------------------------------------------------------------

    def _progress(self, node: Node, record: NodeRecord, name: str, action: CustomAction,
                  current: ActionInProgress) -> StepResult:
        ref = Ref.decode(current.detail) or ref_of(action)
        obj = self.api.get(ref, current.name)
        if obj is None:
            return self._missing(node, record, name, action, current)
        self.ctx.check_shape(node, ref.kind, obj)
        if not current.created and not self.api.dry_run:  # the write after the create was lost, or adopted
            self.ctx.writer.write(node, mark_created(record, created_at(obj, self.ctx.clock()), action.timeout))
            return InProgress(POLL_S)
        state = self._outcome(obj, action)
        label = f"{ref.kind} {current.name}"
        if state == SUCCEEDED:
            return Done(f"{name} done ({label})", max_attempts=action.maxAttempts)
        if state == FAILED:
            cond = condition(obj, (self.actions.get(name) or action).completeConditionType) or {}
            why = cond.get("message") or cond.get("reason") or "no message"
            return Failed(f"{name}: {label} failed ({why})", max_attempts=action.maxAttempts)
        now = self.ctx.clock()
        if current.deadline is not None and now >= current.deadline:
            # The resource stays: its plugin may still act, so it keeps covering its group (no duplicate).
            detail = f"{name} attempt {current.attempt} timed out ({label})"
            return Failed(detail, max_attempts=action.maxAttempts)
        return InProgress(POLL_S)

    def _missing(self, node: Node, record: NodeRecord, name: str, action: CustomAction,
                 current: ActionInProgress) -> StepResult:
        """Killed between writing the record and creating: create it now (same name). A resource we
        adopted, or one deleted by someone else (the record says it was created), is gone: that attempt
        failed, evented, and the next attempt gets a new name — a person's delete is never undone."""
        own = resource_name(name, name_of(node), record, current.attempt)
        never_created = current.name == own and not current.created and current.detail == ref_of(action).encode()
        if never_created and not self.ctx.writer.dry_run:
            _, uuids = self.ctx.jobs.gpu_ids(node, record)
            body = build_resource(name, action, name_of(node), record, current.attempt,
                                  uuids or self._fault_uuids(record))
            self.api.ensure(ref_of(action), body)
            return InProgress(POLL_S)
        if self.ctx.writer.dry_run:
            return InProgress(POLL_S)
        detail = f"{name}: {current.name} was deleted before it completed"
        return Failed(detail, max_attempts=action.maxAttempts)
