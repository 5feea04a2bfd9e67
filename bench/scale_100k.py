"""100,000 GPU nodes, measured (issue 48): one replica of S running its share for real, per-shard reads.

    make bench-100k                                   # N = 100,000, S = 20 then S = 10
    .venv/bin/python bench/scale_100k.py 100000 --shards 20 --steady 120 --faults 10 --burst 1500

Per S, fresh: the API emulator holding the N Nodes (``--node-shape realistic``, the default: as a real GPU fleet's
kubelet, GPU feature discovery and NFD leave them, bench.scale.realistic_node_body; ``toy``: node_body's few fields;
40 images each either way; in this bench's process, apart from the replica's); a stand-in Prometheus in a process
of its own serving ONLY the replica's shard
(the nodes whose ``hashmod(name) mod S`` is its shard: what a Prometheus scraping with docs/sizing.md's relabelling
answers for ``gpuremediate_shard=~"k"``; a query without that matcher is refused and counted); the other S-1
shard Leases held by light stand-ins (one thread renewing them every 2 s, annotated ``S/hashmod`` as replicas of
that mode); then the replica, ``gpuremediate run --source prometheus --shards S --shard-hash hashmod
--prometheus-shard-label gpuremediate_shard``, default flags otherwise, in a process of its own. Printed:

- the node cache: time to /readyz (Node informer synced) and to holding its shard; bytes per cached Node (the
  informer's stripped Node, measured with tracemalloc on 10,000 bodies of each shape decoded from JSON, in list
  pages and one by one as watch events);
- a steady window: full reads, read time (the controller's own gpuremediate_scrape_seconds), CPU s/min, RSS
  median / peak, API requests a minute by resource (Leases, others);
- ``--faults`` single XID 79s on the share, one after another: stand-in has it -> cordon (P50 / P90 / max);
- a burst of ``--burst`` of N at once, spread over every shard: this replica's share is served faulty and acted
  on; every other shard's nodes are cordoned and claimed in ConfigMap ``gpuremediate-budget`` at the same moment
  by S-1 simulated claimers (GET, add the node, update with the resourceVersion; a 409 reads again), so the
  replica's drain admissions meet that contention. Printed: has it -> cordon, each
  cordoned once with its record, the time until the share's drains were admitted (its nodes in the set), the
  claimers' and the replica's budget requests.

The whole controller is S replicas like this one (each holds the fleet's Node cache and its own share): its memory
is S x the replica's, printed beside.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import multiprocessing
import random
import re
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.scale  # noqa: E402
from bench.scale import (  # noqa: E402
    CONTROLLER_TOKEN,
    CONTROLLER_USER,
    LOGS,
    XID_79_MSG,
    CordonWatch,
    RssSampler,
    api_requests,
    api_requests_between,
    controller_process,
    cpu_seconds,
    http_ok,
    log,
    node_body,
    percentile,
    realistic_node_body,
    replica_gauges,
    scrape_stats,
    wait,
)
from gpuremediate.actions.budget_claims import ADMITTED_KEY, BUDGET_CONFIGMAP  # noqa: E402
from gpuremediate.kube.cache import strip_node  # noqa: E402
from gpuremediate.kube.client import KubeClient  # noqa: E402
from gpuremediate.kube.config import ClusterConfig, StaticToken  # noqa: E402
from gpuremediate.kube.errors import Conflict, NotFound  # noqa: E402
from gpuremediate.kube.handover import HANDOVER_ANNOTATION, HANDOVER_VERSION, SHARDS_ANNOTATION  # noqa: E402
from gpuremediate.kube.leader import LeaseLock, lease_clock  # noqa: E402
from gpuremediate.kube.packed import Packer  # noqa: E402
from gpuremediate.kube.resources import CONFIGMAPS, LEASES, NAMESPACES, NODES  # noqa: E402
from gpuremediate.kube.shards import preferred_shard, prometheus_hashmod, shard_lease_name  # noqa: E402
from gpuremediate.signals.sources import NAME_LABEL  # noqa: E402
from gpuremediate.vocab.record import record_from_node  # noqa: E402
from sim.kubeapi import KubeAPIServer  # noqa: E402

NAMESPACE = "gpuremediate-system"
LABEL = "gpuremediate_shard"
IDENTITY = "gpuremediate-bench"
NOW = "@NOW@"  # replaced by the evaluation time in each answer


def names(n: int) -> list[str]:
    return [f"gpu-{i:06d}" for i in range(n)]


# ---------------------------------------------------------------- the stand-in Prometheus (its own process)


def _item(metric: dict[str, str], value: str) -> str:
    return json.dumps({"metric": metric, "value": [NOW, value]}, separators=(",", ":")).replace(f'"{NOW}"', NOW)


class ShardAnswers:
    """What a Prometheus scraping the fleet with the hashmod relabelling answers the source's queries that select
    ``LABEL=~"shard"``: its nodes' temperatures, their XIDs once faulty, freshness and identity."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = set(nodes)
        self.faulty: set[str] = set()
        self.readings = {n: [_item({"Hostname": n, "gpu": str(g), "UUID": f"GPU-{n}-{g}", NAME_LABEL: metric},
                                   str(base + g))
                             for g in range(8) for metric, base in (("DCGM_FI_DEV_GPU_TEMP", 40),
                                                                    ("DCGM_FI_DEV_MEMORY_TEMP", 45))] for n in nodes}
        self.fresh = {n: _item({"Hostname": n}, f"{NOW}") for n in nodes}
        self.identity = {n: [_item({"Hostname": n, "gpu": str(g), "UUID": f"GPU-{n}-{g}",
                                    "modelName": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{g + 1:02X}:00.0",
                                    "DCGM_FI_DRIVER_VERSION": "570.124.06", "pod": f"nvidia-dcgm-exporter-{n}",
                                    "namespace": "gpu-operator"}, "1") for g in range(8)] for n in nodes}

    def xid(self, node: str) -> str:
        return _item({"Hostname": node, "gpu": "0", "UUID": f"GPU-{node}-0", "err_msg": XID_79_MSG,
                      NAME_LABEL: "DCGM_FI_DEV_XID_ERRORS"}, "79")

    def answer(self, query: str) -> list[str]:
        asked = _nodes_named(query)
        nodes = sorted(self.nodes if asked is None else self.nodes & asked)
        if "timestamp(" in query:
            return [self.fresh[n] for n in nodes]
        if query.startswith("group by"):
            return [item for n in nodes for item in self.identity[n]]
        faults = [self.xid(n) for n in nodes if n in self.faulty]
        if "DCGM_FI_DEV_GPU_TEMP" in query:
            return [item for n in nodes for item in self.readings[n]] + faults
        return faults  # the fault fast path's query: the non-zero fault series


