"""resource.k8s.io in the emulator: served where v1.36.2 serves it, defaulted and validated as it does.

The expected messages are the ones kube-apiserver v1.36.2 (``--feature-gates=DRADeviceTaintRules=true
--runtime-config=resource.k8s.io/v1beta2=true``, the /work/cp build) answered for the same requests on 2026-12-02.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, Resource
from sim.kubeapi import KubeAPIServer

RULES = Resource("resource.k8s.io", "v1beta2", "devicetaintrules", "DeviceTaintRule", False)
RULES_V1 = Resource("resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule", False)
DNS_LABEL = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
             "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
             "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
NAME_PART = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
             "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
             "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


@pytest.fixture
def client(srv: KubeAPIServer) -> Iterator[KubeClient]:
    made = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    made.create(NAMESPACES, {"metadata": {"name": "dra"}})
    yield made
    made.close()


def rule(name: str = "r", effect: str = "NoSchedule", **taint: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"},
                     "taint": {"key": "gpuremediate.io/unhealthy", "effect": effect, **taint}}}


def slice_(name: str = "s", node: str = "node-a", driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}, "index": {"int": 0}}}]}}


def claim(name: str = "c") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "dra"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}


def unconditional(obj: dict[str, Any]) -> dict[str, Any]:
    """A PUT body without resourceVersion (DeviceTaintRule allows unconditional updates): the eviction controller
    writes the rule's status as soon as it sees the rule, so a read-then-PUT may meet 409."""
    body = copy.deepcopy(obj)
    body["metadata"].pop("resourceVersion", None)
    return body


def refusal(call: Any) -> str:
    with pytest.raises(errors.Invalid) as refused:
        call()
    return refused.value.message


# --- where it is served ------------------------------------------------------------------------------------

def test_discovery_is_v136s_with_the_device_taint_gate(raw: Any) -> None:
    group = raw("GET", "/apis/resource.k8s.io").body
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta2"]
    assert group["preferredVersion"]["version"] == "v1"
    v1 = [r["name"] for r in raw("GET", "/apis/resource.k8s.io/v1").body["resources"]]
    v1beta2 = [r["name"] for r in raw("GET", "/apis/resource.k8s.io/v1beta2").body["resources"]]
    assert v1 == ["deviceclasses", "resourceclaims", "resourceclaims/status", "resourceclaimtemplates",
                  "resourceslices"]
    assert v1beta2 == ["deviceclasses", "devicetaintrules", "devicetaintrules/status", "resourceclaims",
                       "resourceclaims/status", "resourceclaimtemplates", "resourceslices"]


@pytest.mark.parametrize(("options", "path", "plain"), [
    ({"device_taint_rule_versions": ()}, "/apis/resource.k8s.io/v1beta2/devicetaintrules", False),
    ({"dra": False}, "/apis/resource.k8s.io/v1beta2/devicetaintrules", True),
    ({"dra": False}, "/apis/resource.k8s.io", True),
])
def test_a_cluster_without_the_gate_answers_404(options: dict[str, Any], path: str, plain: bool) -> None:
    from kubeapi_support import Raw

    srv = KubeAPIServer(**options).start()
    try:
        reply = Raw(srv)("GET", path)
        assert reply.status == 404
        if plain:
            assert reply.raw == b"404 page not found\n"
        else:
            assert reply.body["message"] == "the server could not find the requested resource"
        if "device_taint_rule_versions" in options:
            names = [r["name"] for r in Raw(srv)("GET", "/apis/resource.k8s.io/v1beta2").body["resources"]]
            assert "devicetaintrules" not in names and "resourceslices" in names
    finally:
        srv.stop()


def test_v137_serves_device_taint_rules_at_v1_from_one_storage() -> None:
    srv = KubeAPIServer(device_taint_rule_versions=("v1", "v1beta2")).start()
    made = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    try:
        made.create(RULES_V1, {**rule(), "apiVersion": "resource.k8s.io/v1"})
        assert made.get(RULES, "r")["apiVersion"] == "resource.k8s.io/v1beta2"
    finally:
        made.close()
        srv.stop()


# --- DeviceTaintRule -----------------------------------------------------------------------------------------

