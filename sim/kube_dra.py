"""resource.k8s.io (Dynamic Resource Allocation) as kube-apiserver v1.36.2 defaults and validates it.

Read from the v1.36.2 source (pkg/apis/resource/validation, pkg/registry/resource/*/strategy.go,
pkg/apis/resource/v1/defaults.go) and checked against that build (/work/cp, 2026-12-02): the messages below are
the ones it answers with. Covered:

- DeviceTaintRule: ``spec.taint.timeAdded`` defaulted to now (seconds); on an update that changes the effect and
  leaves timeAdded as it was, timeAdded becomes now (the strategy's PrepareForUpdate); the selector's driver, pool
  and device and the taint's key, value and effect validated (effect only when new or changed, as upstream);
  at most 8 status conditions. ``deviceSelector.deviceClassName`` and ``selectors`` are tombstoned since 1.35
  (unknown fields: dropped with a warning).
- ResourceSlice: driver, pool (name, resourceSliceCount > 0), exactly one of nodeName / nodeSelector / allNodes /
  perDeviceNodeSelection, device names (RFC 1123 labels, unique, at most 128), one value per attribute, device
  taints (timeAdded defaulted); driver, pool name and nodeName immutable.
- ResourceClaim: requests (a name, exactly one of ``exactly`` / ``firstAvailable``, ``exactly.deviceClassName``
  required; allocationMode ExactCount and count 1 defaulted; toleration operator Equal defaulted), the spec
  immutable, ``status.reservedFor`` only with an allocation, ``status.allocation`` immutable once set, each
  result naming a request of the claim.

Not covered (the emulator accepts what the real server would refuse): CEL selectors (DeviceClass, claims),
node selectors' contents, counters, partitionable devices, admin access, binding conditions, device status,
the shape of ``metav1.Condition``. The "field is immutable" message for a whole struct shows JSON, not the Go
value dump the real server prints.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from sim import kube_errors as errs
from sim.kube_admission import _DNS1123 as _DNS_SUBDOMAIN
from sim.kube_admission import _LABEL_VALUE, _NAME_PART, LABEL_VALUE_MSG, NAME_PART_MSG
from sim.kube_admission import DNS_MSG as DNS_SUBDOMAIN_MSG
from sim.kube_resources import DRA_GROUP, ResourceType
from sim.kube_store import Obj, now_time

Cause = dict[str, str]

EFFECTS = ("NoExecute", "NoSchedule", "None")  # sorted, as the server lists them
_EFFECTS_TEXT = ", ".join(f'"{e}"' for e in EFFECTS)
MAX_CONDITIONS = 8
MAX_DEVICES = 128
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                 "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
NODE_CHOICE = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
_NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
_ATTRIBUTE_KINDS = (("IntValue", "int"), ("BoolValue", "bool"), ("StringValue", "string"),
                    ("VersionValue", "version"), ("IntValues", "ints"), ("BoolValues", "bools"),
                    ("StringValues", "strings"), ("VersionValues", "versions"))


def is_dra(rt: ResourceType) -> bool:
    return rt.group == DRA_GROUP and not rt.custom


# --- decoding ------------------------------------------------------------------------------------------

_TOMBSTONED = ("deviceClassName", "selectors")  # DeviceTaintSelector fields tombstoned in 1.35 (every version)


def prune(rt: ResourceType, obj: Obj) -> list[str]:
    """Drop (in place) the fields this version no longer has, as decoding does; their paths, for the warning."""
    if not is_dra(rt) or rt.resource != "devicetaintrules":
        return []
    selector = _dict(obj.get("spec")).get("deviceSelector")
    if not isinstance(selector, dict):
        return []
    gone = [key for key in _TOMBSTONED if key in selector]
    for key in gone:
        del selector[key]
    return [f"spec.deviceSelector.{key}" for key in gone]


# --- defaults ------------------------------------------------------------------------------------------

def default(rt: ResourceType, obj: Obj, old: Obj | None) -> None:
    """What decoding (SetDefaults_*) and the strategy's PrepareForCreate/PrepareForUpdate add, in place."""
    if not is_dra(rt):
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if rt.resource == "devicetaintrules":
        _default_rule(spec, (old or {}).get("spec") if old is not None else None)
    elif rt.resource == "resourceslices":
        for device in _dicts(spec.get("devices")):
            for taint in _dicts(device.get("taints")):
                taint.setdefault("timeAdded", now_time())
    elif rt.resource == "resourceclaims":
        _default_claim(obj)


