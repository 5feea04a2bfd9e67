"""The shipped policy files: base = every default, generated from the schema; kind = loadable,
with Jobs that run gpu-sim's real CLI as its image runs it."""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import pytest
from manifests_support import MANIFESTS, ROOT

from gpuremediate.kube.miniyaml import load, load_all
from gpuremediate.policy import doc
from gpuremediate.policy.config import PolicyError, default_policy, loads_policy
from sim import gpusim

BASE = MANIFESTS / "base/policy.toml"
KIND = MANIFESTS / "overlays/kind/policy.toml"
REGENERATE = "python -m gpuremediate.policy.doc --toml > manifests/base/policy.toml"


def test_base_policy_is_the_generated_defaults() -> None:
    assert BASE.read_text(encoding="utf-8") == doc.policy_toml(), f"out of date with the schema; run: {REGENERATE}"


def test_the_policy_reference_page_is_the_generated_markdown() -> None:
    page = (ROOT / "docs/policy-reference.md").read_text(encoding="utf-8")
    assert page == doc.policy_markdown(), ("docs/policy-reference.md is out of date with the schema; run: "
                                           "python -m gpuremediate.policy.doc --markdown > docs/policy-reference.md")


def test_the_policy_reference_has_every_section_and_setting_of_the_policy_file() -> None:
    """The Markdown says what the TOML says: each [section] a heading, each setting a row with the same default."""
    toml_text, page = doc.policy_toml(), doc.policy_markdown()
    for table in re.findall(r"^\[([a-z_.A-Za-z]+)\]$", toml_text, re.MULTILINE):
        assert f"`[{table}]`" in page, table
    section = ""
    for line in toml_text.splitlines():
        header = re.match(r"^\[([A-Za-z_.]+)\]$", line)
        section = header.group(1) if header else section
        setting = re.match(r"^([A-Za-z_]+) = (.*)$", line)
        if setting:
            assert f"| `{setting.group(1)}` | `{setting.group(2).replace('|', chr(92) + '|')}` |" in page, \
                f"[{section}] {setting.group(1)}"


def test_generated_policy_loads_to_exactly_the_built_in_defaults() -> None:
    loaded = loads_policy(doc.policy_toml(), "policy.toml")
    builtin = default_policy()
    assert (loaded.defaults, loaded.cluster, loaded.groups) == (builtin.defaults, builtin.cluster, builtin.groups)


def test_every_setting_is_written_with_its_doc_above_it() -> None:
    lines = doc.policy_toml().splitlines()
    settings = [i for i, line in enumerate(lines) if re.match(r"[a-z_]+ = ", line)]
    assert len(settings) >= 40
    for i in settings:
        assert lines[i - 1].startswith("# ") and len(lines[i - 1]) > 4, f"no comment above {lines[i]!r}"
    tables = set(re.findall(r"^\[([a-z_.]+)\]$", doc.policy_toml(), re.MULTILINE))
    assert {"xid", "drain", "remediation.reset_gpu", "validation.job", "budget", "breaker"} <= tables


def test_groups_example_loads_when_uncommented() -> None:
    text = doc.policy_toml()
    example = text[text.index("# [[groups]]"):]
    uncommented = "\n".join(line[2:] for line in example.splitlines() if line.startswith("# "))
    policy = loads_policy(text + "\n" + uncommented)
    (group,) = policy.groups
    assert group.policy.thermal.gpu_cordon_c == 87.0 and group.policy.drain.mode == "AllowCompletion"
    assert group.policy.drain.scope == policy.defaults.drain.scope  # keys a group does not name keep the defaults


def test_toml_values_refuse_what_toml_cannot_hold() -> None:
    assert doc.toml_value(["a", 1, 2.5, True], "k") == '["a", 1, 2.5, true]'
    assert tomllib.loads("k = " + doc.toml_value('quote " and \\ back', "k"))["k"] == 'quote " and \\ back'
    with pytest.raises(doc.DocError, match="k: cannot write the non-finite"):
        doc.toml_value(float("inf"), "k")
    with pytest.raises(doc.DocError, match="k: no TOML form"):
        doc.toml_value({1, 2}, "k")


