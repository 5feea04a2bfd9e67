"""Defaulting and validation the real apiserver applies on create/update (the subset a controller meets)."""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sim import kube_errors as errs
from sim import kube_schema
from sim.kube_resources import ResourceType
from sim.kube_store import Obj, now_time

if TYPE_CHECKING:
    from sim.kube_store import Store

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
           "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
           "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                   "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
NAME_PART_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                 "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                 "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


def _group(rt: ResourceType) -> str:
    return "" if rt.key == "events" else rt.group


def kind_label(rt: ResourceType) -> str:
    return f"{rt.kind}.{_group(rt)}" if _group(rt) else rt.kind


def raise_invalid(rt: ResourceType, name: str, causes: list[dict[str, str]]) -> None:
    if causes:
        raise errs.invalid(kind_label(rt), name, _group(rt), rt.kind, causes)


def _invalid_value(field: str, value: str, why: str) -> dict[str, str]:
    return errs.cause("FieldValueInvalid", f'Invalid value: "{value}": {why}', field)


def validate_metadata(obj: Obj) -> list[dict[str, str]]:
    meta = obj.get("metadata", {})
    causes = []
    name = meta.get("name", "")
    if not name:
        causes.append(errs.cause("FieldValueRequired", "Required value: name or generateName is required",
                                 "metadata.name"))
    elif not _DNS1123.match(name) or len(name) > 253:
        causes.append(_invalid_value("metadata.name", name, DNS_MSG))
    causes += _validate_annotation_size(meta)
    for key, value in (meta.get("labels") or {}).items():
        if not _NAME_PART.match(key.split("/")[-1]):
            causes.append(_invalid_value("metadata.labels", key, NAME_PART_MSG))
        if not isinstance(value, str) or not _LABEL_VALUE.match(value) or len(value) > 63:
            causes.append(_invalid_value("metadata.labels", str(value), LABEL_VALUE_MSG))
    return causes


ANNOTATIONS_LIMIT_B = 256 * 1024  # apimachinery's TotalAnnotationSizeLimitB: keys and values together


def _validate_annotation_size(meta: dict[str, Any]) -> list[dict[str, str]]:
    annotations = meta.get("annotations") or {}
    total = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if total <= ANNOTATIONS_LIMIT_B:
        return []
    return [errs.cause("FieldValueTooLong", f"Too long: must have at most {ANNOTATIONS_LIMIT_B} bytes",
                       "metadata.annotations")]


Validator = Callable[[ResourceType, Obj, "Obj | None"], list[dict[str, str]]]


def validate(rt: ResourceType, obj: Obj, old: Obj | None, more: Validator | None = None) -> None:
    """422 with every cause: metadata, the kind's own rules, then ``more``'s (sim.kube_dra for resource.k8s.io)."""
    causes = validate_metadata(obj)
    name = obj.get("metadata", {}).get("name", "")
    if rt.resource == "pods":
        causes += _validate_pod(obj, old)
    elif rt.resource in ("configmaps", "secrets"):
        causes += _validate_data_keys(obj)
    elif rt.key == "events":
        causes += _validate_event(obj)
    elif rt.resource == "leases":
        causes += _validate_lease(obj)
    elif rt.custom:
        causes += kube_schema.validate(obj, rt.schema, old)
    if more is not None:
        causes += more(rt, obj, old)
    if old is not None:
        causes += _validate_finalizers(obj, old)
    raise_invalid(rt, name, causes)


_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
CONFIG_KEY_MSG = ("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  "
                  "or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')")


def _validate_data_keys(obj: Obj) -> list[dict[str, str]]:
    keys = [*(obj.get("data") or {}), *(obj.get("binaryData") or {}), *(obj.get("stringData") or {})]
    return [_invalid_value(f"data[{k}]", k, CONFIG_KEY_MSG) for k in keys if not _CONFIG_KEY.match(k)]


def _validate_pod(obj: Obj, old: Obj | None) -> list[dict[str, str]]:
    containers = obj.get("spec", {}).get("containers") or []
    if not containers:
        return [errs.cause("FieldValueRequired", "Required value", "spec.containers")]
    if old is not None and len(containers) != len(old.get("spec", {}).get("containers") or []):
        return [errs.cause("FieldValueForbidden", "Forbidden: pod updates may not add or remove containers",
                           "spec.containers")]
    return []


def _validate_event(obj: Obj) -> list[dict[str, str]]:
    """legacyValidateEvent: an Event about a cluster-scoped object lives in "default"; a new-style one
    (eventTime set, as every events.k8s.io/v1 Event) may also live in "kube-system"."""
    involved = obj.get("involvedObject") or {}
    event_ns = obj.get("metadata", {}).get("namespace", "")
    involved_ns = involved.get("namespace", "")
    cluster_scoped_homes = ("default", "kube-system") if obj.get("eventTime") else ("default",)
    if involved_ns != event_ns and not (involved_ns == "" and event_ns in cluster_scoped_homes):
        return [_invalid_value("involvedObject.namespace", involved_ns, "does not match event.namespace")]
    return []


def validate_events_v1(obj: Obj) -> list[dict[str, str]]:
    causes = []
    controller = obj.get("reportingController", "")
    if not controller:
        causes += [errs.cause("FieldValueRequired", "Required value", "reportingController"),
                   _invalid_value("reportingController", "", "name part must be non-empty"),
                   _invalid_value("reportingController", "", NAME_PART_MSG)]
    if not obj.get("action"):
        causes.append(errs.cause("FieldValueRequired", "Required value", "action"))
    if not obj.get("eventTime"):
        causes.append(errs.cause("FieldValueRequired", "Required value", "eventTime"))
    return causes


def _validate_lease(obj: Obj) -> list[dict[str, str]]:
    duration = (obj.get("spec") or {}).get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        return [errs.cause("FieldValueInvalid", f"Invalid value: {duration}: must be greater than 0",
                           "spec.leaseDurationSeconds")]
    return []


MICRO_TIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_MICRO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
_SECONDS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")
LEASE_MICRO_TIMES = ("acquireTime", "renewTime")


def micro_time_error(rt: ResourceType, obj: Obj) -> str:
    """Go's time.Parse error for the first Lease MicroTime without exactly six fractional digits, or ""."""
    if rt.resource != "leases":
        return ""
    spec = obj.get("spec") or {}
    for key in LEASE_MICRO_TIMES:
        value = spec.get(key)
        if value is None or (isinstance(value, str) and _MICRO_TIME.match(value)):
            continue
        text = str(value)
        head = _SECONDS.match(text)
        rest, wanted = (text[head.end():], ".000000") if head else (text, "2006")
        return f'parsing time "{text}" as "{MICRO_TIME_LAYOUT}": cannot parse "{rest}" as "{wanted}"'
    return ""


def _validate_finalizers(obj: Obj, old: Obj) -> list[dict[str, str]]:
    if not old["metadata"].get("deletionTimestamp"):
        return []
    added = [f for f in obj["metadata"].get("finalizers", []) if f not in old["metadata"].get("finalizers", [])]
    if not added:
        return []
    listed = "[]string{" + ", ".join(f'"{f}"' for f in added) + "}"
    msg = f"Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {listed}"
    # The real server reports this cause twice (metadata is validated in two passes); the message once.
    return [errs.cause("FieldValueForbidden", msg, "metadata.finalizers")] * 2


# --- omitempty: a typed object never stores a false bool that Go's encoder omits ---------------------

_OMITEMPTY_FALSE = {
    "nodes": (("spec", "unschedulable"),),
    "pods": (("spec", "hostNetwork"), ("spec", "hostPID"), ("spec", "hostIPC")),
}


def drop_omitted(rt: ResourceType, obj: Obj) -> None:
    """Drop the ``false`` values of omitempty bools (exchange 29: an uncordoned Node has no
    spec.unschedulable at all)."""
    for path in _OMITEMPTY_FALSE.get(rt.resource, ()) if not rt.custom else ():
        parent: Any = obj
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and parent.get(path[-1]) is False:
            del parent[path[-1]]


# --- defaults on create -----------------------------------------------------------------------------

def prepare_create(rt: ResourceType, obj: Obj, toleration_s: int = 300) -> Obj:
    obj = copy.deepcopy(obj)
    mode = rt.create_status
    if mode == "clear":
        obj["status"] = {}
    elif mode == "drop":
        obj.pop("status", None)
    elif mode == "namespace":
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj["status"] = {"phase": "Active"}
    elif mode == "pod":
        _default_pod(obj, toleration_s)
    if rt.resource == "jobs":
        _default_job(obj)
    return obj