def _nodes_named(query: str) -> set[str] | None:
    """The nodes a query's Hostname matchers name (a follow-up read's, an identity query's); None: every node."""
    found = re.findall(r'Hostname=~?"((?:[^"\\]|\\.)*)"', query)
    if not found:
        return None
    out: set[str] = set()
    for text in found:
        unescaped = re.sub(r"\\(.)", r"\1", text.replace("\\\\", "\\"))
        out.update(unescaped.split("|"))
    return out


def serve_shard(n: int, shards: int, shard: int, conn: Any) -> None:
    """The stand-in: answers the shard's queries; ``conn`` takes ("xid", nodes) and answers when served."""
    mine = [node for node in names(n) if prometheus_hashmod(node, shards) == shard]
    answers = ShardAnswers(mine)
    lock = threading.Lock()
    counts: Counter[str] = Counter()
    scope = f'{LABEL}=~"{shard}"'

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0]
            if scope not in query:  # this Prometheus serves one shard: an unscoped query is the fleet's
                counts["unscoped"] += 1
                self._send(400, json.dumps({"status": "error", "errorType": "bad_data",
                                            "error": f"bench stand-in: query without {scope}"}).encode())
                return
            with lock:
                items = answers.answer(query)
            counts["queries"] += 1
            text = '{"status":"success","data":{"resultType":"vector","result":[' + ",".join(items) + "]}}"
            self._send(200, gzip.compress(text.replace(NOW, f"{time.time():.3f}").encode(), 1), gzipped=True)

        def _send(self, code: int, body: bytes, gzipped: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    conn.send((httpd.server_address[1], len(mine)))
    while True:
        what, arg = conn.recv()
        if what == "xid":
            with lock:
                answers.faulty.update(arg)
            conn.send(time.monotonic())
        elif what == "counts":
            conn.send(dict(counts))
        else:
            return


# ---------------------------------------------------------------- the other replicas, light


class LeaseStandIns:
    """The other S-1 replicas' shard Leases, held and renewed every 2 s by one thread (one identity each)."""

    def __init__(self, client: KubeClient, shards: int, skip: int) -> None:
        mode = {SHARDS_ANNOTATION: f"{shards}/hashmod", HANDOVER_ANNOTATION: HANDOVER_VERSION}
        self.locks = [LeaseLock(client, NAMESPACE, shard_lease_name(i), f"standin-{i}", 15, 10, lease_clock,
                                annotations=mode) for i in range(shards) if i != skip]
        self.stopped = threading.Event()

    def round(self) -> bool:
        return all([lock.try_acquire_or_renew() for lock in self.locks])

    def start(self) -> None:
        def run() -> None:
            while not self.stopped.wait(2.0):
                self.round()
        threading.Thread(target=run, daemon=True, name="lease-standins").start()


class Claimers:
    """The other shards' replicas admitting their share of a burst at once, as the replica under test did in this
    burst (its log: about one ConfigMap update a node; its budget does not bind, so each node reaches admission
    alone and claims ahead find none waiting): each node cordoned, then added alone to the budget ConfigMap's
    admitted set with the resourceVersion (a 409: read again)."""

    def __init__(self, client: KubeClient, by_shard: dict[int, list[str]]) -> None:
        self.client, self.by_shard = client, by_shard
        self.requests, self.conflicts = 0, 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._claim_all, args=(nodes,), daemon=True)
                        for nodes in by_shard.values()]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join()

    def _claim_all(self, nodes: list[str]) -> None:
        for node in nodes:
            self.client.patch(NODES, node, {"spec": {"unschedulable": True}})
            self._claim([node])

    def _claim(self, nodes: list[str]) -> None:
        while True:
            with self.lock:
                self.requests += 2
            try:
                current = self.client.get(CONFIGMAPS, BUDGET_CONFIGMAP, NAMESPACE)
            except NotFound:
                current = None
            admitted = json.loads(((current or {}).get("data") or {}).get(ADMITTED_KEY) or "{}")
            admitted.update(dict.fromkeys(nodes, time.time()))
            data = {ADMITTED_KEY: json.dumps(dict(sorted(admitted.items())), separators=(",", ":"))}
            try:
                if current is None:
                    self.client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                    "metadata": {"name": BUDGET_CONFIGMAP}, "data": data}, NAMESPACE)
                else:
                    self.client.replace(CONFIGMAPS, BUDGET_CONFIGMAP, {**current, "data": data}, NAMESPACE)
                return
            except Conflict:  # another writer first (AlreadyExists too, on a racing create): read again
                with self.lock:
                    self.conflicts += 1


