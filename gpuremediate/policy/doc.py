"""The policy file's defaults, written out as commented TOML, generated from the schema itself.

Every section and setting comes from the dataclasses in ``policy.config`` / ``policy.workflow``
(and whatever section is added there later): the field's default is the value written, its
``doc`` metadata the comment above it. ``manifests/base/policy.toml`` is this output, so the
shipped policy file can never drift from the code (a test compares them).

    python -m gpuremediate.policy.doc --toml > manifests/base/policy.toml
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import Field, fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

from gpuremediate.policy.config import ClusterSettings, Policy

HEADER = """\
# gpuremediate policy: every setting at its built-in default, generated from the schema by
#   python -m gpuremediate.policy.doc --toml
# Delete a line to fall back to the default (the same value). Durations are seconds (numbers).
# Keys are snake_case; an unknown key or a bad value stops the controller with the key path.
"""

GROUPS_EXAMPLE = """\
# ---- per node group overrides -------------------------------------------------------------
# The first [[groups]] whose label selector matches a node applies to it: the keys a group names
# override the values above, the rest keep them. The sections a group may hold (per node):
# {per_node}.
# [[groups]]
# name = "h100-training"
# selector = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
# [groups.thermal]
# gpu_cordon_c = 87.0
# [groups.drain]
# mode = "AllowCompletion"
# timeout_s = 21600.0
# [groups.xid.overrides]
# "94" = "reset-gpu"
"""


class DocError(TypeError):
    """The schema holds a default this generator cannot write as TOML; the message names the key."""


def toml_value(value: Any, path: str) -> str:
    """A TOML literal for a scalar or an array of scalars."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DocError(f"{path}: cannot write the non-finite default {value!r} as TOML")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, Sequence):
        return "[" + ", ".join(toml_value(item, f"{path}[]") for item in value) + "]"
    raise DocError(f"{path}: no TOML form for a default of type {type(value).__name__}")


def _doc(spec: Field[Any]) -> str:
    return str(spec.metadata.get("doc", "")).strip()


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines() if line.strip()]


def _is_table(value: Any) -> bool:
    return is_dataclass(value) and not isinstance(value, type)


def _table_type(owner: Any, spec: Field[Any]) -> type | None:
    """The element type of an array-of-tables field (``tuple[SomeSection, ...]``), else None."""
    hint = get_type_hints(type(owner)).get(spec.name)
    args = get_args(hint) if get_origin(hint) is tuple else ()
    return args[0] if args and is_dataclass(args[0]) and isinstance(args[0], type) else None


def _section(obj: Any, path: str, doc: str) -> Iterator[str]:
    """``[path]`` with its scalar settings, then its sub-tables (TOML needs that order)."""
    yield ""
    yield from _comment(doc)
    yield f"[{path}]"
    tables: list[tuple[Field[Any], Any]] = []
    for spec in fields(obj):
        value = getattr(obj, spec.name)
        key = f"{path}.{spec.name}"
        if _is_table(value) or isinstance(value, Mapping) or _table_type(obj, spec) is not None:
            tables.append((spec, value))
        elif value is None:
            yield from _comment(_doc(spec))
            yield f"# {spec.name} = (not set by default)"
        else:
            yield from _comment(_doc(spec))
            yield f"{spec.name} = {toml_value(value, key)}"
            if "example" in spec.metadata and not value:
                yield f"# e.g. {spec.name} = {toml_value(spec.metadata['example'], key)}"
    for spec, value in tables:
        key = f"{path}.{spec.name}"
        element = _table_type(obj, spec)
        if element is not None:
            yield from _array_of_tables(value, element, key, _doc(spec), spec.metadata.get("example"))
        elif _is_table(value):
            yield from _section(value, key, _doc(spec))
        else:
            yield from _mapping(value, key, _doc(spec))


def _array_of_tables(items: Sequence[Any], element: type, path: str, doc: str,
                     example: Mapping[str, Any] | None) -> Iterator[str]:
    """``[[path]]`` entries, commented: the built-in ones (they apply after the file's own), or one example."""
    yield ""
    yield from _comment(doc)
    if items:
        yield "# built in (they apply after the file's own entries):"
    else:
        yield "# none by default; an entry looks like:"
    for item in items or [element(**(example or {}))]:
        yield f"# [[{path}]]"
        for spec in fields(item):
            yield f"# {spec.name} = {toml_value(getattr(item, spec.name), f'{path}[].{spec.name}')}"


def _mapping(value: Mapping[Any, Any], path: str, doc: str) -> Iterator[str]:
    """A keyed table (XID overrides, custom actions): written commented, with any defaults it has."""
    if value:
        raise DocError(f"{path}: a non-empty table default has no generic TOML form; extend policy/doc.py")
    yield ""
    yield from _comment(doc)
    yield f"# [{path}]   (empty by default)"


def policy_toml() -> str:
    """The whole default policy file."""
    lines = [HEADER.rstrip("\n")]
    for root in (Policy(), ClusterSettings()):
        for spec in fields(root):
            value = getattr(root, spec.name)
            if _is_table(value):
                lines += _section(value, spec.name, _doc(spec))
            elif isinstance(value, Mapping):
                lines += _mapping(value, spec.name, _doc(spec))
            else:
                raise DocError(f"{spec.name}: a top-level setting must be a section (table)")
    per_node = ", ".join(spec.name for spec in fields(Policy))
    lines += ["", GROUPS_EXAMPLE.format(per_node=per_node).rstrip("\n")]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuremediate.policy.doc",
                                     description="Print the default policy file, every setting documented.")
    parser.add_argument("--toml", action="store_true", help="print the policy file (TOML) [the default]")
    parser.parse_args(argv)
    sys.stdout.write(policy_toml())
    return 0


if __name__ == "__main__":
    sys.exit(main())