def _default_pod(obj: Obj, toleration_s: int) -> None:
    spec = obj.setdefault("spec", {})
    for key, value in (("restartPolicy", "Always"), ("terminationGracePeriodSeconds", 30),
                       ("dnsPolicy", "ClusterFirst"), ("serviceAccountName", "default"),
                       ("serviceAccount", "default"), ("securityContext", {}),
                       ("schedulerName", "default-scheduler"), ("priority", 0), ("enableServiceLinks", True),
                       ("preemptionPolicy", "PreemptLowerPriority")):
        spec.setdefault(key, value)
    _default_toleration_seconds(spec, toleration_s)
    for container in spec.get("containers") or []:
        container.setdefault("resources", {})
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", "IfNotPresent")
    obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}


def _default_toleration_seconds(spec: dict[str, Any], seconds: int) -> None:
    """The DefaultTolerationSeconds plugin: a pod not already tolerating not-ready / unreachable NoExecute
    (by key, or by an empty key) tolerates each for `seconds`, whatever else it tolerates."""
    tolerations = list(spec.get("tolerations") or [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") in (key, "", None) and t.get("effect") in ("NoExecute", "", None)
                   for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds})
    spec["tolerations"] = tolerations


DEFAULT_SA_WAIT_S = 1.0  # the plugin retries a missing "default" ServiceAccount 10 times, 100-200 ms apart


def check_service_account(store: Store, sa_rt: ResourceType, pod: Obj, namespace: str) -> None:
    """The ServiceAccount admission plugin: a pod naming a ServiceAccount its namespace lacks is refused
    (403), and the Job controller reports that refusal as FailedCreate."""
    name = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    deadline = time.monotonic() + (DEFAULT_SA_WAIT_S if name == "default" else 0.0)
    with store.changed:
        while store.get(sa_rt.key, namespace, name) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                meta = pod.get("metadata") or {}
                pod_name = meta.get("name") or meta.get("generateName") or "Unknown"
                why = f'error looking up service account {namespace}/{name}: serviceaccount "{name}" not found'
                raise errs.ApiError(403, errs.status(403, f'pods "{pod_name}" is forbidden: {why}', "Forbidden",
                                                     {"name": pod_name, "kind": "pods"}))
            store.changed.wait(remaining)


def _default_job(obj: Obj) -> None:
    """Labels and selector keyed on the Job's uid are added after the uid exists (see label_job)."""
    spec = obj.setdefault("spec", {})
    for key, value in (("parallelism", 1), ("completions", 1), ("backoffLimit", 6),
                       ("completionMode", "NonIndexed"), ("suspend", False)):
        spec.setdefault(key, value)
    spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("creationTimestamp", None)


def job_labels(name: str, uid: str) -> dict[str, str]:
    return {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
            "controller-uid": uid, "job-name": name}


def label_job(obj: Obj) -> None:
    meta = obj["metadata"]
    labels = job_labels(meta["name"], meta["uid"])
    meta["labels"] = {**labels, **(meta.get("labels") or {})}
    spec = obj["spec"]
    spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": meta["uid"]}})
    template_meta = spec["template"].setdefault("metadata", {})
    template_meta["labels"] = {**labels, **(template_meta.get("labels") or {})}


def establish_crd(crd: Obj) -> None:
    when = now_time()
    names = dict(crd["spec"]["names"])
    names.setdefault("singular", names["kind"].lower())
    names.setdefault("listKind", names["kind"] + "List")
    crd["status"] = {
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": when, "reason": "NoConflicts",
             "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": when,
             "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}],
        "acceptedNames": names,
        "storedVersions": [v["name"] for v in crd["spec"].get("versions", []) if v.get("storage")],
    }


# --- events: one storage, two API versions ----------------------------------------------------------

_V1_TO_CORE = {"note": "message", "regarding": "involvedObject", "reportingController": "reportingComponent",
               "deprecatedFirstTimestamp": "firstTimestamp", "deprecatedLastTimestamp": "lastTimestamp",
               "deprecatedCount": "count", "deprecatedSource": "source"}
_CORE_TO_V1 = {v: k for k, v in _V1_TO_CORE.items()}


def event_to_core(obj: Obj) -> Obj:
    out = {_V1_TO_CORE.get(k, k): v for k, v in obj.items()}
    out["apiVersion"], out["kind"] = "v1", "Event"
    return out


def event_from_core(obj: Obj) -> Obj:
    out = {_CORE_TO_V1.get(k, k): v for k, v in obj.items()}
    out["apiVersion"], out["kind"] = "events.k8s.io/v1", "Event"
    out.setdefault("deprecatedSource", {})
    out.setdefault("deprecatedFirstTimestamp", None)
    out.setdefault("deprecatedLastTimestamp", None)
    return out
