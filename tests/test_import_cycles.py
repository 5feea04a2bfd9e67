"""No import cycle among the modules of gpuremediate/ (issue 25), nor among those of sim/.

An ``ast`` walk, not an import: every ``import`` / ``from ... import`` in a module counts, wherever it is — at the
top, under ``if TYPE_CHECKING:`` (a variant typed against its loop is tied to it as much as one importing it), or
inside a function. A cycle is reported with the edges that make it, so the fix is clear: one side owns the
interface (a Protocol) and the other implements it, or the shared part moves to a module both import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def modules(package: str) -> dict[str, tuple[Path, bool]]:
    """Module name → (file, is a package's __init__) for every module under ``package``."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        if is_init:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_init)
    return found


def _longest_known(name: str, known: dict[str, tuple[Path, bool]]) -> str:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def imported(module: str, path: Path, is_init: bool, known: dict[str, tuple[Path, bool]]) -> Iterator[str]:
    """The known modules ``module`` imports (``from pkg import mod`` names ``pkg.mod``; ``from pkg import name``
    names ``pkg``); relative imports are resolved."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _longest_known(alias.name, known)
                if target:
                    yield target
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_init else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                target = full if full in known else _longest_known(base, known)
                if target:
                    yield target


def import_graph(package: str) -> dict[str, set[str]]:
    known = modules(package)
    return {name: set(imported(name, path, is_init, known)) - {name} for name, (path, is_init) in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    edges = [f"  {m} -> {', '.join(sorted(graph[m] & members))}" for m in component]
    return "import cycle among " + ", ".join(component) + ":\n" + "\n".join(edges)


@pytest.mark.parametrize("package", ["gpuremediate", "sim"])
def test_no_import_cycle(package: str) -> None:
    graph = import_graph(package)
    assert len(graph) > 10  # the walk found the package
    found = cycles(graph)
    assert not found, "\n".join(describe(graph, c) for c in found)


def test_the_walk_sees_type_checking_and_function_local_imports(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle made only by an import under TYPE_CHECKING, and one made by an import inside a function, count."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "loop.py").write_text("from pkg import variant\n")
    (pkg / "variant.py").write_text("from typing import TYPE_CHECKING\n"
                                    "if TYPE_CHECKING:\n    from pkg.loop import Loop\n")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    import pkg.a\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert cycles(import_graph("pkg")) == [["pkg.a", "pkg.b"], ["pkg.loop", "pkg.variant"]]


# The layers of gpuremediate/, bottom first (issue 44): a package or top-level module imports only from its own
# layer's modules and the layers below. Written once, here; docs/internals.md draws it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("clock", "shutdown", "malloc_arenas"),
    ("vocab",),  # the words every layer speaks: findings, the record and its states, the policy schema
    ("kube",),
    ("gpu_resources",),
    ("signals",),  # sources -> readings
    ("policy",),  # readings -> findings, decisions' rules
    ("config",),
    ("state",),  # the state machine's decisions
    ("obs",),
    ("actions",),  # effects on the cluster
    ("plugins",),
    ("loops",),
    ("replay", "agent", "check", "preflight", "structured", "webhook"),
    ("fleet",),
    ("controller",),
    ("demo",),
    ("cli",),
    ("__main__",),
)


def package_graph(root: str = "gpuremediate") -> dict[str, set[str]]:
    """Top-level package (or module) → the top-level packages it imports (``gpuremediate/__init__`` aside)."""
    def top(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "__init__"

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph(root).items():
        source = top(module)
        graph.setdefault(source, set()).update(top(t) for t in targets if top(t) not in (source, "__init__"))
    graph.pop("__init__", None)
    return graph


def test_the_packages_import_only_downward_and_make_no_cycle() -> None:
    graph = package_graph()
    layer = {name: index for index, names in enumerate(LAYERS) for name in names}
    assert set(graph) == set(layer), f"placed in no layer: {set(graph) - set(layer)}; gone: {set(layer) - set(graph)}"
    upward = [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets) if layer[b] > layer[a]]
    assert not upward, "imports up or across the layers (LAYERS):\n  " + "\n  ".join(upward)
    found = cycles(graph)
    assert not found, "\n".join(describe(graph, c) for c in found)


def test_the_vocabulary_imports_nothing_of_ours_but_itself() -> None:
    graph = import_graph("gpuremediate")
    assert {"gpuremediate.vocab.findings", "gpuremediate.vocab.record", "gpuremediate.vocab.schema"} <= set(graph)
    outside = {f"{m} -> {t}" for m, targets in graph.items() if m.startswith("gpuremediate.vocab")
               for t in targets if not t.startswith("gpuremediate.vocab")}
    assert not outside, sorted(outside)


def test_signals_read_and_never_judge() -> None:
    """``signals/`` turns sources into readings; a module there that makes Findings is a judge in the wrong layer
    (issue 44: its judges live in ``policy/``)."""
    graph = import_graph("gpuremediate")
    judging = sorted(m for m, targets in graph.items() if m.startswith("gpuremediate.signals")
                     and "gpuremediate.vocab.findings" in targets)
    assert not judging, judging
