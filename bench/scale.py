"""Fleet-scale benchmark (issue 16): the controller against N GPU nodes x 8 GPUs.

    make bench-scale                 # N = 1000, 2500, 5000
    make bench-scale N=200           # one quick run
    .venv/bin/python bench/scale.py --direct 1000   # direct exporter scraping at 1000 nodes

Prometheus mode: a real Prometheus (Debian's package) scraping, every 15 s, one endpoint that serves
the dcgm-exporter series of all N nodes x 8 GPUs (labels as a ServiceMonitor stores them; backfilled
blocks cannot be used here: Prometheus refuses live samples older than its newest block's end); the
API emulator holds the N Nodes; the controller runs as its own process (``gpuremediate run --source
prometheus``). After a steady-state window one node (gpu-live-0) gets an XID 79 on the endpoint.
Printed: read time per cycle (the controller's gpuremediate_scrape_seconds), fault to cordon, the
controller's RSS (peak, steady), its API requests per minute by verb at steady state.

Direct mode (``--direct N [--workers 8 16 32 64] [--shards 2] [--servers 3]``): the N exporters (gpu-sim's
8-GPU body, one loopback address per node) are served by ``--servers`` processes of their own, the emulator
holds their exporter pods, and each of ``--shards`` controller processes reads its shard ``--cycles`` times
at once: printed are the read per cycle (the slowest shard) and each one's CPU seconds per cycle, so the
figures are the controller's, not the exporters'. The parse cost of one 8-GPU scrape is timed alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import promlab  # noqa: E402
from gpuremediate.kube.client import KubeClient  # noqa: E402
from gpuremediate.kube.config import ClusterConfig, StaticToken  # noqa: E402
from gpuremediate.kube.resources import NAMESPACES, NODES, PODS  # noqa: E402
from gpuremediate.signals import dcgm, exposition, sources  # noqa: E402
from sim.gpusim import new_node, render  # noqa: E402
from sim.kubeapi import KubeAPIServer  # noqa: E402

CONTROLLER_USER = "system:serviceaccount:gpuremediate-system:gpuremediate"
CONTROLLER_TOKEN = "bench-scale-controller"
FAULT_NODE = "gpu-live-0"
PROM_SCRAPE_S = 15
LOGS = Path(os.environ.get("BENCH_SCALE_LOGS", "/tmp/gpuremediate-bench-scale"))  # controller.log, kubeconfig
IMAGES_PER_NODE = 40  # what a kubelet reports; the node informer must not keep it


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the cluster


def node_body(name: str) -> dict[str, Any]:
    images = [{"names": [f"registry.example.com/team/image-{i}@sha256:{i:064x}"], "sizeBytes": 10**9 + i}
              for i in range(IMAGES_PER_NODE)]
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name},
                     "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "192"}, "allocatable": {"nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "nodeInfo": {"bootID": f"boot-{name}", "kubeletVersion": "v1.36.0"}, "images": images},
    }


def emulator_with_nodes(names: list[str]) -> tuple[KubeAPIServer, KubeClient]:
    srv = KubeAPIServer().start()
    srv.add_token(CONTROLLER_TOKEN, CONTROLLER_USER)
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=5000,
                        burst=5000)
    for ns in ("gpuremediate-system", "gpuremediate-jobs", "gpu-operator"):
        client.create(NAMESPACES, {"metadata": {"name": ns}})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: client.create(NODES, node_body(n)), names))
    return srv, client


# ---------------------------------------------------------------- Prometheus mode


def fault_nodes(faults: int) -> list[str]:
    """The nodes that get an XID, one after the other (the first is FAULT_NODE)."""
    return [f"gpu-live-{i}" for i in range(max(1, faults))]


def fleet_names(n: int, faults: int = 1) -> list[str]:
    live = fault_nodes(faults)
    return [f"gpu-{i:05d}" for i in range(n - len(live))] + live


class FleetEndpoint:
    """One scrape target exposing every node's dcgm-exporter series (as a federation endpoint would), so a
    real Prometheus holds N nodes x 8 GPUs of fresh series without N exporters. ``inject_xid`` changes one
    node's series; the rest of the body is rendered once."""

    def __init__(self, names: list[str], live: list[str]) -> None:
        self.names, self.live = names, live
        self.xid: dict[str, tuple[int, int]] = {}
        self.lock = threading.Lock()
        self.static = self._render([n for n in names if n not in live])
        self.body = self.static + self._render(live)
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with endpoint.lock:
                    body = endpoint.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _render(self, names: list[str]) -> bytes:
        out: list[str] = []
        for name in promlab.POLICY_FAMILIES:
            for node in names:
                for gpu in range(8):
                    labels = promlab.gpu_labels(node, gpu)
                    labels.pop("instance")
                    labels.pop("job")
                    value = {"DCGM_FI_DEV_XID_ERRORS": self.xid[node][1] if self.xid.get(node, (-1,))[0] == gpu
                             else 0, "DCGM_FI_DEV_GPU_TEMP": 40 + gpu, "DCGM_FI_DEV_MEMORY_TEMP": 45 + gpu}.get(name, 0)
                    out.append(f"{name}{{{promlab._label_text(labels)}}} {value}")
        return ("\n".join(out) + "\n").encode()

    def inject_xid(self, node: str, gpu: int, code: int) -> None:
        self.xid[node] = (gpu, code)
        body = self.static + self._render(self.live)
        with self.lock:
            self.body = body

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def prometheus_with_fleet(endpoint: FleetEndpoint, scrape_interval_s: int) -> Iterator[promlab.PromServer]:
    found = promlab.binaries()
    if found is None:
        raise SystemExit("prometheus/promtool not installed: apt-get install -y prometheus")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        target = promlab.Target(endpoint.address)
        with promlab.PromServer(Path(tmp), found[0], targets=[target], scrape_interval=f"{scrape_interval_s}s",
                                honor_labels=True) as server:
            yield server


