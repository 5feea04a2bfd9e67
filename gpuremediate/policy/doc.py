"""The policy file's defaults, written out as commented TOML, generated from the schema itself.

Every section and setting comes from the dataclasses in ``policy.config`` / ``policy.workflow``
(and whatever section is added there later): the field's default is the value written, its
``doc`` metadata the comment above it. ``manifests/base/policy.toml`` is this output, so the
shipped policy file can never drift from the code (a test compares them). ``--markdown`` writes the same
settings as the policy reference page, docs/policy-reference.md (a test compares that too).

    python -m gpuremediate.policy.doc --toml > manifests/base/policy.toml
    python -m gpuremediate.policy.doc --markdown > docs/policy-reference.md
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
            if spec.metadata.get("internal"):
                continue
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


MARKDOWN_HEADER = """\
# Policy reference

<!-- generated by `python -m gpuremediate.policy.doc --markdown > docs/policy-reference.md`: do not edit; a test
compares this page with the generator's output. -->

Every section and setting of the policy file, its built-in default and what it does, generated from the schema
(the same text as the comments of [manifests/base/policy.toml](../manifests/base/policy.toml), which is the
default policy written out). How to load, check and override the file, and what the settings are for:
[configure.md](configure.md). Durations are seconds (numbers); keys are snake_case, except in `[customDrain]`
and `[actions.<name>]`, which keep NVSentinel's camelCase names. An unknown key or a bad value stops the
controller, naming the key path.

Per node (a `[[groups]]` entry may override them for the nodes its selector matches): {per_node}.
Cluster-wide (one value for the whole fleet): {cluster}.
"""


def _md_cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _md_value(value: Any, path: str) -> str:
    if value is None:
        return "(not set)"
    return "`" + toml_value(value, path).replace("|", "\\|") + "`"


def _md_section(obj: Any, path: str, doc: str, depth: int) -> Iterator[str]:
    """``## `[path]` ``, its doc, a table of its settings, then its sub-tables (one level deeper)."""
    yield f"{'#' * depth} `[{path}]`"
    yield ""
    if doc:
        yield _md_cell(doc)
        yield ""
    rows: list[str] = []
    tables: list[tuple[Field[Any], Any]] = []
    for spec in fields(obj):
        value = getattr(obj, spec.name)
        key = f"{path}.{spec.name}"
        if _is_table(value) or isinstance(value, Mapping) or _table_type(obj, spec) is not None:
            tables.append((spec, value))
            continue
        meaning = _md_cell(_doc(spec))
        if "example" in spec.metadata and not value:
            meaning += f" (e.g. `{toml_value(spec.metadata['example'], key)}`)"
        rows.append(f"| `{spec.name}` | {_md_value(value, key)} | {meaning} |")
    if rows:
        yield "| key | default | meaning |"
        yield "|---|---|---|"
        yield from rows
        yield ""
    for spec, value in tables:
        key = f"{path}.{spec.name}"
        element = _table_type(obj, spec)
        if element is not None:
            yield from _md_array(value, element, key, _doc(spec), spec.metadata.get("example"), depth + 1)
        elif _is_table(value):
            yield from _md_section(value, key, _doc(spec), min(depth + 1, 4))
        else:
            yield from _md_mapping(value, key, _doc(spec), min(depth + 1, 4))


def _md_array(items: Sequence[Any], element: type, path: str, doc: str, example: Mapping[str, Any] | None,
              depth: int) -> Iterator[str]:
    yield f"{'#' * min(depth, 4)} `[[{path}]]`"
    yield ""
    if doc:
        yield _md_cell(doc)
        yield ""
    yield ("Built in (they apply after the file's own entries):" if items else
           "None by default; an entry looks like:")
    yield ""
    yield "```toml"
    for item in items or [element(**(example or {}))]:
        yield f"[[{path}]]"
        for spec in fields(item):
            if spec.metadata.get("internal"):
                continue
            yield f"{spec.name} = {toml_value(getattr(item, spec.name), f'{path}[].{spec.name}')}"
    yield "```"
    yield ""


def _md_mapping(value: Mapping[Any, Any], path: str, doc: str, depth: int) -> Iterator[str]:
    if value:
        raise DocError(f"{path}: a non-empty table default has no generic Markdown form; extend policy/doc.py")
    yield f"{'#' * depth} `[{path}]`"
    yield ""
    yield (_md_cell(doc).rstrip(".") + ". " if doc else "") + "Empty by default."
    yield ""


def policy_markdown() -> str:
    """The policy reference page (docs/policy-reference.md): the same sections, settings, defaults and words as
    ``policy_toml``, as Markdown headings and tables."""
    per_node = ", ".join(f"`[{spec.name}]`" for spec in fields(Policy))
    cluster = ", ".join(f"`[{spec.name}]`" for spec in fields(ClusterSettings))
    lines = [MARKDOWN_HEADER.format(per_node=per_node, cluster=cluster)]
    for root in (Policy(), ClusterSettings()):
        for spec in fields(root):
            value = getattr(root, spec.name)
            if _is_table(value):
                lines += _md_section(value, spec.name, _doc(spec), 2)
            elif isinstance(value, Mapping):
                lines += _md_mapping(value, spec.name, _doc(spec), 2)
            else:
                raise DocError(f"{spec.name}: a top-level setting must be a section (table)")
    lines += ["## `[[groups]]`", "",
              "The first `[[groups]]` whose label selector matches a node applies to it: the keys a group names "
              "override the values above, the rest keep them. The sections a group may hold are the per-node "
              "ones listed at the top.", "", "```toml"]
    example = GROUPS_EXAMPLE.splitlines()
    lines += [line.removeprefix("# ") for line in example[example.index("# [[groups]]"):]]
    lines += ["```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuremediate.policy.doc",
                                     description="Print the default policy file, every setting documented.")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--toml", action="store_true", help="print the policy file (TOML) [the default]")
    form.add_argument("--markdown", action="store_true",
                      help="print the policy reference page (docs/policy-reference.md)")
    args = parser.parse_args(argv)
    sys.stdout.write(policy_markdown() if args.markdown else policy_toml())
    return 0


if __name__ == "__main__":
    sys.exit(main())