# ---------------------------------------------------------------- the run


NODE_SHAPES = ("toy", "realistic")  # bench.scale's node_body (a few fields) or realistic_node_body (a real fleet's)


def fleet_node(shape: str, i: int) -> dict[str, Any]:
    """The fleet's ``i``-th Node as the emulator serves it, in ``shape``."""
    name = f"gpu-{i:06d}"
    if shape == "realistic":
        return realistic_node_body(name, i)
    node = node_body(name)
    node["metadata"].update({"uid": f"{i:08x}-0000-4000-8000-{i:012x}", "resourceVersion": str(10**6 + i),
                             "creationTimestamp": "2026-12-07T00:00:00Z"})
    return node


def bytes_per_cached_node(sample: int = 10_000, shapes: tuple[str, ...] = NODE_SHAPES) -> dict[str, dict[str, int]]:
    """What the Node informer keeps per Node (``strip_node`` of a kubelet's Node, as the emulator serves it), per
    shape: ``listed`` decoded in pages of 500 as the informer's LIST brings them, ``watched`` each decoded from its
    own watch event (what every cached Node becomes once its kubelet or a write has changed it)."""
    return {shape: _bytes_per_cached_node(shape, sample) for shape in shapes}


def _bytes_per_cached_node(shape: str, sample: int) -> dict[str, int]:
    pages = [json.dumps({"items": [fleet_node(shape, i) for i in range(first, min(first + 500, sample))]})
             for first in range(0, sample, 500)]
    events = [json.dumps(fleet_node(shape, i)) for i in range(sample)]
    out: dict[str, int] = {}
    for how, decoded in (("listed", lambda: [item for page in pages for item in json.loads(page)["items"]]),
                         ("watched", lambda: [json.loads(text) for text in events])):
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        store = {node["metadata"]["name"]: strip_node(node) for node in decoded()}
        out[how] = round((tracemalloc.get_traced_memory()[0] - before) / sample)
        tracemalloc.stop()
        assert len(store) == sample
        del store
    packer = Packer(strip_node)  # another shard's Node, as a sharded replica's informer keeps it (kube/packed.py)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    packed = {i: packer.pack(strip_node(json.loads(text))) for i, text in enumerate(events)}
    out["packed"] = round((tracemalloc.get_traced_memory()[0] - before) / sample)
    tracemalloc.stop()
    del packed
    return out


