"""The policy file (TOML): every threshold and XID entry, overridable per node group.

The schema is declarative: each section is a frozen dataclass whose fields carry their type,
default, validator and documentation (``setting``/``section``). One generic walker merges a TOML
table onto a section, so a new section (drain, remediation, budget, ``actions.<name>``, ...) is a new
dataclass and one field, not new parsing code. Per-node sections go on ``Policy`` (``[[groups]]``
can override them); cluster-wide ones go on ``ClusterSettings``.

Errors name the key path: ``groups[1].thermal.gpu_cordon_c: expected a number, got "hot"``
(group indices count from 0); a bad value longer than 80 characters is cut to its start and its size
(``got "xxxx"… (20000 bytes)``, ``schema.excerpt``).
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuremediate.gpu_resources import GpuResourcesPolicy
from gpuremediate.policy.conditions import ConditionsPolicy
from gpuremediate.policy.fabric import FabricPolicy
from gpuremediate.policy.gpu_operator import GpuOperatorPolicy
from gpuremediate.policy.isolation import IsolationPolicy
from gpuremediate.policy.network import NetworkPolicy
from gpuremediate.policy.preflight import PreflightPolicy
from gpuremediate.policy.recovery_action import RecoveryActionPolicy
from gpuremediate.policy.selector import Selector, SelectorError, parse_selector
from gpuremediate.policy.taint import TaintPolicy
from gpuremediate.policy.workflow import (
    BreakerPolicy,
    BudgetPolicy,
    CustomAction,
    CustomDrainPolicy,
    DrainPolicy,
    GatesPolicy,
    MaintenancePolicy,
    NotificationsPolicy,
    PausePolicy,
    RemediationPolicy,
    RepeatOffenderPolicy,
    ValidationPolicy,
)
from gpuremediate.policy.workload import WorkloadPolicy
from gpuremediate.policy.xid import XidOverride
from gpuremediate.signals.model import MAX_TEMP_C
from gpuremediate.vocab.degradation import DegradationPolicy
from gpuremediate.vocab.findings import (
    ACTION_QUARANTINE,
    ACTION_RESET_GPU,
    BUILTIN_ACTIONS,
)
from gpuremediate.vocab.schema import (
    MAX_DURATION_S,
    PolicyError,
    _join,
    _show,
    at_least,
    between,
    check_action,
    coerce,
    merge_section,
    setting,
)


def _parse_xid_code(key: str, path: str) -> int:
    if not key.isascii() or not key.isdigit() or int(key) <= 0:
        raise PolicyError(f"{path}: an XID override's key must be a positive XID number, got {_show(key)}")
    return int(key)


def _parse_xid_override(raw: Any, path: str) -> XidOverride:
    if isinstance(raw, Mapping):
        unknown = sorted(set(raw) - {"action", "reason"})
        if unknown:
            raise PolicyError(f"{_join(path, unknown[0])}: unknown key (known: action, reason)")
        if "action" not in raw:
            raise PolicyError(f"{path}.action: required")
        action = coerce(str, raw["action"], f"{path}.action")
        check_action(action, f"{path}.action")
        return XidOverride(action=action, reason=coerce(str, raw.get("reason", ""), f"{path}.reason"))
    if isinstance(raw, str):
        check_action(raw, path)
        return XidOverride(action=raw)
    raise PolicyError(f"{path}: expected an action name or a table {{action, reason}}, got {_show(raw)}")


def parse_xid_overrides(raw: Any, path: str, current: Mapping[int, XidOverride]) -> Mapping[int, XidOverride]:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: expected a table of XID number = action, got {_show(raw)}")
    merged = dict(current)
    for key, value in raw.items():
        sub = _join(path, key)
        merged[_parse_xid_code(key, sub)] = _parse_xid_override(value, sub)
    return MappingProxyType(dict(sorted(merged.items())))


# --- sections --------------------------------------------------------------------------------------

GROUP_KEYS = ("name", "selector")


@dataclass(frozen=True)
class XidPolicy:
    enabled: bool = setting(True, "act on XIDs (the DCGM_FI_DEV_XID_ERRORS gauge and the per-XID counts)")
    unknown_action: str = setting(ACTION_QUARANTINE, "action for an XID that NVIDIA's catalog does not list",
                                  action=True)
    overrides: Mapping[int, XidOverride] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata={"doc": 'per XID: "79" = "reset-gpu", or a table {action, reason}', "parse": parse_xid_overrides},
    )

    def action_refs(self, path: str) -> Iterator[tuple[str, str]]:
        for code, override in self.overrides.items():
            yield f"{path}.overrides.{code}", override.action


@dataclass(frozen=True)
class EccPolicy:
    enabled: bool = setting(True, "act on volatile double-bit ECC errors")
    dbe_min: int = setting(1, "act when DCGM_FI_DEV_ECC_DBE_VOL_TOTAL is at least this", check=at_least(1))
    dbe_action: str = setting(ACTION_RESET_GPU, "action for volatile double-bit ECC errors", action=True)


@dataclass(frozen=True)
class RowRemapPolicy:
    enabled: bool = setting(True, "act on row-remapping signals")
    failure_action: str = setting(ACTION_QUARANTINE, "action when DCGM_FI_DEV_ROW_REMAP_FAILURE > 0", action=True)
    pending_action: str = setting(ACTION_RESET_GPU, "action when DCGM_FI_DEV_ROW_REMAP_PENDING > 0", action=True)
    pending_urgent: bool = setting(False, "false: a pending remap may wait for a maintenance window")
    uncorrectable_rows_min: int = setting(
        8, "act when DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS is at least this (0 disables)", check=at_least(0)
    )
    uncorrectable_rows_action: str = setting(ACTION_QUARANTINE, "action for too many uncorrectable remapped rows",
                                             action=True)


@dataclass(frozen=True)
class ThermalPolicy:
    enabled: bool = setting(True, "cordon GPUs that stay too hot")
    gpu_cordon_c: float = setting(90.0, "GPU temperature (C) at or above which the hold timer runs",
                                  check=between(0, MAX_TEMP_C))
    gpu_clear_c: float = setting(80.0, "GPU temperature (C) at or below which the clear timer runs",
                                 check=between(0, MAX_TEMP_C))
    memory_cordon_c: float = setting(95.0, "memory (HBM) temperature (C) at or above which the hold timer runs",
                                     check=between(0, MAX_TEMP_C))
    memory_clear_c: float = setting(85.0, "memory temperature (C) at or below which the clear timer runs",
                                    check=between(0, MAX_TEMP_C))
    hold_s: float = setting(60.0, "seconds continuously hot before the cordon finding",
                            check=between(0, MAX_DURATION_S))
    clear_hold_s: float = setting(300.0, "seconds continuously cool before the cordon clears",
                                  check=between(0, MAX_DURATION_S))

    def validate(self, path: str) -> None:
        for name in ("gpu", "memory"):
            cordon, clear = getattr(self, f"{name}_cordon_c"), getattr(self, f"{name}_clear_c")
            if clear >= cordon:
                raise PolicyError(f"{path}: {name}_clear_c ({clear:g}) must be below {name}_cordon_c ({cordon:g})")


@dataclass(frozen=True)
class Policy:
    """What applies to one node: the top-level sections, overridden by the first matching group."""

    xid: XidPolicy = field(default_factory=XidPolicy, metadata={"doc": "the XID table and its overrides"})
    ecc: EccPolicy = field(default_factory=EccPolicy, metadata={"doc": "ECC errors"})
    row_remap: RowRemapPolicy = field(default_factory=RowRemapPolicy, metadata={"doc": "row remapping"})
    thermal: ThermalPolicy = field(default_factory=ThermalPolicy, metadata={"doc": "thermal cordon with hysteresis"})
    drain: DrainPolicy = field(default_factory=DrainPolicy, metadata={"doc": "how a node is drained"})
    remediation: RemediationPolicy = field(
        default_factory=RemediationPolicy, metadata={"doc": "the built-in repair Jobs"}
    )
    validation: ValidationPolicy = field(
        default_factory=ValidationPolicy, metadata={"doc": "the validation Job on all the node's GPUs"}
    )
    customDrain: CustomDrainPolicy = field(
        default_factory=CustomDrainPolicy, metadata={"doc": "hand the drain to a drain plugin (DrainRequest)"}
    )
    conditions: ConditionsPolicy = field(
        default_factory=ConditionsPolicy, metadata={"doc": "NodeConditions (the agent's, other tools') as findings"}
    )
    gpu_operator: GpuOperatorPolicy = field(
        default_factory=GpuOperatorPolicy, metadata={"doc": "reset-gpu on GPU Operator nodes: operands off, then back"}
    )
    gpu_resources: GpuResourcesPolicy = field(
        default_factory=GpuResourcesPolicy, metadata={"doc": "which extended resources are GPUs (MIG slices too)"}
    )
    isolation: IsolationPolicy = field(
        default_factory=IsolationPolicy, metadata={"doc": "one bad GPU out, or its whole node (docs/dra.md)"}
    )
    degradation: DegradationPolicy = field(
        default_factory=DegradationPolicy, metadata={"doc": "slow GPUs and degraded links (docs/degradation.md)"}
    )
    workload: WorkloadPolicy = field(
        default_factory=WorkloadPolicy, metadata={"doc": "pods failing on a node with GPU errors as a finding"}
    )
    preflight: PreflightPolicy = field(
        default_factory=PreflightPolicy, metadata={"doc": "the GPU preflight before a pod starts (docs/preflight.md)"}
    )
    recovery_action: RecoveryActionPolicy = field(
        default_factory=RecoveryActionPolicy, metadata={"doc": "the driver's recovery action for a GPU (DCGM 1523)"}
    )
    fabric: FabricPolicy = field(
        default_factory=FabricPolicy, metadata={"doc": "NVLink domains (NVL72): fabric state, IMEX (operations.md)"}
    )
    network: NetworkPolicy = field(
        default_factory=NetworkPolicy, metadata={"doc": "RDMA NIC ports (InfiniBand, RoCE) read by the agent "
                                                        "(docs/network.md)"}
    )


# Action kinds the record already uses for steps that are not repairs: a custom action of that name could not
# be told apart from them in a record.
RESERVED_ACTION_KINDS = frozenset({"drain", "validate", "diagnostics"})


def parse_actions(raw: Any, path: str, current: Mapping[str, CustomAction]) -> Mapping[str, CustomAction]:
    """``[actions.<name>]`` tables → custom actions; superseding groups must name a node-wide group."""
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: expected a table of [actions.<name>] tables, got {_show(raw)}")
    merged = dict(current)
    for name, table in raw.items():
        sub = _join(path, name)
        if name in BUILTIN_ACTIONS:
            raise PolicyError(f"{sub}: {_show(name)} is a built-in action; a custom action needs another name")
        if name in RESERVED_ACTION_KINDS:
            raise PolicyError(f"{sub}: {_show(name)} names a step of gpuremediate's own (the record's action kind); "
                              "a custom action needs another name")
        check_action(name, sub)
        merged[name] = merge_section(merged.get(name, CustomAction()), table, sub)
    node_wide = {a.group_of(n) for n, a in merged.items() if not a.impactedEntityScope}
    for name, action in merged.items():
        for group in action.supersedingEquivalenceGroups:
            if group not in node_wide:
                raise PolicyError(f"{_join(path, name)}.supersedingEquivalenceGroups: {_show(group)} is not the "
                                  "equivalence group of a defined action without impactedEntityScope")
    return MappingProxyType(merged)


@dataclass(frozen=True)
class ClusterSettings:
    """Cluster-wide sections (not per group)."""

    budget: BudgetPolicy = field(default_factory=BudgetPolicy, metadata={"doc": "the disruption budget"})
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy, metadata={"doc": "the circuit breaker"})
    repeat_offender: RepeatOffenderPolicy = field(
        default_factory=RepeatOffenderPolicy, metadata={"doc": "quarantine nodes that keep failing"}
    )
    actions: Mapping[str, CustomAction] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata={"doc": "custom remediation actions, [actions.<name>]", "parse": parse_actions},
    )
    maintenance: MaintenancePolicy = field(
        default_factory=MaintenancePolicy, metadata={"doc": "inbound MaintenanceRequests"}
    )
    pause: PausePolicy = field(default_factory=PausePolicy, metadata={"doc": "what `gpuremediate pause` holds"})
    gates: GatesPolicy = field(default_factory=GatesPolicy, metadata={"doc": "what must hold before a drain starts"})
    notifications: NotificationsPolicy = field(
        default_factory=NotificationsPolicy, metadata={"doc": "a webhook for what needs a person"}
    )
    taint: TaintPolicy = field(
        default_factory=TaintPolicy, metadata={"doc": "a taint on held nodes, beside or instead of the cordon"}
    )


@dataclass(frozen=True)
class NodeGroup:
    name: str
    selector: Selector
    policy: Policy


@dataclass(frozen=True)
class PolicyFile:
    defaults: Policy = field(default_factory=Policy)
    groups: tuple[NodeGroup, ...] = ()
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    source: str = "<defaults>"
    # The file set nothing (empty, or only comments): every value is the built-in default. Said at start, since a
    # file that rendered empty (a values typo, a ConfigMap key emptied) reads the same as a deliberate one.
    empty: bool = False

    def group_for(self, labels: Mapping[str, str]) -> NodeGroup | None:
        return next((group for group in self.groups if group.selector.matches(labels)), None)

    def for_node(self, labels: Mapping[str, str]) -> Policy:
        """The first group whose selector matches wins; otherwise the top-level policy."""
        group = self.group_for(labels)
        return group.policy if group else self.defaults

    def custom_action_refs(self) -> list[tuple[str, str]]:
        """(key path, name) of every custom action the file names, for the ``actions.<name>`` check."""
        refs = list(_action_refs(self.defaults, ""))
        for index, group in enumerate(self.groups):
            refs += _action_refs(group.policy, f"groups[{index}]")
        return [(path, name) for path, name in refs if name not in BUILTIN_ACTIONS]

    def check_custom_actions(self, known: Collection[str]) -> None:
        """Hook: raise naming the first key path whose custom action is not in ``known``."""
        for path, name in self.custom_action_refs():
            if name not in known:
                raise PolicyError(f"{path}: custom action {_show(name)} is not defined (no [actions.<that name>] "
                                  f"table)")


# --- the generic walker ----------------------------------------------------------------------------


def _action_refs(obj: Any, path: str) -> Iterator[tuple[str, str]]:
    for spec in fields(obj):
        value = getattr(obj, spec.name)
        if spec.metadata.get("action"):
            yield _join(path, spec.name), value
        elif is_dataclass(value):
            yield from _action_refs(value, _join(path, spec.name))
    extra = getattr(obj, "action_refs", None)
    if callable(extra):
        yield from extra(path)


# --- entry points ----------------------------------------------------------------------------------


def _field_names(cls: type) -> set[str]:
    return {spec.name for spec in fields(cls)}


def _parse_group(index: int, raw: Any, defaults: Policy) -> NodeGroup:
    path = f"groups[{index}]"
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: expected a table ([[groups]]), got {_show(raw)}")
    selector_text = raw.get("selector")
    if not isinstance(selector_text, str):
        got = "nothing" if selector_text is None else _show(selector_text)
        raise PolicyError(f"{path}.selector: expected a label selector string, got {got}")
    try:
        selector = parse_selector(selector_text)
    except SelectorError as exc:
        raise PolicyError(f"{path}.selector: {exc}") from None
    name = raw.get("name", path)
    if not isinstance(name, str):
        raise PolicyError(f"{path}.name: expected a string, got {_show(name)}")
    rest = {key: value for key, value in raw.items() if key not in GROUP_KEYS}
    return NodeGroup(name=name, selector=selector, policy=merge_section(defaults, rest, path))


def _known_sections(key: str, sections: Collection[str]) -> str:
    """The close section names of a mistyped key, or all of them; a key too long to be a typo gets the page."""
    close = difflib.get_close_matches(key, sections, n=3, cutoff=0.75)
    if close:
        return "did you mean " + " or ".join(close) + "?"
    if len(key) > 40:
        return "not a section of the policy: docs/policy-reference.md lists them"
    return "known: " + ", ".join(sorted({*sections, "groups"}))


def parse_policy(data: Mapping[str, Any], source: str = "<data>") -> PolicyFile:
    """A parsed TOML document → PolicyFile; raises PolicyError naming the key path."""
    policy_keys, cluster_keys = _field_names(Policy), _field_names(ClusterSettings)
    for key in data:
        if key not in policy_keys | cluster_keys | {"groups"}:
            raise PolicyError(f"{_join('', key)}: unknown key ({_known_sections(key, policy_keys | cluster_keys)})")
    defaults = merge_section(Policy(), {k: v for k, v in data.items() if k in policy_keys}, "")
    cluster = merge_section(ClusterSettings(), {k: v for k, v in data.items() if k in cluster_keys}, "")
    raw_groups = data.get("groups", [])
    if not isinstance(raw_groups, list):
        raise PolicyError(f"groups: expected an array of tables ([[groups]]), got {_show(raw_groups)}")
    groups = tuple(_parse_group(index, raw, defaults) for index, raw in enumerate(raw_groups))
    return PolicyFile(defaults=defaults, groups=groups, cluster=cluster, source=source, empty=not data)


def loads_policy(text: str, source: str = "<string>") -> PolicyFile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise PolicyError(f"{source}: nested too deeply (arrays or tables inside each other) to be a policy") from None
    return parse_policy(data, source)


def load_policy(path: str | Path) -> PolicyFile:
    """Read and check the policy file (the one I/O of the policy layer), including that every custom
    action it names is defined under ``[actions.<name>]``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read the policy file: {exc}") from None
    policy_file = loads_policy(text, str(path))
    policy_file.check_custom_actions(policy_file.cluster.actions)
    return policy_file


def default_policy() -> PolicyFile:
    return PolicyFile()