def _default_rule(spec: dict[str, Any], old_spec: Any) -> None:
    taint = spec.setdefault("taint", {})
    if not isinstance(taint, dict):
        return
    old_taint = old_spec.get("taint") if isinstance(old_spec, dict) else None
    if "timeAdded" not in taint or taint.get("timeAdded") is None:
        taint["timeAdded"] = now_time()
    elif isinstance(old_taint, dict) and taint.get("effect") != old_taint.get("effect") \
            and taint.get("timeAdded") == old_taint.get("timeAdded"):
        taint["timeAdded"] = now_time()  # the effect changed: the eviction clock starts again


def _default_claim(obj: Obj) -> None:
    for request in _dicts(((obj.get("spec") or {}).get("devices") or {}).get("requests")):
        for exact in [request.get("exactly"), *_dicts(request.get("firstAvailable"))]:
            if isinstance(exact, dict):
                _default_request(exact)
    allocation = (obj.get("status") or {}).get("allocation") or {}
    for result in _dicts((allocation.get("devices") or {}).get("results")):
        _default_tolerations(result)


def _default_request(request: dict[str, Any]) -> None:
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount" and not request.get("count"):
        request["count"] = 1
    _default_tolerations(request)


def _default_tolerations(holder: dict[str, Any]) -> None:
    for toleration in _dicts(holder.get("tolerations")):
        if not toleration.get("operator"):
            toleration["operator"] = "Equal"


# --- validation ----------------------------------------------------------------------------------------

def validate(rt: ResourceType, obj: Obj, old: Obj | None) -> list[Cause]:
    """The spec and status causes of a resource.k8s.io object (metadata is validated by the caller)."""
    if not is_dra(rt):
        return []
    if rt.resource == "devicetaintrules":
        return _validate_rule(obj, old)
    if rt.resource == "resourceslices":
        return _validate_slice(obj, old)
    if rt.resource == "resourceclaims":
        return _validate_claim(obj, old)
    return []


def _validate_rule(obj: Obj, old: Obj | None) -> list[Cause]:
    spec = _dict(obj.get("spec"))
    selector = spec.get("deviceSelector")
    causes: list[Cause] = []
    if isinstance(selector, dict):
        causes += _optional(selector, "driver", "spec.deviceSelector.driver", _driver_name)
        causes += _optional(selector, "pool", "spec.deviceSelector.pool", _pool_name)
        causes += _optional(selector, "device", "spec.deviceSelector.device", _device_name)
    old_taint = _dict(_dict((old or {}).get("spec")).get("taint")) if old is not None else None
    causes += _taint(_dict(spec.get("taint")), old_taint, "spec.taint")
    conditions = _dict(obj.get("status")).get("conditions") or []
    if isinstance(conditions, list) and len(conditions) > MAX_CONDITIONS:
        causes.append(errs.cause("FieldValueTooMany", f"Too many: {len(conditions)}: must have at most "
                                 f"{MAX_CONDITIONS} items", "status.conditions"))
    return causes


def _taint(taint: dict[str, Any], old: dict[str, Any] | None, path: str) -> list[Cause]:
    causes = label_name(str(taint.get("key") or ""), f"{path}.key")
    value = taint.get("value")
    if value:
        causes += _label_value(str(value), f"{path}.value")
    effect = taint.get("effect") or ""
    if old is None or old.get("effect") != effect:
        if not effect:
            causes.append(errs.cause("FieldValueRequired", "Required value", f"{path}.effect"))
        elif effect not in EFFECTS:
            causes.append(errs.cause("FieldValueNotSupported",
                                     f'Unsupported value: "{effect}": supported values: {_EFFECTS_TEXT}',
                                     f"{path}.effect"))
    return causes


