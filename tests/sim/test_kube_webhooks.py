"""The emulator calls mutating admission webhooks on create as kube-apiserver does (sim.kube_webhooks): the
preflight webhook's own configuration (manifests/components/preflight) against the controller's own webhook
server, and a recording webhook for the request's fields, refusals, patches and failures."""

from __future__ import annotations

import base64
import copy
import json
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubeapi_support import Raw

from gpuremediate.kube import miniyaml
from gpuremediate.vocab.preflight import CONTAINER_NAME
from gpuremediate.webhook.mutate import Settings
from gpuremediate.webhook.server import CertificateFiles, WebhookServer
from sim import kube_cel
from sim.kube_resources import builtin_types
from sim.kube_webhooks import rule_matches
from sim.kubeapi import KubeAPIServer

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl (Debian's) not installed")
ROOT = Path(__file__).resolve().parents[2]
SERVICE = "gpuremediate-preflight.gpuremediate-system.svc"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def make_cert(folder: Path, name: str = SERVICE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(folder / "tls.key"),
                    "-out", str(folder / "tls.crt")], check=True, capture_output=True)
    return folder


def preflight_config(ca: Path, **hook: Any) -> dict[str, Any]:
    """The kustomize component's MutatingWebhookConfiguration, with the CA cert-manager would inject."""
    config = miniyaml.loads((ROOT / "manifests/components/preflight/mutatingwebhookconfiguration.yaml").read_text())
    config["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode((ca / "tls.crt").read_bytes()).decode()
    config["webhooks"][0].update(hook)
    return dict(config)


def namespace(raw: Raw, name: str, labels: dict[str, str] | None = None) -> None:
    assert raw("POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}}).status == 201
    deadline = time.monotonic() + 10
    while raw("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default").status != 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def gpu_pod(name: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **meta},
            "spec": {"containers": [{"name": "train", "image": "trainer:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}


def create(raw: Raw, ns: str, pod: dict[str, Any], query: str = "") -> Any:
    return raw("POST", f"/api/v1/namespaces/{ns}/pods{query}", pod)


def init_names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"].get("initContainers") or []]


@pytest.fixture
def preflight(srv: KubeAPIServer, raw: Raw, tmp_path: Path) -> Iterator[Path]:
    """The controller's webhook server behind the Service the configuration names; its certificate's folder."""
    certs = make_cert(tmp_path / "tls")
    server = WebhookServer(lambda: Settings(image="gpuremediate:test"),
                           CertificateFiles(str(certs / "tls.crt"), str(certs / "tls.key")), "127.0.0.1", 0).start()
    srv.webhooks.routes["gpuremediate-system/gpuremediate-preflight:443"] = f"127.0.0.1:{server.port}"
    namespace(raw, "train", {"gpuremediate.io/preflight": "enabled"})
    yield certs
    server.stop()


def test_the_preflight_configuration_puts_the_init_container_on_an_opted_in_gpu_pod(
        srv: KubeAPIServer, raw: Raw, preflight: Path) -> None:
    assert raw("POST", CONFIGS, preflight_config(preflight)).status == 201
    reply = create(raw, "train", gpu_pod("job-0"))
    assert reply.status == 201, reply.raw
    pod = reply.body
    assert init_names(pod) == [CONTAINER_NAME]
    assert pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["metadata"]["labels"]["gpuremediate.io/preflight"] == "injected"
    assert init_names(raw("GET", "/api/v1/namespaces/train/pods/job-0").body) == [CONTAINER_NAME]


@pytest.mark.parametrize("pod", [
    gpu_pod("opted-out", annotations={"gpuremediate.io/preflight": "skip"}),
    gpu_pod("daemon", ownerReferences=[{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                                        "uid": "5d7b6f1e-0000-4000-8000-000000000001", "controller": True}]),
    gpu_pod("own-job", labels={"gpuremediate.io/job": "validate"}),
], ids=["annotation-skip", "daemonset", "own-job"])
def test_selectors_and_match_conditions_keep_pods_off_the_webhook(
        srv: KubeAPIServer, raw: Raw, preflight: Path, pod: dict[str, Any]) -> None:
    assert raw("POST", CONFIGS, preflight_config(preflight)).status == 201
    reply = create(raw, "train", copy.deepcopy(pod))
    assert reply.status == 201, reply.raw
    assert init_names(reply.body) == []
    assert srv.webhooks.calls == []  # not called at all: the API server's selectors decided


def test_a_namespace_not_opted_in_is_not_called(srv: KubeAPIServer, raw: Raw, preflight: Path) -> None:
    assert raw("POST", CONFIGS, preflight_config(preflight)).status == 201
    namespace(raw, "plain")
    assert init_names(create(raw, "plain", gpu_pod("p")).body) == []
    assert srv.webhooks.calls == []


@pytest.mark.parametrize("policy, status", [("Ignore", 201), ("Fail", 500)])
def test_a_webhook_down_ignored_or_refusing(srv: KubeAPIServer, raw: Raw, preflight: Path, policy: str,
                                            status: int) -> None:
    srv.webhooks.routes["gpuremediate-system/gpuremediate-preflight:443"] = "127.0.0.1:1"  # nothing listens
    assert raw("POST", CONFIGS, preflight_config(preflight, failurePolicy=policy)).status == 201
    reply = create(raw, "train", gpu_pod("p"))
    assert reply.status == status, reply.raw
    if status == 201:
        assert init_names(reply.body) == []
    else:
        assert reply.body["reason"] == "InternalError"
        assert 'failed calling webhook "preflight.gpuremediate.io"' in reply.body["message"]
        assert raw("GET", "/api/v1/namespaces/train/pods/p").status == 404


def test_a_certificate_the_ca_bundle_does_not_sign_is_a_failed_call(srv: KubeAPIServer, raw: Raw, preflight: Path,
                                                                   tmp_path: Path) -> None:
    other = make_cert(tmp_path / "other")
    assert raw("POST", CONFIGS, preflight_config(other, failurePolicy="Fail")).status == 201
    reply = create(raw, "train", gpu_pod("p"))
    assert reply.status == 500 and "certificate verify failed" in reply.body["message"], reply.raw
    assert srv.webhooks.calls[-1][1] == "failed"


# ---------------------------------------------------------------- a recording webhook


class Recorder:
    def __init__(self, certs: Path) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.answer: Callable[[dict[str, Any]], dict[str, Any]] = lambda req: {"uid": req["uid"], "allowed": True}
        self.delay_s = 0.0
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                recorder.reviews.append(review)
                time.sleep(recorder.delay_s)
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": recorder.answer(review["request"])}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])


@pytest.fixture
def recorder(srv: KubeAPIServer, raw: Raw, tmp_path: Path) -> Iterator[tuple[Recorder, Path]]:
    certs = make_cert(tmp_path / "rec", "recorder.hooks.svc")
    rec = Recorder(certs)
    srv.webhooks.routes["hooks/recorder:8443"] = f"127.0.0.1:{rec.port}"
    namespace(raw, "work")
    yield rec, certs
    rec.httpd.shutdown()
    rec.httpd.server_close()


def recording_config(certs: Path, **hook: Any) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "recorder"},
            "webhooks": [{"name": "recorder.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "clientConfig": {"service": {"namespace": "hooks", "name": "recorder", "port": 8443,
                                                       "path": "/mutate"},
                                           "caBundle": base64.b64encode((certs / "tls.crt").read_bytes()).decode()},
                          "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                     "resources": ["pods"], "scope": "Namespaced"}], **hook}]}


def test_the_admission_review_request_carries_what_kube_apiserver_sends(raw: Raw,
                                                                        recorder: tuple[Recorder, Path]) -> None:
    rec, certs = recorder
    assert raw("POST", CONFIGS, recording_config(certs)).status == 201
    assert create(raw, "work", gpu_pod("seen"), "?dryRun=All").status == 201
    review = rec.reviews[-1]
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    request = review["request"]
    assert request["uid"] and request["operation"] == "CREATE" and request["dryRun"] is True
    assert request["kind"] == request["requestKind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (request["namespace"], request["name"]) == ("work", "seen")
    assert request["userInfo"]["username"] == "kubernetes-admin"
    assert request["object"]["spec"]["containers"][0]["name"] == "train"
    assert request["oldObject"] is None


def test_a_denial_refuses_with_its_message_and_patches_apply_in_order(raw: Raw,
                                                                      recorder: tuple[Recorder, Path]) -> None:
    rec, certs = recorder
    assert raw("POST", CONFIGS, recording_config(certs)).status == 201
    rec.answer = lambda req: {"uid": req["uid"], "allowed": False, "status": {"message": "no GPUs on Sunday"}}
    reply = create(raw, "work", gpu_pod("denied"))
    assert reply.status == 403
    assert reply.body["message"] == 'admission webhook "recorder.example.com" denied the request: no GPUs on Sunday'
    ops = [{"op": "replace", "path": "/spec/containers/0/image", "value": "trainer:2"},
           {"op": "add", "path": "/metadata/annotations", "value": {"seen": "yes"}},
           {"op": "remove", "path": "/spec/containers/0/resources/limits"}]
    rec.answer = lambda req: {"uid": req["uid"], "allowed": True, "patchType": "JSONPatch",
                              "patch": base64.b64encode(json.dumps(ops).encode()).decode()}
    pod = create(raw, "work", gpu_pod("patched")).body
    assert pod["spec"]["containers"][0]["image"] == "trainer:2"
    assert pod["metadata"]["annotations"] == {"seen": "yes"}
    assert "limits" not in pod["spec"]["containers"][0]["resources"]


@pytest.mark.parametrize("policy, status", [("Ignore", 201), ("Fail", 500)])
def test_a_slow_webhook_times_out_and_a_wrong_uid_is_a_failed_call(raw: Raw, recorder: tuple[Recorder, Path],
                                                                    policy: str, status: int) -> None:
    rec, certs = recorder
    assert raw("POST", CONFIGS, recording_config(certs, timeoutSeconds=1, failurePolicy=policy)).status == 201
    rec.delay_s = 2.0
    reply = create(raw, "work", gpu_pod("slow"))
    assert reply.status == status
    if status == 500:
        assert "context deadline exceeded" in reply.body["message"]
    rec.delay_s = 0.0
    rec.answer = lambda req: {"uid": "not-" + req["uid"], "allowed": False}
    assert create(raw, "work", gpu_pod("wrong-uid")).status == status


def test_rules_match_operations_groups_resources_and_scope() -> None:
    pods = next(rt for rt in builtin_types() if rt.resource == "pods")
    nodes = next(rt for rt in builtin_types() if rt.resource == "nodes")
    rule = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
            "scope": "Namespaced"}
    assert rule_matches(rule, pods, "CREATE")
    assert not rule_matches(rule, pods, "UPDATE")
    assert not rule_matches(rule, pods, "CREATE", subresource="status")
    assert not rule_matches({**rule, "resources": ["*"]}, nodes, "CREATE")  # scope Namespaced
    assert rule_matches({**rule, "resources": ["*/*"], "scope": "*"}, pods, "CREATE", subresource="eviction")


def test_cel_exists_and_all_macros() -> None:
    refs = {"object": {"metadata": {"ownerReferences": [{"kind": "Job"}, {"kind": "DaemonSet"}]}}}
    assert kube_cel.evaluate(kube_cel.compile_rule(
        "object.metadata.ownerReferences.exists(r, r.kind == 'DaemonSet')"), refs) is True
    assert kube_cel.evaluate(kube_cel.compile_rule(
        "object.metadata.ownerReferences.all(r, r.kind == 'DaemonSet')"), refs) is False
    with pytest.raises(kube_cel.CelError):
        kube_cel.compile_rule("object.metadata.ownerReferences.exists(r.kind == 'x')")
