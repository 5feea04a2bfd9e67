"""The ``replace`` rung (``[remediation.replace]``): the last before a person (``actions.replace``,
``actions.replaced``).

One attempt, in this order, each step safe to repeat after a restart:

1. the record names the object to delete (``action.name``: "Machine ns/name", ``detail``: its uid) before
   anything is deleted; a dry run writes that with "would replace: ..." and deletes nothing (the attempt then times
   out like a Job a dry run never created);
2. the ``Replacer`` writes its history entry, deletes (uid precondition), marks the entry: a second step, or a
   controller killed anywhere in between, finds the entry and never deletes twice;
3. the record says the delete went (``created``); the attempt waits for the Node to go away. Its flow ends there
   (``loops.node_gone`` sees a node our own replace took away); a Node still here past ``timeout_s`` goes to a
   person.

No owner that would replace the node (no Machine, a Machine without a controller owner, no NodeClaim): the rung
fails at once with that reason, and the ladder goes to a person. While the circuit breaker is open no replacement
starts (a storm is the worst time to delete machines); one under way goes on.
"""

from __future__ import annotations

import logging

from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.actions.replace import NoTarget, find_target
from gpuremediate.actions.replaced import HistoryError, Outcome, ReplacedHistory, Replacer
from gpuremediate.kube import errors
from gpuremediate.loops.repair import RepairContext, RepairRequest
from gpuremediate.loops.step import CONFLICT, Failed, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.vocab.findings import ACTION_REPLACE
from gpuremediate.vocab.record import BLOCK_BREAKER, NodeRecord, block, mark_created, start_action, unblock

log = logging.getLogger(__name__)

POLL_S = 5.0
EVENT_REASON = "GPUNodeReplace"


def matches(policy: Policy, node: Node, record: NodeRecord, kind: str) -> bool:
    return kind == ACTION_REPLACE


class ReplaceRepair:
    def step(self, ctx: RepairContext, node: Node, record: NodeRecord, request: RepairRequest) -> StepResult:
        action = record.action
        if action is None or not action.name:
            return self._start(ctx, node, record, request)
        if not action.created:
            return self._delete(ctx, node, record)
        if action.deadline is not None and ctx.clock() >= action.deadline:
            return Failed(f"replace: {action.name} was deleted, but the node is still here after "
                          f"{request.remediation.replace.timeout_s:.0f}s (its owner did not take it away): a person "
                          f"decides")
        return InProgress(POLL_S)

    def _start(self, ctx: RepairContext, node: Node, record: NodeRecord, request: RepairRequest) -> StepResult:
        if ctx.breaker_open():
            held = block(record, BLOCK_BREAKER, "no node is replaced while the circuit breaker is open", ctx.clock())
            if held != record and ctx.writer.write(node, held) is None:
                return CONFLICT
            return InProgress(ctx.resync_s)
        try:
            found = find_target(ctx.client, node, request.remediation.replace.provider)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("replace: the owner could not be read", extra={"node": name_of(node), "error": str(exc)})
            return InProgress(POLL_S)
        if isinstance(found, NoTarget):
            return Failed(f"replace: no owner would replace this node: {found.why}")
        attempt = record.action.attempt if record.action else 1
        dry = ctx.writer.dry_run
        detail = f"would replace: delete {found.describe()} ({found.provider})" if dry else found.uid
        started = start_action(unblock(record), ACTION_REPLACE, found.describe(), attempt, ctx.clock(),
                               request.remediation.replace.timeout_s, detail)
        if ctx.writer.write(node, started) is None:
            return CONFLICT
        if dry:
            ctx.events.node_event(name_of(node), EVENT_REASON, detail, NORMAL)
            return InProgress(POLL_S)
        return InProgress(0.0)  # the next step reads the node as written, then deletes

    def _delete(self, ctx: RepairContext, node: Node, record: NodeRecord) -> StepResult:
        if ctx.writer.dry_run:  # a dry run never deletes: the attempt waits out its deadline
            if record.action is not None and record.action.deadline is not None and \
                    ctx.clock() >= record.action.deadline:
                return Failed(f"replace: {record.action.detail} (dry run: nothing deleted)")
            return InProgress(POLL_S)
        replacer = Replacer(ctx.client, ReplacedHistory(ctx.client, ctx.namespace))
        fault = record.fault.message if record.fault is not None else record.reason
        try:
            outcome = replacer.replace(node, fault, ctx.clock(), ctx.policy.remediation.replace.provider)
        except (HistoryError, errors.ApiError, errors.TransportError) as exc:
            log.warning("replace: not done yet, asked again", extra={"node": name_of(node), "error": str(exc)})
            return InProgress(POLL_S)
        return self._deleted(ctx, node, record, outcome)

    @staticmethod
    def _deleted(ctx: RepairContext, node: Node, record: NodeRecord, outcome: Outcome) -> StepResult:
        if not outcome.done:
            return Failed(f"replace: no owner would replace this node: {outcome.detail}")
        ctx.events.node_event(name_of(node), EVENT_REASON, outcome.detail, WARNING)
        log.warning("node replaced", extra={"node": name_of(node), "detail": outcome.detail})
        if outcome.target is not None:  # a delete sent now, not the history's answer to a repeated step
            ctx.metrics.replacements.inc(provider=outcome.target.provider)
        if ctx.writer.write(node, mark_created(record, ctx.clock())) is None:
            return CONFLICT  # the history answers the next step: no second delete
        return InProgress(POLL_S)
