"""NVL72 racks (issue 28): a fleet of NVLink domains, some of which lose most of their trays at once.

    .venv/bin/python bench/racks.py                        # 20 racks x 18 trays (360), 3 racks lose 10 trays
    .venv/bin/python bench/racks.py --racks 5 --storm-racks 1 --spread 5
    .venv/bin/python bench/racks.py --domain-action quarantine   # the storm racks handled as one unit each

The API emulator runs in a process of its own (bench/burst.py's); the controller runs here with an in-memory
source: every tray has 4 GPUs whose fabric registration is Completed / Success, GPU Feature Discovery's
``nvidia.com/gpu.clique`` on its Node. ``--storm-racks`` racks get ``--storm-trays`` trays whose registration
failed (``fabric-failure``, a reboot), over ``--spread`` seconds; ``--single-racks`` other racks one tray each.
The domain breaker on the clique label (``[fabric] domain_breaker``, 50 % of a rack's trays) must hold every
storm rack and let the single trays be cordoned. Printed: per storm rack the seconds from the fault that
crossed its threshold becoming readable to its domain breaker opening, the trays cordoned in storm racks
(0 with ``--spread 0``; the trays before the threshold may be, with a spread), the single trays cordoned and
how long that took, trays with more than one reboot Job (must be none: the emulator runs no Job, so a tray's
first repair never ends here and a second one would be a decision taken twice).

With ``--domain-action`` (``[fabric] domain_action``) each storm rack is handled as one unit: every one of its 18
trays must get the domain fault, be cordoned, drained (no pods here: at once) and handed on (``quarantine``: to a
person), none rebooted. Printed besides: per storm rack the seconds from the threshold's fault becoming readable
to its last tray cordoned for the domain action, and the trays that ended with the domain fault.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.burst import NAMESPACE, Emulator, log, node_body, percentile, watch_cordons  # noqa: E402
from gpuremediate.actions.jobs import JOB_LABEL  # noqa: E402
from gpuremediate.actions.nodes import name_of  # noqa: E402
from gpuremediate.config import Settings  # noqa: E402
from gpuremediate.controller import Controller  # noqa: E402
from gpuremediate.kube.client import KubeClient  # noqa: E402
from gpuremediate.kube.config import load_config  # noqa: E402
from gpuremediate.kube.resources import JOBS, NAMESPACES, NODES  # noqa: E402
from gpuremediate.policy.config import loads_policy  # noqa: E402
from gpuremediate.policy.fabric import KIND_DOMAIN  # noqa: E402
from gpuremediate.signals.fabric import CLIQUE_LABEL, STATE_COMPLETED  # noqa: E402
from gpuremediate.signals.fabric_model import GpuFabric  # noqa: E402
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings  # noqa: E402
from gpuremediate.vocab.record import NodeRecord, record_from_node  # noqa: E402

TRAYS, GPUS = 18, 4
POLICY = """[budget]\nmax_unavailable = "100%"\n[breaker]\nthreshold_percent = 99\n
[fabric]\nfailure_grace_s = 0\n"""


def clique(rack: int) -> str:
    return f"00000000-0000-4000-8000-{rack:012d}.1"


def rack_trays(rack: int) -> list[str]:
    return [f"rack-{rack:02d}-tray-{t:02d}" for t in range(1, TRAYS + 1)]


def tray_body(rack: int, tray: int) -> dict[str, Any]:
    body = node_body(f"rack-{rack:02d}-tray-{tray:02d}")
    body["metadata"]["labels"][CLIQUE_LABEL] = clique(rack)
    body["status"]["capacity"] = body["status"]["allocatable"] = {"nvidia.com/gpu": str(GPUS)}
    return body


class RackSource:
    """Every tray's readings; ``begin()`` fails the chosen trays one by one over ``spread`` seconds."""

    def __init__(self, trays: list[str], failing: list[str], spread: float) -> None:
        self.trays, self.failing, self.spread = trays, failing, spread
        self.t0: float | None = None
        self.has: dict[str, float] = {}
        self._lock = threading.Lock()

    def begin(self) -> None:
        self.t0 = time.time()

    def _failing_now(self) -> set[str]:
        if self.t0 is None:
            return set()
        now, step = time.time(), self.spread / max(1, len(self.failing))
        with self._lock:
            for i, name in enumerate(self.failing):
                if self.t0 + i * step <= now:
                    self.has.setdefault(name, self.t0 + i * step)
            return set(self.has)

    def read(self) -> list[NodeReadings]:
        failing = self._failing_now()
        return [NodeReadings(node=n, source="racks", status=SOURCE_OK, gpus=tuple(
            GpuReading(node=n, gpu=str(g), uuid=f"GPU-{n}-{g}", fabric=GpuFabric(
                state=STATE_COMPLETED, status="Insufficient Resources" if n in failing and g == 0 else "Success",
                cluster_uuid=clique(int(n[5:7])).split(".")[0], clique_id=1, imex_daemon=5, imex_domain="UP"))
            for g in range(GPUS))) for n in self.trays]


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(os.environ.get("BENCH_RACKS_DIR", "/tmp/gpuremediate-bench-racks"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = Emulator(workdir)
    try:
        config = load_config(server.kubeconfig)
        admin = KubeClient(config, qps=5000, burst=5000)
        for ns in (NAMESPACE, "gpuremediate-jobs"):
            admin.create(NAMESPACES, {"metadata": {"name": ns}})
        bodies = [tray_body(r, t) for r in range(args.racks) for t in range(1, TRAYS + 1)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda b: admin.create(NODES, b), bodies))
        names = [b["metadata"]["name"] for b in bodies]
        storm = {r: [f"rack-{r:02d}-tray-{t:02d}" for t in range(1, args.storm_trays + 1)]
                 for r in range(args.storm_racks)}
        singles = [f"rack-{r:02d}-tray-01" for r in range(args.storm_racks, args.storm_racks + args.single_racks)]
        failing = [n for trays in storm.values() for n in trays] + singles
        source = RackSource(names, failing, args.spread)
        settings = Settings(namespace=NAMESPACE, scrape_interval_s=args.interval, resync_s=10.0, qps=500, burst=1000)
        policy = POLICY + (f'domain_action = "{args.domain_action}"\n' if args.domain_action else "")
        controller = Controller(settings, loads_policy(policy, "racks-policy"),
                                client=KubeClient(config, qps=500, burst=1000), source=source)
        seen: dict[str, float] = {}
        stop = threading.Event()
        threading.Thread(target=watch_cordons, args=(admin, seen, stop), daemon=True).start()
        assert controller.start_caches(300), "node cache did not sync"
        controller.start_loops()
        time.sleep(2 * args.interval)
        log(f"{len(names)} trays in {args.racks} racks: {len(failing)} trays fail over {args.spread:g} s")
        source.begin()
        opened: dict[str, float] = {}
        deadline = time.time() + args.spread + args.timeout
        while time.time() < deadline:
            for trip in controller.ctx.breakers.latest().domains:
                opened.setdefault(trip.value, time.time())
            whole = not args.domain_action or all(n in seen for r in storm for n in rack_trays(r))
            if len(opened) >= len(storm) and all(n in seen for n in singles) and whole:
                break
            time.sleep(0.1)
        time.sleep(3 * args.interval)  # anything that would still move, moves
        stop.set()
        controller.stop()
        crossing = {r: source.has.get(trays[TRAYS // 2], source.t0 or 0) for r, trays in storm.items()}  # the 10th
        after = [opened[clique(r)] - crossing[r] for r in storm if clique(r) in opened]
        jobs = Counter(j["spec"]["template"]["spec"].get("nodeName", "")
                       for j in admin.list(JOBS, "gpuremediate-jobs").get("items", [])
                       if (j["metadata"].get("labels") or {}).get(JOB_LABEL) == "reboot")
        storm_trays = {n for trays in storm.values() for n in trays}
        taken = [name_of(n) for n in admin.list(NODES).get("items", [])
                 if isinstance(rec := record_from_node(n), NodeRecord) and rec.fault is not None
                 and rec.fault.kind == KIND_DOMAIN]
        whole_after = [max(seen[n] for n in rack_trays(r)) - crossing[r] for r in storm
                       if all(n in seen for n in rack_trays(r))]
        extra = {"domain_action": args.domain_action, "trays_taken_into_domain_actions": len(taken),
                 "racks_taken_whole": len(whole_after),
                 "last_tray_cordoned_after_threshold_max_s": round(max(whole_after), 2) if whole_after else None,
                 "storm_racks_trays_cordoned": sum(1 for r in storm for n in rack_trays(r) if n in seen),
                 "storm_racks_reboot_jobs": sum(jobs[n] for r in storm for n in rack_trays(r)),
                 "trays_taken_outside_storm_racks": sorted(set(taken) - {n for r in storm for n in rack_trays(r)})
                 } if args.domain_action else {}
        return {
            "racks": args.racks, "trays": len(names), "storm_racks": len(storm), "storm_trays_each": args.storm_trays,
            "single_racks": len(singles), "spread_s": args.spread,
            "domain_breakers_open": len(opened), "unexpected_domains": sorted(set(opened) - {clique(r) for r in storm}),
            "breaker_after_threshold_p50_s": round(percentile(after, 50), 2) if after else None,
            "breaker_after_threshold_max_s": round(max(after), 2) if after else None,
            "storm_trays_cordoned": len(storm_trays & set(seen)),
            "single_trays_cordoned": len(set(singles) & set(seen)),
            "single_cordon_max_s": round(max(seen[n] - source.has[n] for n in singles if n in seen), 2)
            if any(n in seen for n in singles) else None,
            "trays_with_two_reboots": sorted(n for n, count in jobs.items() if n and count > 1),
            "fleet_breaker_open": controller.ctx.breakers.latest().is_open,
            **extra,
        }
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--racks", type=int, default=20)
    parser.add_argument("--storm-racks", type=int, default=3)
    parser.add_argument("--storm-trays", type=int, default=10)
    parser.add_argument("--single-racks", type=int, default=5)
    parser.add_argument("--spread", type=float, default=0.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--domain-action", default="", help="[fabric] domain_action (e.g. quarantine; default: none)")
    args = parser.parse_args()
    if args.storm_racks + args.single_racks > args.racks or not TRAYS // 2 < args.storm_trays <= TRAYS:
        parser.error("storm and single racks must fit in --racks; --storm-trays between 10 and 18")
    result = run(args)
    print(json.dumps(result, indent=2))
    ok = (result["domain_breakers_open"] == args.storm_racks and not result["unexpected_domains"]
          and result["single_trays_cordoned"] == args.single_racks and not result["trays_with_two_reboots"]
          and (args.spread > 0 or args.domain_action or result["storm_trays_cordoned"] == 0)
          and (not args.domain_action or (result["racks_taken_whole"] == args.storm_racks
                                          and result["trays_taken_into_domain_actions"] == args.storm_racks * TRAYS
                                          and not result["trays_taken_outside_storm_racks"]
                                          and (args.spread > 0 or result["storm_racks_reboot_jobs"] == 0))))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
