"""The ``Repair`` interface: one step of one repair action for one node, and the narrow context it gets.

The remediate loop (``loops.remediate``) picks the variant from the table in ``loops.repairs`` (action kind →
variant), hands it a ``RepairContext`` and a ``RepairRequest`` and turns the ``StepResult`` it returns into the
record's next state (``Done`` / ``Failed``: the attempt's end, the next attempt, escalation or quarantine). A
variant never sees the loop and never writes that transition; it writes only its own action's progress into the
record (the attempt started, its object created, its step) through ``writer``, before the side effect it leads to.

A variant module imports this module (and ``loops.step``), never ``loops.remediate``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuremediate.actions.events import EventRecorder
from gpuremediate.actions.nodes import Node, NodeWriter
from gpuremediate.loops.step import StepContext, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.workflow import CustomAction, JobPolicy, RemediationPolicy, Rung
from gpuremediate.signals.model import NodeReadings
from gpuremediate.vocab.record import ActionInProgress, NodeRecord


class JobActions(Protocol):
    """The Job actions a repair uses (one Job per attempt, its name in the record before the create:
    ``loops.jobs``)."""

    def fingerprint(self, record: NodeRecord) -> str: ...

    def gpu_ids(self, node: Node, record: NodeRecord) -> tuple[list[str], list[str]]: ...

    def start_job(
        self, node: Node, record: NodeRecord, kind: str, attempt: int, policy: JobPolicy, *,
        timeout_s: float, request_all_gpus: bool = False, detail: str = "",
    ) -> float | None: ...

    def create_job(
        self, node: Node, record: NodeRecord, kind: str, name: str, attempt: int, policy: JobPolicy,
        request_all_gpus: bool, env: Mapping[str, str] | None = None,
        targets: tuple[list[str], list[str]] | None = None, device_claim: str = "", boot_id: str = "",
    ) -> Mapping[str, Any] | None: ...

    def attempt_outcome(
        self, action: ActionInProgress, recreate: Callable[[], None],
        note_created: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> str: ...

    def note_created(self, node: Node, record: NodeRecord, job: Mapping[str, Any]) -> None: ...

    def read(self, name: str) -> Mapping[str, Any] | None:
        """The attempt's Job as the cache (or the server) holds it."""

    def cancel(self, kind: str, name: str, *, with_pods: bool = False) -> None: ...


class WritesNodes(Protocol):
    """What a resync hook gets: the node writer and Events (a loop's whole context has them)."""

    @property
    def writer(self) -> NodeWriter: ...

    @property
    def events(self) -> EventRecorder: ...


class RepairContext(StepContext, Protocol):
    """What a repair step may use: the shared context (the node writer, the API client for custom resources and a
    node's pods, Events, the clock, its node's policy: [remediation], [gpu_operator] ...), the Job actions, the
    latest readings and the cluster's custom actions."""

    @property
    def jobs(self) -> JobActions: ...

    @property
    def readings(self) -> Mapping[str, NodeReadings]: ...

    @property
    def actions(self) -> Mapping[str, CustomAction]:
        """The cluster's ``[actions.<name>]``."""

    @property
    def namespace(self) -> str:
        """The controller's namespace (its ConfigMaps: ``gpuremediate-replaced``)."""

    @property
    def resync_s(self) -> float: ...

    def breaker_open(self) -> bool: ...


@dataclass(frozen=True)
class RepairRequest:
    """What the loop asks of a step: the action kind to run (an attempt in flight keeps the kind it was started
    as), the escalation ladder's rung running it, and the attempts that rung allows."""

    kind: str
    rung: Rung
    attempts: int
    remediation: RemediationPolicy


class Repair(Protocol):
    def step(self, ctx: RepairContext, node: Node, record: NodeRecord, request: RepairRequest) -> StepResult:
        """One step: read, decide, write the action's own progress, return what the loop does next."""


@dataclass(frozen=True)
class RepairRow:
    """One row of the table: ``matches`` picks the variant for a step (rows are tried in order, the first that
    matches runs); ``guarded``: it calls a plugin's kind, so a 403 blocks the node (``blocked: permission``)
    rather than failing the step; ``resync``: an optional hook the loop runs per owned node on its resync."""

    kind: str
    matches: Callable[[Policy, Node, NodeRecord, str], bool]
    make: Callable[[], Repair]
    guarded: bool = False
    resync: Callable[[WritesNodes, Node, set[str]], object] | None = None
