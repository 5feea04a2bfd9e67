"""The emulator's Table format: what `kubectl get` prints (issue 50: `kubectl get nodes` showed only NAME and AGE).

Against kube-apiserver's exchange 30 (shared/data/kube-apiserver/30-table-format.json): the column definitions,
cells (all but AGE, a time), row objects per includeObject, the fallback Accept kubectl sends, 406; then the kinds a
sandbox user looks at (nodes cordoned and NotReady, pods, events, jobs, the project's CRDs by their
additionalPrinterColumns), and `kubectl get` itself when it is installed."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.kube import miniyaml
from sim.kube_tables import human, jsonpath
from sim.kubeapi import KubeAPIServer

DATA = Path("/work/shared/data/kube-apiserver")
if not DATA.exists():
    DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "kube-apiserver"
ROOT = Path(__file__).resolve().parents[2]
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
KUBECTL_ACCEPT = f"{TABLE},application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"


def _ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def srv() -> Iterator[KubeAPIServer]:
    server = KubeAPIServer().start()
    yield server
    server.stop()


def call(srv: KubeAPIServer, method: str, path: str, body: Any = None, accept: str | None = None,
         content_type: str = "application/json") -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    headers = {"Authorization": f"Bearer {srv.admin_token}", "Content-Type": content_type}
    if accept is not None:
        headers["Accept"] = accept
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    return response.status, json.loads(raw)


def capture(step: str) -> dict[str, Any]:
    case = json.loads((DATA / "30-table-format.json").read_text())
    return next(e for e in case["exchanges"] if e["step"] == step)


@pytest.fixture(scope="module")
def captured(srv: KubeAPIServer) -> KubeAPIServer:
    """The capture's objects: namespace capture, node capture-node-1, pods list-a..c on it, Running, no IPs."""
    assert call(srv, "POST", "/api/v1/namespaces", {"metadata": {"name": "capture"}})[0] == 201
    node = {"metadata": {"name": "capture-node-1", "labels": {"capture": "yes", "capture.example.com/role": "db",
                                                              "kubernetes.io/hostname": "capture-node-1"}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
                                       "lastHeartbeatTime": _ago(5), "lastTransitionTime": _ago(5)}]}}
    assert call(srv, "POST", "/api/v1/nodes", node)[0] == 201
    for name in ("list-a", "list-b", "list-c"):
        pod = {"metadata": {"name": name}, "spec": {"nodeName": "capture-node-1",
                                                    "containers": [{"name": "c", "image": "busybox"}]}}
        assert call(srv, "POST", "/api/v1/namespaces/capture/pods", pod)[0] == 201
        assert call(srv, "PATCH", f"/api/v1/namespaces/capture/pods/{name}/status", {"status": {"phase": "Running"}},
                    content_type="application/merge-patch+json")[0] == 200
    return srv


def _definitions(table: dict[str, Any]) -> list[dict[str, Any]]:
    return table["columnDefinitions"]


def _no_age(table: dict[str, Any], rows: list[list[Any]]) -> list[list[Any]]:
    age = [c["name"] for c in _definitions(table)].index("Age")
    return [[cell for i, cell in enumerate(row) if i != age] for row in rows]


def test_nodes_as_a_table_as_kube_apiserver_answers(captured: KubeAPIServer) -> None:
    real = capture("nodes as Table")["response"]["body"]
    status, got = call(captured, "GET", "/api/v1/nodes", accept=TABLE)
    assert status == 200 and got["kind"] == "Table" and got["apiVersion"] == "meta.k8s.io/v1"
    assert _definitions(got) == _definitions(real)
    real_row = next(r for r in real["rows"] if r["cells"][0] == "capture-node-1")
    assert _no_age(got, [r["cells"] for r in got["rows"]]) == _no_age(real, [real_row["cells"]])
    assert re.fullmatch(r"\d+s", got["rows"][0]["cells"][3])
    obj = got["rows"][0]["object"]
    assert obj["kind"] == "PartialObjectMetadata" and obj["apiVersion"] == "meta.k8s.io/v1"
    assert obj["metadata"]["labels"] == real_row["object"]["metadata"]["labels"]
    assert list(got) == list(real) and got["metadata"] == {"resourceVersion": got["metadata"]["resourceVersion"]}


