"""What a real v1.36 control plane does that the emulator learned from shared/data/kube-apiserver-1.36:
the mux's text/plain 404, the annotation size limit, a slow first custom-resource create."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubeapi_support import Raw

from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

MERGE = "application/merge-patch+json"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def gadget_crd(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gadgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": schema or {
                                       "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.mark.parametrize("path", ["/apis/gpuremediate.io/v1alpha1", "/apis/gpuremediate.io",
                                  "/apis/gpuremediate.io/v1alpha1/maintenancerequests", "/apis/batch/v9",
                                  "/api/v2", "/nothing-here"])
def test_an_unserved_group_version_or_path_is_the_muxs_plain_404(raw: Raw, path: str) -> None:
    reply = raw("GET", path)
    assert (reply.status, reply.raw) == (404, b"404 page not found\n")
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.headers["X-Content-Type-Options"] == "nosniff"


def test_an_unknown_resource_of_a_served_group_version_is_still_a_status(raw: Raw) -> None:
    reply = raw("GET", "/apis/batch/v1/nothings")
    assert reply.status == 404 and reply.headers["Content-Type"] == "application/json"
    assert reply.body["message"] == "the server could not find the requested resource"


def test_annotations_over_256_kib_are_refused(raw: Raw) -> None:
    key = "example.com/blob"
    at_limit = {"metadata": {"name": "at-limit", "annotations": {key: "x" * (262144 - len(key))}}}
    assert raw("POST", "/api/v1/namespaces/capture/configmaps", at_limit).status == 201
    over = {"metadata": {"name": "over", "annotations": {key: "x" * (262145 - len(key))}}}
    reply = raw("POST", "/api/v1/namespaces/capture/configmaps", over)
    assert reply.status == 422
    assert reply.body["message"] == ('ConfigMap "over" is invalid: metadata.annotations: Too long: '
                                     "must have at most 262144 bytes")
    assert reply.body["details"]["causes"] == [{"reason": "FieldValueTooLong", "field": "metadata.annotations",
                                                "message": "Too long: must have at most 262144 bytes"}]
    grown = raw("PATCH", "/api/v1/nodes/capture-node-1",
                {"metadata": {"annotations": {"a": "y" * 200000, "b": "z" * 70000}}}, MERGE)
    assert grown.status == 422 and "metadata.annotations: Too long" in grown.body["message"]


def test_a_custom_resource_created_right_after_its_crd_can_wait_for_storage(srv: KubeAPIServer, raw: Raw) -> None:
    srv.first_cr_create_delay_s = 0.6
    assert raw("POST", CRDS, gadget_crd()).status == 201
    started = time.monotonic()
    created = raw("POST", "/apis/example.com/v1/namespaces/capture/gadgets",
                  {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}})
    assert created.status == 201
    assert time.monotonic() - started >= 0.5


DATA_136 = Path("/work/shared/data/kube-apiserver-1.36")


def _capture(case: str) -> dict[str, Any]:
    path = next(DATA_136.glob(f"{case}*.json"), None)
    if path is None:
        pytest.skip(f"capture {case} of kube-apiserver-1.36 not present")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def test_the_plain_404_is_the_captured_one(raw: Raw) -> None:
    real = next(e for e in _capture("31")["exchanges"] if e["request"]["path"] == "/apis/gpuremediate.io/v1alpha1")
    ours = raw("GET", "/apis/gpuremediate.io/v1alpha1")
    assert (ours.status, ours.reason, ours.raw.decode()) == (real["response"]["status"], real["response"]["reason"],
                                                             real["response"]["body_raw"])
    for header in ("Content-Type", "Cache-Control", "X-Content-Type-Options"):
        assert ours.headers[header] == real["response"]["headers"][header]


def test_a_completed_job_has_the_captured_conditions(raw: Raw) -> None:
    real = next(b["status"]["conditions"] for e in _capture("33")["exchanges"]
                if isinstance(b := e["response"].get("body"), dict) and "SuccessCriteriaMet" in json.dumps(b)
                and "conditions" in (b.get("status") or {}))
    job = {"metadata": {"name": "j"}, "spec": {"template": {"spec": {
        "restartPolicy": "Never", "nodeName": "capture-node-1", "containers": [{"name": "m", "image": "x"}]}}}}
    assert raw("POST", "/apis/batch/v1/namespaces/capture/jobs", job).status == 201
    pods = wait_for(lambda: raw("GET", "/api/v1/namespaces/capture/pods?labelSelector=job-name%3Dj").body["items"],
                    5, "the Job's pod")
    raw("PATCH", f"/api/v1/namespaces/capture/pods/{pods[0]['metadata']['name']}/status",
        {"status": {"phase": "Succeeded"}}, MERGE)
    ours = wait_for(lambda: raw("GET", "/apis/batch/v1/namespaces/capture/jobs/j").body["status"].get("conditions"),
                    5, "the Job's conditions")
    def shape(conditions: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(c["type"], c["status"], c["reason"], c["message"], sorted(c)) for c in conditions]
    assert shape(ours) == shape(real)
