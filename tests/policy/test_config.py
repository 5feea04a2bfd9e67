"""The policy file: defaults, overrides, groups, and errors that name the key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuremediate.policy.config import (
    Policy,
    PolicyError,
    default_policy,
    load_policy,
    loads_policy,
)
from gpuremediate.policy.xid import XidOverride

FULL = """
[xid]
unknown_action = "reboot"
overrides = { "79" = "reset-gpu", "13" = { action = "my-fix", reason = "ours." } }

[ecc]
dbe_min = 2
dbe_action = "reboot"

[row_remap]
pending_urgent = true
uncorrectable_rows_min = 0

[thermal]
gpu_cordon_c = 88.5
gpu_clear_c = 78
hold_s = 30

[[groups]]
name = "h100-prod"
selector = "pool=h100,tier in (prod)"
thermal.gpu_cordon_c = 85
xid.overrides = { "48" = "reboot", "79" = "quarantine" }

[[groups]]
selector = "pool=h100"
ecc.enabled = false
"""


def test_defaults() -> None:
    policy = default_policy().for_node({"any": "label"})
    assert policy == Policy()
    assert (policy.thermal.gpu_cordon_c, policy.thermal.gpu_clear_c) == (90.0, 80.0)
    assert (policy.thermal.memory_cordon_c, policy.thermal.memory_clear_c) == (95.0, 85.0)
    assert (policy.thermal.hold_s, policy.thermal.clear_hold_s) == (60.0, 300.0)
    assert (policy.ecc.dbe_min, policy.ecc.dbe_action) == (1, "reset-gpu")
    assert policy.row_remap.failure_action == "quarantine"
    assert (policy.row_remap.pending_action, policy.row_remap.pending_urgent) == ("reset-gpu", False)
    assert policy.row_remap.uncorrectable_rows_min == 8
    assert (policy.xid.unknown_action, dict(policy.xid.overrides)) == ("quarantine", {})
    assert loads_policy("").defaults == Policy()


def test_top_level_values_apply_to_every_node() -> None:
    policy = loads_policy(FULL).for_node({"pool": "a100"})
    assert policy.thermal.gpu_cordon_c == 88.5 and policy.thermal.gpu_clear_c == 78.0 and policy.thermal.hold_s == 30
    assert policy.thermal.memory_cordon_c == 95.0  # untouched keys keep their defaults
    assert (policy.ecc.dbe_min, policy.ecc.dbe_action, policy.ecc.enabled) == (2, "reboot", True)
    assert policy.row_remap.pending_urgent is True and policy.row_remap.uncorrectable_rows_min == 0
    assert policy.xid.unknown_action == "reboot"
    assert dict(policy.xid.overrides) == {13: XidOverride("my-fix", "ours."), 79: XidOverride("reset-gpu")}


def test_first_matching_group_wins_and_inherits_the_top_level() -> None:
    policy_file = loads_policy(FULL)
    prod = policy_file.for_node({"pool": "h100", "tier": "prod"})
    assert policy_file.group_for({"pool": "h100", "tier": "prod"}).name == "h100-prod"  # type: ignore[union-attr]
    assert prod.thermal.gpu_cordon_c == 85.0 and prod.thermal.hold_s == 30  # group key + inherited key
    assert prod.ecc.enabled is True  # the second group also matches, but the first wins
    assert {code: o.action for code, o in prod.xid.overrides.items()} == {13: "my-fix", 48: "reboot", 79: "quarantine"}
    dev = policy_file.for_node({"pool": "h100", "tier": "dev"})
    assert policy_file.group_for({"pool": "h100"}).name == "groups[1]"  # type: ignore[union-attr]
    assert dev.ecc.enabled is False and dev.thermal.gpu_cordon_c == 88.5
    assert policy_file.for_node({}) == policy_file.defaults


def test_load_policy_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    # load_policy also checks that every custom action named is defined (issue 5)
    path.write_text(FULL + '\n[actions.my-fix]\napiGroup = "x.example.com"\nkind = "Fix"\n', encoding="utf-8")
    loaded = load_policy(path)
    assert loaded.source == str(path) and len(loaded.groups) == 2
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        load_policy(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[[groups]]\nselector = \"a=b\"\n[groups.thermal]\ngpu_cordon_c = \"hot\"",
         'groups[0].thermal.gpu_cordon_c: expected a number, got "hot"'),
        ("[[groups]]\nselector = \"a=b\"\n[[groups]]\nselector = \"c=d\"\nthermal.gpu_cordon_c = \"hot\"",
         'groups[1].thermal.gpu_cordon_c: expected a number, got "hot"'),
        ("colour = 1", "colour: unknown key"),
        ("[thermal]\ngpu_cordon = 1", "thermal.gpu_cordon: unknown key"),
        ("[[groups]]\nselector = \"a=b\"\nbogus = 1", "groups[0].bogus: unknown key"),
        ("[[groups]]\nselector = \"a=b\"\n[groups.ecc]\nnope = true", "groups[0].ecc.nope: unknown key"),
        ("thermal = 3", "thermal: expected a table, got 3"),
        ("[thermal]\nhold_s = true", "thermal.hold_s: expected a number, got true"),
        ("[thermal]\nhold_s = -1", "thermal.hold_s: must be between 0 and 3.16224e+07, got -1"),
        ("[breaker]\nthreshold_percent = 200", "breaker.threshold_percent: must be between 0 and 100, got 200"),
        ("[drain]\ntimeout_s = 1e300", "drain.timeout_s: must be between 1 and 3.16224e+07, got 1e+300"),
        ("[remediation.reboot]\ntimeout_s = 1e300", "remediation.reboot.timeout_s: must be between 1 and"),
        ("[validation.job]\nimage = \"\"", 'validation.job.image: expected a container image reference, got ""'),
        ("[validation.job]\nimage = \"a b\"", "validation.job.image: expected a container image reference"),
        ("[remediation.reset_gpu]\nservice_account = \"Bad_SA\"",
         'remediation.reset_gpu.service_account: expected a DNS subdomain'),
        ("[customDrain]\nnamespace = \"Not.DNS\"", 'customDrain.namespace: expected a DNS label'),
        ("[actions.fix]\napiGroup = \"x.io\"\nkind = \"Fix\"\nnamespace = \"" + "a" * 64 + "\"",
         "actions.fix.namespace: a Namespaced action needs a namespace name"),
        ("[validation.job]\ncommand = \"dcgmi diag -r 'oops\"",
         "validation.job.command: cannot split \"dcgmi diag -r 'oops\" like a shell: No closing quotation"),
        ("[validation.job]\ncommand = \"   \"", "validation.job.command: must not be empty"),
        ("[drain]\ngrace_period_s = 100000000000", "drain.grace_period_s: must be between -1 and"),
        ("[ecc]\ndbe_min = 100000000000000000000", "ecc.dbe_min: out of range"),
        ("[remediation]\nmax_attempts = 1000000", "remediation.max_attempts: must be between 1 and 100"),
        ("x = " + "[" * 2000 + "]" * 2000, "<string>: nested too deeply"),
        ("[thermal]\nhold_s = inf", "thermal.hold_s: expected a number, got inf"),
        ("[thermal]\ngpu_clear_c = 90", "thermal: gpu_clear_c (90) must be below gpu_cordon_c (90)"),
        ("[thermal]\nmemory_cordon_c = 80", "thermal: memory_clear_c (85) must be below memory_cordon_c (80)"),
        ("[ecc]\ndbe_min = 1.5", "ecc.dbe_min: expected an integer, got 1.5"),
        ("[ecc]\ndbe_min = 0", "ecc.dbe_min: must be at least 1, got 0"),
        ("[ecc]\nenabled = \"yes\"", 'ecc.enabled: expected true or false, got "yes"'),
        ("[ecc]\ndbe_action = \"Reset_GPU\"", 'ecc.dbe_action: expected a built-in action'),
        ("[row_remap]\nfailure_action = 3", "row_remap.failure_action: expected a string, got 3"),
        ("[row_remap]\nuncorrectable_rows_min = -1", "row_remap.uncorrectable_rows_min: must be at least 0"),
        ("[xid]\noverrides = 3", "xid.overrides: expected a table of XID number = action, got 3"),
        ("[xid.overrides]\nabc = \"reboot\"", 'xid.overrides.abc: an XID override\'s key must be a positive XID'),
        ("[xid.overrides]\n0 = \"reboot\"", "xid.overrides.0: an XID override's key must be a positive XID"),
        ("[xid.overrides]\n79 = \"re boot\"", 'xid.overrides.79: expected a built-in action'),
        ("[xid.overrides]\n79 = [1]", "xid.overrides.79: expected an action name or a table"),
        ("[xid.overrides.79]\nreason = \"x\"", "xid.overrides.79.action: required"),
        ("[xid.overrides.79]\naction = \"none\"\nwhy = 1", "xid.overrides.79.why: unknown key"),
        ("[xid.overrides.79]\naction = \"none\"\nreason = 1", "xid.overrides.79.reason: expected a string, got 1"),
        ("groups = 1", "groups: expected an array of tables"),
        ("groups = [1]", "groups[0]: expected a table"),
        ("[[groups]]\nname = \"x\"", "groups[0].selector: expected a label selector string, got nothing"),
        ("[[groups]]\nselector = 5", "groups[0].selector: expected a label selector string, got 5"),
        ("[[groups]]\nselector = \"a in (b\"", "groups[0].selector: unbalanced"),
        ("[[groups]]\nselector = \"a=b\"\nname = 3", "groups[0].name: expected a string, got 3"),
        ("[[groups]]\nselector = \"a=b\"\nthermal.gpu_cordon_c = 70",
         "groups[0].thermal: gpu_clear_c (80) must be below gpu_cordon_c (70)"),
        ("[thermal\n", "<string>: not valid TOML"),
    ],
)
def test_errors_name_the_key_path(text: str, error: str) -> None:
    with pytest.raises(PolicyError) as caught:
        loads_policy(text)
    assert str(caught.value).startswith(error), str(caught.value)


def test_custom_actions_are_collected_for_the_actions_hook() -> None:
    text = FULL + '\n[[groups]]\nselector = "x=y"\nrow_remap.pending_action = "slow-fix"\n'
    policy_file = loads_policy(text)
    refs = policy_file.custom_action_refs()
    assert ("xid.overrides.13", "my-fix") in refs
    assert ("groups[2].row_remap.pending_action", "slow-fix") in refs
    assert all(name not in {"none", "reboot", "reset-gpu", "quarantine", "cordon"} for _, name in refs)
    policy_file.check_custom_actions({"my-fix", "slow-fix"})
    with pytest.raises(PolicyError, match=r'^groups\[2\]\.row_remap\.pending_action: custom action "slow-fix" is not'):
        policy_file.check_custom_actions({"my-fix"})


def test_a_mistyped_section_is_answered_with_the_close_names() -> None:
    with pytest.raises(PolicyError, match=r"^thermall: unknown key \(did you mean thermal\?\)$"):
        loads_policy("[thermall]\nhold_s = 1", "typo")
    with pytest.raises(PolicyError, match=r"^foo: unknown key \(known: actions, .*preflight.*\)$"):
        loads_policy("[foo]\nx = 1", "unknown")
