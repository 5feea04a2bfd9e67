"""``[fabric]``: NVLink domains (GB200/GB300 NVL72), their fabric state and IMEX, as findings (issue 28).

Each GPU's fabric reading (``signals.fabric``: nvidia-smi's Fabric section or DCGM's fabric fields) gives at most
one condition per kind; a condition that lasts its grace becomes a finding the state machine acts on:

- ``fabric-failure``: the fabric registration completed with a status other than Success (NVML's status
  "Insufficient Resources", DCGM's Failure): the GPU is not in its NVLink domain. Default: reboot.
- ``fabric-stuck``: the registration has been In Progress for ``stuck_after_s``. Default: cordon.
- ``fabric-unhealthy``: a node of an NVLink domain whose GPUs say Not Started: the Fabric Manager / NVLink
  management software is not running there. Default: cordon. Not Started on a node in no domain is nothing (a
  GB200 node used alone reports it: aws/eks-node-monitoring-agent's Fabric Manager check skips it too).
- ``imex-not-ready``: on a node of an NVLink domain, an IMEX daemon that runs but is not READY, or a domain
  DOWN / DEGRADED. Default: an event only. A daemon that is not installed, not configured or not running
  (-1, -2, -3: idle nodes whose IMEX comes with a ComputeDomain, single-node systems) is nothing: the false
  alarms of NVSentinel #1471 and DCGM #308.

Not Supported, missing or unreadable values are never a condition (non-NVLink nodes, old drivers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuremediate.policy.safety import DomainTrip, NodeView
from gpuremediate.policy.workflow import label_key
from gpuremediate.signals.fabric import (
    CLIQUE_LABEL,
    IMEX_DAEMON_NAMES,
    IMEX_DAEMON_READY,
    STATE_COMPLETED,
    STATE_IN_PROGRESS,
    STATE_NOT_STARTED,
    STATUS_SUCCESS,
)
from gpuremediate.signals.fabric_model import GpuFabric
from gpuremediate.vocab.findings import ACTION_CORDON, ACTION_NONE, ACTION_QUARANTINE, ACTION_REBOOT, Finding
from gpuremediate.vocab.schema import MAX_DURATION_S, PolicyError, between, check_action, setting
from gpuremediate.vocab.states import HEALTHY

KIND_FABRIC_FAILURE = "fabric-failure"
KIND_FABRIC_STUCK = "fabric-stuck"
KIND_FABRIC_UNHEALTHY = "fabric-unhealthy"
KIND_IMEX = "imex-not-ready"
KIND_DOMAIN = "domain"  # a tray taken into its NVLink domain's domain action (the rack handled as one unit)
FABRIC_KINDS = (KIND_FABRIC_FAILURE, KIND_FABRIC_STUCK, KIND_FABRIC_UNHEALTHY, KIND_IMEX)
IMEX_DOWN = ("DOWN", "DEGRADED")
# Cordon findings that lift by themselves once the state is good again (as a thermal cordon does).
CLEARING_KINDS = (KIND_FABRIC_STUCK, KIND_FABRIC_UNHEALTHY, KIND_IMEX)


def _domain_action_name(value: object, path: str) -> None:
    """``domain_action``: any action but ``cordon`` (a cordon alone hands nothing over and lifts nothing)."""
    check_action(value, path)
    if value == ACTION_CORDON:
        raise PolicyError(f"{path}: cordon is not a domain action (none holds the trays; quarantine drains them "
                          f"for a person)")


@dataclass(frozen=True)
class FabricPolicy:
    enabled: bool = setting(True, "act on the NVLink fabric state of GPUs in NVLink domains (NVL72) and on IMEX")
    domain_label: str = setting(CLIQUE_LABEL, "node label naming a node's NVLink domain (GPU Feature Discovery's "
                                "<ClusterUUID>.<CliqueId>); also a domain of the breaker's domain_labels",
                                check=label_key)
    domain_breaker: bool = setting(True, "count domain_label among [breaker] domain_labels: when more than "
                                   "domain_threshold_percent of a domain's trays fault, its per-tray repairs hold")
    failure_grace_s: float = setting(60.0, "seconds a fabric registration completed with an error lasts before "
                                     "the fabric-failure finding", check=between(0, MAX_DURATION_S))
    failure_action: str = setting(ACTION_REBOOT, "action for fabric-failure", action=True)
    stuck_after_s: float = setting(900.0, "seconds In Progress before the fabric-stuck finding",
                                   check=between(0, MAX_DURATION_S))
    stuck_action: str = setting(ACTION_CORDON, "action for fabric-stuck", action=True)
    not_started_grace_s: float = setting(300.0, "seconds a domain node's GPUs say Not Started (its Fabric Manager "
                                         "is not running) before the fabric-unhealthy finding",
                                         check=between(0, MAX_DURATION_S))
    not_started_action: str = setting(ACTION_CORDON, "action for fabric-unhealthy", action=True)
    not_started_anywhere: bool = setting(False, "false: Not Started counts only on a node of an NVLink domain (a "
                                         "GB200 used alone reports it) | true: on any node (a [[groups]] of HGX "
                                         "nodes whose Fabric Manager must run)")
    imex_grace_s: float = setting(300.0, "seconds an IMEX daemon runs not READY (or its domain is DOWN/DEGRADED) "
                                  "before the imex-not-ready finding", check=between(0, MAX_DURATION_S))
    imex_action: str = setting(ACTION_NONE, "action for imex-not-ready (none: an event only)", action=True)
    domain_action: str = field(default=ACTION_NONE, metadata={
        "action": True, "check": _domain_action_name,
        "doc": "once the domain breaker opens for an NVLink domain (domain_breaker): none = its trays are held for "
               "a person (breaker reset) | quarantine = every tray is drained, then handed to a person | a custom "
               "action (a rack maintenance at the provider), with its [remediation.ladders] ladder; reboot and "
               "reset-gpu too"})

    def grace(self, kind: str) -> float:
        return {KIND_FABRIC_FAILURE: self.failure_grace_s, KIND_FABRIC_STUCK: self.stuck_after_s,
                KIND_FABRIC_UNHEALTHY: self.not_started_grace_s, KIND_IMEX: self.imex_grace_s}[kind]

    def action(self, kind: str) -> str:
        return {KIND_FABRIC_FAILURE: self.failure_action, KIND_FABRIC_STUCK: self.stuck_action,
                KIND_FABRIC_UNHEALTHY: self.not_started_action, KIND_IMEX: self.imex_action}[kind]


def domain_trips(trips: Sequence[DomainTrip], rules: FabricPolicy) -> dict[str, DomainTrip]:
    """The domain breaker's trips that are domain actions: NVLink domain (``domain_label``) value -> its trip.
    Empty unless ``[fabric]`` is on with ``domain_breaker`` and a ``domain_action``."""
    if not rules.enabled or not rules.domain_breaker or rules.domain_action == ACTION_NONE:
        return {}
    return {t.value: t for t in trips if t.label == rules.domain_label}


def domain_finding(node: str, trip: DomainTrip, rules: FabricPolicy) -> Finding:
    """The domain decision as a finding on one tray of the domain: the same fingerprint on every tray (the
    domain, and when its breaker opened: a later trip of the same domain is a new decision), the action
    ``domain_action``. The detect loop adds it to the findings of every tray of a tripped domain while the trip
    stands, so its handled fingerprint survives a restart and the decision is taken once per tray."""
    fingerprint = f"{KIND_DOMAIN}:{trip.label}={trip.value}@{trip.opened_at:.0f}"
    then = "handed to a person" if rules.domain_action == ACTION_QUARANTINE else rules.domain_action
    message = (f"domain action for {trip.label}={trip.value}: {trip.reason}; the NVLink domain is handled as one "
               f"unit: every tray drained, then {then}")
    return Finding(node, KIND_DOMAIN, "", (), rules.domain_action, fingerprint, message)


def is_domain_fault(kind: str) -> bool:
    return kind == KIND_DOMAIN


def breaker_domain_labels(configured: tuple[str, ...], rules: FabricPolicy) -> tuple[str, ...]:
    """``[breaker] domain_labels`` and, with ``[fabric] domain_breaker``, the NVLink domain label: the domain
    breaker then holds the per-tray repairs of a rack whose trays fault together (one breaker, not a twin)."""
    if not rules.enabled or not rules.domain_breaker or rules.domain_label in configured:
        return configured
    return (*configured, rules.domain_label)


def domains_out(views: Sequence[NodeView], label: str) -> list[tuple[dict[str, str], float]]:
    """``gpuremediate_domain_nodes_out``: per value of ``label``, its nodes out of service (the budget's view of
    "out": unschedulable, NotReady or in a repair flow); domains with none have no series."""
    out: dict[str, int] = {}
    for view in views:
        value = view.labels.get(label)
        if value and (view.unschedulable or not view.ready or view.state != HEALTHY):
            out[value] = out.get(value, 0) + 1
    return [({"domain": value}, float(count)) for value, count in sorted(out.items())]


def in_domain(fabric: GpuFabric, labels: Mapping[str, str], rules: FabricPolicy) -> bool:
    """The node is in a multi-node NVLink domain: its domain label is set, or the GPU names its clique."""
    return bool(labels.get(rules.domain_label)) or fabric.clique is not None


def _imex_not_ready(fabric: GpuFabric) -> bool:
    daemon = fabric.imex_daemon
    if daemon is not None and daemon < 0:
        return False  # not installed / not configured / not running: no IMEX expected here
    return (daemon is not None and daemon != IMEX_DAEMON_READY) or fabric.imex_domain in IMEX_DOWN


def conditions(fabric: GpuFabric | None, labels: Mapping[str, str], rules: FabricPolicy) -> set[str]:
    """The fabric kinds this GPU's reading shows now (no grace applied)."""
    if fabric is None:
        return set()
    found = set()
    if fabric.state == STATE_COMPLETED and fabric.status not in (None, STATUS_SUCCESS):
        found.add(KIND_FABRIC_FAILURE)
    elif fabric.state == STATE_IN_PROGRESS:
        found.add(KIND_FABRIC_STUCK)
    member = in_domain(fabric, labels, rules)
    if fabric.state == STATE_NOT_STARTED and (member or rules.not_started_anywhere):
        found.add(KIND_FABRIC_UNHEALTHY)
    if member and _imex_not_ready(fabric):
        found.add(KIND_IMEX)
    return found


