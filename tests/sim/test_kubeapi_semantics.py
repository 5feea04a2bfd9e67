"""Focused behaviour of the emulator: selectors, pagination, watch, patches, SSA, eviction, CRDs,
finalizers, graceful delete, Job controller and GC, auth/RBAC, fault injection, TLS."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
from typing import Any

import pytest
from kubeapi_support import Raw, make_ready

from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "/api/v1/namespaces/capture"
MERGE = "application/merge-patch+json"


def pod(name: str, labels: dict[str, str] | None = None, node: str | None = "capture-node-1") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def until(predicate: Any, timeout: float = 3.0) -> Any:
    return wait_for(predicate, timeout, "the emulator to reach the state", interval=0.02)


def watch_events(srv: KubeAPIServer, path: str) -> tuple[list[dict[str, Any]], bool]:
    """All events of a watch; the bool says whether the stream ended cleanly (zero-length chunk)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {srv.admin_token}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
    data, clean = b"", True
    try:
        data = resp.read()
    except http.client.IncompleteRead as exc:
        data, clean = exc.partial, False
    except (ConnectionResetError, http.client.HTTPException):
        clean = False
    conn.close()
    return [json.loads(line) for line in data.splitlines() if line.strip()], clean


# --- selectors and pagination -----------------------------------------------------------------------

def test_label_and_field_selectors_filter_lists(raw: Raw) -> None:
    raw("POST", f"{NS}/pods", pod("a", {"env": "prod", "tier": "web"}))
    raw("POST", f"{NS}/pods", pod("b", {"env": "dev"}, node=None))
    raw("POST", f"{NS}/pods", pod("c", {"legacy": "1"}))
    def names(query: str) -> list[str]:
        reply = raw("GET", f"{NS}/pods?{query}")
        assert reply.status == 200, reply.raw
        return [i["metadata"]["name"] for i in reply.body["items"]]
    assert names("labelSelector=env%20in%20(prod,dev),!legacy") == ["a", "b"]
    assert names("labelSelector=env%20notin%20(prod)") == ["b", "c"]
    assert names("labelSelector=tier") == ["a"]
    assert names("fieldSelector=spec.nodeName%3Dcapture-node-1") == ["a", "c"]
    assert names("fieldSelector=metadata.name!%3Da,spec.nodeName%3Dcapture-node-1") == ["c"]
    bad = raw("GET", f"{NS}/pods?fieldSelector=spec.foo%3Dbar")
    assert bad.status == 400 and bad.body["message"] == "field label not supported: spec.foo"


def test_pagination_pages_through_with_remaining_count(raw: Raw) -> None:
    for name in ("p1", "p2", "p3"):
        raw("POST", f"{NS}/configmaps", {"metadata": {"name": name}})
    first = raw("GET", f"{NS}/configmaps?limit=2").body
    assert [i["metadata"]["name"] for i in first["items"]] == ["p1", "p2"]
    assert first["metadata"]["remainingItemCount"] == 1
    token = first["metadata"]["continue"]
    second = raw("GET", f"{NS}/configmaps?limit=2&continue={token}").body
    assert [i["metadata"]["name"] for i in second["items"]] == ["p3"]
    assert "continue" not in second["metadata"]
    filtered = raw("GET", f"{NS}/configmaps?limit=1&labelSelector=").body
    assert "remainingItemCount" in filtered["metadata"]
    assert raw("GET", f"{NS}/configmaps?limit=1&continue=garbage").status == 400


def test_a_paged_list_across_namespaces_is_in_etcd_key_order_and_misses_none(raw: Raw) -> None:
    # etcd orders "<namespace>/<name>" as a string: "a-b/x" before "a/x" ('-' < '/'), unlike (namespace, name)
    for namespace in ("a", "a-b"):
        raw("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        raw("POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "x", "labels": {"t": "p"}}})
    seen, token = [], ""
    while True:
        page = raw("GET", "/api/v1/configmaps?labelSelector=t%3Dp&limit=1" + (f"&continue={token}" if token else ""))
        seen += [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in page.body["items"]]
        token = page.body["metadata"].get("continue", "")
        if not token:
            break
    assert seen == ["a-b/x", "a/x"]


