"""Diagnostics before the first repair of a fault (``[remediation.diagnostics]``, off by default).

A reset or a reboot wipes what the driver knows about the fault, so once per fault, before the first rung's
first attempt, a Job collects it (``nvidia-bug-report.sh`` by default, or the configured command) on the node.
The Job is the record's action (kind ``diagnostics``) while it runs, named from the fault's occurrence like every
other Job (loops/jobs.py): a restarted controller finds it instead of starting a second one. The Job is told
where to write (``$(DIAGNOSTICS_OUTPUT)`` = ``<output_dir>/<job name>.log`` on the node); that location is kept in
the record (``fault.diagnostics``) and named on the ``GPUDiagnosticsCollected`` Event. Its outcome — ok, failed
(or deleted), timed out — is recorded and never blocks the repair: the repair starts right after.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.actions.jobs import FAILED, SUCCEEDED, job_name
from gpuremediate.actions.nodes import Node, name_of
from gpuremediate.loops.jobs import DELETED, TIMED_OUT
from gpuremediate.loops.repair import RepairContext, RepairRequest
from gpuremediate.loops.step import CONFLICT, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.workflow import DiagnosticsPolicy
from gpuremediate.vocab.record import (
    DIAGNOSTICS_FAILED,
    DIAGNOSTICS_OK,
    DIAGNOSTICS_SKIPPED,
    DIAGNOSTICS_TIMED_OUT,
    Diagnostics,
    NodeRecord,
    start_action,
)

log = logging.getLogger(__name__)

DIAGNOSTICS = "diagnostics"  # the action kind and the Job's gpuremediate.io/job label
OUTCOMES = {SUCCEEDED: DIAGNOSTICS_OK, FAILED: DIAGNOSTICS_FAILED, DELETED: DIAGNOSTICS_FAILED,
            TIMED_OUT: DIAGNOSTICS_TIMED_OUT}
POLL_S = 1.0


def due(policy: DiagnosticsPolicy, record: NodeRecord) -> bool:
    """The fault not diagnosed yet and: a diagnostics Job under way (finished even if a reload turned them off),
    or diagnostics enabled and no repair attempt started (after one the evidence is gone)."""
    if record.fault is None or record.fault.diagnostics is not None:
        return False
    if record.action is not None and record.action.kind == DIAGNOSTICS:
        return True
    return policy.enabled and record.action is None


def reported_not_ready(node: Node) -> bool:
    """The kubelet's Ready condition is False or Unknown (the node is down or unreachable); a node reporting no
    Ready condition at all is not taken for down."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") != "True"
    return False


def output_location(policy: DiagnosticsPolicy, name: str) -> str:
    return f"{policy.output_dir.rstrip('/')}/{name}.log"


def due_step(policy: Policy, node: Node, record: NodeRecord, kind: str) -> bool:
    """The table's row (``loops.repairs``): diagnostics come first, before any rung's action."""
    return due(policy.remediation.diagnostics, record)


class DiagnosticsStep:
    """The ``Repair`` for the diagnostics step (``loops.repairs``). Its outcome is the fault's, not the repair's:
    the step writes it into the record itself (the state stays repairing) and the repair starts right after."""

    def step(self, ctx: RepairContext, node: Node, record: NodeRecord, request: RepairRequest) -> StepResult:
        return DiagnosticsJob(ctx).step(node, record, request.remediation.diagnostics)


