"""What one Prometheus-source read costs the controller at N nodes x 8 GPUs (issue 16), in process.

    .venv/bin/python bench/source_cost.py 5000            # read time, split; memory held between reads
    .venv/bin/python bench/source_cost.py 5000 --profile  # cProfile of the reads, top functions
    .venv/bin/python bench/source_cost.py 20000 --shards 4  # one replica of 4: the fleet's answers, shard 0 kept

A stand-in Prometheus in a separate process answers the source's three queries (readings, freshness,
identity) with what a real one answers for a healthy fleet (the shapes of bench/scale.py's fleet,
gzipped as Prometheus sends them), so the figures are the controller's alone: HTTP, JSON decode,
readings. ``bench/scale.py`` measures the same against a real Prometheus, with its evaluation time.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import gzip
import io
import json
import multiprocessing
import pstats
import statistics
import sys
import time
import tracemalloc
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuremediate.kube.shards import shard_of  # noqa: E402
from gpuremediate.signals import sources  # noqa: E402
from gpuremediate.signals.model import NodeReadings  # noqa: E402

EVAL_TIME = 1_800_000_000.0


def names(n: int) -> list[str]:
    return [f"gpu-{i:05d}" for i in range(n)]


def _item(metric: dict[str, str], value: float) -> dict[str, Any]:
    return {"metric": metric, "value": [EVAL_TIME, f"{value:g}"]}


def answers(n: int) -> dict[str, bytes]:
    """The gzipped JSON Prometheus answers each query with, for a healthy fleet of n nodes."""
    readings, stamps, identity = [], [], []
    for node in names(n):
        stamps.append(_item({"Hostname": node}, EVAL_TIME - 5))
        for gpu in range(8):
            key = {"Hostname": node, "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu:02d}"}
            for metric, value in (("DCGM_FI_DEV_GPU_TEMP", 40 + gpu), ("DCGM_FI_DEV_MEMORY_TEMP", 45 + gpu)):
                readings.append(_item({**key, sources.NAME_LABEL: metric}, value))
            identity.append(_item({**key, "modelName": "NVIDIA H100 80GB HBM3",
                                   "pci_bus_id": f"00000000:{gpu + 1:02X}:00.0",
                                   "DCGM_FI_DRIVER_VERSION": "570.124.06", "pod": f"nvidia-dcgm-exporter-{node}",
                                   "namespace": "gpu-operator", "exported_pod": f"train-{node}-{gpu}",
                                   "exported_namespace": "ml"}, 1))

    def body(result: list[dict[str, Any]]) -> bytes:
        text = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
        return gzip.compress(text.encode(), 6)
    return {"readings": body(readings), "freshness": body(stamps), "identity": body(identity)}


def which(query: str) -> str:
    if "timestamp(" in query:
        return "freshness"
    return "identity" if query.startswith("group by") else "readings"


def serve(n: int, port_out: Any) -> None:
    bodies = answers(n)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
            body = bodies[which(query)]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put((httpd.server_address[1], {k: len(v) for k, v in bodies.items()}))
    httpd.serve_forever()


def rss_mb() -> tuple[float, float]:
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = float(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nodes", type=int, nargs="?", default=5000)
    p.add_argument("--reads", type=int, default=9, help="reads (one in identity_every=8 is a full identity read)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--trace", action="store_true", help="tracemalloc: what is held after the reads, by line")
    p.add_argument("--shards", type=int, default=1, help="read as the replica holding shard 0 of this many")
    args = p.parse_args()
    queue: Any = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(args.nodes, queue), daemon=True)
    server.start()
    port, sizes = queue.get(timeout=600)
    def owns(node: str) -> bool:
        return shard_of(node, args.shards) == 0

    mine = [node for node in names(args.nodes) if owns(node)]
    source = sources.PrometheusSource(f"http://127.0.0.1:{port}", clock=lambda: EVAL_TIME,
                                      expected_nodes=lambda: mine, keep=owns if args.shards > 1 else None)
    if args.trace:
        tracemalloc.start()
    held: dict[str, NodeReadings] = {}  # what the detect loop keeps (ctx.readings)
    times = []
    profiler = cProfile.Profile() if args.profile else None
    cpu_started = time.process_time()
    for _ in range(args.reads):
        started = time.perf_counter()
        if profiler:
            profiler.enable()
        readings = source.read()
        if profiler:
            profiler.disable()
        times.append(time.perf_counter() - started)
        held = {r.node: r for r in readings}
        del readings
    gc.collect()
    rss, hwm = rss_mb()
    ok = sum(1 for r in held.values() if r.status == "ok")
    cpu = time.process_time() - cpu_started
    print(json.dumps({"nodes": args.nodes, "shards": args.shards, "reads": args.reads, "ok_nodes": ok,
                      "cpu_s_per_read": round(cpu / args.reads, 3), "answer_gzip_bytes": sizes,
                      "read_s_first": round(times[0], 3), "read_s_median": round(statistics.median(times[1:]), 3),
                      "read_s_max": round(max(times[1:]), 3), "rss_mb_after": round(rss, 1),
                      "rss_mb_peak": round(hwm, 1)}))
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
        print(out.getvalue())
    if args.trace:
        snapshot = tracemalloc.take_snapshot()
        stats = snapshot.statistics("lineno")
        print(f"held: {sum(s.size for s in stats) / 1e6:.1f} MB")
        for stat in stats[:25]:
            print(f"{stat.size / 1e6:8.2f} MB {stat.count:8d}  {stat.traceback[0]}")
    server.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