def step_timers(
    fabrics: Mapping[str, GpuFabric | None], labels: Mapping[str, str], rules: FabricPolicy,
    timers: Mapping[str, float], now: float,
) -> dict[str, float]:
    """``<kind>:<gpu>`` → since when; a GPU without a reading this cycle keeps its timers (missing changes nothing)."""
    kept = {key: since for key, since in timers.items() if key.partition(":")[2] not in fabrics}
    for gpu, fabric in fabrics.items():
        for kind in sorted(conditions(fabric, labels, rules)):
            key = f"{kind}:{gpu}"
            kept[key] = timers.get(key, now)
    return kept


def cleared_words(kind: str) -> str:
    """The message of a soft fault's end: the thermal one's, or the fabric's."""
    if kind in CLEARING_KINDS:
        return f"{kind}: the NVLink fabric / IMEX state is good again"
    return "temperature back below the clear threshold"


def _code(kind: str, fabric: GpuFabric | None) -> str:
    """A short word for the finding's code (status, metrics' ``code`` label): few values, never free text."""
    if kind == KIND_FABRIC_STUCK:
        return STATE_IN_PROGRESS
    if kind == KIND_FABRIC_UNHEALTHY:
        return STATE_NOT_STARTED
    if fabric is None:
        return ""
    if kind == KIND_FABRIC_FAILURE:
        words = (fabric.status or "").split(" (")[0]  # DCGM's "Failure (error code 3)": its word
        return re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-")[:40]
    if fabric.imex_daemon is not None and fabric.imex_daemon != IMEX_DAEMON_READY:
        return IMEX_DAEMON_NAMES[fabric.imex_daemon].lower().replace("_", "-")
    return f"domain-{(fabric.imex_domain or '').lower()}"


