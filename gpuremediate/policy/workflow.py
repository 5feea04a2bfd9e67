"""Policy sections for what the controller does about a fault: drain, repair, validate, and the
fleet-wide safety knobs (budget, circuit breaker, repeat offender).

Per-node sections (``[drain]``, ``[remediation.*]``, ``[validation]``) sit on ``Policy`` and can be
overridden per ``[[groups]]``; fleet-wide ones (``[budget]``, ``[breaker]``, ``[repeat_offender]``)
sit on ``ClusterSettings``. Durations are seconds.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuremediate.policy.selector import SelectorError, check_label_key, parse_selector
from gpuremediate.policy.taint import taint_key
from gpuremediate.vocab.findings import ACTION_CORDON, ACTION_NONE, ACTION_QUARANTINE, ACTION_REPLACE, BUILTIN_ACTIONS
from gpuremediate.vocab.schema import (
    PolicyError,
    _join,
    _show,
    at_least,
    between,
    check_action,
    dns_label,
    dns_subdomain,
    duration,
    excerpt,
    image_reference,
    is_dns_label,
    merge_section,
    one_of,
    setting,
    shell_words,
    string_list,
)

DRAIN_MODES = ("Immediate", "AllowCompletion", "DeleteAfterTimeout")
DRAIN_SCOPES = ("all", "gpu", "impacted")
DRAIN_TIMEOUT_ACTIONS = ("quarantine", "delete")
_PERCENT = re.compile(r"\d{1,3}%", re.ASCII)

DCGM_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
MAX_LEAD_S = 366 * 86400.0
MAX_GRACE_S = 366 * 86400  # a pod's terminationGracePeriodSeconds is an int64; a year is plenty
MAX_ATTEMPTS = 100


def label_key(value: Any, path: str) -> None:
    try:
        check_label_key(value)
    except SelectorError as exc:
        raise PolicyError(f"{path}: {exc}") from None


def selector_text(value: Any, path: str) -> None:
    try:
        parse_selector(value)
    except SelectorError as exc:
        raise PolicyError(f"{path}: {exc}") from None


def _any_text(value: Any, path: str) -> None:
    if not value.strip():
        raise PolicyError(f"{path}: must not be empty")


def parse_namespace_modes(raw: Any, path: str, current: Mapping[str, str]) -> Mapping[str, str]:
    """``[drain.namespace_modes]``: namespace = one of the drain modes (a group's table adds to its base's)."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: expected a table of namespace = mode, got {_show(raw)}")
    merged = dict(current)
    for namespace, mode in raw.items():
        sub = _join(path, namespace)
        dns_label(namespace, sub)
        if not isinstance(mode, str):
            raise PolicyError(f"{sub}: expected a drain mode string, got {_show(mode)}")
        one_of(*DRAIN_MODES)(mode, sub)
        merged[namespace] = mode
    return MappingProxyType(dict(sorted(merged.items())))


@dataclass(frozen=True)
class DrainPolicy:
    mode: str = setting("Immediate", "Immediate (evict, honour PDBs) | AllowCompletion (wait for pods to finish) | "
                        "DeleteAfterTimeout (wait, then delete)", check=one_of(*DRAIN_MODES))
    scope: str = setting("all", "all | gpu (pods requesting a [gpu_resources] name: nvidia.com/gpu, "
                         "nvidia.com/mig-*) | impacted (pods on the faulty GPUs); widened to what the repair "
                         "ends (a reboot: all; a reset of every GPU: gpu)",
                         check=one_of(*DRAIN_SCOPES))
    timeout_s: float = setting(1800.0, "seconds before the drain's timeout outcome", check=duration(1))
    timeout_action: str = setting(
        "quarantine",
        "Immediate/AllowCompletion at timeout: quarantine (pods stay, a person decides) | delete (delete what is left)",
        check=one_of(*DRAIN_TIMEOUT_ACTIONS),
    )
    grace_period_s: int = setting(-1, "eviction/delete grace seconds (-1: each pod's own)",
                                  check=between(-1, MAX_GRACE_S))
    stuck_s: float = setting(
        60.0, "past the timeout, seconds a pod may stay Terminating beyond its grace period (a finalizer, a D-state "
        "process, a dead kubelet) before the drain ends anyway: with timeout_action delete it is force-deleted where "
        "the node is NotReady and the drain goes on to the repair; with quarantine the node is quarantined",
        check=duration(1))
    retry_s: float = setting(5.0, "seconds between drain steps (a PDB refusal is retried after this)",
                             check=duration(0.1))
    namespace_modes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), metadata={
        "doc": 'a drain mode per namespace, e.g. {"batch" = "AllowCompletion", "inference" = "Immediate"} '
               "(the others: mode)",
        "parse": parse_namespace_modes})
    skip_namespaces: tuple[str, ...] = field(default=(), metadata={
        "doc": 'namespaces whose pods are never evicted nor waited for, e.g. ["kube-system", "gpu-operator"] '
               "(NVSentinel's system namespaces)",
        "parse": string_list(dns_label), "example": ["kube-system", "gpu-operator"]})
    pod_events: bool = setting(True, "a Warning Event GPUFault on each pod the drain evicts or deletes, and on its "
                               "owner (its Job, JobSet, PyTorchJob...), naming the GPU, the fault and when it was "
                               "seen (not in a dry run)")

    def mode_of(self, namespace: str) -> str:
        """The drain mode for a pod of ``namespace``."""
        return self.namespace_modes.get(namespace, self.mode)