def test_doc_command_prints_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert doc.main(["--toml"]) == 0
    assert capsys.readouterr().out == doc.policy_toml()


# -- kind -------------------------------------------------------------------------------------------


def _gpusim_entrypoint() -> list[str]:
    """The gpu-sim image's ENTRYPOINT (sim/Dockerfile): how a Job's command must start."""
    text = (ROOT / "sim/Dockerfile").read_text(encoding="utf-8")
    match = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    assert match, "sim/Dockerfile has no exec-form ENTRYPOINT"
    entry: list[str] = json.loads(match.group(1))
    return entry


def test_kind_policy_loads_and_changes_what_kind_needs() -> None:
    policy = loads_policy(KIND.read_text(encoding="utf-8"), str(KIND))
    remediation = policy.defaults.remediation
    assert remediation.reboot_wait_for_boot_id is False  # a kind node never gets a new bootID
    for job in (remediation.reset_gpu, remediation.reboot, policy.defaults.validation.job):
        assert job.image == "gpu-sim:dev" and job.privileged is False and job.host_pid is False
    assert policy.cluster.budget.as_budget_value() == 1


@pytest.mark.parametrize("job,verb", [("reset_gpu", "reset"), ("reboot", "reboot"), ("validation", "validate")])
def test_kind_jobs_run_gpu_sims_real_cli(job: str, verb: str) -> None:
    policy = loads_policy(KIND.read_text(encoding="utf-8")).defaults
    spec = policy.validation.job if job == "validation" else getattr(policy.remediation, job)
    argv = shlex.split(spec.command)
    entry = _gpusim_entrypoint()
    assert argv[:len(entry)] == entry, f"{job}: must run {entry} as the gpu-sim image does"
    expanded = [a.replace("$(NODE_NAME)", "gpu-node-1").replace("$(GPU_IDS)", "0,3") for a in argv[len(entry):]]
    args = gpusim.build_parser().parse_args(expanded)
    assert args.command == verb and args.node == "gpu-node-1"
    assert args.url == "http://gpu-sim.gpu-operator.svc:9400"
    if verb == "reset":
        assert args.gpu_list == "0,3"


def test_kind_service_sends_each_job_to_its_own_nodes_gpu_sim() -> None:
    docs = load_all((MANIFESTS / "overlays/kind/gpu-sim.yaml").read_text(encoding="utf-8"))
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert service["metadata"]["name"] == "gpu-sim" and service["metadata"]["namespace"] == "gpu-operator"
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["ports"][0]["port"] == 9400


def test_kind_overlay_replaces_the_policy_through_the_generator() -> None:
    base = load((MANIFESTS / "base/kustomization.yaml").read_text(encoding="utf-8"))
    kind = load((MANIFESTS / "overlays/kind/kustomization.yaml").read_text(encoding="utf-8"))
    (ours,) = base["configMapGenerator"]
    (theirs,) = kind["configMapGenerator"]
    assert (ours["name"], ours["files"]) == ("gpuremediate-policy", ["policy.toml"])
    assert (theirs["name"], theirs["behavior"], theirs["files"]) == ("gpuremediate-policy", "replace", ["policy.toml"])
    for generator in (ours, theirs):  # a stable name: people and the e2e harness patch it by name
        assert generator["options"]["disableNameSuffixHash"] is True


def test_a_bad_policy_names_the_key() -> None:
    with pytest.raises(PolicyError, match=r"remediation.reboot_wait_for_boot_id: expected true or false"):
        loads_policy("[remediation]\nreboot_wait_for_boot_id = 1\n")


def test_the_e2e_kind_target_runs_the_same_jobs_as_the_kind_overlay() -> None:
    from e2e import harness

    policy = loads_policy(KIND.read_text(encoding="utf-8")).defaults
    sections = harness.KubeconfigCluster._job_sections(None)  # type: ignore[arg-type]
    assert sections["remediation.reset_gpu"]["command"] == policy.remediation.reset_gpu.command
    assert sections["remediation.reboot"]["command"] == policy.remediation.reboot.command
    assert sections["validation.job"]["command"] == policy.validation.job.command
