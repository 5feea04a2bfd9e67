"""Core/v1 Events the emulated control-plane components write (node-controller, job-controller...), with
the client-go recorder's aggregation: the same reason and message about the same object bumps `count`."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from sim.kube_store import Obj, now_time

if TYPE_CHECKING:
    from sim.kube_host import EventHost
    from sim.kube_resources import ResourceType


def object_reference(rt: ResourceType, obj: Obj) -> dict[str, Any]:
    meta = obj["metadata"]
    ref: dict[str, Any] = {"kind": rt.kind}
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    ref.update(name=meta["name"], uid=meta.get("uid", ""), apiVersion=rt.group_version)
    if rt.namespaced:
        ref["resourceVersion"] = meta.get("resourceVersion", "")
    return ref


def record_event(api: EventHost, rt: ResourceType, involved: Obj, reason: str, message: str, *,
                 component: str, event_type: str = "Normal", host: str = "") -> Obj:
    """Write (or bump) the Event; an Event about a cluster-scoped object lives in `default`."""
    events = api.type_for("", "events")
    ref = object_reference(rt, involved)
    namespace = ref.get("namespace") or "default"
    source = {"component": component, **({"host": host} if host else {})}

    identity = (namespace, ref["uid"], reason, message, component, host)
    now = now_time()
    with api.store.lock:
        known = api.recorded_events.get(identity)
        old = api.store.get(events.key, namespace, known) if known else None
        if old is not None:
            bumped = {**old, "count": int(old.get("count") or 1) + 1, "lastTimestamp": now}
            bumped["metadata"] = dict(old["metadata"])
            return api.store.update(events, bumped, old)
        body: Obj = {"apiVersion": "v1", "kind": "Event",
                     "metadata": {"name": f"{involved['metadata']['name']}.{secrets.token_hex(8)}",
                                  "namespace": namespace},
                     "involvedObject": ref, "reason": reason, "message": message, "source": source,
                     "firstTimestamp": now, "lastTimestamp": now, "count": 1, "type": event_type,
                     "eventTime": None, "reportingComponent": component, "reportingInstance": host}
        created = api.store.create(events, body, namespace)
        api.recorded_events[identity] = created["metadata"]["name"]
        return created