WATCH_HISTORY = 20_000


def emulator(n: int, shape: str = "realistic") -> tuple[KubeAPIServer, KubeClient]:
    # A real API server's continue token lasts until etcd's compaction (every 5 minutes); the emulator's until its
    # watch history has moved on by watch_history events. With its default 1,000, the Lease and other writes during
    # the replica's 200-page LIST of 100,000 Nodes expired the token once (S = 10), the LIST began again unpaged,
    # and the replica gave up on its sync: 20,000 is minutes of this bench's writes, as a real server's window is.
    srv = KubeAPIServer(watch_history=WATCH_HISTORY).start()
    srv.add_token(CONTROLLER_TOKEN, CONTROLLER_USER)
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=5000,
                        burst=5000)
    for ns in (NAMESPACE, "gpuremediate-jobs", "gpu-operator"):
        client.create(NAMESPACES, {"metadata": {"name": ns}})
    # straight into the store, as a restored etcd holds them: 100,000 creates over HTTP, or through the store's
    # create (three copies of each and a watch event), took 12-16 minutes of this bench's 25 at realistic Nodes
    srv.store.restore(srv.type_for("", "nodes"), (fleet_node(shape, i) for i in range(n)))
    # The store's millions of objects live to the end: out of the collector's sight, or each full collection walks
    # them all while the emulator's threads wait (a LIST page took over the controller's 60 s sync limit once).
    gc.collect()
    gc.freeze()
    return srv, client


def api_by_resource(srv: KubeAPIServer, since: int, seconds: float) -> dict[str, float]:
    mine = Counter(f"{verb} {resource}" for user, verb, _g, resource, _s, _ns, _n in list(srv.requests)[since:]
                   if user == CONTROLLER_USER)
    return {k: round(v * 60.0 / seconds, 1) for k, v in sorted(mine.items())}


def spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": round(percentile(values, 0.5), 2), "p90": round(percentile(values, 0.9), 2),
            "max": round(max(values), 2), "count": len(values)}


def run(n: int, shards: int, steady_s: float, faults: int, burst: int, port: int,
        shape: str = "realistic") -> dict[str, Any]:
    shard = preferred_shard(IDENTITY, shards)
    result: dict[str, Any] = {"nodes": n, "shards": shards, "shard": shard, "node_shape": shape}
    t0 = time.monotonic()
    srv, client = emulator(n, shape)
    result["emulator_load_s"] = round(time.monotonic() - t0, 1)
    log(f"emulator holds {n} Nodes after {result['emulator_load_s']} s")
    watch = CordonWatch(srv)
    parent, child = multiprocessing.Pipe()
    prom = multiprocessing.Process(target=serve_shard, args=(n, shards, shard, child), daemon=True)
    prom.start()
    prom_port, share = parent.recv()
    result["share_nodes"] = share
    standins = LeaseStandIns(client, shards, shard)
    assert standins.round(), "the stand-ins could not take their Leases"
    standins.start()
    LOGS.mkdir(parents=True, exist_ok=True)
    kubeconfig = LOGS / f"kubeconfig-100k-{shards}"
    srv.write_kubeconfig(kubeconfig, token=CONTROLLER_TOKEN)
    log_name = f"controller-100k-{shards}.log"
    (LOGS / log_name).unlink(missing_ok=True)
    source = ("--source", "prometheus", "--prometheus-url", f"http://127.0.0.1:{prom_port}")
    flags = ("--shards", str(shards), "--shard-hash", "hashmod", "--prometheus-shard-label", LABEL,
             "--identity", IDENTITY)
    started = time.monotonic()
    proc = controller_process(kubeconfig, source, port, flags, log_name=log_name)
    rss = RssSampler(proc.pid)
    try:
        figures(result, srv, client, watch, proc, rss, parent, port, started, shards, shard, n, steady_s, faults,
                burst)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        standins.stopped.set()
        parent.send(("stop", None))
        prom.join(10)
        client.close()
        srv.stop()
    return result


