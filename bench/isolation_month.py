"""GPU-hours out of service, node-level vs GPU-level isolation (issue 26), over a month of a synthetic fleet.

    .venv/bin/python bench/isolation_month.py [--nodes 1000] [--days 30] [--rate 0.5] [--seed 1]

The history is ``sim.history.catalog_fleet`` (faults of the XID catalog's mix on random GPUs); the same history is
replayed (the controller's own loops, ``gpuremediate replay``) under the default policy and under
``[isolation] scope = "gpu"``, on a simulated cluster serving DRA (``gpuremediate/replay/dra.py``). Printed per
fault class: faults, GPU-hours both ways, and for per-GPU faults the bound the issue sets: GPU-level at most one
eighth of node-level plus the repair itself (the reset and validation Jobs' time, on one GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuremediate.policy.config import default_policy, loads_policy  # noqa: E402
from gpuremediate.policy.xid import XID_TABLE  # noqa: E402
from gpuremediate.replay.cluster import Durations  # noqa: E402
from gpuremediate.replay.engine import ReplayOptions, replay  # noqa: E402
from gpuremediate.replay.history import load_scrapes  # noqa: E402
from gpuremediate.replay.result import ReplayResult  # noqa: E402
from sim.history import GPUS, catalog_fleet, write_all  # noqa: E402

GPU_LEVEL = '[isolation]\nscope = "gpu"\n'


def repair_hours(durations: Durations) -> float:
    """One GPU's own repair: its reset Job and its validation Job."""
    return (durations.reset_gpu_s + durations.validate_s) / 3600.0


def table(faults: Counter[str], node: ReplayResult, gpu: ReplayResult, durations: Durations) -> list[str]:
    by_node, by_gpu = node.gpu_hours_by_fault(), gpu.gpu_hours_by_fault()
    lines = [f"{'fault':<10} {'action':<10} {'faults':>6} {'node-level':>11} {'GPU-level':>10} {'ratio':>6}  bound",
             "-" * 66]
    for fault in sorted(set(by_node) | set(by_gpu) | set(faults), key=lambda f: (-by_node.get(f, 0.0), f)):
        n, g, count = by_node.get(fault, 0.0), by_gpu.get(fault, 0.0), faults.get(fault, 0)
        action = _action(fault)
        bound = ""
        if action == "reset-gpu" and count:
            limit = n / GPUS + count * repair_hours(durations)
            bound = f"<= {limit:.1f} {'met' if g <= limit + 1e-9 else 'MISSED'}"
        ratio = f"{g / n:.3f}" if n else "-"
        lines.append(f"{fault or '-':<10} {action:<10} {count:>6} {n:>11.1f} {g:>10.1f} {ratio:>6}  {bound}")
    lines.append(f"{'total':<10} {'':<10} {sum(faults.values()):>6} {node.gpu_hours():>11.1f} {gpu.gpu_hours():>10.1f}"
                 f" {gpu.gpu_hours() / node.gpu_hours() if node.gpu_hours() else 0:>6.3f}")
    return lines


def _action(fault: str) -> str:
    kind, _, code = fault.partition(" ")
    if kind == "xid" and code.isdigit() and int(code) in XID_TABLE:
        return XID_TABLE[int(code)].action
    return kind


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=0.5, help="GPU faults per 1,000 GPU-days")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.getLogger("gpuremediate").setLevel(logging.CRITICAL)  # the loops narrate every step
    fleet = catalog_fleet(args.nodes, args.days, per_1000_gpu_days=args.rate, seed=args.seed)
    faults = Counter(f"xid {f.values['xid']:.0f}" for f in fleet.faults)
    durations = Durations()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        write_all(fleet, out)
        nodes = json.loads((out / "nodes.json").read_text())["items"]
        history = load_scrapes(out / "scrapes")
        results = []
        for policy in (default_policy(), loads_policy(GPU_LEVEL, "gpu-level")):
            started = time.monotonic()
            results.append(replay(history, policy, nodes, ReplayOptions(durations=durations)))
            print(f"{policy.source}: replayed in {time.monotonic() - started:.1f}s, "
                  f"{results[-1].gpu_level_flows()} GPU-level flows", file=sys.stderr)
    print(f"{args.nodes} nodes x {GPUS} GPUs, {args.days:g} days, {len(fleet.faults)} faults "
          f"({args.rate:g} per 1,000 GPU-days, seed {args.seed}); GPU-hours out of service:")
    print("\n".join(table(faults, results[0], results[1], durations)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
