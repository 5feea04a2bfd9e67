"""The build as setup.cfg declares it, plus the manifests the simulated cluster reads (``sim.cluster``): copied
from manifests/ into the ``sim`` package when the wheel is built, so an installed ``gpuremediate demo`` (and
``demo --keep``) finds them outside the repository. manifests/ stays their one source; tests/packaging checks the
wheel's copies are the same bytes."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# Files of manifests/ the package reads at run time, each installed at sim/<the same relative path>.
PACKAGED_MANIFESTS = ("manifests/base/serviceaccounts.yaml",)


class BuildPyWithManifests(build_py):
    def run(self) -> None:
        super().run()
        for relative in PACKAGED_MANIFESTS:
            target = Path(self.build_lib) / "sim" / relative
            self.mkpath(str(target.parent))
            self.copy_file(str(HERE / relative), str(target))


setup(cmdclass={"build_py": BuildPyWithManifests})
