"""Loading manifests/ for the tests (no cluster, no PyYAML): objects, roles, the controller's grants."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuremediate.kube.miniyaml import load, load_all
from gpuremediate.obs.controller_metrics import ControllerMetrics

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
KUSTOMIZATION = "kustomization.yaml"
CONTROLLER_SA = ("gpuremediate-system", "gpuremediate")
AGGREGATE_LABEL = "gpuremediate.io/aggregate-to-controller"
# Every kustomization a person (or a GitOps tool) applies, in an order that applies: a root's namespaces first.
KUSTOMIZE_ROOTS = ["base", "agent", "overlays/dry-run", "overlays/kind", "overlays/nvsentinel-compat",
                   "overlays/sharded", "plugins/drain-window", "dcgm-exporter", "monitoring", "crds"]


PROMTOOL_TESTS = MANIFESTS / "monitoring" / "tests"  # `promtool test rules` files: not Kubernetes objects


def manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.rglob("*.yaml") if PROMTOOL_TESTS not in p.parents)


def patch_files() -> set[Path]:
    """Files kustomize merges onto other objects: partial objects, not resources of their own."""
    found: set[Path] = set()
    for kfile in MANIFESTS.rglob(KUSTOMIZATION):
        spec = load(kfile.read_text(encoding="utf-8"))
        found |= {(kfile.parent / p["path"]).resolve() for p in spec.get("patches", []) if "path" in p}
    return found


def objects(*, with_patches: bool = False, under: str = "") -> Iterator[tuple[Path, dict[str, Any]]]:
    skipped = set() if with_patches else patch_files()
    root = MANIFESTS / under if under else MANIFESTS
    for path in manifest_files():
        if path.name == KUSTOMIZATION or path.resolve() in skipped or root not in path.parents:
            continue
        for doc in load_all(path.read_text(encoding="utf-8")):
            assert isinstance(doc, dict), f"{path}: a document that is not an object"
            yield path, doc


def of_kind(*kinds: str, under: str = "") -> list[dict[str, Any]]:
    return [obj for _, obj in objects(under=under) if obj["kind"] in kinds]


def named(kind: str, name: str) -> dict[str, Any]:
    found = [obj for obj in of_kind(kind) if obj["metadata"]["name"] == name]
    assert found, f"no {kind} {name} under manifests/"
    return found[0]


# -- RBAC ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """One rule of a role bound to the controller; ``namespace`` None: cluster-wide (a ClusterRole)."""

    role: str
    namespace: str | None
    rule: dict[str, Any]

    def permissions(self) -> set[tuple[str, str, str, str | None]]:
        """(apiGroup, resource, verb, namespace) — what this rule grants, one per combination."""
        rule = self.rule
        return {(g, r, v, self.namespace) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def _aggregated(role: dict[str, Any], cluster_roles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ClusterRoles an aggregating ClusterRole collects (matchLabels selectors, as the control plane does)."""
    selectors = [s.get("matchLabels", {}) for s in role["aggregationRule"]["clusterRoleSelectors"]]
    labels_of = [(r, r["metadata"].get("labels", {})) for r in cluster_roles]
    return [r for r, labels in labels_of if any(sel.items() <= labels.items() for sel in selectors)]


