"""The idle-node check's Job and what decides a node may take one (issue 46; the loop is ``loops.idle_check``).

The Job runs ``gpuremediate preflight`` (the webhook's check, its container named as the init container so the
failed-pod watch reads its termination line the same way) on every GPU of one node, and yields to any real pod:

- ``priorityClassName`` names a PriorityClass with a negative value and ``preemptionPolicy: Never`` (the chart and
  kustomize ship it). A pod without a class has priority 0 ("If no globalDefault PriorityClass exists, pods without
  a priorityClassName have priority zero", kubernetes.io/docs/concepts/configuration/pod-priority-preemption): when
  it cannot be scheduled for the GPUs this pod holds, kube-scheduler preempts this pod (deleted with its grace
  period, ``terminationGracePeriodSeconds`` 5 here) and the real pod takes the GPUs. ``Never``: this pod itself
  never preempts anything; it waits in the queue behind every higher-priority pod. Below -10, the cluster
  autoscaler's default ``expendable-pods-priority-cutoff``, it never makes the cluster scale up either.
- It is placed by kube-scheduler (a required node affinity on ``metadata.name``, like a DaemonSet's pod), not by
  ``nodeName``: only a scheduled pod takes part in priority and preemption, and the kubelet would refuse a bound
  pod whose GPUs were just taken.
- ``backoffLimit`` 0: a preempted pod is not started again (the Job fails; the loop reads that as "unknown").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuremediate.actions.custom import label_value
from gpuremediate.actions.jobs import FAULT_ANNOTATION, JOB_LABEL, NODE_LABEL, gpu_resources, job_name
from gpuremediate.actions.node_status import taints_of
from gpuremediate.actions.nodes import is_excluded, is_ready, node_unschedulable_of
from gpuremediate.actions.pods import is_finished
from gpuremediate.gpu_resources import GPU, pod_gpu_requests
from gpuremediate.kube.config import ConfigError, parse_rfc3339
from gpuremediate.policy.preflight import PreflightPolicy, preflight_args
from gpuremediate.vocab import states
from gpuremediate.vocab.preflight import CONTAINER_NAME
from gpuremediate.vocab.record import NodeRecord, RecordError

KIND = "idle-check"  # the Job's JOB_LABEL value
GRACE_S = 5  # the pod's terminationGracePeriodSeconds: how long a preempting pod waits for it at most
# Taints that say the node is going out of service, or is being acted on: no check there. Any other taint (a GPU
# node's own ``nvidia.com/gpu=present:NoSchedule``, say) is tolerated exactly, as the node's own GPU pods do.
OUT_OF_SERVICE_TAINTS = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/", "gpuremediate.io/",
                         "ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler")


def why_not_eligible(node: Mapping[str, Any], record: NodeRecord | RecordError | None) -> str:
    """Why the node takes no idle check now ("" when it may): only a node in service, schedulable, Ready, in no
    remediation state and not going away."""
    if is_excluded(node):
        return "excluded"
    if (node.get("metadata") or {}).get("deletionTimestamp"):
        return "being deleted"
    if isinstance(record, RecordError):
        return "malformed record"
    if record is not None and (record.state != states.HEALTHY or record.action is not None):
        return f"state {record.state}"
    if node_unschedulable_of(node):
        return "cordoned"
    if not is_ready(node):
        return "not Ready"
    for taint in taints_of(node):
        if str(taint.get("key") or "").startswith(OUT_OF_SERVICE_TAINTS):
            return f"taint {taint.get('key')}"
    return ""


def gpu_use(pods: Iterable[Mapping[str, Any]], gpu_names: tuple[str, ...]) -> tuple[bool, float]:
    """(a pod holds GPUs on the node now, when the last finished GPU pod still listed ended; 0: none). The
    controller's own Jobs count: a repair or another check holds the GPUs as much as a workload."""
    busy, ended = False, 0.0
    for pod in pods:
        if not pod_gpu_requests(pod, gpu_names):
            continue
        if not is_finished(pod):
            busy = True
            continue
        ended = max(ended, _ended_at(pod))
    return busy, ended


def _ended_at(pod: Mapping[str, Any]) -> float:
    status = pod.get("status") or {}
    stamps = [((c.get("state") or {}).get("terminated") or {}).get("finishedAt")
              for c in status.get("containerStatuses") or []]
    found = 0.0
    for stamp in stamps:
        try:
            found = max(found, parse_rfc3339(str(stamp))) if stamp else found
        except ConfigError:
            continue
    return found


def build_idle_check(node: Mapping[str, Any], fingerprint: str, *, namespace: str, image: str,
                     policy: PreflightPolicy, gpus: Mapping[str, int], service_account: str) -> dict[str, Any]:
    """The Job checking every GPU of ``node`` (``gpus``: each GPU resource's capacity)."""
    name = str((node.get("metadata") or {}).get("name") or "")
    labels = {JOB_LABEL: KIND, NODE_LABEL: label_value(name)}
    held = gpu_resources(gpus)
    container = {
        "name": CONTAINER_NAME, "image": image, "imagePullPolicy": "IfNotPresent",
        # on-unknown exit: a check that cannot tell exits 3 (the Job fails, read as unknown), never 0 (passed)
        "args": preflight_args(policy, on_unknown="exit", expect_gpus=held.get(GPU, "")),
        "env": [{"name": "NODE_NAME", "value": name}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi", **held},
                      "limits": {"memory": "256Mi", **held}},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
    tolerations = [{"key": t["key"], "operator": "Equal", "value": str(t.get("value") or ""), "effect": t["effect"]}
                   for t in taints_of(node) if t.get("key") and t.get("effect")]
    pod_spec: dict[str, Any] = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}},
        "priorityClassName": policy.idle_check_priority_class,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_S,
        "serviceAccountName": service_account,
        "automountServiceAccountToken": False,
        "containers": [container],
        **({"tolerations": tolerations} if tolerations else {}),
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name(KIND, name, fingerprint, 1), "namespace": namespace, "labels": labels,
                     "annotations": {FAULT_ANNOTATION: fingerprint}},
        "spec": {"backoffLimit": 0, "activeDeadlineSeconds": int(policy.idle_check_timeout_s),
                 "ttlSecondsAfterFinished": 3600,
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }
