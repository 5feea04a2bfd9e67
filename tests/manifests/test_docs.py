"""README and operator docs stay true: e2e numbers, links, every metric documented."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from manifests_support import ROOT, controller_metrics

README = ROOT / "README.md"
DOC_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md"))
# every page under docs/, by its path there without .md (docs/internals/kube.md is "internals/kube"): README
# links each one (its documentation list)
DOCS = tuple(str(p.relative_to(ROOT / "docs").with_suffix("")) for p in DOC_PAGES)

OLD_HEADINGS: dict[str, tuple[str, ...]] = {
    # docs/operations.md before it was split by question (issue 44): its index keeps each heading
    "operations.md": (
        'Before you install: the dcgm-exporter counters',
        'Install with Helm',
        'Install with kustomize',
        'The policy',
        'First rollout: dry-run',
        'Reading GPU health from Prometheus: `--source=prometheus`',
        'The recording rules',
        "Three sources of GPU health: metrics, the node agent, other tools' NodeConditions",
        'Choosing the budget and the breaker',
        'A sandbox to try the commands: `make sandbox`',
        'Pausing all new work: `gpuremediate pause`',
        'Failure domains: a budget per rack, a breaker per domain',
        'NVLink domains (GB200 / GB300 NVL72): fabric state, Fabric Manager, IMEX',
        'The findings and what they do',
        'What never fires, and why',
        'A rack at once: the domain breaker on the clique label',
        'A rack as one unit: `[fabric] domain_action`',
        'Sources of the names and values',
        'Drain gates and pacing',
        'Telling the job why it died: `GPUFault` Events on pods',
        'Pods failing on a node with GPU errors: `[workload]`',
        'Notifications: a webhook for what needs a person (and, if you like, every repair)',
        'Escalation ladder',
        'Diagnostics before the first repair',
        'One bad GPU out instead of its node: `[isolation] scope = "gpu"` (DRA clusters)',
        'Without DRA: `[isolation] without_dra = "device-plugin"`',
        'MIG nodes',
        'GPU reset on GPU-operator nodes',
        'Reading `status` and `explain`',
        'Releasing a quarantined node',
        'Keeping a node cordoned whatever gpuremediate finishes',
        'A Node whose annotations are full',
        'Running several replicas (sharding)',
        'Upgrades',
    ),
    # docs/internals.md before it was split by seam (issue 44): its index keeps each heading
    "internals.md": (
        '`gpuremediate.kube` — the REST client',
        '`sim.kubeapi` — the Kubernetes API emulator',
        '`sim.nodesim` — the kubelet stand-in (talks to any API server through `KubeClient`)',
        '`sim.gpusim` — the dcgm-exporter stand-in',
        'Signals and policy',
        'gpuremediate.state',
        'The controller and its loops (`gpuremediate/controller.py`, `gpuremediate/loops/`, `gpuremediate/actions/`)',
        'Drain and repair variants: one interface each, one table each (issue 25)',
        'Busy, big and hostile clusters: the contracts added for them',
        'Scale, sources and operability: the contracts added for them',
        'MIG, the GPU reset sequence, escalation: the contracts added for them',
        'DRA device taints: the primitives of GPU-level isolation (issue 26)',
        "The operator's CLI conventions",
        'Time',
    ),
}


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
    assert len(DOCS) >= 20
    for name in DOCS:
        assert f"docs/{name}.md" in links, f"README does not link docs/{name}.md"
    for path in [README, *DOC_PAGES]:
        for target in _links(path):
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lowercased, every character but letters, digits, spaces, '-'
    and '_' dropped, each space a '-' (inline code's backticks and a link's brackets go with the punctuation)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown page: its headings' slugs (outside code blocks), a repeated one with -1, -2...
    as GitHub numbers them, and any explicit ``<a name="...">`` / ``id="..."``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        marker = re.match(r"^\s*(```|~~~)", line)
        if marker:
            fence = "" if fence == marker.group(1) else fence or marker.group(1)
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fence or heading is None:
            continue
        slug = github_slug(heading.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    found.update(re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", path.read_text(encoding="utf-8")))
    return found


def _links_with_anchors(path: Path) -> list[tuple[str, str]]:
    """(file, anchor) of every relative link of the page, outside code blocks and inline code ("" for none)."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    found = []
    for target in re.findall(r"\]\(([^()\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        found.append((file, anchor))
    return found


def test_github_slug_follows_githubs_rules() -> None:
    assert github_slug("Reading GPU health from Prometheus: `--source=prometheus`") == \
        "reading-gpu-health-from-prometheus---sourceprometheus"
    assert github_slug("A rack as one unit: `[fabric] domain_action`") == "a-rack-as-one-unit-fabric-domain_action"
    assert github_slug("Three sources of GPU health: metrics, the node agent, other tools' NodeConditions") == \
        "three-sources-of-gpu-health-metrics-the-node-agent-other-tools-nodeconditions"
    assert github_slug("`gpuremediate.kube` — the REST client") == "gpuremediatekube--the-rest-client"


def test_every_relative_link_and_anchor_in_readme_and_the_docs_resolves() -> None:
    broken = []
    for page in [README, *DOC_PAGES]:
        for file, anchor in _links_with_anchors(page):
            target = (page.parent / file).resolve() if file else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {file} does not exist")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {file or page.name}#{anchor}: no such heading")
    assert not broken, "\n".join(broken)


def test_the_anchor_check_finds_a_missing_file_and_heading(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## Two words: `x`\n\n```\n# not a heading\n```\n## Two words: `x`\n",
                                   encoding="utf-8")
    assert anchors(tmp_path / "a.md") == {"top", "two-words-x", "two-words-x-1"}
    (tmp_path / "b.md").write_text("[ok](a.md#two-words-x) [bad](a.md#not-a-heading) [gone](c.md) "
                                   "`[code](c.md)`\n", encoding="utf-8")
    assert _links_with_anchors(tmp_path / "b.md") == [("a.md", "two-words-x"), ("a.md", "not-a-heading"),
                                                     ("c.md", "")]
    assert "not-a-heading" not in anchors(tmp_path / "a.md")


def test_old_operations_and_internals_anchors_still_land_somewhere() -> None:
    """The split pages keep every heading the one-page docs had: each still an anchor of the old page (its
    index), whose text links on to where the section is now."""
    for page, headings in OLD_HEADINGS.items():
        kept = anchors(ROOT / "docs" / page)
        for heading in headings:
            assert github_slug(heading) in kept, f"docs/{page}#{github_slug(heading)} is gone"


def test_metrics_doc_lists_every_metric_the_controller_exports() -> None:
    text = (ROOT / "docs/metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(gpuremediate_[a-z_]+)` \|", text, re.MULTILINE))
    exported = set(controller_metrics())
    assert documented == exported, f"undocumented: {exported - documented}; gone: {documented - exported}"