def test_expired_continue_token_and_exact_list_are_410() -> None:
    srv = KubeAPIServer(watch_history=5).start()
    try:
        raw = Raw(srv)
        raw("POST", "/api/v1/namespaces", {"metadata": {"name": "capture"}})
        for n in range(4):
            raw("POST", f"{NS}/configmaps", {"metadata": {"name": f"c{n}"}})
        token = raw("GET", f"{NS}/configmaps?limit=1").body["metadata"]["continue"]
        old_rv = raw("GET", f"{NS}/configmaps").body["metadata"]["resourceVersion"]
        for n in range(10):
            raw("POST", f"{NS}/configmaps", {"metadata": {"name": f"d{n}"}})
        expired = raw("GET", f"{NS}/configmaps?limit=1&continue={token}")
        assert expired.status == 410 and expired.body["reason"] == "Expired"
        assert expired.body["metadata"]["continue"]
        exact = raw("GET", f"{NS}/configmaps?resourceVersion={old_rv}&resourceVersionMatch=Exact")
        assert exact.status == 410
        assert exact.body["message"] == "The resourceVersion for the provided list is too old."
        events, _ = watch_events(srv, f"{NS}/configmaps?watch=true&resourceVersion={old_rv}&timeoutSeconds=1")
        assert len(events) == 1 and events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410
    finally:
        srv.stop()


def test_future_resource_version_times_out_with_retry_after(raw: Raw) -> None:
    reply = raw("GET", f"{NS}/pods?resourceVersion=999999999")
    assert reply.status == 504 and reply.headers["Retry-After"] == "1"
    assert reply.body["details"]["retryAfterSeconds"] == 1


# --- watch ----------------------------------------------------------------------------------------

def test_watch_streams_changes_bookmarks_and_ends_cleanly(srv: KubeAPIServer, raw: Raw) -> None:
    rv = raw("GET", f"{NS}/pods").body["metadata"]["resourceVersion"]
    raw("POST", f"{NS}/pods", pod("w", {"case": "watch"}))
    make_ready(raw, "capture", "w")
    raw("DELETE", f"{NS}/pods/w")
    raw("DELETE", f"{NS}/pods/w?gracePeriodSeconds=0")
    events, clean = watch_events(srv, f"{NS}/pods?watch=true&allowWatchBookmarks=true&timeoutSeconds=1"
                                      f"&resourceVersion={rv}&labelSelector=case%3Dwatch")
    kinds = [e["type"] for e in events]
    assert kinds[:5] == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
    assert "BOOKMARK" in kinds[5:] and clean
    bookmark = next(e for e in events if e["type"] == "BOOKMARK")["object"]
    assert bookmark == {"kind": "Pod", "apiVersion": "v1", "metadata": {
        "resourceVersion": bookmark["metadata"]["resourceVersion"], "creationTimestamp": None},
        "spec": {"containers": None}, "status": {}}


def test_watch_resumes_from_a_resource_version_and_rv0_lists_first(srv: KubeAPIServer, raw: Raw) -> None:
    raw("POST", f"{NS}/configmaps", {"metadata": {"name": "one"}})
    mid = raw("GET", f"{NS}/configmaps").body["metadata"]["resourceVersion"]
    raw("POST", f"{NS}/configmaps", {"metadata": {"name": "two"}})
    resumed, _ = watch_events(srv, f"{NS}/configmaps?watch=true&timeoutSeconds=0.3&resourceVersion={mid}")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in resumed] == [("ADDED", "two")]
    initial, _ = watch_events(srv, f"{NS}/configmaps?watch=true&timeoutSeconds=0.3&resourceVersion=0")
    assert sorted(e["object"]["metadata"]["name"] for e in initial) == ["one", "two"]
    bad = raw("GET", f"{NS}/pods?watch=true&resourceVersion=abc")
    assert bad.status == 500 and "reason" not in bad.body


def test_watch_cut_mid_stream_by_fault(srv: KubeAPIServer, raw: Raw) -> None:
    srv.inject("GET", r"watch=true", action="cut-watch", delay_s=0.2)
    start = time.monotonic()
    _, clean = watch_events(srv, f"{NS}/pods?watch=true&timeoutSeconds=5")
    assert not clean and time.monotonic() - start < 2


# --- patches and apply ----------------------------------------------------------------------------

