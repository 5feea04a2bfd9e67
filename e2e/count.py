"""Count the e2e suite: scenarios (test functions) and checks (assert statements, holds() and wait_metric()
calls in them).

    python e2e/count.py           # "N scenarios, M checks"
    python e2e/count.py --json

README.md states these two numbers; tests/manifests/test_readme.py keeps them equal.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

E2E = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Count:
    scenarios: int
    checks: int

    def __str__(self) -> str:
        return f"{self.scenarios} scenarios, {self.checks} checks"


def _tests(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")]


CHECK_CALLS = frozenset({"holds", "wait_metric"})


def _is_check(node: ast.AST) -> bool:
    """An assert, ``cluster.holds(...)`` (a condition that must stay true for a while) or
    ``cluster.wait_metric(...)`` (a metric that must reach its value: an assert that waits for the counter)."""
    if isinstance(node, ast.Assert):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in CHECK_CALLS)


def count_file(path: Path) -> Count:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    tests = _tests(tree)
    checks = sum(_is_check(node) for test in tests for node in ast.walk(test))
    return Count(len(tests), checks)


def count(root: Path = E2E) -> Count:
    """Every test_*.py under root (the kind run executes the same files)."""
    counts = [count_file(p) for p in sorted(root.rglob("test_*.py"))]
    return Count(sum(c.scenarios for c in counts), sum(c.checks for c in counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    total = count()
    print(json.dumps(total.__dict__) if args.json else total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
