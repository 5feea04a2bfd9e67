"""The images, built and run as a user's cluster runs them (issue 42): built on the local base (.ci/base-image.sh:
no registry is reachable here), then the controller container in the cluster's way — its service account's token,
CA and namespace mounted at /var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT pointing
at the API emulator over TLS, a read-only root, user 65532, the base Deployment's args and RBAC — reads the
simulated fleet, cordons a faulted node and walks it back, and serves /metrics and /readyz; the agent (the same
image, the DaemonSet's command) publishes a kernel-log XID as a NodeCondition; the drain-window plugin (the same
image) drains a DrainRequest; gpu-sim serves dcgm-exporter's series and takes the repair Jobs' commands. Skipped,
saying why, where no Docker engine is reachable."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from image_support import (
    SA_DIR,
    VERSION_LABEL,
    Container,
    Images,
    build_images,
    container,
    docker,
    free_port,
    http_get,
    in_cluster_env,
    new_token,
    pod_options,
    service_account_dir,
    wait_for,
)
from manifests_support import (
    CONTROLLER_SA,
    CONTROLLER_USER,
    MANIFESTS,
    controller_grants,
    of_kind,
    rules_by_scope,
)

from gpuremediate.kube.resources import NODES
from gpuremediate.policy.conditions import GPU_HEALTHY
from gpuremediate.vocab.record import STATE_LABEL
from sim.cluster import AGENT_USER, SimCluster
from sim.gpusim import BOOT_ID_FILE, KMSG_FILE, SMI_FILE

pytestmark = pytest.mark.slow
AGENT_NS = "gpuremediate-agent"


@pytest.fixture(scope="module")
def images() -> Images:
    return build_images()


def _manifest(kind: str, name: str, under: str) -> dict[str, Any]:
    """The object as manifests/<under> ships it (an overlay or component may carry another of that name)."""
    (found,) = [obj for obj in of_kind(kind, under=under) if obj["metadata"]["name"] == name]
    return found


def _container_spec(kind: str, name: str) -> dict[str, Any]:
    under = "agent" if kind == "DaemonSet" else "base"
    (spec,) = _manifest(kind, name, under)["spec"]["template"]["spec"]["containers"]
    return dict(spec)


def _with(args: list[str], **flags: str) -> list[str]:
    """``args`` with each ``--flag=value`` of ``flags`` (underscores as dashes) set: replaced, else added."""
    out = list(args)
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        out = [a for a in out if not a.startswith(flag + "=")] + [f"{flag}={value}"]
    return out


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt-get install shellcheck)")
def test_the_ci_scripts_pass_shellcheck() -> None:
    root = MANIFESTS.parent
    scripts = [str(root / ".ci" / "run"), *sorted(str(p) for p in (root / ".ci").glob("*.sh"))]
    assert len(scripts) >= 2
    done = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_release_base_is_one_image_pinned_by_digest() -> None:
    """Both Dockerfiles take their base as the BASE argument (CI passes its local base), whose release default is
    the same python:3.11 image pinned by digest (a multi-arch index digest: the release builds amd64 and arm64)."""
    root = MANIFESTS.parent
    defaults = set()
    for dockerfile in (root / "Dockerfile", root / "sim" / "Dockerfile"):
        text = dockerfile.read_text(encoding="utf-8")
        (default,) = re.findall(r"^ARG BASE=(\S+)$", text, re.MULTILINE)
        assert re.fullmatch(r"python:3\.11[\w.-]*@sha256:[0-9a-f]{64}", default), default
        assert re.search(r"^FROM \$\{BASE\}$", text, re.MULTILINE), dockerfile
        defaults.add(default)
    assert len(defaults) == 1, defaults


def test_the_image_says_its_version_as_its_label_does(images: Images) -> None:
    labels = json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", images.controller).stdout)
    assert labels[VERSION_LABEL] == images.version
    said = docker("run", "--rm", "--read-only", images.controller, "version").stdout.strip()
    assert said == f"gpuremediate {images.version}"
    user = docker("image", "inspect", "-f", "{{.Config.User}}", images.controller).stdout.strip()
    assert user == "65532:65532"
    # The agent's command is the DaemonSet's own (`python -m gpuremediate.agent`): `python` exists in the image.
    command = _container_spec("DaemonSet", "gpuremediate-agent")["command"]
    helped = docker("run", "--rm", "--read-only", "--entrypoint", command[0], images.controller, *command[1:],
                    "--help")
    assert "NodeConditions" in helped.stdout


def test_a_build_whose_version_argument_disagrees_with_the_package_stops(images: Images) -> None:
    wrong = "0.0.0-wrong"
    done = docker("build", "-q", "--force-rm", "--build-arg", f"BASE={images.base}", "--build-arg", f"VERSION={wrong}",
                  "-f", str(MANIFESTS.parent / "Dockerfile"), str(MANIFESTS.parent), check=False, timeout=600)
    # The steps before the check leave untagged layers labelled with the wrong version: not left to pile up.
    docker("image", "prune", "-f", "--filter", f"label={VERSION_LABEL}={wrong}", check=False)
    assert done.returncode != 0
    assert f"gpuremediate.__version__ is '{images.version}'" in done.stdout + done.stderr
    # Left out (e2e/kind/run.sh's plain `docker build`), the image builds and claims no version.
    root = MANIFESTS.parent
    unversioned = docker("build", "-q", "--build-arg", f"BASE={images.base}", "-f", str(root / "Dockerfile"),
                         str(root), timeout=600).stdout.strip().splitlines()[-1]
    try:
        label = docker("image", "inspect", "-f", f'{{{{index .Config.Labels "{VERSION_LABEL}"}}}}', unversioned)
        assert label.stdout.strip() == ""
    finally:
        docker("rmi", unversioned, check=False)


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    with SimCluster(nodes=3, tls=True) as sim:
        yield sim


def _node(cluster: SimCluster, name: str) -> dict[str, Any]:
    return dict(cluster.kube.get(NODES, name))


def test_the_controller_container_runs_in_cluster_and_remediates_a_node(
        images: Images, cluster: SimCluster, tmp_path: Path) -> None:
    api = cluster.api
    assert api is not None and api.ca_file is not None and api.url.startswith("https://")
    # The controller's ServiceAccount, held to what manifests/base binds to it (the emulator enforces it).
    namespace = CONTROLLER_SA[0]
    token = new_token(api, CONTROLLER_USER, namespace)
    rules, namespaced = rules_by_scope(controller_grants())
    api.enforce_rbac(CONTROLLER_USER, rules, namespaced=namespaced)
    sa = service_account_dir(tmp_path / "sa", token, api.ca_file, namespace)
    policy = tmp_path / "policy"  # the ConfigMap gpuremediate-policy, mounted as the Deployment mounts it
    policy.mkdir(mode=0o755)
    shutil.copyfile(MANIFESTS / "base" / "policy.toml", policy / "policy.toml")
    (policy / "policy.toml").chmod(0o644)

    spec = _container_spec("Deployment", "gpuremediate")
    port = free_port()
    args = _with(list(spec["args"]), metrics_addr=f"127.0.0.1:{port}", exporter_port=str(cluster.exporter_port),
                 scrape_interval="1s", resync="1s")
    env = {"POD_NAME": "gpuremediate-image-test", "POD_NAMESPACE": namespace, **in_cluster_env(api.url)}
    env |= {e["name"]: e["value"] for e in spec["env"] if "value" in e}
    mounts = [(sa, SA_DIR, True)] + [(policy, m["mountPath"], True) for m in spec["volumeMounts"]
                                     if m["name"] == "policy"]
    with container(images.controller, args, options=pod_options(env=env, mounts=mounts)) as box:
        base = f"http://127.0.0.1:{port}"
        wait_for("the controller's /readyz answers 200", lambda: http_get(base + "/readyz")[0] == 200, 90, box)

        def metric(pattern: str) -> bool:
            status, text = http_get(base + "/metrics")
            return status == 200 and re.search(pattern, text, re.MULTILINE) is not None

        # The fleet read through the mounted token: three healthy nodes, this replica the leader.
        wait_for("/metrics: 3 healthy nodes", lambda: metric(r'^gpuremediate_nodes\{state="healthy"\} 3(\.0)?$'),
                 60, box)
        wait_for("/metrics: the leader", lambda: metric(r"^gpuremediate_leader 1(\.0)?$"), 30, box)

        # A GPU falls off the bus on gpu-node-2 (XID 79 on its exporter): cordoned, drained, rebooted, validated.
        cluster.gpusim.inject_xid("gpu-node-2", 3, 79)
        wait_for("gpu-node-2 cordoned", lambda: bool(_node(cluster, "gpu-node-2")["spec"].get("unschedulable")),
                 60, box)
        seen = {(_node(cluster, "gpu-node-2")["metadata"].get("labels") or {}).get(STATE_LABEL)}

        def back() -> bool:
            node = _node(cluster, "gpu-node-2")
            state = (node["metadata"].get("labels") or {}).get(STATE_LABEL)
            seen.add(state)
            return state == "healthy" and not node["spec"].get("unschedulable")

        wait_for("gpu-node-2 back healthy and uncordoned", back, 90, box)
        assert seen & {"draining", "repairing", "validating"}, seen
        for other in ("gpu-node-1", "gpu-node-3"):
            assert not _node(cluster, other)["spec"].get("unschedulable"), other
        # Through the mounted token: the cordon is the controller's ServiceAccount's own patch.
        assert any(user == CONTROLLER_USER and verb == "patch" and resource == "nodes" and name == "gpu-node-2"
                   for user, verb, _, resource, _, _, name in list(api.requests))
        _, metrics = http_get(base + "/metrics")
        assert re.search(r'^gpuremediate_transitions_total\{.*to="draining".*\} [1-9]', metrics, re.MULTILINE), \
            [line for line in metrics.splitlines() if "transitions_total{" in line]

        _runs_as_the_manifest_says(box)
        code = box.stop()
        logs = box.logs()
    assert code == 0, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert lines and len(lines) == len(logs.splitlines()), "--log-format=json: every line one JSON object"


def _runs_as_the_manifest_says(box: Container) -> None:
    """User 65532 (runAsUser), a root filesystem even root cannot write (readOnlyRootFilesystem), /tmp writable
    (the emptyDir)."""
    status = box.exec("cat", "/proc/1/status").stdout
    assert re.search(r"^Uid:\s+65532\s", status, re.MULTILINE), status
    assert re.search(r"^Gid:\s+65532\s", status, re.MULTILINE), status
    written = box.exec("python", "-c", "open('/probe', 'w')", user="0")
    assert written.returncode != 0 and "Read-only file system" in written.stderr, written.stderr
    assert box.exec("python", "-c", "open('/tmp/probe', 'w').write('x')").returncode == 0
    host = box.inspect()["HostConfig"]
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"]


def test_the_agent_container_publishes_a_kernel_xid_as_a_node_condition(
        images: Images, cluster: SimCluster, tmp_path: Path) -> None:
    api = cluster.api
    assert api is not None
    node = "gpu-node-1"
    token = new_token(api, AGENT_USER, AGENT_NS)
    api.enforce_rbac(AGENT_USER, _manifest("ClusterRole", "gpuremediate-agent", "agent")["rules"])
    sa = service_account_dir(tmp_path / "sa", token, api.ca_file, AGENT_NS)
    state = tmp_path / "state"  # the hostPath /var/lib/gpuremediate-agent
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    host = Path(cluster.gpusim.host_dir(node))  # the node's kernel log, boot id and nvidia-smi, as gpu-sim writes

    spec = _container_spec("DaemonSet", "gpuremediate-agent")
    port = free_port()
    args = _with(list(spec["args"]), metrics_addr=f"127.0.0.1:{port}", kmsg=f"/host/{KMSG_FILE}",
                 boot_id=f"/host/{BOOT_ID_FILE}", nvidia_smi=f"/host/{SMI_FILE}", interval="1s",
                 nvidia_smi_timeout="5s")
    env = {"NODE_NAME": node, **in_cluster_env(api.url)}
    env |= {e["name"]: e["value"] for e in spec["env"] if "value" in e}
    mounts = [(sa, SA_DIR, True), (host, "/host", True), (state, "/var/lib/gpuremediate-agent", False)]
    command = spec["command"]
    options = [*pod_options(env=env, mounts=mounts, user="65532:65532"), "--entrypoint", command[0]]
    with container(images.controller, [*command[1:], *args], options=options) as box:
        base = f"http://127.0.0.1:{port}"

        def condition() -> dict[str, Any]:
            conditions = _node(cluster, node).get("status", {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == GPU_HEALTHY), {})

        wait_for("the agent's /readyz answers 200", lambda: http_get(base + "/readyz")[0] == 200, 90, box)
        wait_for("GPUHealthy=True published", lambda: condition().get("status") == "True", 60, box)
        cluster.gpusim.kernel_xid(node, 2, 79)
        wait_for("GPUHealthy=False after XID 79 in the kernel log", lambda: condition().get("status") == "False",
                 60, box)
        assert "79" in condition().get("message", ""), condition()
        assert any(user == AGENT_USER and resource == "nodes" and sub == "status"
                   for user, _, _, resource, sub, _, _ in list(api.requests))
        assert list(state.iterdir()), "the kernel-log resume point is kept in the state directory"
        code = box.stop()
        logs = box.logs()
    assert code == 0, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]


def test_the_gpusim_container_serves_the_exporter_and_takes_the_jobs_commands(images: Images) -> None:
    port = free_port()
    url = f"http://127.0.0.11:{port}"
    options = pod_options(env={}, mounts=())
    with container(images.gpusim, ["--nodes", "2", "--port", str(port), "--gpus", "4"], options=options) as box:
        def xids(node_ip: str) -> list[str] | None:
            """The XIDs gpu-node-N's exporter shows (dcgm-exporter >= 3.3: in err_code, while non-zero)."""
            status, text = http_get(f"http://{node_ip}:{port}/metrics")
            if status != 200 or "DCGM_FI_DEV_GPU_TEMP{" not in text:
                return None
            return re.findall(r'^DCGM_FI_DEV_XID_ERRORS\{[^}]*gpu="(\d+)"[^}]*err_code="(\d+)"', text, re.MULTILINE)

        wait_for("gpu-sim serves gpu-node-1's exporter", lambda: xids("127.0.0.11") == [], 30, box)
        _, text = http_get(f"{url}/metrics")
        assert 'Hostname="gpu-node-1"' in text and 'Hostname="gpu-node-2"' not in text
        # What the kind policy's Jobs run, in the same image: `python /app/gpusim.py <command> --url=...`.
        job = ["run", "--rm", "--network", "host", "--read-only", images.gpusim]
        docker(*job, "inject", f"--url={url}", "--node=gpu-node-1", "--gpu=2", "--fault=xid", "--value=79")
        assert xids("127.0.0.11") == [("2", "79")]
        assert xids("127.0.0.12") == []  # gpu-node-2 untouched
        failed = docker(*job, "validate", f"--url={url}", "--node=gpu-node-1", check=False)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        docker(*job, "reset", f"--url={url}", "--node=gpu-node-1", "--gpus=2")
        assert xids("127.0.0.11") == []
        docker(*job, "validate", f"--url={url}", "--node=gpu-node-1")
        assert box.stop() == 0


