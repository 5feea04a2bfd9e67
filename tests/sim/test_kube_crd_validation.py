"""CRD structural schemas and CEL rules on create and update, against the project's own CRDs
(manifests/crds/**, manifests/plugins/**), with v1.36's message text."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from kubeapi_support import Raw

from gpuremediate.kube import miniyaml
from sim import kube_cel as cel

ROOT = Path(__file__).resolve().parents[2]
CRD_FILES = sorted([*ROOT.glob("manifests/crds/**/*.yaml"), *ROOT.glob("manifests/plugins/**/*.yaml")])
MRS = "/apis/gpuremediate.io/v1alpha1/maintenancerequests"
MERGE = "application/merge-patch+json"
IMMUTABLE = "spec.healthEvent is immutable; delete the request and create a new one"


def crds() -> list[dict[str, Any]]:
    docs = [d for path in CRD_FILES for d in miniyaml.load_all(path.read_text(encoding="utf-8"))]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]


def rules(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    found = [r["rule"] for r in schema.get("x-kubernetes-validations") or []]
    for sub in [*(schema.get("properties") or {}).values(), schema.get("items"), schema.get("additionalProperties")]:
        found += rules(sub)
    return found


def test_every_rule_in_the_manifests_compiles() -> None:
    all_rules = [rule for crd in crds() for version in crd["spec"]["versions"]
                 for rule in rules(version["schema"]["openAPIV3Schema"])]
    assert len(all_rules) >= 3
    for rule in all_rules:
        cel.compile_rule(rule)


@pytest.fixture
def mr(raw: Raw) -> Raw:
    crd = next(c for c in crds() if c["metadata"]["name"] == "maintenancerequests.gpuremediate.io")
    assert raw("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd).status == 201
    return raw


def request(name: str, **event: Any) -> dict[str, Any]:
    health = {"nodeName": "capture-node-1", "agent": "csp", "recommendedAction": "NONE", **event}
    return {"apiVersion": "gpuremediate.io/v1alpha1", "kind": "MaintenanceRequest", "metadata": {"name": name},
            "spec": {"healthEvent": {k: v for k, v in health.items() if v is not None}}}


def refused(reply: Any) -> list[tuple[str, str, str]]:
    assert reply.status == 422, reply.raw
    return [(c["field"], c["reason"], c["message"]) for c in reply.body["details"]["causes"]]


def test_a_default_is_applied_and_unknown_fields_pruned(mr: Raw) -> None:
    created = mr("POST", MRS, request("ok", extra="dropped"))
    assert created.status == 201
    assert created.body["spec"]["healthEvent"]["isHealthy"] is False
    assert "extra" not in created.body["spec"]["healthEvent"]
    patched = mr("PATCH", f"{MRS}/ok", {"spec": {"sneaky": 1, "startTime": "2026-12-01T10:00:00Z"}}, MERGE)
    assert patched.status == 200 and "sneaky" not in patched.body["spec"]


def test_cel_rules_refuse_with_the_v136_text(mr: Raw) -> None:
    healthy = mr("POST", MRS, request("healthy", isHealthy=True))
    assert healthy.body["message"] == ('MaintenanceRequest.gpuremediate.io "healthy" is invalid: spec.healthEvent: '
                                       "Invalid value: spec.healthEvent.isHealthy must be false "
                                       "(an opening event raises a fault)")
    assert refused(mr("POST", MRS, request("custom", recommendedAction="CUSTOM"))) == [
        ("spec.healthEvent", "FieldValueInvalid",
         "Invalid value: recommendedAction CUSTOM needs customRecommendedAction")]
    assert refused(mr("POST", MRS, request("both", recommendedAction="CUSTOM", isHealthy=True)))[0][2] == \
        "Invalid value: spec.healthEvent.isHealthy must be false (an opening event raises a fault)"
    assert mr("POST", MRS, request("named", recommendedAction="CUSTOM", customRecommendedAction="x")).status == 201


def test_the_immutable_health_event_on_update(mr: Raw) -> None:
    assert mr("POST", MRS, request("frozen")).status == 201
    edited = mr("PATCH", f"{MRS}/frozen", {"spec": {"healthEvent": {"message": "edited"}}}, MERGE)
    assert refused(edited) == [("spec.healthEvent", "FieldValueInvalid", f"Invalid value: {IMMUTABLE}")]
    assert edited.body["message"].endswith(f"is invalid: spec.healthEvent: Invalid value: {IMMUTABLE}")
    assert mr("PATCH", f"{MRS}/frozen", {"spec": {"startTime": "2026-12-02T00:00:00Z"}}, MERGE).status == 200


@pytest.mark.parametrize(("event", "cause"), [
    ({"nodeName": None}, ("spec.healthEvent.nodeName", "FieldValueRequired", "Required value")),
    ({"nodeName": ""}, ("spec.healthEvent.nodeName", "FieldValueInvalid",
                        'Invalid value: "": spec.healthEvent.nodeName in body should be at least 1 chars long')),
    ({"recommendedAction": "REBOOT"}, ("spec.healthEvent.recommendedAction", "FieldValueNotSupported",
                                       'Unsupported value: "REBOOT": supported values: "NONE", "COMPONENT_RESET", '
                                       '"CONTACT_SUPPORT", "RUN_FIELDDIAG", "RESTART_VM", "RESTART_BM", '
                                       '"REPLACE_VM", "RUN_DCGMEUD", "CUSTOM", "UNKNOWN"')),
    ({"agent": "a" * 257}, ("spec.healthEvent.agent", "FieldValueTooLong", "Too long: must have at most 256 bytes")),
    ({"version": -1}, ("spec.healthEvent.version", "FieldValueInvalid",
                       "Invalid value: -1: spec.healthEvent.version in body should be greater than or equal to 0")),
    ({"generatedTimestamp": "yesterday"}, ("spec.healthEvent.generatedTimestamp", "FieldValueInvalid",
                                           'Invalid value: "yesterday": spec.healthEvent.generatedTimestamp in body '
                                           'must be of type date-time: "yesterday"')),
    ({"isFatal": "yes"}, ("spec.healthEvent.isFatal", "FieldValueTypeInvalid",
                          'Invalid value: "string": spec.healthEvent.isFatal in body must be of type boolean: '
                          '"string"')),
    ({"errorCode": ["x"] * 65}, ("spec.healthEvent.errorCode", "FieldValueTooMany",
                                 "Too many: 65: must have at most 64 items")),
])
def test_the_openapi_schema_is_enforced_and_then_rules_are_skipped(mr: Raw, event: dict[str, Any],
                                                                    cause: tuple[str, str, str]) -> None:
    assert refused(mr("POST", MRS, request("bad", **event))) == [
        cause, ("<nil>", "FieldValueInvalid", 'Invalid value: "null": some validation rules were not checked '
                                               "because the object was invalid; correct the existing errors to "
                                               "complete validation")]


def test_status_conditions_are_checked_on_the_status_subresource(mr: Raw) -> None:
    assert mr("POST", MRS, request("st")).status == 201
    condition = {"type": "NodePrepared", "status": "Maybe", "lastTransitionTime": "2026-12-01T10:00:00Z",
                 "reason": "Drained", "message": ""}
    bad = mr("PATCH", f"{MRS}/st/status", {"status": {"conditions": [condition]}}, MERGE)
    assert refused(bad)[0][:2] == ("status.conditions[0].status", "FieldValueNotSupported")
    good = copy.deepcopy(condition) | {"status": "True"}
    fine = mr("PATCH", f"{MRS}/st/status", {"status": {"conditions": [good], "phase": "Preparing"}}, MERGE)
    assert fine.status == 200
    reason = mr("PATCH", f"{MRS}/st/status", {"status": {"conditions": [good | {"reason": "not ok"}]}}, MERGE)
    assert refused(reason)[0][:2] == ("status.conditions[0].reason", "FieldValueInvalid")


# --- the evaluator's CEL semantics ---------------------------------------------------------------------

@pytest.mark.parametrize(("rule", "value", "expected"), [
    ("!has(self.a) || self.a != 'X' || (has(self.b) && size(self.b) > 0)", {"a": "X", "b": ""}, False),
    ("!has(self.a) || self.a != 'X' || (has(self.b) && size(self.b) > 0)", {"a": "X", "b": "y"}, True),
    ("!has(self.a) || self.a != 'X'", {}, True),
    ("self.flag == 1", {"flag": True}, False),  # CEL: a bool never equals an int
    ("self.missing > 0 || true", {}, True),  # an error on one side of || is absorbed
    ("self.n >= 0 ? self.n % 3 == 1 : false", {"n": 7}, True),
    ("self.name.startsWith('gpu-') && self.items.size() == 2 && 'b' in self.items", {"name": "gpu-1",
                                                                                      "items": ["a", "b"]}, True),
])
def test_cel_subset_semantics(rule: str, value: Any, expected: bool) -> None:
    assert cel.evaluate(cel.compile_rule(rule), {"self": value}) is expected


@pytest.mark.parametrize("rule", ["self.x > 'a'", "self.missing", "size(1)"])
def test_cel_errors_name_the_problem(rule: str) -> None:
    with pytest.raises(cel.CelError, match=r"no such|no matching overload"):
        cel.evaluate(cel.compile_rule(rule), {"self": {"x": 1}})
