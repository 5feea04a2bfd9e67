"""What one step of a drain or repair variant returns to its loop (controller-runtime's read → decide → write →
requeue, kured's one-method Drainer/Rebooter): still going with a requeue, done, or failed with a reason.

The loop that ran the step owns what follows: the terminal state transition written into the record (drain
complete or failed; the repair attempt's end, the next attempt, escalation or quarantine), its metrics and Events,
then ``then`` (a clean-up that must come after the record, such as deleting a completed DrainRequest).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuremediate.actions.custom import PermissionBackoff
from gpuremediate.actions.events import EventRecorder
from gpuremediate.actions.nodes import Node, NodeWriter
from gpuremediate.kube.client import KubeClient
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.policy.config import Policy
from gpuremediate.vocab.record import ActionInProgress, NodeRecord


class StepContext(Protocol):
    """What every variant's step may use (``loops.base.LoopView``); ``DrainContext`` and ``RepairContext`` add
    their own."""

    @property
    def writer(self) -> NodeWriter: ...

    @property
    def client(self) -> KubeClient: ...

    @property
    def events(self) -> EventRecorder: ...

    @property
    def metrics(self) -> ControllerMetrics: ...

    @property
    def permissions(self) -> PermissionBackoff: ...

    @property
    def policy(self) -> Policy:
        """The node's policy."""

    def clock(self) -> float: ...

    def check_shape(self, node: Node, kind: str, obj: Mapping[str, Any]) -> None:
        """Report a plugin resource whose ``status.conditions`` has the wrong shape (once)."""


CONFLICT_RETRY_S = 0.2  # a 409 on a write: the next step reads the node again and decides again


@dataclass(frozen=True)
class InProgress:
    """Not finished: the loop requeues the node after ``requeue_s`` (None: only an event or a resync queues it)."""

    requeue_s: float | None


CONFLICT = InProgress(CONFLICT_RETRY_S)


@dataclass(frozen=True)
class Done:
    """Finished well. ``detail`` says what was done (the repair attempt's history line)."""

    detail: str = ""
    at: float | None = None  # when the variant saw it done (None: the loop's clock now)
    then: Callable[[], None] | None = None  # run once the record says so
    max_attempts: int | None = None  # the attempts this action runs under where its own policy says (repair)
    written: tuple[Node, NodeRecord] | None = None  # the node and record as the variant last wrote them


@dataclass(frozen=True)
class Failed:
    """Finished badly, for ``reason``. ``cancel``: the action's object to delete once the record says so."""

    reason: str
    at: float | None = None
    then: Callable[[], None] | None = None
    max_attempts: int | None = None
    cancel: ActionInProgress | None = None
    written: tuple[Node, NodeRecord] | None = None


StepResult = InProgress | Done | Failed