TRACE_MEMORY = False  # --trace-memory: the controller under bench/traced_controller.py
FAULT_POLL = "1s"  # --fault-poll: the controller's --prometheus-fault-poll
CONTROLLER_LOG_LEVEL = "warning"  # --log-level: info adds the fast path's split (controller.log)


def controller_process(kubeconfig: Path, prom_url: str, metrics_port: int, interval: str) -> subprocess.Popen[bytes]:
    entry = [str(ROOT / "bench" / "traced_controller.py")] if TRACE_MEMORY else ["-m", "gpuremediate"]
    return subprocess.Popen(
        [sys.executable, *entry, "run", "--kubeconfig", str(kubeconfig), "--source", "prometheus",
         "--prometheus-url", prom_url, "--prometheus-fault-poll", FAULT_POLL, "--scrape-interval", interval,
         "--metrics-addr",
         f"127.0.0.1:{metrics_port}", "--log-level", CONTROLLER_LOG_LEVEL],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(kubeconfig.parent / "controller.log", "wb"))


class RssSampler:
    """The controller's RSS every half second (VmRSS), and its peak (VmHWM)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _status(self, key: str) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1]) / 1024.0
        return 0.0

    def _run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                self.samples.append((time.monotonic(), self._status("VmRSS")))
            except OSError:
                return

    def peak_mb(self) -> float:
        try:
            return self._status("VmHWM")
        except OSError:
            return max((mb for _, mb in self.samples), default=0.0)

    def median_mb(self, since: float, until: float) -> float:
        window = [mb for t, mb in self.samples if since <= t <= until]
        return statistics.median(window) if window else 0.0


def scrape_stats(metrics_port: int) -> tuple[float, float, float]:
    """(count, sum, errors) of the controller's reads of the Prometheus source."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for s in exposition.parse(text, strict=False).samples:
        if s.label("source") == "prometheus":
            values[s.name] = values.get(s.name, 0.0) + s.value
    return (values.get("gpuremediate_scrape_seconds_count", 0.0), values.get("gpuremediate_scrape_seconds_sum", 0.0),
            values.get("gpuremediate_scrape_errors_total", 0.0))


