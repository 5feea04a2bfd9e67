"""A uniformly slow API server (issue 41): every request but the watches takes ``--delay`` seconds (an overloaded
kube-apiserver queueing in API Priority and Fairness). ``--nodes`` nodes fault at once (XID 48: drain, reset,
validate) with a budget that admits them all and the breaker off; printed per node: when it was cordoned, left
Draining (repairing), reached validating and came back healthy, seconds after the faults, for each
``--loop-workers`` count asked for.

    .venv/bin/python bench/slow_api.py                          # 8 nodes, 3 s a request, 1 then 4 workers
    .venv/bin/python bench/slow_api.py --delay 1 --workers 1 2 4 8 --limit 120

The emulator and the controller run in this process (the controller in-process, as tests/reliability runs it,
with its own token); the delay is the emulator's injected fault, so the controller's own CPU is not what is
measured: its waiting is.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuremediate.policy.config import loads_policy  # noqa: E402
from gpuremediate.vocab import states  # noqa: E402
from gpuremediate.vocab.record import NodeRecord, record_from_node  # noqa: E402
from sim.cluster import SimCluster  # noqa: E402
from tests.loops.test_conflicts import job_service_account  # noqa: E402
from tests.reliability.harness import Controllers, reliability_settings  # noqa: E402

MILESTONES = ("cordoned", states.REPAIRING, states.VALIDATING, "back")


def run(nodes: int, delay_s: float, workers: int, limit_s: float) -> dict[str, dict[str, float]]:
    policy = loads_policy(f'[drain]\nretry_s = 1\n[budget]\nmax_unavailable = "{nodes}"\n[breaker]\nenabled = false\n',
                          "slow-api")
    cluster = SimCluster(nodes=nodes, gpus=2, job_duration_s=0.2, reboot_down_s=0.3)
    cluster.start()
    job_service_account(cluster.kube)
    settings = dataclasses.replace(reliability_settings(cluster), resync_s=2.0, loop_workers=workers)
    controllers = Controllers(cluster, policy, settings)
    controllers.start()
    key = cluster.api.type_for("", "nodes").key
    try:
        time.sleep(3)
        for method in ("GET", "PATCH", "POST", "PUT", "DELETE"):
            cluster.api.inject(method, r"^(?!.*watch=).*$", count=10**9, action="delay", delay_s=delay_s)
        start = time.monotonic()
        names = [o["metadata"]["name"] for o in cluster.api.store.list_all(key)]
        for name in names:
            cluster.gpusim.inject_xid(name, 0, 48)
        seen: dict[str, dict[str, float]] = collections.defaultdict(dict)
        while time.monotonic() - start < limit_s and not all("back" in seen[n] for n in names):
            at = round(time.monotonic() - start, 1)
            for obj in cluster.api.store.list_all(key):
                name, record = obj["metadata"]["name"], record_from_node(obj)
                state = record.state if isinstance(record, NodeRecord) else ""
                if obj.get("spec", {}).get("unschedulable"):
                    seen[name].setdefault("cordoned", at)
                if state in (states.REPAIRING, states.VALIDATING):
                    seen[name].setdefault(state, at)
                if state == states.HEALTHY and "cordoned" in seen[name]:
                    seen[name].setdefault("back", at)
            time.sleep(0.5)
        return {name: dict(seen[name]) for name in names}
    finally:
        controllers.close()
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--delay", type=float, default=3.0, help="seconds each non-watch request takes")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4], help="--loop-workers counts to run")
    parser.add_argument("--limit", type=float, default=240.0, help="seconds to watch each run for")
    args = parser.parse_args()
    for workers in args.workers:
        seen = run(args.nodes, args.delay, workers, args.limit)
        print(f"--loop-workers {workers}, {args.nodes} nodes, {args.delay:g} s a request (limit {args.limit:g} s):")
        for milestone in MILESTONES:
            times = sorted(s[milestone] for s in seen.values() if milestone in s)
            shown = (f"{len(times)}/{len(seen)} nodes, first {times[0]:.1f} s, median {statistics.median(times):.1f} s,"
                     f" last {times[-1]:.1f} s") if times else f"0/{len(seen)} nodes"
            print(f"  {milestone:<11} {shown}")


if __name__ == "__main__":
    main()