def test_strategic_merge_merges_conditions_and_containers(raw: Raw) -> None:
    cond = {"type": "GpuHealthy", "status": "False", "reason": "Xid"}
    reply = raw("PATCH", "/api/v1/nodes/capture-node-1/status", {"status": {"conditions": [cond]}},
                "application/strategic-merge-patch+json")
    types = [c["type"] for c in reply.body["status"]["conditions"]]
    assert types == ["Ready", "GpuHealthy"]
    raw("POST", f"{NS}/pods", {"metadata": {"name": "two"}, "spec": {"containers": [
        {"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]}})
    patched = raw("PATCH", f"{NS}/pods/two", {"spec": {"containers": [{"name": "b", "image": "b:2"}]}},
                  "application/strategic-merge-patch+json").body
    assert [(c["name"], c["image"]) for c in patched["spec"]["containers"]] == [("a", "a:1"), ("b", "b:2")]
    assert raw("PATCH", f"{NS}/pods/two", {"spec": {"containers": [{"name": "b", "image": "b:3"}]}},
               MERGE).status == 422


def test_json_patch_failure_leaves_object_unchanged(raw: Raw) -> None:
    raw("POST", f"{NS}/configmaps", {"metadata": {"name": "jp"}, "data": {"k": "v"}})
    ops = [{"op": "test", "path": "/data/k", "value": "no"}, {"op": "replace", "path": "/data/k", "value": "x"}]
    assert raw("PATCH", f"{NS}/configmaps/jp", ops, "application/json-patch+json").status == 422
    assert raw("GET", f"{NS}/configmaps/jp").body["data"] == {"k": "v"}


def test_server_side_apply_ownership_and_conflicts(raw: Raw) -> None:
    apply = "application/apply-patch+yaml"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"s": "a", "only": "1"}}
    assert raw("PATCH", f"{NS}/configmaps/ssa?fieldManager=a", body, apply).status == 201
    same = raw("PATCH", f"{NS}/configmaps/ssa?fieldManager=a", body, apply)
    assert same.status == 200
    other = {**body, "data": {"s": "b"}}
    conflict = raw("PATCH", f"{NS}/configmaps/ssa?fieldManager=b", other, apply)
    assert conflict.status == 409
    assert conflict.body["message"] == 'Apply failed with 1 conflict: conflict with "a": .data.s'
    forced = raw("PATCH", f"{NS}/configmaps/ssa?fieldManager=b&force=true", other, apply).body
    assert forced["data"] == {"s": "b", "only": "1"}
    owners = {e["manager"]: e["fieldsV1"] for e in forced["metadata"]["managedFields"]}
    assert owners["b"] == {"f:data": {".": {}, "f:s": {}}} and owners["a"] == {"f:data": {".": {}, "f:only": {}}}
    dropped = raw("PATCH", f"{NS}/configmaps/ssa?fieldManager=a", {**body, "data": {}}, apply).body
    assert dropped["data"] == {"s": "b"}
    yaml_body = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  c: \"yes\"\n"
    assert raw("PATCH", f"{NS}/configmaps/ssa?fieldManager=c", yaml_body, apply).body["data"]["c"] == "yes"


# --- deletion -------------------------------------------------------------------------------------

def test_finalizers_hold_an_object_until_removed(raw: Raw) -> None:
    raw("POST", f"{NS}/configmaps", {"metadata": {"name": "fin", "finalizers": ["x/hold"]}})
    held = raw("DELETE", f"{NS}/configmaps/fin").body
    assert held["metadata"]["deletionGracePeriodSeconds"] == 0 and held["metadata"]["finalizers"] == ["x/hold"]
    assert raw("GET", f"{NS}/configmaps/fin").status == 200
    assert raw("PATCH", f"{NS}/configmaps/fin", {"metadata": {"finalizers": None}}, MERGE).status == 200
    assert raw("GET", f"{NS}/configmaps/fin").status == 404


def test_graceful_pod_delete_shortens_and_unbound_goes_at_once(raw: Raw) -> None:
    raw("POST", f"{NS}/pods", pod("g"))
    first = raw("DELETE", f"{NS}/pods/g").body["metadata"]
    assert first["deletionGracePeriodSeconds"] == 30
    assert raw("DELETE", f"{NS}/pods/g?gracePeriodSeconds=10").body["metadata"]["deletionGracePeriodSeconds"] == 10
    assert raw("GET", f"{NS}/pods/g").status == 200
    assert raw("DELETE", f"{NS}/pods/g?gracePeriodSeconds=0").status == 200
    assert raw("GET", f"{NS}/pods/g").status == 404
    raw("POST", f"{NS}/pods", pod("u", node=None))
    raw("DELETE", f"{NS}/pods/u")
    assert raw("GET", f"{NS}/pods/u").status == 404


def test_dry_run_mutations_store_nothing(raw: Raw) -> None:
    created = raw("POST", f"{NS}/configmaps?dryRun=All", {"metadata": {"name": "dry"}})
    assert created.status == 201 and "resourceVersion" not in created.body["metadata"]
    assert raw("GET", f"{NS}/configmaps/dry").status == 404
    raw("POST", f"{NS}/configmaps", {"metadata": {"name": "real"}, "data": {"a": "1"}})
    assert raw("PATCH", f"{NS}/configmaps/real?dryRun=All", {"data": {"a": "2"}}, MERGE).body["data"]["a"] == "2"
    assert raw("GET", f"{NS}/configmaps/real").body["data"]["a"] == "1"
    assert raw("DELETE", f"{NS}/configmaps/real?dryRun=All").status == 200
    assert raw("GET", f"{NS}/configmaps/real").status == 200
    assert raw("POST", f"{NS}/configmaps?dryRun=Yes", {"metadata": {"name": "x"}}).status == 422


# --- eviction ---------------------------------------------------------------------------------------

def _pdb(name: str, app: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": {"app": app}}, **spec}}


def test_eviction_respects_the_budget(srv: KubeAPIServer, raw: Raw) -> None:
    pdbs = "/apis/policy/v1/namespaces/capture/poddisruptionbudgets"
    for name in ("e1", "e2"):
        raw("POST", f"{NS}/pods", pod(name, {"app": "e"}))
        make_ready(raw, "capture", name)
    raw("POST", pdbs, _pdb("budget", "e", minAvailable=1))
    status = until(lambda: (s := raw("GET", f"{pdbs}/budget").body.get("status", {})).get("expectedPods") == 2
                   and s)
    assert (status["disruptionsAllowed"], status["currentHealthy"], status["desiredHealthy"]) == (1, 2, 1)
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "e1"}}
    ok = raw("POST", f"{NS}/pods/e1/eviction", eviction)
    assert ok.status == 201 and ok.body == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                            "status": "Success", "code": 201}
    refused = raw("POST", f"{NS}/pods/e2/eviction", {**eviction, "metadata": {"name": "e2"}})
    assert refused.status == 429 and "Retry-After" not in refused.headers
    assert refused.body["details"]["causes"][0]["message"] == \
        "The disruption budget budget needs 1 healthy pods and has 1 currently"
    raw("POST", pdbs, _pdb("budget2", "e", maxUnavailable="50%"))
    two = raw("POST", f"{NS}/pods/e2/eviction", {**eviction, "metadata": {"name": "e2"}})
    assert two.status == 500 and "reason" not in two.body
    assert raw("POST", f"{NS}/pods/nope/eviction", {**eviction, "metadata": {"name": "nope"}}).status == 404


def test_a_pod_relabelled_from_one_budget_to_another_moves_both_statuses(raw: Raw) -> None:
    """A pod's change syncs the PDBs that select it now and those that did before (only those: the disruption
    controller's getPdbForPod), so a relabel leaves neither status stale."""
    pdbs = "/apis/policy/v1/namespaces/capture/poddisruptionbudgets"
    for name, app in (("m1", "old"), ("m2", "old"), ("m3", "new")):
        raw("POST", f"{NS}/pods", pod(name, {"app": app}))
        make_ready(raw, "capture", name)
    raw("POST", pdbs, _pdb("old", "old", minAvailable=1))
    raw("POST", pdbs, _pdb("new", "new", minAvailable=1))

    def healthy(name: str) -> int:
        return int(raw("GET", f"{pdbs}/{name}").body.get("status", {}).get("currentHealthy", -1))

    assert until(lambda: healthy("old") == 2 and healthy("new") == 1)
    raw("PATCH", f"{NS}/pods/m2", {"metadata": {"labels": {"app": "new"}}}, MERGE)
    assert until(lambda: healthy("old") == 1 and healthy("new") == 2)


def test_eviction_without_budget_deletes_gracefully(raw: Raw) -> None:
    raw("POST", f"{NS}/pods", pod("free"))
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "free"}}
    assert raw("POST", f"{NS}/pods/free/eviction?dryRun=All", body).status == 201
    assert "deletionTimestamp" not in raw("GET", f"{NS}/pods/free").body["metadata"]
    assert raw("POST", f"{NS}/pods/free/eviction", body).status == 201
    assert raw("GET", f"{NS}/pods/free").body["metadata"]["deletionGracePeriodSeconds"] == 30


