"""CPU time: gpuremediate's exposition parser vs prometheus_client's text parser.

Run by ``make bench`` (which installs prometheus_client into the venv). Inputs: every real
dcgm-exporter scrape (the tests' copies in tests/signals/data/dcgm-exporter and the reference data in
../shared/data, or ``$GPUREMEDIATE_SHARED_DATA``; files there that are not exporter scrapes are named
and skipped), the L4 scrape with ``", "`` between its labels (as older exporters and dcgm-exporter's README
quickstart sample write a label set: ``{gpu="0", UUID="GPU-604ac76c-..."}``), plus a synthetic 8-GPU scrape.
Each input is read two ways: as the controller reads an exporter's scrape (``strict=False`` with the
exporter's content type) and strictly (``parse(text)``).

Both parsers must yield the same samples (name, labels, value) on every input before anything is
timed; a disagreement fails the run. Then each parser's CPU time per parse (``time.process_time``,
not wall time: a loaded machine slows the clock, not the CPU time) is the best of ``REPEAT`` runs,
the two parsers' runs interleaved. The run fails when the smallest ratio is below ``TARGET_RATIO``.

What is fair to both: prometheus_client's generator is drained (``list()``), its families holding their
samples; ours is timed as the controller calls it. Repeating one text keeps warm only what gpuremediate
keeps between parses because a fleet's exporters write it alike (HELP / TYPE lines, label-name
sequences, families); label texts (a node's GPUs) are decoded afresh by every parse, as across a fleet.
``ParseResult.families`` is made when first read and the controller never reads it, so the ratio is
for the samples; a second table (informational) also reads the families.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from synthetic import scrape as synthetic_scrape  # noqa: E402

from gpuremediate.signals.exposition import ParseResult, parse  # noqa: E402

SCRAPES = ROOT / "tests" / "signals" / "data" / "dcgm-exporter"
SHARED = Path(os.environ.get("GPUREMEDIATE_SHARED_DATA", ROOT.parent / "shared" / "data"))
# dcgm-exporter serves this; the controller passes it to parse() with strict=False
EXPORTER_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TARGET_RATIO = 10.0
REPEAT = 15  # runs per parser and input; the best (least CPU time) counts
RUN_CPU_S = 0.02  # each run loops the parse until about this much CPU time
Key = tuple[str, tuple[tuple[str, str], ...], object]


def _lenient(text: str) -> ParseResult:
    return parse(text, content_type=EXPORTER_CONTENT_TYPE, strict=False)


def _strict(text: str) -> ParseResult:
    return parse(text)


MODES: dict[str, Callable[[str], ParseResult]] = {"lenient": _lenient, "strict": _strict}


def ours(text: str, mode: str) -> list[Key]:
    result = MODES[mode](text)
    return [(s.name, s.labels, _value(s.value)) for s in result.samples]


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


def _value(value: float) -> object:
    return "NaN" if math.isnan(value) else value


# Timed runs: each calls its parser's API straight in the loop (no wrapper frame on either side).
Timer = Callable[[str, int], float]


def _ours_lenient(text: str, number: int) -> float:
    clock = time.process_time
    start = clock()
    for _ in range(number):
        parse(text, content_type=EXPORTER_CONTENT_TYPE, strict=False)
    return (clock() - start) / number


def _ours_strict(text: str, number: int) -> float:
    clock = time.process_time
    start = clock()
    for _ in range(number):
        parse(text)
    return (clock() - start) / number


def _theirs(text: str, number: int) -> float:
    clock = time.process_time
    start = clock()
    for _ in range(number):
        list(text_string_to_metric_families(text))
    return (clock() - start) / number


def _ours_lenient_families(text: str, number: int) -> float:
    """As _ours_lenient, then reading the families (made when first read; the controller never reads them)."""
    clock = time.process_time
    start = clock()
    for _ in range(number):
        len(parse(text, content_type=EXPORTER_CONTENT_TYPE, strict=False).families)
    return (clock() - start) / number


TIMERS: dict[str, Timer] = {"lenient": _ours_lenient, "strict": _ours_strict}


def _loops(timer: Timer, text: str) -> int:
    """How many calls make one run of about RUN_CPU_S of CPU time."""
    number = 1
    while timer(text, number) * number < RUN_CPU_S / 10:  # the first call also warms caches
        number *= 2
    return max(1, int(number * RUN_CPU_S / max(timer(text, number) * number, 1e-9)))


def best_cpu(mine: Timer, other: Timer, text: str) -> tuple[float, float]:
    """Best-of-REPEAT CPU seconds per call of each, their runs interleaved so load hits both alike."""
    n_mine, n_other = _loops(mine, text), _loops(other, text)
    best_mine = best_other = math.inf
    for _ in range(REPEAT):
        best_mine = min(best_mine, mine(text, n_mine))
        best_other = min(best_other, other(text, n_other))
    return best_mine, best_other


def _is_scrape(path: Path) -> bool:
    """A dcgm-exporter scrape: Prometheus text with at least one TYPE line and sample lines."""
    if path.suffix in (".json", ".csv", ".md", ".txt", ".xlsx"):
        return False
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return "# TYPE " in text and any(line and line[0] != "#" for line in text.splitlines())


def inputs() -> tuple[list[tuple[str, str]], list[str]]:
    """(label, text) per distinct scrape, and what was skipped in the shared data and why."""
    by_text: dict[str, list[str]] = {}
    for path in sorted(SCRAPES.glob("*.prom")):
        by_text.setdefault(path.read_text(encoding="utf-8"), []).append(f"tests:{path.name}")
    skipped: list[str] = []
    if SHARED.is_dir():
        for path in sorted(p for p in SHARED.rglob("*") if p.is_file()):
            rel = path.relative_to(SHARED)
            if _is_scrape(path):
                by_text.setdefault(path.read_text(encoding="utf-8"), []).append(f"shared:{rel}")
            else:
                skipped.append(str(rel))
    else:
        skipped.append(f"{SHARED} (not found: only the tests' copies are read)")
    found = [(_label(names), text) for text, names in by_text.items()]
    l4 = SCRAPES / "scrape-L4-default.prom"
    if l4.is_file():
        found.append(("scrape-L4-default.prom, labels ', '-separated", comma_space(l4.read_text(encoding="utf-8"))))
    found.append(("synthetic 8-GPU, every dcp-metrics-included field", synthetic_scrape()))
    return found, skipped


def comma_space(text: str) -> str:
    """``text`` with its label sets written ``a="1", b="2"``: the shape of dcgm-exporter's README quickstart
    sample (``DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"} 139``)."""
    lines = []
    for line in text.split("\n"):
        head, brace, rest = line.partition("{")
        if brace and not line.startswith("#"):
            labels, close, tail = rest.rpartition("} ")
            line = head + brace + labels.replace('",', '", ') + close + tail
        lines.append(line)
    return "\n".join(lines)


def _label(names: list[str]) -> str:
    """``x.prom (tests, shared)`` for one file in both places, else every name."""
    bases = {name.partition(":")[2].rpartition("/")[2] for name in names}
    if len(bases) == 1:
        return f"{bases.pop()} ({', '.join(name.partition(':')[0] for name in names)})"
    return " = ".join(names)


def _skipped_summary(skipped: list[str]) -> str:
    by_dir: dict[str, list[str]] = {}
    for rel in skipped:
        folder, _, name = rel.rpartition("/")
        by_dir.setdefault(folder or ".", []).append(name)
    return "; ".join(f"{folder}/ ({len(names)}: {', '.join(names) if len(names) <= 3 else 'all'})"
                     for folder, names in by_dir.items())


def main() -> int:
    found, skipped = inputs()
    print(f"skipped in {SHARED} (not exporter scrapes): {_skipped_summary(skipped)}")
    rows = []
    extra = []  # lenient, with ParseResult.families read too
    for label, text in found:
        for mode in MODES:
            mine = ours(text, mode)
            other = theirs(text, {key[0] for key in mine})
            if sorted(mine, key=repr) != sorted(other, key=repr):
                print(f"{label} ({mode}): the parsers disagree; not timing it", file=sys.stderr)
                return 1
            ours_s, theirs_s = best_cpu(TIMERS[mode], _theirs, text)
            rows.append((label, mode, len(mine), ours_s, theirs_s, theirs_s / ours_s))
        with_families, theirs_s = best_cpu(_ours_lenient_families, _theirs, text)
        extra.append((label, with_families, theirs_s / with_families))
    width = max(len(row[0]) for row in rows)
    print(f"CPU time per parse (time.process_time, best of {REPEAT} runs of ~{RUN_CPU_S * 1000:.0f} ms each)")
    print(f"{'input':<{width}}  {'mode':<7}  {'samples':>7}  {'ours µs':>9}  {'theirs µs':>9}  "
          f"{'ours samples/s':>14}  ratio")
    for label, mode, count, ours_s, theirs_s, ratio in rows:
        print(f"{label:<{width}}  {mode:<7}  {count:>7}  {ours_s * 1e6:>9.1f}  {theirs_s * 1e6:>9.1f}  "
              f"{count / ours_s:>14,.0f}  {ratio:5.1f}x")
    print("lenient, the families read too (not what the controller does; informational):")
    for label, ours_s, ratio in extra:
        print(f"{label:<{width}}  {'+fam':<7}  {'':>7}  {ours_s * 1e6:>9.1f}  {'':>9}  {'':>14}  {ratio:5.1f}x")
    low = min(rows, key=lambda row: row[5])
    print(f"minimum ratio: {low[5]:.1f}x ({low[0]}, {low[1]}); target {TARGET_RATIO:.0f}x")
    if low[5] < TARGET_RATIO:
        slow = [f"{row[0]} ({row[1]}) {row[5]:.1f}x" for row in rows if row[5] < TARGET_RATIO]
        print(f"below the {TARGET_RATIO:.0f}x target: {'; '.join(slow)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