def test_a_rule_is_created_with_generation_one_an_empty_status_and_timeadded(client: KubeClient) -> None:
    body = rule()
    body["status"] = {"conditions": [{"type": "X", "status": "True", "reason": "R", "message": "m",
                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    created = client.create(RULES, body)
    assert created["metadata"]["generation"] == 1 and created["status"] == {}
    assert created["spec"]["taint"]["timeAdded"].endswith("Z")


def test_a_changed_effect_moves_timeadded_and_generation(client: KubeClient) -> None:
    created = client.create(RULES, {**rule(), "spec": {**rule()["spec"], "taint": {
        **rule()["spec"]["taint"], "timeAdded": "2026-01-01T00:00:00Z"}}})
    assert created["spec"]["taint"]["timeAdded"] == "2026-01-01T00:00:00Z"  # a client's value is kept
    relabelled = unconditional(created)
    relabelled["spec"]["taint"]["value"] = "xid-48"
    relabelled = client.replace(RULES, "r", relabelled)
    assert relabelled["spec"]["taint"]["timeAdded"] == "2026-01-01T00:00:00Z"  # same effect: same time
    assert relabelled["metadata"]["generation"] == 2
    escalated = unconditional(relabelled)
    escalated["spec"]["taint"]["effect"] = "NoExecute"
    escalated = client.replace(RULES, "r", escalated)
    assert escalated["spec"]["taint"]["timeAdded"] != "2026-01-01T00:00:00Z"  # the eviction clock starts now
    assert escalated["metadata"]["generation"] == 3


def test_the_status_subresource_keeps_the_spec(client: KubeClient) -> None:
    created = client.create(RULES, rule())
    body = unconditional(created)
    body["spec"]["taint"]["effect"] = "NoExecute"
    mine = {"type": "Reviewed", "status": "True", "reason": "ByOps", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
    body["status"] = {"conditions": [mine]}
    stored = client.replace(RULES, "r", body, subresource="status")
    assert stored["spec"]["taint"]["effect"] == "NoSchedule" and stored["metadata"]["generation"] == 1
    assert mine in stored["status"]["conditions"]
    many = unconditional(stored)
    many["status"]["conditions"] = [{**mine, "type": f"T{i}"} for i in range(9)]
    assert "status.conditions: Too many: 9: must have at most 8 items" in refusal(
        lambda: client.replace(RULES, "r", many, subresource="status"))


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r["spec"]["taint"].update(effect="PreferNoSchedule"),
     'spec.taint.effect: Unsupported value: "PreferNoSchedule": supported values: "NoExecute", "NoSchedule", "None"'),
    (lambda r: r["spec"]["taint"].pop("effect"), "spec.taint.effect: Required value"),
    (lambda r: r["spec"]["taint"].update(key="bad key!"), f'spec.taint.key: Invalid value: "bad key!": {NAME_PART}'),
    (lambda r: r["spec"]["taint"].update(key=""),
     f'[spec.taint.key: Invalid value: "": name part must be non-empty, '
     f'spec.taint.key: Invalid value: "": {NAME_PART}]'),
    (lambda r: r["spec"]["deviceSelector"].update(device="GPU_1"),
     f'spec.deviceSelector.device: Invalid value: "GPU_1": {DNS_LABEL}'),
    (lambda r: r.pop("spec"), f'[spec.taint.key: Invalid value: "": name part must be non-empty, spec.taint.key: '
                              f'Invalid value: "": {NAME_PART}, spec.taint.effect: Required value]'),
])
def test_an_invalid_rule_gets_the_real_servers_message(client: KubeClient, change: Any, message: str) -> None:
    body = rule()
    change(body)
    assert refusal(lambda: client.create(RULES, body)) == f'DeviceTaintRule.resource.k8s.io "r" is invalid: {message}'


def test_an_unchanged_unknown_effect_is_not_validated_again(client: KubeClient, srv: KubeAPIServer) -> None:
    """Upstream validates the effect only when it is new or changed ("unknown enums in stored objects")."""
    client.create(RULES, rule())
    stored = srv.store.get("resource.k8s.io/devicetaintrules", "", "r")
    assert stored is not None
    stored["spec"]["taint"]["effect"] = "FutureEffect"
    with srv.store.lock:
        srv.store.update(srv.type_for("resource.k8s.io", "devicetaintrules"), stored,
                         srv.store.get("resource.k8s.io/devicetaintrules", "", "r") or {})
    body = unconditional(client.get(RULES, "r"))
    body["metadata"]["labels"] = {"x": "y"}
    assert client.replace(RULES, "r", body)["metadata"]["labels"] == {"x": "y"}


def test_the_tombstoned_selector_fields_are_dropped_with_a_warning(srv: KubeAPIServer, raw: Any) -> None:
    body = rule()
    body["spec"]["deviceSelector"]["deviceClassName"] = "gpu.nvidia.com"
    reply = raw("POST", "/apis/resource.k8s.io/v1beta2/devicetaintrules", body)
    assert reply.status == 201
    assert "deviceClassName" not in reply.body["spec"]["deviceSelector"]
    assert 'unknown field \\"spec.deviceSelector.deviceClassName\\"' in reply.headers["Warning"]
    strict = raw("POST", "/apis/resource.k8s.io/v1beta2/devicetaintrules?fieldValidation=Strict",
                 {**body, "metadata": {"name": "strict"}})
    assert strict.status == 400 and 'unknown field "spec.deviceSelector.deviceClassName"' in strict.body["message"]


# --- ResourceSlice -----------------------------------------------------------------------------------------

def test_slices_are_selected_by_node_and_driver(client: KubeClient) -> None:
    client.create(RESOURCE_SLICES, slice_("a", "node-a"))
    client.create(RESOURCE_SLICES, slice_("b", "node-b"))
    client.create(RESOURCE_SLICES, slice_("c", "node-a", driver="nic.example.com"))
    listed = client.list(RESOURCE_SLICES, field_selector="spec.nodeName=node-a")["items"]
    names = [s["metadata"]["name"] for s in listed]
    assert names == ["a", "c"]
    one = client.list(RESOURCE_SLICES, field_selector="spec.nodeName=node-a,spec.driver=gpu.nvidia.com")["items"]
    assert [s["metadata"]["name"] for s in one] == ["a"]
    with pytest.raises(errors.BadRequest) as refused:
        client.list(RESOURCE_SLICES, field_selector="spec.pool.name=node-a")
    assert refused.value.message == ("field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: "
                                     "spec.pool.name")


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s["spec"].pop("nodeName"), "spec: Required value: exactly one of `nodeName`, `nodeSelector`, "
                                          "`allNodes`, `perDeviceNodeSelection` is required"),
    (lambda s: s["spec"]["devices"].append(copy.deepcopy(s["spec"]["devices"][0])),
     'spec.devices[1]: Duplicate value: "gpu-0"'),
    (lambda s: s["spec"].pop("driver"), "spec.driver: Required value"),
    (lambda s: s["spec"].pop("pool"), "[spec.pool.name: Required value, spec.pool.resourceSliceCount: Invalid value: "
                                      "0: must be greater than zero]"),
    (lambda s: s["spec"]["devices"][0]["attributes"].update(uuid={"string": "a", "int": 1}),
     'spec.devices[0].attributes[uuid]: Invalid value: {"IntValue":1,"BoolValue":null,"StringValue":"a",'
     '"VersionValue":null,"IntValues":null,"BoolValues":null,"StringValues":null,"VersionValues":null}: exactly one '
     'value must be specified'),
])
def test_an_invalid_slice_gets_the_real_servers_message(client: KubeClient, change: Any, message: str) -> None:
    body = slice_()
    change(body)
    assert refusal(lambda: client.create(RESOURCE_SLICES, body)) == \
        f'ResourceSlice.resource.k8s.io "s" is invalid: {message}'