class DiagnosticsJob:
    """One step of a fault's diagnostics Job for one node."""

    def __init__(self, ctx: RepairContext) -> None:
        self.ctx = ctx

    def step(self, node: Node, record: NodeRecord, policy: DiagnosticsPolicy) -> StepResult:
        action = record.action
        if action is None or not action.name:
            if reported_not_ready(node):  # no Job could run there: waiting for its timeout would hold the repair
                return self._skip(node, record)
            return self._start(node, record, policy)
        outcome = self.ctx.jobs.attempt_outcome(action, lambda: self._recreate(node, record, policy, action.name),
                                            lambda job: self.ctx.jobs.note_created(node, record, job))
        if outcome not in OUTCOMES:
            return InProgress(POLL_S)
        return self._finish(node, record, OUTCOMES[outcome])

    def _start(self, node: Node, record: NodeRecord, policy: DiagnosticsPolicy) -> StepResult:
        name = job_name(DIAGNOSTICS, name_of(node), self.ctx.jobs.fingerprint(record), 1)
        location = output_location(policy, name)
        started = start_action(record, DIAGNOSTICS, name, 1, self.ctx.clock(), policy.job.timeout_s, location)
        written = self.ctx.writer.write(node, started)  # the name is in the record before the create
        if written is None:
            return CONFLICT
        job = self._create(written, started, policy, name)
        if job is not None:
            self.ctx.jobs.note_created(written, started, job)
        return InProgress(POLL_S)

    def _recreate(self, node: Node, record: NodeRecord, policy: DiagnosticsPolicy, name: str) -> None:
        """Killed between the record write and the create: create it now, under the recorded name."""
        job = self._create(node, record, policy, name)
        if job is not None:
            self.ctx.jobs.note_created(node, record, job)

    def _create(self, node: Node, record: NodeRecord, policy: DiagnosticsPolicy,
                name: str) -> Mapping[str, Any] | None:
        """The Job unless it exists (lookup before create); None in dry-run."""
        env = {"DIAGNOSTICS_DIR": policy.output_dir, "DIAGNOSTICS_OUTPUT": output_location(policy, name)}
        return self.ctx.jobs.create_job(node, record, DIAGNOSTICS, name, 1, policy.job, False, env=env)

    def _skip(self, node: Node, record: NodeRecord) -> StepResult:
        """The node is not Ready (the case a reboot rung is for): no diagnostics for this fault, said once."""
        assert record.fault is not None
        result = Diagnostics(outcome=DIAGNOSTICS_SKIPPED, job="", location="", at=self.ctx.clock())
        if self.ctx.writer.write(node, dataclasses.replace(record, fault=dataclasses.replace(
                record.fault, diagnostics=result))) is None:
            return CONFLICT
        self.ctx.metrics.diagnostics.inc(outcome=DIAGNOSTICS_SKIPPED)
        self.ctx.events.node_event(name_of(node), "GPUDiagnosticsCollected", describe(result, name_of(node)),
                                   WARNING)
        return InProgress(0.0)

    def _finish(self, node: Node, record: NodeRecord, outcome: str) -> StepResult:
        """Record the outcome (the repair starts on the next step), then delete a timed-out Job and report."""
        action = record.action
        assert action is not None and record.fault is not None
        result = Diagnostics(outcome=outcome, job=action.name, location=action.detail, at=self.ctx.clock())
        after = dataclasses.replace(record, fault=dataclasses.replace(record.fault, diagnostics=result), action=None)
        if self.ctx.writer.write(node, after) is None:
            return CONFLICT
        if outcome == DIAGNOSTICS_TIMED_OUT:
            self.ctx.jobs.cancel(DIAGNOSTICS, action.name)
        self.ctx.metrics.diagnostics.inc(outcome=outcome)
        text = describe(result, name_of(node))
        self.ctx.events.node_event(name_of(node), "GPUDiagnosticsCollected", text,
                                   NORMAL if outcome == DIAGNOSTICS_OK else WARNING)
        log.info("diagnostics ended", extra={"node": name_of(node), "detail": text})
        return InProgress(0.0)


def describe(result: Diagnostics, node: str) -> str:
    """One line for the Event and explain: outcome, Job, where the output is on the node."""
    if result.outcome == DIAGNOSTICS_OK:
        return f"diagnostics collected by Job {result.job}: output on node {node} at {result.location}"
    if result.outcome == DIAGNOSTICS_SKIPPED:
        return f"diagnostics skipped: node {node} is not Ready, so no Job could run there; the repair goes on"
    return (f"diagnostics Job {result.job} {result.outcome}; the repair goes on (any output is on node {node} at "
            f"{result.location})")

