"""Offline structural checks of everything under manifests/ (no cluster needed)."""

from __future__ import annotations

import csv
import inspect
import io
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from manifests_support import (
    AGGREGATE_LABEL,
    KUSTOMIZATION,
    KUSTOMIZE_ROOTS,
    MANIFESTS,
    PROMTOOL_TESTS,
    ROOT,
    controller_grants,
    known_series,
    named,
    objects,
    of_kind,
    series_in,
)

from gpuremediate import cli
from gpuremediate.kube.miniyaml import load, load_all
from gpuremediate.signals import dcgm
from gpuremediate.vocab import window
from sim import gpusim

# the series the controller's dcgm parser reads (signals/dcgm.py): the counters must enable them
POLICY_FIELDS = {dcgm.XID_FIELD, dcgm.XID_COUNT_SERIES, *dcgm.NAMED_FIELDS}


# -- every file ---------------------------------------------------------------------------------


def test_every_manifest_loads_and_every_object_is_named() -> None:
    count = 0
    for path, obj in objects(with_patches=True):
        assert obj.get("apiVersion"), f"{path}: object without apiVersion"
        assert obj.get("kind"), f"{path}: object without kind"
        assert obj.get("metadata", {}).get("name"), f"{path}: {obj['kind']} without metadata.name"
        count += 1
    assert count >= 30


def _kustomization_refs(kdir: Path) -> list[Path]:
    spec = load((kdir / KUSTOMIZATION).read_text(encoding="utf-8"))
    refs = [kdir / r for r in spec.get("resources", [])]
    refs += [kdir / p["path"] for p in spec.get("patches", []) if "path" in p]
    for generator in spec.get("configMapGenerator", []):
        refs += [kdir / f.split("=", 1)[-1] for f in generator.get("files", [])]
    return refs


def test_kustomizations_list_only_existing_files_and_every_manifest_is_listed() -> None:
    listed: set[Path] = set()
    for kfile in MANIFESTS.rglob(KUSTOMIZATION):
        for ref in _kustomization_refs(kfile.parent):
            assert ref.exists(), f"{kfile} lists {ref}, which does not exist"
            if ref.is_dir():
                assert (ref / KUSTOMIZATION).exists(), f"{kfile}: {ref} is a directory without {KUSTOMIZATION}"
            listed.add(ref.resolve())
    files = [p for p in MANIFESTS.rglob("*") if p.suffix in (".yaml", ".json") and p.name != KUSTOMIZATION
             and PROMTOOL_TESTS not in p.parents]  # promtool's unit tests: beside the rules, not resources
    unlisted = [str(p.relative_to(MANIFESTS)) for p in files if p.resolve() not in listed]
    assert not unlisted, f"manifests no kustomization lists: {unlisted}"


# -- workloads ----------------------------------------------------------------------------------


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_every_workload_runs_non_root_read_only_with_nothing_extra(kind: str) -> None:
    workloads = of_kind(kind)
    assert workloads
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in _containers(workload):
            where = f"{workload['metadata']['name']}/{container['name']}"
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in security["capabilities"], where
            assert set(container["resources"]) == {"requests", "limits"}, where


def test_controller_deployment_matches_the_contract() -> None:
    deployment = named("Deployment", "gpuremediate")
    assert deployment["metadata"]["namespace"] == "gpuremediate-system"
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpuremediate"
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["topologySpreadConstraints"] and pod["affinity"]["podAntiAffinity"]
    (container,) = pod["containers"]
    assert container["image"] == "gpuremediate"  # the released tag: manifests/components/release
    args = cli.build_parser().parse_args(container["args"])  # the real flags of `gpuremediate run`
    settings = cli.settings_from_args(args)
    assert args.command == "run" and settings.leader_elect and settings.log_format == "json"
    assert settings.policy_path == "/etc/gpuremediate/policy.toml"
    assert settings.lease_name == "gpuremediate" and settings.jobs_namespace == "gpuremediate-jobs"
    assert container["securityContext"]["runAsUser"] == 65532
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": settings.metrics_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/gpuremediate"]]["configMap"]["name"] == "gpuremediate-policy"


