"""What `make` tells the user (issue 50): `make lint` installed shellcheck with apt-get as root, silently; `make test`
printed setuptools' editable-install banner."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no make")


def _tools(tmp_path: Path) -> Path:
    """A PATH without shellcheck whose apt-get and sudo only note that they ran (and apt-get 'installs' one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "id", "echo", "chmod"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    shellcheck = f"#!/bin/sh\necho \"shellcheck $*\" >> {tmp_path}/ran\n"
    installed = bin_dir / "shellcheck"
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"apt-get $*\" >> {tmp_path}/ran\n"
                                     f"printf '%s' '{shellcheck}' > {installed}; chmod +x {installed}\n")
    (bin_dir / "sudo").write_text(f"#!/bin/sh\necho \"sudo $*\" >> {tmp_path}/ran\nexec \"$@\"\n")
    for script in ("apt-get", "sudo"):
        (bin_dir / script).chmod(0o755)
    return bin_dir


def _make(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert MAKE is not None
    env = {**os.environ, "PATH": str(_tools(tmp_path))}
    return subprocess.run([MAKE, "--no-print-directory", "-C", str(ROOT), "shellcheck", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def test_without_shellcheck_make_says_so_and_installs_nothing(tmp_path: Path) -> None:
    done = _make(tmp_path)
    assert done.returncode == 0, done.stderr
    said = done.stderr.strip()
    assert said.startswith("make: shellcheck is not installed: e2e/kind/*.sh"), said
    assert said.endswith(" were not checked. Install it (Debian: apt-get install -y shellcheck, as root) or run make "
                         "shellcheck INSTALL_SHELLCHECK=1 to have make run apt-get."), said
    assert not (tmp_path / "ran").exists()  # no apt-get, no sudo


def test_install_shellcheck_says_it_runs_apt_get(tmp_path: Path) -> None:
    done = _make(tmp_path, "INSTALL_SHELLCHECK=1")
    assert done.returncode == 0, done.stderr
    sudo = "" if os.getuid() == 0 else "sudo "
    assert f"make: installing shellcheck: {sudo}apt-get install -y shellcheck (Debian's package)" in done.stdout
    ran = (tmp_path / "ran").read_text().splitlines()
    assert [line.removeprefix("sudo ") for line in ran if "install" in line] == \
        ["apt-get install -y -qq shellcheck"] * (2 if sudo else 1), ran
    assert any(line.startswith("shellcheck e2e/kind/") for line in ran), ran


def test_the_test_venv_install_quiets_setuptools_editable_banner() -> None:
    """`make test`'s first run installs the package editable; setuptools' 'Editable installation' banner (a
    BuildBackendWarning) is filtered out (make -n shows the command as run)."""
    assert MAKE is not None
    done = subprocess.run([MAKE, "--no-print-directory", "-C", str(ROOT), "-n", "-B", "test"], capture_output=True,
                          text=True, timeout=60, check=False)
    install = [line for line in done.stdout.splitlines() if "pip install -q -e" in line]
    assert install and all(line.startswith('PYTHONWARNINGS="ignore:Editable installation:UserWarning" ')
                           for line in install), done.stdout
