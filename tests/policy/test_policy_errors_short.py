"""A policy error names the key and repeats a cut excerpt of a long bad value, never the whole of it (issue 22
item 7: about 50 errors repeated a 10-20 KB value in full). Every scalar setting of the schema is tried, and the
keys whose values have parsers of their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuremediate.policy.config import PolicyError, load_policy, loads_policy
from gpuremediate.vocab.schema import EXCERPT_CHARS
from tests.policy.test_policy_fuzz import LEAVES, _document

BIG = 20_000
MAX_MESSAGE = 400  # the key path, what is wanted (a list of the allowed values at most), a cut excerpt

BAD_VALUES = {
    "word": "x" * BIG,
    "selector": "a in (" + "b," * (BIG // 2),
    "words": " ".join(["w"] * (BIG // 2)),
    "non-ascii": "\u00e9" * BIG,
    "quote": "'" + "x" * BIG,
}


def _error(text: str) -> str | None:
    try:
        loads_policy(text, "policy.toml")
    except PolicyError as error:
        return str(error)
    return None


def _assert_short(message: str, key: str, value: str) -> None:
    assert len(message) <= MAX_MESSAGE, f"{len(message)} characters: {message[:200]}…"
    assert message.startswith(key), message[:200]
    assert value[: EXCERPT_CHARS * 2] not in message  # at most an excerpt of it
    if "bytes)" in message:  # the excerpt says how much it left out
        assert f"({len(value.encode())} bytes)" in message, message


@pytest.mark.parametrize("kind", sorted(BAD_VALUES))
def test_every_setting_names_its_key_and_cuts_a_long_bad_value(kind: str) -> None:
    value = BAD_VALUES[kind]
    refused = 0
    for path, _hint in LEAVES:
        message = _error(_document({path: value}))
        if message is not None:
            refused += 1
            _assert_short(message, ".".join(path), value)
    assert refused >= 50  # most settings want a number, a flag, a name or a choice


@pytest.mark.parametrize(("document", "key"), [
    ('[[groups]]\nselector = {v}\n', "groups[0].selector"),
    ('[[groups]]\nselector = "pool=" {v}\n', "groups[0].selector"),
    ('[[groups]]\nname = "g"\nselector = "a=b"\n[groups.thermal]\nhold_s = {v}\n', "groups[0].thermal.hold_s"),
    ('[xid.overrides]\n"79" = {v}\n', "xid.overrides"),
    ('[budget]\nmax_unavailable = {v}\n', "budget.max_unavailable"),
    ('[[budget.domains]]\nlabel = {v}\n', "budget.domains[0].label"),
    ('[gates]\nprometheus_url = {v}\n', "gates.prometheus_url"),
    ('[drain.namespace_modes]\nbatch = {v}\n', "drain.namespace_modes.batch"),
    ('[remediation.ladders]\n"reset-gpu" = [{action = {v}}]\n', "remediation.ladders"),
    ('[actions.fix]\napiGroup = "g.io"\nkind = "Fix"\nnamespace = {v}\n', "actions.fix.namespace"),
    ('[gpu_operator]\noperands = [{v}]\n', "gpu_operator.operands"),
    ('[gpu_resources]\nnames = [{v}]\n', "gpu_resources.names"),
    ('[[conditions.rules]]\ntype = "GpuDriverHung"\nstatus = {v}\n', "conditions.rules[0].status"),
    ('[taint]\nenabled = true\neffect = {v}\n', "taint.effect"),
])
def test_keys_with_their_own_parsers_name_the_key_and_cut_a_long_bad_value(document: str, key: str) -> None:
    value = "X" * BIG  # no action name, namespace, URL, label key or value, resource name, mode or status
    if '"pool=" {v}' in document:  # a selector whose label value is the long part
        text = document.replace('"pool=" {v}', json.dumps("pool=" + value))
    else:
        text = document.replace("{v}", json.dumps(value))
    message = _error(text)
    assert message is not None, text[:200]
    _assert_short(message, key, value)


def test_a_long_unknown_key_is_named_by_a_cut_excerpt() -> None:
    key = "k" * BIG
    message = _error(f"[thermal]\n{key} = 1\n")
    assert message is not None and len(message) <= MAX_MESSAGE and message.startswith("thermal.kkk"), message[:200]
    assert "unknown key" in message and f"({BIG} bytes)" in message


@pytest.mark.parametrize(("document", "start"), [
    ("{k} = 1\n", "kkk"),  # a top-level key (issue 41: the earlier fix cut only keys inside a section)
    ('[drain.namespace_modes]\n{k} = "Immediate"\n', "drain.namespace_modes.kkk"),  # a namespace of the file's own
])
def test_a_long_key_of_the_file_is_named_by_a_cut_excerpt(document: str, start: str) -> None:
    message = _error(document.replace("{k}", "k" * BIG))
    assert message is not None and len(message) <= MAX_MESSAGE and message.startswith(start), message[:200]
    assert f"({BIG} bytes)" in message


def test_an_undefined_custom_action_is_named_by_a_cut_excerpt(tmp_path: Path) -> None:
    """The check that every custom action named is defined (``load_policy``) named it twice, once in full."""
    name = "a" * BIG
    path = tmp_path / "policy.toml"
    path.write_text(f'[xid.overrides]\n"79" = "{name}"\n', encoding="utf-8")
    with pytest.raises(PolicyError) as raised:
        load_policy(path)
    message = str(raised.value)
    assert len(message) <= MAX_MESSAGE and message.startswith("xid.overrides.79"), message[:200]
    assert "is not defined" in message and f"({BIG} bytes)" in message
