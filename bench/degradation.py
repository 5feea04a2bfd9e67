"""The degradation detector over a labelled synthetic fleet (issue 29): precision, recall, time to finding, false
findings on the healthy part, CPU and memory, through the real detector and policy code.

    python bench/degradation.py               # 100 nodes x 8 GPUs x 2 days (quick)
    python bench/degradation.py --full        # 1,000 nodes x 8 GPUs x 7 days, 60 s scrapes (the issue's size)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuremediate.policy.config import loads_policy  # noqa: E402
from gpuremediate.policy.degradation import DegradationDetector, NodeContext, _Gpu, _Link  # noqa: E402
from gpuremediate.vocab.degradation import DegradationPolicy  # noqa: E402
from sim.degradation_fleet import GPUS, KIND_LINK, KIND_SLOW, KIND_TREND, DegradationFleet, Episode, Spec  # noqa: E402

MIN_SLOW_S = 600.0  # the recall counts slow GPUs lasting at least 10 minutes


@dataclass(frozen=True)
class Found:
    kind: str
    uuid: str
    at: float
    code: str = ""  # a trend's


@dataclass(frozen=True)
class Shard:
    found: list[Found]
    cpu_s: float
    samples: int
    state_bytes: int
    gpus: int


def run(spec: Spec, policy: DegradationPolicy, racks: range) -> Shard:
    """Every pass of these racks through one detector; the findings as they appear, CPU seconds in update()."""
    fleet = DegradationFleet(spec)
    detector = DegradationDetector()
    context = NodeContext("", policy, "")
    found: list[Found] = []
    seen: dict[tuple[str, str], float] = {}
    cpu, samples = 0.0, 0
    for now, readings in fleet.passes(racks):
        started = time.process_time()
        detector.update(readings, lambda _name: context, now)
        cpu += time.process_time() - started
        samples += len(readings) * GPUS
        for key, gpu in detector.gpus.items():
            _note(found, seen, KIND_SLOW, key, gpu.found)
            for link in (gpu.pcie, gpu.nvlink):
                if link is not None:
                    _note(found, seen, KIND_LINK, key, link.found)
            if gpu.trends is not None:
                for code, since in gpu.trends.found.items():
                    _note(found, seen, KIND_TREND, key, since, code)
    return Shard(found, cpu, samples, state_bytes(detector), len(detector.gpus))


def _note(found: list[Found], seen: dict[tuple[str, str], float], kind: str, key: str, at: float | None,
          code: str = "") -> None:
    if at is not None and seen.get((kind + code, key)) != at:
        seen[(kind + code, key)] = at
        found.append(Found(kind, key, at, code))


def _matches(episode: Episode, finding: Found, step_s: float) -> bool:
    return (finding.kind == episode.kind and finding.uuid == episode.uuid and finding.code == (
        episode.code if episode.kind == KIND_TREND else "") and episode.start <= finding.at <= episode.end + 2 * step_s)


def score(kind: str, fleet: DegradationFleet, found: list[Found], hold_s: float) -> dict[str, float]:
    step = fleet.spec.step_s
    episodes = [e for e in fleet.episodes if e.kind == kind]
    mine = [f for f in found if f.kind == kind]
    by_gpu: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_gpu.setdefault(episode.uuid, []).append(episode)
    true = [f for f in mine if any(_matches(e, f, step) for e in by_gpu.get(f.uuid, ()))]
    false = len(mine) - len(true)
    findings_of: dict[str, list[Found]] = {}
    for finding in mine:
        findings_of.setdefault(finding.uuid, []).append(finding)
    counted = [e for e in episodes if kind == KIND_LINK or e.end - e.start >= MIN_SLOW_S]
    late, hit, hit_peers, peers = [], 0, 0, 0
    for episode in counted:
        first = min((f.at for f in findings_of.get(episode.uuid, ()) if _matches(episode, f, step)), default=None)
        with_peers = kind != KIND_SLOW or episode.code == "peers"
        peers += with_peers
        if first is not None:
            hit += 1
            hit_peers += with_peers
            late.append((first - episode.start - hold_s) / step)
    q = statistics.quantiles(late, n=10) if len(late) >= 2 else [late[0]] * 9 if late else [float("nan")] * 9
    return {"findings": len(mine), "precision": len(true) / len(mine) if mine else float("nan"),
            "episodes": len(counted), "recall": hit / len(counted) if counted else float("nan"),
            "recall_with_peers": hit_peers / peers if peers else float("nan"),
            "p50": statistics.median(late) if late else float("nan"), "p90": q[8], "false": false}


def state_bytes(detector: DegradationDetector) -> int:
    """The detector's own memory: its tables, each GPU's slots, links and peer keys (strings shared with the
    readings are not counted twice: the GPU keys and node names are)."""
    total = sys.getsizeof(detector.gpus) + sys.getsizeof(detector.contexts)
    keys: set[int] = set()
    for key, gpu in detector.gpus.items():
        total += sys.getsizeof(key) + sys.getsizeof(gpu)
        for link in (gpu.pcie, gpu.nvlink):
            total += sys.getsizeof(link) if isinstance(link, _Link) else 0
        if gpu.trends is not None:
            total += sys.getsizeof(gpu.trends) + sys.getsizeof(gpu.trends.found)
            for window in (gpu.trends.sbe, gpu.trends.rows):
                total += sys.getsizeof(window) + sys.getsizeof(window.slices) if window is not None else 0
        for part in (gpu.peers, gpu.local):
            if id(part) not in keys:
                keys.add(id(part))
                total += sys.getsizeof(part)
    assert all(isinstance(g, _Gpu) for g in detector.gpus.values())
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="1,000 nodes x 7 days (the issue's size)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="processes, each a share of the racks (jobs and peers "
                        "never span racks: the same findings as one process)")
    parser.add_argument("--no-trends", action="store_true", help="slow-gpu and link-degraded only (their cost alone)")
    parser.add_argument("--policy", help="a policy file whose [degradation] to use (default: the defaults, enabled)")
    args = parser.parse_args()
    spec = Spec(nodes=1000 if args.full else args.nodes, days=7.0 if args.full else args.days, seed=args.seed)
    policy = (loads_policy(Path(args.policy).read_text(encoding="utf-8"), args.policy).defaults.degradation
              if args.policy else DegradationPolicy(enabled=True, trends=not args.no_trends))
    fleet = DegradationFleet(spec)
    started = time.monotonic()
    racks = fleet.racks()
    cuts = [range(racks * i // args.jobs, racks * (i + 1) // args.jobs) for i in range(args.jobs)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        shards = list(pool.map(run, [spec] * args.jobs, [policy] * args.jobs, cuts))
    took = time.monotonic() - started
    found = [f for shard in shards for f in shard.found]
    cpu, samples = sum(s.cpu_s for s in shards), sum(s.samples for s in shards)
    print(f"fleet: {spec.nodes} nodes x {GPUS} GPUs x {spec.days:g} days, {spec.step_s:g} s scrapes, seed {spec.seed}; "
          f"{samples:,} GPU samples in {took:.0f} s")
    print(f"policy: hold_s {policy.hold_s:g}, slow_ratio {policy.slow_ratio:g}, link_hold_s {policy.link_hold_s:g}, "
          f"pcie_replays_min {policy.pcie_replays_min}, nvlink_errors_min {policy.nvlink_errors_min}")
    healthy = fleet.healthy_gpu_days()
    print("| finding | episodes | findings | precision | recall | recall (GPUs with peers) | onset to finding, "
          "windows past hold P50 / P90 | false per 1,000 healthy GPU-days |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, hold in ((KIND_SLOW, policy.hold_s), (KIND_LINK, policy.link_hold_s), (KIND_TREND, 0.0)):
        s = score(kind, fleet, found, hold)
        label = {KIND_SLOW: f"{kind} (>= 10 min)", KIND_TREND: f"{kind} (windows from onset)"}.get(kind, kind)
        print(f"| {label} | {s['episodes']:.0f} | {s['findings']:.0f} | {s['precision']:.3f} | {s['recall']:.3f} | "
              f"{s['recall_with_peers']:.3f} | {s['p50']:.2f} / {s['p90']:.2f} | "
              f"{1000 * s['false'] / healthy:.3f} ({s['false']:.0f} in {healthy:,.0f}) |")
    size, gpus = sum(s.state_bytes for s in shards), sum(s.gpus for s in shards)
    print(f"cost: {1e6 * cpu / samples:.2f} CPU us per GPU sample in update(); detector state {size / 1e6:.2f} MB "
          f"({size / max(1, gpus):.0f} B per GPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
