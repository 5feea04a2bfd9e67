"""The emulator reads the protobuf bodies Helm v4 sends for its release Secrets (sim/kube_protobuf.py): a Secret,
a ConfigMap and a Namespace created from protobuf are stored as the same JSON objects, a DeleteOptions body is
obeyed, and a body it cannot read is a 400 naming the kind (a custom resource's protobuf stays a 415)."""

from __future__ import annotations

import base64

from kubeapi_support import Raw

from sim import kube_protobuf

PB = kube_protobuf.MEDIA_TYPE


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def entry(number: int, key: str, value: bytes | str) -> bytes:
    return field(number, field(1, key) + field(2, value))


def meta(name: str, namespace: str = "", labels: dict[str, str] | None = None) -> bytes:
    body = field(1, name) + field(2, "") + field(3, namespace) + field(6, "")  # gogo writes empty strings too
    for k, v in (labels or {}).items():
        body += entry(11, k, v)
    return body + entry(12, "note", "from protobuf")


def envelope(api_version: str, kind: str, raw_object: bytes) -> bytes:
    return kube_protobuf.MAGIC + field(1, field(1, api_version) + field(2, kind)) + field(2, raw_object) + \
        field(3, "") + field(4, "")


def test_a_secret_from_protobuf_is_stored_as_its_json(raw: Raw) -> None:
    payload = b"\x1f\x8b\x00binary release"
    secret = field(1, meta("sh.helm.release.v1.r.v1", "capture", {"owner": "helm", "status": "deployed"})) + \
        entry(2, "release", payload) + field(3, "helm.sh/release.v1") + field(5, 1)
    made = raw("POST", "/api/v1/namespaces/capture/secrets", envelope("v1", "Secret", secret), PB)
    assert made.status == 201, made.raw
    got = raw("GET", "/api/v1/namespaces/capture/secrets/sh.helm.release.v1.r.v1").body
    assert base64.b64decode(got["data"]["release"]) == payload
    assert got["type"] == "helm.sh/release.v1" and got["immutable"] is True
    assert got["metadata"]["labels"] == {"owner": "helm", "status": "deployed"}
    assert got["metadata"]["annotations"] == {"note": "from protobuf"}
    listed = raw("GET", "/api/v1/namespaces/capture/secrets?labelSelector=owner%3Dhelm").body
    assert [s["metadata"]["name"] for s in listed["items"]] == ["sh.helm.release.v1.r.v1"]


def test_configmap_and_namespace_and_delete_options(raw: Raw) -> None:
    cm = field(1, meta("cm", "capture")) + entry(2, "policy.toml", "[drain]\nmode = \"Immediate\"\n")
    assert raw("POST", "/api/v1/namespaces/capture/configmaps", envelope("v1", "ConfigMap", cm), PB).status == 201
    data = raw("GET", "/api/v1/namespaces/capture/configmaps/cm").body["data"]
    assert data == {"policy.toml": "[drain]\nmode = \"Immediate\"\n"}
    ns = field(1, meta("helm-made")) + field(2, field(1, "kubernetes"))
    assert raw("POST", "/api/v1/namespaces", envelope("v1", "Namespace", ns), PB).status == 201
    assert raw("GET", "/api/v1/namespaces/helm-made").status == 200
    # DeleteOptions with a failing precondition: refused (the body was read), then without one: deleted.
    wrong = envelope("meta.k8s.io/v1", "DeleteOptions", field(2, field(1, "not-its-uid") + field(2, "")))
    assert raw("DELETE", "/api/v1/namespaces/capture/configmaps/cm", wrong, PB).status == 409
    background = envelope("meta.k8s.io/v1", "DeleteOptions", field(1, 0) + field(4, "Background"))
    assert raw("DELETE", "/api/v1/namespaces/capture/configmaps/cm", background, PB).status == 200
    assert raw("GET", "/api/v1/namespaces/capture/configmaps/cm").status == 404


def test_an_unreadable_body_is_refused_naming_the_kind(raw: Raw) -> None:
    pod = envelope("v1", "Pod", field(1, meta("p", "capture")))
    refused = raw("POST", "/api/v1/namespaces/capture/pods", pod, PB)
    assert refused.status == 400 and "Pod" in refused.body["message"], refused.raw
    assert raw("POST", "/api/v1/namespaces/capture/secrets", b"not protobuf", PB).status == 400
    wrong_kind = envelope("v1", "ConfigMap", field(1, meta("x", "capture")))
    assert raw("POST", "/api/v1/namespaces/capture/secrets", wrong_kind, PB).status == 400