def wait(cond: Callable[[], object], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if cond():
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def run_prometheus(n: int, steady_s: float, interval_s: float, faults: int = 1) -> dict[str, Any]:
    live = fault_nodes(faults)
    names = fleet_names(n, faults)
    log(f"N={n}: emulator with {n} Nodes")
    srv, client = emulator_with_nodes(names)
    started = time.monotonic()
    endpoint = FleetEndpoint(names, live)
    log(f"N={n}: fleet endpoint of {len(endpoint.body) / 1e6:.1f} MB in {time.monotonic() - started:.0f} s")
    proc = None
    try:
        with prometheus_with_fleet(endpoint, PROM_SCRAPE_S) as prom:
            wait(lambda: prom_has_nodes(prom.url) >= n, 600, "Prometheus to scrape the fleet")
            LOGS.mkdir(parents=True, exist_ok=True)
            kubeconfig = LOGS / "kubeconfig"
            srv.write_kubeconfig(kubeconfig, token=CONTROLLER_TOKEN)
            metrics_port = promlab.free_port()
            proc = controller_process(kubeconfig, prom.url, metrics_port, f"{interval_s:g}s")
            rss = RssSampler(proc.pid)
            wait(lambda: scrape_stats(metrics_port)[0] >= 3, 600, "three reads of the Prometheus source")
            log(f"N={n}: controller reading; steady-state window {steady_s:g} s")
            before_reqs = len(srv.requests)
            c0, s0, e0 = scrape_stats(metrics_port)
            prom_cpu_0 = cpu_seconds(prom.proc.pid) if prom.proc else 0.0
            t0 = time.monotonic()
            time.sleep(steady_s)
            t1 = time.monotonic()
            c1, s1, e1 = scrape_stats(metrics_port)
            prom_cpu_s = (cpu_seconds(prom.proc.pid) if prom.proc else 0.0) - prom_cpu_0
            steady = Counter(r[1] for r in list(srv.requests)[before_reqs:] if r[0] == CONTROLLER_USER)
            per_minute = {verb: round(count * 60.0 / (t1 - t0), 1) for verb, count in sorted(steady.items())}
            fault_query_s = query_seconds(prom.url, sources.fault_query(("Hostname",)))
            timed = [fault_to_cordon(endpoint, prom.url, client, node) for node in live]
            cordon_s, prom_s = timed[0]
            ours = sorted(round(c - p, 1) for c, p in timed)
            return {
                "nodes": n, "gpus": n * 8, "reads": int(c1 - c0), "read_errors": int(e1 - e0),
                "read_s_per_cycle": round((s1 - s0) / max(1.0, c1 - c0), 3),
                "fault_to_cordon_s": round(cordon_s, 1), "fault_in_prometheus_after_s": round(prom_s, 1),
                "prometheus_to_cordon_s": round(cordon_s - prom_s, 1), "fault_query_s": round(fault_query_s, 3),
                **({"prometheus_to_cordon_s_each": ours, "prometheus_to_cordon_s_median": statistics.median(ours)}
                   if faults > 1 else {}),
                "prometheus_cpu_s_per_min_steady": round(prom_cpu_s * 60.0 / (t1 - t0), 1),
                "rss_peak_mb": round(rss.peak_mb(), 1), "rss_steady_mb": round(rss.median_mb(t0, t1), 1),
                "api_per_min_steady": per_minute, "scrape_interval_s": interval_s,
                "prometheus_scrape_interval_s": PROM_SCRAPE_S,
            }
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
        endpoint.stop()
        srv.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def query_seconds(url: str, query: str, times: int = 5) -> float:
    """The median wall time of an instant query (Prometheus' evaluation plus the transfer)."""
    took = []
    for _ in range(times):
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}), timeout=60) as r:
            r.read()
        took.append(time.monotonic() - started)
    return statistics.median(took)


def fault_to_cordon(endpoint: FleetEndpoint, prom_url: str, client: KubeClient, node: str) -> tuple[float, float]:
    """An XID 79 on ``node``: (seconds to its cordon, seconds until Prometheus had it)."""
    endpoint.inject_xid(node, 3, 79)
    injected = time.monotonic()
    in_prom = FaultInProm(prom_url, node)
    cordon_s = wait(lambda: in_prom.check() and client.get(NODES, node)["spec"].get("unschedulable"), 300,
                    f"{node}'s cordon")
    return cordon_s, (in_prom.seen_at or injected) - injected