def controller_grants(under: str = "base") -> list[Grant]:
    """Every rule the controller's ServiceAccount gets from the bindings under ``manifests/<under>``."""
    found = [obj for _, obj in objects(under=under)]
    cluster_roles = [o for o in found if o["kind"] == "ClusterRole"]
    grants: list[Grant] = []
    for binding in (o for o in found if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        subjects = {(s.get("namespace"), s["name"]) for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
        if CONTROLLER_SA not in subjects:
            continue
        namespace = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        matches = [o for o in found if o["kind"] == ref["kind"] and o["metadata"]["name"] == ref["name"]
                   and (ref["kind"] == "ClusterRole" or o["metadata"].get("namespace") == namespace)]
        assert len(matches) == 1, f"binding {binding['metadata']['name']} refers to a missing {ref['kind']}"
        role = matches[0]
        parts = _aggregated(role, cluster_roles) if "aggregationRule" in role else [role]
        for part in parts:
            grants += [Grant(part["metadata"]["name"], namespace, rule) for rule in part.get("rules", [])]
    return grants


# -- metrics --------------------------------------------------------------------------------------


def controller_metrics() -> dict[str, str]:
    """name -> type of every metric the controller registers (from its own /metrics text)."""
    text = ControllerMetrics().registry.render()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def known_series() -> set[str]:
    """Every series name a query may use: counters and gauges, and _bucket/_sum/_count of histograms."""
    series: set[str] = set()
    for name, kind in controller_metrics().items():
        if kind == "histogram":  # a histogram's own name is no series: only these three are
            series |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            series.add(name)
    return series


def series_in(text: str) -> set[str]:
    return set(re.findall(r"\bgpuremediate_[a-z_]+\b", text))


CONTROLLER_USER = f"system:serviceaccount:{CONTROLLER_SA[0]}:{CONTROLLER_SA[1]}"


def rules_by_scope(grants: list[Grant]) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The grants as the emulator enforces them: cluster-wide rules, and rules per namespace."""
    cluster = [g.rule for g in grants if g.namespace is None]
    namespaced: dict[str, list[dict[str, Any]]] = {}
    for g in grants:
        if g.namespace is not None:
            namespaced.setdefault(g.namespace, []).append(g.rule)
    return cluster, namespaced


def allows(grant: Grant, verb: str, group: str, resource: str, namespace: str | None, name: str | None) -> bool:
    rule = grant.rule
    if grant.namespace is not None and grant.namespace != namespace:
        return False
    names = rule.get("resourceNames") or []
    return (group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
            and (not names or name in names))


def deployment_args(policy: Path, cluster: Any, kubeconfig: str, *extra: str) -> list[str]:
    """The base Deployment's args pointed at a SimCluster (policy file, port, kubeconfig), then ``extra``."""
    (container,) = named("Deployment", "gpuremediate")["spec"]["template"]["spec"]["containers"]
    args = [a for a in container["args"] if not a.startswith(("--policy=", "--metrics-addr="))]
    sim_args = cluster.controller_args()
    sim_args[sim_args.index("--kubeconfig") + 1] = kubeconfig
    return [*args, *extra, f"--policy={policy}", "--metrics-addr=127.0.0.1:0", "--scrape-interval=0.3s",
            "--resync=0.3s", "--log-format=text", *sim_args]


def controller_calls(cluster: Any) -> list[tuple[str, str, str, str | None, str | None]]:
    """(verb, group, resource[/sub], namespace, name) of every resource request the controller's account made."""
    return [(verb, group, f"{res}/{sub}" if sub else res, ns, name)
            for user, verb, group, res, sub, ns, name in list(cluster.api.requests) if user == CONTROLLER_USER and res]


def kubeconfig_under_rbac(cluster: Any, tmp: Path, grants: list[Grant]) -> str:
    """A kubeconfig for the controller's ServiceAccount, whose requests the emulator allows by ``grants`` only."""
    token = secrets.token_hex(16)
    cluster.api.add_token(token, CONTROLLER_USER, ["system:serviceaccounts", "system:authenticated"])
    rules, namespaced = rules_by_scope(grants)
    cluster.api.enforce_rbac(CONTROLLER_USER, rules, namespaced=namespaced)
    return str(cluster.api.write_kubeconfig(tmp / "controller.kubeconfig", token))


@contextlib.contextmanager
def controller_under_rbac(cluster: Any, tmp: Path, policy_text: str) -> Iterator[Path]:
    """``gpuremediate run`` with the base Deployment's args as the controller's ServiceAccount, under the rules
    the base manifests bind to it (the emulator enforces them); yields the path of its log, SIGTERMed after."""
    kubeconfig = kubeconfig_under_rbac(cluster, tmp, controller_grants())
    policy = tmp / "policy.toml"
    policy.write_text(policy_text, encoding="utf-8")
    env = {**os.environ, "POD_NAMESPACE": "gpuremediate-system", "POD_NAME": "gpuremediate-rbac-test",
           "PYTHONPATH": str(ROOT)}
    log_path = tmp / "controller.log"
    with log_path.open("w") as log:
        argv = [sys.executable, "-m", "gpuremediate", *deployment_args(policy, cluster, kubeconfig)]
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield log_path
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
