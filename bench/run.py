"""Samples per second: gpuremediate's exposition parser vs prometheus_client's text parser.

Run by ``make bench`` (which installs prometheus_client into the venv). Both parsers must yield the
same samples (name, labels, value) on every input before anything is timed.
"""

from __future__ import annotations

import functools
import math
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from synthetic import scrape as synthetic_scrape  # noqa: E402

from gpuremediate.signals.exposition import parse  # noqa: E402

SCRAPES = ROOT / "tests" / "signals" / "data" / "dcgm-exporter"
TARGET_RATIO = 3.0
Key = tuple[str, tuple[tuple[str, str], ...], object]


def ours(text: str) -> list[Key]:
    return [(s.name, s.labels, _value(s.value)) for s in parse(text).samples]


def theirs(text: str, our_names: set[str]) -> list[Key]:
    keys = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            # prometheus_client renames 0.0.4 counter samples to <name>_total; undo it to compare
            if name not in our_names and name.endswith("_total") and name[:-6] in our_names:
                name = name[:-6]
            keys.append((name, tuple(sorted(sample.labels.items())), _value(float(sample.value))))
    return keys


def _all_families(text: str) -> list[object]:
    return list(text_string_to_metric_families(text))


def _value(value: float) -> object:
    return "NaN" if math.isnan(value) else value


def best_rate(func: Callable[[], object], samples: int, budget_s: float = 1.0, repeat: int = 7) -> float:
    """Samples per second of the best of ``repeat`` runs, each looping long enough to time well."""
    once = min(timeit.repeat(func, number=1, repeat=3))
    number = max(1, int(budget_s / repeat / max(once, 1e-9)))
    best = min(timeit.repeat(func, number=number, repeat=repeat)) / number
    return samples / best


def inputs() -> list[tuple[str, str]]:
    found = [(path.name, path.read_text(encoding="utf-8")) for path in sorted(SCRAPES.glob("*.prom"))]
    found.append(("synthetic 8-GPU, every dcp-metrics-included field", synthetic_scrape()))
    return found


def main() -> int:
    rows = []
    for name, text in inputs():
        mine = ours(text)
        other = theirs(text, {key[0] for key in mine})
        if sorted(mine, key=repr) != sorted(other, key=repr):
            print(f"{name}: the parsers disagree; not timing it", file=sys.stderr)
            return 1
        ours_rate = best_rate(functools.partial(parse, text), len(mine))
        theirs_rate = best_rate(functools.partial(_all_families, text), len(mine))
        rows.append((name, len(mine), ours_rate, theirs_rate, ours_rate / theirs_rate))
    width = max(len(row[0]) for row in rows)
    print(f"{'input':<{width}}  {'samples':>7}  {'ours samples/s':>14}  {'prometheus_client samples/s':>27}  ratio")
    for name, count, ours_rate, theirs_rate, ratio in rows:
        print(f"{name:<{width}}  {count:>7}  {ours_rate:>14,.0f}  {theirs_rate:>27,.0f}  {ratio:5.1f}x")
    slow = [row[0] for row in rows if row[4] < TARGET_RATIO]
    if slow:  # timings on a shared machine are noisy: say so, but only disagreement fails the run
        print(f"below the {TARGET_RATIO:.0f}x target: {', '.join(slow)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
