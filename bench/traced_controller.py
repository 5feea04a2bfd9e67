"""``python -m gpuremediate`` under tracemalloc: where the controller's memory goes (issue 16).

    BENCH_TRACE_OUT=/tmp/trace.txt .venv/bin/python bench/traced_controller.py run --kubeconfig ...

Every ``BENCH_TRACE_EVERY`` seconds (default 20) a thread writes the allocations still held, by source line,
largest first, to ``BENCH_TRACE_OUT`` (replaced each time: the last one is the steady state). tracemalloc
counts Python allocations only (no interpreter overhead, no arena fragmentation) and slows the process:
its figures say where memory goes, not the RSS.
"""

from __future__ import annotations

import os
import sys
import threading
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOP = 40


def report(snapshot: tracemalloc.Snapshot) -> str:
    stats = snapshot.statistics("lineno")
    total = sum(s.size for s in stats)
    lines = [f"total {total / 1e6:.1f} MB held in {sum(s.count for s in stats)} blocks"]
    for stat in stats[:TOP]:
        frame = stat.traceback[0]
        where = f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno}"
        lines.append(f"{stat.size / 1e6:8.2f} MB {stat.count:9d} blocks  {where}")
    return "\n".join(lines) + "\n"


def dump_every(path: Path, every_s: float) -> None:
    while True:
        threading.Event().wait(every_s)
        text = report(tracemalloc.take_snapshot())
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def main() -> int:
    tracemalloc.start()
    out = Path(os.environ.get("BENCH_TRACE_OUT", "/tmp/gpuremediate-trace.txt"))
    every = float(os.environ.get("BENCH_TRACE_EVERY", "20"))
    threading.Thread(target=dump_every, args=(out, every), name="trace-dump", daemon=True).start()
    from gpuremediate.cli import main as cli_main
    from gpuremediate.shutdown import Shutdown
    return cli_main(sys.argv[1:], shutdown=Shutdown().install())


if __name__ == "__main__":
    raise SystemExit(main())
