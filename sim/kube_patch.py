"""Patch algebra: RFC 7386 merge patch, RFC 6902 JSON patch, strategic merge patch, and the leaf-path
bookkeeping behind the simplified server-side apply (managedFields as sets of leaf paths).

Simplifications: lists are atomic leaves for field ownership; strategic merge knows the upstream merge
keys a GPU controller meets (conditions, containers, env, ports, volumes, addresses, ...; taints have none);
`$patch` and `$retainKeys` directives are not supported.
"""

from __future__ import annotations

import copy
from typing import Any

from gpuremediate.kube.patch import merge_patch

__all__ = ["json_patch", "merge_diff", "merge_patch", "strategic_merge"]

Path = tuple[str, ...]


class PatchError(Exception):
    """A patch that cannot be applied (a failed `test`, a missing path, an unknown op)."""


# --- RFC 7386 ---------------------------------------------------------------------------------------
# merge_patch: the client's own (gpuremediate.kube.patch), re-exported for the handlers.

def merge_diff(source: Any, target: Any) -> Any:
    """The merge patch that turns source into target (both dicts)."""
    patch: dict[str, Any] = {}
    for key in source:
        if key not in target:
            patch[key] = None
    for key, value in target.items():
        old = source.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(old, dict):
            sub = merge_diff(old, value)
            if sub:
                patch[key] = sub
        elif old != value or type(old) is not type(value):
            patch[key] = copy.deepcopy(value)
    return patch


_MISSING = object()


# --- RFC 6902 ---------------------------------------------------------------------------------------

def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for part in parts:
        cur = _child(cur, part)
    return cur


def _child(cur: Any, part: str) -> Any:
    if isinstance(cur, dict):
        if part not in cur:
            raise PatchError(f"missing key {part}")
        return cur[part]
    if isinstance(cur, list):
        index = _index(part, len(cur) - 1)
        return cur[index]
    raise PatchError("path traverses a scalar")


def _index(part: str, upper: int) -> int:
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchError(f"bad index {part}")
    index = int(part)
    if index > upper:
        raise PatchError(f"index {index} out of range")
    return index


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _container(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else _index(last, len(parent)), value)
    else:
        raise PatchError("cannot add to a scalar")
    return doc


def _remove(doc: Any, parts: list[str]) -> tuple[Any, Any]:
    if not parts:
        raise PatchError("cannot remove the root")
    parent = _container(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"missing key {last}")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(last, len(parent) - 1))
    raise PatchError("cannot remove from a scalar")


def json_patch(doc: Any, ops: list[Any]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "path" not in op:
            raise PatchError("malformed operation")
        doc = _apply_op(doc, op)
    return doc


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, parts = op.get("op"), _pointer(op["path"])
    if kind == "add":
        return _add(doc, parts, copy.deepcopy(_value(op)))
    if kind == "remove":
        return _remove(doc, parts)[0]
    if kind == "replace":
        doc, _ = _remove(doc, parts) if parts else (doc, None)
        return _add(doc, parts, copy.deepcopy(_value(op)))
    if kind == "test":
        if _container(doc, parts) != _value(op):
            raise PatchError("test failed")
        return doc
    if kind in ("move", "copy"):
        source = _pointer(op.get("from", ""))
        if kind == "move":
            doc, value = _remove(doc, source)
        else:
            value = copy.deepcopy(_container(doc, source))
        return _add(doc, parts, value)
    raise PatchError(f"unknown op {kind!r}")


def _value(op: dict[str, Any]) -> Any:
    if "value" not in op:
        raise PatchError("missing value")
    return op["value"]


# --- strategic merge patch ------------------------------------------------------------------------

# NodeSpec.Taints has no patchStrategy/patchMergeKey tags (k8s.io/api core/v1 types.go: only
# `json:"taints,omitempty" protobuf:"bytes,5,opt,name=taints"`): a strategic merge patch replaces the whole
# list, which is why the node lifecycle controller's PatchNodeTaints sends the full list with a resourceVersion.
MERGE_KEYS: dict[str, str] = {
    "conditions": "type", "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "addresses": "type",
    "ownerReferences": "uid", "imagePullSecrets": "name", "containerStatuses": "name",
    "initContainerStatuses": "name", "volumeDevices": "devicePath", "envFrom": "",
}
PRIMITIVE_MERGE_LISTS = {"finalizers"}


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        first = next((i for i in items if isinstance(i, dict)), {})
        return "containerPort" if "containerPort" in first else "port"
    key = MERGE_KEYS.get(field)
    return key or None


def strategic_merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for field, value in patch.items():
        if value is None:
            result.pop(field, None)
        elif isinstance(value, list) and isinstance(result.get(field), list):
            result[field] = _merge_list(field, result[field], value)
        elif isinstance(value, dict):
            result[field] = strategic_merge(result.get(field), value)
        else:
            result[field] = copy.deepcopy(value)
    return result


def _merge_list(field: str, current: list[Any], patch: list[Any]) -> list[Any]:
    if field in PRIMITIVE_MERGE_LISTS:
        return list(current) + [v for v in patch if v not in current]
    key = _merge_key(field, patch + current)
    if key is None or not all(isinstance(i, dict) and key in i for i in patch):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(current)
    for item in patch:
        at = next((n for n, old in enumerate(merged) if isinstance(old, dict) and old.get(key) == item[key]), None)
        if at is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[at] = strategic_merge(merged[at], item)
    return merged


# --- field ownership (server-side apply) ----------------------------------------------------------

IGNORED_ROOTS: set[Path] = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"),
                            ("metadata", "uid"), ("metadata", "resourceVersion"), ("metadata", "generation"),
                            ("metadata", "creationTimestamp"), ("metadata", "managedFields"),
                            ("metadata", "deletionTimestamp"), ("metadata", "deletionGracePeriodSeconds"),
                            ("metadata", "generateName"), ("status",)}


def leaf_paths(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf (scalar, list, or empty dict) under obj keyed by its path."""
    out: dict[Path, Any] = {}
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            path = (*prefix, key)
            if path in IGNORED_ROOTS:
                continue
            out.update(leaf_paths(value, path))
    elif prefix:
        out[prefix] = obj
    return out


def get_path(obj: Any, path: Path) -> Any:
    cur = obj
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return _MISSING
        cur = cur[key]
    return cur


def delete_path(obj: dict[str, Any], path: Path) -> None:
    cur: Any = obj
    for key in path[:-1]:
        cur = cur.get(key) if isinstance(cur, dict) else None
        if cur is None:
            return
    if isinstance(cur, dict):
        cur.pop(path[-1], None)


def changed_paths(old: Any, new: Any) -> set[Path]:
    before, after = leaf_paths(old), leaf_paths(new)
    return {p for p, v in after.items() if before.get(p, _MISSING) != v}


def path_text(path: Path) -> str:
    return "." + ".".join(path)


def fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        cur = tree
        for depth, key in enumerate(path):
            node = cur.setdefault(f"f:{key}", {})
            if depth < len(path) - 1:
                node.setdefault(".", {})
            cur = node
    return tree


def paths_from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in tree.items():
        if not key.startswith("f:"):
            continue
        path = (*prefix, key[2:])
        children = {k: v for k, v in sub.items() if k.startswith("f:")}
        out |= paths_from_fields_v1(children, path) if children else {path}
    return out