# --- CRDs -------------------------------------------------------------------------------------------

CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "metadata": {"name": "gadgets.example.com"},
       "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "shortNames": ["gd"]},
                "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                              "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                  "spec": {"type": "object", "properties": {
                                      "x": {"type": "integer"},
                                      "mode": {"type": "string", "x-kubernetes-validations": [
                                          {"rule": "self == oldSelf", "message": "mode is immutable"}]}}},
                                  "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}}]}}


def test_crd_serves_resources_with_status_subresource(raw: Raw) -> None:
    crd = raw("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD).body
    assert {c["type"] for c in crd["status"]["conditions"]} == {"NamesAccepted", "Established"}
    discovery = raw("GET", "/apis/example.com/v1").body
    assert [r["name"] for r in discovery["resources"]] == ["gadgets", "gadgets/status"]
    base = "/apis/example.com/v1/namespaces/capture/gadgets"
    created = raw("POST", base, {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"},
                                 "spec": {"x": 1, "mode": "a", "extra": True}, "status": {"phase": "no"}})
    assert created.status == 201 and created.headers["Warning"] == '299 - "unknown field \\"spec.extra\\""'
    assert "status" not in created.body and list(created.body)[:2] == ["apiVersion", "kind"]
    main = raw("PATCH", f"{base}/g", {"status": {"phase": "ignored"}}, MERGE).body
    assert "status" not in main and main["metadata"]["generation"] == 1
    status = raw("PATCH", f"{base}/g/status", {"status": {"phase": "Ready"}, "spec": {"x": 9}}, MERGE).body
    assert status["status"] == {"phase": "Ready"} and status["spec"]["x"] == 1
    assert status["metadata"]["generation"] == 1
    assert raw("PATCH", f"{base}/g", {"spec": {"x": 2}}, MERGE).body["metadata"]["generation"] == 2
    assert raw("PATCH", f"{base}/g", {"metadata": {"labels": {"a": "b"}}}, MERGE).body["metadata"]["generation"] == 2
    immutable = raw("PATCH", f"{base}/g", {"spec": {"mode": "b"}}, MERGE)
    assert immutable.status == 422 and "mode is immutable" in immutable.body["message"]
    assert raw("PATCH", f"{base}/g", {"spec": {}}, "application/strategic-merge-patch+json").status == 415
    assert raw("GET", f"{base}/nope").body["message"] == 'gadgets.example.com "nope" not found'


# --- controllers ------------------------------------------------------------------------------------

def _job(name: str, backoff: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"backoffLimit": backoff, "template": {"spec": {
        "restartPolicy": "Never", "nodeName": "capture-node-1", "containers": [{"name": "m", "image": "x"}]}}}}