@dataclass(frozen=True)
class JobPolicy:
    image: str = setting(DCGM_IMAGE, "container image", check=image_reference)
    command: str = setting("true", "command, split like a shell would (shlex); $(NODE_NAME), $(GPU_IDS) (indexes, or "
                           "UUIDs where no readings show the faulty GPUs: nvidia-smi -i takes either) and "
                           "$(GPU_UUIDS) are expanded by Kubernetes", check=shell_words)
    service_account: str = setting("gpuremediate-job", "ServiceAccount of the Job's pod", check=dns_subdomain)
    privileged: bool = setting(True, "privileged container (GPU reset and reboot need the host)")
    host_pid: bool = setting(False, "share the host's PID namespace")
    timeout_s: float = setting(900.0, "seconds before the attempt counts as failed", check=duration(1))


def _reset_job() -> JobPolicy:
    return JobPolicy(command="nvidia-smi --gpu-reset -i $(GPU_IDS)", timeout_s=600.0)


def _reboot_job() -> JobPolicy:
    return JobPolicy(
        image="busybox:1.36", command="nsenter -t 1 -m -u -i -n -p -- systemctl reboot", host_pid=True, timeout_s=1200.0
    )


# --- escalation ladders ([remediation.ladders]) -----------------------------------------------------

RUNG_KEYS = ("action", "attempts", "timeout")
NOT_REPAIRS = (ACTION_NONE, ACTION_CORDON, ACTION_QUARANTINE)  # actions that are no rung of their own
_DURATION_TEXT = re.compile(r"(\d+(?:\.\d+)?)([smh])", re.ASCII)
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Rung:
    """One rung of an escalation ladder: a repair action, its attempts and its timeout per attempt."""

    action: str
    attempts: int = 0  # 0: the action's own count (remediation.max_attempts, actions.<name>.maxAttempts)
    timeout_s: float = 0.0  # 0: the action's own timeout (remediation.<job>.timeout_s, actions.<name>.timeout)


def parse_duration_value(raw: Any, path: str) -> float:
    """Seconds, as a number (600) or a text with one unit (\"90s\", \"10m\", \"2h\")."""
    seconds: float | None = None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        seconds = float(raw)
    elif isinstance(raw, str) and (match := _DURATION_TEXT.fullmatch(raw.strip())):
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds is None:
        raise PolicyError(f"{path}: expected seconds (a number) or a duration like \"10m\", got {_show(raw)}")
    duration(1)(seconds, path)
    return seconds


def _parse_rung(raw: Any, path: str, last: bool) -> Rung:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: expected a table {{action, attempts, timeout}}, got {_show(raw)}")
    unknown = sorted(set(raw) - set(RUNG_KEYS))
    if unknown:
        raise PolicyError(f"{_join(path, unknown[0])}: unknown key (known: {', '.join(RUNG_KEYS)})")
    action = raw.get("action")
    if not isinstance(action, str):
        raise PolicyError(f"{path}.action: required (a repair action: reset-gpu, reboot or an [actions.<name>])")
    check_action(action, f"{path}.action")
    if action in (ACTION_NONE, ACTION_CORDON):
        raise PolicyError(f"{path}.action: {_show(action)} repairs nothing; a rung is reset-gpu, reboot, a custom "
                          "action or (last) quarantine")
    if action == ACTION_QUARANTINE:
        if not last:
            raise PolicyError(f"{path}.action: quarantine ends the ladder; it may only be the last rung")
        if set(raw) != {"action"}:
            raise PolicyError(f"{path}: the quarantine rung takes no attempts or timeout")
    attempts = raw.get("attempts", 0)
    if "attempts" in raw:
        if not isinstance(attempts, int) or isinstance(attempts, bool):
            raise PolicyError(f"{path}.attempts: expected an integer, got {_show(attempts)}")
        between(1, MAX_ATTEMPTS)(attempts, f"{path}.attempts")
    timeout = parse_duration_value(raw["timeout"], f"{path}.timeout") if "timeout" in raw else 0.0
    return Rung(action=action, attempts=attempts, timeout_s=timeout)


