"""manifests/agent: least privilege as shipped — exactly the RBAC the agent calls, read-only host mounts but
its own state directory, privilege only from kmsg-access.yaml, and flags the agent really has."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuremediate.agent.cli import add_arguments, settings_from_args
from gpuremediate.kube.miniyaml import load, load_all

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "manifests" / "agent"
KIND_AGENT = ROOT / "manifests" / "overlays" / "kind" / "agent"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in load_all(path.read_text(encoding="utf-8")) if isinstance(d, dict)]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind]
    return found


def render(where: Path) -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed")
    out = subprocess.run(["kubectl", "kustomize", str(where)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in load_all(out.stdout) if isinstance(d, dict)]


def pod_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "DaemonSet")["spec"]["template"]["spec"]


def parse_args(container: dict[str, Any]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(container["args"])


def test_rbac_is_get_node_and_patch_node_status_only() -> None:
    objs = docs(AGENT / "rbac.yaml")
    role = one(objs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert "gpuremediate.io/aggregate-to-controller" not in role["metadata"]["labels"]  # not the controller's
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuremediate-agent",
                                    "namespace": "gpuremediate-agent"}]


def test_the_baseline_daemonset_is_unprivileged_and_mounts_the_host_read_only() -> None:
    pod = pod_of(docs(AGENT / "daemonset.yaml"))
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert host == {"kmsg": {"path": "/dev/kmsg", "type": "CharDevice"},
                    "state": {"path": "/var/lib/gpuremediate-agent", "type": "DirectoryOrCreate"},
                    "sys": {"path": "/sys", "type": "Directory"}}
    assert mounts["kmsg"]["readOnly"] is True and mounts["sys"]["readOnly"] is True
    assert "--sysfs=/host/sys" in container["args"]
    assert not mounts["state"].get("readOnly")  # the resume point: its only write on the host
    assert [t for t in pod["tolerations"]] == [{"operator": "Exists"}]  # runs on nodes we cordon or taint


def test_the_only_privilege_is_the_kmsg_patch_and_it_keeps_the_root_filesystem_read_only() -> None:
    patch = pod_of(docs(AGENT / "kmsg-access.yaml"))
    assert patch["containers"][0]["securityContext"]["privileged"] is True
    assert "volumes" not in patch and "volumeMounts" not in patch["containers"][0]
    rendered = render(AGENT)
    pod = pod_of(rendered)
    security = pod["containers"][0]["securityContext"]
    assert security["privileged"] is True and security["readOnlyRootFilesystem"] is True
    assert one(rendered, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert {d["metadata"].get("namespace") for d in rendered if d["kind"] in ("DaemonSet", "ServiceAccount")} == {
        "gpuremediate-agent"}


@pytest.mark.parametrize("where", [AGENT, KIND_AGENT], ids=["agent", "kind"])
def test_the_daemonset_runs_the_agent_with_flags_it_has(where: Path) -> None:
    pod = pod_of(render(where))
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "gpuremediate.agent"]
    args = parse_args(container)
    settings = settings_from_args(args)
    assert settings.state_path.startswith("/var/lib/gpuremediate-agent/")
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["ports"][0]["containerPort"] == int(args.metrics_addr.rsplit(":", 1)[1])


def test_the_kind_agent_reads_gpu_sims_files_unprivileged() -> None:
    pod = pod_of(render(KIND_AGENT))
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is False and container["securityContext"]["runAsUser"] != 0
    assert "runtimeClassName" not in pod
    args = parse_args(container)
    assert args.kmsg.startswith("/var/run/gpu-sim/") and args.nvidia_smi.startswith("/var/run/gpu-sim/")
    assert {m["name"]: m.get("readOnly") for m in container["volumeMounts"]}["gpu-sim"] is True


def test_kustomization_lists_every_agent_manifest() -> None:
    spec = load((AGENT / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = set(spec["resources"]) | {p["path"] for p in spec["patches"]}
    assert listed == {p.name for p in AGENT.glob("*.yaml") if p.name != "kustomization.yaml"}
