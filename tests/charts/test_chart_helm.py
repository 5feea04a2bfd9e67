"""charts/gpuremediate through real Helm (helm-sdkpy, Helm v4's library) on the API emulator: lint, the defaults
render exactly the kustomize base and agent, each optional part renders its kustomization, the schema refuses bad
values before anything is created, and an upgrade keeps the policy and the controller's records."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from chart_support import (
    CHART,
    MANIFESTS,
    NAMESPACE,
    ROOT,
    Cluster,
    by_key,
    docs,
    helm,
    kustomize,
    run,
    without_helm_labels,
)

import gpuremediate
from gpuremediate.kube import errors
from gpuremediate.kube.resources import CONFIGMAPS, CRDS, DEPLOYMENTS, NAMESPACES, NODES, Resource
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab import record

POLICY = ("ConfigMap", NAMESPACE, "gpuremediate-policy")
MAINTENANCE = Resource("gpuremediate.io", "v1alpha1", "maintenancerequests", "MaintenanceRequest", False)
STUB_KINDS = [("monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules"),
              ("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors")]
LINT_WARNING, LINT_ERROR = 2, 3  # Helm's support severities (1 info, 2 warning, 3 error)


def policy_of(configmap: dict[str, Any]) -> Any:
    return loads_policy(configmap["data"]["policy.toml"], source="policy.toml")


def assert_same_objects(chart: list[dict[str, Any]], kustomized: list[dict[str, Any]]) -> None:
    """Every object of the kustomization, and no other, with the same content (the policy compared as the
    controller reads it: the chart writes it from values, without the comments)."""
    ours = {k: without_helm_labels(v) for k, v in by_key(chart).items()}
    theirs = by_key(kustomized)
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        if k == POLICY:
            assert policy_of(ours[k]) == policy_of(theirs[k])
            ours[k] = {**ours[k], "data": None}
            theirs[k] = {**theirs[k], "data": None}
        assert ours[k] == theirs[k], k


def _stub_crds(cluster: Cluster) -> None:
    """The Prometheus Operator's two kinds, any schema (Helm maps every kind it applies through discovery)."""
    for group, version, kind, plural in STUB_KINDS:
        cluster.kube.create(CRDS, {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
                     "versions": [{"name": version, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})


def test_lint_passes() -> None:
    module = helm()
    result = run(module.Lint(module.Configuration(namespace=NAMESPACE)).run(str(CHART)))
    assert result["TotalChartsLinted"] == 1
    assert not result["Errors"], result
    assert all(m["Severity"] < LINT_WARNING for m in result["Messages"]), result["Messages"]  # info only: no icon


def test_lint_fails_a_broken_chart(tmp_path: Path) -> None:
    """The lint above can fail: a template that does not parse is an error."""
    module = helm()
    broken = tmp_path / "gpuremediate"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("{{ if }}\n", encoding="utf-8")
    try:
        result = run(module.Lint(module.Configuration(namespace=NAMESPACE)).run(str(broken)))
    except module.ChartError:
        return
    assert result["Errors"] or any(m["Severity"] >= LINT_ERROR for m in result["Messages"]), result


def test_defaults_are_the_kustomize_base_and_agent(cluster: Cluster) -> None:
    chart = cluster.rendered()
    kustomized = kustomize("base") + kustomize("agent")
    # The release's namespace is Helm's (it must exist before the release): the base's Namespace object is not
    # the chart's; the Jobs' and the agent's namespaces are.
    release_ns = [o for o in kustomized if o["kind"] == "Namespace" and o["metadata"]["name"] == NAMESPACE]
    assert release_ns and not [o for o in chart if o["kind"] == "Namespace" and o["metadata"]["name"] == NAMESPACE]
    # CRDs come from the chart's crds/ (Helm installs them before the release, never in its manifest).
    crds = [o for o in kustomized if o["kind"] == "CustomResourceDefinition"]
    assert crds and not [o for o in chart if o["kind"] == "CustomResourceDefinition"]
    shipped = [d for path in sorted((CHART / "crds").glob("*.yaml")) for d in docs(path.read_text(encoding="utf-8"))]
    assert by_key(shipped) == by_key(crds)
    for crd in crds:
        assert cluster.kube.get(CRDS, crd["metadata"]["name"])["spec"]["group"] == crd["spec"]["group"]
    assert_same_objects(chart, [o for o in kustomized if o not in release_ns and o not in crds])


def test_dry_run_is_the_dry_run_overlay(cluster: Cluster) -> None:
    chart = {k: v for k, v in by_key(cluster.rendered({"dryRun": True})).items() if k[0] == "Deployment"}
    overlay = [o for o in kustomize("overlays/dry-run") if o["kind"] == "Deployment"]
    assert_same_objects(list(chart.values()), overlay)
    assert "--dry-run" in overlay[0]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_shards_are_the_sharded_overlay(cluster: Cluster) -> None:
    chart = cluster.rendered({"controller": {"shards": 4}})
    overlay = kustomize("overlays/sharded")
    kinds = ("Deployment", "Role", "RoleBinding")
    assert_same_objects([o for o in chart if o["kind"] in kinds], [o for o in overlay if o["kind"] in kinds])
    args = by_key(overlay)["Deployment", NAMESPACE, "gpuremediate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--shards=4" in args


def test_cli_roles_are_on_by_default_and_the_switch_drops_only_them(cluster: Cluster) -> None:
    """The people's roles (manifests/base/rbac-people.yaml) render by default (the defaults test compares them);
    cliRoles.enabled=false leaves out those four objects and nothing else."""
    kustomized = set(by_key(kustomize("base") + kustomize("agent")))
    people = {key for key in kustomized if key[2] in ("gpuremediate-viewer", "gpuremediate-operator")}
    assert {k[:2] for k in people} == {("ClusterRole", ""), ("Role", NAMESPACE)} and len(people) == 4, people
    not_the_charts = {k for k in kustomized if k[0] == "CustomResourceDefinition" or k == ("Namespace", "", NAMESPACE)}
    without = set(by_key(cluster.rendered({"cliRoles": {"enabled": False}})))
    assert without == kustomized - not_the_charts - people


def test_monitoring_and_the_drain_window_plugin_are_their_kustomizations(cluster: Cluster) -> None:
    _stub_crds(cluster)
    values = {"monitoring": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                             "dashboard": {"enabled": True}},
              "drainWindow": {"enabled": True}}
    chart = cluster.rendered(values)
    base = {k for k in by_key(kustomize("base") + kustomize("agent"))}
    extra = [o for o in chart if (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) not in base]
    assert_same_objects(extra, kustomize("monitoring") + kustomize("plugins/drain-window"))


def test_values_reach_the_objects(cluster: Cluster) -> None:
    digest = "sha256:" + "ab" * 32
    values = {
        "image": {"repository": "registry.example.com/gpuremediate", "digest": digest},
        "controller": {"nodeSelector": {"node-role.kubernetes.io/infra": ""}, "priorityClassName": "infra-critical",
                       "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
                       "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
                       "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}},
        "agent": {"kmsgAccess": False, "priorityClassName": "system-node-critical"},
        "jobsNamespace": "gpu-repair",
        "policy": {"drain": {"mode": "AllowCompletion", "skip_namespaces": ["kube-system"]},
                   "thermal": {"hold_s": 90.5}, "xid": {"overrides": {"79": "reboot"}},
                   "groups": [{"name": "h100", "selector": "nvidia.com/gpu.product=H100",
                               "thermal": {"gpu_cordon_c": 87}}]},
    }
    objs = by_key(cluster.rendered(values))
    pod = objs["Deployment", NAMESPACE, "gpuremediate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"registry.example.com/gpuremediate@{digest}"
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/infra": ""}
    assert pod["priorityClassName"] == "infra-critical"
    assert pod["tolerations"] == values["controller"]["tolerations"]  # type: ignore[index]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container["env"]
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert "--jobs-namespace=gpu-repair" in container["args"]
    assert ("ServiceAccount", "gpu-repair", "gpuremediate-job") in objs
    assert ("Role", "gpu-repair", "gpuremediate-controller") in objs
    agent = objs["DaemonSet", "gpuremediate-agent", "gpuremediate-agent"]["spec"]["template"]["spec"]
    assert agent["priorityClassName"] == "system-node-critical"
    assert agent["securityContext"]["runAsUser"] == 65532
    assert agent["containers"][0]["securityContext"]["privileged"] is False
    policy = policy_of(objs[POLICY]).defaults
    assert policy.drain.mode == "AllowCompletion" and policy.drain.skip_namespaces == ("kube-system",)
    assert policy.thermal.hold_s == 90.5
    assert policy.xid.overrides[79].action == "reboot"
    group = policy_of(objs[POLICY]).groups[0]
    assert group.name == "h100" and group.policy.thermal.gpu_cordon_c == 87.0
    assert group.policy.drain.mode == "AllowCompletion"  # a group keeps what it does not name


@pytest.mark.parametrize(("values", "named"), [
    ({"policy": {"drain": {"mode": "Fast"}}}, ["policy", "drain", "mode", "Immediate"]),
    ({"policy": {"thermal": {"hot_c": 95}}}, ["policy", "thermal", "hot_c"]),
    ({"policy": {"thermal": {"hold_s": -5}}}, ["policy", "thermal", "hold_s"]),
    ({"policy": {"ecc": {"dbe_min": 1.5}}}, ["policy", "ecc", "dbe_min"]),
    ({"policy": {"remediation": {"reboot": {"service_account": "Not_A_Name"}}}},
     ["policy", "remediation", "reboot", "service_account"]),
    ({"image": {"digest": "latest"}}, ["image", "digest"]),
    ({"dryRun": "yes"}, ["dryRun"]),
])
def test_the_schema_refuses_a_bad_value_naming_it(cluster: Cluster, values: dict[str, Any],
                                                  named: list[str]) -> None:
    with pytest.raises(cluster.helm.HelmError) as caught:
        cluster.install(values)
    message = str(caught.value)
    assert "schema" in message.lower(), message
    for part in named:
        assert part in message, (part, message)
    with pytest.raises(errors.NotFound):  # refused before anything was applied
        cluster.kube.get(DEPLOYMENTS, "gpuremediate", namespace=NAMESPACE)


def test_upgrade_keeps_the_policy_and_the_records(cluster: Cluster, tmp_path: Path) -> None:
    """The previous release's chart (the newest v* tag below this version, from git; without one, this chart as
    version N and a copy as N+1) installed with a changed policy; the controller's state written beside it (a node's
    record and state label, its breaker ConfigMap, a MaintenanceRequest); then `helm upgrade --reuse-values` to the
    next with one more value: the policy keeps the first change and takes the second, the image is the new version,
    and every record is untouched. `helm uninstall` then removes the release's objects and still leaves the records
    and the CRD's requests."""
    first, following, upgraded = _previous_and_next(tmp_path)
    cluster.install({"policy": {"thermal": {"hold_s": 120}}}, chart=first)
    rec = record.NodeRecord(state="quarantined", since=1_700_000_000.0, reason="repeat-offender", node="gpu-node-1")
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "gpu-node-1", "labels": {record.STATE_LABEL: rec.state},
        "annotations": {record.RECORD_ANNOTATION: record.encode(rec)}}}
    cluster.kube.create(NODES, node)
    cluster.kube.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "gpuremediate-breaker", "namespace": NAMESPACE}, "data": {"state": '{"open": false}'}},
        namespace=NAMESPACE)
    cluster.kube.create(MAINTENANCE, {"apiVersion": "gpuremediate.io/v1alpha1", "kind": "MaintenanceRequest",
                                      "metadata": {"name": "rack-7"},
                                      "spec": {"healthEvent": {"nodeName": "gpu-node-1", "isHealthy": False}}})
    before = cluster.kube.get(NODES, "gpu-node-1")["metadata"]

    result = cluster.upgrade({"policy": {"drain": {"mode": "AllowCompletion"}}}, chart=upgraded, reuse_values=True)
    assert result["version"] == 2 and result["info"]["status"] == "deployed"

    policy = policy_of(cluster.kube.get(CONFIGMAPS, "gpuremediate-policy", namespace=NAMESPACE)).defaults
    assert policy.thermal.hold_s == 120.0 and policy.drain.mode == "AllowCompletion"
    deployment = cluster.kube.get(DEPLOYMENTS, "gpuremediate", namespace=NAMESPACE)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f":{following}")
    after = cluster.kube.get(NODES, "gpu-node-1")["metadata"]
    assert after["annotations"][record.RECORD_ANNOTATION] == before["annotations"][record.RECORD_ANNOTATION]
    assert record.record_from_node({"metadata": after}) == rec
    assert after["labels"][record.STATE_LABEL] == "quarantined"
    assert cluster.kube.get(CONFIGMAPS, "gpuremediate-breaker", namespace=NAMESPACE)["data"]
    assert cluster.kube.get(MAINTENANCE, "rack-7")["spec"]["healthEvent"]["nodeName"] == "gpu-node-1"

    cluster.uninstall()
    with pytest.raises(errors.NotFound):
        cluster.kube.get(DEPLOYMENTS, "gpuremediate", namespace=NAMESPACE)
    assert record.record_from_node(cluster.kube.get(NODES, "gpu-node-1")) == rec
    assert cluster.kube.get(CONFIGMAPS, "gpuremediate-breaker", namespace=NAMESPACE)
    assert cluster.kube.get(MAINTENANCE, "rack-7")  # crds/ are never deleted by Helm: nor their objects
    assert cluster.kube.get(NAMESPACES, NAMESPACE)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _previous_and_next(tmp: Path) -> tuple[Path, str, Path]:
    """(the chart to install first, the version upgraded to, the chart to upgrade to)."""
    version = gpuremediate.__version__
    tags = subprocess.run(["git", "-C", str(ROOT), "tag", "--list", "v[0-9]*.[0-9]*.[0-9]*"], capture_output=True,
                          text=True, timeout=30, check=False).stdout.split()
    older = sorted((t for t in tags if re.fullmatch(r"v\d+\.\d+\.\d+", t) and _version(t[1:]) < _version(version)),
                   key=lambda t: _version(t[1:]))
    for tag in reversed(older):
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", tag, "charts/gpuremediate"],
                                 capture_output=True, timeout=60, check=False)
        if archive.returncode == 0:
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(tmp / "previous", filter="data")
            return tmp / "previous" / "charts" / "gpuremediate", version, CHART
    upgraded = tmp / "gpuremediate"  # no earlier release: this chart as N, a copy as N+1 (next version and image)
    shutil.copytree(CHART, upgraded)
    major, minor, patch = _version(version)
    following = f"{major}.{minor}.{patch + 1}"
    chart_yaml = (upgraded / "Chart.yaml").read_text(encoding="utf-8")
    (upgraded / "Chart.yaml").write_text(chart_yaml.replace(version, following), encoding="utf-8")
    return CHART, following, upgraded


def test_chart_copies_are_the_manifests() -> None:
    """The files the chart reads verbatim (it cannot reach outside its directory) are manifests/' own."""
    pairs = {
        CHART / "crds" / "gpuremediate.io_maintenancerequests.yaml":
            MANIFESTS / "crds" / "gpuremediate.io_maintenancerequests.yaml",
        CHART / "files" / "grafana-dashboard.json": MANIFESTS / "monitoring" / "grafana-dashboard.json",
        CHART / "files" / "prometheusrule.yaml": MANIFESTS / "monitoring" / "prometheusrule.yaml",
        CHART / "files" / "recording-rules.yaml": MANIFESTS / "monitoring" / "recording-rules.yaml",
        CHART / "files" / "crd-drainrequests.yaml": MANIFESTS / "plugins" / "drain-window" / "crd-drainrequests.yaml",
    }
    for copy, source in pairs.items():
        assert copy.read_bytes() == source.read_bytes(), f"{copy} differs from {source}: cp {source} {copy}"
    assert json.loads((CHART / "files" / "grafana-dashboard.json").read_text(encoding="utf-8"))
