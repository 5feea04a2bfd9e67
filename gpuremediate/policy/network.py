"""The network judge (issue 45): a node's RDMA NIC ports (``signals.nic`` readings) → findings, through ``[network]``.

Four kinds, each naming the NIC, its port and the GPUs on its rail where known:

- ``nic-down``: a port not ``ACTIVE`` / ``LinkUp`` (for RoCE also its net device not ``up``), or a device gone from
  ``/sys/class/infiniband``. Only a port seen up since the agent started counts (an unused port of a dual-port
  HCA polls for a peer forever) unless ``watch_never_up``; down for ``stuck_down_after_s``: ``stuck_down_action``.
- ``nic-degraded``: up, but trained below its expected rate (``expected_rate_gbps``, or else the highest rate
  the port or any up port of the same link layer on a NIC of the same model on the node showed: a 400 Gb/s port
  at 200).
- ``nic-flapping``: ``link_downed`` (InfiniBand) or ``carrier_changes`` / 2 (RoCE) rising ``flap_count`` times
  within ``window_s``.
- ``nic-errors``: the error counters rising by ``error_count`` within ``window_s`` (never their absolute value:
  on a busy fabric they are never zero).

Hysteresis: a finding stays until its cause has been gone for ``clear_after_s``; a recovered link lifts it.
The agent runs the judge and writes NodeCondition ``GPUNetworkHealthy`` (reason ``<Kind>:<nic>``,
``condition_reason``); the controller maps the reason back to the action through ``condition_rules``.
"""

from __future__ import annotations

import fnmatch
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.policy.conditions import GPU_NETWORK_HEALTHY, ConditionRule, conditions_of
from gpuremediate.signals.nic import (
    LINK_LAYER_ETHERNET,
    OPERSTATE_UP,
    NetworkReadings,
    NicReading,
    PortReading,
)
from gpuremediate.vocab.findings import (
    ACTION_CORDON,
    ACTION_REBOOT,
    KIND_NIC_DEGRADED,
    KIND_NIC_DOWN,
    KIND_NIC_ERRORS,
    KIND_NIC_FLAPPING,
    Finding,
    by_severity,
)
from gpuremediate.vocab.schema import PolicyError, _show, at_least, between, duration, setting, string_list

# While a node is held for a NIC finding the controller taints it <key>=<nic>:NoSchedule (beside the cordon): a key
# multi-node jobs can select on. The key is gpuremediate's own: the controller takes any taint of it off again.
NIC_TAINT_KEY = "gpuremediate.io/nic-degraded"
# The counters of a link's health (IBA PortCounters, the kernel's counters/ directory). port_xmit_discards and
# port_xmit_wait rise with congestion alone and are left out.
DEFAULT_ERROR_COUNTERS = (
    "symbol_error", "link_error_recovery", "port_rcv_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "port_rcv_remote_physical_errors",
)
LINK_DOWNED = "link_downed"
# The condition reason's word for each kind; a port down past the hold has its own (its action differs).
REASON_DOWN, REASON_STUCK_DOWN = "NicDown", "NicStuckDown"
REASON_DEGRADED, REASON_FLAPPING, REASON_ERRORS = "NicDegraded", "NicFlapping", "NicErrors"
_REASONS = {KIND_NIC_DOWN: REASON_DOWN, KIND_NIC_DEGRADED: REASON_DEGRADED, KIND_NIC_FLAPPING: REASON_FLAPPING,
            KIND_NIC_ERRORS: REASON_ERRORS}
REASON_KINDS = {REASON_DOWN: KIND_NIC_DOWN, REASON_STUCK_DOWN: KIND_NIC_DOWN, REASON_DEGRADED: KIND_NIC_DEGRADED,
                REASON_FLAPPING: KIND_NIC_FLAPPING, REASON_ERRORS: KIND_NIC_ERRORS}


def _port_glob(value: object, path: str) -> None:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise PolicyError(f"{path}: expected a port as <device>/<port> or <device> (globs allowed: mlx5_*/2), "
                          f"got {_show(value)}")


def _counter_name(value: object, path: str) -> None:
    if not isinstance(value, str) or not value or "/" in value.replace("hw_counters/", "", 1) or ".." in value:
        raise PolicyError(f"{path}: expected a counter file name (symbol_error, hw_counters/out_of_buffer), "
                          f"got {_show(value)}")


