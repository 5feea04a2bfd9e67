"""Pure safety rules: the disruption budget, the circuit breaker, the repeat-offender rule (design §4).

Budget
    ``Budget(max_unavailable)`` takes an int (``2``) or a percentage string (``"25%"``) of the GPU
    nodes. :func:`budget_check` says whether one more node may be drained; :func:`admit` picks, from
    several candidates at once, at most the remaining budget (oldest fault first, then by name).

    A node is *out of service* (counts against the budget, once) when it is NotReady, unschedulable
    for any reason (a person's cordon, another tool's), or in draining/repairing/validating.
    One exception: a node we cordoned at once for a fatal fault that is still *waiting* for the
    budget (state draining, no drain started) does not count: its workloads still run, and counting
    it would let a burst of faults block every drain forever.

    A GPU-level flow (``[isolation] scope = "gpu"``: one GPU out by a DeviceTaintRule, the node schedulable) counts
    in GPUs: its isolated GPUs' share of the node (1/8 on an 8-GPU node), so eight such flows fill one node's slot.
    A node whose GPU count is unknown, or that is unschedulable or NotReady besides, counts whole.

    Percentages round DOWN, never below 1 (a 3-node pool at 25% can still repair one node);
    ``0`` and ``"0%"`` mean no drain at all. Kubernetes rounds both ways: a Deployment's
    ``maxUnavailable`` rounds down, a PDB's and a DaemonSet's round up. Rounding down is the safe
    side here: an extra GPU node out of service costs training capacity, one fewer only delays a
    repair.

Circuit breaker
    :class:`CircuitBreaker` is a frozen, JSON-serialisable value: ``record_fault`` and ``evaluate``
    return a new breaker. It opens when more than ``threshold_pct`` % of the GPU nodes faulted
    within ``window_s`` (and at least ``min_nodes`` did), and stays open until ``reset`` by a person.

    It also judges how fast faults arrive (:class:`Look`, issue 49): a source hands a storm over in installments
    (Prometheus' scrape targets each at its own phase, a direct read's exporters, the agents' conditions), and a
    storm's first nodes look exactly like its last. When more than ``look_nodes`` nodes, or more than
    ``look_percent`` % of the GPU nodes, fault within ``look_window_s``, new faults are held for a bounded look
    (``look_s``): if the faults counted pass the threshold meanwhile the breaker opens with none of the held ones
    acted on; if not, the look ends and the held faults go on at once (:meth:`CircuitBreaker.judge`).

Failure domains
    A :class:`DomainBudget` caps the nodes out of service within each value of one node label
    ("at most 1 node per ``topology.kubernetes.io/rack``"); :func:`admit` and :func:`budget_check`
    apply the fleet-wide budget and every domain budget together. A node without the label is in no
    domain of that key. :func:`clustered_domains` finds the label values (rack, NVLink domain, driver
    version...) on which recent faults cluster, so work stops in that domain only.

Pause
    :class:`Pause` is a person's (or a tool's) switch: while paused, no new work starts anywhere.

Repeat offender
    :func:`repeat_offender` is true when the node's repair history holds ``count`` or more repairs
    within ``window_s`` before ``now`` (the window edge ``now - window_s`` is inside; ``count <= 0``
    switches the rule off).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpuremediate.gpu_resources import gpu_count
from gpuremediate.vocab import states
from gpuremediate.vocab.record import (  # BLOCK_*: the admission reasons, re-exported for the loops
    BLOCK_GATE,  # noqa: F401
    BLOCK_PAUSED,  # noqa: F401
    OUTCOME_REPAIR_FAILED,
    OUTCOME_REPAIRED,
    HistoryEntry,
    NodeRecord,
    RecordError,
    isolated_at_gpu,
    node_unschedulable,
    record_from_node,
)

DEFAULT_REPEAT_COUNT = 3
DEFAULT_REPEAT_WINDOW_S = 7 * 24 * 3600.0
REPAIR_OUTCOMES = frozenset({OUTCOME_REPAIRED, OUTCOME_REPAIR_FAILED})

_PERCENT = re.compile(r"(\d{1,3})%", re.ASCII)



# ---- budget ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """What the budget needs to know about one GPU node."""

    name: str
    unschedulable: bool = False  # spec.unschedulable, whoever set it
    ready: bool = True  # condition Ready is True
    state: str = states.HEALTHY  # our record's state (healthy when none)
    waiting: bool = False  # we cordoned it for a fault but have not started draining it
    first_seen: float | None = None  # when its open fault was first seen (admission order)
    since: float | None = None  # when its record entered its state (a budget's reason says since when it holds)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)  # for failure domains
    gpus: int = 0  # the node's GPUs (0: unknown)
    gpus_out: int | None = None  # a GPU-level flow: the GPUs it isolates (None: the flow, if any, is node-level)

    @property
    def share(self) -> Fraction:
        """How much of a node slot it takes while out of service: all of it, or a GPU-level flow's GPUs' share."""
        if self.gpus_out is None or self.gpus <= 0 or not self.ready or self.unschedulable:
            return Fraction(1)
        return Fraction(min(self.gpus_out, self.gpus), self.gpus)

    @property
    def out_of_service(self) -> bool:
        if not self.ready:
            return True
        if self.waiting:
            return False
        return self.unschedulable or self.state in states.ACTIVE_STATES

    @property
    def held(self) -> bool:
        """Out of service while it only waits: for a person (quarantined) or to cool down (thermal cordon)."""
        return self.ready and self.state in (states.QUARANTINED, states.CORDONED)

    def describe(self) -> str:
        """``gpu-node-2: quarantined since 2026-11-01T10:00:00Z, needs a person`` for a budget's reason (since
        when: from its record; a node NotReady or cordoned by someone else has no such time to say)."""
        if not self.ready:
            return f"{self.name}: not Ready"
        if self.state == states.HEALTHY:
            return f"{self.name}: unschedulable"
        since = f" since {_utc(self.since)}" if self.since else ""
        then = {states.QUARANTINED: ", needs a person", states.CORDONED: ", cooling down"}.get(self.state, "")
        part = f" ({self.share.numerator}/{self.share.denominator} of its GPUs)" if self.share < 1 else ""
        return f"{self.name}: {self.state}{part}{since}{then}"


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def counts_against(view: NodeView, budget: Budget) -> bool:
    """Whether the node takes a slot of ``budget`` now."""
    return view.out_of_service and (budget.count_held or not view.held)


def notable(view: NodeView) -> bool:
    """Whether the budget needs the node's view: all but a Ready, schedulable node in no flow of ours. Such a node
    takes no slot, waits for no admission and is in no domain's count of nodes out; it counts only toward the
    fleet's and its domains' sizes (``FleetSize``)."""
    return not view.ready or view.unschedulable or view.state != states.HEALTHY


@dataclass(frozen=True)
class FleetSize:
    """How many GPU nodes there are, in all and per domain, where the views handed to the budget are not all of
    them but the ``notable`` ones and the candidates: at 100,000 nodes a view of every Node per admission and per
    gauge update held the interpreter while faults waited, and kept 100,000 views in memory."""

    nodes: int
    members: Callable[[str, str], int]  # (label, value): how many GPU nodes carry that value of the label


def _total(gpu_nodes: Sequence[NodeView], size: FleetSize | None) -> int:
    return size.nodes if size is not None else len(gpu_nodes)


def node_view(node: Mapping[str, Any]) -> NodeView:
    """A NodeView from a Node object (its record, spec.unschedulable and Ready condition)."""
    metadata = node.get("metadata") or {}
    record = record_from_node(node)
    labels = metadata.get("labels") or {}
    view = NodeView(name=str(metadata.get("name", "")), unschedulable=node_unschedulable(node), ready=_ready(node),
                    labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
                    gpus=gpu_count(node))
    if record is None or isinstance(record, RecordError):
        return view  # a malformed record counts by what the node shows, never less
    return dataclasses.replace(
        view,
        state=record.state,
        waiting=is_waiting(record),
        first_seen=record.fault.first_seen if record.fault else None,
        since=record.since or None,
        gpus_out=1 if record.isolation is not None and record.isolation.at_gpu else None,
    )


def is_waiting(record: NodeRecord) -> bool:
    """Cordoned by us at once for a fault (or, GPU-level, its GPU tainted NoSchedule), drain not started yet: holds
    no budget slot. A GPU-level flow counted while it waits would deadlock a burst as a cordoned node would."""
    return (
        record.state == states.DRAINING
        and record.action is None
        and ((record.cordoned_by_us and not record.was_unschedulable) or isolated_at_gpu(record))
    )


def _ready(node: Mapping[str, Any]) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False  # no Ready condition: not known to be serving, so it counts as out


@dataclass(frozen=True)
class Budget:
    max_unavailable: int | str = "25%"
    count_held: bool = True  # nodes that only wait (quarantined, thermal-cordoned) count against the limit

    def __post_init__(self) -> None:
        value = self.max_unavailable
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"maxUnavailable must be an int or 'N%', not {value!r}")
        if isinstance(value, int) and value < 0:
            raise ValueError(f"maxUnavailable must be >= 0, got {value}")
        if isinstance(value, str):
            match = _PERCENT.fullmatch(value.strip())
            if match is None or int(match.group(1)) > 100:
                raise ValueError(f"maxUnavailable {value!r} is not an int or a percentage '0%'..'100%'")

    def limit(self, total_nodes: int) -> int:
        """How many GPU nodes may be out of service at once among ``total_nodes``."""
        value = self.max_unavailable
        if isinstance(value, int):
            return value
        percent = int(value.strip().rstrip("%"))
        if percent == 0:
            return 0
        return max(1, math.floor(total_nodes * percent / 100))


@dataclass(frozen=True)
class BudgetResult:
    allowed: bool
    in_use: float  # GPU node slots in use now (the candidate included when it already is; a GPU-level flow a share)
    limit: int
    reason: str


@dataclass(frozen=True)
class DomainBudget:
    """At most ``max_unavailable`` nodes out of service among the nodes sharing one value of ``label``."""

    label: str
    max_unavailable: int | str = 1

    def __post_init__(self) -> None:
        if not self.label:
            raise ValueError("a domain budget needs a node label")
        Budget(self.max_unavailable)  # the same count / percentage rules

    def limit(self, domain_size: int) -> int:
        return Budget(self.max_unavailable).limit(domain_size)


def budget_check(
    gpu_nodes: Sequence[NodeView], candidate: str, budget: Budget | None = None,
    domains: Sequence[DomainBudget] = (), size: FleetSize | None = None,
) -> BudgetResult:
    """May ``candidate`` be taken out of service along with the nodes already out? ``gpu_nodes``: every GPU node,
    or (with ``size``) at least the notable ones and the candidate."""
    budget = budget or Budget()
    _require_known(gpu_nodes, [candidate])
    limit = budget.limit(_total(gpu_nodes, size))
    by_name = {v.name: v for v in gpu_nodes}
    others = sorted((v for v in gpu_nodes if v.name != candidate and counts_against(v, budget)), key=lambda v: v.name)
    used = _slots(others)
    in_use = float(used + (by_name[candidate].share if counts_against(by_name[candidate], budget) else 0))
    if used + by_name[candidate].share > limit:
        names = "; ".join(v.describe() for v in others) if others else "none"
        held = " ([budget].count_held = false lets repairs pass nodes that only wait)" if any(
            v.held for v in others) else ""
        over = _over_why(others, used, limit)
        reason = f"budget full: {_shown(used)} of {limit} out of service ({names}){held}{over}"
        return BudgetResult(False, in_use, limit, reason)
    for domain in domains:
        full = _domain_full(gpu_nodes, by_name[candidate], domain,
                            {v.name for v in gpu_nodes if counts_against(v, budget)}, size)
        if full:
            return BudgetResult(False, in_use, limit, full)
    return BudgetResult(True, in_use, limit, f"within budget: {_shown(used)} other of {limit} in use")


def admit(
    gpu_nodes: Sequence[NodeView], candidates: Sequence[str], budget: Budget | None = None,
    domains: Sequence[DomainBudget] = (), size: FleetSize | None = None,
) -> list[str]:
    """The candidates that may start now, oldest fault first (then by name), while the nodes out of
    service, admitted ones included, stay within the limit and within every domain budget. A
    candidate already out of service (NotReady, a person's cordon) still has to fit: it takes its
    slot as any other. ``size``: as for ``budget_check``."""
    budget = budget or Budget()
    _require_known(gpu_nodes, candidates)
    limit = budget.limit(_total(gpu_nodes, size))
    out = {v.name for v in gpu_nodes if counts_against(v, budget)}
    by_name = {v.name: v for v in gpu_nodes}
    used = _slots(by_name[n] for n in out)  # kept as candidates are added: a sum per candidate was quadratic
    admitted = []
    for name in sorted(set(candidates), key=lambda n: admission_order(by_name[n])):
        adds = Fraction(0) if name in out else by_name[name].share
        if used + adds > limit:
            continue
        if any(_domain_full(gpu_nodes, by_name[name], domain, out, size) for domain in domains):
            continue
        out.add(name)
        used += adds
        admitted.append(name)
    return admitted


def domain_admission(gpu_nodes: Sequence[NodeView], members: Collection[str], budget: Budget | None = None,
                     size: FleetSize | None = None) -> BudgetResult:
    """May a domain action take all ``members`` (the trays of one NVLink domain) out of service together? The
    fleet-wide budget counts each tray whole, out of service or not yet: all or none. The domain budgets are for
    ordinary repairs (at most so many trays of a rack out at once) and do not hold a decision about the whole
    domain."""
    budget = budget or Budget()
    _require_known(gpu_nodes, list(members))
    limit = budget.limit(_total(gpu_nodes, size))
    others = sorted((v for v in gpu_nodes if v.name not in members and counts_against(v, budget)),
                    key=lambda v: v.name)
    used = _slots(others)
    in_use = float(used + len(members))
    if used + len(members) > limit:
        names = "; ".join(v.describe() for v in others[:10]) + ("; ..." if len(others) > 10 else "") or "none"
        return BudgetResult(False, in_use, limit, f"budget full for the domain's {len(members)} trays together: "
                                                  f"{_shown(used)} other of {limit} out of service ({names})")
    return BudgetResult(True, in_use, limit, f"within budget: the domain's {len(members)} trays and "
                                             f"{_shown(used)} other of {limit}")


def _domain_full(gpu_nodes: Sequence[NodeView], candidate: NodeView, domain: DomainBudget, out: set[str],
                 size: FleetSize | None = None) -> str:
    """Why ``candidate`` would overfill its ``domain`` ("" when it fits or has no such label)."""
    value = candidate.labels.get(domain.label)
    if value is None:
        return ""
    members = [v for v in gpu_nodes if v.labels.get(domain.label) == value]
    limit = domain.limit(size.members(domain.label, value) if size is not None else len(members))
    others = sorted((v for v in members if v.name in out and v.name != candidate.name), key=lambda v: v.name)
    if _slots(others) + candidate.share <= limit:
        return ""
    names = ", ".join(v.name for v in others) if others else "none"
    return f"domain budget full: {domain.label}={value}: {_shown(_slots(others))} of {limit} out of service ({names})"


def _over_why(others: Sequence[NodeView], used: Fraction, limit: int) -> str:
    """Why more than the limit can be out (\"3 of 2\" reads as a contradiction): drains are admitted within it, but
    every node out of service counts, and some are taken out without asking the budget."""
    if used <= limit:
        return ""
    outside = [v.name for v in others if not v.ready or v.state == states.HEALTHY]
    held = [v.name for v in others if v.ready and v.state in (states.QUARANTINED, states.CORDONED)]
    causes = ([f"NotReady or cordoned by someone else ({', '.join(outside)})"] if outside else []) + \
        ([f"quarantined or cordoned while hot, which never waits for the budget ({', '.join(held)})"] if held else [])
    because = " and ".join(causes) or \
        "admitted while the limit allowed them (a smaller fleet or a new policy lowered it)"
    return f"; over {limit} because every node out of service counts, not only gpuremediate's drains: {because}"


def _slots(views: Iterable[NodeView]) -> Fraction:
    """The node slots ``views`` take: one each, a GPU-level flow its GPUs' share."""
    return sum((v.share for v in views), Fraction(0))


def _shown(slots: Fraction) -> str:
    return str(int(slots)) if slots.denominator == 1 else f"{float(slots):.3g}"


def admission_order(view: NodeView) -> tuple[float, str]:
    """The order candidates are admitted in: oldest fault first (a node with none last), then by name."""
    return (math.inf if view.first_seen is None else view.first_seen), view.name


def _require_known(gpu_nodes: Sequence[NodeView], names: Sequence[str]) -> None:
    known = {v.name for v in gpu_nodes}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"not among the GPU nodes: {', '.join(unknown)}")


# ---- circuit breaker ------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainTrip:
    """One failure domain (a node label's value) whose nodes faulted together."""

    label: str
    value: str
    reason: str
    opened_at: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DomainTrip:
        return cls(label=str(data["label"]), value=str(data["value"]), reason=str(data.get("reason", "")),
                   opened_at=float(data["opened_at"]))


def clustered_domains(
    gpu_nodes: Sequence[NodeView], faulted: Collection[str], labels: Sequence[str], threshold_pct: float,
    min_nodes: int, now: float, window_s: float,
) -> list[DomainTrip]:
    """The label values shared by at least ``min_nodes`` recently faulted nodes that make up more than
    ``threshold_pct`` % of the nodes with that value: the common label of a clustered failure."""
    trips = []
    for label in labels:
        members: dict[str, list[str]] = {}
        for view in gpu_nodes:
            if label in view.labels:
                members.setdefault(view.labels[label], []).append(view.name)
        for value, names in sorted(members.items()):
            hit = sorted(n for n in names if n in faulted)
            if len(hit) >= max(1, min_nodes) and len(hit) * 100 > threshold_pct * len(names):
                reason = (f"{len(hit)} of {len(names)} nodes with {label}={value} faulted within {window_s:g}s "
                          f"({', '.join(hit)})")
                trips.append(DomainTrip(label, value, reason, now))
    return trips


LOOK_RELEASED = "released"  # the look ended under the threshold: its held faults go on
LOOK_OPENED = "opened"  # the storm passed the threshold during the look: the breaker holds them


@dataclass(frozen=True)
class LookRate:
    """``[breaker]``'s arrival rate: a look opens when more than ``nodes`` GPU nodes, or more than ``percent`` % of
    them, fault within ``window_s`` (at least ``min_nodes``); it lasts ``look_s`` (0: no look)."""

    nodes: int = 10
    percent: float = 10.0
    window_s: float = 30.0
    look_s: float = 20.0
    min_nodes: int = 3

    def __post_init__(self) -> None:
        if self.nodes < 1 or not 0 < self.percent <= 100 or self.window_s <= 0 or self.look_s < 0 \
                or self.min_nodes < 1:
            raise ValueError(f"look rate out of range: nodes={self.nodes} (>= 1), percent={self.percent:g} "
                             f"(0-100], window_s={self.window_s:g} (> 0), look_s={self.look_s:g} (>= 0), "
                             f"min_nodes={self.min_nodes} (>= 1)")

    def limit(self, total_gpu_nodes: int) -> int:
        """Most nodes that may fault within the window without a look: the lower of the two, never below
        ``min_nodes - 1`` (fewer than the breaker's ``min_nodes`` can never open it, so a look could not change
        what happens to them)."""
        by_share = math.floor(total_gpu_nodes * self.percent / 100)
        return max(self.min_nodes - 1, min(self.nodes, by_share))


@dataclass(frozen=True)
class Look:
    """Faults arrived faster than the policy's rate: new work on them waits until ``until`` to see whether the
    storm passes the breaker's threshold. ``nodes``: the faults held (arrived since it opened, the first included).
    Ended: ``outcome`` LOOK_RELEASED (they go on) or LOOK_OPENED (the breaker opened: they stay held)."""

    opened_at: float
    until: float
    reason: str
    nodes: tuple[str, ...] = ()
    ended_at: float | None = None
    outcome: str = ""

    @property
    def looking(self) -> bool:
        return self.ended_at is None

    @functools.cached_property
    def node_set(self) -> frozenset[str]:
        return frozenset(self.nodes)

    def holds(self, node: str) -> bool:
        """The node's new work waits for this look."""
        return self.looking and node in self.node_set

    def describe(self, now: float) -> str:
        """One line for ``status`` / ``breaker status``."""
        if self.looking:
            left = max(0.0, self.until - now)
            return (f"{len(self.nodes)} new faults held for a storm look, {left:.0f} s left "
                    f"(until {_utc(self.until)}): {self.reason}")
        return (f"the last storm look ({_utc(self.opened_at)}, {len(self.nodes)} faults held) ended "
                f"{'under the threshold: they went on' if self.outcome == LOOK_RELEASED else 'with the breaker open'}")

    def to_dict(self) -> dict[str, Any]:
        return {"opened_at": self.opened_at, "until": self.until, "reason": self.reason, "nodes": list(self.nodes),
                "ended_at": self.ended_at, "outcome": self.outcome}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Look:
        ended = data.get("ended_at")
        outcome = str(data.get("outcome", ""))
        if outcome not in ("", LOOK_RELEASED, LOOK_OPENED):
            raise ValueError(f"look.outcome {outcome!r} is not one of {LOOK_RELEASED}, {LOOK_OPENED}")
        nodes = data.get("nodes", [])
        if not isinstance(nodes, list):
            raise ValueError(f"look.nodes must be a list, not {nodes!r}")
        return cls(opened_at=float(data["opened_at"]), until=float(data["until"]), reason=str(data.get("reason", "")),
                   nodes=tuple(str(n) for n in nodes), ended_at=None if ended is None else float(ended),
                   outcome=outcome)


@dataclass(frozen=True)
class CircuitBreaker:
    open: bool = False
    opened_at: float | None = None
    reason: str = ""
    faults: tuple[tuple[str, float], ...] = ()  # (node, time) of faults, pruned to the window
    reset_by: str = ""
    reset_at: float | None = None
    domains: tuple[DomainTrip, ...] = ()  # failure domains where faults clustered: work stops there only
    look: Look | None = None  # the latest storm look (an ended one says how it ended until the next opens)

    @property
    def is_open(self) -> bool:
        return self.open

    @property
    def looking(self) -> Look | None:
        """The look under way, if any."""
        return self.look if self.look is not None and self.look.looking else None

    def arrivals(self, now: float, window_s: float) -> set[str]:
        """The nodes whose faults arrived within ``window_s`` and since the last look ended (its faults were
        judged: they do not count towards the next look)."""
        since = now - window_s
        if self.look is not None and self.look.ended_at is not None:
            since = max(since, self.look.ended_at)
        return {node for node, at in self.faults if at >= since}

    def judge(self, names: Sequence[str], total_gpu_nodes: int, now: float, threshold_pct: float, window_s: float,
              min_nodes: int, rate: LookRate | None) -> CircuitBreaker:
        """A batch of new faults (``names``: nodes just found faulted, none held yet): counted, the breaker
        evaluated, and the arrival rate judged. A node the last look released is not counted again (it was when it
        arrived). Past the threshold the breaker opens and a look under way ends (its faults stay held by the
        open breaker); during a look the batch joins it; faster than ``rate`` a look opens with the batch."""
        released = self.look.node_set if self.look is not None and self.look.outcome == LOOK_RELEASED else frozenset()
        new = [n for n in dict.fromkeys(names) if n not in released]
        after = self
        for name in new:
            after = after.record_fault(name, now)
        after = after.evaluate(total_gpu_nodes, now, threshold_pct, window_s, min_nodes)
        return after._watch(new, total_gpu_nodes, now, threshold_pct, rate)

    def _watch(self, new: Sequence[str], total: int, now: float, threshold_pct: float,
               rate: LookRate | None) -> CircuitBreaker:
        look = self.looking
        if look is not None:
            added = tuple(n for n in new if n not in look.node_set)
            joined = dataclasses.replace(self, look=dataclasses.replace(look, nodes=(*look.nodes, *added))) \
                if added else self
            return joined.end_look(now) if self.open else joined
        if self.open:
            return self
        if rate is None or not rate.look_s or not new:
            return self
        arrived = self.arrivals(now, rate.window_s)
        limit = rate.limit(total)
        if len(arrived) <= limit:
            return self
        threshold = math.floor(total * threshold_pct / 100) + 1
        reason = (f"{len(arrived)} GPU nodes faulted within {rate.window_s:g}s, more than {limit} (the policy's "
                  f"[breaker] look_nodes {rate.nodes} / look_percent {rate.percent:g}% of {total}): new faults wait "
                  f"up to {rate.look_s:g}s to see whether the storm reaches the breaker's threshold "
                  f"({max(threshold, rate.min_nodes)} of {total})")
        return dataclasses.replace(self, look=Look(opened_at=now, until=now + rate.look_s, reason=reason,
                                                   nodes=tuple(new)))

    def end_look(self, now: float) -> CircuitBreaker:
        """The look under way ends: released (its faults go on), or, with the breaker open, held by it."""
        look = self.looking
        if look is None:
            return self
        outcome = LOOK_OPENED if self.open else LOOK_RELEASED
        return dataclasses.replace(self, look=dataclasses.replace(look, ended_at=now, outcome=outcome))

    def blocks(self, view: NodeView, acting_for: str = "") -> str:
        """Why no new work may start on this node ("" when none): the whole breaker or its domain's.
        ``acting_for``: the label of the domain whose own decision (a domain action) the work is: that domain's
        breaker does not hold it (the whole breaker and the node's other domains still do)."""
        if self.open:
            return f"circuit breaker open: {self.reason}"
        for trip in self.domains:
            if view.labels.get(trip.label) == trip.value and trip.label != acting_for:
                return f"domain breaker open for {trip.label}={trip.value}: {trip.reason}"
        return ""

    def evaluate_domains(
        self, gpu_nodes: Sequence[NodeView], now: float, labels: Sequence[str], threshold_pct: float,
        window_s: float, min_nodes: int = 2,
    ) -> CircuitBreaker:
        """Open a domain breaker for every label value on which the window's faults cluster."""
        recent = {node for node, at in self.faults if at >= now - window_s}
        known = {(t.label, t.value) for t in self.domains}
        found = [t for t in clustered_domains(gpu_nodes, recent, labels, threshold_pct, min_nodes, now, window_s)
                 if (t.label, t.value) not in known]
        return dataclasses.replace(self, domains=(*self.domains, *found)) if found else self

    def record_fault(self, node: str, now: float) -> CircuitBreaker:
        return dataclasses.replace(self, faults=(*self.faults, (node, now)))

    def evaluate(
        self, total_gpu_nodes: int, now: float, threshold_pct: float, window_s: float, min_nodes: int = 1
    ) -> CircuitBreaker:
        """Prune faults older than the window; open when more than threshold_pct % of nodes faulted."""
        recent = tuple((node, at) for node, at in self.faults if at >= now - window_s)
        pruned = dataclasses.replace(self, faults=recent)
        if self.open or total_gpu_nodes <= 0:
            return pruned
        faulted = len({node for node, _ in recent})
        if faulted < max(1, min_nodes) or faulted * 100 <= threshold_pct * total_gpu_nodes:
            return pruned
        reason = (f"{faulted} of {total_gpu_nodes} GPU nodes faulted within {window_s:g}s "
                  f"(more than {threshold_pct:g}%: the policy's [breaker] threshold_percent)")
        return dataclasses.replace(pruned, open=True, opened_at=now, reason=reason)

    def evaluate_share(
        self, members: set[str], now: float, threshold_pct: float, window_s: float, min_nodes: int = 1
    ) -> CircuitBreaker:
        """Open when more than threshold_pct % of ``members`` (a replica's own nodes with --shards: a sample of
        the fleet, the shard of a node being a hash of its name) faulted within the window."""
        if self.open or not members:
            return self
        faulted = len({node for node, at in self.faults if at >= now - window_s and node in members})
        if faulted < max(1, min_nodes) or faulted * 100 <= threshold_pct * len(members):
            return self
        reason = (f"{faulted} of this replica's {len(members)} GPU nodes faulted within {window_s:g}s (more than "
                  f"{threshold_pct:g}%: its shards are a sample of the fleet)")
        return dataclasses.replace(self, open=True, opened_at=now, reason=reason)

    def reset(self, by: str, now: float) -> CircuitBreaker:
        """Closed again by a person; the faults that opened it are forgotten."""
        return CircuitBreaker(reset_by=by, reset_at=now)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["faults"] = [[node, at] for node, at in self.faults]
        data["domains"] = [dataclasses.asdict(t) for t in self.domains]
        data["look"] = self.look.to_dict() if self.look is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CircuitBreaker:
        """Inverse of to_dict; raises ValueError naming the bad field."""
        try:
            faults = tuple((str(node), float(at)) for node, at in data.get("faults", []))
            opened_at, reset_at = data.get("opened_at"), data.get("reset_at")
            return cls(
                open=_bool(data.get("open", False), "open"),
                opened_at=None if opened_at is None else float(opened_at),
                reason=str(data.get("reason", "")),
                faults=faults,
                reset_by=str(data.get("reset_by", "")),
                reset_at=None if reset_at is None else float(reset_at),
                domains=tuple(DomainTrip.from_dict(t) for t in data.get("domains", [])),
                look=Look.from_dict(data["look"]) if data.get("look") is not None else None,
            )
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise ValueError(f"malformed circuit breaker state: {exc}") from exc


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a boolean, not {value!r}")
    return value


# ---- pause ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pause:
    """Set by a person or a tool (an upgrade): no new work starts anywhere while paused."""

    paused: bool = False
    by: str = ""
    reason: str = ""
    at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pause:
        """Inverse of to_dict; raises ValueError naming the bad field."""
        at = data.get("at")
        try:
            return cls(paused=_bool(data.get("paused", False), "paused"), by=str(data.get("by", "")),
                       reason=str(data.get("reason", "")), at=None if at is None else float(at))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed pause state: {exc}") from exc


# ---- repeat offender ------------------------------------------------------------------------


def repeat_offender(
    history: Sequence[HistoryEntry],
    now: float,
    count: int = DEFAULT_REPEAT_COUNT,
    window_s: float = DEFAULT_REPEAT_WINDOW_S,
) -> bool:
    """True when ``count`` or more repairs (repaired or failed) happened at or after ``now - window_s``.

    Entries stamped after ``now`` (another replica's clock ran ahead) count too: the safe side.
    """
    if count <= 0:
        return False  # the rule is switched off
    recent = [e for e in history if e.outcome in REPAIR_OUTCOMES and e.at >= now - window_s]
    return len(recent) >= count
