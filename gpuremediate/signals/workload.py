"""The workload signal (issue 29): pods on one node failing with GPU errors — a node whose GPU is dead but whose
exporter shows nothing keeps taking pods and failing them ("a node with one dead GPU kept showing Ready and
rejected hundreds of pods in under two hours").

Read from one watch of the cluster's Failed pods (``fieldSelector=status.phase=Failed``, every namespace), each
reduced at once to what this needs (``reduce``: node, when, the GPU error it names, or nothing), so the cache holds
a few strings per failed pod, never the pods. A failure counts when it names the GPU:

- the kubelet refused the pod at admission for a GPU (``status.reason`` ``UnexpectedAdmissionError`` whose message
  names an NVIDIA resource, or a device plugin's ``Allocate failed``: it offered a device it cannot hand out);
- a container ended with a termination message or reason naming the GPU as unusable: no CUDA device, devices
  busy or unavailable, an uncorrectable ECC error, a lost or fallen-off GPU, NVML failing to initialise.

An application's own CUDA bug (an illegal memory access, out of memory) is not the node's fault and does not count.

A failed preflight (issue 46) is read here too: the init container ``gpuremediate-preflight`` (the webhook's) ended
non-zero with a ``preflight failed: GPU ...`` line (``vocab.preflight``). Its "unknown" line is never a failure, and
nothing else it says is matched against the GPU errors above. A pod whose restartPolicy restarts its init container
never reaches Failed: a second watch reads the Pending pods the webhook labelled (``gpuremediate.io/preflight``).
This module reads (failed pods → failures by node); ``policy.workload`` judges them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuremediate.kube.cache import FAILED_PODS, Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import PODS
from gpuremediate.vocab.preflight import CONTAINER_NAME, FAILED, POD_LABEL, parse_message

ADMISSION = "admission"
CONTAINER = "container"
PREFLIGHT = "preflight"  # the preflight init container failed a GPU
NOT_PREFLIGHT = frozenset({ADMISSION, CONTAINER})
PREFLIGHT_PENDING = "status.phase=Pending"  # with label POD_LABEL: a preflight restarted in place
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"

# A container's termination message or reason that says the GPU itself is unusable (CUDA runtime/driver API
# error names and their messages, NVML's, the driver's).
GPU_UNUSABLE = re.compile("|".join((
    r"no CUDA-capable device is detected", r"CUDA_ERROR_NO_DEVICE", r"cudaErrorNoDevice",
    r"CUDA-capable device\(s\) is/are busy or unavailable", r"cudaErrorDevicesUnavailable",
    r"CUDA_ERROR_ECC_UNCORRECTABLE", r"cudaErrorECCUncorrectable", r"uncorrectable ECC error encountered",
    r"GPU is lost", r"fallen off the bus", r"Failed to initialize NVML", r"NVML_ERROR_GPU_IS_LOST",
    r"CUDA_ERROR_SYSTEM_NOT_READY", r"cudaErrorSystemNotReady", r"system not yet initialized",
)), re.IGNORECASE)
GPU_RESOURCE = re.compile(r"nvidia\.com/|Allocate failed|unhealthy devices", re.IGNORECASE)
MAX_TEXT = 300  # of a failure's message kept for the finding


@dataclass(frozen=True)
class Failure:
    """One failed pod, as much of it as the signal needs."""

    pod: str  # namespace/name
    node: str
    at: float  # when it failed (its condition's or container's time; 0: unknown)
    how: str  # ADMISSION | CONTAINER | PREFLIGHT
    text: str  # what it said
    uid: str = ""  # PREFLIGHT: the pod's uid and its controller / JobSet (apiVersion, kind, name, uid): who is told
    owners: tuple[tuple[str, str, str, str], ...] = ()


def reduce(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The informer's transform: a Failed pod → the few fields ``failure_of`` reads (a non-GPU failure keeps only
    its name: the cache stays small however many pods fail)."""
    meta = pod.get("metadata") or {}
    kept: dict[str, Any] = {"metadata": {"name": meta.get("name", ""), "namespace": meta.get("namespace", ""),
                                         "resourceVersion": meta.get("resourceVersion", "")}}
    found = _gpu_error(pod)
    if found is not None:
        # A pod refused at admission may carry no status time: its creation then (admission follows at once). Never
        # "when this watch saw it": a restarted controller relists last week's failures.
        at = _failed_at(pod) or _seconds(meta.get("creationTimestamp") or "")
        kept["gpuFailure"] = {"node": str((pod.get("spec") or {}).get("nodeName") or ""), "at": at,
                              "how": found[0], "text": found[1][:MAX_TEXT]}
        if found[0] == PREFLIGHT:
            kept["gpuFailure"] |= {"uid": str(meta.get("uid") or ""), "owners": _owners(meta)}
    return kept


