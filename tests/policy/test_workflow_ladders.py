"""[remediation.ladders] and [remediation.diagnostics]: parsing, validation errors naming the key path,
per-group overrides, and the default (no ladder) that behaves as before."""

from __future__ import annotations

import pytest

from gpuremediate.policy.config import load_policy, loads_policy
from gpuremediate.policy.workflow import DIAGNOSTICS_DIR, RemediationPolicy, Rung
from gpuremediate.vocab.schema import PolicyError

RMA = '[actions.rma]\napiGroup = "repair.example.com"\nkind = "RMA"\n'


def _ladders(body: str, extra: str = "") -> RemediationPolicy:
    return loads_policy(f"[remediation.ladders]\n{body}\n{extra}").defaults.remediation


def test_a_ladder_parses_with_attempts_and_timeouts() -> None:
    remediation = _ladders('reset-gpu = [{action = "reset-gpu", attempts = 2, timeout = "10m"}, '
                           '{action = "reboot", attempts = 1, timeout = 900}, {action = "rma"}, '
                           '{action = "quarantine"}]', RMA)
    assert remediation.ladder_for("reset-gpu") == (
        Rung("reset-gpu", 2, 600.0), Rung("reboot", 1, 900.0), Rung("rma"))


def test_without_a_ladder_the_action_is_its_own_only_rung() -> None:
    remediation = RemediationPolicy()
    assert remediation.ladder_for("reset-gpu") == (Rung("reset-gpu"),)
    assert remediation.ladder_for("rma") == (Rung("rma"),)
    assert _ladders('reboot = [{action = "reboot"}]').ladder_for("reset-gpu") == (Rung("reset-gpu"),)


@pytest.mark.parametrize(("body", "error"), [
    ('reset-gpu = []', 'remediation.ladders.reset-gpu: expected a non-empty array of rungs'),
    ('reset-gpu = "reboot"', 'remediation.ladders.reset-gpu: expected a non-empty array'),
    ('reset-gpu = [{action = "reboot"}]',
     'remediation.ladders.reset-gpu[0].action: the first rung is the recommended action itself'),
    ('reset-gpu = [{action = "reset-gpu"}, {action = "quarantine"}, {action = "reboot"}]',
     'remediation.ladders.reset-gpu[1].action: quarantine ends the ladder'),
    ('reset-gpu = [{action = "reset-gpu"}, {action = "quarantine", attempts = 2}]',
     'remediation.ladders.reset-gpu[1]: the quarantine rung takes no attempts'),
    ('reset-gpu = [{action = "reset-gpu"}, {action = "cordon"}]',
     'remediation.ladders.reset-gpu[1].action: "cordon" repairs nothing'),
    ('quarantine = [{action = "quarantine"}]', 'remediation.ladders.quarantine: a ladder is keyed by'),
    ('reset-gpu = [{action = "reset-gpu"}, {action = "reboot"}, {action = "reset-gpu"}]',
     'remediation.ladders.reset-gpu[2].action: "reset-gpu" is already rung 1'),
    ('reset-gpu = [{action = "reset-gpu", attempts = 0}]',
     'remediation.ladders.reset-gpu[0].attempts: must be between 1 and 100'),
    ('reset-gpu = [{action = "reset-gpu", attempts = "2"}]',
     'remediation.ladders.reset-gpu[0].attempts: expected an integer'),
    ('reset-gpu = [{action = "reset-gpu", timeout = "ten minutes"}]',
     'remediation.ladders.reset-gpu[0].timeout: expected seconds'),
    ('reset-gpu = [{action = "reset-gpu", timeout = 0}]',
     'remediation.ladders.reset-gpu[0].timeout: must be between 1'),
    ('reset-gpu = [{action = "reset-gpu", tries = 2}]', 'remediation.ladders.reset-gpu[0].tries: unknown key'),
    ('reset-gpu = [{attempts = 2}]', 'remediation.ladders.reset-gpu[0].action: required'),
    ('reset-gpu = [{action = "Reset GPU"}]', 'remediation.ladders.reset-gpu[0].action: expected a built-in'),
])
def test_bad_ladders_name_the_key_path(body: str, error: str) -> None:
    with pytest.raises(PolicyError) as raised:
        _ladders(body)
    assert str(raised.value).startswith(error), str(raised.value)


def test_a_rung_naming_an_undefined_custom_action_is_refused_at_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "policy.toml"
    path.write_text('[remediation.ladders]\nreset-gpu = [{action = "reset-gpu"}, {action = "rma"}]\n')
    with pytest.raises(PolicyError, match=r"remediation\.ladders\.reset-gpu\[1\]\.action: custom action \"rma\" "
                                          r"is not defined"):
        load_policy(path)
    path.write_text('[remediation.ladders]\nreset-gpu = [{action = "reset-gpu"}, {action = "rma"}]\n' + RMA)
    assert load_policy(path).defaults.remediation.ladder_for("reset-gpu")[1] == Rung("rma")


def test_a_group_overrides_a_ladder_and_keeps_the_others() -> None:
    policy = loads_policy(
        '[remediation.ladders]\nreset-gpu = [{action = "reset-gpu"}, {action = "reboot"}]\n'
        'rma = [{action = "rma"}, {action = "quarantine"}]\n' + RMA +
        '[[groups]]\nselector = "pool=a"\n[groups.remediation.ladders]\n'
        'reset-gpu = [{action = "reset-gpu", attempts = 3}]\n')
    group = policy.for_node({"pool": "a"}).remediation
    assert group.ladder_for("reset-gpu") == (Rung("reset-gpu", 3),)
    assert group.ladder_for("rma") == (Rung("rma"),)
    assert policy.for_node({}).remediation.ladder_for("reset-gpu") == (Rung("reset-gpu"), Rung("reboot"))
    with pytest.raises(PolicyError, match=r"^groups\[0\]\.remediation\.ladders\.reset-gpu\[0\]\.action"):
        loads_policy('[[groups]]\nselector = "pool=a"\n[groups.remediation.ladders]\n'
                     'reset-gpu = [{action = "reboot"}]\n')


def test_diagnostics_are_off_by_default_and_configurable() -> None:
    default = RemediationPolicy().diagnostics
    assert not default.enabled and default.output_dir == DIAGNOSTICS_DIR
    assert "nvidia-bug-report.sh --output-file $(DIAGNOSTICS_OUTPUT)" in default.job.command
    on = loads_policy('[remediation.diagnostics]\nenabled = true\noutput_dir = "/data/bug-reports"\n'
                      '[remediation.diagnostics.job]\ncommand = "collect.sh"\ntimeout_s = 60\n'
                      ).defaults.remediation.diagnostics
    assert on.enabled and on.output_dir == "/data/bug-reports" and on.job.command == "collect.sh"
    assert on.job.timeout_s == 60.0
    with pytest.raises(PolicyError, match=r"^remediation\.diagnostics\.output_dir: expected an absolute directory"):
        loads_policy('[remediation.diagnostics]\noutput_dir = "relative/dir"\n')