def _parse_ladder(key: str, raw: Any, path: str) -> tuple[Rung, ...]:
    check_action(key, path)
    if key in NOT_REPAIRS:
        raise PolicyError(f"{path}: a ladder is keyed by the repair action a finding recommends (reset-gpu, reboot "
                          f"or a custom action), not {_show(key)}")
    if not isinstance(raw, list) or not raw:
        got = "an empty array" if raw == [] else _show(raw)
        raise PolicyError(f"{path}: expected a non-empty array of rungs [{{action = ...}}, ...], got {got}")
    rungs = tuple(_parse_rung(item, f"{path}[{i}]", i == len(raw) - 1) for i, item in enumerate(raw))
    if rungs[0].action != key:
        raise PolicyError(f"{path}[0].action: the first rung is the recommended action itself ({_show(key)}), got "
                          f"{_show(rungs[0].action)}")
    seen = [r.action for r in rungs]
    for i, action in enumerate(seen):
        if action in seen[:i]:
            raise PolicyError(f"{path}[{i}].action: {_show(action)} is already rung {seen.index(action) + 1}; give "
                              "that rung more attempts instead")
    return rungs


def parse_ladders(raw: Any, path: str, current: Mapping[str, tuple[Rung, ...]]) -> Mapping[str, tuple[Rung, ...]]:
    """``[remediation.ladders]``: action = [rungs]; a group's table replaces the ladders it names."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: expected a table of action = [rungs], got {_show(raw)}")
    merged = dict(current)
    for key, ladder in raw.items():
        merged[key] = _parse_ladder(key, ladder, _join(path, key))
    return MappingProxyType(dict(sorted(merged.items())))


# --- diagnostics before the first repair ([remediation.diagnostics]) ---------------------------------

DIAGNOSTICS_DIR = "/var/log/gpuremediate/diagnostics"


def _absolute_dir(value: Any, path: str) -> None:
    if not value.startswith("/") or any(c.isspace() or ord(c) < 32 for c in value) or "/../" in f"{value}/":
        raise PolicyError(f"{path}: expected an absolute directory on the node, got {_show(value)}")


def _diagnostics_job() -> JobPolicy:
    # nvidia-bug-report.sh ships with the driver on the host: run it there (its output lands on the host too).
    return JobPolicy(image="busybox:1.36", host_pid=True, timeout_s=900.0,
                     command="nsenter -t 1 -m -u -i -n -p -- sh -c \"mkdir -p $(DIAGNOSTICS_DIR) && "
                             "nvidia-bug-report.sh --output-file $(DIAGNOSTICS_OUTPUT)\"")


@dataclass(frozen=True)
class DiagnosticsPolicy:
    enabled: bool = setting(False, "run a diagnostics Job once per fault before its first repair (the evidence is "
                            "gone after a reset); its outcome never blocks the repair")
    output_dir: str = setting(DIAGNOSTICS_DIR, "directory on the node for the output; the Job gets "
                              "$(DIAGNOSTICS_DIR) and $(DIAGNOSTICS_OUTPUT) = <output_dir>/<job name>.log "
                              "(nvidia-bug-report.sh appends .gz)", check=_absolute_dir)
    job: JobPolicy = field(default_factory=_diagnostics_job, metadata={"doc": "the diagnostics Job"})


# --- replace, the last rung before a person ([remediation.replace]) -----------------------------------


def _startup_taint(value: Any, path: str) -> None:
    if value != "":
        taint_key(value, path)


REPLACE_PROVIDERS = ("auto", "cluster-api", "karpenter", "custom")


@dataclass(frozen=True)
class ReplacePolicy:
    enabled: bool = setting(False, "replace the node after the ladder's last repair rung fails, before a person: its "
                            "Cluster API Machine or Karpenter NodeClaim is deleted (once per Node) and its owner makes "
                            "a new node")
    provider: str = setting("auto", "auto (what the Node names: the cluster.x-k8s.io/machine annotation, else a "
                            "karpenter.sh NodeClaim), cluster-api, karpenter, or custom (the [actions.<action>] "
                            "custom remediation resource)", check=one_of(*REPLACE_PROVIDERS))
    action: str = setting("", "provider = custom: the [actions.<name>] that replaces the node")
    timeout_s: float = setting(1800.0, "seconds after the delete for the owner to take the node away (the "
                               "replacement joins as a new Node); past it a person decides", check=duration(1))
    startup_taint: str = setting("", "a taint key new nodes register with (Karpenter's NodePool startupTaints, a "
                                 "kubelet --register-with-taints): a node of this group that joins with no record and "
                                 "carries it is validated (the validation Job) before it takes work; the taint is "
                                 "removed when it passes, a failure quarantines it. Empty: off", check=_startup_taint)

    def validate(self, path: str) -> None:
        if self.provider == "custom":
            if not self.action:
                raise PolicyError(f"{path}.action: required with provider = \"custom\" (an [actions.<name>])")
            check_action(self.action, f"{path}.action")
            if self.action in BUILTIN_ACTIONS or self.action == ACTION_REPLACE:
                raise PolicyError(f"{path}.action: a custom action's name, got {_show(self.action)}")
        elif self.action:
            raise PolicyError(f"{path}.action: only with provider = \"custom\" (provider is {_show(self.provider)})")

    def rung(self) -> Rung | None:
        """The rung it adds at the end of every ladder (None: off). One attempt: a replace is never retried."""
        if not self.enabled:
            return None
        return Rung(self.action if self.provider == "custom" else ACTION_REPLACE, attempts=1,
                    timeout_s=self.timeout_s)

    def action_refs(self, path: str) -> Iterator[tuple[str, str]]:
        if self.provider == "custom":
            yield _join(path, "action"), self.action


@dataclass(frozen=True)
class RemediationPolicy:
    max_attempts: int = setting(2, "repair attempts before the node is quarantined", check=between(1, MAX_ATTEMPTS))
    reset_gpu: JobPolicy = field(default_factory=_reset_job, metadata={"doc": "the reset-gpu Job"})
    reboot: JobPolicy = field(default_factory=_reboot_job, metadata={"doc": "the reboot Job"})
    reboot_ready_timeout_s: float = setting(1800.0, "seconds for a new bootID and Ready after the reboot Job",
                                            check=duration(1))
    reboot_wait_for_boot_id: bool = setting(True, "a reboot is done when the node's bootID changed and it is Ready "
                                            "(false: when the reboot Job succeeded; for simulated nodes)")
    ladders: Mapping[str, tuple[Rung, ...]] = field(default_factory=lambda: MappingProxyType({}), metadata={
        "doc": "escalation per recommended action: reset-gpu = [{action = \"reset-gpu\", attempts = 2, timeout = "
               "\"10m\"}, {action = \"reboot\", attempts = 1}, {action = \"rma\"}]; the next rung when a rung's "
               "attempts fail, quarantine after the last (without a ladder: max_attempts, then quarantine)",
        "parse": parse_ladders})
    diagnostics: DiagnosticsPolicy = field(default_factory=DiagnosticsPolicy, metadata={
        "doc": "diagnostics (nvidia-bug-report.sh) before the first repair of a fault"})
    replace: ReplacePolicy = field(default_factory=ReplacePolicy, metadata={
        "doc": "replace the node as the last rung of every ladder, before a person (off by default)"})

    def ladder_for(self, action: str) -> tuple[Rung, ...]:
        """The repair rungs for a fault recommending ``action`` (a trailing quarantine rung is the implicit end),
        then ``[remediation.replace]``'s rung where it is on."""
        rungs = self.ladders.get(action) or (Rung(action),)
        repairs = tuple(r for r in rungs if r.action != ACTION_QUARANTINE) or (Rung(action),)
        last = self.replace.rung()
        if last is None or any(r.action == last.action for r in repairs):
            return repairs
        return (*repairs, last)

    def attempts_of(self, rung: Rung, actions: Mapping[str, CustomAction]) -> int:
        """A rung's attempts: its own, else its action's (max_attempts, or actions.<name>.maxAttempts)."""
        if rung.attempts:
            return rung.attempts
        custom = actions.get(rung.action)
        return custom.maxAttempts if custom is not None else self.max_attempts

    def action_refs(self, path: str) -> Iterator[tuple[str, str]]:
        """Every action a ladder names, for the ``actions.<name>`` check (built-ins are filtered there)."""
        for key, rungs in self.ladders.items():
            yield _join(path, f"ladders.{key}"), key
            for index, rung in enumerate(rungs):
                yield _join(path, f"ladders.{key}[{index}].action"), rung.action


