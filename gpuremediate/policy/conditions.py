"""NodeConditions → findings, through a table in the policy file; and one node's findings from both sources.

The node agent (``gpuremediate agent``) publishes ``GPUHealthy``, ``GPUDriverResponsive``,
``GPUCountMatches`` and ``GPUFabricHealthy`` on its Node; node-problem-detector and other tools publish
their own (``KernelDeadlock``, ``ReadonlyFilesystem``, ...). A rule matches a condition by type, status
and reason (``*`` = any reason) and names the action; the first matching rule wins. The policy file's
rules come before the defaults (the agent's own conditions), so a file can override a default::

    [conditions]
    max_age_s = 900               # a condition whose heartbeat is older is ignored (its writer is gone)

    [[conditions.rules]]          # node-problem-detector's kernel monitor (condition True = problem)
    type = "KernelDeadlock"
    status = "True"
    action = "reboot"

    # [[conditions.rules]]       # NPD keeps reason FilesystemIsReadOnly while False too: match the status
    # type = "ReadonlyFilesystem"
    # status = "True"
    # reason = "FilesystemIsReadOnly"
    # action = "cordon"
    #
    # [[conditions.rules]]
    # type = "FrequentKubeletRestart"
    # status = "True"
    # action = "none"             # an Event only

A condition's fingerprint is its type, status, reason and lastTransitionTime: a fault that clears and
comes back (a new transition) is a new occurrence, one that stays is the same one.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.vocab.findings import (
    ACTION_CORDON,
    ACTION_NONE,
    ACTION_QUARANTINE,
    ACTION_REBOOT,
    ACTION_RESET_GPU,
    NETWORK_KINDS,
    Finding,
    by_severity,
)
from gpuremediate.vocab.schema import PolicyError, _join, _show, check_action, duration, setting

# The agent's conditions: True is healthy (like Ready), so a missing agent is never a fault.
GPU_HEALTHY = "GPUHealthy"
GPU_DRIVER_RESPONSIVE = "GPUDriverResponsive"
GPU_COUNT_MATCHES = "GPUCountMatches"
GPU_FABRIC_HEALTHY = "GPUFabricHealthy"
# The node's RDMA NICs ([network], policy.network): reason "<Kind>:<nic>" (NicDown:mlx5_0), mapped to
# [network]'s actions by rules of that policy (policy.network.condition_rules).
GPU_NETWORK_HEALTHY = "GPUNetworkHealthy"
AGENT_CONDITIONS = (GPU_HEALTHY, GPU_DRIVER_RESPONSIVE, GPU_COUNT_MATCHES, GPU_FABRIC_HEALTHY, GPU_NETWORK_HEALTHY)

ANY_REASON = "*"
STATUSES = ("True", "False", "Unknown")
DEFERRED_SUFFIX = "Deferred"
RULE_KEYS = ("type", "status", "reason", "action", "urgent")
# NVML's GPU UUID, as the agent names the GPUs of a finding in its messages (other tools' messages rarely do).
GPU_UUID = re.compile(r"\bGPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")


def reason_for_action(action: str, urgent: bool = True) -> str:
    """The GPUHealthy reason the agent writes for the worst finding's action: ``reset-gpu`` →
    ``NeedsResetGpu``; a repair that may wait for a window gets ``Deferred`` (``NeedsResetGpuDeferred``)."""
    words = "".join(part.capitalize() for part in action.split("-") if part)
    return f"Needs{words}" + ("" if urgent else DEFERRED_SUFFIX)


KIND_CONDITION = "condition"  # the Finding kind of a NodeCondition rule


# --- the table -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConditionRule:
    type: str
    status: str
    action: str
    reason: str = ANY_REASON  # exact; "*" any; "Prefix*" any that starts with Prefix
    urgent: bool = True
    # The finding's kind: a NodeCondition's, or (rules the policy builds, not the file) the kind the reason
    # names, with the code after the reason's ":" (GPUNetworkHealthy's NicDown:mlx5_0 → nic-down, mlx5_0).
    kind: str = field(default=KIND_CONDITION, metadata={"internal": True})  # not a key of the file

    def matches(self, condition: Mapping[str, Any]) -> bool:
        if condition.get("type") != self.type or condition.get("status") != self.status:
            return False
        if self.reason.endswith(ANY_REASON):
            return str(condition.get("reason") or "").startswith(self.reason[:-1])
        return condition.get("reason") == self.reason


def _healthy_rules() -> tuple[ConditionRule, ...]:
    actions = (ACTION_QUARANTINE, ACTION_REBOOT, ACTION_RESET_GPU, ACTION_CORDON)
    return tuple(
        ConditionRule(GPU_HEALTHY, "False", action, reason_for_action(action, urgent), urgent)
        for action in actions
        for urgent in (True, False)
    )


# The agent's own conditions. GPUHealthy's reason carries the action the shared policy chose on the node;
# a hung driver, a GPU missing from the driver and a fatal NVSwitch error all need the node rebooted.
DEFAULT_RULES: tuple[ConditionRule, ...] = (
    *_healthy_rules(),
    ConditionRule(GPU_DRIVER_RESPONSIVE, "False", ACTION_REBOOT),
    ConditionRule(GPU_COUNT_MATCHES, "False", ACTION_REBOOT),
    ConditionRule(GPU_FABRIC_HEALTHY, "False", ACTION_REBOOT),
)


def _text(raw: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
    if key not in raw:
        if default is None:
            raise PolicyError(f"{_join(path, key)}: required")
        return default
    value = raw[key]
    if not isinstance(value, str) or not value.strip():
        raise PolicyError(f"{_join(path, key)}: expected a non-empty string, got {_show(value)}")
    return value


def parse_rule(raw: Any, path: str) -> ConditionRule:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: expected a table ([[conditions.rules]]), got {_show(raw)}")
    unknown = sorted(set(raw) - set(RULE_KEYS))
    if unknown:
        raise PolicyError(f"{_join(path, unknown[0])}: unknown key (known: {', '.join(RULE_KEYS)})")
    status = _text(raw, "status", path)
    if status not in STATUSES:
        raise PolicyError(f"{path}.status: expected one of {', '.join(STATUSES)}, got {_show(status)}")
    action = _text(raw, "action", path)
    check_action(action, f"{path}.action")
    urgent = raw.get("urgent", True)
    if not isinstance(urgent, bool):
        raise PolicyError(f"{path}.urgent: expected true or false, got {_show(urgent)}")
    return ConditionRule(type=_text(raw, "type", path), status=status, action=action,
                         reason=_text(raw, "reason", path, ANY_REASON), urgent=urgent)


def parse_rules(raw: Any, path: str, current: tuple[ConditionRule, ...]) -> tuple[ConditionRule, ...]:
    """``[[conditions.rules]]`` → rules, placed before ``current`` (the defaults, or a group's base)."""
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: expected an array of tables ([[conditions.rules]]), got {_show(raw)}")
    return (*(parse_rule(item, f"{path}[{index}]") for index, item in enumerate(raw)), *current)


@dataclass(frozen=True)
class ConditionsPolicy:
    """``[conditions]``: which NodeConditions are findings, and how old a condition may be."""

    enabled: bool = setting(True, "act on NodeConditions (the agent's and other tools')")
    max_age_s: float = setting(900.0, "ignore a condition whose lastHeartbeatTime is older than this (its writer "
                               "stopped; the agent heartbeats every 300 s)", check=duration(1))
    rules: tuple[ConditionRule, ...] = field(default=DEFAULT_RULES, metadata={
        "doc": "[[conditions.rules]] {type, status, reason (default *; Prefix* matches a prefix), action, "
               "urgent}; first match wins, the file's rules before the agent's defaults",
        "parse": parse_rules})

    def action_refs(self, path: str) -> Iterator[tuple[str, str]]:
        for index, rule in enumerate(self.rules):
            yield f"{path}.rules[{index}].action", rule.action


# --- conditions → findings -------------------------------------------------------------------------


def parse_time(text: Any) -> float | None:
    """An RFC 3339 time (``2026-12-01T07:50:23Z``) as unix seconds; None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.timestamp()


def conditions_of(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = node.get("status")
    raw = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in raw if isinstance(c, Mapping) and isinstance(c.get("type"), str)] if isinstance(raw, list) \
        else []


def is_stale(condition: Mapping[str, Any], max_age_s: float, now: float) -> bool:
    """Older than ``max_age_s`` by its heartbeat (else its transition): its writer stopped updating it."""
    seen = parse_time(condition.get("lastHeartbeatTime"))
    if seen is None:
        seen = parse_time(condition.get("lastTransitionTime"))
    return seen is not None and now - seen > max_age_s


@dataclass(frozen=True)
class ConditionView:
    """What one node's conditions say: findings (worst first) and whether the agent is reporting."""

    node: str
    findings: tuple[Finding, ...] = ()
    agent_reporting: bool = False  # at least one of the agent's conditions present and fresh
    ignored: tuple[str, ...] = ()  # why a matching condition was not used (stale), in words


# One finding in a message (the judge's own, or the agent's condition's: its findings joined by "; ").
_SAID = re.compile(r"(?P<kind>nic-[a-z]+) (?P<nic>[^\s/]+)/(?P<port>\d+): (?P<detail>.*?)"
                   r"(?:; GPUs on its rail: (?P<gpus>GPU-[^→;]*?))? → (?P<action>[a-z-]+)")


@dataclass(frozen=True)
class NicSaid:
    """What a NIC finding's message says of one NIC: its port, what was seen, the GPUs on its rail."""

    kind: str
    port: str
    detail: str
    rail: tuple[str, ...]


def nic_said(message: str, nic: str) -> list[NicSaid]:
    """The findings ``message`` states about ``nic`` (a record's fault message holds the condition's message)."""
    return [NicSaid(m["kind"], f"{nic}/{m['port']}", m["detail"],
                    tuple(g.strip() for g in m["gpus"].split(",")) if m["gpus"] else ())
            for m in _SAID.finditer(message) if m["nic"] == nic]


def _finding(node: str, condition: Mapping[str, Any], rule: ConditionRule) -> Finding:
    ctype, status = str(condition["type"]), str(condition.get("status", ""))
    reason, message = str(condition.get("reason") or ""), str(condition.get("message") or "")
    since = str(condition.get("lastTransitionTime") or "")
    said = f" ({reason})" if reason else ""
    text = f"NodeCondition {ctype}={status}{said}: {message or 'no message'} → {rule.action}"
    # The GPUs the message names (the agent names each by UUID); none named: the finding is node-wide and
    # a reset-gpu repair resets every GPU of the node.
    gpus = tuple(sorted(set(GPU_UUID.findall(message))))
    if rule.kind in NETWORK_KINDS:  # the message holds every NIC's findings: this NIC's rail only
        nic = reason.partition(":")[2]
        gpus = tuple(sorted({g for said in nic_said(message, nic) for g in said.rail if GPU_UUID.fullmatch(g)}))
    if not gpus and rule.action == ACTION_RESET_GPU:
        text += " (the condition names no GPU: every GPU of the node is reset)"
    code = reason.partition(":")[2] or ctype if rule.kind != KIND_CONDITION else ctype
    return Finding(node, rule.kind, code, gpus, rule.action,
                   f"condition:{ctype}:{status}:{reason}:{since}", text, rule.urgent)


def condition_view(node: Mapping[str, Any], policy: ConditionsPolicy, now: float,
                   more_rules: Sequence[ConditionRule] = ()) -> ConditionView:
    """``more_rules``: after the policy's (the [network] section's GPUNetworkHealthy rules)."""
    name = str((node.get("metadata") or {}).get("name", ""))
    rules = (*policy.rules, *more_rules)
    if not policy.enabled:
        return ConditionView(name)
    found: list[Finding] = []
    ignored: list[str] = []
    reporting = False
    for condition in conditions_of(node):
        stale = is_stale(condition, policy.max_age_s, now)
        if condition["type"] in AGENT_CONDITIONS and not stale:
            reporting = True
        rule = next((r for r in rules if r.matches(condition)), None)
        if rule is None:
            continue
        if stale:
            ignored.append(f"{condition['type']}={condition.get('status')}: not updated for more than "
                           f"{policy.max_age_s:g} s")
            continue
        found.append(_finding(name, condition, rule))
    return ConditionView(name, tuple(by_severity(found)), reporting, tuple(ignored))


# --- both sources, one node ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeVerdict:
    """One node's findings from the metrics source and its conditions, worst first.

    ``unknown`` is set only when neither source gives anything to act on and the metrics are unknown:
    unknown is never unhealthy on its own, but an actionable condition (a hung driver the exporter cannot
    report) is acted on. ``metrics_known`` tells the caller whether the metric findings are current (only
    then may fingerprints the metrics no longer show be forgotten).
    """

    findings: tuple[Finding, ...]
    metrics_known: bool
    unknown: str = ""  # why the node's health is unknown ("" when it is known or actionable)


def merge_node(
    metric_findings: Iterable[Finding], metrics_known: bool, metrics_reason: str, view: ConditionView | None,
    others: Iterable[Finding] = (),
) -> NodeVerdict:
    """The worst finding wins: every source's findings in one list, worst first, duplicates by fingerprint once.
    ``others``: sources current whatever the metrics are (the workload signal)."""
    unique: dict[str, Finding] = {}
    for finding in (*(metric_findings if metrics_known else ()), *(view.findings if view else ()), *others):
        unique.setdefault(finding.fingerprint, finding)
    findings = tuple(by_severity(unique.values()))
    actionable = any(f.action != ACTION_NONE for f in findings)
    unknown = "" if metrics_known or actionable else (metrics_reason or "no readings")
    return NodeVerdict(findings, metrics_known, unknown)


def merge_fleet(
    metric_findings: Mapping[str, Sequence[Finding]],
    metrics_unknown: Mapping[str, str],
    views: Mapping[str, ConditionView],
) -> dict[str, NodeVerdict]:
    """``merge_node`` for every node either source knows: metric findings of nodes whose readings are
    current, the unknown reason of those whose are not (a node the metrics source did not return at all
    is unknown to it too), and each node's condition view."""
    names = set(metric_findings) | set(metrics_unknown) | set(views)
    return {
        name: merge_node(metric_findings.get(name, ()), name in metric_findings and name not in metrics_unknown,
                         metrics_unknown.get(name, "the metrics source returned nothing for this node"),
                         views.get(name))
        for name in sorted(names)
    }

