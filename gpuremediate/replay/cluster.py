"""The simulated cluster a replay runs the controller's loops against: Nodes, one workload pod per
node, Jobs that finish after their typical duration, the breaker ConfigMap. In memory, on the
simulated clock; it answers the few KubeClient calls the loops make, as the API server would.

- a Node patch is a JSON merge patch guarded by its resourceVersion (409 when stale);
- each node runs one GPU workload pod; an eviction marks it terminating and it is gone
  ``drain_s`` later; it is back once the node returns to service;
- a Job completes ``duration`` after its creation; a completed reboot Job gives the node a new bootID;
- Events are not stored (the replay's EventRecorder keeps them);
- with ``dra`` (a policy isolating GPUs), the DRA objects of ``replay.dra``: slices, the workload's claim, rules.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuremediate.actions.jobs import JOB_LABEL
from gpuremediate.kube import errors
from gpuremediate.kube.patch import merge_patch
from gpuremediate.kube.resources import CONFIGMAPS, EVENTS, JOBS, NODES, PODS, Resource
from gpuremediate.replay.dra import ReplayDra
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_REBOOT, ACTION_RESET_GPU
from gpuremediate.vocab.record import RECORD_ANNOTATION

Node = dict[str, Any]
WriteHook = Callable[[Node, Node], None]
Pods = list[dict[str, Any]]
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Durations:
    """How long things take on the simulated cluster (seconds)."""

    drain_s: float = 600.0  # an evicted workload pod is gone after this
    reset_gpu_s: float = 300.0
    reboot_s: float = 900.0
    validate_s: float = 600.0
    custom_s: float = 900.0  # a Job of any other kind

    def for_job(self, kind: str) -> float:
        return {ACTION_RESET_GPU: self.reset_gpu_s, ACTION_REBOOT: self.reboot_s,
                "validate": self.validate_s}.get(kind, self.custom_s)


class SimClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _not_found(what: str) -> errors.NotFound:
    return errors.NotFound(404, {"reason": "NotFound", "message": f"{what} not found"})


class ReplayCluster:
    """Duck-types the KubeClient methods the loops call (get, list, patch, create, replace, delete, evict)."""

    def __init__(self, nodes: list[Node], clock: SimClock, durations: Durations, on_write: WriteHook,
                 dra_gpus: Mapping[str, list[str]] | None = None) -> None:
        self.nodes: dict[str, Node] = {n["metadata"]["name"]: n for n in nodes}
        self.dra = None if dra_gpus is None else ReplayDra(dra_gpus, self._evict_workload)
        self.clock = clock
        self.durations = durations
        self.on_write = on_write
        self.jobs: dict[str, tuple[dict[str, Any], float]] = {}  # name -> (Job, done at)
        self.evicted: dict[str, float] = {}  # node -> when its workload pod was evicted
        self.pod_generation: dict[str, int] = {}  # node -> how many workload pods it ran (a new uid each)
        self.configmaps: dict[str, dict[str, Any]] = {}
        self._rv = 1
        self._boots = 0

    # ---- the simulated passage of time --------------------------------------------------------------

    def busy(self) -> bool:
        """Something will happen without a history change: a pod terminating or a Job running."""
        now = self.clock()
        return any(done > now or job.get("status") is None for job, done in self.jobs.values()) or any(
            now < at + self.durations.drain_s for at in self.evicted.values())

    def advance(self) -> None:
        """Finish the Jobs whose time has come (a finished reboot gives the node a new bootID)."""
        now = self.clock()
        for name, (job, done_at) in self.jobs.items():
            if job.get("status") is None and now >= done_at:
                job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
                labels = job["metadata"].get("labels") or {}
                if labels.get(JOB_LABEL) == ACTION_REBOOT:
                    self._reboot(self._job_node(job), name)

    def _job_node(self, job: Mapping[str, Any]) -> str:
        for container in job["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env") or []:
                if env.get("name") == "NODE_NAME":
                    return str(env["value"])
        return ""

    def _reboot(self, node: str, job: str) -> None:
        if node in self.nodes:
            self._boots += 1
            rebooted = merge_patch(self.nodes[node], {"status": {"nodeInfo": {"bootID": f"boot-{self._boots}"}}})
            self._store(rebooted)

    def _store(self, node: Node) -> Node:
        self._rv += 1
        node["metadata"]["resourceVersion"] = str(self._rv)
        self.nodes[node["metadata"]["name"]] = node
        return node

    # ---- KubeClient ------------------------------------------------------------------------------

    def resolve(self, api_version: str, kind: str, *, fresh: bool = False) -> Resource:
        """Discovery: only the DeviceTaintRule of a DRA replay is asked for (``fresh``: nothing is cached)."""
        if self.dra is None:
            raise _not_found(f"kind {kind} in {api_version}")
        return self.dra.resolve(api_version, kind)

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        if self.dra is not None and self.dra.serves(res):
            return self.dra.get(res, name, self._workload_uid)
        if res == NODES and name in self.nodes:
            return copy.deepcopy(self.nodes[name])
        if res == JOBS and name in self.jobs:
            return copy.deepcopy(self.jobs[name][0])
        if res == CONFIGMAPS and name in self.configmaps:
            return copy.deepcopy(self.configmaps[name])
        raise _not_found(f"{res.plural} {name!r}")

    def list(self, res: Resource, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int = 500) -> dict[str, Any]:
        if res == NODES:
            return {"items": [copy.deepcopy(n) for n in self.nodes.values()], "metadata": {}}
        if self.dra is not None and self.dra.serves(res):
            return {"items": self.dra.list(res, label_selector=label_selector, field_selector=field_selector),
                    "metadata": {}}
        if res == PODS and field_selector and field_selector.startswith("spec.nodeName="):
            node = field_selector.split("=", 1)[1]
            return {"items": self._pods(node), "metadata": {}}
        return {"items": [], "metadata": {}}

    def _pods(self, node: str) -> Pods:
        evicted = self.evicted.get(node)
        if evicted is not None and self.clock() >= evicted + self.durations.drain_s:
            return []
        pod: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"workload-{node}", "namespace": "workloads",
                         "uid": f"uid-workload-{node}-{self.pod_generation.get(node, 0)}"},
            "spec": {"nodeName": node, "containers": [
                {"name": "train", "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}}}]},
            "status": {"phase": "Running"},
        }
        if evicted is not None:
            pod["metadata"]["deletionTimestamp"] = "terminating"
        if self.dra is not None:
            pod["spec"].update(self.dra.pod_claims(node))
        return [pod]

    def _workload_uid(self, node: str) -> str | None:
        pods = self._pods(node) if node in self.nodes else []
        return str(pods[0]["metadata"]["uid"]) if pods else None

    def _evict_workload(self, node: str) -> None:
        if self._pods(node):
            self.evicted.setdefault(node, self.clock())

    def patch(self, res: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None,
              *, patch_type: str = "merge", subresource: str | None = None, **_: Any) -> dict[str, Any]:
        if res != NODES or name not in self.nodes:
            raise _not_found(f"{res.plural} {name!r}")
        if subresource == "status" and patch_type == "strategic":
            return self._patch_conditions(name, patch)
        before = self.nodes[name]
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != before["metadata"]["resourceVersion"]:
            raise errors.Conflict(409, {"reason": "Conflict", "message": f"node {name} changed since read"})
        after = self._store(merge_patch(before, patch))
        self._back_in_service(after)
        self.on_write(before, after)
        return copy.deepcopy(after)

    def _patch_conditions(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """The controller's GPURemediation condition: a strategic merge keyed by condition type (a JSON
        merge patch would replace the whole list, Ready with it)."""
        node = copy.deepcopy(self.nodes[name])
        conditions = node.setdefault("status", {}).setdefault("conditions", [])
        for wanted in (patch.get("status") or {}).get("conditions") or []:
            kept = [c for c in conditions if c.get("type") != wanted.get("type")]
            conditions[:] = [*kept, dict(wanted)]
        return copy.deepcopy(self._store(node))

    def set_condition(self, name: str, condition: Mapping[str, Any]) -> None:
        """A condition another writer (the node agent) set on the Node: stored, not a write of the loops."""
        self._patch_conditions(name, {"status": {"conditions": [condition]}})

    def _back_in_service(self, node: Node) -> None:
        """A node back in healthy runs a workload again (the next drain evicts it anew)."""
        labels = node["metadata"].get("labels") or {}
        name = node["metadata"]["name"]
        if labels.get("gpuremediate.io/state") == states.HEALTHY and self.evicted.pop(name, None) is not None:
            self.pod_generation[name] = self.pod_generation.get(name, 0) + 1

    def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None, *,
               dry_run: bool = False) -> dict[str, Any]:
        name = str(body["metadata"]["name"])
        if self.dra is not None and self.dra.serves(res):
            return self.dra.create(res, body)
        if res == JOBS:
            if name in self.jobs:
                raise errors.AlreadyExists(409, {"reason": "AlreadyExists", "message": f"job {name} exists"})
            kind = str((body["metadata"].get("labels") or {}).get(JOB_LABEL, ""))
            job = copy.deepcopy(dict(body))
            job.pop("status", None)
            job["metadata"]["uid"] = f"uid-job-{name}"
            self.jobs[name] = (job, self.clock() + self.durations.for_job(kind))
            return copy.deepcopy(job)
        if res == CONFIGMAPS:
            return self.replace(res, name, body, namespace)
        if res == EVENTS:
            return dict(body)
        raise errors.Forbidden(403, {"reason": "Forbidden", "message": f"replay does not simulate {res.plural}"})

    def replace(self, res: Resource, name: str, body: Mapping[str, Any], namespace: str | None = None,
                **_: Any) -> dict[str, Any]:
        if self.dra is not None and self.dra.serves(res):
            return self.dra.replace(name, body)
        stored = copy.deepcopy(dict(body))
        stored.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self.configmaps[name] = stored
        return copy.deepcopy(stored)

    def delete(self, res: Resource, name: str, namespace: str | None = None, *,
               preconditions: Mapping[str, str] | None = None, **_: Any) -> dict[str, Any]:
        if self.dra is not None and self.dra.serves(res):
            return self.dra.delete(name, preconditions)
        if res == JOBS and self.jobs.pop(name, None) is not None:
            return {}
        raise _not_found(f"{res.plural} {name!r}")

    def evict(self, pod_name: str, namespace: str, *, grace_period_seconds: int | None = None,
              dry_run: bool = False) -> dict[str, Any]:
        node = pod_name.removeprefix("workload-")
        if node not in self.nodes or not self._pods(node):
            raise _not_found(f"pod {namespace}/{pod_name}")
        self.evicted.setdefault(node, self.clock())
        return {}


def replay_node(node: Mapping[str, Any], gpus: int) -> Node:
    """A Node as the replay starts it: its labels, capacity and a person's cordon kept; Ready; no
    record of ours (the replay starts from a fleet gpuremediate never touched)."""
    metadata = node.get("metadata") or {}
    labels = {k: v for k, v in (metadata.get("labels") or {}).items() if k != "gpuremediate.io/state"}
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != RECORD_ANNOTATION}
    status = node.get("status") or {}
    capacity = dict(status.get("capacity") or {})
    allocatable = dict(status.get("allocatable") or {})
    if gpus and "nvidia.com/gpu" not in capacity:
        capacity["nvidia.com/gpu"] = str(gpus)
    if gpus and "nvidia.com/gpu" not in allocatable:
        allocatable["nvidia.com/gpu"] = capacity["nvidia.com/gpu"]
    name = str(metadata.get("name", ""))
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": str(metadata.get("uid") or f"uid-{name}"), "resourceVersion": "1",
                     "labels": labels, "annotations": annotations},
        "spec": {"unschedulable": True} if (node.get("spec") or {}).get("unschedulable") else {},
        "status": {"capacity": capacity, "allocatable": allocatable, "nodeInfo": {"bootID": "boot-0"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }
