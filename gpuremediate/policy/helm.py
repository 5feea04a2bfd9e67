"""The Helm chart's ``policy`` values and their JSON schema, generated from the policy schema itself.

charts/gpuremediate/values.yaml holds every key of manifests/base/policy.toml under ``policy:`` (the same
sections, the same defaults), and values.schema.json the rules of each key (type, bounds, allowed values,
no unknown key), so that ``helm install --set policy.drain.mode=Fast`` is refused by Helm, naming the key,
before anything reaches the cluster. Both come from the dataclasses in ``policy.config`` / ``policy.workflow``,
as policy.toml does (``policy.doc``); a test compares the chart's files with this output:

    python -m gpuremediate.policy.helm --write charts/gpuremediate

The chart renders the values back into policy.toml (templates/_policy.tpl); the controller still checks the
file as it checks any policy file (what a schema cannot say: a clear threshold above its cordon threshold...).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import Field, fields, is_dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from gpuremediate.policy.config import ClusterSettings, Policy
from gpuremediate.vocab.schema import check_action, dns_label, dns_subdomain, image_reference

BEGIN = "# --- BEGIN generated policy values (python -m gpuremediate.policy.helm --write charts/gpuremediate) ---"
END = "# --- END generated policy values ---"
SCHEMA_KEY = "policy"  # values.schema.json: properties.policy is generated, the rest written by hand

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _is_table(value: Any) -> bool:
    return is_dataclass(value) and not isinstance(value, type)


def _doc(spec: Field[Any]) -> str:
    return " ".join(str(spec.metadata.get("doc", "")).split())


def _closure(check: Any) -> dict[str, Any]:
    names = getattr(getattr(check, "__code__", None), "co_freevars", ())
    cells = getattr(check, "__closure__", None) or ()
    return {name: cell.cell_contents for name, cell in zip(names, cells, strict=False)}


def _check_rules(check: Any) -> dict[str, Any]:
    """What a setting's ``check`` says, as JSON schema keywords (checks it cannot say are left to the controller)."""
    if check is None:
        return {}
    if check is check_action:
        return {"pattern": "^[a-z0-9-]+$"}
    if check is dns_label:
        return {"pattern": DNS_LABEL_PATTERN, "maxLength": 63}
    if check is dns_subdomain:
        return {"pattern": DNS_SUBDOMAIN_PATTERN, "maxLength": 253}
    if check is image_reference:
        return {"pattern": r"^[^\s]+$"}
    qualname = getattr(check, "__qualname__", "")
    bound = _closure(check)
    if qualname.startswith("between.") and {"minimum", "maximum"} <= bound.keys():
        return {"minimum": bound["minimum"], "maximum": bound["maximum"]}
    if qualname.startswith("at_least.") and "minimum" in bound:
        return {"minimum": bound["minimum"]}
    if qualname.startswith("one_of.") and "allowed" in bound:
        return {"enum": list(bound["allowed"])}
    if qualname.endswith("_not_empty") or qualname.endswith("_any_text"):
        return {"minLength": 1, "pattern": r"\S"}
    return {}


def _scalar_type(hint: Any) -> tuple[list[str], bool]:
    """JSON types of a hint and whether None is allowed."""
    nullable = False
    if get_origin(hint) in (Union, UnionType):
        args = get_args(hint)
        nullable = NoneType in args
        hint = next((a for a in args if a is not NoneType), str)
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if hint in names:
        return [names[hint]], nullable
    return [], nullable


