"""kube-controller-manager's writers, as the emulator now runs them: node lifecycle (condition taints,
Lease lapse, taint-based eviction, Node Events), ServiceAccount admission, Job FailedCreate, absent-owner GC."""

from __future__ import annotations

from typing import Any

from kubeapi_support import Raw, make_ready, prepare

from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "/api/v1/namespaces/capture"
NODE = "/api/v1/nodes/capture-node-1"
MERGE = "application/merge-patch+json"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def until(predicate: Any, timeout: float = 5.0) -> Any:
    return wait_for(predicate, timeout, "the emulator's controllers", interval=0.02)


def taints(raw: Raw, path: str = NODE) -> list[tuple[str, str]]:
    return [(t["key"], t["effect"]) for t in raw("GET", path).body["spec"].get("taints") or []]


def node_events(raw: Raw, reason: str) -> list[dict[str, Any]]:
    return [e for e in raw("GET", "/api/v1/namespaces/default/events").body["items"] if e["reason"] == reason]


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": "capture-node-1",
                                                 "containers": [{"name": "c", "image": "x"}], **spec}}


# --- node lifecycle ---------------------------------------------------------------------------------

def test_a_new_node_is_tainted_not_ready_until_ready_and_registered(raw: Raw) -> None:
    created = raw("POST", "/api/v1/nodes", {"metadata": {"name": "fresh"}})
    assert created.body["spec"]["taints"] == [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    assert until(lambda: not taints(raw) and node_events(raw, "RegisteredNode"))  # capture-node-1 is Ready
    assert taints(raw, "/api/v1/nodes/fresh") == [("node.kubernetes.io/not-ready", "NoSchedule")]
    event = next(e for e in node_events(raw, "RegisteredNode") if e["involvedObject"]["name"] == "fresh")
    assert event["message"] == "Node fresh event: Registered Node fresh in Controller"
    assert event["source"] == {"component": "node-controller"} and event["involvedObject"]["kind"] == "Node"


def test_a_cordon_is_followed_by_the_unschedulable_taint_so_a_guarded_patch_meets_409(raw: Raw) -> None:
    until(lambda: not taints(raw))
    cordoned = raw("PATCH", NODE, {"spec": {"unschedulable": True}}, MERGE).body
    until(lambda: ("node.kubernetes.io/unschedulable", "NoSchedule") in taints(raw))
    taint = raw("GET", NODE).body["spec"]["taints"][0]
    assert set(taint) == {"key", "effect", "timeAdded"}
    guarded = {"metadata": {"resourceVersion": cordoned["metadata"]["resourceVersion"], "labels": {"a": "b"}}}
    assert raw("PATCH", NODE, guarded, MERGE).status == 409
    assert until(lambda: node_events(raw, "NodeNotSchedulable"))[0]["message"] == \
        "Node capture-node-1 status is now: NodeNotSchedulable"
    raw("PATCH", NODE, {"spec": {"unschedulable": None}}, MERGE)
    until(lambda: not taints(raw))
    assert until(lambda: node_events(raw, "NodeSchedulable"))


def _set_ready(raw: Raw, status: str) -> None:
    reason = "KubeletNotReady" if status == "False" else "KubeletReady"
    conditions = [{"type": "Ready", "status": status, "reason": reason, "message": "",
                   "lastHeartbeatTime": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z"}]
    assert raw("PATCH", f"{NODE}/status", {"status": {"conditions": conditions}}, MERGE).status == 200


def test_not_ready_taints_evict_pods_after_their_toleration(srv: KubeAPIServer, raw: Raw) -> None:
    srv.default_toleration_s = 1
    for name, extra in (("short", {}), ("forever", {"tolerations": [{"operator": "Exists"}]}),
                        ("none", {"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                                   "effect": "NoSchedule"},
                                                  {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                                   "effect": "NoExecute"}]})):
        assert raw("POST", f"{NS}/pods", pod(name, **extra)).status == 201
    short = raw("GET", f"{NS}/pods/short").body["spec"]["tolerations"]
    assert {(t["key"], t["tolerationSeconds"]) for t in short} == {("node.kubernetes.io/not-ready", 1),
                                                                    ("node.kubernetes.io/unreachable", 1)}
    _set_ready(raw, "False")
    until(lambda: {("node.kubernetes.io/not-ready", "NoSchedule"),
                   ("node.kubernetes.io/not-ready", "NoExecute")} <= set(taints(raw)))
    deleting = lambda name: raw("GET", f"{NS}/pods/{name}").body["metadata"].get("deletionTimestamp")  # noqa: E731
    until(lambda: deleting("short") and deleting("none"))
    assert not deleting("forever")
    evictions = [e for e in raw("GET", f"{NS}/events").body["items"] if e["reason"] == "TaintManagerEviction"]
    assert {e["message"] for e in evictions} == {"Marking for deletion Pod capture/short",
                                                 "Marking for deletion Pod capture/none"}
    assert until(lambda: node_events(raw, "NodeNotReady"))
    _set_ready(raw, "True")
    until(lambda: not taints(raw))


def test_a_node_whose_lease_lapses_becomes_unknown_and_unreachable() -> None:
    srv = KubeAPIServer(node_monitor_grace_s=0.5).start()
    try:
        _lapse(prepare(Raw(srv)))
    finally:
        srv.stop()


def _lapse(raw: Raw) -> None:
    assert raw("POST", "/api/v1/nodes", {"metadata": {"name": "no-lease"}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}]}}).status == 201
    assert raw("POST", f"{NS}/pods", pod("work")).status == 201
    make_ready(raw, "capture", "work")
    lease = {"metadata": {"name": "capture-node-1"}, "spec": {"holderIdentity": "capture-node-1",
             "leaseDurationSeconds": 40, "renewTime": "2026-12-01T06:29:26.522773Z"}}
    assert raw("POST", LEASES, lease).status == 201
    ready = lambda path=NODE: next(c for c in raw("GET", path).body["status"]["conditions"]  # noqa: E731
                                   if c["type"] == "Ready")
    until(lambda: ready()["status"] == "Unknown")
    assert (ready()["reason"], ready()["message"]) == ("NodeStatusUnknown", "Kubelet stopped posting node status.")
    until(lambda: {("node.kubernetes.io/unreachable", "NoSchedule"),
                   ("node.kubernetes.io/unreachable", "NoExecute")} <= set(taints(raw)))
    work = raw("GET", f"{NS}/pods/work").body
    assert next(c for c in work["status"]["conditions"] if c["type"] == "Ready")["status"] == "False"
    assert not work["metadata"].get("deletionTimestamp")  # tolerated for 300 s
    assert ready("/api/v1/nodes/no-lease")["status"] == "True"  # never had a Lease: left alone


