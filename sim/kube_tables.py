"""Server-side printing: the meta.k8s.io Table (what ``kubectl get`` shows) and PartialObjectMetadata.

A client asks with ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` (kubectl adds the v1beta1 Table and plain
JSON after it as fallbacks); the first media range the server can give wins, and none it can give is 406 (exchange 30
in shared/data/kube-apiserver). Each row has the kind's cells (the wide ones too: ``priority`` 1 columns, which
kubectl shows with ``-o wide``) and, per ``includeObject`` (``None``, ``Metadata`` the default, ``Object``), the
object. Columns as kube-apiserver's printers (pkg/printers/internalversion) make them for nodes (Status with
SchedulingDisabled, Roles from node-role labels), pods, events, jobs (v1.36's, with Status), configmaps, namespaces,
leases; custom resources by their CRD version's ``additionalPrinterColumns`` (simple JSONPath: fields, ``[n]``,
``[*]``, ``[?(@.f=="v")]``; Name first, Age alone when the CRD names none). Every other kind: Name and Age. Not
served: Tables on a watch (``kubectl get -w`` gets plain objects), row conditions other than a finished pod's.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from sim import kube_errors as errs
from sim.kube_resources import ResourceType

Obj = dict[str, Any]
META_GROUP = "meta.k8s.io"
PLAIN = "json"
AVAILABLE = "application/json, application/yaml, application/vnd.kubernetes.protobuf"
_PLAIN_TYPES = ("application/json", "application/yaml", "application/vnd.kubernetes.protobuf", "application/*", "*/*",
                "*")
_VIEWS = ("Table", "PartialObjectMetadata", "PartialObjectMetadataList")

DESCRIPTIONS = {  # kube-apiserver v1.28's column descriptions (shared/data/kube-apiserver/30-table-format.json)
    'name': (
        'Name must be unique within a namespace. Is required when creating resources, although some resources '
        'may allow a client to request the generation of an appropriate name automatically. Name is primarily '
        'intended for creation idempotence and configuration definition. Cannot be updated. More info: '
        'https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names'),
    'node:Status': (
        'The status of the node'),
    'node:Roles': (
        'The roles of the node'),
    'age': (
        'CreationTimestamp is a timestamp representing the server time when this object was created. It is not '
        'guaranteed to be set in happens-before order across separate operations. Clients may not set this '
        'value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for '
        'lists. More info: '
        'https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata'),
    'node:Version': (
        'Kubelet Version reported by the node.'),
    'node:Internal-IP': (
        'List of addresses reachable to the node. Queried from cloud provider, if available. More info: '
        'https://kubernetes.io/docs/concepts/nodes/node/#addresses Note: This field is declared as mergeable, '
        'but the merge key is not sufficiently unique, which can cause data corruption when it is merged. '
        'Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. '
        'Consumers should assume that addresses can change during the lifetime of a Node. However, there are '
        "some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own "
        'status or consumers of the downward API (status.hostIP).'),
    'node:External-IP': (
        'List of addresses reachable to the node. Queried from cloud provider, if available. More info: '
        'https://kubernetes.io/docs/concepts/nodes/node/#addresses Note: This field is declared as mergeable, '
        'but the merge key is not sufficiently unique, which can cause data corruption when it is merged. '
        'Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. '
        'Consumers should assume that addresses can change during the lifetime of a Node. However, there are '
        "some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own "
        'status or consumers of the downward API (status.hostIP).'),
    'node:OS-Image': (
        'OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).'),
    'node:Kernel-Version': (
        "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64)."),
    'node:Container-Runtime': (
        'ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).'),
    'pod:Ready': (
        'The aggregate readiness state of this pod for accepting traffic.'),
    'pod:Status': (
        'The aggregate status of the containers in this pod.'),
    'pod:Restarts': (
        'The number of times the containers in this pod have been restarted and when the last container in this '
        'pod has restarted.'),
    'pod:IP': (
        'podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.'),
    'pod:Node': (
        'NodeName is a request to schedule this pod onto a specific node. If it is non-empty, the scheduler '
        'simply schedules this pod onto that node, assuming that it fits resource requirements.'),
    'pod:Nominated Node': (
        'nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled '
        'right away as preemption victims receive their graceful termination periods. This field does not '
        'guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere '
        'if other nodes become available sooner. Scheduler may also decide to give the resources on this node to '
        'a higher priority pod that is created after preemption. As a result, this field may be different than '
        'PodSpec.nodeName when the pod is scheduled.'),
    'pod:Readiness Gates': (
        'If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its '
        'containers are ready AND all conditions specified in the readiness gates have status equal to "True" '
        'More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates'),
    'configmap:Data': (
        "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or "
        "'.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must "
        'not overlap with the keys in the BinaryData field, this is enforced during validation process.'),
}

DESCRIPTIONS.update({  # not in the capture: kube-apiserver's text for them (shortened where it runs long)
    "namespace:Status": "The status of the namespace",
    "lease:Holder": "holderIdentity contains the identity of the holder of a current lease.",
    "event:Last Seen": "The time at which the most recent occurrence of this event was recorded.",
    "event:Type": "Type of this event (Normal, Warning), new types could be added in the future",
    "event:Reason": "This should be a short, machine understandable string that gives the reason for the transition "
                    "into the object's current status.",
    "event:Object": "The object that this event is about.",
    "event:Subobject": "If referring to a piece of an object instead of an entire object, this string should contain "
                       "a valid JSON/Go field access statement, such as desiredState.manifest.containers[2].",
    "event:Source": "The component reporting this event. Should be a short machine understandable string.",
    "event:Message": "A human-readable description of the status of this operation.",
    "event:First Seen": "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
    "event:Count": "The number of times this event has occurred.",
    "job:Status": "Status of the job.",
    "job:Completions": "The number of pods which reached phase Succeeded. The value increases monotonically for a "
                       "given spec. However, it may decrease in reaction to scale down of elastic indexed jobs.",
    "job:Duration": "Time required to complete the job.",
    "job:Containers": "Names of each container in the template.",
    "job:Images": "Images referenced by each container in the template.",
    "job:Selector": "A label query over pods that should match the pod count. Normally, the system sets this field "
                    "for you.",
})

# kind -> its columns after Name: (column, type, priority); "age" is the Age column.
COLUMNS: dict[str, list[tuple[str, str, int]]] = {
    "Node": [("Status", "string", 0), ("Roles", "string", 0), ("age", "string", 0), ("Version", "string", 0),
             ("Internal-IP", "string", 1), ("External-IP", "string", 1), ("OS-Image", "string", 1),
             ("Kernel-Version", "string", 1), ("Container-Runtime", "string", 1)],
    "Pod": [("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "string", 0), ("age", "string", 0),
            ("IP", "string", 1), ("Node", "string", 1), ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1)],
    "Event": [("Last Seen", "string", 0), ("Type", "string", 0), ("Reason", "string", 0), ("Object", "string", 0),
              ("Subobject", "string", 1), ("Source", "string", 1), ("Message", "string", 0),
              ("First Seen", "string", 1), ("Count", "string", 1), ("name", "string", 1)],
    "Job": [("Status", "string", 0), ("Completions", "string", 0), ("Duration", "string", 0), ("age", "string", 0),
            ("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)],
    "ConfigMap": [("Data", "string", 0), ("age", "string", 0)],
    "Namespace": [("Status", "string", 0), ("age", "string", 0)],
    "Lease": [("Holder", "string", 0), ("age", "string", 0)],
}

_POD_DONE = {"Succeeded": {"type": "Completed", "status": "True", "reason": "Succeeded",
                           "message": "The pod has completed successfully."},
             "Failed": {"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}}


# ---- negotiation -----------------------------------------------------------------------------------------------

def negotiate(accept: str) -> tuple[str, str]:
    """(view, meta.k8s.io version): ("json", "") for the object itself, ("Table", "v1"), ("PartialObjectMetadata",
    "v1")...; 406 when no media range of ``accept`` is one the server gives."""
    if not accept.strip():
        return PLAIN, ""
    for media in accept.split(","):
        kind, *raw = [part.strip() for part in media.split(";")]
        params = dict(p.split("=", 1) for p in raw if "=" in p)
        params = {k.strip().lower(): v.strip() for k, v in params.items()}
        if "as" in params:
            if kind.lower() in ("application/json", "application/yaml") and params["as"] in _VIEWS \
                    and params.get("g") == META_GROUP and params.get("v") in ("v1", "v1beta1"):
                return params["as"], params["v"]
            continue
        if kind.lower() in _PLAIN_TYPES:
            return PLAIN, ""
    raise errs.ApiError(406, errs.status(406, f"406: Not Acceptable\n\nAvailable representations: {AVAILABLE}",
                                         "NotAcceptable", {}))


def view_of_one(rt: ResourceType, obj: Obj, view: str, version: str, include: str, now: datetime | None = None) -> Obj:
    if view == "Table":
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        return table(rt, [obj], {"resourceVersion": rv}, version, include, now)
    return partial(obj, version)


def view_of_list(rt: ResourceType, listed: Obj, view: str, version: str, include: str,
                 now: datetime | None = None) -> Obj:
    items, meta = listed.get("items") or [], listed.get("metadata") or {}
    if view == "Table":
        return table(rt, items, meta, version, include, now)
    return {"kind": "PartialObjectMetadataList", "apiVersion": f"{META_GROUP}/{version}", "metadata": meta,
            "items": [partial(o, version) for o in items]}


def partial(obj: Obj, version: str) -> Obj:
    return {"kind": "PartialObjectMetadata", "apiVersion": f"{META_GROUP}/{version}",
            "metadata": obj.get("metadata") or {}}


# ---- the Table -------------------------------------------------------------------------------------------------

def table(rt: ResourceType, objs: list[Obj], meta: Obj, version: str, include: str = "",
          now: datetime | None = None) -> Obj:
    now = now or datetime.now(UTC)
    columns, cells = _columns(rt), _cells_for(rt)
    rows = []
    for obj in objs:
        row: Obj = {"cells": cells(obj, now)}
        if rt.kind == "Pod" and not rt.custom:
            done = _POD_DONE.get(str((obj.get("status") or {}).get("phase", "")))
            if done is not None:
                row["conditions"] = [done]
        row["object"] = None if include == "None" else obj if include == "Object" else partial(obj, version)
        rows.append(row)
    return {"kind": "Table", "apiVersion": f"{META_GROUP}/{version}", "metadata": meta, "columnDefinitions": columns,
            "rows": rows}


def _column(name: str, type_: str, description: str, priority: int = 0, format_: str = "") -> Obj:
    return {"name": name, "type": type_, "format": format_, "description": description, "priority": priority}


def _columns(rt: ResourceType) -> list[Obj]:
    out = [_column("Name", "string", DESCRIPTIONS["name"], format_="name")]
    if rt.custom:
        for col in rt.printer_columns or ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},):
            text = col.get("description") or \
                f"Custom resource definition column (in JSONPath format): {col['jsonPath']}"
            out.append(_column(col["name"], col.get("type", "string"), text, int(col.get("priority", 0)),
                               col.get("format", "")))
        return out
    kind, own = rt.kind.lower(), COLUMNS.get(rt.kind, [("age", "string", 0)])
    if any(name == "name" for name, _, _ in own):
        out = []  # an Event's Name is its last column (wide only)
    for name, type_, priority in own:
        if name == "age":
            out.append(_column("Age", type_, DESCRIPTIONS["age"], priority))
        elif name == "name":
            out.append(_column("Name", type_, DESCRIPTIONS["name"], priority, "name"))
        else:
            out.append(_column(name, type_, DESCRIPTIONS.get(f"{kind}:{name}", ""), priority))
    return out


def _cells_for(rt: ResourceType) -> Any:
    if rt.custom:
        return lambda obj, now: _custom_cells(rt, obj, now)
    printer = {"Node": _node, "Pod": _pod, "Event": _event, "Job": _job, "ConfigMap": _configmap,
               "Namespace": _namespace, "Lease": _lease}.get(rt.kind)
    if printer is None:
        return lambda obj, now: [_name(obj), _age(obj, now)]
    return printer


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _age(obj: Obj, now: datetime) -> str:
    return since((obj.get("metadata") or {}).get("creationTimestamp"), now)


def _node(obj: Obj, now: datetime) -> list[Any]:
    spec, status, labels = obj.get("spec") or {}, obj.get("status") or {}, (obj.get("metadata") or {}).get("labels")
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    shown = [("Ready" if ready[0].get("status") == "True" else "NotReady")] if ready else ["Unknown"]
    if spec.get("unschedulable"):
        shown.append("SchedulingDisabled")
    roles = set()
    for key, value in (labels or {}).items():
        if key.startswith("node-role.kubernetes.io/") and key.split("/", 1)[1]:
            roles.add(key.split("/", 1)[1])
        elif key == "kubernetes.io/role" and value:
            roles.add(str(value))
    info = status.get("nodeInfo") or {}

    def address(kind: str) -> str:
        found = [a.get("address") for a in status.get("addresses") or [] if a.get("type") == kind]
        return str(found[0]) if found else "<none>"

    return [_name(obj), ",".join(shown), ",".join(sorted(roles)) or "<none>", _age(obj, now),
            str(info.get("kubeletVersion", "")), address("InternalIP"), address("ExternalIP"),
            info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>"]


def _pod(obj: Obj, now: datetime) -> list[Any]:
    spec, status, meta = obj.get("spec") or {}, obj.get("status") or {}, obj.get("metadata") or {}
    reason = str(status.get("reason") or status.get("phase") or "")
    restarts, ready, running, last_restart = 0, 0, False, ""
    for container in reversed(status.get("containerStatuses") or []):
        restarts += int(container.get("restartCount") or 0)
        ended = ((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        last_restart = max(last_restart, str(ended or ""))
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated")
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated is not None and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated is not None:
            reason = f"Signal:{terminated['signal']}" if terminated.get("signal") else \
                f"ExitCode:{terminated.get('exitCode', 0)}"
        elif container.get("ready") and "running" in state:
            running, ready = True, ready + 1
    if reason == "Completed" and running:
        has_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        reason = "Running" if has_ready else "NotReady"
    if meta.get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    shown_restarts = f"{restarts} ({since(last_restart, now)} ago)" if restarts and last_restart else str(restarts)
    ips = [p.get("ip") for p in status.get("podIPs") or [] if p.get("ip")] or [status.get("podIP") or ""]
    gates = spec.get("readinessGates") or []
    if gates:
        true = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
        shown_gates = f"{sum(1 for g in gates if g.get('conditionType') in true)}/{len(gates)}"
    else:
        shown_gates = "<none>"
    return [_name(obj), f"{ready}/{len(spec.get('containers') or [])}", reason, shown_restarts, _age(obj, now),
            ips[0] or "<none>", spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>",
            shown_gates]


def _event(obj: Obj, now: datetime) -> list[Any]:
    if "regarding" in obj or "note" in obj:  # events.k8s.io/v1's shape: the core one's fields by their old names
        from sim.kube_admission import event_to_core
        obj = event_to_core(obj)
    first = since(obj.get("firstTimestamp") or obj.get("eventTime"), now)
    last = since(obj["lastTimestamp"], now) if obj.get("lastTimestamp") else first
    count = int(obj.get("count") or 0)
    series = obj.get("series")
    if isinstance(series, dict):
        last, count = since(series.get("lastObservedTime"), now), int(series.get("count") or 0)
    elif count == 0:
        count = 1
    involved = obj.get("involvedObject") or {}
    kind = str(involved.get("kind", "")).lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = obj.get("source") or {}
    component = source.get("component") or obj.get("reportingComponent") or ""
    host = source.get("host") or obj.get("reportingInstance") or ""
    shown_source = "" if not (component or host) else ", ".join([component, host] if host else [component])
    return [last, obj.get("type", ""), obj.get("reason", ""), target, involved.get("fieldPath", ""), shown_source,
            str(obj.get("message", "")).strip(), first, count, _name(obj)]


def _job(obj: Obj, now: datetime) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    succeeded = int(status.get("succeeded") or 0)
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{spec['completions']}"
    elif int(spec.get("parallelism") or 0) > 1:
        completions = f"{succeeded}/1 of {spec['parallelism']}"
    else:
        completions = f"{succeeded}/1"
    started, finished = _parse(status.get("startTime") or ""), _parse(status.get("completionTime") or "")
    shown_duration = "" if started is None else human(((finished or now) - started).total_seconds())
    conditions = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
    if "Complete" in conditions:
        shown = "Complete"
    elif "Failed" in conditions:
        shown = "Failed"
    elif (obj.get("metadata") or {}).get("deletionTimestamp"):
        shown = "Terminating"
    else:
        shown = next((c for c in ("Suspended", "FailureTarget", "SuccessCriteriaMet") if c in conditions), "Running")
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    return [_name(obj), shown, completions, shown_duration, _age(obj, now),
            ",".join(str(c.get("name", "")) for c in containers), ",".join(str(c.get("image", "")) for c in containers),
            _selector(spec.get("selector"))]


def _selector(selector: Any) -> str:
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return "<none>"
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), ",".join(expr.get("values") or [])
        parts.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": str(key),
                      "DoesNotExist": f"!{key}"}.get(str(op), str(key)))
    return ",".join(parts)


def _configmap(obj: Obj, now: datetime) -> list[Any]:
    return [_name(obj), len(obj.get("data") or {}) + len(obj.get("binaryData") or {}), _age(obj, now)]


def _namespace(obj: Obj, now: datetime) -> list[Any]:
    return [_name(obj), str((obj.get("status") or {}).get("phase", "")), _age(obj, now)]


def _lease(obj: Obj, now: datetime) -> list[Any]:
    return [_name(obj), str((obj.get("spec") or {}).get("holderIdentity") or ""), _age(obj, now)]


# ---- custom resources: additionalPrinterColumns ------------------------------------------------------------------

def _custom_cells(rt: ResourceType, obj: Obj, now: datetime) -> list[Any]:
    cells: list[Any] = [_name(obj)]
    for col in rt.printer_columns or ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},):
        found = jsonpath(obj, str(col.get("jsonPath", "")))
        if not found:
            cells.append(None)
            continue
        value, kind = found[0], col.get("type", "string")
        if kind == "string":
            cells.append(value if isinstance(value, str) else json.dumps(value, separators=(",", ":")))
        elif kind == "integer":
            cells.append(int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None)
        elif kind == "number":
            cells.append(value if isinstance(value, int | float) and not isinstance(value, bool) else None)
        elif kind == "boolean":
            cells.append(value if isinstance(value, bool) else None)
        elif kind == "date":
            cells.append(since(value, now) if isinstance(value, str) and _parse(value) is not None else None)
        else:
            cells.append(None)
    return cells


_STEP = re.compile(r"""\.(?P<field>[A-Za-z0-9_-]+)|\[(?P<index>-?\d+|\*)\]|"""
                   r"""\[\?\(@\.(?P<path>[A-Za-z0-9_.-]+)\s*(?P<op>==|!=)\s*(?P<q>["'])(?P<value>.*?)(?P=q)\)\]""")


def jsonpath(obj: Any, path: str) -> list[Any]:
    """The values a CRD column's simple JSONPath selects (``.a.b``, ``[0]``, ``[*]``, ``[?(@.type=="X")]``)."""
    path = path.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    current, at = [obj], 0
    while at < len(path):
        step = _STEP.match(path, at)
        if step is None:
            return []
        at = step.end()
        found: list[Any] = []
        for value in current:
            if step["field"] is not None:
                if isinstance(value, dict) and step["field"] in value:
                    found.append(value[step["field"]])
            elif step["index"] is not None:
                if isinstance(value, list):
                    if step["index"] == "*":
                        found += value
                    elif -len(value) <= int(step["index"]) < len(value):
                        found.append(value[int(step["index"])])
            elif isinstance(value, list):
                for item in value:
                    got = jsonpath(item, "." + step["path"])
                    if bool(got and _text(got[0]) == step["value"]) == (step["op"] == "=="):
                        found.append(item)
        current = found
    return current


# ---- time ------------------------------------------------------------------------------------------------------

def _text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def _parse(text: Any) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def since(stamp: Any, now: datetime) -> str:
    """translateTimestampSince: how long ago, as kubectl's AGE column says it; ``<unknown>`` with no time."""
    when = _parse(stamp) if stamp else None
    if when is None:
        return "<unknown>"
    return human((now - when).total_seconds())


def human(seconds_f: float) -> str:
    """k8s.io/apimachinery's duration.HumanDuration."""
    seconds = int(seconds_f)
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"
