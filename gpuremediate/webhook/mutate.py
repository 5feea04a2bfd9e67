"""The preflight webhook's decision (issue 46): an AdmissionReview v1 for a Pod CREATE → the same AdmissionReview
kind with a ``response`` that allows the pod, with a base64 JSONPatch adding one init container running
``gpuremediate preflight`` when the pod is one to check.

The contract (Kubernetes API reference, "Dynamic Admission Control"): the response echoes ``request.uid`` and the
request's ``apiVersion``/``kind``; ``patchType: JSONPatch`` and ``patch`` (RFC 6902, base64) for a mutation. This
webhook never refuses a pod: anything it cannot read is allowed untouched (and its configuration says
``failurePolicy: Ignore``), so a broken webhook never stops a cluster from scheduling.

Which pods: those asking for GPUs (a GPU extended resource of ``[gpu_resources] names`` in a container's limits or
requests, or DRA claims named by a container), not opted out (annotation ``gpuremediate.io/preflight: skip``), not a
DaemonSet's (a node's own agents), not the controller's own Jobs (label ``gpuremediate.io/job``), not already
given the preflight. The namespace opt-in (label ``gpuremediate.io/preflight=enabled``) is the webhook
configuration's ``namespaceSelector``: the AdmissionReview carries no namespace labels.

The init container gets the pod's GPUs and nothing more: the sum over its containers of each GPU resource (the
kubelet's device manager hands an init container's devices on to the containers after it, so the pod's effective
request is unchanged and the preflight checks the very GPUs the job gets), the DRA claims its containers name, no
privilege (no escalation, every capability dropped, non-root, read-only root, RuntimeDefault seccomp: what a
restricted namespace asks).
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuremediate.gpu_resources import DEFAULT_NAMES, GPU, count_of, is_gpu_resource
from gpuremediate.policy.preflight import PreflightPolicy, preflight_args
from gpuremediate.vocab.preflight import CONTAINER_NAME, POD_ANNOTATION, POD_INJECTED, POD_LABEL, POD_SKIP

REVIEW_VERSION = "admission.k8s.io/v1"
OWN_JOB_LABEL = "gpuremediate.io/job"  # actions.jobs.JOB_LABEL: the controller's own Jobs' pods
# What was decided: the result label of gpuremediate_preflight_admissions_total.
SKIP_NO_GPU = "skipped-no-gpu"
SKIP_OPTED_OUT = "skipped-opted-out"
SKIP_DAEMONSET = "skipped-daemonset"
SKIP_OWN_JOB = "skipped-own-job"
SKIP_ALREADY = "skipped-already-injected"
SKIP_NOT_A_POD_CREATE = "skipped-not-a-pod-create"
INJECTED = "injected"


@dataclass(frozen=True)
class Settings:
    """What the init container runs: the controller's image and the policy's ``[preflight]``."""

    image: str
    policy: PreflightPolicy = field(default_factory=PreflightPolicy)
    gpu_names: tuple[str, ...] = DEFAULT_NAMES
    cpu: str = "100m"
    memory: str = "128Mi"
    memory_limit: str = "256Mi"


@dataclass(frozen=True)
class Decision:
    result: str  # INJECTED or a SKIP_* reason
    patch: tuple[dict[str, Any], ...] = ()


def gpu_limits(pod: Mapping[str, Any], names: Sequence[str]) -> dict[str, str]:
    """Each GPU resource summed over the pod's containers (limits, else requests)."""
    total: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        seen = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, value in seen.items():
            if is_gpu_resource(name, names):
                total[name] = total.get(name, 0) + (count_of(value) or 1)
    return {name: str(n) for name, n in sorted(total.items()) if n > 0}


def claims_used(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The DRA claim references (``resources.claims``) the pod's containers name, each once."""
    spec = pod.get("spec") or {}
    declared = {c.get("name") for c in spec.get("resourceClaims") or []}
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for container in spec.get("containers") or []:
        for ref in (container.get("resources") or {}).get("claims") or []:
            if ref.get("name") in declared:
                found.setdefault((str(ref.get("name")), str(ref.get("request") or "")), dict(ref))
    return list(found.values())


def why_skipped(pod: Mapping[str, Any], settings: Settings) -> str:
    meta = pod.get("metadata") or {}
    if (meta.get("annotations") or {}).get(POD_ANNOTATION) == POD_SKIP:
        return SKIP_OPTED_OUT
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return SKIP_DAEMONSET
    if OWN_JOB_LABEL in (meta.get("labels") or {}):
        return SKIP_OWN_JOB
    if any(c.get("name") == CONTAINER_NAME for c in (pod.get("spec") or {}).get("initContainers") or []):
        return SKIP_ALREADY
    if not gpu_limits(pod, settings.gpu_names) and not claims_used(pod):
        return SKIP_NO_GPU
    return ""


def init_container(pod: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    policy = settings.policy
    # whole GPUs: fewer seen fails the preflight where the runtime gives no list of them
    args = preflight_args(policy, on_unknown="pass" if policy.on_unknown == "pass" else "exit",
                          expect_gpus=gpu_limits(pod, settings.gpu_names).get(GPU, ""))
    resources: dict[str, Any] = {
        "requests": {"cpu": settings.cpu, "memory": settings.memory},
        "limits": {"memory": settings.memory_limit, **gpu_limits(pod, settings.gpu_names)},
    }
    claims = claims_used(pod)
    if claims:
        resources["claims"] = claims
    return {
        "name": CONTAINER_NAME, "image": settings.image, "imagePullPolicy": "IfNotPresent", "args": args,
        "resources": resources,
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }


def decide(pod: Mapping[str, Any], settings: Settings) -> Decision:
    skipped = why_skipped(pod, settings)
    if skipped:
        return Decision(skipped)
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    container = init_container(pod, settings)
    ops: list[dict[str, Any]] = []
    if spec.get("initContainers"):
        ops.append({"op": "add", "path": "/spec/initContainers/0", "value": container})
    else:
        ops.append({"op": "add", "path": "/spec/initContainers", "value": [container]})
    if meta.get("labels"):
        ops.append({"op": "add", "path": "/metadata/labels/" + POD_LABEL.replace("~", "~0").replace("/", "~1"),
                    "value": POD_INJECTED})
    else:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {POD_LABEL: POD_INJECTED}})
    return Decision(INJECTED, tuple(ops))


def review(body: Mapping[str, Any], settings: Settings) -> tuple[dict[str, Any], str]:
    """The AdmissionReview answer and what was decided. Raises ValueError when the body is no AdmissionReview
    request (the server answers 400: kube-apiserver then applies failurePolicy, Ignore)."""
    request = body.get("request") if isinstance(body, Mapping) else None
    if not isinstance(request, Mapping) or not request.get("uid"):
        raise ValueError("not an AdmissionReview request (request.uid missing)")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    kind = request.get("kind") or {}
    pod = request.get("object")
    if request.get("operation") != "CREATE" or kind.get("kind") != "Pod" or not isinstance(pod, Mapping):
        result = SKIP_NOT_A_POD_CREATE
    else:
        decision = decide(pod, settings)
        result = decision.result
        if decision.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(list(decision.patch)).encode()).decode()
    answer = {"apiVersion": str(body.get("apiVersion") or REVIEW_VERSION), "kind": "AdmissionReview",
              "response": response}
    return answer, result


def preflight_command(settings: Settings) -> str:
    """The init container's command line, as a person would type it (for docs and logs)."""
    return shlex.join(["gpuremediate", *init_container({}, settings)["args"]])
