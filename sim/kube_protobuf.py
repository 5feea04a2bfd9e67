"""The protobuf request bodies the emulator reads: core/v1 Secrets, ConfigMaps, Namespaces and DeleteOptions, as
Helm sends them.

Helm v4 keeps each release in a Secret (``sh.helm.release.v1.<name>.v<revision>``) and writes it through client-go's
typed clientset, whose requests for built-in kinds are ``application/vnd.kubernetes.protobuf``
(``helm install --create-namespace`` writes its Namespace the same way). kube-apiserver reads protobuf for every
built-in kind; the emulator reads the few kinds a client sends it as protobuf, into the JSON objects the rest of it
stores. Everything it answers stays JSON (clients accept it: they send ``Accept: ...protobuf,application/json``).

The wire format (k8s.io/apimachinery/pkg/runtime/serializer/protobuf): the 4 bytes ``k8s\\x00``, then a
``runtime.Unknown`` {1: TypeMeta {1: apiVersion, 2: kind}, 2: raw (the object's own message), 3: contentEncoding,
4: contentType}. Field numbers below are generated.proto's in k8s.io/api/core/v1 and apimachinery's meta/v1.
gogo-protobuf writes every non-pointer string, even empty: an empty string is a field left unset.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

Obj = dict[str, Any]


class ProtobufError(ValueError):
    """A body that is not a k8s protobuf envelope of a kind this module reads."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of a message: an int for varints, bytes for length-delimited ones."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ProtobufError("truncated field")
            yield number, buf[pos:pos + size]
            pos += size
        elif wire == 1:
            yield number, buf[pos:pos + 8]
            pos += 8
        elif wire == 5:
            yield number, buf[pos:pos + 4]
            pos += 4
        else:
            raise ProtobufError(f"wire type {wire} of field {number}")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ProtobufError("a string field that is not length-delimited")
    return value.decode("utf-8")


def _msg(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ProtobufError("a message field that is not length-delimited")
    return value


def _entry(value: int | bytes) -> tuple[str, bytes]:
    """A map<string, V> entry: {1: key, 2: value} (the value's bytes; absent = empty)."""
    key, val = "", b""
    for number, part in fields(_msg(value)):
        if number == 1:
            key = _text(part)
        elif number == 2:
            val = _msg(part)
    return key, val


def _time(value: int | bytes) -> str | None:
    """meta/v1 Time {1: seconds, 2: nanos} as RFC 3339 seconds (the JSON form); zero: unset."""
    seconds = 0
    for number, part in fields(_msg(value)):
        if number == 1 and isinstance(part, int):
            seconds = part
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner_reference(value: int | bytes) -> Obj:
    ref: Obj = {}
    names = {5: "apiVersion", 1: "kind", 3: "name", 4: "uid"}
    for number, part in fields(_msg(value)):
        if number in names:
            ref[names[number]] = _text(part)
        elif number in (6, 7) and isinstance(part, int):
            ref["controller" if number == 6 else "blockOwnerDeletion"] = bool(part)
    return ref


def object_meta(buf: bytes) -> Obj:
    meta: Obj = {}
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    for number, value in fields(buf):
        if number in strings:
            if text := _text(value):
                meta[strings[number]] = text
        elif number in (11, 12):
            key, val = _entry(value)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = val.decode("utf-8")
        elif number == 13:
            meta.setdefault("ownerReferences", []).append(_owner_reference(value))
        elif number == 14:
            meta.setdefault("finalizers", []).append(_text(value))
        elif number == 8 and (stamp := _time(value)):
            meta["creationTimestamp"] = stamp
    return meta


def _secret(raw: bytes) -> Obj:
    obj: Obj = {}
    for number, value in fields(raw):
        if number == 1:
            obj["metadata"] = object_meta(_msg(value))
        elif number == 2:
            key, val = _entry(value)
            obj.setdefault("data", {})[key] = base64.b64encode(val).decode("ascii")
        elif number == 3:
            if text := _text(value):
                obj["type"] = text
        elif number == 4:
            key, val = _entry(value)
            obj.setdefault("stringData", {})[key] = val.decode("utf-8")
        elif number == 5 and isinstance(value, int):
            obj["immutable"] = bool(value)
    return obj


def _config_map(raw: bytes) -> Obj:
    obj: Obj = {}
    for number, value in fields(raw):
        if number == 1:
            obj["metadata"] = object_meta(_msg(value))
        elif number == 2:
            key, val = _entry(value)
            obj.setdefault("data", {})[key] = val.decode("utf-8")
        elif number == 3:
            key, val = _entry(value)
            obj.setdefault("binaryData", {})[key] = base64.b64encode(val).decode("ascii")
        elif number == 4 and isinstance(value, int):
            obj["immutable"] = bool(value)
    return obj


def _namespace(raw: bytes) -> Obj:
    obj: Obj = {}
    for number, value in fields(raw):
        if number == 1:
            obj["metadata"] = object_meta(_msg(value))
        elif number == 2:  # NamespaceSpec {1: finalizers}
            finalizers = [_text(v) for n, v in fields(_msg(value)) if n == 1]
            if finalizers:
                obj["spec"] = {"finalizers": finalizers}
    return obj


def _delete_options(raw: bytes) -> Obj:
    """meta/v1 DeleteOptions: 1 gracePeriodSeconds, 2 preconditions {1 uid, 2 resourceVersion}, 3 orphanDependents,
    4 propagationPolicy, 5 dryRun (as ``helm uninstall`` sends them with its Secrets' deletes)."""
    opts: Obj = {}
    for number, value in fields(raw):
        if number == 1 and isinstance(value, int):
            opts["gracePeriodSeconds"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 2:
            names = {1: "uid", 2: "resourceVersion"}
            pre = {names[n]: _text(v) for n, v in fields(_msg(value)) if n in names and _text(v)}
            if pre:
                opts["preconditions"] = pre
        elif number == 3 and isinstance(value, int):
            opts["orphanDependents"] = bool(value)
        elif number == 4:
            if text := _text(value):
                opts["propagationPolicy"] = text
        elif number == 5:
            opts.setdefault("dryRun", []).append(_text(value))
    return opts


READERS: dict[tuple[str, str], Callable[[bytes], Obj]] = {
    ("v1", "Secret"): _secret,
    ("v1", "ConfigMap"): _config_map,
    ("v1", "Namespace"): _namespace,
    ("meta.k8s.io/v1", "DeleteOptions"): _delete_options,
    ("v1", "DeleteOptions"): _delete_options,
}


def decode(body: bytes) -> Obj:
    """The JSON form of a protobuf-encoded object of a kind in READERS; ProtobufError for anything else."""
    if not body.startswith(MAGIC):
        raise ProtobufError("no k8s protobuf envelope")
    api_version = kind = ""
    raw = b""
    for number, value in fields(body[len(MAGIC):]):
        if number == 1:
            for part_number, part in fields(_msg(value)):
                if part_number == 1:
                    api_version = _text(part)
                elif part_number == 2:
                    kind = _text(part)
        elif number == 2:
            raw = _msg(value)
        elif number == 3 and _text(value):
            raise ProtobufError(f"contentEncoding {_text(value)!r}")
    reader = READERS.get((api_version, kind))
    if reader is None:
        raise ProtobufError(f"the emulator reads no protobuf {api_version}/{kind}")
    return {"apiVersion": api_version, "kind": kind, **reader(raw)}