def test_metrics_service_and_pdb_select_the_controller() -> None:
    labels = named("Deployment", "gpuremediate")["spec"]["template"]["metadata"]["labels"]
    service = named("Service", "gpuremediate-metrics")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= labels.items()
    pdb = named("PodDisruptionBudget", "gpuremediate")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_jobs_namespace_is_privileged_with_a_tokenless_service_account() -> None:
    namespace = named("Namespace", "gpuremediate-jobs")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    account = [sa for sa in of_kind("ServiceAccount") if sa["metadata"]["name"] == "gpuremediate-job"]
    assert account[0]["metadata"]["namespace"] == "gpuremediate-jobs"
    assert account[0]["automountServiceAccountToken"] is False


# -- RBAC -----------------------------------------------------------------------------------------


def test_no_rbac_rule_uses_a_wildcard() -> None:
    roles = of_kind("Role", "ClusterRole")
    assert roles
    for role in roles:
        for rule in role.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: wildcard in {field}"
                assert not any("*" in v for v in rule.get(field, [])), role["metadata"]["name"]


def test_the_controller_cluster_role_aggregates_and_holds_no_rules_itself() -> None:
    role = named("ClusterRole", "gpuremediate-controller")
    assert role["aggregationRule"]["clusterRoleSelectors"] == [{"matchLabels": {AGGREGATE_LABEL: "true"}}]
    assert "rules" not in role
    grants = controller_grants()
    assert {g.role for g in grants} >= {"gpuremediate-controller-core", "gpuremediate-controller"}
    assert all(g.namespace in (None, "gpuremediate-system", "gpuremediate-jobs", "default") for g in grants)


def test_an_aggregated_cluster_role_declares_no_rules_field() -> None:
    """kube-controller-manager's clusterrole-aggregation-controller owns an aggregated ClusterRole's .rules
    (it writes them by a forced server-side apply): a manifest that declares the field, even ``rules: []``,
    fails its second ``kubectl apply --server-side`` (conflict with "clusterrole-aggregation-controller":
    .rules), as GitOps tools apply. tests/manifests/test_server_side_apply.py applies every kustomization
    twice."""
    aggregated = [r for r in of_kind("ClusterRole") if "aggregationRule" in r]
    assert aggregated, "no aggregated ClusterRole found"
    for role in aggregated:
        assert "rules" not in role, f"{role['metadata']['name']}: an aggregated ClusterRole declares rules"


def test_plugin_kinds_sit_in_their_own_aggregated_cluster_roles() -> None:
    for role in of_kind("ClusterRole"):
        groups = {g for rule in role.get("rules", []) for g in rule["apiGroups"]}
        plugin_groups = groups & {"nvsentinel.nvidia.com", "nvsentinel.dgxc.nvidia.com"}
        if plugin_groups and role["metadata"]["name"].startswith("gpuremediate-controller"):
            assert groups == plugin_groups, f"{role['metadata']['name']} mixes plugin and core permissions"
            assert role["metadata"]["labels"][AGGREGATE_LABEL] == "true"


# -- CRDs -----------------------------------------------------------------------------------------


