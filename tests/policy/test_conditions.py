"""NodeConditions → findings through the policy table, and merging them with the metrics source's."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from gpuremediate.policy import conditions as c
from gpuremediate.policy.config import _action_refs
from gpuremediate.vocab.findings import (
    ACTION_CORDON,
    ACTION_NONE,
    ACTION_QUARANTINE,
    ACTION_REBOOT,
    ACTION_RESET_GPU,
    BUILTIN_ACTIONS,
    KIND_XID,
    Finding,
)
from gpuremediate.vocab.schema import PolicyError, merge_section

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def stamp(ts: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cond(ctype: str, status: str, reason: str = "", message: str = "", age_s: float = 10.0,
         since: float = NOW - 3600) -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": stamp(NOW - age_s), "lastTransitionTime": stamp(since)}


def node(*conds: dict[str, Any], name: str = "gpu-node-1") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": list(conds)}}


def policy_from(text: str) -> c.ConditionsPolicy:
    return merge_section(c.ConditionsPolicy(), tomllib.loads(text)["conditions"], "conditions")


def metric_finding(action: str = ACTION_RESET_GPU, node_name: str = "gpu-node-1") -> Finding:
    return Finding(node_name, KIND_XID, "48", ("GPU-1",), action, "xid:GPU-1:48", "GPU GPU-1 XID 48")


# --- the agent's reasons and the default table -----------------------------------------------------


@pytest.mark.parametrize(("action", "urgent", "reason"), [
    ("reset-gpu", True, "NeedsResetGpu"), ("reboot", True, "NeedsReboot"),
    ("reset-gpu", False, "NeedsResetGpuDeferred"), ("nvsentinel-reset", True, "NeedsNvsentinelReset"),
])
def test_reason_for_action_is_camel_case(action: str, urgent: bool, reason: str) -> None:
    assert c.reason_for_action(action, urgent) == reason


@pytest.mark.parametrize("action", [ACTION_QUARANTINE, ACTION_REBOOT, ACTION_RESET_GPU, ACTION_CORDON])
@pytest.mark.parametrize("urgent", [True, False])
def test_default_table_maps_the_agents_gpuhealthy_reason_back_to_its_action(action: str, urgent: bool) -> None:
    view = c.condition_view(node(cond(c.GPU_HEALTHY, "False", c.reason_for_action(action, urgent), "XID 79")),
                            c.ConditionsPolicy(), NOW)
    assert [(f.action, f.urgent, f.kind, f.code) for f in view.findings] == [
        (action, urgent, c.KIND_CONDITION, c.GPU_HEALTHY)]
    assert "XID 79" in view.findings[0].message


@pytest.mark.parametrize("ctype", [c.GPU_DRIVER_RESPONSIVE, c.GPU_COUNT_MATCHES, c.GPU_FABRIC_HEALTHY])
def test_default_table_reboots_for_a_hung_driver_a_missing_gpu_and_a_fatal_sxid(ctype: str) -> None:
    view = c.condition_view(node(cond(ctype, "False", "AnyReason")), c.ConditionsPolicy(), NOW)
    assert [f.action for f in view.findings] == [ACTION_REBOOT]


def test_healthy_agent_conditions_are_no_findings_but_say_the_agent_reports() -> None:
    view = c.condition_view(node(*(cond(t, "True", "Ok") for t in c.AGENT_CONDITIONS)), c.ConditionsPolicy(), NOW)
    assert view.findings == ()
    assert view.agent_reporting


def test_default_rules_need_no_custom_action() -> None:
    assert all(rule.action in BUILTIN_ACTIONS for rule in c.DEFAULT_RULES)


# --- matching ------------------------------------------------------------------------------------


def test_npd_condition_drives_an_action_through_a_file_rule() -> None:
    policy = policy_from('[[conditions.rules]]\ntype = "KernelDeadlock"\nstatus = "True"\naction = "reboot"\n')
    view = c.condition_view(node(cond("KernelDeadlock", "True", "DockerHung", "task docker:7 blocked"),
                                 cond("KernelDeadlock", "False", "KernelHasNoDeadlock")), policy, NOW)
    assert [(f.action, f.code) for f in view.findings] == [(ACTION_REBOOT, "KernelDeadlock")]
    assert not view.agent_reporting


def test_reason_must_match_when_the_rule_names_one() -> None:
    policy = policy_from('[[conditions.rules]]\ntype = "ReadonlyFilesystem"\nstatus = "True"\n'
                         'reason = "FilesystemIsReadOnly"\naction = "cordon"\n')
    matching = c.condition_view(node(cond("ReadonlyFilesystem", "True", "FilesystemIsReadOnly")), policy, NOW)
    other = c.condition_view(node(cond("ReadonlyFilesystem", "True", "SomethingElse")), policy, NOW)
    assert [f.action for f in matching.findings] == [ACTION_CORDON]
    assert other.findings == ()


def test_file_rules_come_before_the_defaults_and_the_first_match_wins() -> None:
    policy = policy_from('[[conditions.rules]]\ntype = "GPUDriverResponsive"\nstatus = "False"\naction = "none"\n')
    view = c.condition_view(node(cond(c.GPU_DRIVER_RESPONSIVE, "False", "NvidiaSmiTimeout")), policy, NOW)
    assert [f.action for f in view.findings] == [ACTION_NONE]


def test_a_stale_condition_is_ignored_and_said_why() -> None:
    view = c.condition_view(node(cond(c.GPU_DRIVER_RESPONSIVE, "False", "NvidiaSmiTimeout", age_s=901)),
                            c.ConditionsPolicy(), NOW)
    assert view.findings == ()
    assert not view.agent_reporting
    assert "GPUDriverResponsive=False" in view.ignored[0]


def test_disabled_policy_gives_nothing() -> None:
    policy = policy_from("[conditions]\nenabled = false\n")
    assert c.condition_view(node(cond(c.GPU_DRIVER_RESPONSIVE, "False")), policy, NOW).findings == ()


def test_fingerprint_is_new_when_the_condition_transitions_again() -> None:
    first = c.condition_view(node(cond(c.GPU_COUNT_MATCHES, "False", "GPUMissing", since=NOW - 600)),
                             c.ConditionsPolicy(), NOW)
    same = c.condition_view(node(cond(c.GPU_COUNT_MATCHES, "False", "GPUMissing", "other text", since=NOW - 600)),
                            c.ConditionsPolicy(), NOW)
    again = c.condition_view(node(cond(c.GPU_COUNT_MATCHES, "False", "GPUMissing", since=NOW - 60)),
                             c.ConditionsPolicy(), NOW)
    assert first.findings[0].fingerprint == same.findings[0].fingerprint
    assert first.findings[0].fingerprint != again.findings[0].fingerprint


def test_malformed_conditions_are_skipped() -> None:
    raw = {"metadata": {"name": "n"}, "status": {"conditions": ["junk", {"status": "False"}, None]}}
    assert c.condition_view(raw, c.ConditionsPolicy(), NOW).findings == ()
    assert c.condition_view({"metadata": {"name": "n"}, "status": {"conditions": "x"}},
                            c.ConditionsPolicy(), NOW).findings == ()


# --- parsing: errors name the key path -------------------------------------------------------------


@pytest.mark.parametrize(("text", "error"), [
    ('[[conditions.rules]]\ntype = "X"\nstatus = "false"\naction = "reboot"\n',
     'conditions.rules[0].status: expected one of True, False, Unknown, got "false"'),
    ('[[conditions.rules]]\ntype = "X"\nstatus = "True"\n', "conditions.rules[0].action: required"),
    ('[[conditions.rules]]\nstatus = "True"\naction = "reboot"\n', "conditions.rules[0].type: required"),
    ('[[conditions.rules]]\ntype = "X"\nstatus = "True"\naction = "Reboot!"\n', "conditions.rules[0].action: "),
    ('[[conditions.rules]]\ntype = "X"\nstatus = "True"\naction = "reboot"\nurgent = "no"\n',
     'conditions.rules[0].urgent: expected true or false, got "no"'),
    ('[[conditions.rules]]\ntype = "X"\nstatus = "True"\naction = "reboot"\ncolour = 1\n',
     "conditions.rules[0].colour: unknown key"),
    ('[[conditions.rules]]\ntype = ""\nstatus = "True"\naction = "reboot"\n',
     'conditions.rules[0].type: expected a non-empty string, got ""'),
    ("[conditions]\nrules = 3\n", "conditions.rules: expected an array of tables"),
    ("[conditions]\nmax_age_s = 0\n", "conditions.max_age_s: must be between 1 and"),
])
def test_bad_rules_name_the_key_path(text: str, error: str) -> None:
    with pytest.raises(PolicyError) as exc:
        policy_from(text)
    assert str(exc.value).startswith(error)


def test_custom_actions_in_rules_are_reported_for_the_actions_check() -> None:
    policy = policy_from('[[conditions.rules]]\ntype = "X"\nstatus = "True"\naction = "vendor-rma"\n')
    refs = [(path, name) for path, name in _action_refs(policy, "conditions") if name not in BUILTIN_ACTIONS]
    assert refs == [("conditions.rules[0].action", "vendor-rma")]


def test_parse_time_reads_rfc3339_and_rejects_junk() -> None:
    assert c.parse_time("2027-01-15T08:00:00Z") == NOW
    assert c.parse_time("yesterday") is None
    assert c.parse_time(None) is None


# --- both sources ----------------------------------------------------------------------------------


def driver_hang_view() -> c.ConditionView:
    return c.condition_view(node(cond(c.GPU_DRIVER_RESPONSIVE, "False", "NvidiaSmiTimeout")),
                            c.ConditionsPolicy(), NOW)


def test_exporter_down_but_driver_hung_is_actionable_not_unknown() -> None:
    verdict = c.merge_node([], False, "exporter unreachable", driver_hang_view())
    assert verdict.unknown == ""
    assert [f.action for f in verdict.findings] == [ACTION_REBOOT]
    assert not verdict.metrics_known


def test_exporter_down_and_agent_healthy_stays_unknown() -> None:
    healthy = c.condition_view(node(cond(c.GPU_HEALTHY, "True", "NoGPUFault")), c.ConditionsPolicy(), NOW)
    verdict = c.merge_node([], False, "exporter unreachable", healthy)
    assert verdict.unknown == "exporter unreachable"
    assert verdict.findings == ()


def test_unknown_metrics_findings_are_not_used() -> None:
    verdict = c.merge_node([metric_finding()], False, "stale", None)
    assert verdict.findings == () and verdict.unknown == "stale"


def test_the_worst_finding_of_both_sources_comes_first() -> None:
    verdict = c.merge_node([metric_finding(ACTION_RESET_GPU)], True, "", driver_hang_view())
    assert [f.action for f in verdict.findings] == [ACTION_REBOOT, ACTION_RESET_GPU]
    cordon_only = c.merge_node([metric_finding(ACTION_QUARANTINE)], True, "", driver_hang_view())
    assert cordon_only.findings[0].action == ACTION_QUARANTINE


def test_the_same_finding_twice_is_kept_once() -> None:
    verdict = c.merge_node([metric_finding(), metric_finding()], True, "", None)
    assert len(verdict.findings) == 1


def test_merge_fleet_treats_a_node_missing_from_the_metrics_as_unknown_to_them() -> None:
    healthy = c.condition_view(node(cond(c.GPU_HEALTHY, "True"), name="b"), c.ConditionsPolicy(), NOW)
    hung = c.condition_view(node(cond(c.GPU_DRIVER_RESPONSIVE, "False"), name="c"), c.ConditionsPolicy(), NOW)
    verdicts = c.merge_fleet({"a": [metric_finding(node_name="a")]}, {"d": "exporter down"},
                             {"b": healthy, "c": hung})
    assert sorted(verdicts) == ["a", "b", "c", "d"]
    assert verdicts["a"].metrics_known and verdicts["a"].findings[0].node == "a"
    assert verdicts["b"].unknown and not verdicts["b"].metrics_known
    assert verdicts["c"].unknown == "" and verdicts["c"].findings[0].action == ACTION_REBOOT
    assert verdicts["d"].unknown == "exporter down"


def test_a_finding_names_the_gpus_the_agents_message_names_by_uuid() -> None:
    message = ("GPU GPU-81d866e6-cfe1-3385-cd90-d92fc9604041 reported 1 time(s) recently: XID 48; "
               "GPU GPU-0aa1b2c3-0000-1111-2222-333344445555 reported 2 time(s) recently: XID 48")
    view = c.condition_view(node(cond(c.GPU_HEALTHY, "False", "NeedsResetGpu", message)), c.ConditionsPolicy(), NOW)
    (finding,) = view.findings
    assert finding.gpus == ("GPU-0aa1b2c3-0000-1111-2222-333344445555", "GPU-81d866e6-cfe1-3385-cd90-d92fc9604041")


def test_a_condition_naming_no_gpu_is_node_wide() -> None:
    view = c.condition_view(node(cond(c.GPU_DRIVER_RESPONSIVE, "False", "NvidiaSmiTimeout", "nvidia-smi hung")),
                            c.ConditionsPolicy(), NOW)
    assert [f.gpus for f in view.findings] == [()]


def test_a_node_wide_reset_says_every_gpu_is_reset() -> None:
    policy = policy_from('[[conditions.rules]]\ntype = "GpuFault"\nstatus = "True"\naction = "reset-gpu"\n')
    (finding,) = c.condition_view(node(cond("GpuFault", "True", "Bad", "the GPU is bad")), policy, NOW).findings
    assert finding.gpus == () and finding.message.endswith("every GPU of the node is reset)")