def test_job_controller_creates_pod_and_records_completion(raw: Raw) -> None:
    jobs = "/apis/batch/v1/namespaces/capture/jobs"
    job = raw("POST", jobs, _job("j")).body
    uid = job["metadata"]["uid"]
    pods = until(lambda: raw("GET", f"{NS}/pods?labelSelector=job-name%3Dj").body["items"])
    meta = pods[0]["metadata"]
    assert meta["generateName"] == "j-" and meta["finalizers"] == ["batch.kubernetes.io/job-tracking"]
    assert meta["labels"]["batch.kubernetes.io/controller-uid"] == uid
    assert meta["ownerReferences"][0] | {"uid": uid} == {"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                                         "uid": uid, "controller": True, "blockOwnerDeletion": True}
    raw("PATCH", f"{NS}/pods/{meta['name']}/status", {"status": {"phase": "Succeeded"}}, MERGE)
    status = until(lambda: (s := raw("GET", f"{jobs}/j").body["status"]).get("completionTime") and s)
    assert [c["type"] for c in status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert {(c["reason"], c["message"]) for c in status["conditions"]} == {
        ("CompletionsReached", "Reached expected number of succeeded pods")}
    assert (status["succeeded"], status["terminating"], status["ready"]) == (1, 0, 0)
    until(lambda: "finalizers" not in raw("GET", f"{NS}/pods/{meta['name']}").body["metadata"])


def test_job_backoff_then_failed_and_gc_modes(raw: Raw) -> None:
    jobs = "/apis/batch/v1/namespaces/capture/jobs"
    raw("POST", jobs, _job("f", backoff=1))
    for _ in range(2):
        name = until(lambda: [p["metadata"]["name"] for p in raw("GET", f"{NS}/pods?labelSelector=job-name%3Df")
                              .body["items"] if p["status"]["phase"] == "Pending"])[0]
        raw("PATCH", f"{NS}/pods/{name}/status", {"status": {"phase": "Failed"}}, MERGE)
    status = until(lambda: (s := raw("GET", f"{jobs}/f").body["status"]).get("conditions") and s)
    assert status["conditions"][0]["reason"] == "BackoffLimitExceeded" and status["failed"] == 2
    raw("DELETE", f"{jobs}/f?propagationPolicy=Background")
    until(lambda: not raw("GET", f"{NS}/pods?labelSelector=job-name%3Df").body["items"])
    raw("POST", jobs, _job("o"))
    until(lambda: raw("GET", f"{NS}/pods?labelSelector=job-name%3Do").body["items"])
    raw("DELETE", f"{jobs}/o")  # batch/v1 default: orphan
    until(lambda: raw("GET", f"{jobs}/o").status == 404)
    orphan = raw("GET", f"{NS}/pods?labelSelector=job-name%3Do").body["items"]
    assert orphan and "ownerReferences" not in orphan[0]["metadata"]


# --- auth, RBAC, faults, TLS ------------------------------------------------------------------------

def test_unknown_token_is_401_and_rbac_gives_403(srv: KubeAPIServer, raw: Raw) -> None:
    bad = raw("GET", "/api/v1/nodes", token="nope")
    assert bad.status == 401 and bad.raw == (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
                                             b'"message":"Unauthorized","reason":"Unauthorized","code":401}\n')
    srv.add_token("sa-token", "system:serviceaccount:capture:ctl")
    srv.enforce_rbac("system:serviceaccount:capture:ctl", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}])
    assert raw("GET", f"{NS}/pods", token="sa-token").status == 200
    denied = raw("GET", "/api/v1/nodes", token="sa-token")
    assert denied.status == 403 and denied.body["message"] == (
        'nodes is forbidden: User "system:serviceaccount:capture:ctl" cannot list resource "nodes" in API group '
        '"" at the cluster scope')
    delete = raw("DELETE", f"{NS}/pods/x", token="sa-token")
    assert delete.status == 403 and delete.body["details"] == {"name": "x", "kind": "pods"}
    assert ("system:serviceaccount:capture:ctl", "list", "", "nodes", "", None, None) in srv.requests


