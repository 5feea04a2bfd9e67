"""Direct exporter scraping split over shards (issue 16): what one replica's detect read costs with
``--shards S``, each replica scraping only the exporters of its own shard.

    .venv/bin/python bench/shard_direct.py 1000          # N nodes x 8 GPUs, S = 1 then S = 2
    .venv/bin/python bench/shard_direct.py 1000 --shards 1 2 4

gpu-sim serves the N nodes from its own process (the exporters' CPU is not the readers'); each replica is
its own process running ``ExporterSource``'s scrape of the targets of its shard (``sha256(node) mod S``),
all S at once, as S replicas would. Printed per replica: CPU seconds and wall seconds per cycle (the best
of ``--cycles``), nodes read, peak RSS. The CPU seconds are what sharding divides; the wall time also
depends on how many cores are free (on a loaded 2-core machine, gpu-sim's serving competes with them).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PORT = 19400


def ip_of(index: int) -> str:
    return f"127.1.{index // 250}.{index % 250 + 1}"


def serve(n: int, port: int) -> None:
    from sim.gpusim import GpuSim

    sim = GpuSim(port=port)
    for i in range(n):
        sim.add_node(f"gpu-{i:05d}", gpus=8, ip=ip_of(i))
    sim.start()
    print("serving", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    sim.stop()


def read(n: int, port: int, shards: int, index: int, cycles: int) -> None:
    from gpuremediate.kube.shards import shard_of
    from gpuremediate.signals.sources import ExporterSource, exporter_targets

    pods = [{"metadata": {"name": f"dcgm-gpu-{i:05d}", "namespace": "gpu-operator"},
             "spec": {"nodeName": f"gpu-{i:05d}"}, "status": {"phase": "Running", "podIP": ip_of(i)}}
            for i in range(n)]
    mine = [p for p in pods if shard_of(p["spec"]["nodeName"], shards) == index]
    source = ExporterSource(client=None, port=port, workers=16)  # type: ignore[arg-type]  # no pod informer used
    targets = exporter_targets(mine, port, "/metrics")
    source._scrape_all(targets)  # warm: connections, first parses
    walls, cpus, ok = [], [], 0
    for _ in range(cycles):
        cpu, wall = time.process_time(), time.monotonic()
        readings = source._scrape_all(targets)
        cpus.append(time.process_time() - cpu)
        walls.append(time.monotonic() - wall)
        ok = sum(1 for r in readings if r.status == "ok")
    print(json.dumps({"shards": shards, "shard": index, "nodes": len(mine), "nodes_ok": ok,
                      "cpu_s_per_cycle": round(min(cpus), 2), "wall_s_per_cycle": round(min(walls), 2),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nodes", type=int, nargs="?", default=1000)
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--role", choices=("serve", "read"), help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "serve":
        serve(args.nodes, PORT)
        return 0
    if args.role == "read":
        read(args.nodes, PORT, args.shards[0], args.index, args.cycles)
        return 0
    me = [sys.executable, __file__, str(args.nodes)]
    server = subprocess.Popen([*me, "--role", "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "serving":
            raise SystemExit("gpu-sim did not start")
        for shards in args.shards:
            readers = [subprocess.Popen([*me, "--role", "read", "--shards", str(shards), "--index", str(i),
                                         "--cycles", str(args.cycles)]) for i in range(shards)]
            for reader in readers:
                reader.wait()
    finally:
        server.communicate(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
