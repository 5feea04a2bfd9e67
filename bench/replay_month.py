"""How long `gpuremediate replay` takes over a synthetic month of a 200-node fleet (sim/history.py).

    .venv/bin/python bench/replay_month.py [--nodes 200] [--days 30]

Generates the history into a temporary folder, then times the replay of the default policy and the
--compare run with the strict one, end to end (reading the scrapes included) and the engine alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuremediate.policy.config import default_policy, load_policy  # noqa: E402
from gpuremediate.replay.engine import replay  # noqa: E402
from gpuremediate.replay.history import load_scrapes  # noqa: E402
from sim.history import month_fleet, write_all  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--days", type=float, default=30.0)
    args = parser.parse_args()
    logging.getLogger("gpuremediate").setLevel(logging.CRITICAL)  # the loops narrate every step
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        write_all(month_fleet(args.nodes, args.days), out)
        nodes = json.loads((out / "nodes.json").read_text())["items"]
        started = time.monotonic()
        history = load_scrapes(out / "scrapes")
        loaded = time.monotonic() - started
        for policy in (default_policy(), load_policy(out / "policy-strict.toml")):
            result = replay(history, policy, nodes)
            print(f"{policy.source}: {len(result.gpus)} nodes, {args.days:g} days, {history.change_count()} "
                  f"change points, {len(result.moves)} transitions; load {loaded:.2f}s, engine "
                  f"{result.seconds:.2f}s ({result.steps} instants)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