def _words(kind: str, fabric: GpuFabric | None) -> str:
    if kind == KIND_FABRIC_FAILURE:
        return (f"its NVLink fabric registration completed with status {fabric.status if fabric else '?'!r}: "
                "the GPU is not in its NVLink domain")
    if kind == KIND_FABRIC_STUCK:
        return "its NVLink fabric registration is still In Progress"
    if kind == KIND_FABRIC_UNHEALTHY:
        return ("its NVLink fabric registration has Not Started: the Fabric Manager / NVLink management software "
                "is not running")
    daemon = fabric.imex_daemon if fabric else None
    named = IMEX_DAEMON_NAMES.get(daemon, "?") if daemon is not None else "-"
    return f"its IMEX daemon is not READY (daemon {named}, domain {fabric.imex_domain if fabric else None})"


def fabric_findings(
    node: str, fabrics: Mapping[str, GpuFabric | None], rules: FabricPolicy, timers: Mapping[str, float], now: float,
) -> list[Finding]:
    """The timers that passed their grace, as findings (fingerprint: kind, GPU and since when)."""
    found = []
    for key, since in sorted(timers.items()):
        kind, _, gpu = key.partition(":")
        if kind not in FABRIC_KINDS or now - since < rules.grace(kind):
            continue
        message = (f"GPU {gpu}: {_words(kind, fabrics.get(gpu))} for {now - since:.0f} s; "
                   f"[fabric] says {rules.action(kind)}")
        found.append(Finding(node, kind, _code(kind, fabrics.get(gpu)), (gpu,), rules.action(kind),
                             f"{kind}:{gpu}:{since:.0f}", message))
    return found
