"""What a real v1.36 control plane does that the emulator learned from shared/data/kube-apiserver-1.36:
the mux's text/plain 404, the annotation size limit, a slow first custom-resource create."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubeapi_support import Raw

from sim.kubeapi import KubeAPIServer

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