def test_one_node_pods_without_objects_and_kubectls_fallback_accept(captured: KubeAPIServer) -> None:
    one = call(captured, "GET", "/api/v1/nodes/capture-node-1", accept=TABLE)[1]
    assert _definitions(one) == _definitions(capture("one node as Table")["response"]["body"])
    assert [r["cells"][0] for r in one["rows"]] == ["capture-node-1"]
    real = capture("pods as Table (includeObject=None)")["response"]["body"]
    pods = call(captured, "GET", "/api/v1/namespaces/capture/pods?includeObject=None", accept=TABLE)[1]
    assert _definitions(pods) == _definitions(real)
    assert _no_age(pods, [r["cells"] for r in pods["rows"]]) == _no_age(real, [r["cells"] for r in real["rows"]])
    assert [list(r) for r in pods["rows"]] == [["cells", "object"]] * 3 and all(r["object"] is None
                                                                                for r in pods["rows"])
    fallback = call(captured, "GET", "/api/v1/nodes/capture-node-1?includeObject=None", accept=KUBECTL_ACCEPT)[1]
    assert fallback["kind"] == "Table" and fallback["rows"][0]["object"] is None
    plain = call(captured, "GET", "/api/v1/nodes/capture-node-1", accept="application/json")[1]
    assert plain["kind"] == "Node"


def test_default_columns_406_and_partial_object_metadata(captured: KubeAPIServer) -> None:
    real = capture("Table of configmaps (default columns)")["response"]["body"]
    got = call(captured, "GET", "/api/v1/namespaces/capture/configmaps?includeObject=None&labelSelector=nothing%3Dhere",
               accept=TABLE)[1]
    assert {**got, "metadata": {}} == {**real, "metadata": {}}
    refused = capture("unsupported Accept")["response"]
    assert call(captured, "GET", "/api/v1/nodes/capture-node-1", accept="application/xml") == \
        (refused["status"], refused["body"])
    partial = call(captured, "GET", "/api/v1/nodes/capture-node-1",
                   accept="application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io")[1]
    assert list(partial) == ["kind", "apiVersion", "metadata"] and partial["kind"] == "PartialObjectMetadata"
    assert partial["metadata"]["name"] == "capture-node-1"


def test_what_a_sandbox_user_looks_at(srv: KubeAPIServer) -> None:
    """A cordoned and a NotReady node with roles and versions; a Job; an Event of the controller's; the project's
    MaintenanceRequest CRD by its additionalPrinterColumns."""
    nodes = [("gpu-node-4", True, "True"), ("gpu-node-5", False, "Unknown")]
    for name, cordoned, ready in nodes:
        node = {"metadata": {"name": name, "labels": {"node-role.kubernetes.io/gpu": ""}},
                "spec": {"unschedulable": cordoned},
                "status": {"conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": _ago(1),
                                           "lastTransitionTime": _ago(1)}],
                           "nodeInfo": {"kubeletVersion": "v1.28.7"},
                           "addresses": [{"type": "InternalIP", "address": "10.0.0.4"}]}}
        assert call(srv, "POST", "/api/v1/nodes", node)[0] == 201
    table = call(srv, "GET", "/api/v1/nodes?labelSelector=node-role.kubernetes.io%2Fgpu", accept=KUBECTL_ACCEPT)[1]
    assert [c["name"] for c in _definitions(table) if c["priority"] == 0] == ["Name", "Status", "Roles", "Age",
                                                                              "Version"]
    assert [(r["cells"][0], r["cells"][1], r["cells"][2], r["cells"][4], r["cells"][5]) for r in table["rows"]] == [
        ("gpu-node-4", "Ready,SchedulingDisabled", "gpu", "v1.28.7", "10.0.0.4"),
        ("gpu-node-5", "NotReady", "gpu", "v1.28.7", "10.0.0.4")]

    event = {"metadata": {"name": "gpu-node-4.1"}, "involvedObject": {"kind": "Node", "name": "gpu-node-4"},
             "reason": "GPUNodeDraining", "message": "healthy → draining (xid-48): GPU 2 XID 48; cordoned ",
             "type": "Warning", "source": {"component": "gpuremediate", "host": "ctl-0"}, "count": 3,
             "firstTimestamp": _ago(600), "lastTimestamp": _ago(130)}
    assert call(srv, "POST", "/api/v1/namespaces/default/events", event)[0] == 201
    events = call(srv, "GET", "/api/v1/events?fieldSelector=reason%3DGPUNodeDraining", accept=KUBECTL_ACCEPT)[1]
    assert [(c["name"], c["priority"]) for c in _definitions(events)] == [
        ("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Subobject", 1), ("Source", 1), ("Message", 0),
        ("First Seen", 1), ("Count", 1), ("Name", 1)]
    assert events["rows"][0]["cells"] == ["2m10s", "Warning", "GPUNodeDraining", "node/gpu-node-4", "",
                                          "gpuremediate, ctl-0", "healthy → draining (xid-48): GPU 2 XID 48; cordoned",
                                          "10m", 3, "gpu-node-4.1"]

    job = {"metadata": {"name": "gpur-reset-gpu-gpu-node-4-1"},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "reset", "image": "gpu-sim:dev"}]}}}}
    assert call(srv, "POST", "/apis/batch/v1/namespaces/default/jobs", job)[0] == 201
    jobs = call(srv, "GET", "/apis/batch/v1/namespaces/default/jobs", accept=KUBECTL_ACCEPT)[1]
    assert [c["name"] for c in _definitions(jobs)] == ["Name", "Status", "Completions", "Duration", "Age",
                                                       "Containers", "Images", "Selector"]
    cells = jobs["rows"][0]["cells"]
    assert cells[:3] == ["gpur-reset-gpu-gpu-node-4-1", "Running", "0/1"] and cells[5:7] == ["reset", "gpu-sim:dev"]

    crd = miniyaml.loads((ROOT / "manifests/crds/gpuremediate.io_maintenancerequests.yaml").read_text())
    assert call(srv, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)[0] == 201
    version = crd["spec"]["versions"][0]["name"]
    request = {"apiVersion": f"gpuremediate.io/{version}", "kind": "MaintenanceRequest",
               "metadata": {"name": "gpu-node-4-maint"},
               "spec": {"healthEvent": {"nodeName": "gpu-node-4"}, "startTime": _ago(3 * 3600)}}
    path = f"/apis/gpuremediate.io/{version}/maintenancerequests"
    deadline = time.monotonic() + 10
    while (status := call(srv, "POST", path, request)[0]) != 201 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 201
    crs = call(srv, "GET", path, accept=KUBECTL_ACCEPT)[1]
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in _definitions(crs)] == ["Name", *[c["name"] for c in columns]]
    assert _definitions(crs)[1]["description"] == \
        "Custom resource definition column (in JSONPath format): .spec.healthEvent.nodeName"
    assert crs["rows"][0]["cells"][:4] == ["gpu-node-4-maint", "gpu-node-4", "3h", None]  # no status.phase yet