def _validation_job() -> JobPolicy:
    return JobPolicy(command="dcgmi diag -r 2", privileged=False, timeout_s=1800.0)


@dataclass(frozen=True)
class ValidationPolicy:
    enabled: bool = setting(True, "validate before returning a node to service (false: straight to healthy)")
    job: JobPolicy = field(default_factory=_validation_job, metadata={"doc": "the validation Job (all GPUs)"})


def check_budget_value(text: str, path: str) -> None:
    value = text.strip()
    counted = value.isascii() and value.isdigit()
    if not (counted or _PERCENT.fullmatch(value)) or (value.endswith("%") and int(value[:-1]) > 100):
        raise PolicyError(f"{path}: expected a count like \"2\" or a percentage like \"25%\", "
                          f"got {excerpt(text, repr)}")


def budget_value(text: str) -> int | str:
    value = text.strip()
    return int(value) if value.isascii() and value.isdigit() else value


@dataclass(frozen=True)
class DomainBudgetPolicy:
    """``[[budget.domains]]``: a budget within each value of one node label (a failure domain)."""

    label: str = setting("", "node label whose values are the domains, e.g. topology.kubernetes.io/rack",
                         check=label_key)
    max_unavailable: str = setting("1", "most nodes out of service at once within one domain: a count or a "
                                   "percentage of that domain's nodes")

    def validate(self, path: str) -> None:
        if not self.label:
            raise PolicyError(f"{path}.label: required (the node label that names the domain)")
        check_budget_value(self.max_unavailable, f"{path}.max_unavailable")