def _owners(meta: Mapping[str, Any]) -> list[list[str]]:
    found = [[str(r.get("apiVersion", "")), str(r["kind"]), str(r["name"]), str(r.get("uid", ""))]
             for r in meta.get("ownerReferences") or [] if r.get("controller") and r.get("kind") and r.get("name")]
    jobset = (meta.get("labels") or {}).get(JOBSET_LABEL)
    return found + ([["jobset.x-k8s.io/v1alpha2", "JobSet", str(jobset), ""]] if jobset else [])


def failure_of(reduced: Mapping[str, Any]) -> Failure | None:
    found = reduced.get("gpuFailure")
    if not isinstance(found, Mapping) or not found.get("node"):
        return None
    meta = reduced.get("metadata") or {}
    owners = tuple((str(a), str(k), str(n), str(u)) for a, k, n, u in found.get("owners") or [])
    return Failure(f"{meta.get('namespace', '')}/{meta.get('name', '')}", str(found["node"]), float(found["at"]),
                   str(found["how"]), str(found["text"]), str(found.get("uid") or ""), owners)


def _gpu_error(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    status = pod.get("status") or {}
    message = str(status.get("message") or "")
    if status.get("reason") == "UnexpectedAdmissionError" and GPU_RESOURCE.search(message):
        return ADMISSION, message
    for container in (*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])):
        if container.get("name") == CONTAINER_NAME:
            failed = _preflight_failed(container)
            if failed:
                return PREFLIGHT, failed
            continue  # its "unknown", or anything else it says, is no GPU error
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            ended = state.get("terminated") or {}
            text = f"{ended.get('reason') or ''} {ended.get('message') or ''}".strip()
            if ended.get("exitCode") not in (None, 0) and GPU_UNUSABLE.search(text):
                return CONTAINER, f"container {container.get('name', '')}: {text}"
    return None


def _preflight_failed(container: Mapping[str, Any]) -> str:
    """The preflight's ``failed`` line, from its last or current termination; "" when it passed or could not tell."""
    for state in (container.get("state") or {}, container.get("lastState") or {}):
        ended = state.get("terminated") or {}
        message = str(ended.get("message") or "")
        parsed = parse_message(message)
        if ended.get("exitCode") not in (None, 0) and parsed is not None and parsed.result == FAILED:
            return message.strip().splitlines()[0]
    return ""


def _failed_at(pod: Mapping[str, Any]) -> float:
    status = pod.get("status") or {}
    stamps = [c.get("lastTransitionTime") for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    for container in (*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])):
        stamps.append(((container.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        stamps.append(((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
    stamps.append(status.get("startTime"))
    return max((_seconds(s) for s in stamps if s), default=0.0)


def _seconds(stamp: Any) -> float:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class WorkloadSignal:
    """The GPU failures of the cluster's Failed pods, by node; fed by an informer's handlers (any thread). A detect
    pass asks once per node (``policy.workload.WorkloadJudge``): only its node's failures, never a scan of the
    cluster's."""

    def __init__(self) -> None:
        self._by_node: dict[str, dict[str, Failure]] = {}  # node -> pod -> its failure
        self._node_of: dict[str, str] = {}  # pod -> the node its failure is filed under
        self._lock = threading.Lock()

    def seen(self, reduced: Mapping[str, Any]) -> None:
        failure = failure_of(reduced)
        meta = reduced.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        with self._lock:
            self._drop(key)
            if failure is not None:
                self._by_node.setdefault(failure.node, {})[key] = failure
                self._node_of[key] = failure.node

    def _drop(self, key: str) -> None:
        node = self._node_of.pop(key, None)
        if node is not None:
            pods = self._by_node.get(node, {})
            pods.pop(key, None)
            if not pods:
                self._by_node.pop(node, None)

    def failures(self, node: str, now: float, window_s: float, hows: frozenset[str] = NOT_PREFLIGHT) -> list[Failure]:
        """The node's failures of these kinds within ``window_s``; older ones (an hour at least) are forgotten."""
        keep_s = max(window_s, 3600.0)
        with self._lock:
            for key in [k for k, f in self._by_node.get(node, {}).items() if now - f.at > keep_s]:
                self._drop(key)
            found = self._by_node.get(node, {}).values()
            return sorted((f for f in found if now - f.at <= window_s and f.how in hows), key=lambda f: (f.at, f.pod))


class FailedPodsWatch:
    """The one watch of the cluster's Failed pods, reduced as they come, feeding ``signal``; with ``preflight``, also
    the Pending pods the preflight webhook labelled (an init container restarted in place: the pod never fails)."""

    def __init__(self, client: KubeClient, signal: WorkloadSignal, preflight: bool = False) -> None:
        self.signal = signal
        self.informers = [Informer(client, PODS, field_selector=FAILED_PODS, transform=reduce)]
        if preflight:
            self.informers.append(Informer(client, PODS, label_selector=POD_LABEL, field_selector=PREFLIGHT_PENDING,
                                           transform=reduce))
        for informer in self.informers:
            informer.add_handler(on_add=signal.seen, on_update=lambda _old, new: signal.seen(new))
        self.informer = self.informers[0]

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