def test_jsonpath_and_human_durations() -> None:
    obj = {"status": {"conditions": [{"type": "DrainDeferred", "status": "False"},
                                     {"type": "DrainComplete", "status": "True"}]}, "spec": {"n": [1, 2]}}
    assert jsonpath(obj, '.status.conditions[?(@.type=="DrainComplete")].status') == ["True"]
    assert jsonpath(obj, ".spec.n[1]") == [2] and jsonpath(obj, ".spec.n[*]") == [1, 2]
    assert jsonpath(obj, ".spec.missing") == []
    assert [human(s) for s in (0, 111, 165, 840, 3 * 3600, 9 * 3600, 3 * 86400 + 3600, 400 * 86400)] == \
        ["0s", "111s", "2m45s", "14m", "3h", "9h", "3d1h", "400d"]


@pytest.mark.skipif(shutil.which("kubectl") is None or shutil.which("openssl") is None,
                    reason="kubectl (and openssl for the TLS emulator) not installed: the Table checks above run")
def test_kubectl_get_prints_the_columns(tmp_path: Path) -> None:
    server = KubeAPIServer(tls=True).start()  # kubectl sends a bearer token over https only
    try:
        node = {"metadata": {"name": "gpu-node-1"}, "spec": {"unschedulable": True},
                "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": _ago(1),
                                           "lastTransitionTime": _ago(1)}], "nodeInfo": {"kubeletVersion": "v1.28.7"}}}
        server.store.create(server.type_for("", "nodes"), node, "")
        config = server.write_kubeconfig(tmp_path / "kubeconfig", embed_ca=True)

        def kubectl(*args: str) -> list[list[str]]:
            done = subprocess.run(["kubectl", "--kubeconfig", config, *args], capture_output=True, text=True,
                                  timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            return [re.split(r"\s{2,}", line.strip()) for line in done.stdout.splitlines()]

        header, row = kubectl("get", "nodes")
        assert header == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        assert row[:3] == ["gpu-node-1", "Ready,SchedulingDisabled", "<none>"] and row[4] == "v1.28.7", row
        assert re.fullmatch(r"\d+s", row[3]), row
        header = kubectl("get", "events", "-A")[0]
        assert header == ["NAMESPACE", "LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    finally:
        server.stop()