def test_a_slices_node_is_immutable_and_its_taints_get_timeadded(client: KubeClient) -> None:
    body = slice_()
    body["spec"]["devices"][0]["taints"] = [{"key": "gpu.nvidia.com/xid", "effect": "NoExecute"}]
    created = client.create(RESOURCE_SLICES, body)
    assert created["spec"]["devices"][0]["taints"][0]["timeAdded"].endswith("Z")
    moved = copy.deepcopy(created)
    moved["spec"]["nodeName"] = "node-b"
    assert 'spec.nodeName: Invalid value: "node-b": field is immutable' in refusal(
        lambda: client.replace(RESOURCE_SLICES, "s", moved))


# --- ResourceClaim -----------------------------------------------------------------------------------------

def test_a_claim_is_defaulted_as_v136_does(client: KubeClient) -> None:
    body = claim()
    body["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [{"key": "k"}]
    created = client.create(RESOURCE_CLAIMS, body)
    assert created["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
        "tolerations": [{"key": "k", "operator": "Equal"}]}
    assert created["status"] == {}


def test_a_claims_status_follows_the_real_rules(client: KubeClient) -> None:
    created = client.create(RESOURCE_CLAIMS, claim())
    # A pod that exists and may run: the resourceclaim controller drops a reservation for a pod that is gone.
    pod = client.create(PODS, {"metadata": {"name": "p", "namespace": "dra"},
                               "spec": {"containers": [{"name": "c", "image": "x"}]}}, "dra")
    pod_ref = {"resource": "pods", "name": "p", "uid": pod["metadata"]["uid"]}
    reserved_only = {**created, "status": {"reservedFor": [pod_ref]}}
    assert refusal(lambda: client.replace(RESOURCE_CLAIMS, "c", reserved_only, "dra", subresource="status")) == (
        'ResourceClaim.resource.k8s.io "c" is invalid: status.reservedFor: Forbidden: may not be specified when '
        "`allocated` is not set")
    result = {"request": "nope", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"}
    wrong = {**created, "status": {"allocation": {"devices": {"results": [result]}}}}
    assert refusal(lambda: client.replace(RESOURCE_CLAIMS, "c", wrong, "dra", subresource="status")) == (
        'ResourceClaim.resource.k8s.io "c" is invalid: status.allocation.devices.results[0].request: Invalid value: '
        "\"nope\": must be the name of a request in the claim or the name of a request and a subrequest separated "
        "by '/'")
    right = {**created, "status": {"allocation": {"devices": {"results": [{**result, "request": "gpu"}]}},
                                   "reservedFor": [pod_ref]}}
    allocated = client.replace(RESOURCE_CLAIMS, "c", right, "dra", subresource="status")
    moved = copy.deepcopy(allocated)
    moved["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-2"
    assert "status.allocation: Invalid value: " in refusal(
        lambda: client.replace(RESOURCE_CLAIMS, "c", moved, "dra", subresource="status"))
    respec = copy.deepcopy(allocated)
    respec["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    assert "spec: Invalid value: " in refusal(lambda: client.replace(RESOURCE_CLAIMS, "c", respec, "dra"))
    released = copy.deepcopy(allocated)
    released["status"] = {}
    assert client.replace(RESOURCE_CLAIMS, "c", released, "dra", subresource="status")["status"] == {}
