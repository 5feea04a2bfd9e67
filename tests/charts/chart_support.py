"""Real Helm (PyPI's helm-sdkpy: Helm v4's Go library) against the Kubernetes API emulator, for tests/charts.

helm-sdkpy has no client-side ``helm template``: every render here is an install on an emulator (sim.kubeapi
over TLS, a kubeconfig with its token), and the objects compared are the release's manifest as Helm stored it.
What the emulator needed for Helm: protobuf request bodies for the release Secrets (sim/kube_protobuf.py).
"""

from __future__ import annotations

import asyncio
import importlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.miniyaml import load_all

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpuremediate"
MANIFESTS = ROOT / "manifests"
RELEASE = "gpuremediate"
NAMESPACE = "gpuremediate-system"
# Labels only the chart puts on objects (Helm's conventions); everything else must be the kustomize base's.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
               "app.kubernetes.io/version"}
HELM_POD_ANNOTATIONS = {"checksum/policy"}  # rolls the controller when the policy changes


def helm() -> Any:
    """The helm_sdkpy module; installed into this interpreter's environment when missing (it declares
    Python >= 3.12 and runs on 3.11: --ignore-requires-python), else the test is skipped, saying why."""
    try:
        return importlib.import_module("helm_sdkpy")
    except ImportError:
        pass
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--ignore-requires-python", "helm-sdkpy"],
                         capture_output=True, text=True, timeout=600, check=False)
    try:
        importlib.invalidate_caches()
        return importlib.import_module("helm_sdkpy")
    except ImportError:
        pytest.skip("helm-sdkpy (Helm v4's library) is not installed and `pip install --ignore-requires-python "
                    f"helm-sdkpy` failed: {(out.stderr or out.stdout).strip()[-300:]}")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in load_all(text) if isinstance(d, dict)]


def kustomize(root: str) -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed (kubectl kustomize renders manifests/)")
    out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS / root)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return docs(out.stdout)


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def by_key(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for obj in objs:
        assert key(obj) not in out, f"{key(obj)} twice"
        out[key(obj)] = obj
    return out


def without_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the kustomize base would have it: Helm's own labels and the policy checksum taken off."""
    meta = obj["metadata"]
    labels = {k: v for k, v in meta.get("labels", {}).items() if k not in HELM_LABELS}
    meta = {**meta, "labels": labels} if labels else {k: v for k, v in meta.items() if k != "labels"}
    obj = {**obj, "metadata": meta}
    template = obj.get("spec", {}).get("template")
    if template and "annotations" in template.get("metadata", {}):
        notes = {k: v for k, v in template["metadata"]["annotations"].items() if k not in HELM_POD_ANNOTATIONS}
        tmeta = {**template["metadata"], "annotations": notes} if notes else \
            {k: v for k, v in template["metadata"].items() if k != "annotations"}
        obj["spec"] = {**obj["spec"], "template": {**template, "metadata": tmeta}}
    return obj


@dataclass
class Cluster:
    """An emulator with the release namespace, and a Helm configuration for it."""

    kubeconfig: str
    kube: KubeClient
    helm: Any

    def config(self) -> Any:
        return self.helm.Configuration(namespace=NAMESPACE, kubeconfig=self.kubeconfig)

    def install(self, values: dict[str, Any] | None = None, chart: Path = CHART) -> dict[str, Any]:
        return run(self.helm.Install(self.config()).run(RELEASE, str(chart), values=values, wait=False, timeout=120))

    def upgrade(self, values: dict[str, Any] | None = None, chart: Path = CHART, **options: Any) -> dict[str, Any]:
        return run(self.helm.Upgrade(self.config()).run(RELEASE, str(chart), values=values, wait=False,
                                                        timeout=120, **options))

    def uninstall(self) -> dict[str, Any]:
        return run(self.helm.Uninstall(self.config()).run(RELEASE, wait=False, timeout=120))

    def rendered(self, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The objects of a fresh release with these values (Helm's stored manifest: what it applied)."""
        return docs(self.install(values)["manifest"])
