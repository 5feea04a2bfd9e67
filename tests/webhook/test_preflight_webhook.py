"""The preflight webhook (issue 46): the AdmissionReview v1 contract (uid echoed, base64 JSONPatch), which pods get
the init container and with what (the pod's GPU limits or DRA claims, no privilege), which are left alone, and
the HTTPS server: a test-only certificate made with openssl, many concurrent reviews answered within the
webhook's timeout, a rotated certificate read again."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import ssl
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.policy.preflight import PreflightPolicy
from gpuremediate.webhook import mutate
from gpuremediate.webhook.server import PATH, CertificateFiles, WebhookServer

IMAGE = "ghcr.io/example/gpuremediate:1.0.0"
SETTINGS = mutate.Settings(IMAGE)
TIMEOUT_S = 3.0  # the chart's timeoutSeconds


def gpu_pod(gpus: str = "2", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-0", "namespace": "ml", **meta},
            "spec": {"containers": [
                {"name": "train", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": gpus}}},
                {"name": "sidecar", "image": "log", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"name": "cpu", "image": "x"}]}}


def admission_review(pod: dict[str, Any], operation: str = "CREATE", uid: str = "705ab4f5-6393-11e8-b7cc") \
        -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": "ml", "operation": operation, "object": pod, "dryRun": False}}


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    assert response["allowed"] is True
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def test_a_gpu_pod_gets_the_init_container_with_its_gpus_and_no_privilege() -> None:
    answer, result = mutate.review(admission_review(gpu_pod()), SETTINGS)
    assert result == mutate.INJECTED
    assert (answer["apiVersion"], answer["kind"], answer["response"]["uid"]) == (
        "admission.k8s.io/v1", "AdmissionReview", "705ab4f5-6393-11e8-b7cc")
    [init, label] = patch_of(answer)
    assert (init["op"], init["path"]) == ("add", "/spec/initContainers")
    [container] = init["value"]
    assert container["name"] == "gpuremediate-preflight" and container["image"] == IMAGE
    assert container["args"][:3] == ["preflight", "--on-unknown", "pass"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "3"  # the pod's GPUs, the sum of its containers
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsNonRoot"] is True and "privileged" not in security
    assert label == {"op": "add", "path": "/metadata/labels", "value": {"gpuremediate.io/preflight": "injected"}}


def test_existing_init_containers_and_labels_are_kept() -> None:
    pod = gpu_pod(labels={"app": "train"})
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "x"}]
    [init, label] = patch_of(mutate.review(admission_review(pod), SETTINGS)[0])
    assert init["path"] == "/spec/initContainers/0"  # first: the GPUs checked before anything else runs
    assert label["path"] == "/metadata/labels/gpuremediate.io~1preflight"


def test_a_dra_pod_gets_the_claims_its_containers_name() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
        "containers": [{"name": "a", "resources": {"claims": [{"name": "gpus"}]}},
                       {"name": "b", "resources": {"claims": [{"name": "gpus"}]}}]}}
    [init, _] = patch_of(mutate.review(admission_review(pod), SETTINGS)[0])
    resources = init["value"][0]["resources"]
    assert resources["claims"] == [{"name": "gpus"}] and "nvidia.com/gpu" not in resources["limits"]


@pytest.mark.parametrize(("pod", "result"), [
    ({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}, mutate.SKIP_NO_GPU),
    (gpu_pod(annotations={"gpuremediate.io/preflight": "skip"}), mutate.SKIP_OPTED_OUT),
    (gpu_pod(ownerReferences=[{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm", "uid": "u",
                               "controller": True}]), mutate.SKIP_DAEMONSET),
    (gpu_pod(labels={"gpuremediate.io/job": "validate"}), mutate.SKIP_OWN_JOB),
])
def test_pods_left_alone(pod: dict[str, Any], result: str) -> None:
    answer, got = mutate.review(admission_review(pod), SETTINGS)
    assert got == result and patch_of(answer) == []


def test_not_twice_and_not_on_update() -> None:
    pod = gpu_pod()
    pod["spec"]["initContainers"] = [mutate.init_container(pod, SETTINGS)]
    assert mutate.review(admission_review(pod), SETTINGS)[1] == mutate.SKIP_ALREADY
    assert mutate.review(admission_review(gpu_pod(), operation="UPDATE"), SETTINGS)[1] == mutate.SKIP_NOT_A_POD_CREATE
    with pytest.raises(ValueError, match="request.uid"):
        mutate.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, SETTINGS)


def test_the_policy_shapes_the_command() -> None:
    policy = PreflightPolicy(on_unknown="fail", dcgm_diag=False, command="all_reduce_perf -g 8", command_timeout_s=60)
    args = mutate.init_container(gpu_pod(), mutate.Settings(IMAGE, policy))["args"]
    assert args == ["preflight", "--on-unknown", "exit", "--dcgmi", "no", "--expect-gpus", "3",
                    "--command", "all_reduce_perf -g 8", "--command-timeout", "60"]


# ---------------------------------------------------------------- the HTTPS server


def make_cert(folder: Path, name: str = "gpuremediate-preflight.gpuremediate-system.svc") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name},IP:127.0.0.1", "-keyout", str(folder / "tls.key"),
                    "-out", str(folder / "tls.crt")], check=True, capture_output=True)
    return folder


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl (Debian's) not installed")


def post(port: int, ca: Path, body: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=TIMEOUT_S)
    try:
        conn.request("POST", PATH, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        peer = conn.sock.getpeercert() if conn.sock else None  # type: ignore[union-attr]
        serial = str((peer or {}).get("serialNumber", ""))
        return response.status, json.loads(data) if response.status == 200 else {}, serial
    finally:
        conn.close()


@needs_openssl
def test_many_concurrent_reviews_are_answered_within_the_timeout(tmp_path: Path) -> None:
    certs = make_cert(tmp_path / "tls")
    observed: list[str] = []
    server = WebhookServer(lambda: SETTINGS, CertificateFiles(str(certs / "tls.crt"), str(certs / "tls.key")),
                           "127.0.0.1", 0, observe=lambda result, _s: observed.append(result)).start()
    try:
        reviews = [admission_review(gpu_pod(), uid=f"uid-{i}") for i in range(200)]
        with ThreadPoolExecutor(max_workers=32) as pool:  # a socket timeout of TIMEOUT_S fails a slow answer
            answers = list(pool.map(lambda r: post(server.port, certs / "tls.crt", r), reviews))
        assert [a[0] for a in answers] == [200] * 200
        assert sorted(a[1]["response"]["uid"] for a in answers) == sorted(f"uid-{i}" for i in range(200))
        assert all(patch_of(a[1]) for a in answers)
        assert observed.count(mutate.INJECTED) == 200
    finally:
        server.stop()


@needs_openssl
def test_a_rotated_certificate_is_read_again_and_a_bad_body_is_a_400(tmp_path: Path) -> None:
    certs = make_cert(tmp_path / "tls")
    files = CertificateFiles(str(certs / "tls.crt"), str(certs / "tls.key"))
    server = WebhookServer(lambda: SETTINGS, files, "127.0.0.1", 0).start()
    try:
        _, _, before = post(server.port, certs / "tls.crt", admission_review(gpu_pod()))
        rotated = make_cert(tmp_path / "new")
        for name in ("tls.crt", "tls.key"):  # as the kubelet swaps a Secret's files in
            (rotated / name).replace(certs / name)
        files.current(now=1e12)  # the next check (at most once a second) reads it
        status, answer, after = post(server.port, certs / "tls.crt", admission_review(gpu_pod()))
        assert status == 200 and patch_of(answer) and files.reloads == 1 and after != before
        conn = http.client.HTTPSConnection("127.0.0.1", server.port,
                                           context=ssl.create_default_context(cafile=str(certs / "tls.crt")))
        conn.request("POST", PATH, b"{not json", {"Content-Type": "application/json"})
        assert conn.getresponse().status == 400
        conn.close()
    finally:
        server.stop()