def _validate_slice(obj: Obj, old: Obj | None) -> list[Cause]:
    spec = _dict(obj.get("spec"))
    pool = _dict(spec.get("pool"))
    causes = _driver_name(str(spec.get("driver") or ""), "spec.driver")
    causes += _pool_name(str(pool.get("name") or ""), "spec.pool.name")
    if int(pool.get("resourceSliceCount") or 0) <= 0:
        causes.append(_invalid("spec.pool.resourceSliceCount", pool.get("resourceSliceCount") or 0,
                               "must be greater than zero"))
    if int(pool.get("generation") or 0) < 0:
        causes.append(_invalid("spec.pool.generation", pool.get("generation"), "must be greater than or equal to 0"))
    if old is not None:
        old_spec = _dict(old.get("spec"))
        for field, new_value, old_value in (
                ("spec.pool.name", pool.get("name"), _dict(old_spec.get("pool")).get("name")),
                ("spec.driver", spec.get("driver"), old_spec.get("driver")),
                ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName"))):
            if new_value != old_value:
                causes.append(_invalid(field, new_value, "field is immutable"))
    causes += _node_choice(spec)
    causes += _devices(spec.get("devices"))
    return causes


def _node_choice(spec: dict[str, Any]) -> list[Cause]:
    chosen = [f"`{name}`" for name in _NODE_FIELDS if spec.get(name) not in (None, False, "")]
    if not chosen:
        return [errs.cause("FieldValueRequired", f"Required value: {NODE_CHOICE}", "spec")]
    if len(chosen) > 1:
        return [_invalid("spec", "{" + ", ".join(chosen) + "}", f"{NODE_CHOICE}, but multiple fields are set")]
    return []


def _devices(devices: Any) -> list[Cause]:
    items = devices if isinstance(devices, list) else []
    causes: list[Cause] = []
    if len(items) > MAX_DEVICES:
        causes.append(errs.cause("FieldValueTooMany", f"Too many: {len(items)}: must have at most {MAX_DEVICES} "
                                 "items", "spec.devices"))
    seen: set[str] = set()
    for i, device in enumerate(_dicts(items)):
        name = str(device.get("name") or "")
        causes += _device_name(name, f"spec.devices[{i}].name")
        if name in seen:
            causes.append(errs.cause("FieldValueDuplicate", f'Duplicate value: "{name}"', f"spec.devices[{i}]"))
        seen.add(name)
        for key, attribute in sorted(_dict(device.get("attributes")).items()):
            causes += _attribute(attribute, f"spec.devices[{i}].attributes[{key}]")
        for j, taint in enumerate(_dicts(device.get("taints"))):
            causes += _taint(taint, None, f"spec.devices[{i}].taints[{j}]")
    return causes


def _attribute(attribute: Any, path: str) -> list[Cause]:
    value = _dict(attribute)
    if sum(1 for _, key in _ATTRIBUTE_KINDS if key in value) == 1:
        return []
    shown = "{" + ",".join(f'"{go}":{json.dumps(value.get(key))}' for go, key in _ATTRIBUTE_KINDS) + "}"
    return [errs.cause("FieldValueInvalid", f"Invalid value: {shown}: exactly one value must be specified", path)]


def _validate_claim(obj: Obj, old: Obj | None) -> list[Cause]:
    spec = _dict(obj.get("spec"))
    if old is not None and spec != _dict(old.get("spec")):
        return [_invalid("spec", spec, "field is immutable")]
    requests = list(_dicts(_dict(spec.get("devices")).get("requests")))
    causes = [c for i, r in enumerate(requests) for c in _request(r, f"spec.devices.requests[{i}]")]
    return causes + _claim_status(_dict(obj.get("status")), _dict((old or {}).get("status")), requests)


def _request(request: dict[str, Any], path: str) -> list[Cause]:
    causes = _device_name(str(request.get("name") or ""), f"{path}.name")
    exact, first = request.get("exactly"), request.get("firstAvailable")
    choice = "exactly one of `exactly` or `firstAvailable` is required"
    if exact is None and not first:
        return [*causes, errs.cause("FieldValueRequired", f"Required value: {choice}", path)]
    if exact is not None and first:
        return [*causes, _invalid(path, None, f"{choice}, but multiple fields are set")]
    if isinstance(exact, dict):
        if not exact.get("deviceClassName"):
            causes.append(errs.cause("FieldValueRequired", "Required value", f"{path}.exactly.deviceClassName"))
        for j, toleration in enumerate(_dicts(exact.get("tolerations"))):
            causes += _toleration(toleration, f"{path}.exactly.tolerations[{j}]")
    return causes


def _toleration(toleration: dict[str, Any], path: str) -> list[Cause]:
    causes = label_name(str(toleration["key"]), f"{path}.key") if toleration.get("key") else []
    operator, value = toleration.get("operator"), str(toleration.get("value") or "")
    if operator == "Exists" and value:
        causes.append(_invalid(f"{path}.value", value, "must be empty for operator `Exists`"))
    elif operator == "Equal":
        causes += _label_value(value, f"{path}.value")
    elif operator not in ("Exists", "Equal"):
        causes.append(errs.cause("FieldValueNotSupported", f'Unsupported value: "{operator}": supported values: '
                                 '"Equal", "Exists"', f"{path}.operator"))
    effect = toleration.get("effect")
    if effect and effect not in EFFECTS:
        causes.append(errs.cause("FieldValueNotSupported", f'Unsupported value: "{effect}": supported values: '
                                 f"{_EFFECTS_TEXT}", f"{path}.effect"))
    return causes


def _claim_status(status: dict[str, Any], old: dict[str, Any], requests: list[dict[str, Any]]) -> list[Cause]:
    allocation, old_allocation = status.get("allocation"), old.get("allocation")
    causes: list[Cause] = []
    if status.get("reservedFor") and not allocation:
        causes.append(errs.cause("FieldValueForbidden", "Forbidden: may not be specified when `allocated` is not "
                                 "set", "status.reservedFor"))
    if allocation and old_allocation:
        if allocation != old_allocation:
            causes.append(_invalid("status.allocation", allocation, "field is immutable"))
        return causes
    names = _request_names(requests)
    results = _dict(_dict(allocation).get("devices")).get("results")
    for i, result in enumerate(_dicts(results)):
        causes += _result(result, f"status.allocation.devices.results[{i}]", names)
    for i, ref in enumerate(_dicts(status.get("reservedFor"))):
        causes += [errs.cause("FieldValueRequired", "Required value", f"status.reservedFor[{i}].{key}")
                   for key in ("resource", "name", "uid") if not ref.get(key)]
    return causes


def _request_names(requests: list[dict[str, Any]]) -> set[str]:
    names = {str(r.get("name")) for r in requests}
    return names | {f"{r.get('name')}/{sub.get('name')}" for r in requests for sub in _dicts(r.get("firstAvailable"))}


def _result(result: dict[str, Any], path: str, names: set[str]) -> list[Cause]:
    causes: list[Cause] = []
    request = str(result.get("request") or "")
    if request not in names:
        causes.append(_invalid(f"{path}.request", request, "must be the name of a request in the claim or the "
                               "name of a request and a subrequest separated by '/'"))
    causes += _driver_name(str(result.get("driver") or ""), f"{path}.driver")
    causes += _pool_name(str(result.get("pool") or ""), f"{path}.pool")
    return causes + _device_name(str(result.get("device") or ""), f"{path}.device")


# --- names -----------------------------------------------------------------------------------------------

def label_name(key: str, path: str) -> list[Cause]:
    """metav1validation.ValidateLabelName: an optional DNS-subdomain prefix, a name part of <= 63 characters."""
    prefix, _, name = key.rpartition("/")
    causes: list[Cause] = []
    if "/" in key and not prefix:
        causes.append(_invalid(path, key, "prefix part must be non-empty"))
    elif prefix and (not _DNS_SUBDOMAIN.match(prefix) or len(prefix) > 253):
        causes.append(_invalid(path, key, f"prefix part {DNS_SUBDOMAIN_MSG}"))
    if not name:
        causes.append(_invalid(path, key, "name part must be non-empty"))
    elif len(name) > 63:
        causes.append(_invalid(path, key, "name part must be no more than 63 bytes"))
    if not _NAME_PART.match(name):
        causes.append(_invalid(path, key, NAME_PART_MSG))
    return causes


def _label_value(value: str, path: str) -> list[Cause]:
    causes = [_invalid(path, value, "must be no more than 63 bytes")] if len(value) > 63 else []
    if not _LABEL_VALUE.match(value):
        causes.append(_invalid(path, value, LABEL_VALUE_MSG))
    return causes


def _driver_name(name: str, path: str) -> list[Cause]:
    if not name:
        return [errs.cause("FieldValueRequired", "Required value", path)]
    causes = [errs.cause("FieldValueTooLong", "Too long: may not be more than 63 bytes", path)] if len(name) > 63 \
        else []
    if not _DNS_SUBDOMAIN.match(name):
        causes.append(_invalid(path, name, DNS_SUBDOMAIN_MSG))
    return causes


def _pool_name(name: str, path: str) -> list[Cause]:
    if not name:
        return [errs.cause("FieldValueRequired", "Required value", path)]
    causes = [errs.cause("FieldValueTooLong", "Too long: may not be more than 253 bytes", path)] \
        if len(name) > 253 else []
    return causes + [_invalid(path, name, DNS_SUBDOMAIN_MSG) for part in name.split("/")
                     if not _DNS_SUBDOMAIN.match(part)]


def _device_name(name: str, path: str) -> list[Cause]:
    if not name:
        return [errs.cause("FieldValueRequired", "Required value", path)]
    if len(name) > 63:
        return [_invalid(path, name, "must be no more than 63 characters")]
    return [] if _DNS_LABEL.match(name) else [_invalid(path, name, DNS_LABEL_MSG)]


def _optional(holder: dict[str, Any], key: str, path: str, check: Any) -> list[Cause]:
    return check(str(holder[key]), path) if holder.get(key) is not None else []


def _invalid(path: str, value: Any, why: str) -> Cause:
    shown = json.dumps(value, separators=(",", ":")) if not isinstance(value, bool) else str(value).lower()
    return errs.cause("FieldValueInvalid", f"Invalid value: {shown}: {why}", path)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def parse_time(text: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (``...Z``), or None."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
