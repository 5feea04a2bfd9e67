"""The policy sections of issue 15 (failure-domain budgets and breaker, pause, gates, notifications,
namespaces the drain skips): defaults change nothing, values are read, bad ones name their key path."""

from __future__ import annotations

import pytest

from gpuremediate.policy.config import PolicyError, loads_policy


def test_defaults_change_nothing() -> None:
    cluster = loads_policy("").cluster
    assert cluster.budget.domains == ()
    assert cluster.breaker.domain_labels == ()
    assert cluster.gates.blocking_alerts == () and cluster.gates.blocking_pod_selectors == ()
    assert cluster.gates.settle_s == 0.0
    assert not cluster.notifications.enabled
    assert cluster.pause.in_flight == "finish"
    assert loads_policy("").defaults.drain.skip_namespaces == ()


def test_sections_are_read() -> None:
    policy = loads_policy('''
[drain]
skip_namespaces = ["kube-system", "gpu-operator"]

[[budget.domains]]
label = "topology.kubernetes.io/rack"
max_unavailable = "1"

[[budget.domains]]
label = "nvidia.com/nvlink-domain"
max_unavailable = "25%"

[breaker]
domain_labels = ["nvidia.com/cuda.driver-version.full"]
domain_threshold_percent = 40
domain_min_nodes = 3

[pause]
in_flight = "hold"

[gates]
blocking_alerts = ["KubeNodeNotReady"]
prometheus_url = "http://prometheus.monitoring:9090"
blocking_pod_selectors = ["app=checkpoint-writer", "critical in (yes)"]
settle_s = 600

[notifications]
enabled = true
format = "slack"
cluster = "prod-a"
''')
    cluster = policy.cluster
    assert [(d.label, d.max_unavailable) for d in cluster.budget.domains] == [
        ("topology.kubernetes.io/rack", "1"), ("nvidia.com/nvlink-domain", "25%")]
    assert cluster.breaker.domain_labels == ("nvidia.com/cuda.driver-version.full",)
    assert cluster.breaker.domain_threshold_percent == 40.0 and cluster.breaker.domain_min_nodes == 3
    assert cluster.pause.in_flight == "hold"
    assert cluster.gates.blocking_alerts == ("KubeNodeNotReady",) and cluster.gates.settle_s == 600.0
    assert cluster.gates.blocking_pod_selectors == ("app=checkpoint-writer", "critical in (yes)")
    assert cluster.notifications.enabled and cluster.notifications.format == "slack"
    assert policy.defaults.drain.skip_namespaces == ("kube-system", "gpu-operator")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[budget.domains]]\nmax_unavailable = "1"', r"budget.domains\[0\].label: required"),
        ('[[budget.domains]]\nlabel = "a b"', r"budget.domains\[0\].label: invalid label key"),
        ('[[budget.domains]]\nlabel = "rack"\nmax_unavailable = "lots"', r"budget.domains\[0\].max_unavailable"),
        ('[[budget.domains]]\nlabel = "rack"\n[[budget.domains]]\nlabel = "rack"',
         r"budget.domains\[1\].label: 'rack' has a budget already"),
        ('[budget]\ndomains = "rack"', r"budget.domains: expected an array of tables"),
        ('[[budget.domains]]\nlabel = "rack"\nzone = 1', r"budget.domains\[0\].zone: unknown key"),
        ('[breaker]\ndomain_labels = "rack"', "breaker.domain_labels: expected an array of strings"),
        ('[breaker]\ndomain_labels = ["ok", 3]', r"breaker.domain_labels\[1\]: expected a string"),
        ('[breaker]\ndomain_threshold_percent = 120', "breaker.domain_threshold_percent"),
        ('[pause]\nin_flight = "later"', "pause.in_flight: expected one of finish, hold"),
        ('[gates]\nblocking_pod_selectors = ["a in ("]', r"gates.blocking_pod_selectors\[0\]:"),
        ('[gates]\nblocking_alerts = [" "]', r"gates.blocking_alerts\[0\]: must not be empty"),
        ('[gates]\nprometheus_url = "ftp://x"', "gates.prometheus_url: must start with http"),
        ('[gates]\nsettle_s = -1', "gates.settle_s"),
        ('[notifications]\nformat = "xml"', "notifications.format: expected one of json, slack"),
        ('[notifications]\nsecret = "Not_A_Name"', "notifications.secret"),
        ('[drain]\nskip_namespaces = ["Kube System"]', r"drain.skip_namespaces\[0\]"),
    ],
)
def test_bad_values_name_their_key_path(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        loads_policy(text)


def test_a_group_may_skip_its_own_namespaces() -> None:
    policy = loads_policy('[[groups]]\nselector = "pool=batch"\n[groups.drain]\nskip_namespaces = ["batch-system"]\n')
    assert policy.for_node({"pool": "batch"}).drain.skip_namespaces == ("batch-system",)
    assert policy.for_node({}).drain.skip_namespaces == ()


def test_namespace_modes() -> None:
    policy = loads_policy('[drain]\nnamespace_modes = { batch = "AllowCompletion", scratch = "DeleteAfterTimeout" }\n'
                          '[[groups]]\nselector = "pool=x"\n[groups.drain.namespace_modes]\nserve = "Immediate"\n')
    drain = policy.defaults.drain
    assert drain.mode_of("batch") == "AllowCompletion" and drain.mode_of("other") == "Immediate"
    assert dict(policy.for_node({"pool": "x"}).drain.namespace_modes) == {
        "batch": "AllowCompletion", "scratch": "DeleteAfterTimeout", "serve": "Immediate"}
    assert dict(loads_policy("").defaults.drain.namespace_modes) == {}


@pytest.mark.parametrize(("text", "message"), [
    ('[drain]\nnamespace_modes = { batch = "Later" }', "drain.namespace_modes.batch: expected one of Immediate"),
    ('[drain]\nnamespace_modes = { "Bad NS" = "Immediate" }', "drain.namespace_modes.Bad NS"),
    ('[drain]\nnamespace_modes = { batch = 3 }', "drain.namespace_modes.batch: expected a drain mode string"),
    ('[drain]\nnamespace_modes = "batch"', "drain.namespace_modes: expected a table"),
])
def test_bad_namespace_modes(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        loads_policy(text)