def parse_domain_budgets(raw: Any, path: str, _current: Any) -> tuple[DomainBudgetPolicy, ...]:
    if not isinstance(raw, list):
        raise PolicyError(f"{path}: expected an array of tables ([[budget.domains]]), got {_show(raw)}")
    domains = []
    for index, table in enumerate(raw):
        domains.append(merge_section(DomainBudgetPolicy(), table, f"{path}[{index}]"))
    labels = [d.label for d in domains]
    for index, label in enumerate(labels):
        if label in labels[:index]:
            raise PolicyError(f"{path}[{index}].label: {excerpt(label, repr)} has a budget already")
    return tuple(domains)


@dataclass(frozen=True)
class BudgetPolicy:
    max_unavailable: str = setting("25%", "most GPU nodes out of service at once: a count (\"2\") or a percentage "
                                   "(\"25%\"); nodes unschedulable for any reason count")
    count_held: bool = setting(True, "nodes that only wait count too (quarantined, needing a person; cordoned for "
                               "heat): false lets repairs go on while they wait, which a small cluster may need "
                               "(docs/operations.md, \"Choosing the budget and the breaker\")")
    domains: tuple[DomainBudgetPolicy, ...] = field(default=(), metadata={
        "doc": "[[budget.domains]] {label, max_unavailable}: also at most this many nodes out per value of the "
               "label (a rack, an NVLink domain, a node pool)",
        "parse": parse_domain_budgets, "example": {"label": "topology.kubernetes.io/rack", "max_unavailable": "1"}})

    def validate(self, path: str) -> None:
        check_budget_value(self.max_unavailable, f"{path}.max_unavailable")

    def as_budget_value(self) -> int | str:
        return budget_value(self.max_unavailable)


