"""Custom resources: durable names, labels, structured template rendering, conditions; policy sections."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.actions.custom import (
    FAILED,
    IN_PROGRESS,
    SUCCEEDED,
    PermissionBackoff,
    PermissionDenied,
    Ref,
    dns_name,
    event_id,
    label_value,
    outcome,
    render,
)
from gpuremediate.kube import errors
from gpuremediate.loops.custom_drain import entities, pods_by_namespace, request_body, request_name
from gpuremediate.loops.custom_remediate import build_resource, resource_name
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab.record import Fault, NodeRecord, occurrence
from gpuremediate.vocab.schema import PolicyError

DNS = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
LABEL = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def record(fingerprint: str = "xid/GPU-1/79/100", gpus: tuple[str, ...] = ("GPU-aaaa",)) -> NodeRecord:
    fault = Fault(kind="xid", code="79", gpus=gpus, fingerprint=fingerprint, action="rma", first_seen=1.0,
                  last_seen=1.0, message="XID 79: GPU fell off the bus")
    return NodeRecord(state="draining", since=1.0, fault=fault)


@settings(max_examples=80, deadline=None)
@given(parts=st.lists(st.text(min_size=1, max_size=120), min_size=1, max_size=4))
def test_dns_names_are_valid_and_stable(parts: list[str]) -> None:
    name = dns_name(*parts)
    assert len(name) <= 253 and DNS.fullmatch(name), name
    assert dns_name(*parts) == name


@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=300))
def test_label_values_are_valid(text: str) -> None:
    value = label_value(text)
    assert len(value) <= 63 and LABEL.fullmatch(value), value


def test_distinct_long_inputs_get_distinct_names() -> None:
    long_a, long_b = "n" * 300 + "a", "n" * 300 + "b"
    assert dns_name("drain", long_a) != dns_name("drain", long_b)
    assert label_value(long_a) != label_value(long_b)


def test_drain_request_is_named_and_filled_per_nvsentinel() -> None:
    rec = record()
    pods = [{"metadata": {"namespace": "b", "name": "p2"}}, {"metadata": {"namespace": "a", "name": "p1"}},
            {"metadata": {"namespace": "b", "name": "p1"}}]
    body = request_body(Ref("nvsentinel.nvidia.com/v1alpha1", "DrainRequest", "ns"), "node-1", rec, pods)
    eid = event_id(occurrence(rec))  # one id per fault occurrence: fingerprint + first seen
    assert eid != event_id(occurrence(dataclasses.replace(rec, fault=dataclasses.replace(rec.fault, first_seen=99.0))))
    assert body["metadata"]["name"] == request_name("node-1", rec) == f"drain-node-1-{eid}"
    assert body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["labels"]["nvsentinel.nvidia.com/node-name"] == "node-1"
    spec = body["spec"]
    assert spec["podsToDrain"] == {"a": ["p1"], "b": ["p1", "p2"]}
    assert spec["healthEventID"] == eid and spec["errorCode"] == ["79"] and spec["recommendedAction"] == "rma"
    assert spec["entitiesImpacted"] == [{"type": "GPU_UUID", "value": "GPU-aaaa"}]
    assert entities(record(gpus=("node-1/gpu3",)).fault) == [{"type": "GPU", "value": "3"}]
    assert pods_by_namespace([]) == {}


def test_template_placeholders_fill_string_values_only() -> None:
    template = {"spec": {"node": "{{nodeName}}", "{{nodeName}}": "key stays", "n": 3,
                         "list": ["a-{{attempt}}", {"x": "{{ gpuUUIDs }}"}], "evil": "{{nodeName}}"}}
    values = {"nodeName": "a: b\n- c", "attempt": "2", "gpuUUIDs": "GPU-1,GPU-2"}
    out = render(template, values)
    assert out["spec"]["node"] == "a: b\n- c"  # data, not YAML structure
    assert out["spec"]["{{nodeName}}"] == "key stays"
    assert out["spec"]["list"] == ["a-2", {"x": "GPU-1,GPU-2"}] and out["spec"]["n"] == 3
    assert template["spec"]["node"] == "{{nodeName}}", "the template itself is never modified"


def test_outcome_reads_the_condition() -> None:
    def obj(status: str | None) -> dict[str, object]:
        conds = [] if status is None else [{"type": "Complete", "status": status}]
        return {"status": {"conditions": [{"type": "Other", "status": "True"}, *conds]}}

    assert outcome(obj("True"), "Complete") == SUCCEEDED
    assert outcome(obj("False"), "Complete") == FAILED
    assert outcome(obj("Unknown"), "Complete") == IN_PROGRESS
    assert outcome(obj(None), "Complete") == IN_PROGRESS
    assert outcome({}, "Complete") == IN_PROGRESS


ACTIONS = '''
[xid.overrides]
79 = "rma"
[actions.rma]
apiGroup = "remediation.example.com"
kind = "RemediationRequest"
equivalenceGroup = "external-rma"
supersedingEquivalenceGroups = ["restart"]
impactedEntityScope = "GPU_UUID"
maxAttempts = 3
[actions.rma.template.metadata.labels]
team = "ops"
[actions.rma.template.spec]
nodeName = "{{nodeName}}"
attempt = "{{attempt}}"
[actions.reboot-vm]
apiGroup = "remediation.example.com"
kind = "RemediationRequest"
equivalenceGroup = "restart"
'''


def test_actions_section_parses_and_builds_a_resource() -> None:
    pf = loads_policy(ACTIONS)
    pf.check_custom_actions(pf.cluster.actions)
    rma = pf.cluster.actions["rma"]
    assert rma.maxAttempts == 3 and rma.supersedingEquivalenceGroups == ("restart",)
    rec = record()
    body = build_resource("rma", rma, "node-1", rec, 2, ["GPU-aaaa"])
    assert body["apiVersion"] == "remediation.example.com/v1alpha1" and body["kind"] == "RemediationRequest"
    assert body["metadata"]["name"] == resource_name("rma", "node-1", rec, 2)
    assert body["metadata"]["name"].endswith("-2")
    labels = body["metadata"]["labels"]
    assert labels["team"] == "ops" and labels["gpuremediate.io/equivalence-group"] == "external-rma"
    assert labels["gpuremediate.io/entity"] == "GPU-aaaa" and labels["gpuremediate.io/attempt"] == "2"
    assert body["spec"] == {"nodeName": "node-1", "attempt": "2"}


@pytest.mark.parametrize(("text", "error"), [
    ('[actions.x]\nkind = "K"', "actions.x.apiGroup: required"),
    ('[actions.x]\napiGroup = "g"\nkind = "K"\nscope = "Global"', "actions.x.scope: expected one of"),
    ('[actions.x]\napiGroup = "g"\nkind = "K"\nsupersedingEquivalenceGroups = ["nope"]',
     'actions.x.supersedingEquivalenceGroups: "nope" is not the equivalence group'),
    ('[actions.x]\napiGroup = "g"\nkind = "K"\ntemplate = { spec = { a = "{{nodename}}" } }',
     "actions.x.template: unknown placeholder {{nodename}}"),
    ('[actions.x]\napiGroup = "g"\nkind = "K"\ntemplate = { kind = "Other" }', "actions.x.template.kind: set by"),
    ('[actions.x]\napiGroup = "g"\nkind = "K"\ntemplate = { metadata = { name = "n" } }',
     "actions.x.template.metadata: only labels and annotations"),
    ('[actions.reboot]\napiGroup = "g"\nkind = "K"', "actions.reboot: \"reboot\" is a built-in action"),
    ('[actions.diagnostics]\napiGroup = "g"\nkind = "K"', "actions.diagnostics: \"diagnostics\" names a step"),
    ('[actions.validate]\napiGroup = "g"\nkind = "K"', "actions.validate: \"validate\" names a step"),
    ('[customDrain]\nonTimeout = "ignore"', "customDrain.onTimeout: expected one of quarantine, builtin"),
    ('[customDrain]\nstatusConditionStatus = "yes"', "customDrain.statusConditionStatus: expected one of"),
])
def test_plugin_sections_reject_bad_input_naming_the_key(text: str, error: str) -> None:
    with pytest.raises(PolicyError) as caught:
        loads_policy(text)
    assert str(caught.value).startswith(error), str(caught.value)


def test_undefined_custom_action_is_an_error_naming_the_key(tmp_path: object) -> None:
    from pathlib import Path

    from gpuremediate.policy.config import load_policy

    path = Path(str(tmp_path)) / "p.toml"
    path.write_text('[ecc]\ndbe_action = "fix-it"\n')
    with pytest.raises(PolicyError, match=r'^ecc\.dbe_action: custom action "fix-it" is not defined'):
        load_policy(path)
    path.write_text('[ecc]\ndbe_action = "fix-it"\n[actions.fix-it]\napiGroup = "g.io"\nkind = "Fix"\n')
    assert load_policy(path).cluster.actions["fix-it"].kind == "Fix"


def test_custom_drain_can_differ_per_group() -> None:
    pf = loads_policy('[customDrain]\nenabled = true\n'
                      '[[groups]]\nselector = "pool=slurm"\ncustomDrain.enabled = false\n')
    assert pf.for_node({}).customDrain.enabled
    assert not pf.for_node({"pool": "slurm"}).customDrain.enabled


def test_permission_backoff_doubles_and_answers_for_the_server_meanwhile() -> None:
    now = [1000.0]
    backoff = PermissionBackoff(lambda: now[0], first_s=30.0, max_s=100.0)
    ref = Ref("remediation.example.com/v1alpha1", "RemediationRequest", "ns")
    cause = errors.Forbidden(403, {"reason": "Forbidden", "message": "cannot list"})
    denied = backoff.refused("list", ref, "remediationrequests", cause)
    assert denied.fresh and denied.first and denied.retry_in == 30.0
    assert "list on remediationrequests.remediation.example.com in namespace ns" in denied.describe()
    now[0] += 29.0
    with pytest.raises(PermissionDenied) as held:
        backoff.check(ref)  # no request is sent: the last refusal answers
    assert not held.value.fresh and held.value.verb == "list"
    now[0] += 2.0
    backoff.check(ref)  # due again: the next call asks the server
    again = backoff.refused("list", ref, "remediationrequests", cause)
    assert again.retry_in == 60.0 and not again.first
    assert backoff.refused("list", ref, "remediationrequests", cause).retry_in == 100.0  # capped
    backoff.allowed(ref)
    assert not backoff.known(ref)
    backoff.check(ref)
