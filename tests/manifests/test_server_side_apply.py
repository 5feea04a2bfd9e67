"""Every kustomization applies server-side twice (``kubectl apply --server-side -k``, as GitOps tools apply):
the second apply of a manifest that declares a field a controller owns fails with a conflict. The case that
did: the aggregated ClusterRole's ``rules: []`` against kube-controller-manager's
clusterrole-aggregation-controller, which owns ``.rules`` (a forced server-side apply).

Target: the emulator (sim.kubeapi over TLS, started here: it models that controller and stores every kind the
manifests hold; kubectl runs with ``--validate=false``, the emulator serves no OpenAPI), or, with
GPUREMEDIATE_TEST_KUBECONFIG, that real cluster. The Prometheus Operator's kinds get stub CRDs where they are
not served. Everything applied is deleted at the end, Namespaces included (their pods force-deleted: a
bare control plane has no kubelet to finish a deletion), so on a real cluster run it between e2e runs, not
during one. Needs kubectl.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from manifests_support import KUSTOMIZE_ROOTS, MANIFESTS

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.miniyaml import load_all
from gpuremediate.kube.resources import CRDS, NAMESPACES, PODS, Resource

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")

REAL_KUBECONFIG = os.environ.get("GPUREMEDIATE_TEST_KUBECONFIG")
AGGREGATION_MANAGER = "clusterrole-aggregation-controller"
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)
STUB_KINDS = {("monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules"),
              ("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors")}


class Target:
    def __init__(self, kubeconfig: str, emulated: bool) -> None:
        self.kubeconfig = kubeconfig
        self.emulated = emulated
        self.kube = KubeClient(load_config(kubeconfig))
        self.applied: list[str] = []
        self.stubs: list[str] = []

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True,
                              timeout=120, check=False)

    def apply(self, root: str) -> subprocess.CompletedProcess[str]:
        validate = ["--validate=false"] if self.emulated else []
        return self.kubectl("apply", "--server-side", *validate, "-k", str(MANIFESTS / root))


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    if REAL_KUBECONFIG:
        made = Target(REAL_KUBECONFIG, emulated=False)
        try:
            yield made
        finally:
            _delete_applied(made)
            made.kube.close()
        return
    from sim.kubeapi import KubeAPIServer

    server = KubeAPIServer(tls=True).start()  # kubectl sends no bearer token over plain HTTP
    made = Target(str(server.write_kubeconfig(tmp_path_factory.mktemp("ssa") / "kubeconfig")), emulated=True)
    try:
        yield made
    finally:
        made.kube.close()
        server.stop()


def _render(root: str) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS / root)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [d for d in load_all(out) if isinstance(d, dict)]


def _stub_crds(target: Target, docs: list[dict[str, Any]]) -> None:
    """A CRD (any schema) for each Prometheus Operator kind the render holds that the cluster does not serve."""
    wanted = {(d["apiVersion"], d["kind"]) for d in docs}
    for group, version, kind, plural in sorted(STUB_KINDS):
        if (f"{group}/{version}", kind) not in wanted:
            continue
        res = Resource(group, version, plural, kind, True)
        with contextlib.suppress(errors.NotFound):
            target.kube.list(res, limit=1)
            continue  # served: the real operator's CRD
        name = f"{plural}.{group}"
        target.kube.create(CRDS, {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
                     "versions": [{"name": version, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})
        target.stubs.append(name)
        _wait(lambda r=res: _served(target, r), 30, f"the stub {kind} CRD served")


def _served(target: Target, res: Resource) -> bool:
    try:
        target.kube.list(res, limit=1)
    except errors.NotFound:
        return False
    return True


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def _aggregated_by_the_controller(target: Target, name: str) -> bool:
    """The aggregation controller has written the role's ``.rules`` (its managedFields entry)."""
    role = target.kube.get(CLUSTER_ROLES, name)
    return any(e.get("manager") == AGGREGATION_MANAGER for e in role["metadata"].get("managedFields") or [])


@pytest.mark.parametrize("root", KUSTOMIZE_ROOTS)
def test_a_second_server_side_apply_of_the_kustomization_succeeds(target: Target, root: str) -> None:
    docs = _render(root)
    _stub_crds(target, docs)
    first = target.apply(root)
    target.applied.append(root)
    assert first.returncode == 0, first.stderr
    for role in docs:
        if role["kind"] == "ClusterRole" and "aggregationRule" in role:
            _wait(lambda n=role["metadata"]["name"]: _aggregated_by_the_controller(target, n), 30,
                  f"{AGGREGATION_MANAGER} to fill {role['metadata']['name']}'s rules")
    second = target.apply(root)
    assert second.returncode == 0, f"the second server-side apply of {root} failed:\n{second.stderr}"


def test_the_aggregation_controller_owns_rules(target: Target, tmp_path: Path) -> None:
    """A manifest declaring ``rules: []`` on an aggregated ClusterRole: its first apply lands, its second
    conflicts with the aggregation controller over ``.rules``, as on kube-controller-manager (v1.36)."""
    name = "gpuremediate-test-aggregated"
    doc = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
           "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"gpuremediate.io/test-aggregate": "true"}}]},
           "rules": []}
    part = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": f"{name}-part", "labels": {"gpuremediate.io/test-aggregate": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}
    path = tmp_path / "aggregated.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [doc, part]}))
    validate = ["--validate=false"] if target.emulated else []
    try:
        first = target.kubectl("apply", "--server-side", *validate, "-f", str(path))
        assert first.returncode == 0, first.stderr
        _wait(lambda: _aggregated_by_the_controller(target, name), 30, f"{AGGREGATION_MANAGER} to fill {name}")
        assert target.kube.get(CLUSTER_ROLES, name)["rules"] == part["rules"]
        second = target.kubectl("apply", "--server-side", *validate, "-f", str(path))
        assert second.returncode != 0
        assert f'conflict with "{AGGREGATION_MANAGER}": .rules' in second.stderr, second.stderr
    finally:
        for role in (name, f"{name}-part"):
            with contextlib.suppress(errors.NotFound):
                target.kube.delete(CLUSTER_ROLES, role)


def _delete_applied(target: Target) -> None:
    """What the roots applied, gone: a bare control plane's pods force-deleted, the Namespaces waited out."""
    namespaces = {d["metadata"]["name"] for root in target.applied for d in _render(root) if d["kind"] == "Namespace"}
    for root in reversed(target.applied):
        target.kubectl("delete", "-k", str(MANIFESTS / root), "--ignore-not-found", "--wait=false")
    for name in target.stubs:
        with contextlib.suppress(errors.NotFound):
            target.kube.delete(CRDS, name)

    def gone() -> bool:
        left = False
        for ns in namespaces:
            try:
                target.kube.get(NAMESPACES, ns)
            except errors.NotFound:
                continue
            left = True
            for pod in target.kube.list(PODS, ns)["items"]:
                with contextlib.suppress(errors.NotFound):
                    target.kube.delete(PODS, pod["metadata"]["name"], ns, grace_period_seconds=0)
        return not left

    _wait(gone, 120, f"the namespaces {sorted(namespaces)} deleted")