@dataclass(frozen=True)
class BreakerPolicy:
    enabled: bool = setting(True, "stop starting new work when too many GPU nodes fault at once")
    threshold_percent: float = setting(30.0, "open when more than this % of GPU nodes fault within the window",
                                       check=between(0, 100))
    window_s: float = setting(600.0, "the window, seconds", check=duration(1))
    min_nodes: int = setting(3, "and at least this many nodes faulted", check=at_least(1))
    domain_labels: tuple[str, ...] = field(default=(), metadata={
        "doc": "node labels whose values are failure domains (rack, NVLink domain, driver version): when faults "
               "cluster on one value, work stops in that domain only",
        "parse": string_list(label_key),
        "example": ["topology.kubernetes.io/rack", "nvidia.com/cuda.driver-version.full"]})
    domain_threshold_percent: float = setting(50.0, "a domain opens when more than this % of its nodes fault "
                                              "within the window", check=between(0, 100))
    domain_min_nodes: int = setting(2, "and at least this many of its nodes faulted", check=at_least(1))
    # The arrival rate (issue 49; docs/architecture.md, "A storm is known by how it arrives"): a source hands a
    # storm over in installments, and a storm's first nodes look exactly like its last.
    look_nodes: int = setting(10, "a storm look opens when more than this many GPU nodes fault within "
                              "look_window_s (a single bad node, or a rack's handful, stays under it and is acted "
                              "on at once)", check=at_least(1))
    look_percent: float = setting(10.0, "... or more than this % of the GPU nodes (the lower of the two counts, "
                                  "never fewer than min_nodes)", check=between(0.01, 100))
    look_window_s: float = setting(30.0, "the window the arrival rate is counted over, seconds (two Prometheus "
                                   "scrape intervals at 15 s)", check=duration(1))
    look_s: float = setting(20.0, "how long new faults are held once a look opens, seconds: about one scrape "
                            "interval of the source and a few polls; the faults counted meanwhile that pass "
                            "threshold_percent open the breaker with none of them acted on, else they go on at once "
                            "(0: no look; a direct read's look also lasts until a read begun after it opened is "
                            "judged)", check=between(0, 3600))


PAUSE_IN_FLIGHT = ("finish", "hold")


@dataclass(frozen=True)
class PausePolicy:
    in_flight: str = setting("finish", "while paused (`gpuremediate pause`): finish (repairs and validations under "
                             "way go on) | hold (nothing moves until resumed)", check=one_of(*PAUSE_IN_FLIGHT))


@dataclass(frozen=True)
class GatesPolicy:
    """``[gates]``: what must hold before a new drain starts, beyond the budget and the breaker (kured's)."""

    blocking_alerts: tuple[str, ...] = field(default=(), metadata={
        "doc": "no drain starts while one of these Prometheus alerts fires (an unreadable alerts API blocks too)",
        "parse": string_list(_any_text), "example": ["KubeNodeNotReady", "GPUFleetDegraded"]})
    prometheus_url: str = setting("", "the Prometheus for blocking_alerts (empty: --prometheus-url)")
    alerts_ttl_s: float = setting(30.0, "seconds an alerts answer is reused", check=duration(1))
    blocking_pod_selectors: tuple[str, ...] = field(default=(), metadata={
        "doc": "no drain of a node running a pod that matches one of these label selectors",
        "parse": string_list(selector_text), "example": ["app=checkpoint-writer"]})
    settle_s: float = setting(0.0, "seconds after a node returned to service before the next drain starts "
                              "(0: off)", check=between(0, 366 * 86400.0))

    def validate(self, path: str) -> None:
        url = self.prometheus_url
        if url and not url.startswith(("http://", "https://")):
            raise PolicyError(f"{path}.prometheus_url: must start with http:// or https://, got {excerpt(url, repr)}")


NOTIFY_FORMATS = ("json", "slack")
# What may notify (obs/notify.py's kinds): the first four need a person and are the default; the others follow
# every repair (kured's one message per reboot): a drain admitted and started, a repair done, back in service.
NOTIFY_EVENTS = ("quarantined", "repair-failed", "breaker-open", "drain-blocked", "drain-started", "repaired",
                 "returned")
NOTIFY_DEFAULT_EVENTS = NOTIFY_EVENTS[:4]
# The named fields a [notifications].template may use, as {node}.
NOTIFY_FIELDS = ("node", "from", "to", "reason", "message", "cluster", "kind", "time")


def notify_template(value: Any, path: str) -> None:
    """A message template: text with {field} for the fields of NOTIFY_FIELDS (and {{ }} for braces)."""
    try:
        parts = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise PolicyError(f"{path}: {exc} (write {{{{ and }}}} for a brace)") from None
    for _literal, name, spec, _conversion in parts:
        if name is None:
            continue
        if name not in NOTIFY_FIELDS:
            raise PolicyError(f"{path}: unknown field {{{excerpt(name, str)}}}; the fields: "
                              f"{', '.join('{' + f + '}' for f in NOTIFY_FIELDS)}")
        if spec and "{" in spec:
            raise PolicyError(f"{path}: a field's format must not hold another field")


