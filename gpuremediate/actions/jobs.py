"""Repair and validation Jobs pinned to one node.

Names are derived from node + fault fingerprint + attempt, so a controller restarted at any point
finds the Job it already created (lookup before create; AlreadyExists means "mine") and never runs
a one-shot action twice for the same attempt.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.actions.custom import label_value
from gpuremediate.gpu_resources import GPU
from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import JOBS

JOB_LABEL = "gpuremediate.io/job"  # value: the job kind (reset-gpu, reboot, validate)
NODE_LABEL = "gpuremediate.io/node"
FAULT_ANNOTATION = "gpuremediate.io/fault"
# A reboot Job's node bootID before it: the Job alone says when its reboot happened (a node deleted and registered
# again lost the record that held it).
BOOT_ID_ANNOTATION = "gpuremediate.io/boot-id"

RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
MISSING = "missing"


@dataclass(frozen=True)
class JobSpec:
    """How to run one kind of Job (from the policy file)."""

    image: str
    command: tuple[str, ...]
    service_account: str = "gpuremediate-job"
    privileged: bool = False
    host_pid: bool = False
    timeout_s: int = 1800
    request_all_gpus: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    # A ResourceClaim (in the Job's namespace) the pod takes its GPU through: then kube-scheduler places the pod on
    # the node (a required node affinity on its name; a pod given spec.nodeName skips the claim's allocation).
    device_claim: str = ""
    claim_request: str = "gpu"


def job_name(kind: str, node: str, fingerprint: str, attempt: int) -> str:
    """A DNS-1123 label (<= 63 chars) unique per (kind, node, fingerprint, attempt)."""
    digest = hashlib.sha256(f"{node}\0{fingerprint}".encode()).hexdigest()[:8]
    suffix = f"-{digest}-{attempt}"
    prefix = f"gpur-{kind}-"
    node_part = re.sub(r"[^a-z0-9-]", "-", node.lower())[: 63 - len(prefix) - len(suffix)].strip("-")
    return f"{prefix}{node_part}{suffix}"


def build_job(
    kind: str,
    node: str,
    fingerprint: str,
    attempt: int,
    spec: JobSpec,
    *,
    namespace: str,
    gpus: int | Mapping[str, int] = 0,
    gpu_ids: Sequence[str] = (),
    boot_id: str = "",
) -> dict[str, Any]:
    """The Job (``boot_id``: the node's before a reboot, kept on the Job); with ``spec.request_all_gpus`` its
    container asks for ``gpus``: GPU resource → count (a plain number is that many ``nvidia.com/gpu``), as limits
    and requests alike (an extended resource's must match)."""
    name = job_name(kind, node, fingerprint, attempt)
    labels = {JOB_LABEL: kind, NODE_LABEL: label_value(node)}  # node names may exceed a label value's 63 chars
    env = [
        {"name": "NODE_NAME", "value": node},
        {"name": "GPU_IDS", "value": ",".join(gpu_ids)},
        *({"name": k, "value": v} for k, v in sorted(spec.env.items())),
    ]
    container: dict[str, Any] = {"name": kind, "image": spec.image, "command": list(spec.command), "env": env}
    held = gpu_resources(gpus)
    if spec.request_all_gpus and held:
        container["resources"] = {"limits": dict(held), "requests": dict(held)}
    if spec.device_claim:
        container["resources"] = {"claims": [{"name": spec.claim_request}]}
    if spec.privileged:
        container["securityContext"] = {"privileged": True}
    pod_spec: dict[str, Any] = {
        **_placement(node, spec),
        "restartPolicy": "Never",
        "serviceAccountName": spec.service_account,
        "automountServiceAccountToken": False,
        # The node is cordoned (and may carry NoExecute taints from a GPU fault): tolerate everything.
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if spec.host_pid:
        pod_spec["hostPID"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {FAULT_ANNOTATION: fingerprint, **({BOOT_ID_ANNOTATION: boot_id} if boot_id else {})},
        },
        "spec": {
            "backoffLimit": 0,
            **_disruption_policy(kind),
            "activeDeadlineSeconds": spec.timeout_s,
            "ttlSecondsAfterFinished": 24 * 3600,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


# A reboot's pod is ended by the reboot itself: the kubelet's graceful node shutdown marks it DisruptionTarget too, so
# a reboot Job never ignores a disruption (its pod would run again once the node is back: a second reboot).
REPEATABLE_KINDS = frozenset({"validate", "reset-gpu"})


def _disruption_policy(kind: str) -> dict[str, Any]:
    """A pod of a repeatable Job that was evicted or preempted (a person's ``kubectl drain``, an autoscaler) did not
    fail: the Job controller ignores it and starts another (within ``activeDeadlineSeconds``) rather than failing the
    Job at ``backoffLimit`` 0 (a repaired node quarantined as "validation failed")."""
    if kind not in REPEATABLE_KINDS:
        return {}
    return {"podFailurePolicy": {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}}


def _placement(node: str, spec: JobSpec) -> dict[str, Any]:
    """``nodeName``: pinned, bypassing the scheduler (so our own cordon does not keep the pod out). With a device
    claim the scheduler must allocate it, so a required node affinity on ``metadata.name`` pins the pod instead
    (what the DaemonSet controller does; the node is not cordoned in a GPU-level flow)."""
    if not spec.device_claim:
        return {"nodeName": node}
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term]}}},
            "resourceClaims": [{"name": spec.claim_request, "resourceClaimName": spec.device_claim}]}


def gpu_resources(gpus: int | Mapping[str, int]) -> dict[str, str]:
    """The container resource quantities for ``gpus`` (zero counts left out)."""
    counts = {GPU: gpus} if isinstance(gpus, int) else dict(gpus)
    return {name: str(count) for name, count in sorted(counts.items()) if count > 0}