def _values_of(section: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in fields(section):
        value = getattr(section, spec.name)
        if _is_table(value):
            out[spec.name] = _values_of(value)
        elif isinstance(value, Mapping):
            if value:
                raise TypeError(f"{spec.name}: a non-empty table default has no values form; extend policy/helm.py")
            out[spec.name] = {}
        elif isinstance(value, tuple):
            if any(_is_table(item) for item in value):
                out[spec.name] = []  # built-in entries apply after the file's own: the file starts empty
            else:
                out[spec.name] = list(value)
        else:
            out[spec.name] = value
    return out


def _schema_of(section: Any, description: str) -> dict[str, Any]:
    hints = get_type_hints(type(section))
    props: dict[str, Any] = {}
    for spec in fields(section):
        value = getattr(section, spec.name)
        doc = _doc(spec)
        if _is_table(value):
            props[spec.name] = _schema_of(value, doc)
            continue
        if isinstance(value, Mapping):
            props[spec.name] = {"type": "object", "description": doc}
            continue
        if isinstance(value, tuple):
            items: dict[str, Any] = {"type": "object"} if any(_is_table(i) for i in value) else {}
            if not items and all(isinstance(i, str) for i in value):
                items = {"type": "string"}
            props[spec.name] = {"type": "array", "description": doc, **({"items": items} if items else {})}
            continue
        types, nullable = _scalar_type(hints[spec.name])
        if not types:  # a parsed setting (a duration "10m" or seconds, a selector...): the controller checks it
            props[spec.name] = {"description": doc}
            continue
        if nullable or value is None:
            types = [*types, "null"]
        prop: dict[str, Any] = {"type": types[0] if len(types) == 1 else types, "description": doc}
        if spec.metadata.get("parse") is None:
            prop.update(_check_rules(spec.metadata.get("check")))
        props[spec.name] = prop
    return {"type": "object", "description": description, "additionalProperties": False, "properties": props}


def policy_values() -> dict[str, Any]:
    """Every section of the policy file with its defaults, as the chart's ``policy`` value."""
    out: dict[str, Any] = {}
    for root in (Policy(), ClusterSettings()):
        for spec in fields(root):
            value = getattr(root, spec.name)
            out[spec.name] = _values_of(value) if _is_table(value) else {}
    out["groups"] = []
    return out


def policy_schema() -> dict[str, Any]:
    """The JSON schema of the ``policy`` value: one object per section, no unknown key, each key's rules."""
    props: dict[str, Any] = {}
    for root in (Policy(), ClusterSettings()):
        for spec in fields(root):
            value = getattr(root, spec.name)
            props[spec.name] = _schema_of(value, _doc(spec)) if _is_table(value) else \
                {"type": "object", "description": _doc(spec)}
    props["groups"] = {
        "type": "array", "description": "[[groups]]: per node group overrides (name, selector, then sections)",
        "items": {"type": "object", "required": ["name", "selector"],
                  "properties": {"name": {"type": "string", "minLength": 1},
                                 "selector": {"type": "string", "minLength": 1}}}}
    return {"type": "object", "description": "the policy file (manifests/base/policy.toml), every key",
            "additionalProperties": False, "properties": props}


# --- YAML out (the values file is read by people: block style, comments from the docs) ------------------

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"no YAML form for {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a YAML double-quoted scalar
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    if isinstance(value, dict) and not value:
        return "{}"
    raise TypeError(f"no inline YAML form for {type(value).__name__}")


def _yaml_lines(values: Mapping[str, Any], schema: Mapping[str, Any], indent: int) -> list[str]:
    lines: list[str] = []
    pad = "  " * indent
    props = schema.get("properties", {})
    for key, value in values.items():
        doc = props.get(key, {}).get("description", "")
        name = key if _PLAIN.match(key) else json.dumps(key)
        if doc:
            lines.append(f"{pad}# {doc}")
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{name}:")
            lines += _yaml_lines(value, props.get(key, {}), indent + 1)
        else:
            lines.append(f"{pad}{name}: {_yaml_scalar(value)}")
    return lines


def values_block() -> str:
    """The ``policy:`` block of values.yaml, between its markers."""
    schema = policy_schema()
    body = _yaml_lines({"policy": policy_values()}, {"properties": {"policy": schema}}, 0)
    return "\n".join([BEGIN, *body[1:], END]) + "\n"  # the first line: the policy's own description


def replace_block(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"values.yaml has no generated block ({BEGIN!r} ... {END!r})")
    return text[:start] + values_block() + text[end + len(END) + 1:]


def merged_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The chart's values.schema.json with properties.policy replaced by policy_schema()."""
    out = dict(schema)
    out["properties"] = {**schema.get("properties", {}), SCHEMA_KEY: policy_schema()}
    return out


def schema_text(schema: Mapping[str, Any]) -> str:
    return json.dumps(merged_schema(schema), indent=2) + "\n"


def write(chart: Path) -> None:
    values = chart / "values.yaml"
    values.write_text(replace_block(values.read_text(encoding="utf-8")), encoding="utf-8")
    schema_path = chart / "values.schema.json"
    schema_path.write_text(schema_text(json.loads(schema_path.read_text(encoding="utf-8"))), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuremediate.policy.helm",
                                     description="Write the Helm chart's generated policy values and schema.")
    parser.add_argument("--write", metavar="CHART", help="the chart directory (charts/gpuremediate)")
    args = parser.parse_args(argv)
    if args.write:
        write(Path(args.write))
    else:
        sys.stdout.write(values_block())
    return 0


if __name__ == "__main__":
    sys.exit(main())