# --- admission, Job controller, garbage collector ------------------------------------------------------

def test_a_pod_naming_a_missing_service_account_is_refused(raw: Raw) -> None:
    refused = raw("POST", f"{NS}/pods", pod("p", serviceAccountName="nope"))
    assert refused.status == 403
    assert refused.body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": 'pods "p" is forbidden: error looking up service account capture/nope: '
                                       'serviceaccount "nope" not found',
                            "reason": "Forbidden", "details": {"name": "p", "kind": "pods"}, "code": 403}
    assert raw("POST", f"{NS}/pods", pod("q")).status == 201  # the namespace's default ServiceAccount exists
    assert raw("POST", "/api/v1/namespaces", {"metadata": {"name": "later"}}).status == 201
    until(lambda: raw("GET", "/api/v1/namespaces/later/serviceaccounts/default").status == 200)


def test_a_job_whose_pods_are_refused_gets_failed_create_until_the_account_exists(raw: Raw) -> None:
    job = {"metadata": {"name": "j"}, "spec": {"backoffLimit": 0, "template": {"spec": {
        "restartPolicy": "Never", "serviceAccountName": "runner", "containers": [{"name": "m", "image": "x"}]}}}}
    assert raw("POST", "/apis/batch/v1/namespaces/capture/jobs", job).status == 201
    events = lambda: [e for e in raw("GET", f"{NS}/events").body["items"] if e["reason"] == "FailedCreate"]  # noqa: E731
    event = until(events)[0]
    assert (event["type"], event["source"], event["involvedObject"]["kind"]) == ("Warning",
                                                                                 {"component": "job-controller"}, "Job")
    assert event["message"] == ('Error creating: pods "j-" is forbidden: error looking up service account '
                                'capture/runner: serviceaccount "runner" not found')
    assert not raw("GET", f"{NS}/pods?labelSelector=job-name%3Dj").body["items"]
    until(lambda: events()[0]["count"] >= 2)  # retried with backoff: the same Event, counted
    assert len(events()) == 1
    assert raw("POST", f"{NS}/serviceaccounts", {"metadata": {"name": "runner"}}).status == 201
    until(lambda: raw("GET", f"{NS}/pods?labelSelector=job-name%3Dj").body["items"])


