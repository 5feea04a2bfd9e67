"""What kube-controller-manager would run against the emulator: the Job controller, the owner-reference
garbage collector, the disruption (PDB status) controller, namespace cleanup, the ClusterRole aggregation
controller, node lifecycle (sim.kube_nodes), device-taint eviction (sim.kube_dra_eviction) and the resourceclaim
controller's deallocation (sim.kube_dra_claims); kube-scheduler's
placement of pods pinned to one node that wait for ResourceClaims (sim.kube_scheduler); plus the eviction
subresource, which reads and writes PDB status the way the real registry does.
"""

from __future__ import annotations

import copy
import json
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sim import kube_admission as adm
from sim import kube_errors as errs
from sim.kube_dra_claims import ClaimController
from sim.kube_dra_eviction import DeviceTaintEviction
from sim.kube_events import record_event
from sim.kube_nodes import NodeLifecycle
from sim.kube_scheduler import PinnedScheduler
from sim.kube_selectors import match_label_selector_object
from sim.kube_store import Obj, WatchEvent, now_time

if TYPE_CHECKING:
    from sim.kube_handlers import Target
    from sim.kube_host import ControllersHost
    from sim.kube_http import Handler, Request
    from sim.kube_resources import ResourceType
    from sim.kube_store import Store

TERMINAL = ("Succeeded", "Failed")
CLUSTER_ROLES = "rbac.authorization.k8s.io/clusterroles"
AGGREGATION_MANAGER = "clusterrole-aggregation-controller"


def is_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