@dataclass(frozen=True)
class NotificationsPolicy:
    """``[notifications]``: a webhook for what needs a person (and, if chosen, every repair); its URL lives in a
    Secret."""

    enabled: bool = setting(False, "post the events below to the webhook")
    events: tuple[str, ...] = field(default=NOTIFY_DEFAULT_EVENTS, metadata={
        "doc": f"what notifies: {', '.join(NOTIFY_EVENTS)} (drain-started, repaired and returned: every repair's "
               "steps, one message each)",
        "parse": string_list(one_of(*NOTIFY_EVENTS)), "example": [*NOTIFY_DEFAULT_EVENTS, "drain-started",
                                                                  "returned"]})
    template: str = setting("", "the message text, with {node} {from} {to} {reason} {message} {cluster} {kind} "
                            "{time}: Slack's text, and `text` in the json body (empty: the built-in text)",
                            check=notify_template)
    secret: str = setting("gpuremediate-notifications", "Secret (in the controller's namespace) holding the URL",
                          check=dns_subdomain)
    secret_key: str = setting("url", "the Secret's key holding the webhook URL", check=_any_text)
    format: str = setting("json", "json (generic) | slack (Slack-compatible {text})", check=one_of(*NOTIFY_FORMATS))
    cluster: str = setting("", "a cluster name put in every notification")
    drain_blocked_after_s: float = setting(1800.0, "notify once when a drain stays blocked this long",
                                           check=duration(1))
    timeout_s: float = setting(5.0, "seconds per delivery attempt", check=between(0.1, 600))
    retries: int = setting(3, "retries after a failed delivery (with backoff)", check=between(0, 10))


@dataclass(frozen=True)
class RepeatOffenderPolicy:
    count: int = setting(3, "repairs within the window that quarantine a node (0 disables)", check=at_least(0))
    window_s: float = setting(7 * 86400.0, "the window, seconds", check=duration(1))


@dataclass(frozen=True)
class MaintenancePolicy:
    prepare_lead_s: float = setting(1800.0, "seconds before a MaintenanceRequest's startTime that preparation "
                                    "(cordon + drain) starts", check=between(0, MAX_LEAD_S))
    respect_budget: bool = setting(True, "a maintenance drain waits for the disruption budget and the circuit "
                                   "breaker like a fault does (false: it starts at its time regardless)")
    warn_age_s: float = setting(7 * 86400.0, "a request older than this is reported as forgotten (an Event)",
                                check=duration(1))


# --- plugins (NVSentinel's contracts; field names as NVSentinel spells them) ------------------------

CUSTOM_DRAIN_ON_TIMEOUT = ("quarantine", "builtin")
ACTION_SCOPES = ("Namespaced", "Cluster")
# Placeholders a custom action's template may use, in string values only.
PLACEHOLDERS = ("nodeName", "healthEventID", "action", "gpuUUIDs", "attempt", "namespace", "reason")
ENTITY_SCOPES = ("", "GPU", "GPU_UUID")
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_RESERVED_TEMPLATE_KEYS = ("apiVersion", "kind", "status")


def _not_empty(value: Any, path: str) -> None:
    if not str(value).strip():
        raise PolicyError(f"{path}: must not be empty")


def _condition_status(value: Any, path: str) -> None:
    one_of("True", "False", "Unknown")(value, path)


@dataclass(frozen=True)
class CustomDrainPolicy:
    """``[customDrain]``: hand the drain to a plugin through a DrainRequest-shaped resource."""

    enabled: bool = setting(False, "create one request per fault instead of evicting (a plugin drains)")
    apiGroup: str = setting("nvsentinel.nvidia.com", "API group of the request kind", check=dns_subdomain)
    version: str = setting("v1alpha1", "API version of the request kind", check=_not_empty)
    kind: str = setting("DrainRequest", "the request kind (its plural comes from discovery)", check=_not_empty)
    namespace: str = setting("gpuremediate-system", "namespace the requests are created in", check=dns_label)
    statusConditionType: str = setting("DrainComplete", "condition the plugin sets when the drain is done",
                                       check=_not_empty)
    statusConditionStatus: str = setting("True", "the condition's status that means done", check=_condition_status)
    timeout: float = setting(1800.0, "seconds to wait for the plugin, from the request's creationTimestamp (from the "
                             "drain's start until the request exists)",
                             check=duration(1))
    onTimeout: str = setting("quarantine", "quarantine (pods stay, a person decides) | builtin (delete the "
                             "request and drain with the built-in drain)", check=one_of(*CUSTOM_DRAIN_ON_TIMEOUT))

    @property
    def api_version(self) -> str:
        return f"{self.apiGroup}/{self.version}"


