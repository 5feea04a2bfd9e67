"""The chart's policy values and schema are generated from the policy schema (gpuremediate.policy.helm), hold
every key of manifests/base/policy.toml at its default, and the values file is what the generator writes."""

from __future__ import annotations

import json
import tomllib
from typing import Any

from chart_support import CHART, MANIFESTS

from gpuremediate.kube.miniyaml import load
from gpuremediate.policy import helm
from gpuremediate.policy.config import parse_policy

REGENERATE = "regenerate: python -m gpuremediate.policy.helm --write charts/gpuremediate"


def leaves(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, dict) and v:
            out |= leaves(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def chart_values() -> dict[str, Any]:
    values = load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert isinstance(values, dict)
    return values


def test_values_yaml_holds_the_generated_policy_block() -> None:
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    assert helm.replace_block(text) == text, REGENERATE


def test_values_schema_holds_the_generated_policy_schema() -> None:
    text = (CHART / "values.schema.json").read_text(encoding="utf-8")
    assert helm.schema_text(json.loads(text)) == text, REGENERATE


def test_every_key_of_policy_toml_is_a_value_at_its_default() -> None:
    shipped = leaves(tomllib.loads((MANIFESTS / "base" / "policy.toml").read_text(encoding="utf-8")))
    values = leaves(chart_values()["policy"])
    for key, default in shipped.items():
        assert key in values, f"policy.{key} is in policy.toml but not in the chart's values"
        assert values[key] == default, key
    # The rest: tables and arrays empty by default (policy.toml shows them commented out).
    assert all(values[k] in ({}, [], None) for k in set(values) - set(shipped)), set(values) - set(shipped)
    assert parse_policy(chart_values()["policy"], "values.yaml").defaults == parse_policy({}, "x").defaults


def test_every_value_key_has_a_schema_entry_and_no_other_is_allowed() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        assert node.get("additionalProperties") is False, f"{path}: unknown keys must be refused"
        for k, v in values.items():
            assert k in node["properties"], f"{path}.{k} has no schema"
            child = node["properties"][k]
            if isinstance(v, dict) and "properties" in child:
                walk(v, child, f"{path}.{k}")

    walk(chart_values()["policy"], schema["properties"]["policy"], "policy")
    top = {k for k in chart_values()}
    assert top <= set(schema["properties"]), top - set(schema["properties"])
