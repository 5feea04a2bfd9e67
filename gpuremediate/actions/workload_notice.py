"""The workload notice (issue 29): when a GPU fault makes the controller evict or delete a pod, a Warning Event
``GPUFault`` on the pod and on its owner (its controller reference: a Job, a PyTorchJob, a LeaderWorkerSet..., and
the JobSet a Job of a JobSet belongs to, by its ``jobset.sigs.k8s.io/jobset-name`` label), naming the node, the
faulty GPUs, the fault and when it was first seen, so the job's owner sees why it died (``kubectl describe pod``,
``kubectl get events``).

Each pod and each owner is told once per fault occurrence (the record's fingerprint): a PDB's refusal retried ten
times is one notice. Nothing is written in a dry run: a person reading their pod's Events would take "would be
evicted" for an eviction. Written on the report lane (after the actions, at background priority).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuremediate.actions.events import WARNING, EventRecorder, ObjectRef
from gpuremediate.vocab.record import NodeRecord, occurrence

REASON = "GPUFault"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
MAX_REMEMBERED = 100_000  # (occurrence, object) pairs told; past it the oldest half is forgotten


@dataclass(frozen=True)
class Why:
    """What a notice says: the node, the fault, how the pod is moved."""

    node: str
    fault: str  # "XID 48 on GPU GPU-1234... (first seen 2026-12-03T09:00:00Z): <the finding's sentence>"
    how: str  # "evicted: the node is drained" / "deleted by the device taint eviction controller: ..."


def why_of(node: str, record: NodeRecord, how: str) -> Why:
    fault = record.fault
    if fault is None:
        return Why(node, f"{record.reason or 'a GPU fault'}", how)
    name = f"XID {fault.code}" if fault.kind == "xid" and fault.code else fault.kind
    gpus = ", ".join(fault.gpus) or "the node's GPUs"
    seen = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(fault.first_seen))
    return Why(node, f"{name} on GPU {gpus} (first seen {seen}): {fault.message}", how)


def pod_ref(pod: Mapping[str, Any]) -> ObjectRef:
    meta = pod.get("metadata") or {}
    return ObjectRef("v1", "Pod", str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))


def owners(pod: Mapping[str, Any]) -> Iterator[ObjectRef]:
    """The pod's controller (its controller reference), and the JobSet its Job belongs to."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") and ref.get("name"):
            yield ObjectRef(str(ref.get("apiVersion", "")), str(ref["kind"]), namespace, str(ref["name"]),
                            str(ref.get("uid", "")))
    jobset = (meta.get("labels") or {}).get(JOBSET_LABEL)
    if jobset:
        yield ObjectRef(JOBSET_API_VERSION, "JobSet", namespace, str(jobset))


class WorkloadNotice:
    """Tells each affected pod and owner once per fault occurrence; shared by the drains of one loop."""

    def __init__(self) -> None:
        self._told: dict[tuple[str, str], None] = {}  # (occurrence, object key): insertion-ordered
        self._lock = threading.Lock()

    def tell(self, events: EventRecorder, record: NodeRecord, pods: Sequence[Mapping[str, Any]], why: Why) -> int:
        """Events for ``pods`` (and their owners) not told yet of this fault; how many were written."""
        if events.dry_run or not pods:
            return 0
        fault = occurrence(record)
        written = 0
        for pod in pods:
            subject = pod_ref(pod)
            pod_message = f"node {why.node}: {why.fault}. This pod is {why.how}."
            written += self._once(events, fault, subject, pod_message)
            for owner in owners(pod):
                message = (f"its pod {subject.name} on node {why.node} is {why.how}: {why.fault}")
                written += self._once(events, fault, owner, message)
        return written

    def _once(self, events: EventRecorder, fault: str, ref: ObjectRef, message: str) -> int:
        key = (fault, ref.key)
        with self._lock:
            if key in self._told:
                return 0
            self._told[key] = None
            if len(self._told) > MAX_REMEMBERED:
                for old in list(self._told)[: MAX_REMEMBERED // 2]:
                    del self._told[old]
        events.object_event(ref, REASON, message, WARNING)
        return 1
