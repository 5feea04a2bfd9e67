"""A CRD's structural schema on create and update, as apiextensions-apiserver applies it: defaults, then
OpenAPI validation (type, required, enum, lengths, pattern, format, bounds, item and property counts),
then every `x-kubernetes-validations` CEL rule (sim.kube_cel), with v1.36's messages
(`<path>: Invalid value: <rule message>`). Rules are skipped when the schema already failed, as the real
server does, and a rule whose value did not change on an update is not re-evaluated (ratcheting).
"""

from __future__ import annotations

import copy
import re
from datetime import datetime
from functools import lru_cache
from typing import Any

from sim import kube_cel as cel
from sim import kube_errors as errs
from sim.kube_resources import type_name

Schema = dict[str, Any]
Cause = dict[str, str]
_RESERVED = ("apiVersion", "kind", "metadata")
_MISSING = object()
_JSON_TYPES = {"integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,),
               "object": (dict,), "array": (list,)}
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
SKIPPED_RULES = ("some validation rules were not checked because the object was invalid; correct the existing "
                 "errors to complete validation")


def apply_defaults(value: Any, schema: Schema | None) -> None:
    """Fill absent properties that declare a `default` (in place), depth first."""
    if schema is None:
        return
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                apply_defaults(value[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value.keys() - set(schema.get("properties") or {}):
                apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"])


def validate(obj: dict[str, Any], schema: Schema | None, old: dict[str, Any] | None) -> list[Cause]:
    if schema is None:
        return []
    body = {k: v for k, v in obj.items() if k not in _RESERVED}
    old_body = None if old is None else {k: v for k, v in old.items() if k not in _RESERVED}
    causes = _openapi(body, {**schema, "properties": {k: v for k, v in (schema.get("properties") or {}).items()
                                                      if k not in _RESERVED}}, "")
    if causes:
        if _has_rules(schema):
            causes.append(errs.cause("FieldValueInvalid", f'Invalid value: "null": {SKIPPED_RULES}', "<nil>"))
        return causes
    return _rules(body, _MISSING if old_body is None else old_body, schema, "")


# --- OpenAPI v3 validation -----------------------------------------------------------------------------

def _openapi(value: Any, schema: Schema, path: str) -> list[Cause]:
    if value is None and schema.get("nullable"):
        return []
    expected = schema.get("type")
    if expected in _JSON_TYPES and not _is_type(value, expected):
        shown = type_name(value)
        return [errs.cause("FieldValueTypeInvalid",
                           f'Invalid value: "{shown}": {path or "body"} in body must be of type {expected}: "{shown}"',
                           path)]
    causes = _scalar_checks(value, schema, path)
    if isinstance(value, dict):
        causes += _object_checks(value, schema, path)
    elif isinstance(value, list):
        causes += _array_checks(value, schema, path)
    return causes


def _is_type(value: Any, expected: str) -> bool:
    return isinstance(value, _JSON_TYPES[expected]) and not (expected != "boolean" and isinstance(value, bool))


def _scalar_checks(value: Any, schema: Schema, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(_go_quote(v) for v in schema["enum"])
        causes.append(errs.cause("FieldValueNotSupported",
                                 f"Unsupported value: {_go_quote(value)}: supported values: {allowed}", path))
    if isinstance(value, str):
        causes += _string_checks(value, schema, path)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            causes.append(_invalid(path, value, f"{path} in body should be greater than or equal to "
                                                f"{_number(schema['minimum'])}"))
        if "maximum" in schema and value > schema["maximum"]:
            causes.append(_invalid(path, value, f"{path} in body should be less than or equal to "
                                                f"{_number(schema['maximum'])}"))
    return causes


def _string_checks(value: str, schema: Schema, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        causes.append(errs.cause("FieldValueTooLong", f"Too long: must have at most {schema['maxLength']} bytes",
                                 path))
    if "minLength" in schema and len(value) < schema["minLength"]:
        causes.append(_invalid(path, value, f"{path} in body should be at least {schema['minLength']} chars long"))
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        causes.append(_invalid(path, value, f"{path} in body should match '{schema['pattern']}'"))
    if schema.get("format") == "date-time" and not _is_date_time(value):
        causes.append(_invalid(path, value, f'{path} in body must be of type date-time: "{value}"'))
    return causes


def _object_checks(value: dict[str, Any], schema: Schema, path: str) -> list[Cause]:
    causes = [errs.cause("FieldValueRequired", "Required value", _join(path, key))
              for key in schema.get("required") or [] if key not in value]
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        causes.append(errs.cause("FieldValueTooMany", f"Too many: {len(value)}: must have at most "
                                 f"{schema['maxProperties']} items", path))
    props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
    for key, sub in value.items():
        sub_schema = props.get(key, extra if isinstance(extra, dict) else None)
        if sub_schema is not None:
            causes += _openapi(sub, sub_schema, _join(path, key))
    return causes


def _array_checks(value: list[Any], schema: Schema, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        causes.append(errs.cause("FieldValueTooMany", f"Too many: {len(value)}: must have at most "
                                 f"{schema['maxItems']} items", path))
    if "minItems" in schema and len(value) < schema["minItems"]:
        causes.append(_invalid(path, value, f"{path} in body should have at least {schema['minItems']} items"))
    if isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            causes += _openapi(item, schema["items"], f"{path}[{i}]")
    return causes


def _is_date_time(text: str) -> bool:
    if not _DATE_TIME.match(text):
        return False
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return True


# --- x-kubernetes-validations -------------------------------------------------------------------------

def _has_rules(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    if schema.get("x-kubernetes-validations"):
        return True
    subs = [*(schema.get("properties") or {}).values(), schema.get("items"), schema.get("additionalProperties")]
    return any(_has_rules(sub) for sub in subs)


@lru_cache(maxsize=256)
def _compiled(rule: str) -> cel.Node:
    return cel.compile_rule(rule)


def _rules(value: Any, old: Any, schema: Schema, path: str) -> list[Cause]:
    """Pre-order: a node's own rules, then its children's (the order the real server reports them)."""
    causes = [cause for rule in schema.get("x-kubernetes-validations") or []
              if (cause := _check_rule(rule, value, old, path)) is not None]
    if isinstance(value, dict):
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for key, sub in value.items():
            sub_schema = props.get(key, extra if isinstance(extra, dict) else None)
            if sub_schema is not None:
                before = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                causes += _rules(sub, before, sub_schema, _join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):  # list items are not correlated with the old list: no oldSelf
            causes += _rules(item, _MISSING, schema["items"], f"{path}[{i}]")
    return causes


def _check_rule(rule: dict[str, Any], value: Any, old: Any, path: str) -> Cause | None:
    text = str(rule.get("rule", ""))
    try:
        node = _compiled(text)
    except cel.CelError as err:
        return errs.cause("FieldValueInvalid", f"Invalid value: compilation failed: {err}", path or "<nil>")
    transition = cel.uses_old_self(node)
    if transition and old is _MISSING:
        return None  # a transition rule applies to updates of a value that existed before
    if not transition and old is not _MISSING and old == value:
        return None  # ratcheting: an unchanged value is not held to a rule it may have predated
    scope = {"self": value, **({"oldSelf": old} if transition else {})}
    try:
        ok = cel.evaluate(node, scope)
    except cel.CelError as err:
        return errs.cause("FieldValueInvalid", f"Invalid value: {err} evaluating rule: {text}", path or "<nil>")
    if ok is True:
        return None
    message = rule.get("message") or f"failed rule: {text}"
    field = _join(path, str(rule["fieldPath"]).lstrip(".")) if rule.get("fieldPath") else path
    return errs.cause(str(rule.get("reason") or "FieldValueInvalid"), f"Invalid value: {message}", field or "<nil>")


# --- formatting -----------------------------------------------------------------------------------------

def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _invalid(path: str, value: Any, detail: str) -> Cause:
    return errs.cause("FieldValueInvalid", f"Invalid value: {_go_value(value)}: {detail}", path)


def _go_quote(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else _go_value(value)


def _go_value(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _number(value)
    return f'"{type_name(value)}"'


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