def figures(result: dict[str, Any], srv: KubeAPIServer, client: KubeClient, watch: CordonWatch,
            proc: subprocess.Popen[bytes], rss: RssSampler, prom: Any, port: int, started: float, shards: int,
            shard: int, n: int, steady_s: float, faults: int, burst: int) -> None:
    def alive() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"the replica exited {proc.returncode}: see {LOGS}")
        return False

    result["ready_s"] = round(wait(lambda: alive() or http_ok(f"http://127.0.0.1:{port}/readyz"), 1800,
                                   "the replica ready (node cache synced)"), 1)
    result["rss_mb_at_ready"] = round(rss.samples[-1][1] if rss.samples else 0.0, 1)
    holds = wait(lambda: alive() or (lease_holder(client, shard) == IDENTITY), 600, "the replica holding its shard")
    result["holds_shard_s"] = round(time.monotonic() - started, 1)
    wait(lambda: alive() or scrape_stats(port)[0] - scrape_stats(port)[2] >= 1, 600, "the first full read")
    result["first_read_after_start_s"] = round(time.monotonic() - started, 1)
    log(f"ready {result['ready_s']} s, holds shard {shard} (+{holds:.0f} s), first read at "
        f"{result['first_read_after_start_s']} s")
    steady(result, srv, proc, rss, port, steady_s)
    mine = [name for name in names(n) if prometheus_hashmod(name, shards) == shard]
    rng = random.Random(48)
    singles = rng.sample(mine, faults)
    latencies = []
    api_before = api_requests(port)
    for node in singles:
        prom.send(("xid", [node]))
        has_it = prom.recv()
        wait(lambda: alive() or node in watch.cordons, 120, f"{node} cordoned")  # noqa: B023 (waited on here)
        latencies.append(watch.cordons[node][0][0] - has_it)
    result["single_fault_has_it_to_cordon_s"] = {**spread(latencies), "each": [round(v, 2) for v in latencies]}
    result["single_fault_api_requests"] = api_requests_between(api_before, api_requests(port))
    log(f"single faults: {result['single_fault_has_it_to_cordon_s']}; the replica's API requests meanwhile: "
        f"{result['single_fault_api_requests']}")
    if burst:
        burst_phase(result, srv, client, watch, prom, alive, shards, shard, n, burst, set(singles))
    prom.send(("counts", None))
    result["stand_in_prometheus"] = prom.recv()
    result["rss_mb_peak"] = round(rss.peak_mb(), 1)
    result["gauges"] = replica_gauges(port)
    result["whole_controller_gb"] = {"steady": round(shards * result["steady"]["rss_mb_median"] / 1024, 2),
                                     "peak": round(shards * result["rss_mb_peak"] / 1024, 2)}


def lease_holder(client: KubeClient, shard: int) -> str:
    try:
        lease = client.get(LEASES, shard_lease_name(shard), NAMESPACE)
    except NotFound:
        return ""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def steady(result: dict[str, Any], srv: KubeAPIServer, proc: subprocess.Popen[bytes], rss: RssSampler, port: int,
           steady_s: float) -> None:
    count0, sum0, err0 = scrape_stats(port)
    cpu0, since, t0 = cpu_seconds(proc.pid), len(srv.requests), time.monotonic()
    time.sleep(steady_s)
    count1, sum1, err1 = scrape_stats(port)
    cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
    reads = count1 - count0
    result["steady"] = {
        "seconds": round(t1 - t0), "full_reads": reads, "read_errors": err1 - err0,
        "read_s_mean": round((sum1 - sum0) / reads, 2) if reads else None,
        "cpu_s_per_min": round((cpu1 - cpu0) * 60 / (t1 - t0), 1),
        "rss_mb_median": round(rss.median_mb(t0, t1), 1), "rss_mb_max": round(rss.max_mb(t0, t1), 1),
        "api_per_min": api_by_resource(srv, since, t1 - t0)}
    log(f"steady: {result['steady']}")


