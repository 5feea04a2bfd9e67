"""What a replay found: every transition, wait, breaker trip and fault left alone, and the cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuremediate.replay.replaced import Replaced
from gpuremediate.vocab import states

# Faults seen but not acted on, by why.
UNKNOWN = "unknown"  # the node's metrics were unreadable: its health was unknown
EXCLUDED = "excluded"  # the node is labelled gpuremediate.io/exclude=true
NOTICE = "notice"  # the policy's action for it is "none": an Event, nothing else
BELOW_THRESHOLD = "below-threshold"  # a raw signal the policy does not count as a fault (threshold, rule off)
BREAKER_HELD = "breaker-held"  # a fault found while the circuit breaker was open: no new work
UNACTED_CATEGORIES = (UNKNOWN, EXCLUDED, NOTICE, BELOW_THRESHOLD, BREAKER_HELD)

# The [degradation] detector's finding kinds (issue 29, docs/degradation.md), as vocab/findings names them.
DEGRADATION_KINDS = ("slow-gpu", "link-degraded", "trend")


@dataclass(frozen=True)
class Move:
    at: float
    node: str
    from_state: str
    to_state: str
    reason: str
    message: str


@dataclass(frozen=True)
class Span:
    """The node was in ``state`` (not healthy) from ``start`` to ``end``, out of service with ``gpus`` of its GPUs
    (None: all of them; GPU-level isolation takes one) because of ``fault`` (its class: ``xid 48``, ``thermal``)."""

    node: str
    state: str
    start: float
    end: float
    gpus: int | None = None
    fault: str = ""


@dataclass(frozen=True)
class Wait:
    """The node waited (record ``blocked``): for the budget, the breaker, a PDB..."""

    node: str
    reason: str
    detail: str
    start: float
    end: float


@dataclass(frozen=True)
class Unacted:
    node: str
    category: str  # one of UNACTED_CATEGORIES
    detail: str
    start: float
    end: float  # == start for a one-off sighting


@dataclass(frozen=True)
class Sighting:
    """A degradation finding (slow-gpu, link-degraded, trend) the detector held from ``start`` to ``end`` (the end of
    the range while it lasted), with the action its policy gives it (cordon, drain, none); or a node's
    workload-gpu-errors finding (``[workload]``: its pods failing with GPU errors), while the signal gave it."""

    node: str
    kind: str  # one of DEGRADATION_KINDS, or KIND_WORKLOAD
    code: str  # sm-clock; pcie, nvlink; sbe-rate, remapped-rows, retired-pending; admission, container
    gpus: tuple[str, ...]
    action: str
    start: float
    end: float
    message: str
    ongoing: bool = False  # still found at the end of the range


@dataclass(frozen=True)
class Maintenance:
    """A MaintenanceRequest the controller would have filed for a node's trends (``trend_action = "maintenance"``):
    filed at ``at``, its drain starting at ``drain_at`` (the trend window's next opening)."""

    node: str
    name: str
    at: float
    drain_at: float
    trends: tuple[str, ...]  # the trend fingerprints it covers


@dataclass(frozen=True)
class BreakerTrip:
    at: float
    node: str
    reason: str


@dataclass
class ReplayResult:
    policy: str
    start: float
    end: float
    step_s: float
    gpus: dict[str, int]  # every GPU node replayed -> its GPU count
    moves: list[Move] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    unacted: list[Unacted] = field(default_factory=list)
    trips: list[BreakerTrip] = field(default_factory=list)
    findings: list[Sighting] = field(default_factory=list)  # degradation findings, by start
    workload_findings: list[Sighting] = field(default_factory=list)  # workload-gpu-errors findings, by start
    failed_pods: int = 0  # in the history
    gpu_failed_pods: int = 0  # of them, failed with a GPU error on a replayed node (the workload signal's input)
    maintenances: list[Maintenance] = field(default_factory=list)
    replaced: list[Replaced] = field(default_factory=list)  # from the controller's history (replay.replaced)
    notes: list[str] = field(default_factory=list)
    steps: int = 0  # simulated instants the engine visited
    changes: int = 0  # change points in the history
    seconds: float = 0.0  # wall time of the replay

    @property
    def affected(self) -> list[str]:
        return sorted({m.node for m in self.moves} | {u.node for u in self.unacted if u.category != UNKNOWN}
                      | {r.node for r in self.replaced}
                      | {w.node for w in self.waits} | {f.node for f in (*self.findings, *self.workload_findings)})

    def node_hours(self, node: str | None = None) -> float:
        """Hours out of service (any state but healthy), for one node or the fleet."""
        return sum(s.end - s.start for s in self.spans if node is None or s.node == node) / 3600.0

    def gpu_hours(self, node: str | None = None) -> float:
        return sum(self._span_gpu_hours(s) for s in self.spans if node is None or s.node == node)

    def _span_gpu_hours(self, span: Span) -> float:
        gpus = self.gpus.get(span.node, 0) if span.gpus is None else min(span.gpus, self.gpus.get(span.node, 0))
        return (span.end - span.start) * gpus / 3600.0

    def gpu_hours_by_fault(self) -> dict[str, float]:
        """GPU-hours out of service per fault class (what opened each flow)."""
        found: dict[str, float] = {}
        for span in self.spans:
            found[span.fault] = found.get(span.fault, 0.0) + self._span_gpu_hours(span)
        return dict(sorted(found.items()))

    def gpu_level_flows(self) -> int:
        """Flows that began GPU-level (one GPU out, the node in service)."""
        return sum(1 for s in self.spans if s.gpus is not None and s.state == states.DRAINING)

    def findings_by_kind(self) -> dict[str, int]:
        """Degradation findings per kind (every kind, 0 included)."""
        return {kind: sum(1 for f in self.findings if f.kind == kind) for kind in DEGRADATION_KINDS}

    def final_states(self) -> dict[str, str]:
        final: dict[str, str] = {}
        for move in self.moves:
            final[move.node] = move.to_state
        return final

    def count_to(self, state: str) -> int:
        return sum(1 for m in self.moves if m.to_state == state)

    def summary(self) -> dict[str, Any]:
        finals = self.final_states()
        return {
            "nodes": len(self.gpus),
            "gpus": sum(self.gpus.values()),
            "nodes_acted_on": len({m.node for m in self.moves}),
            "transitions": len(self.moves),
            "drains": self.count_to(states.DRAINING),
            "repairs": self.count_to(states.REPAIRING),
            "quarantines": self.count_to(states.QUARANTINED),
            "cordons": self.count_to(states.CORDONED),
            "quarantined_at_end": sorted(n for n, s in finals.items() if s == states.QUARANTINED),
            "breaker_trips": len(self.trips),
            "budget_waits": sum(1 for w in self.waits if w.reason == "budget"),
            "node_hours_out_of_service": round(self.node_hours(), 3),
            "gpu_hours_out_of_service": round(self.gpu_hours(), 3),
            "gpu_hours_by_fault": {k: round(v, 3) for k, v in self.gpu_hours_by_fault().items()},
            "gpu_level_flows": self.gpu_level_flows(),
            "unacted": {c: sum(1 for u in self.unacted if u.category == c) for c in UNACTED_CATEGORIES},
            "degradation_findings": self.findings_by_kind(),
            "maintenances_scheduled": len(self.maintenances),
            "workload_findings": len(self.workload_findings),
            "failed_pods": {"in_history": self.failed_pods, "gpu_errors": self.gpu_failed_pods},
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "start": self.start,
            "end": self.end,
            "step_s": self.step_s,
            "summary": self.summary(),
            "transitions": [asdict(m) for m in self.moves],
            "out_of_service": [asdict(s) for s in self.spans],
            "waits": [asdict(w) for w in self.waits],
            "breaker_trips": [asdict(t) for t in self.trips],
            "not_acted_on": [asdict(u) for u in self.unacted],
            "degradation_findings": [asdict(f) for f in self.findings],
            "maintenances": [asdict(m) for m in self.maintenances],
            "workload_findings": [asdict(f) for f in self.workload_findings],
            "replaced": [asdict(r) for r in self.replaced],
            "per_node": {n: {"node_hours": round(self.node_hours(n), 3), "gpu_hours": round(self.gpu_hours(n), 3)}
                         for n in self.affected},
            "notes": self.notes,
            "engine": {"steps": self.steps, "history_changes": self.changes, "seconds": round(self.seconds, 3)},
        }
