"""Fuzz the policy file: a clear error (one line starting with the key path) or a policy that is harmless
(every number finite and bounded, every Job command splittable, every name Kubernetes accepts) — never a
traceback. Documents are built from the schema itself, so a new setting is fuzzed without a test change."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuremediate.policy.config import ClusterSettings, Policy, PolicyError, PolicyFile, load_policy, loads_policy
from gpuremediate.policy.workflow import JobPolicy
from gpuremediate.vocab.schema import MAX_DURATION_S

FUZZ = settings(max_examples=400, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _leaves(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, type) of every scalar setting of a section, walking nested sections."""
    hints = get_type_hints(cls)
    for spec in fields(cls):
        hint = hints[spec.name]
        if is_dataclass(hint):
            yield from _leaves(hint, (*prefix, spec.name))  # type: ignore[arg-type]
        elif "parse" not in spec.metadata:
            yield (*prefix, spec.name), hint


LEAVES = sorted(set(_leaves(Policy)) | set(_leaves(ClusterSettings)), key=lambda leaf: leaf[0])

SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 100, 101, 200, 2**53 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1e300, -1e300, 0.05, 99.9, 1e10]),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["", " ", "Immediate", "quarantine", "reset-gpu", "a in (", "dcgmi diag -r 'oops", "Bad_Name",
                     "gpuremediate-job", "x" * 300, "25%", "101%", "2", "-1", "busybox:1.36", "a b"]),
)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a JSON string is a TOML basic string


def _document(settings_: dict[tuple[str, ...], Any]) -> str:
    tables: dict[tuple[str, ...], list[str]] = {}
    for path, value in settings_.items():
        tables.setdefault(path[:-1], []).append(f"{json.dumps(path[-1])} = {_toml_value(value)}")
    out = list(tables.pop((), []))
    for table, lines in sorted(tables.items()):
        out.append("[" + ".".join(table) + "]")
        out += lines
    return "\n".join(out) + "\n"


TYPED: dict[Any, st.SearchStrategy[Any]] = {
    float: st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1e300, 0.05, 99.9, 1e10]),
                     st.integers(min_value=-(2**60), max_value=2**60)),
    int: st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, -1, 100, 101, 2**53 + 1])),
    bool: st.booleans(),
    str: st.one_of(st.text(max_size=12), st.sampled_from([
        "", " ", "Immediate", "quarantine", "reset-gpu", "none", "a in (", "dcgmi diag -r 'oops", "Bad_Name",
        "gpuremediate-job", "x" * 300, "25%", "101%", "2", "-1", "busybox:1.36", "a b", "ns", "a.b.c", "True"])),
}


def _value_for(hint: Any) -> st.SearchStrategy[Any]:
    """Mostly the setting's own type (so documents get past type checks and reach the value checks)."""
    typed = TYPED.get(hint)
    return SCALARS if typed is None else st.one_of(*[typed] * 9, SCALARS)


documents = st.lists(st.sampled_from(LEAVES), min_size=1, max_size=3, unique_by=lambda leaf: leaf[0]).flatmap(
    lambda leaves: st.fixed_dictionaries({path: _value_for(hint) for path, hint in leaves})).map(_document)


def _numbers(obj: Any, path: str = "") -> Iterator[tuple[str, float]]:
    for spec in fields(obj):
        value = getattr(obj, spec.name)
        here = f"{path}.{spec.name}" if path else spec.name
        if is_dataclass(value):
            yield from _numbers(value, here)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield here, float(value)


def _jobs(obj: Any) -> Iterator[JobPolicy]:
    for spec in fields(obj):
        value = getattr(obj, spec.name)
        if isinstance(value, JobPolicy):
            yield value
        elif is_dataclass(value):
            yield from _jobs(value)


def _assert_harmless(policy_file: PolicyFile) -> None:
    for section in (policy_file.defaults, policy_file.cluster, *(g.policy for g in policy_file.groups)):
        for path, number in _numbers(section):
            assert math.isfinite(number) and abs(number) <= 2**53, f"{path} accepted as {number}"
            if path.endswith("_s") or path.endswith("timeout"):
                assert number <= MAX_DURATION_S, f"{path} accepted as {number}"
        for job in _jobs(section):
            assert shlex.split(job.command), job.command
            assert job.image.strip() and not any(c.isspace() for c in job.image), job.image
    breaker = policy_file.cluster.breaker
    assert 0 <= breaker.threshold_percent <= 100


def _assert_clear(error: PolicyError, source: str) -> None:
    text = str(error)
    assert "\n" not in text.strip() or text.startswith(f"{source}: not valid TOML"), text
    assert text and not text.startswith(" "), text


@FUZZ
@given(text=documents)
def test_fuzzed_policy_files_are_a_clear_error_or_harmless(text: str) -> None:
    try:
        policy_file = loads_policy(text, "policy.toml")
    except PolicyError as error:
        _assert_clear(error, "policy.toml")
        head = str(error).split(":", 1)[0]
        assert head == "policy.toml" or head.split(".")[0].split("[")[0] in {s.name for s in fields(Policy)} | {
            s.name for s in fields(ClusterSettings)} | {"groups"}, str(error)
        return
    _assert_harmless(policy_file)


@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=100).map(lambda b: b.decode("latin-1")))
def test_arbitrary_text_is_a_clear_error_or_a_policy(text: str) -> None:
    try:
        policy_file = loads_policy(text, "policy.toml")
    except PolicyError as error:
        _assert_clear(error, "policy.toml")
        return
    _assert_harmless(policy_file)


def test_a_policy_file_on_disk_that_is_binary_or_nested_is_a_clear_error(tmp_path: Path) -> None:
    binary, nested = tmp_path / "binary.toml", tmp_path / "nested.toml"
    binary.write_bytes(bytes(range(256)))
    nested.write_text("a = " + "{b = " * 2000 + "1" + "}" * 2000 + "\n")
    for path in (binary, nested):
        try:
            load_policy(path)
        except PolicyError as error:
            assert str(error).startswith(str(path)), error
        else:
            raise AssertionError(f"{path} accepted")