def burst_phase(result: dict[str, Any], srv: KubeAPIServer, client: KubeClient, watch: CordonWatch, prom: Any,
                alive: Any, shards: int, shard: int, n: int, burst: int, taken: set[str]) -> None:
    rng = random.Random(1500)
    nodes = rng.sample([name for name in names(n) if name not in taken], burst)
    by_shard: dict[int, list[str]] = {}
    for node in nodes:
        by_shard.setdefault(prometheus_hashmod(node, shards), []).append(node)
    mine = by_shard.pop(shard, [])
    claimers = Claimers(client, by_shard)
    since = len(srv.requests)
    prom.send(("xid", mine))
    has_it = prom.recv()
    claimers.start()
    wait(lambda: alive() or all(node in watch.cordons for node in mine), 600, "the share's burst cordoned")
    claimers.join()
    cordon_s = [watch.cordons[node][0][0] - has_it for node in mine]
    admitted_by: dict[str, float] = {}

    def share_admitted() -> bool:
        configmap = client.get(CONFIGMAPS, BUDGET_CONFIGMAP, NAMESPACE)
        admitted = json.loads((configmap.get("data") or {}).get(ADMITTED_KEY) or "{}")
        for node in mine:
            if node in admitted and node not in admitted_by:
                admitted_by[node] = time.monotonic() - has_it
        return len(admitted_by) == len(mine)

    wait(lambda: alive() or share_admitted(), 600, "the share's drains admitted")
    writes = Counter(f"{verb} {resource}" for user, verb, _g, resource, _s, _ns, _n in list(srv.requests)[since:]
                     if user == CONTROLLER_USER and resource == "configmaps")
    records = sum(1 for node in mine if record_from_node(client.get(NODES, node)) is not None)
    result["burst"] = {
        "nodes": burst, "share": len(mine), "other_shards": sum(len(v) for v in by_shard.values()),
        "has_it_to_cordon_s": spread(cordon_s),
        "cordoned_once_with_record": sum(1 for node in mine if len(watch.cordons[node]) == 1
                                         and watch.cordons[node][0][1]),
        "records": records,
        "has_it_to_drain_admitted_s": spread(list(admitted_by.values())),
        "replica_configmap_requests": dict(writes),
        "claimers_requests": claimers.requests, "claimers_409": claimers.conflicts}
    log(f"burst: {result['burst']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nodes", type=int, nargs="?", default=100_000)
    p.add_argument("--shards", type=int, nargs="+", default=[20, 10])
    p.add_argument("--steady", type=float, default=130.0, help="seconds of the steady window (reads every 60 s)")
    p.add_argument("--faults", type=int, default=10)
    p.add_argument("--burst", type=int, default=1500)
    p.add_argument("--port", type=int, default=18480)
    p.add_argument("--log-level", default="warning", help="the replica's (info: the fast path's split per fault)")
    p.add_argument("--node-shape", choices=NODE_SHAPES, default="realistic",
                   help="the emulator's Nodes: realistic (a real GPU fleet's labels, conditions, nodeInfo) or toy")
    p.add_argument("--watch-history", type=int, default=20_000,
                   help="watch events the emulator keeps (a continue token or a watch older than these expires)")
    p.add_argument("--profile", action="store_true",
                   help="the replica under bench/sampled_controller.py (profile-<port>.txt beside its log)")
    args = p.parse_args()
    bench.scale.CONTROLLER_LOG_LEVEL, bench.scale.PROFILE = args.log_level, args.profile
    global WATCH_HISTORY
    WATCH_HISTORY = args.watch_history
    per_node = bytes_per_cached_node()
    for shape, kept in per_node.items():
        log(f"the node informer keeps {kept['listed']} bytes per listed {shape} Node, {kept['watched']} per watched, "
            f"{kept['packed']} per packed (another shard's)")
    for shards in args.shards:
        result = run(args.nodes, shards, args.steady, args.faults, args.burst, args.port, args.node_shape)
        result["bytes_per_cached_node"] = per_node
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
