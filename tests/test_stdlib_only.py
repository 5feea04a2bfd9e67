"""The runtime is the standard library only: every import under gpuremediate/ must resolve there.

``sim`` is first-party (shipped in the same distribution, stdlib-only itself): only the demo uses it."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpuremediate"
FIRST_PARTY = {"gpuremediate", "sim"}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_every_runtime_import_is_stdlib_or_own_package() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert files, "no modules found under gpuremediate/"
    offenders = {
        f"{path.relative_to(PACKAGE.parent)}: {root}"
        for path in files
        for root in _imported_roots(path)
        if root not in FIRST_PARTY and root not in sys.stdlib_module_names
    }
    assert not offenders, f"non-stdlib imports at runtime: {sorted(offenders)}"


def test_the_checker_catches_a_third_party_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import requests\nfrom yaml import safe_load\nimport json\n")
    assert _imported_roots(bad) - set(sys.stdlib_module_names) == {"requests", "yaml"}


def test_the_simulators_are_stdlib_only_too() -> None:
    offenders = {
        f"{path.relative_to(ROOT)}: {root}"
        for path in sorted((ROOT / "sim").rglob("*.py"))
        for root in _imported_roots(path)
        if root not in FIRST_PARTY and root not in sys.stdlib_module_names
    }
    assert not offenders, f"non-stdlib imports in sim/: {sorted(offenders)}"
