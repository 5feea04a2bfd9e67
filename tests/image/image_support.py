"""Docker for the image tests: the engine (or a skip that says why), the images built once per session on the
local base (.ci/base-image.sh), containers run as a cluster's kubelet would run them, and what they need from the
emulator (a service account's token, CA and namespace, as the kubelet mounts them)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "manifests"))  # manifests_support: the manifests' own RBAC and args

BASE_SCRIPT = ROOT / ".ci" / "base-image.sh"
DEFAULT_BASE = "gpuremediate-base:bookworm"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the kubelet mounts a pod's token
CONTROLLER_IMAGE = "gpuremediate:image-test"
GPUSIM_IMAGE = "gpu-sim:image-test"
VERSION_LABEL = "org.opencontainers.image.version"


def docker(*args: str, timeout: float = 120, check: bool = True, input: str | None = None,
           ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, input=input,
                          check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done


def engine_or_skip() -> None:
    """A reachable Docker engine, else the test is skipped, saying why."""
    if shutil.which("docker") is None:
        pytest.skip("no docker command (Debian's docker.io package; .ci/run installs it and starts dockerd)")
    try:
        info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip("the Docker engine does not answer `docker info` within 30 s")
    if info.returncode != 0 or not info.stdout.strip():
        why = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        pytest.skip(f"no Docker engine reachable ({why}); .ci/run starts dockerd as root")


def base_image_or_skip() -> str:
    """The base the images build on: $GPUREMEDIATE_BASE_IMAGE as it is, else the local base .ci/base-image.sh
    makes, imported from its cached tarball when Docker lacks it (debootstrap is CI's step, not a test's)."""
    named = os.environ.get("GPUREMEDIATE_BASE_IMAGE", "")
    if named and not named.startswith("gpuremediate-base:"):
        return named
    image = named or DEFAULT_BASE
    done = subprocess.run(["bash", str(BASE_SCRIPT), image], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GPUREMEDIATE_BASE_CACHED_ONLY": "1"}, check=False)
    if done.returncode == 3:
        pytest.skip(f"no local base image {image} and no cached root filesystem to import: run .ci/base-image.sh "
                    f"(debootstrap, as root) or set GPUREMEDIATE_BASE_IMAGE ({done.stdout.strip()})")
    assert done.returncode == 0, f".ci/base-image.sh failed:\n{done.stdout}{done.stderr}"
    return image


def package_version() -> str:
    from gpuremediate import __version__
    return __version__


@dataclass(frozen=True)
class Images:
    base: str
    controller: str
    gpusim: str
    version: str


def build_images() -> Images:
    """Both images as `make image` builds them, on the local base, under test tags."""
    engine_or_skip()
    base = base_image_or_skip()
    version = package_version()
    before = {tag: image_id(tag) for tag in (CONTROLLER_IMAGE, GPUSIM_IMAGE)}
    docker("build", "-q", "--build-arg", f"BASE={base}", "--build-arg", f"VERSION={version}",
           "-t", CONTROLLER_IMAGE, "-f", str(ROOT / "Dockerfile"), str(ROOT), timeout=600)
    docker("build", "-q", "--build-arg", f"BASE={base}", "-t", GPUSIM_IMAGE, "-f", str(ROOT / "sim" / "Dockerfile"),
           str(ROOT), timeout=600)
    for tag, old in before.items():
        if old and old != image_id(tag):  # the previous run's build, now untagged: not left to pile up
            docker("rmi", old, check=False)
    return Images(base, CONTROLLER_IMAGE, GPUSIM_IMAGE, version)


def image_id(tag: str) -> str:
    done = docker("image", "inspect", "-f", "{{.Id}}", tag, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def free_port() -> int:
    """A port free on 127.0.0.1 now (the containers share the host's network)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Container:
    """``docker run -d`` with a name of its own; ``remove()`` (always, in a finally) takes it away."""

    def __init__(self, image: str, args: Sequence[str], *, options: Sequence[str] = ()) -> None:
        self.name = f"gpuremediate-image-test-{uuid.uuid4().hex[:10]}"
        self.image = image
        docker("run", "-d", "--name", self.name, *options, image, *args)

    def logs(self) -> str:
        done = docker("logs", self.name, check=False)
        return done.stdout + done.stderr

    def exec(self, *argv: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
        return docker("exec", *(["--user", user] if user else []), self.name, *argv, check=False, timeout=60)

    def inspect(self) -> dict[str, Any]:
        found = json.loads(docker("inspect", self.name).stdout)
        assert isinstance(found, list) and found
        return dict(found[0])

    def running(self) -> bool:
        return bool(self.inspect()["State"]["Running"])

    def stop(self, grace_s: int = 30) -> int:
        """SIGTERM, as the kubelet sends it, then its exit code."""
        docker("stop", "-t", str(grace_s), self.name, timeout=grace_s + 30)
        return int(self.inspect()["State"]["ExitCode"])

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False)


@contextlib.contextmanager
def container(image: str, args: Sequence[str], *, options: Sequence[str] = ()) -> Iterator[Container]:
    running = Container(image, args, options=options)
    try:
        yield running
    finally:
        running.remove()


def pod_options(*, env: dict[str, str], mounts: Sequence[tuple[Path, str, bool]] = (),
                user: str | None = None) -> list[str]:
    """`docker run` options for a container as the manifests' securityContext runs it: the host's network (the
    emulator and gpu-sim listen on 127.0.0.x), a read-only root, /tmp an emptyDir, no capabilities, no privilege
    escalation, the image's own user unless ``user``; ``mounts``: (host path, container path, read-only)."""
    options = ["--network", "host", "--read-only", "--tmpfs", "/tmp:size=64m", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges"]
    if user:
        options += ["--user", user]
    for key, value in env.items():
        options += ["-e", f"{key}={value}"]
    for host, path, read_only in mounts:
        options += ["-v", f"{host}:{path}{':ro' if read_only else ''}"]
    return options


def service_account_dir(where: Path, token: str, ca_file: str | None, namespace: str) -> Path:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount: token, ca.crt, namespace
    (mode 0644, as its projected volume's default), readable by the container's user."""
    where.mkdir(parents=True)
    (where / "token").write_text(token)
    (where / "namespace").write_text(namespace)
    if ca_file:
        shutil.copyfile(ca_file, where / "ca.crt")
    for path in where.iterdir():
        path.chmod(0o644)
    where.chmod(0o755)
    return where


def in_cluster_env(server_url: str) -> dict[str, str]:
    """KUBERNETES_SERVICE_HOST/PORT as the kubelet sets them, for the emulator at ``server_url``."""
    host, port = server_url.split("://", 1)[1].rsplit(":", 1)
    return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}


def new_token(api: Any, user: str, namespace: str) -> str:
    token = secrets.token_hex(16)
    api.add_token(token, user, ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                "system:authenticated"])
    return token


def http_get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


def wait_for(what: str, check: Callable[[], bool], timeout: float, box: Container | None = None) -> None:
    """Poll ``check`` until it holds; on timeout the assertion carries the container's log tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if check():
                return
        if box is not None and not box.running():
            break
        time.sleep(0.25)
    tail = "\n".join(box.logs().splitlines()[-40:]) if box is not None else ""
    state = "" if box is None or box.running() else f" (the container exited {box.inspect()['State']['ExitCode']})"
    raise AssertionError(f"{what}: not within {timeout:.0f} s{state}\n{tail}")