def test_the_drain_window_plugin_container_drains_a_drain_request(images: Images, tmp_path: Path) -> None:
    """manifests/plugins/drain-window's Deployment (the same image, `plugin drain-window`) in the cluster's way:
    under its ClusterRole, it evicts the pods a DrainRequest lists and marks it DrainComplete."""
    from e2e.plugins.remediation import drain_request_crd, install_crd
    from gpuremediate.actions.custom import condition
    from gpuremediate.kube import errors
    from gpuremediate.kube.client import KubeClient
    from gpuremediate.kube.config import load_config
    from gpuremediate.kube.resources import NAMESPACES, PODS
    from sim.kubeapi import KubeAPIServer

    api = KubeAPIServer(tls=True).start()
    client = KubeClient(load_config(api.write_kubeconfig(str(tmp_path / "admin.kubeconfig"))), qps=100, burst=100)
    try:
        for ns in ("gpuremediate-system", "work"):
            client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        drain_requests = install_crd(client, drain_request_crd(), "nvsentinel.nvidia.com/v1alpha1", "DrainRequest")
        for name in ("a", "b", "stays"):
            client.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "work"},
                                 "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}}, "work")
        user = "system:serviceaccount:gpuremediate-system:gpuremediate-drain-window"
        token = new_token(api, user, "gpuremediate-system")
        api.enforce_rbac(user, _manifest("ClusterRole", "gpuremediate-drain-window", "plugins")["rules"])
        sa = service_account_dir(tmp_path / "sa", token, api.ca_file, "gpuremediate-system")
        (spec,) = _manifest("Deployment", "gpuremediate-drain-window", "plugins")["spec"]["template"]["spec"][
            "containers"]
        # Open every day, all day (the shipped window is Mon-Fri: the test must not depend on the weekday).
        args = _with(list(spec["args"]), days="Mon-Sun", hours="00:00-24:00", retry="0.5s", resync="2s")
        env = {"POD_NAME": "drain-window-image-test", "POD_NAMESPACE": "gpuremediate-system",
               **in_cluster_env(api.url)}
        env |= {e["name"]: e["value"] for e in spec["env"] if "value" in e}
        with container(images.controller, args, options=pod_options(env=env, mounts=[(sa, SA_DIR, True)])) as box:
            client.create(drain_requests, {
                "apiVersion": drain_requests.api_version, "kind": "DrainRequest",
                "metadata": {"name": "drain-n1", "namespace": "gpuremediate-system"},
                "spec": {"nodeName": "n1", "podsToDrain": {"work": ["a", "b"]}}}, "gpuremediate-system")

            def complete() -> bool:
                for pod in client.list(PODS, "work")["items"]:  # the kubelet: an evicted pod goes
                    if pod["metadata"].get("deletionTimestamp"):
                        with contextlib.suppress(errors.NotFound):
                            client.delete(PODS, pod["metadata"]["name"], "work", grace_period_seconds=0)
                done = condition(client.get(drain_requests, "drain-n1", "gpuremediate-system"), "DrainComplete")
                return done is not None and done["status"] == "True"

            wait_for("DrainComplete=True on the DrainRequest", complete, 60, box)
            assert {p["metadata"]["name"] for p in client.list(PODS, "work")["items"]} == {"stays"}
            assert any(u == user and resource == "pods" and sub == "eviction"
                       for u, _, _, resource, sub, _, _ in list(api.requests))
            code = box.stop()
            logs = box.logs()
        assert code == 0, logs[-3000:]
        assert "Traceback" not in logs, logs[-3000:]
    finally:
        client.close()
        api.stop()