class FaultInProm:
    """When Prometheus first answers with the injected XID (its own scrape delay, not the controller's)."""

    def __init__(self, url: str, node: str = FAULT_NODE) -> None:
        self.url, self.node = url, node
        self.seen_at: float | None = None

    def check(self) -> bool:
        if self.seen_at is None:
            query = urllib.parse.urlencode({"query": f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{self.node}"}} != 0'})
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=10) as resp:
                if json.loads(resp.read())["data"]["result"]:
                    self.seen_at = time.monotonic()
        return True


def prom_has_nodes(url: str) -> int:
    query = urllib.parse.urlencode({"query": "count(count by (Hostname) (DCGM_FI_DEV_GPU_TEMP))"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=30) as resp:
        result = json.loads(resp.read())["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


# ---------------------------------------------------------------- direct mode


NODE_PLACEHOLDER = "node-placeholder"


def node_ip(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def serve_exporters(port: int, nodes_by_ip: dict[str, str], template: str, ready: Any) -> None:
    """One exporter process: every node whose IP it is given, on one listening socket (0.0.0.0 with
    SO_REUSEPORT: the kernel spreads the connections over the processes; the node is the address the
    scraper connected to). Each answer is gpu-sim's 8-GPU body with the node's name put in."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            node = nodes_by_ip.get(self.connection.getsockname()[0], "unknown")
            body = template.replace(NODE_PLACEHOLDER, node).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            super().server_bind()

    server = Server(("0.0.0.0", port), Handler)
    ready.put(os.getpid())
    server.serve_forever()


def read_fleet(api_url: str, token: str, port: int, workers: int, cycles: int, shard: int, shards: int,
               out: Any) -> None:
    """One controller's reads (a process of its own): ``cycles`` reads of its shard, each timed and its CPU
    seconds counted (this process does nothing else)."""
    from gpuremediate.controller import ShardExporterSource
    from gpuremediate.kube.shards import shard_of
    client = KubeClient(ClusterConfig(server=api_url, token_source=StaticToken(token)), qps=500, burst=500)
    source = ShardExporterSource(client, port=port, workers=workers, timeout_s=10.0, sync_timeout_s=300.0,
                                 owns=lambda node: shards == 1 or shard_of(node, shards) == shard)
    source.start()
    source.read()  # warm: connections, the informer's first list
    walls, cpus, ok = [], [], 0
    for _ in range(cycles):
        cpu0, started = time.process_time(), time.monotonic()
        readings = source.read()
        walls.append(time.monotonic() - started)
        cpus.append(time.process_time() - cpu0)
        ok = sum(1 for r in readings if r.status == "ok")
    source.stop()
    out.put({"shard": shard, "read_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "ok": ok,
             "peak_rss_mb": round(peak_rss_mb(), 1)})


def collect(results: Any, readers: list[Any]) -> list[dict[str, Any]]:
    """Each reader's result; a reader that died (its traceback is above) ends the run instead of a hang."""
    got: list[dict[str, Any]] = []
    while len(got) < len(readers):
        try:
            got.append(results.get(timeout=5))
        except queue.Empty:
            if sum(1 for proc in readers if proc.is_alive()) < len(readers) - len(got):
                raise SystemExit("a controller process died before its result: see its traceback above") from None
    return got


def run_direct(n: int, cycles: int, workers: int, shards: int, servers: int) -> dict[str, Any]:
    """N exporters served by ``servers`` processes, read by ``shards`` controller processes at once."""
    names = [f"gpu-{i:05d}" for i in range(n)]
    srv, client = emulator_with_nodes(names)
    spawn = multiprocessing.get_context("spawn")
    port = promlab.free_port()
    template = render(new_node(NODE_PLACEHOLDER, 8, "127.0.0.1"))
    by_ip = {node_ip(i): name for i, name in enumerate(names)}
    ready = spawn.Queue()
    exporters = [spawn.Process(target=serve_exporters, args=(port, by_ip, template, ready), daemon=True)
                 for _ in range(servers)]
    readers: list[Any] = []
    try:
        for proc in exporters:
            proc.start()
        for _ in exporters:
            ready.get(timeout=60)

        def pod(i: int) -> None:
            pod_name = f"dcgm-{names[i]}"
            client.create(PODS, {"metadata": {"name": pod_name, "labels": {"app": "nvidia-dcgm-exporter"}},
                                 "spec": {"nodeName": names[i], "containers": [{"name": "e", "image": "x"}]}},
                          "gpu-operator")
            client.patch(PODS, pod_name, {"status": {"phase": "Running", "podIP": node_ip(i)}},
                         "gpu-operator", subresource="status")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(pod, range(n)))
        results = spawn.Queue()
        readers = [spawn.Process(target=read_fleet, args=(srv.url, srv.admin_token, port, workers, cycles, shard,
                                                          shards, results), daemon=True) for shard in range(shards)]
        for proc in readers:
            proc.start()
        got = sorted(collect(results, readers), key=lambda r: r["shard"])
        per_parse = min(timeit.repeat(lambda: dcgm.readings_from_samples(
            exposition.parse(template, strict=False).samples, node="parse-cost", source="exporter",
            observed_at=0.0), number=50, repeat=3)) / 50
        return {"mode": "direct", "nodes": n, "workers": workers, "shards": shards, "exporter_processes": servers,
                "cycles": cycles, "read_s_per_cycle": round(max(r["read_s"] for r in got), 2),
                "cpu_s_per_cycle": [round(r["cpu_s"], 2) for r in got],
                "nodes_ok_last_cycle": sum(r["ok"] for r in got),
                "controller_peak_rss_mb": [r["peak_rss_mb"] for r in got],
                "parse_ms_per_scrape": round(per_parse * 1000, 2), "scrape_bytes": len(template)}
    finally:
        for proc in [*readers, *exporters]:
            proc.terminate()
            proc.join(10)
        srv.stop()


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1]) / 1024.0
    return 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sizes", nargs="*", type=int, help="fleet sizes (default: 1000 2500 5000; $N overrides)")
    p.add_argument("--direct", action="store_true", help="direct exporter scraping instead of Prometheus")
    p.add_argument("--steady", type=float, default=60.0, help="steady-state window, seconds")
    p.add_argument("--interval", type=float, default=10.0, help="the controller's --scrape-interval, seconds")
    p.add_argument("--cycles", type=int, default=5, help="direct mode: reads to time")
    p.add_argument("--workers", type=int, nargs="+", default=[16],
                   help="direct mode: scrape concurrency (several: a sweep)")
    p.add_argument("--shards", type=int, default=1, help="direct mode: controller processes, each reading its shard")
    p.add_argument("--servers", type=int, default=3, help="direct mode: processes serving the exporters")
    p.add_argument("--faults", type=int, default=1,
                   help="XIDs injected one after the other, each on a node of its own (fault to cordon of each)")
    p.add_argument("--log-level", default="warning",
                   help="the controller's --log-level (info: the fast path's split of each fault, in controller.log)")
    p.add_argument("--fault-poll", default="1s", help="the controller's --prometheus-fault-poll (off: no fast path)")
    p.add_argument("--trace-memory", action="store_true",
                   help="run the controller under tracemalloc (bench/traced_controller.py; slower: not for timings)")
    args = p.parse_args()
    global TRACE_MEMORY, FAULT_POLL, CONTROLLER_LOG_LEVEL
    TRACE_MEMORY, FAULT_POLL, CONTROLLER_LOG_LEVEL = args.trace_memory, args.fault_poll, args.log_level
    sizes = args.sizes or ([int(os.environ["N"])] if os.environ.get("N") else [1000, 2500, 5000])
    for n in sizes:
        if args.direct:
            for workers in args.workers:
                print(json.dumps(run_direct(n, args.cycles, workers, args.shards, args.servers)), flush=True)
        else:
            print(json.dumps(run_prometheus(n, args.steady, args.interval, args.faults)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