def ensure_job(client: KubeClient, job: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Create the Job unless it already exists; return what the server holds."""
    return create_job_once(client, job, dry_run=dry_run)[0]


def create_job_once(
    client: KubeClient, job: Mapping[str, Any], *, dry_run: bool = False
) -> tuple[dict[str, Any], bool]:
    """(what the server holds, whether this call created it): lookup before create, AlreadyExists = found."""
    meta = job["metadata"]
    try:
        found: dict[str, Any] = client.get(JOBS, meta["name"], meta["namespace"])
        return found, False
    except errors.NotFound:
        pass
    try:
        created: dict[str, Any] = client.create(JOBS, dict(job), meta["namespace"], dry_run=dry_run)
        return created, True
    except errors.AlreadyExists:
        again: dict[str, Any] = client.get(JOBS, meta["name"], meta["namespace"])
        return again, False


def job_outcome(job: Mapping[str, Any] | None) -> str:
    """running / succeeded / failed / missing, from the Job's conditions (counts as a fallback)."""
    if job is None:
        return MISSING
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return SUCCEEDED
        if cond.get("type") == "Failed":
            return FAILED
    if status.get("succeeded"):
        return SUCCEEDED
    if status.get("failed"):
        return FAILED
    return RUNNING


def deadline_exceeded(job: Mapping[str, Any] | None) -> bool:
    """The Job controller ended the Job at its activeDeadlineSeconds (Failed, reason DeadlineExceeded)."""
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True" and cond.get("reason") == "DeadlineExceeded":
            return True
    return False


def finished(job: Mapping[str, Any]) -> bool:
    return job_outcome(job) in (SUCCEEDED, FAILED)


def read_job(client: KubeClient, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        job: dict[str, Any] = client.get(JOBS, name, namespace)
        return job
    except errors.NotFound:
        return None


class ActionJobs:
    """The controller's own Jobs (label ``JOB_LABEL``, in the jobs namespace) from one watch, started by the first
    read. A repair or validation in progress looks at its Job every second: from the cache that costs the API
    server nothing (a GET each look was 60 a minute per node in repair, 6,000 a minute with 100 nodes out). A Job
    the cache does not hold is asked for by GET: it may have just been created (the watch lags), and "missing"
    decides that an attempt was stopped by someone, which only the server may say. Until the watch has listed,
    reads GET too: a read never waits for the watch (a loop waiting on a sync that a failing API server never
    gives cannot stop in time, and a successor then finds the attempt past its deadline). A client that cannot
    watch (replay's cluster) GETs each time, as before."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self._informer: Informer | None = None
        self._stopped = False
        self._lock = threading.Lock()

    def read(self, name: str) -> dict[str, Any] | None:
        informer = self._watch()
        if informer is not None and informer.has_synced():
            cached = informer.get(name, self.namespace)
            if cached is not None:
                return cached
        return read_job(self.client, name, self.namespace)

    def on_node(self, node: str) -> list[dict[str, Any]]:
        """Every Job of ours on ``node`` (its label), whatever record the Node carries now: from the watch once it
        has listed, else a LIST by label (asked only before an attempt starts)."""
        value = label_value(node)
        informer = self._watch()
        if informer is not None and informer.has_synced():
            return [job for job in informer.list()
                    if ((job.get("metadata") or {}).get("labels") or {}).get(NODE_LABEL) == value]
        listed = self.client.list(JOBS, self.namespace, label_selector=f"{JOB_LABEL},{NODE_LABEL}={value}")
        return list(listed.get("items") or [])

    def all(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Every Job of ours: from the watch once it has listed (waited for up to ``timeout``: its list is the one
        read), else one LIST by label (a client that cannot watch, or a watch that did not list in time)."""
        informer = self._watch()
        if informer is not None and informer.wait_for_sync(timeout):
            return informer.list()
        return list(self.client.list(JOBS, self.namespace, label_selector=JOB_LABEL).get("items") or [])

    def stop(self) -> None:
        with self._lock:
            informer, self._informer, self._stopped = self._informer, None, True
        if informer is not None:
            informer.stop(timeout=0)

    def _watch(self) -> Informer | None:
        if not callable(getattr(self.client, "watch", None)):
            return None
        with self._lock:
            if self._informer is None and not self._stopped:
                self._informer = Informer(self.client, JOBS, self.namespace, label_selector=JOB_LABEL).start()
            return self._informer


def job_node(job: Mapping[str, Any]) -> str:
    """The Node a Job of ours runs on: its pod's ``nodeName``, else the ``metadata.name`` its node affinity pins
    (a device-claim Job), else its ``NODE_NAME``; its node label's value at worst (a long name's is cut-and-hashed:
    compare it with ``label_value``)."""
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in required.get("nodeSelectorTerms") or []:
        for field_ in term.get("matchFields") or []:
            if field_.get("key") == "metadata.name" and len(field_.get("values") or []) == 1:
                return str(field_["values"][0])
    for container in spec.get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "NODE_NAME" and env.get("value"):
                return str(env["value"])
    return str(((job.get("metadata") or {}).get("labels") or {}).get(NODE_LABEL) or "")


def delete_job(client: KubeClient, name: str, namespace: str, *, dry_run: bool = False,
               with_pods: bool = False) -> None:
    """``with_pods``: foreground deletion, the Job stays (deleting) until its pods are gone, so "the Job is gone"
    means nothing of it can still run."""
    with contextlib.suppress(errors.NotFound):
        client.delete(JOBS, name, namespace, propagation_policy="Foreground" if with_pods else "Background",
                      dry_run=dry_run)