def _walk_schema(node: dict[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield where, node
    for name, child in node.get("properties", {}).items():
        yield from _walk_schema(child, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk_schema(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk_schema(node["additionalProperties"], f"{where}{{}}")


def _crd_versions() -> Iterator[tuple[str, dict[str, Any]]]:
    for crd in of_kind("CustomResourceDefinition"):
        for version in crd["spec"]["versions"]:
            yield f"{crd['metadata']['name']}/{version['name']}", version


def test_crd_schemas_are_structural_and_validations_have_messages() -> None:
    rules = 0
    for name, version in _crd_versions():
        for where, node in _walk_schema(version["schema"]["openAPIV3Schema"], name):
            if not (node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")):
                assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, where
            if node.get("type") == "array":
                assert isinstance(node.get("items"), dict), f"{where}: array without items"
            if "properties" in node or "additionalProperties" in node:
                assert node["type"] == "object", where
            for validation in node.get("x-kubernetes-validations", []):
                assert isinstance(validation["rule"], str) and validation["rule"].strip(), where
                assert isinstance(validation["message"], str) and validation["message"].strip(), where
                rules += 1
    assert rules >= 2


def _schema_has_path(schema: dict[str, Any], json_path: str) -> bool:
    node = schema
    for part in re.sub(r"\[[^\]]*\]", ".[]", json_path).strip(".").split("."):
        if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
            return True  # metadata: the API server's own schema
        if part == "[]":
            node = node.get("items", {})
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            return False
    return True


def test_printer_columns_point_into_the_schema() -> None:
    for name, version in _crd_versions():
        schema = version["schema"]["openAPIV3Schema"]
        for column in version.get("additionalPrinterColumns", []):
            assert _schema_has_path(schema, column["jsonPath"]), f"{name}: column {column['name']}"
    assert not _schema_has_path({"type": "object", "properties": {"spec": {"type": "object", "properties": {}}}},
                                ".spec.nope")


def test_maintenance_request_crd_contract() -> None:
    crd = named("CustomResourceDefinition", "maintenancerequests.gpuremediate.io")
    assert crd["spec"]["scope"] == "Cluster" and crd["spec"]["names"]["shortNames"] == ["mr"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns[:3] == [("Node", ".spec.healthEvent.nodeName"), ("StartTime", ".spec.startTime"),
                           ("Phase", ".status.phase")]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["startTime"]["format"] == "date-time" and "startTime" not in spec["required"]
    event = spec["properties"]["healthEvent"]
    assert "nodeName" in event["required"]
    rules = {v["rule"] for v in event["x-kubernetes-validations"]}
    assert "self == oldSelf" in rules and "!self.isHealthy" in rules
    actions = event["properties"]["recommendedAction"]["enum"]
    assert {"NONE", "COMPONENT_RESET", "RESTART_VM", "RESTART_BM", "REPLACE_VM", "CONTACT_SUPPORT", "CUSTOM"} <= set(
        actions
    )


def test_nvsentinel_group_copy_differs_only_in_group() -> None:
    ours = named("CustomResourceDefinition", "maintenancerequests.gpuremediate.io")
    theirs = named("CustomResourceDefinition", "maintenancerequests.nvsentinel.dgxc.nvidia.com")
    assert theirs["spec"]["group"] == "nvsentinel.dgxc.nvidia.com"
    as_ours = json.loads(
        json.dumps(theirs).replace("maintenancerequests.nvsentinel.dgxc.nvidia.com", ours["metadata"]["name"])
    )
    as_ours["spec"]["group"] = "gpuremediate.io"
    assert as_ours == ours


def test_drain_request_crd_follows_nvsentinel_contract() -> None:
    crd = named("CustomResourceDefinition", "drainrequests.nvsentinel.nvidia.com")
    assert crd["spec"]["scope"] == "Namespaced" and crd["spec"]["group"] == "nvsentinel.nvidia.com"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["nodeName"]["type"] == "string"
    assert spec["podsToDrain"]["additionalProperties"] == {"type": "array", "items": {"type": "string"}}
    assert {"checkName", "recommendedAction", "errorCode", "healthEventID", "entitiesImpacted"} <= set(spec)


# -- kind ------------------------------------------------------------------------------------------


def test_gpu_sim_daemonset_poses_as_dcgm_exporter() -> None:
    daemonset = named("DaemonSet", "gpu-sim")
    assert daemonset["metadata"]["namespace"] == "gpu-operator"
    template = daemonset["spec"]["template"]
    assert template["metadata"]["labels"]["app"] == "nvidia-dcgm-exporter"
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert env == {"NODE_NAME": "spec.nodeName"}
    assert container["ports"][0]["containerPort"] == 9400
    assert "command" not in container, "the image's entrypoint runs gpu-sim (sim/Dockerfile)"
    args = gpusim.build_parser().parse_args(container["args"])
    assert args.command is None and args.port == 9400 and args.host == "0.0.0.0"  # serve


# -- dcgm-exporter, monitoring --------------------------------------------------------------------


def test_dcgm_counters_enable_every_field_the_policy_reads() -> None:
    config_map = load((MANIFESTS / "dcgm-exporter/counters-configmap.yaml").read_text(encoding="utf-8"))
    rows = [
        [cell.strip() for cell in row]
        for row in csv.reader(io.StringIO(config_map["data"]["dcgm-metrics.csv"]))
        if row and not row[0].lstrip().startswith("#")
    ]
    assert all(len(row) == 3 and row[1] in {"gauge", "counter", "label"} for row in rows), rows
    fields = [row[0] for row in rows]
    assert len(fields) == len(set(fields)), "a field listed twice"
    assert set(fields) >= POLICY_FIELDS, POLICY_FIELDS - set(fields)


def test_grafana_dashboard_parses_and_uses_only_known_metrics() -> None:
    dashboard = json.loads((MANIFESTS / "monitoring/grafana-dashboard.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert exprs
    used = set().union(*map(series_in, exprs))
    unknown = used - known_series()
    assert not unknown, f"the dashboard queries metrics the controller does not export: {unknown}"
    assert {"gpuremediate_nodes", "gpuremediate_transitions_total", "gpuremediate_blocked_nodes",
            "gpuremediate_remediation_seconds_bucket"} <= used
    # what an operator asks of it first: what holds work back, what cannot be seen, who was not told, API trouble
    assert {"gpuremediate_paused", "gpuremediate_nodes_unknown", "gpuremediate_fleet_health_unknown",
            "gpuremediate_domain_breaker_open", "gpuremediate_notifications_total",
            "gpuremediate_api_errors_total", "gpuremediate_node_state"} <= used


def test_grafana_dashboard_has_a_node_table_and_panels_that_do_not_overlap() -> None:
    dashboard = json.loads((MANIFESTS / "monitoring/grafana-dashboard.json").read_text(encoding="utf-8"))
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "two panels share an id"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    tables = [p for p in panels if p["type"] == "table"]
    assert tables, "no table of nodes: a person cannot find the node behind a graph"
    for table in tables:  # one row per node, its state beside it
        (target,) = table["targets"]
        assert target["format"] == "table" and target["instant"] is True
        assert "by (node, state)" in target["expr"] and "gpuremediate_node_state" in target["expr"]
        columns = table["transformations"][0]["options"]["renameByName"]
        assert columns == {"node": "Node", "state": "State"}
    titles = {p["title"] for p in panels}
    assert {"Paused", "Domain breakers open", "GPU nodes of unknown health", "Fleet health unknown",
            "Notifications by kind and result", "Kubernetes API errors by reason"} <= titles


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian's prometheus package)")
def test_grafana_dashboard_queries_parse_as_promql(tmp_path: Path) -> None:
    """Each panel's query, Grafana's $__ variables given values, parses (promtool checks it as a recording rule)."""
    dashboard = json.loads((MANIFESTS / "monitoring/grafana-dashboard.json").read_text(encoding="utf-8"))
    exprs = [t["expr"].replace("$__rate_interval", "5m").replace("$__range", "1h")
             for panel in dashboard["panels"] for t in panel["targets"]]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard.yaml").write_text(json.dumps(rules), encoding="utf-8")
    checked = subprocess.run([str(shutil.which("promtool")), "check", "rules", str(tmp_path / "dashboard.yaml")],
                             capture_output=True, text=True, timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_alerts_cover_the_failure_modes_with_known_metrics() -> None:
    rule = named("PrometheusRule", "gpuremediate")
    alerts = {r["alert"]: r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]}
    for name, expr in alerts.items():
        assert series_in(expr) <= known_series(), f"{name}: unknown metrics {series_in(expr) - known_series()}"
    joined = " ".join(alerts.values())
    for series in ("circuit_breaker_open", 'nodes{state="quarantined"}', 'nodes{state="draining"}',
                   'nodes{state="repairing"}', "scrape_errors_total", "leader"):
        assert f"gpuremediate_{series}" in joined, series


# -- kustomize, when kubectl is here --------------------------------------------------------------



@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("root", KUSTOMIZE_ROOTS)
def test_kustomize_renders_and_the_render_loads(root: str) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS / root)], capture_output=True, text=True, timeout=60, check=False
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = load_all(rendered.stdout)
    assert docs and all(d["kind"] and d["metadata"]["name"] for d in docs)
    deployments = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpuremediate"]
    if root == "overlays/dry-run":
        assert deployments[0]["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--dry-run"
    if root == "overlays/sharded":
        spec = deployments[0]["spec"]
        assert spec["replicas"] == 2 and spec["template"]["spec"]["containers"][0]["args"][-1] == "--shards=4"
    if root == "overlays/nvsentinel-compat":
        args = deployments[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[-1] == "--maintenance-group=nvsentinel.dgxc.nvidia.com"
        assert any(d["metadata"]["name"] == "maintenancerequests.nvsentinel.dgxc.nvidia.com" for d in docs)
    policies = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpuremediate-policy"]
    if root in ("base", "overlays/kind"):
        (policy,) = policies
        want = (MANIFESTS / root / "policy.toml").read_text(encoding="utf-8")
        assert policy["data"]["policy.toml"] == want
        volumes = deployments[0]["spec"]["template"]["spec"]["volumes"]
        assert {"name": "policy", "configMap": {"name": policy["metadata"]["name"]}} in volumes


# -- scripts and workflows ----------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_kind_scripts_pass_shellcheck() -> None:
    scripts = sorted(str(p) for p in (ROOT / "e2e/kind").glob("*.sh"))
    assert scripts
    result = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kind_cluster_has_as_many_gpu_workers_as_the_emulator_target_has_nodes() -> None:
    from e2e.harness import EmulatorCluster

    cluster = load((ROOT / "e2e/kind/cluster.yaml").read_text(encoding="utf-8"))
    roles = [n["role"] for n in cluster["nodes"]]
    emulated = inspect.signature(EmulatorCluster).parameters["nodes"].default
    assert roles == ["control-plane"] + ["worker"] * emulated, "the scenarios index nodes[0..3]"


def test_kind_controller_stays_on_the_control_plane() -> None:
    patch = load((MANIFESTS / "overlays/kind/controller-on-control-plane.yaml").read_text(encoding="utf-8"))
    spec = patch["spec"]["template"]["spec"]
    # the scenarios drain the GPU workers with scope "all": a controller there would evict itself
    assert spec["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"} \
        in spec["tolerations"]


def test_workflows_load_and_run_the_make_targets() -> None:
    ci = load((ROOT / ".github/workflows/ci.yaml").read_text(encoding="utf-8"))
    e2e = load((ROOT / ".github/workflows/e2e-kind.yaml").read_text(encoding="utf-8"))
    ci_runs = [s.get("run", "") for job in ci["jobs"].values() for s in job["steps"]]
    e2e_steps = [s for job in e2e["jobs"].values() for s in job["steps"]]
    assert "make lint" in ci_runs and "make test" in ci_runs
    assert [s.get("run") for s in e2e_steps if s.get("run", "").startswith("make")] == ["make test", "make e2e-kind"]
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in e2e_steps)


def test_drain_window_plugin_runs_a_real_subcommand_with_valid_flags() -> None:
    (container,) = named("Deployment", "gpuremediate-drain-window")["spec"]["template"]["spec"]["containers"]
    args = cli.build_parser().parse_args(container["args"])
    assert (args.command, args.plugin) == ("plugin", "drain-window"), args
    assert window.parse_days(args.days) and window.parse_hours(args.hours)  # raise on a bad window