class Controllers:
    def __init__(self, store: Store, api: ControllersHost, tick_s: float = 0.1) -> None:
        self.api = api
        self.store = store
        self.tick_s = tick_s
        self.queue: queue.Queue[WatchEvent | None] = queue.Queue()
        self.failed_deleted: dict[str, int] = {}
        self.gc_pending: set[tuple[str, str, str]] = set()  # (storage key, namespace, name) awaiting GC
        self.job_deadlines: dict[tuple[str, str], float] = {}  # (namespace, name) -> when to sync that Job again
        self.create_backoff: dict[tuple[str, str], float] = {}  # Job -> seconds until its next pod create try
        self.create_retry_at: dict[tuple[str, str], float] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.nodes = NodeLifecycle(store, api)
        self.device_taints = DeviceTaintEviction(store, api)
        self.scheduler = PinnedScheduler(store, api)
        self.claims = ClaimController(store, api)
        self.store.listeners.append(self._on_event)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kube-controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=2)

    def rt(self, group: str, resource: str) -> ResourceType:
        return self.api.type_for(group, resource)

    # --- event intake ------------------------------------------------------------------------------
    def _on_event(self, event: WatchEvent) -> None:
        if event.key == "apiextensions.k8s.io/customresourcedefinitions":
            if event.type == "DELETED":
                self.api.unregister_crd(event.obj)
            else:
                self.api.register_crd(event.obj)
        if event.type == "DELETED" and event.key == "/pods":
            self._note_pod_gone(event.obj)
        meta = event.obj["metadata"]
        if event.type != "DELETED" and meta.get("deletionTimestamp") and \
                {"orphan", "foregroundDeletion"} & set(meta.get("finalizers") or []):
            self.gc_pending.add((event.key, meta.get("namespace", ""), meta["name"]))
        self.queue.put(event)

    def _note_pod_gone(self, pod: Obj) -> None:
        if pod.get("status", {}).get("phase") in TERMINAL:
            return
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Job" and not self._ignored_failure(pod, ref["name"]):
                self.failed_deleted[ref["uid"]] = self.failed_deleted.get(ref["uid"], 0) + 1

    def _ignored_failure(self, pod: Obj, job_name: str) -> bool:
        job = self.store.get(self.rt("batch", "jobs").key, pod["metadata"].get("namespace", ""), job_name)
        return job is not None and pod_failure_action(job, pod) == "Ignore"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = self.queue.get(timeout=self.tick_s)
            except queue.Empty:
                event = None
            try:
                if event is not None:
                    self._react(event)
                self._gc_pass()
                self._deadline_pass()
                self.nodes.tick()
                self.device_taints.tick()
                self.scheduler.tick()
                self.claims.tick()
            except errs.ApiError:
                continue  # a conflict with a concurrent writer: the next event or tick retries
            except Exception:  # a bug in one controller must not stop the others (a real one restarts)
                traceback.print_exc()

    def _react(self, event: WatchEvent) -> None:
        obj, meta = event.obj, event.obj["metadata"]
        ns = meta.get("namespace", "")
        self.nodes.react(event)
        self.device_taints.react(event)
        self.scheduler.react(event)
        self.claims.react(event)
        if event.key == "/pods":
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") == "Job":
                    self.sync_job(ns, ref["name"])
            if event.type != "DELETED":
                self._release_orphan_pod(obj)
            self.sync_pdbs(ns, obj, event.prev)
        elif event.key == "batch/jobs":
            self.sync_job(ns, meta["name"])
        elif event.key == "policy/poddisruptionbudgets" and event.type != "DELETED":
            self.sync_pdb(ns, meta["name"])
        elif event.key == "/namespaces" and event.type == "ADDED":
            self._default_service_account(meta["name"])
        elif event.key == CLUSTER_ROLES:
            self.aggregate_cluster_roles()
        if event.type != "DELETED" and meta.get("ownerReferences") and \
                meta.get("ownerReferences") != ((event.prev or {}).get("metadata") or {}).get("ownerReferences"):
            self._collect_if_orphaned(event.key, obj)
        if event.type == "DELETED":
            self._collect_dependents(meta["uid"])
            if event.key == "/namespaces":
                self._empty_namespace(meta["name"])

    # --- clusterrole-aggregation-controller ------------------------------------------------------------
    def aggregate_cluster_roles(self) -> None:
        """Every ClusterRole with an ``aggregationRule`` gets the rules of the ClusterRoles its selectors
        match (by name, each rule once), written as kube-controller-manager writes them: a forced
        server-side apply of ``.rules`` by the field manager ``clusterrole-aggregation-controller``. So
        ``.rules`` is that manager's: an applier that declares it (``rules: []``) meets a conflict on its
        next apply."""
        from sim.kube_handlers import server_side_apply_and_own

        rt = self.rt("rbac.authorization.k8s.io", "clusterroles")
        roles = sorted(self.store.select(rt.key, "", lambda _o: True), key=lambda r: r["metadata"]["name"])
        for role in roles:
            selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors")
            if selectors is None:
                continue
            rules: list[Any] = []
            for other in roles:
                if other["metadata"]["name"] == role["metadata"]["name"]:
                    continue
                labels = other["metadata"].get("labels") or {}
                if any(match_label_selector_object(sel, labels) for sel in selectors):
                    rules.extend(r for r in other.get("rules") or [] if r not in rules)
            if rules != (role.get("rules") or []):
                applied = {"apiVersion": rt.group_version, "kind": rt.kind,
                           "metadata": {"name": role["metadata"]["name"]}, "rules": rules}
                server_side_apply_and_own(self.store, rt, role, applied, AGGREGATION_MANAGER)

    # --- garbage collector ---------------------------------------------------------------------------
    def _all_objects(self, keep: Callable[[Obj], bool] | None = None) -> list[tuple[ResourceType, Obj]]:
        out = []
        for rt in {rt.key: rt for rt in list(self.api.types.values())}.values():
            out += [(rt, o) for o in self.store.select(rt.key, "", keep)]
        return out

    def _dependents(self, uid: str) -> list[tuple[ResourceType, Obj]]:
        by_key = {rt.key: rt for rt in list(self.api.types.values())}
        return [(by_key[key], obj) for key, obj in self.store.owned_by(uid) if key in by_key]

    def _collect_dependents(self, uid: str) -> None:
        """Delete what `uid` owned and no other live owner still does (one snapshot of the store)."""
        with self.store.lock:
            dependents = [(rt, dep, any(self.store.has_uid(r.get("uid")) for r in dep["metadata"]["ownerReferences"]
                                        if r.get("uid") != uid)) for rt, dep in self._dependents(uid)]
        for rt, dep, owned_still in dependents:
            if not dep["metadata"].get("deletionTimestamp") and not owned_still:
                self._delete(rt, dep, "Background")

    def _collect_if_orphaned(self, key: str, obj: Obj) -> None:
        """attemptToDeleteItem: an object none of whose owners exists (by uid) is deleted, one with some
        owners left loses the dangling references; an owner of a kind the server does not serve cannot be
        checked, so it counts as existing."""
        rt = next((r for r in list(self.api.types.values()) if r.key == key), None)
        if rt is None or obj["metadata"].get("deletionTimestamp"):
            return
        namespace = obj["metadata"].get("namespace", "")
        refs = obj["metadata"]["ownerReferences"]
        solid = [ref for ref in refs if self._owner_may_exist(ref, namespace)]
        if not solid:
            self._delete(rt, obj, "Background")
        elif len(solid) < len(refs):  # some owners exist: only the dangling references go
            updated = copy.deepcopy(obj)
            updated["metadata"]["ownerReferences"] = solid
            self.store.update(rt, updated, obj)

    def _owner_may_exist(self, ref: dict[str, Any], namespace: str) -> bool:
        api_version = str(ref.get("apiVersion", ""))
        group = api_version.split("/")[0] if "/" in api_version else ""
        rt = next((r for (g, _, _), r in list(self.api.types.items()) if g == group and r.kind == ref.get("kind")),
                  None)
        if rt is None:
            return True
        owner = self.store.get(rt.key, namespace if rt.namespaced else "", str(ref.get("name", "")))
        return owner is not None and owner["metadata"]["uid"] == ref.get("uid")

    def _default_service_account(self, namespace: str) -> None:
        """The ServiceAccount controller: every namespace gets its `default` ServiceAccount."""
        sa_rt = self.rt("", "serviceaccounts")
        with self.store.lock:
            ns_obj = self.store.get("/namespaces", "", namespace)
            if ns_obj is None or ns_obj["metadata"].get("deletionTimestamp") \
                    or self.store.get(sa_rt.key, namespace, "default") is not None:
                return
            self.store.create(sa_rt, {"apiVersion": "v1", "kind": "ServiceAccount",
                                      "metadata": {"name": "default", "namespace": namespace}}, namespace)

    def _delete(self, rt: ResourceType, obj: Obj, policy: str) -> bool:
        """Delete; True when the object is gone now (False: graceful, held, or the delete failed)."""
        try:
            _, removed = self.store.delete(rt, obj["metadata"].get("namespace", ""), obj["metadata"]["name"],
                                           propagation=policy)
        except errs.ApiError:
            return False
        return removed

    def _gc_pass(self) -> None:
        by_key = {rt.key: rt for rt in list(self.api.types.values())}
        for key, ns, name in list(self.gc_pending):
            obj, rt = self.store.get(key, ns, name), by_key.get(key)
            finalizers = (obj or {}).get("metadata", {}).get("finalizers") or []
            if obj is None or rt is None or not {"orphan", "foregroundDeletion"} & set(finalizers):
                self.gc_pending.discard((key, ns, name))
                continue
            if "orphan" in finalizers:
                self._orphan(obj)
                self.store.remove_finalizer(rt, obj, "orphan")
            elif "foregroundDeletion" in finalizers:
                deps = self._dependents(obj["metadata"]["uid"])
                for dep_rt, dep in deps:
                    if not dep["metadata"].get("deletionTimestamp"):
                        self._delete(dep_rt, dep, "Foreground")
                if not deps:
                    self.store.remove_finalizer(rt, obj, "foregroundDeletion")

    def _orphan(self, owner: Obj) -> None:
        uid = owner["metadata"]["uid"]
        for rt, dep in self._dependents(uid):
            updated = copy.deepcopy(dep)
            refs = [r for r in updated["metadata"]["ownerReferences"] if r.get("uid") != uid]
            if refs:
                updated["metadata"]["ownerReferences"] = refs
            else:
                updated["metadata"].pop("ownerReferences")
            self.store.update(rt, updated, dep)

    def _empty_namespace(self, namespace: str) -> None:
        for rt, obj in self._all_objects():
            if rt.namespaced and obj["metadata"].get("namespace") == namespace:
                self._delete(rt, obj, "Background")
                self.store.remove_finalizer(rt, obj, adm.TRACKING_FINALIZER)

    # --- Job controller ------------------------------------------------------------------------------
    # Not modelled: kube-controller-manager syncs a Job at least SyncJobBatchPeriod (1 s) after a change of its pods
    # (pkg/controller/job/job_controller.go), so a real Job's status lags its pod; here it follows at once. On a
    # v1.36.2 control plane a reboot Job's status still said running after its pod had rebooted the node (issue 43).
    def _release_orphan_pod(self, pod: Obj) -> None:
        """syncOrphanPod: a pod whose controlling Job is gone (or is another Job now) loses the
        job-tracking finalizer, so it can really go away."""
        if adm.TRACKING_FINALIZER not in (pod["metadata"].get("finalizers") or []):
            return
        refs = [r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")]
        if refs and refs[0].get("kind") != "Job":
            return
        if refs:
            job = self.store.get(self.rt("batch", "jobs").key, pod["metadata"].get("namespace", ""), refs[0]["name"])
            if job is not None and job["metadata"]["uid"] == refs[0].get("uid"):
                return
        self.store.remove_finalizer(self.rt("", "pods"), pod, adm.TRACKING_FINALIZER)

    def _deadline_pass(self) -> None:
        now = time.time()
        for (ns, name), due in list(self.job_deadlines.items()):
            if due <= now:
                self.job_deadlines.pop((ns, name), None)
                self.sync_job(ns, name)

    def sync_job(self, ns: str, name: str) -> None:
        jobs, pods_rt = self.rt("batch", "jobs"), self.rt("", "pods")
        with self.store.lock:
            job = self.store.get(jobs.key, ns, name)
            if job is None:
                self.create_backoff.pop((ns, name), None)
                self.create_retry_at.pop((ns, name), None)
                return
            uid = job["metadata"]["uid"]
            pods = self.store.select(pods_rt.key, ns, lambda p: owned_by(p, uid))
            for pod in pods:
                if pod["status"].get("phase") in TERMINAL or pod["metadata"].get("deletionTimestamp") \
                        or job["metadata"].get("deletionTimestamp"):
                    self.store.remove_finalizer(pods_rt, pod, adm.TRACKING_FINALIZER)
            if job["metadata"].get("deletionTimestamp"):
                return
            status = self._job_status(job, pods)
            if status != job.get("status"):
                updated = copy.deepcopy(job)
                updated["status"] = status
                self.store.update(jobs, updated, job)

    def _job_status(self, job: Obj, pods: list[Obj]) -> dict[str, Any]:
        """As v1.36's Job controller: SuccessCriteriaMet / FailureTarget first, then Complete / Failed once
        no pod of the Job is still terminating."""
        spec, status = job["spec"], copy.deepcopy(job.get("status") or {})
        if _finished(status):
            return status
        succeeded = sum(1 for p in pods if p["status"].get("phase") == "Succeeded")
        failed = sum(1 for p in pods if p["status"].get("phase") == "Failed"
                     and pod_failure_action(job, p) != "Ignore") + self.failed_deleted.get(job["metadata"]["uid"], 0)
        active = [p for p in pods if p["status"].get("phase") not in TERMINAL
                  and not p["metadata"].get("deletionTimestamp")]
        terminating = sum(1 for p in pods if p["status"].get("phase") not in TERMINAL
                          and p["metadata"].get("deletionTimestamp"))
        status.setdefault("startTime", now_time())
        past_deadline = self._past_deadline(job, status)
        target = _interim(status)
        if target is None and succeeded >= int(spec.get("completions") or 1):
            target = _add_condition(status, "SuccessCriteriaMet", "CompletionsReached",
                                    "Reached expected number of succeeded pods")
        elif target is None and (failed > int(spec.get("backoffLimit", 6)) or past_deadline):
            reason, message = (("DeadlineExceeded", "Job was active longer than specified deadline") if past_deadline
                               else ("BackoffLimitExceeded", "Job has reached the specified backoff limit"))
            target = _add_condition(status, "FailureTarget", reason, message)
        if target is not None:
            terminating += sum(1 for pod in active if not self._delete(self.rt("", "pods"), pod, "Background"))
            if terminating == 0:
                self._finish(status, target)
            active = []
        elif not (terminating and replaces_only_failed(job)):
            self._create_missing(job, status, active, succeeded)
        status["terminating"] = terminating
        return _job_counts(status, len(active), succeeded, failed, sum(1 for p in active if is_ready(p)))

    @staticmethod
    def _finish(status: dict[str, Any], target: dict[str, Any]) -> None:
        final = "Complete" if target["type"] == "SuccessCriteriaMet" else "Failed"
        _add_condition(status, final, target["reason"], target["message"])
        if final == "Complete":
            status["completionTime"] = now_time()

    def _create_missing(self, job: Obj, status: dict[str, Any], active: list[Obj], succeeded: int) -> None:
        spec, key = job["spec"], (job["metadata"]["namespace"], job["metadata"]["name"])
        if self.create_retry_at.get(key, 0.0) > time.time():
            return
        wanted = min(int(spec.get("parallelism") or 1), int(spec.get("completions") or 1) - succeeded)
        for _ in range(wanted - len(active)):
            try:
                active.append(self._create_job_pod(job))
            except errs.ApiError as err:
                self._failed_create(job, key, err)
                return
        self.create_backoff.pop(key, None)

    def _failed_create(self, job: Obj, key: tuple[str, str], err: errs.ApiError) -> None:
        """A refused pod (e.g. a missing ServiceAccount): the FailedCreate Warning on the Job, and a retry
        with backoff (1 s doubling to 60 s), as the Job controller does; the Job has no condition for it."""
        record_event(self.api, self.rt("batch", "jobs"), job, "FailedCreate", f"Error creating: {err}",
                     component="job-controller", event_type="Warning")
        backoff = min(60.0, self.create_backoff.get(key, 0.5) * 2)
        self.create_backoff[key] = backoff
        self.create_retry_at[key] = time.time() + backoff
        self.job_deadlines[key] = min(self.job_deadlines.get(key, math.inf), self.create_retry_at[key])

    def _past_deadline(self, job: Obj, status: dict[str, Any]) -> bool:
        """activeDeadlineSeconds counts from status.startTime; a Job not yet there is looked at again then."""
        deadline = job["spec"].get("activeDeadlineSeconds")
        if deadline is None:
            return False
        started = datetime.strptime(status["startTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        due = started + int(deadline)
        if time.time() >= due:
            return True
        self.job_deadlines[(job["metadata"].get("namespace", ""), job["metadata"]["name"])] = due
        return False

    def _create_job_pod(self, job: Obj) -> Obj:
        meta, template = job["metadata"], copy.deepcopy(job["spec"]["template"])
        tmeta = template.get("metadata") or {}
        pod: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": f"{meta['name']}-", "labels": tmeta.get("labels") or {},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
            "finalizers": [adm.TRACKING_FINALIZER]}, "spec": template.get("spec") or {}}
        if tmeta.get("annotations"):
            pod["metadata"]["annotations"] = tmeta["annotations"]
        pods_rt = self.rt("", "pods")
        prepared = adm.prepare_create(pods_rt, pod, self.api.default_toleration_s)
        adm.check_service_account(self.store, self.rt("", "serviceaccounts"), prepared, meta["namespace"])
        return self.store.create(pods_rt, prepared, meta["namespace"])

    # --- disruption controller -----------------------------------------------------------------------
    def sync_pdbs(self, ns: str, pod: Obj, prev: Obj | None) -> None:
        """The PDBs a pod's change can move: those selecting it now or before (its labels may have changed);
        the disruption controller, too, queues only the PDBs of a changed pod (``getPdbForPod``)."""
        labels = [(o.get("metadata") or {}).get("labels") for o in (pod, prev) if o is not None]
        for pdb in self.store.list_all(self.rt("policy", "poddisruptionbudgets").key, ns):
            selector = (pdb.get("spec") or {}).get("selector")
            if selector is not None and any(match_label_selector_object(selector, lab) for lab in labels):
                self.sync_pdb(ns, pdb["metadata"]["name"])

    def sync_pdb(self, ns: str, name: str) -> Obj | None:
        pdbs = self.rt("policy", "poddisruptionbudgets")
        with self.store.lock:
            pdb = self.store.get(pdbs.key, ns, name)
            if pdb is None:
                return None
            pods = self._pdb_pods(pdb)
            status = pdb_status(pdb, pods)
            if status == pdb.get("status"):
                return pdb
            updated = copy.deepcopy(pdb)
            updated["status"] = status
            return self.store.update(pdbs, updated, pdb)

    def _pdb_pods(self, pdb: Obj) -> list[Obj]:
        selector = pdb.get("spec", {}).get("selector")
        if selector is None:
            return []
        return self.store.select(self.rt("", "pods").key, pdb["metadata"]["namespace"],
                                 lambda p: match_label_selector_object(selector, p["metadata"].get("labels")))

    # --- eviction subresource ------------------------------------------------------------------------
    def evict(self, h: Handler, req: Request, t: Target) -> None:
        try:
            body = json.loads(req.body.decode("utf-8") or "{}")
        except ValueError:
            raise errs.bad_request("the object provided is unrecognized (must be of type Eviction)") from None
        if body.get("metadata", {}).get("name", t.name) != t.name:
            raise errs.bad_request("name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") or {}
        dry_value = req.query.get("dryRun") or (options.get("dryRun") or [None])[0]
        if dry_value is not None:
            req.query["dryRun"] = dry_value
        dry = self.api.verbs.dry_run(req, "DeleteOptions")
        grace = options.get("gracePeriodSeconds")
        pods_rt = self.rt("", "pods")
        with self.store.lock:
            pod = self.store.get(pods_rt.key, t.namespace, t.name)
            if pod is None:
                raise errs.not_found("pods", "", t.name)
            if not (pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") in TERMINAL):
                self._check_budget(pod, dry)
            if not dry:
                pod = self._mark_evicted(pods_rt, pod)
                self.store.delete(pods_rt, t.namespace, t.name, grace=grace,
                                  preconditions=options.get("preconditions"))
        h.send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    def _mark_evicted(self, pods_rt: ResourceType, pod: Obj) -> Obj:
        """As kube-apiserver's eviction (``addConditionAndDeletePod``): a pod not yet terminal gets the condition
        DisruptionTarget (EvictionByEvictionAPI) before its deletion, which a Job's podFailurePolicy reads."""
        if pod["status"].get("phase") in TERMINAL or pod["metadata"].get("deletionTimestamp"):
            return pod
        updated = copy.deepcopy(pod)
        status = updated.setdefault("status", {})
        kept = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
        status["conditions"] = [*kept, {"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                                        "lastTransitionTime": now_time(), "reason": "EvictionByEvictionAPI",
                                        "message": "Eviction API: evicting"}]
        return self.store.update(pods_rt, updated, pod)

    def _check_budget(self, pod: Obj, dry: bool) -> None:
        pdbs_rt = self.rt("policy", "poddisruptionbudgets")
        ns = pod["metadata"]["namespace"]
        matching = [p for p in self.store.list_all(pdbs_rt.key, ns) if p.get("spec", {}).get("selector") is not None
                    and match_label_selector_object(p["spec"]["selector"], pod["metadata"].get("labels"))]
        if len(matching) > 1:
            raise errs.ApiError(500, errs.status(500, "This pod has more than one PodDisruptionBudget, which the "
                                                      "eviction subresource does not support."))
        if not matching:
            return
        pdb = self.sync_pdb(ns, matching[0]["metadata"]["name"]) or matching[0]
        status = pdb.get("status") or {}
        if int(status.get("disruptionsAllowed", 0)) <= 0:
            msg = (f"The disruption budget {pdb['metadata']['name']} needs {status.get('desiredHealthy', 0)} "
                   f"healthy pods and has {status.get('currentHealthy', 0)} currently")
            body = errs.status(429, "Cannot evict pod as it would violate the pod's disruption budget.",
                               "TooManyRequests", {"causes": [{"reason": "DisruptionBudget", "message": msg}]})
            raise errs.ApiError(429, body)
        if dry:
            return
        updated = copy.deepcopy(pdb)
        updated["status"]["disruptionsAllowed"] = int(status["disruptionsAllowed"]) - 1
        disrupted = dict(status.get("disruptedPods") or {})
        disrupted[pod["metadata"]["name"]] = now_time()
        updated["status"] = _with_disrupted(updated["status"], disrupted)
        self.store.update(pdbs_rt, updated, pdb)


def pod_failure_action(job: Obj, pod: Obj) -> str:
    """The action of the first ``spec.podFailurePolicy`` rule matching the pod's conditions (``onPodConditions``;
    ``onExitCodes`` is not modelled), "Count" when none does, as the Job controller's ``matchPodFailurePolicy``."""
    conditions = {(c.get("type"), c.get("status")) for c in (pod.get("status") or {}).get("conditions") or []}
    for rule in (job["spec"].get("podFailurePolicy") or {}).get("rules") or []:
        wanted = rule.get("onPodConditions") or []
        if any((w.get("type"), w.get("status", "True")) in conditions for w in wanted):
            return str(rule.get("action", "Count"))
    return "Count"


def replaces_only_failed(job: Obj) -> bool:
    """``podReplacementPolicy: Failed`` (the default with a podFailurePolicy): a terminating pod is replaced only
    once it is gone or terminal."""
    spec = job["spec"]
    return spec.get("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed") \
        == "Failed"


def _interim(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or []
                 if c.get("type") in ("SuccessCriteriaMet", "FailureTarget") and c.get("status") == "True"), None)


def _add_condition(status: dict[str, Any], kind: str, reason: str, message: str) -> dict[str, Any]:
    now = now_time()
    condition = {"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now,
                 "reason": reason, "message": message}
    status["conditions"] = [*status.get("conditions", []), condition]
    return condition


def _finished(status: dict[str, Any]) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _job_counts(status: dict[str, Any], active: int, succeeded: int, failed: int, ready: int) -> dict[str, Any]:
    for key, value in (("active", active), ("succeeded", succeeded), ("failed", failed)):
        if value:
            status[key] = value
        else:
            status.pop(key, None)
    status["uncountedTerminatedPods"] = {}
    status["ready"] = ready
    return status


def _with_disrupted(status: dict[str, Any], disrupted: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"observedGeneration": status.get("observedGeneration")}
    if disrupted:
        out["disruptedPods"] = disrupted
    for key, value in status.items():
        if key not in ("observedGeneration", "disruptedPods"):
            out[key] = value
    return _condition(out, status.get("conditions"))


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def pdb_status(pdb: Obj, pods: list[Obj]) -> dict[str, Any]:
    """The disruption controller's view: expected, desired and current healthy pods, disruptions allowed."""
    spec, old = pdb.get("spec", {}), pdb.get("status") or {}
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    healthy = sum(1 for p in live if is_ready(p))
    expected = len(pods)
    min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
    percent = isinstance(min_available, str) or isinstance(max_unavailable, str)
    if percent and any(not any(r.get("controller") for r in p["metadata"].get("ownerReferences") or [])
                       for p in pods):
        expected, desired = 0, 0  # no scale to compute a percentage against (as upstream, case 14)
        allowed_base = 0
    else:
        if max_unavailable is not None:
            desired = max(0, expected - _scaled(max_unavailable, expected))
        else:
            desired = _scaled(min_available if min_available is not None else 1, expected)
        allowed_base = healthy - desired
    disrupted = {name: when for name, when in (old.get("disruptedPods") or {}).items()
                 if any(p["metadata"]["name"] == name for p in live)}
    allowed = max(0, allowed_base - len(disrupted)) if expected or not percent else 0
    status: dict[str, Any] = {"observedGeneration": pdb["metadata"].get("generation", 1)}
    if disrupted:
        status["disruptedPods"] = disrupted
    status.update(disruptionsAllowed=allowed, currentHealthy=healthy, desiredHealthy=desired,
                  expectedPods=expected)
    return _condition(status, old.get("conditions"))


def _condition(status: dict[str, Any], old_conditions: list[dict[str, Any]] | None) -> dict[str, Any]:
    allowed = int(status.get("disruptionsAllowed", 0)) > 0
    value, reason = ("True", "SufficientPods") if allowed else ("False", "InsufficientPods")
    previous = next((c for c in old_conditions or [] if c.get("type") == "DisruptionAllowed"), None)
    when = previous["lastTransitionTime"] if previous and previous.get("status") == value else now_time()
    status["conditions"] = [{"type": "DisruptionAllowed", "status": value,
                             "observedGeneration": status["observedGeneration"], "lastTransitionTime": when,
                             "reason": reason, "message": ""}]
    return status