@dataclass(frozen=True)
class NetworkPolicy:
    """``[network]``: RDMA NIC ports (InfiniBand, RoCE) as findings; read by the node agent from sysfs."""

    enabled: bool = setting(True, "read /sys/class/infiniband and /sys/class/net on each node (the agent) and "
                            "publish GPUNetworkHealthy; a node without an RDMA device reports none and is never "
                            "a fault")
    prometheus: bool = setting(False, "also judge node_exporter's node_infiniband_* series through the Prometheus "
                               "source (the controller judges them: for nodes without the agent; no link layer, "
                               "RoCE net device or rail in those series)")
    ignore_ports: tuple[str, ...] = field(default=(), metadata={
        "doc": "ports never judged, as <device>/<port> or <device> (fnmatch globs: mlx5_1/*): a port down by design",
        "parse": string_list(_port_glob)})
    watch_never_up: bool = setting(False, "false: a port not seen up since the agent started is not judged (an "
                                   "unused port polls forever); true: every port not ignored must be up")
    expected_rate_gbps: float = setting(0.0, "the rate (Gb/s, as sysfs 'rate' says) every port should train at; "
                                        "0: the highest rate the port or any up port of its link layer on a "
                                        "NIC of its model (hca_type) on the node showed since the agent "
                                        "started", check=between(0, 100_000))
    window_s: float = setting(600.0, "seconds over which counter rises are summed (flaps, errors)",
                              check=duration(10))
    flap_count: int = setting(3, "link downs (link_downed, or carrier_changes / 2) within window_s that make a "
                              "port flapping", check=at_least(1))
    error_counters: tuple[str, ...] = field(default=DEFAULT_ERROR_COUNTERS, metadata={
        "doc": "counters/ files (or hw_counters/<name>) whose rises are summed for nic-errors",
        "parse": string_list(_counter_name)})
    error_count: int = setting(100, "the summed rise of error_counters within window_s that makes nic-errors "
                               "(the rise, never the absolute value)", check=at_least(1))
    clear_after_s: float = setting(60.0, "a finding lifts once its cause has been gone this long (hysteresis)",
                                   check=duration(0))
    stuck_down_after_s: float = setting(900.0, "a port down this long gets stuck_down_action instead",
                                        check=duration(1))
    down_action: str = setting(ACTION_CORDON, "action for nic-down", action=True)
    stuck_down_action: str = setting(ACTION_REBOOT, "action for a port down past stuck_down_after_s", action=True)
    degraded_action: str = setting(ACTION_CORDON, "action for nic-degraded", action=True)
    flapping_action: str = setting(ACTION_CORDON, "action for nic-flapping", action=True)
    errors_action: str = setting(ACTION_CORDON, "action for nic-errors", action=True)

    def ignored(self, port: str) -> bool:
        device = port.split("/", 1)[0]
        return any(fnmatch.fnmatchcase(port, glob) or fnmatch.fnmatchcase(device, glob) for glob in self.ignore_ports)

    def action_for(self, reason: str) -> str:
        return {REASON_DOWN: self.down_action, REASON_STUCK_DOWN: self.stuck_down_action,
                REASON_DEGRADED: self.degraded_action, REASON_FLAPPING: self.flapping_action,
                REASON_ERRORS: self.errors_action}[reason]


# --- the condition's reason, both ways ---------------------------------------------------------------


def condition_reason(word: str, nic: str) -> str:
    """``NicDown:mlx5_0``: the kind's word and the NIC (metav1.Condition's reason pattern allows the colon)."""
    return f"{word}:{nic}"


def condition_kind(node: Mapping[str, Any]) -> str | None:
    """The NIC finding kind the node's agent reports now (GPUNetworkHealthy=False, its reason's word: the worst
    finding's), or None."""
    for cond in conditions_of(node):
        if cond.get("type") == GPU_NETWORK_HEALTHY and cond.get("status") == "False":
            word = str(cond.get("reason") or "").partition(":")[0]
            return REASON_KINDS.get(word)
    return None


def condition_rules(policy: NetworkPolicy) -> tuple[ConditionRule, ...]:
    """The controller's rules for GPUNetworkHealthy=False, one per reason word, with ``[network]``'s actions."""
    if not policy.enabled:
        return ()
    return tuple(ConditionRule(GPU_NETWORK_HEALTHY, "False", policy.action_for(word), f"{word}:*", kind=kind)
                 for word, kind in REASON_KINDS.items())


# --- the judge ---------------------------------------------------------------------------------------


@dataclass
class _Active:
    since: float
    clear_since: float | None = None
    detail: str = ""


@dataclass
class _PortMemory:
    seen_up: bool = False
    max_rate: float = 0.0
    samples: deque[tuple[float, Mapping[str, int]]] = field(default_factory=deque)
    active: dict[str, _Active] = field(default_factory=dict)  # kind -> the finding in force


def _rise(samples: Iterable[tuple[float, Mapping[str, int]]], names: Iterable[str]) -> int:
    """The summed rise of ``names`` over consecutive samples; a counter that went down was reset (counted
    again from zero)."""
    total = 0
    previous: Mapping[str, int] | None = None
    wanted = tuple(names)
    for _, counters in samples:
        if previous is not None:
            for name in wanted:
                if name in counters and name in previous:
                    now, before = counters[name], previous[name]
                    total += now - before if now >= before else now
        previous = counters
    return total


def _link_counters(port: PortReading, nic: NicReading) -> dict[str, int]:
    """The port's counters, plus its net devices' carrier changes (RoCE) as ``carrier_changes``."""
    counters = dict(port.counters)
    changes = [d.carrier_changes for d in nic.netdevs if d.carrier_changes is not None]
    if changes and port.link_layer == LINK_LAYER_ETHERNET:
        counters["carrier_changes"] = sum(changes)
    return counters


def _port_up(port: PortReading, nic: NicReading) -> tuple[bool, str]:
    if not port.up:
        return False, f"state {port.state or '?'}, phys_state {port.phys_state or '?'}"
    if port.link_layer == LINK_LAYER_ETHERNET:
        down = [d for d in nic.netdevs if d.operstate and d.operstate != OPERSTATE_UP]
        if down:
            return False, ", ".join(f"{d.name} operstate {d.operstate}" for d in down)
    return True, ""


class NetworkJudge:
    """Judges one node's readings cycle after cycle; remembers each port's history (seen up, highest rate,
    counter samples, findings in force)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._ports: dict[str, _PortMemory] = {}
        self._nics: dict[str, tuple[int, ...]] = {}  # device -> its port numbers, as last read
        self._lock = threading.Lock()

    def judge(self, readings: NetworkReadings, policy: NetworkPolicy, now: float,
              rails: Mapping[str, tuple[str, ...]] | None = None) -> list[Finding]:
        """Findings worst first; ``rails``: device → the GPUs on its rail (keys as the node's other findings)."""
        if not policy.enabled:
            return []
        rails = rails or {}
        with self._lock:
            found: list[Finding] = []
            present = {nic.device for nic in readings.nics}
            for nic in readings.nics:
                self._nics[nic.device] = tuple(p.port for p in nic.ports)
                for port in nic.ports:
                    found += self._judge_port(port, nic, readings, policy, now, rails.get(nic.device, ()))
            for device in sorted(set(self._nics) - present):  # gone from sysfs: every port it had is down
                for number in self._nics[device]:
                    found += self._gone(device, number, policy, now, rails.get(device, ()))
            return by_severity(found)

    def _judge_port(self, port: PortReading, nic: NicReading, readings: NetworkReadings, policy: NetworkPolicy,
                    now: float, gpus: tuple[str, ...]) -> list[Finding]:
        name = port.name
        if policy.ignored(name):
            self._ports.pop(name, None)
            return []
        memory = self._ports.setdefault(name, _PortMemory())
        up, why_down = _port_up(port, nic)
        if up:
            memory.seen_up = True
            memory.max_rate = max(memory.max_rate, port.rate_gbps or 0.0)
        memory.samples.append((now, _link_counters(port, nic)))
        while len(memory.samples) > 2 and memory.samples[1][0] <= now - policy.window_s:
            memory.samples.popleft()  # keep one sample at or before the window's start: the baseline
        raw: dict[str, str] = {}
        if not up and (memory.seen_up or policy.watch_never_up):
            raw[KIND_NIC_DOWN] = why_down
        expected = self._expected_rate(port, nic, readings, memory, policy)
        if up and port.rate_gbps is not None and expected and port.rate_gbps < expected:
            raw[KIND_NIC_DEGRADED] = (f"trained at {port.rate_gbps:g} Gb/s ({port.width or '?'}X {port.speed}) "
                                      f"below the expected {expected:g} Gb/s")
        downs = _rise(memory.samples, (LINK_DOWNED,)) + _rise(memory.samples, ("carrier_changes",)) // 2
        if downs >= policy.flap_count:
            raw[KIND_NIC_FLAPPING] = f"the link went down {downs} times within {policy.window_s:g} s"
        errors = _rise(memory.samples, policy.error_counters)
        if errors >= policy.error_count:
            raw[KIND_NIC_ERRORS] = (f"error counters ({', '.join(policy.error_counters)}) rose by {errors} within "
                                    f"{policy.window_s:g} s (threshold {policy.error_count})")
        return self._findings(name, memory, raw, policy, now, gpus)

    @staticmethod
    def _expected_rate(port: PortReading, nic: NicReading, readings: NetworkReadings, memory: _PortMemory,
                       policy: NetworkPolicy) -> float:
        if policy.expected_rate_gbps:
            return policy.expected_rate_gbps
        if not port.link_layer:  # unknown (node_exporter's series say none): an InfiniBand and a RoCE port differ
            return memory.max_rate
        # Peers: the up ports of the same link layer on NICs of the same model (a 10 Gb/s iWARP port beside 40 Gb/s
        # QDR ones, an OmniPath HCA beside a ConnectX-3: each right at its own rate).
        peers = [p.rate_gbps or 0.0 for n in readings.nics if n.model == nic.model for p in n.ports
                 if p.up and p.link_layer == port.link_layer and not policy.ignored(p.name)]
        return max([memory.max_rate, *peers])

    def _gone(self, device: str, number: int, policy: NetworkPolicy, now: float,
              gpus: tuple[str, ...]) -> list[Finding]:
        name = f"{device}/{number}"
        memory = self._ports.get(name)
        if memory is None or policy.ignored(name) or not (memory.seen_up or policy.watch_never_up):
            return []
        why = f"the device {device} is gone from /sys/class/infiniband (driver unloaded or the NIC fell off the bus)"
        return self._findings(name, memory, {KIND_NIC_DOWN: why}, policy, now, gpus)

    def _findings(self, name: str, memory: _PortMemory, raw: Mapping[str, str], policy: NetworkPolicy, now: float,
                  gpus: tuple[str, ...]) -> list[Finding]:
        for kind in list(memory.active):
            active = memory.active[kind]
            if kind in raw:
                active.clear_since, active.detail = None, raw[kind]
                continue
            if active.clear_since is None:
                active.clear_since = now
            if now - active.clear_since >= policy.clear_after_s:
                del memory.active[kind]  # gone long enough: lifted
        for kind, detail in raw.items():
            memory.active.setdefault(kind, _Active(now, None, detail))
        return [self._finding(name, kind, active, policy, now, gpus) for kind, active in sorted(memory.active.items())]

    def _finding(self, port: str, kind: str, active: _Active, policy: NetworkPolicy, now: float,
                 gpus: tuple[str, ...]) -> Finding:
        device = port.split("/", 1)[0]
        word = _REASONS[kind]
        if kind == KIND_NIC_DOWN and now - active.since >= policy.stuck_down_after_s:
            word = REASON_STUCK_DOWN
        action = policy.action_for(word)
        # No running times in the message: the agent rewrites its condition whenever the message changes.
        lasting = f" for more than {policy.stuck_down_after_s:g} s" if word == REASON_STUCK_DOWN else ""
        clearing = " (clearing)" if active.clear_since is not None else ""
        rail = f"; GPUs on its rail: {', '.join(gpus)}" if gpus else ""
        message = f"{kind} {port}: {active.detail}{lasting}{clearing}{rail} → {action}"
        return Finding(node=self.node, kind=kind, code=device, gpus=gpus, action=action,
                       fingerprint=f"{kind}:{port}:{word}@{active.since:.0f}", message=message)


class NetworkJudges:
    """The controller's judges of node_exporter's InfiniBand series (``[network] prometheus``), one per node. A node
    the read brought nothing for (node_exporter not scraped, its series stale, the query failed) keeps the findings
    it had: a gap in Prometheus is not a link back up."""

    def __init__(self) -> None:
        self._judges: dict[str, NetworkJudge] = {}
        self._last: dict[str, list[Finding]] = {}

    def findings(self, node: str, readings: NetworkReadings | None, policy: NetworkPolicy,
                 now: float) -> list[Finding]:
        if not (policy.enabled and policy.prometheus):
            self.forget(lambda name: name != node)
            return []
        if readings is None:
            return list(self._last.get(node, ()))
        judge = self._judges.setdefault(node, NetworkJudge(node))
        found = self._last[node] = judge.judge(readings, policy, now)
        return list(found)

    def kinds(self, node: str) -> set[str]:
        """The kinds of the node's findings from node_exporter's series now."""
        return {f.kind for f in self._last.get(node, ())}

    def forget(self, keep: Callable[[str], bool]) -> None:
        for name in [n for n in self._judges if not keep(n)]:
            del self._judges[name]
            self._last.pop(name, None)


def reason_of(finding: Finding) -> str:
    """The GPUNetworkHealthy reason for a finding the judge made."""
    word = REASON_STUCK_DOWN if f":{REASON_STUCK_DOWN}@" in finding.fingerprint else _REASONS[finding.kind]
    return condition_reason(word, finding.code)