def test_a_pod_whose_owner_does_not_exist_is_garbage_collected(raw: Raw) -> None:
    ds = raw("POST", "/apis/apps/v1/namespaces/capture/daemonsets",
             {"metadata": {"name": "ds"}, "spec": {"selector": {"matchLabels": {"a": "b"}},
                                                  "template": {"metadata": {"labels": {"a": "b"}}}}}).body
    owners = {"owned": ("DaemonSet", "apps/v1", "ds", ds["metadata"]["uid"]),
              "stale-uid": ("DaemonSet", "apps/v1", "ds", "00000000-0000-0000-0000-000000000001"),
              "absent": ("DaemonSet", "apps/v1", "gone", "00000000-0000-0000-0000-000000000002"),
              "unknown-kind": ("Widget", "example.com/v1", "w", "00000000-0000-0000-0000-000000000003")}
    for name, (kind, api_version, owner, uid) in owners.items():
        body = pod(name)
        body["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": owner, "uid": uid}]
        assert raw("POST", f"{NS}/pods", body).status == 201
    both = pod("both")
    both["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gone", "uid": "00000000-0000-0000-0000-000000000004"},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": ds["metadata"]["uid"]}]
    assert raw("POST", f"{NS}/pods", both).status == 201
    gone = lambda name: raw("GET", f"{NS}/pods/{name}").body["metadata"].get("deletionTimestamp")  # noqa: E731
    until(lambda: gone("stale-uid") and gone("absent"))
    assert not gone("owned") and not gone("unknown-kind")
    refs = until(lambda: len(r := raw("GET", f"{NS}/pods/both").body["metadata"]["ownerReferences"]) == 1 and r)
    assert refs[0]["name"] == "ds" and not gone("both")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_status_heartbeat_also_keeps_a_leased_node_alive(srv: KubeAPIServer, raw: Raw) -> None:
    lifecycle, clock = srv.controllers.nodes, FakeClock()
    lifecycle.clock = clock
    lease = {"metadata": {"name": "capture-node-1"}, "spec": {"holderIdentity": "capture-node-1",
             "leaseDurationSeconds": 40, "renewTime": "2026-12-01T06:29:26.522773Z"}}
    assert raw("POST", LEASES, lease).status == 201
    until(lambda: "capture-node-1" in lifecycle.renewals)
    clock.now += 40
    heartbeat = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
                  "lastHeartbeatTime": "2026-12-01T06:30:06Z", "lastTransitionTime": "2026-11-29T21:18:23Z"}]
    assert raw("PATCH", f"{NODE}/status", {"status": {"conditions": heartbeat}}, MERGE).status == 200
    until(lambda: lifecycle.renewals["capture-node-1"][1] == clock.now)
    clock.now += 30  # 70 s after the Lease, 30 s after the heartbeat: alive (grace 50 s)
    passes = lifecycle.passes
    until(lambda: lifecycle.passes >= passes + 2)
    ready = lambda: next(c for c in raw("GET", NODE).body["status"]["conditions"] if c["type"] == "Ready")  # noqa: E731
    assert ready()["status"] == "True"
    clock.now += 21
    until(lambda: ready()["status"] == "Unknown")