def test_fault_injection_status_reset_and_delay(srv: KubeAPIServer, raw: Raw) -> None:
    srv.inject("GET", r"/api/v1/nodes$", count=1, status=503, retry_after=2)
    failed = raw("GET", "/api/v1/nodes")
    assert failed.status == 503 and failed.headers["Retry-After"] == "2"
    assert failed.body["reason"] == "ServiceUnavailable"
    assert raw("GET", "/api/v1/nodes").status == 200
    srv.inject("GET", r"/api/v1/nodes$", action="reset")
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        raw("GET", "/api/v1/nodes")
    srv.inject("GET", r"/api/v1/nodes$", action="delay", delay_s=0.3)
    start = time.monotonic()
    assert raw("GET", "/api/v1/nodes").status == 200 and time.monotonic() - start >= 0.3


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls_serves_with_a_self_signed_certificate() -> None:
    srv = KubeAPIServer(tls=True).start()
    try:
        assert srv.url.startswith("https://") and srv.ca_file
        context = ssl.create_default_context(cafile=srv.ca_file)
        conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=context, timeout=5)
        conn.request("GET", "/api/v1/namespaces", headers={"Authorization": f"Bearer {srv.admin_token}"})
        assert conn.getresponse().status == 200
    finally:
        srv.stop()


def test_standalone_entry_point_prints_url_and_writes_kubeconfig(tmp_path: Any) -> None:
    out = tmp_path / "kc"
    proc = subprocess.Popen([sys.executable, "-m", "sim.kubeapi", "--port", "0", "--kubeconfig-out", str(out)],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip() if proc.stdout else ""
        assert url.startswith("http://127.0.0.1:") and f"server: {url}" in out.read_text()
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_watch_from_rv_reports_modified_and_selector_exit_as_deleted(srv: KubeAPIServer, raw: Raw) -> None:
    raw("POST", f"{NS}/configmaps", {"metadata": {"name": "m", "labels": {"keep": "yes"}}})
    rv = raw("GET", f"{NS}/configmaps").body["metadata"]["resourceVersion"]
    raw("PATCH", f"{NS}/configmaps/m", {"data": {"a": "1"}}, MERGE)
    raw("PATCH", f"{NS}/configmaps/m", {"metadata": {"labels": {"keep": "no"}}}, MERGE)
    events, _ = watch_events(srv, f"{NS}/configmaps?watch=true&timeoutSeconds=0.3&resourceVersion={rv}"
                                  "&labelSelector=keep%3Dyes")
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
