"""`pip install` works whole (issue 42): the wheel, built from a copy of the sources as `pip install .` builds it,
installed with --no-deps into a fresh venv outside the repository, runs `demo`, the sandbox (`demo --keep`),
`replay` and `check` from another folder: it carries the manifests the simulated cluster reads (copied at build
time by setup.py from manifests/, their one source: the wheel's copies are the same bytes) and its data files."""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuremediate import __version__

ROOT = Path(__file__).resolve().parents[2]
# What `pip install .` reads: the build's configuration and the packages' sources (a copy: the build writes
# build/ and *.egg-info beside them, which the checkout is spared).
SOURCES = ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in", "gpuremediate", "sim", "manifests")
NO_NETWORK = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
              "No matching distribution found for setuptools")

pytestmark = pytest.mark.slow


def packaged_manifests() -> tuple[str, ...]:
    """setup.py's PACKAGED_MANIFESTS, read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PACKAGED_MANIFESTS" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return tuple(str(v) for v in value)
    raise AssertionError("setup.py names no PACKAGED_MANIFESTS")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    cwd: Path  # a folder outside the repository, where the commands run

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def env(self) -> dict[str, str]:
        """The user's environment, without anything that would find the checkout's sources."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        return env | {"PYTHONDONTWRITEBYTECODE": "1", "NO_COLOR": "1"}

    def run(self, argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=self.cwd, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(path, src / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"),
                            str(src)], capture_output=True, text=True, timeout=600, check=False)
    if built.returncode != 0 and any(s in built.stdout + built.stderr for s in NO_NETWORK):
        pytest.skip("building the wheel needs setuptools from PyPI (pip's build isolation) and PyPI is not "
                    "reachable: " + (built.stderr.strip().splitlines() or [""])[-1])
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp / "dist").glob("gpuremediate-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return Installed(wheel, venv, cwd)


def test_the_wheel_carries_the_manifests_as_manifests_has_them(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        names = set(whl.namelist())
        for relative in packaged_manifests():
            inside = f"sim/{relative}"
            assert inside in names, f"the wheel lacks {inside}"
            assert whl.read(inside) == (ROOT / relative).read_bytes(), f"{inside} differs from {relative}"
        assert {"gpuremediate/data/Xids.csv", "gpuremediate/data/Xid_144-150_Decode.csv",
                "gpuremediate/py.typed"} <= names
        assert not [n for n in names if n.startswith(("tests/", "e2e/", "bench/"))]


def test_installed_it_is_itself_not_the_checkout(installed: Installed) -> None:
    where = installed.run([installed.bin("python"), "-c", "import gpuremediate, sim.cluster; "
                           "print(gpuremediate.__file__); print(sim.cluster.SERVICEACCOUNTS_FILE)"])
    assert where.returncode == 0, where.stderr
    package, manifest = where.stdout.split()
    assert Path(package).is_relative_to(installed.venv), package
    assert Path(manifest).is_relative_to(installed.venv) and Path(manifest).is_file(), manifest
    said = installed.run([installed.bin("gpuremediate"), "version"])
    assert said.stdout.strip() == f"gpuremediate {__version__}"


def test_the_demo_runs_from_the_wheel_and_its_nodes_walk_their_states(installed: Installed) -> None:
    done = installed.run([installed.bin("gpuremediate"), "demo", "--no-color"], timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    for node, state in [("gpu-node-1", "draining"), ("gpu-node-1", "repairing"), ("gpu-node-1", "validating"),
                        ("gpu-node-1", "healthy"), ("gpu-node-3", "cordoned"), ("gpu-node-4", "quarantined")]:
        assert re.search(rf"^\s+[\d.]+s\s+{node}\s+{state}\s", out, re.MULTILINE), f"{node} never {state}:\n{out}"
    assert re.search(r"Evictions: \d+; transitions: [1-9]\d*\.", out), out[-2000:]


def test_the_sandbox_runs_from_the_wheel_until_interrupted(installed: Installed) -> None:
    kubeconfig = installed.cwd / "sandbox.kubeconfig"
    log = installed.cwd / "sandbox.log"
    with log.open("w") as out:
        proc = subprocess.Popen([installed.bin("gpuremediate"), "demo", "--keep", "--speed", "4", "--no-color",
                                 "--kubeconfig-out", str(kubeconfig)], cwd=installed.cwd, env=installed.env(),
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while "Sandbox:" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            assert "Sandbox:" in log.read_text(), log.read_text()[-3000:]
            status = installed.run([installed.bin("gpuremediate"), "status", "--kubeconfig", str(kubeconfig)])
            assert status.returncode == 0, status.stderr
            assert re.search(r"^gpu-node-4\s+quarantined", status.stdout, re.MULTILINE), status.stdout
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            assert proc.wait(60) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert "sandbox stopped" in log.read_text()


def test_replay_runs_from_the_wheel_on_a_synthetic_history(installed: Installed) -> None:
    history = installed.cwd / "history"
    made = installed.run([installed.bin("python"), "-m", "sim.history", "--nodes", "6", "--days", "1",
                          "--catalog-mix", "300", "--seed", "1", str(history)])
    assert made.returncode == 0, made.stderr
    report = installed.cwd / "replay.html"
    done = installed.run([installed.bin("gpuremediate"), "replay", "--scrapes", str(history / "scrapes"),
                          "--nodes", str(history / "nodes.json"), "--html", str(report)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "healthy → draining" in done.stdout, done.stdout[-3000:]
    assert report.stat().st_size > 0


def test_check_runs_from_the_wheel_against_gpusims_nvidia_smi(installed: Installed) -> None:
    """`check` with gpu-sim's nvidia-smi stand-in (the installed sim writes it): healthy, then a double-bit ECC
    error (needs repair, exit 2)."""
    host = installed.cwd / "host"
    write = ("import sys; from sim.gpusim import GpuSim; g = GpuSim(port=0, files_dir=sys.argv[1]); "
             "g.add_node('n1', gpus=2, ip='127.0.0.1'); "
             "len(sys.argv) > 2 and g.inject_dbe('n1', 1)")
    smi = str(host / "n1" / "nvidia-smi")
    check = [installed.bin("gpuremediate"), "check", "--nvidia-smi", smi, "--kernel-log", "no"]
    assert installed.run([installed.bin("python"), "-c", write, str(host)]).returncode == 0
    healthy = installed.run(check)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert installed.run([installed.bin("python"), "-c", write, str(host), "dbe"]).returncode == 0
    faulty = installed.run(check)
    assert faulty.returncode == 2, faulty.stdout + faulty.stderr
    assert "needs repair" in faulty.stdout, faulty.stdout