def template_placeholders(value: Any) -> set[str]:
    """Every placeholder name used in the string values of a template (keys are never templated)."""
    if isinstance(value, str):
        return {m.group(1) for m in _PLACEHOLDER.finditer(value)}
    children: Any = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else ()
    found: set[str] = set()
    for child in children:
        found |= template_placeholders(child)
    return found


def parse_template(raw: Any, path: str, current: Any) -> Any:
    """A structured resource body (TOML table) with ``{{placeholder}}`` in string values."""
    if not isinstance(raw, dict):
        raise PolicyError(f"{path}: expected a table (the resource body), got {type(raw).__name__}")
    for key in _RESERVED_TEMPLATE_KEYS:
        if key in raw:
            raise PolicyError(f"{path}.{key}: set by the controller (apiVersion/kind from the action, status by "
                              "the plugin); remove it from the template")
    meta = raw.get("metadata", {})
    if not isinstance(meta, dict) or set(meta) - {"labels", "annotations"}:
        raise PolicyError(f"{path}.metadata: only labels and annotations may be templated (the name and "
                          "namespace are the controller's)")
    unknown = sorted(template_placeholders(raw) - set(PLACEHOLDERS))
    if unknown:
        raise PolicyError(f"{path}: unknown placeholder {{{{{unknown[0]}}}}} (known: {', '.join(PLACEHOLDERS)})")
    return raw


def parse_names(raw: Any, path: str, current: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(v, str) and v for v in raw):
        raise PolicyError(f"{path}: expected an array of non-empty strings")
    return tuple(raw)


def _default_template() -> dict[str, Any]:
    return {"spec": {"nodeName": "{{nodeName}}", "action": "{{action}}", "healthEventId": "{{healthEventID}}"}}


@dataclass(frozen=True)
class CustomAction:
    """``[actions.<name>]``: a custom remediation resource and how to read its completion."""

    apiGroup: str = setting("", "API group of the remediation kind", check=dns_subdomain)
    version: str = setting("v1alpha1", "API version of the remediation kind", check=_not_empty)
    kind: str = setting("", "the remediation kind (its plural comes from discovery)", check=_not_empty)
    scope: str = setting("Namespaced", "Namespaced | Cluster", check=one_of(*ACTION_SCOPES))
    namespace: str = setting("gpuremediate-system", "namespace of the resources (Namespaced scope)")
    completeConditionType: str = setting("Complete", "condition: True = repaired, False = failed (retry), "
                                         "absent/Unknown = in progress", check=_not_empty)
    equivalenceGroup: str = setting("", "repairs of one group are never duplicated on a node (default: the "
                                    "action's name)")
    supersedingEquivalenceGroups: tuple[str, ...] = field(
        default=(), metadata={"doc": "groups whose in-progress or succeeded repair covers this one",
                              "parse": parse_names})
    impactedEntityScope: str = setting("", "\"\" (the node) | GPU | GPU_UUID: the group is per faulty GPU",
                                       check=one_of(*ENTITY_SCOPES))
    template: Any = field(default_factory=_default_template, metadata={
        "doc": "the resource body (a table); string values may use {{" + "}}, {{".join(PLACEHOLDERS) + "}}",
        "parse": parse_template})
    maxAttempts: int = setting(2, "resources (attempts) before the node is quarantined",
                               check=between(1, MAX_ATTEMPTS))
    timeout: float = setting(3600.0, "seconds one attempt may take before it counts as failed, from the resource's "
                             "creationTimestamp", check=duration(1))

    def validate(self, path: str) -> None:
        for key in ("apiGroup", "kind"):
            if not getattr(self, key).strip():
                raise PolicyError(f"{path}.{key}: required (the custom resource's {key})")
        if self.scope == "Namespaced" and not is_dns_label(self.namespace):
            raise PolicyError(f"{path}.namespace: a Namespaced action needs a namespace name, "
                              f"got {excerpt(self.namespace, repr)}")

    @property
    def api_version(self) -> str:
        return f"{self.apiGroup}/{self.version}"

    def group_of(self, name: str) -> str:
        """The equivalence group (the action's own name when none is configured)."""
        return self.equivalenceGroup or name
