"""README and operator docs stay true: e2e numbers, links, every metric documented."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from manifests_support import ROOT, controller_metrics

README = ROOT / "README.md"
DOCS = ("architecture", "operations", "metrics", "troubleshooting", "agent")


def _count_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e_count", ROOT / "e2e/count.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["e2e_count"] = module
    spec.loader.exec_module(module)
    return module


def test_readme_starts_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# gpuremediate" and lines[2] == "```sh"
    assert lines[3].startswith("make demo ") and lines[4].startswith("make test ") and lines[5] == "```"


def test_readme_numbers_are_what_e2e_count_prints() -> None:
    counted = _count_module().count()
    match = re.search(r"\*\*(\d+) scenarios\*\* with \*\*(\d+) checks\*\*", README.read_text(encoding="utf-8"))
    assert match, "README lost its e2e numbers sentence"
    stated = (int(match.group(1)), int(match.group(2)))
    assert stated == (counted.scenarios, counted.checks), (
        f"README says {stated}, e2e/count.py counts {counted}: update README.md")
    assert counted.scenarios >= 20


def test_count_counts_test_functions_their_asserts_holds_and_metric_waits(tmp_path: Path) -> None:
    count = _count_module()
    (tmp_path / "test_a.py").write_text(
        "def helper():\n    assert True\n\n"
        "def test_one():\n    assert 1\n    for x in []:\n        assert x\n\n"
        "class TestGroup:\n    async def test_two(self):\n        assert 2\n\n"
        "def test_three(c):\n    c.holds(lambda: True, 1.0, 'x')\n    c.wait(lambda: True, 1.0, 'y')\n"
        "    c.wait_metric('m', 1)\n",
        encoding="utf-8")
    (tmp_path / "harness.py").write_text("def test_not_a_test_file():\n    assert 0\n", encoding="utf-8")
    assert count.count(tmp_path) == count.Count(scenarios=3, checks=5)


def _links(path: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8"))
            if not t.startswith(("http://", "https://"))]


def test_readme_links_every_doc_and_every_link_resolves() -> None:
    links = _links(README)
    for name in DOCS:
        assert f"docs/{name}.md" in links, f"README does not link docs/{name}.md"
    for path in [README, *(ROOT / "docs" / f"{n}.md" for n in DOCS)]:
        for target in _links(path):
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


def test_metrics_doc_lists_every_metric_the_controller_exports() -> None:
    text = (ROOT / "docs/metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(gpuremediate_[a-z_]+)` \|", text, re.MULTILINE))
    exported = set(controller_metrics())
    assert documented == exported, f"undocumented: {exported - documented}; gone: {documented - exported}"
