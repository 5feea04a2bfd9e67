"""Mass failure (issue 27): how fast the controller cordons a burst of faults, and whether the breaker holds.

    .venv/bin/python bench/burst.py                       # 5,000 nodes, 750 fault within 10 s
    .venv/bin/python bench/burst.py --nodes 1500 --faults 750 --spread 0 --breaker default
    .venv/bin/python bench/burst.py --conditions --faults 1600 --spread 30 --interval 15 --breaker default

``--conditions``: the faults come as the node agents' conditions (``KernelDeadlock=True``, written on the Node's
status one after the other over ``--spread`` s; a policy rule cordons for it), read by the detect loop's full
reads, instead of in the readings.

The API emulator runs in a process of its own (``python -m sim.kubeapi``), so its CPU is not the
controller's; the controller runs in this process with an in-memory source that answers for every node
and turns ``--faults`` of them faulty (XID 79) over ``--spread`` seconds: "the source has it" is the moment
a node's fault becomes readable. A watch on the Nodes (this process) sees each cordon land. Printed: P50 /
P90 / max from "the source has it" to the cordon, cordons a second sustained (first to last), the
controller's API requests by verb and the CPU seconds of this process.

``--breaker raised`` (the default) sets the breaker's threshold to 99 % and turns its storm look off (a burst
under test, not a storm to stop); ``--breaker default`` keeps 30 % within 600 s, min 3, and the look (issue 49):
then the breaker must open within one cycle of the threshold and nothing past it be cordoned. The budget is 0 (no
drain starts: the cordon alone is measured) unless ``--drain``.

``--drain`` (the drain burst): ``--pods`` pods on the faulted nodes, in ``--namespaces`` team namespaces; a third
of them in PDB groups of six, three on faulted nodes and three partners on healthy ones, ``minAvailable: 3`` (the
three on faulted nodes may go), and every tenth group at ``minAvailable: 6`` (nothing may go: its evictions
must all be refused). The budget is 100 %, the breaker raised. Printed beside the cordons: evictions a second
sustained (first to last pod gone of those that may go), the eviction answers by status (429s counted), pods
that got two successful evictions, pods gone from healthy nodes and from 0-allowed groups (both must be 0).

    .venv/bin/python bench/burst.py --nodes 5000 --faults 750 --drain --pods 10000 --qps 200 --burst 400

``--kubeconfig PATH``: a real control plane instead of the emulator (kube-apiserver, kube-controller-manager with
its disruption and node lifecycle controllers; the e2e ``apiserver`` target's). The bench registers the nodes
(labelled ``bench.gpuremediate.io/burst``) and renews their Leases as kubelets would, and reads the server's own
``/metrics`` before and after the burst: ``apiserver_request_duration_seconds`` P50/P90/P99 of the verbs the
controller sends, and the requests API Priority and Fairness rejected. Everything it created is deleted at
the end (``--cleanup`` alone deletes what an interrupted run left).

    .venv/bin/python bench/burst.py --kubeconfig /path/admin.kubeconfig --nodes 1000 --faults 150 --drain --pods 2000
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuremediate.actions.node_status import build_condition, conditions_patch  # noqa: E402
from gpuremediate.config import Settings  # noqa: E402
from gpuremediate.controller import Controller  # noqa: E402
from gpuremediate.kube import errors  # noqa: E402
from gpuremediate.kube.client import KubeClient  # noqa: E402
from gpuremediate.kube.config import load_config  # noqa: E402
from gpuremediate.kube.resources import JOBS, LEASES, NAMESPACES, NODES, PDBS, PODS, SERVICEACCOUNTS  # noqa: E402
from gpuremediate.policy.config import loads_policy  # noqa: E402
from gpuremediate.policy.safety import Look  # noqa: E402
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings  # noqa: E402
from sim.waiting import wait_for  # noqa: E402

NAMESPACE = "gpuremediate-system"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Emulator:
    """``python -m sim.kubeapi`` in its own process."""

    def __init__(self, workdir: Path) -> None:
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.unlink(missing_ok=True)  # an earlier run's
        self.proc = subprocess.Popen([sys.executable, "-m", "sim.kubeapi", "--port", "0", "--kubeconfig-out",
                                      str(kubeconfig)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        deadline = time.monotonic() + 30
        while not kubeconfig.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not kubeconfig.exists():
            raise SystemExit("the emulator did not write its kubeconfig")
        time.sleep(0.2)
        self.kubeconfig = str(kubeconfig)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def cpu_s(self) -> float:
        """The emulator's user + system CPU seconds so far (how much of a figure is the emulator's)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


BENCH_LABEL = "bench.gpuremediate.io/burst"
NODE_LEASES = "kube-node-lease"


class RealServer:
    """A real control plane at ``kubeconfig``: the bench's nodes are kept Ready by renewing their Leases (the
    kubelet's heartbeat since 1.17; the node lifecycle controller marks a node whose Lease stops Unknown), and
    everything the bench made is deleted by ``cleanup``."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.admin = KubeClient(load_config(kubeconfig), qps=5000, burst=5000)
        self._leases: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def register(self, names: list[str]) -> None:
        """Each node, its Ready status (the status subresource) and its Lease, then renewed every 10 s."""
        def one(name: str) -> None:
            body = node_body(name)
            body["metadata"]["labels"][BENCH_LABEL] = "true"
            status = body.pop("status")
            created = self.admin.create(NODES, body)
            self.admin.patch(NODES, name, {"status": status}, subresource="status")
            self._leases[name] = self.admin.create(LEASES, {"metadata": {"name": name, "namespace": NODE_LEASES,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                     "uid": created["metadata"]["uid"]}]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_now()}}, NODE_LEASES)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, names))
        self._renewer = threading.Thread(target=self._renew, daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        with ThreadPoolExecutor(4) as pool:
            while not self._stop.wait(10.0):
                list(pool.map(self._renew_one, list(self._leases)))

    def _renew_one(self, name: str) -> None:
        lease = self._leases[name]
        lease["spec"]["renewTime"] = micro_now()
        try:
            self._leases[name] = self.admin.replace(LEASES, name, lease, NODE_LEASES)
        except Exception as exc:  # a 409 or a lost reply: read it again for the next round
            log(f"lease {name}: {exc}")
            with contextlib.suppress(Exception):
                self._leases[name] = self.admin.get(LEASES, name, NODE_LEASES)

    def metrics(self) -> str:
        return raw_get(self.kubeconfig, "/metrics")

    def stop(self) -> None:
        self._stop.set()
        self.cleanup(self.admin)

    @staticmethod
    def cleanup(admin: KubeClient) -> None:
        """The bench's nodes (their Leases go with them: owner references), team namespaces (their pods and
        PDBs go with them) and the controller's Jobs, so a later e2e run meets none of them."""
        nodes = admin.list(NODES, label_selector=BENCH_LABEL)["items"]
        teams = [n for n in admin.list(NAMESPACES)["items"] if n["metadata"]["name"].startswith("team-")]
        log(f"cleanup: {len(nodes)} nodes, {len(teams)} namespaces")
        for ns in teams:  # pods first, at once (no kubelet finishes a graceful deletion)
            for pod in admin.list(PODS, ns["metadata"]["name"])["items"]:
                with contextlib.suppress(Exception):
                    admin.delete(PODS, pod["metadata"]["name"], ns["metadata"]["name"], grace_period_seconds=0)
            with contextlib.suppress(Exception):
                admin.delete(NAMESPACES, ns["metadata"]["name"])
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: admin.delete(NODES, n["metadata"]["name"]), nodes))
        with contextlib.suppress(Exception):
            for job in admin.list(JOBS, "gpuremediate-jobs", label_selector="gpuremediate.io/job")["items"]:
                admin.delete(JOBS, job["metadata"]["name"], "gpuremediate-jobs", propagation_policy="Background")


def micro_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1e6) % 1000000:06d}Z"


def raw_get(kubeconfig: str, path: str) -> str:
    """GET ``path`` of the API server as text (its /metrics)."""
    config = load_config(kubeconfig)
    request = urllib.request.Request(config.server.rstrip("/") + path,
                                     headers={"Authorization": config.authorization() or ""})
    with urllib.request.urlopen(request, context=config.ssl_context(), timeout=30) as response:
        return response.read().decode()


LATENCY_OF = (("PATCH", "nodes", ""), ("POST", "pods", "eviction"), ("POST", "events", ""), ("GET", "pods", ""),
              ("PATCH", "nodes", "status"))


def histograms(text: str) -> dict[tuple[str, str, str], dict[float, float]]:
    """``apiserver_request_duration_seconds`` buckets by (verb, resource, subresource), cumulative counts."""
    out: dict[tuple[str, str, str], dict[float, float]] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_duration_seconds_bucket{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.rindex("}")]))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        le = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
        bucket = out.setdefault(key, {})
        bucket[le] = bucket.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The bucket bound under which fraction ``q`` of the requests finished (Prometheus' histogram_quantile
    without the interpolation: an upper bound)."""
    total = buckets.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return le
    return None


def server_figures(before: str, after: str) -> dict[str, Any]:
    b, a = histograms(before), histograms(after)
    out: dict[str, Any] = {}
    for verb, resource, sub in LATENCY_OF:
        key = (verb, resource, sub)
        delta = {le: n - b.get(key, {}).get(le, 0.0) for le, n in a.get(key, {}).items()}
        if delta.get(float("inf"), 0.0) > 0:
            name = f"{verb} {resource}{'/' + sub if sub else ''}"
            out[name] = {"requests": int(delta[float("inf")]),
                         **{f"p{int(q * 100)}_le_s": quantile(delta, q) for q in (0.5, 0.9, 0.99)}}

    def rejected(text: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("apiserver_flowcontrol_rejected_requests_total{"))

    return {"apiserver_latency": out, "apf_rejected": int(rejected(after) - rejected(before))}


def node_body(name: str) -> dict[str, Any]:
    """A GPU node as a kubelet reports one (its image list included: the informer must not keep it)."""
    images = [{"names": [f"registry.example.com/team/image-{i}@sha256:{i:064x}"], "sizeBytes": 10**9 + i}
              for i in range(40)]
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"bootID": f"boot-{name}"}, "images": images}}


class BurstSource:
    """Every node's readings; ``begin()`` makes the chosen nodes faulty one by one over ``spread`` seconds (not
    ``start``: the detect loop starts a source that has one, which began the burst with the controller)."""

    def __init__(self, nodes: list[str], faulty: list[str], spread: float) -> None:
        self.nodes, self.faulty, self.spread = nodes, faulty, spread
        self.t0: float | None = None
        self.has: dict[str, float] = {}  # node -> when its fault became readable (time.time())
        self._lock = threading.Lock()

    def begin(self) -> None:
        self.t0 = time.time()

    def _faulty_now(self) -> set[str]:
        if self.t0 is None:
            return set()
        now = time.time()
        step = self.spread / max(1, len(self.faulty))
        with self._lock:
            for i, name in enumerate(self.faulty):
                at = self.t0 + i * step
                if at <= now:
                    self.has.setdefault(name, max(at, self.t0))
            return set(self.has)

    def read(self) -> list[NodeReadings]:
        faulty = self._faulty_now()
        return [NodeReadings(node=n, source="burst", status=SOURCE_OK, gpus=tuple(
            GpuReading(node=n, gpu=str(g), uuid=f"GPU-{n}-{g}", xid=79 if (n in faulty and g == 0) else None)
            for g in range(8))) for n in self.nodes]


class ConditionBurst(BurstSource):
    """``--conditions``: the readings stay healthy; ``begin()`` starts a thread that writes the node agents'
    condition (``KernelDeadlock=True``, a rule of the policy cordons for it) on the chosen nodes one by one over
    ``spread`` seconds, as the agents publish at their own phases: "the source has it" is the moment the API server
    answered the condition's write."""

    def __init__(self, client: KubeClient, nodes: list[str], faulty: list[str], spread: float) -> None:
        super().__init__(nodes, faulty, spread)
        self.client = client

    def begin(self) -> None:
        self.t0 = time.time()
        threading.Thread(target=self._publish, name="agents", daemon=True).start()

    def _publish(self) -> None:
        assert self.t0 is not None
        step = self.spread / max(1, len(self.faulty))
        for i, name in enumerate(self.faulty):
            time.sleep(max(0.0, self.t0 + i * step - time.time()))
            cond = build_condition(None, "KernelDeadlock", "True", "Hung", "task blocked (bench)", time.time())
            self.client.patch(NODES, name, conditions_patch([cond]), patch_type="strategic", subresource="status")
            with self._lock:
                self.has[name] = time.time()

    def _faulty_now(self) -> set[str]:
        return set()


CONDITION_RULE = '[[conditions.rules]]\ntype = "KernelDeadlock"\nstatus = "True"\naction = "cordon"\n'

GROUP = 6  # a PDB group: three pods on faulted nodes, three partners on healthy ones


class Workload:
    """The drain burst's pods and PDBs, and which of them may be evicted."""

    def __init__(self, faulty: list[str], healthy: list[str], pods: int, namespaces: int) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.pdbs: list[dict[str, Any]] = []
        self.may_go: set[tuple[str, str]] = set()  # pods on faulted nodes that their PDB (if any) lets go
        self.must_stay: set[tuple[str, str]] = set()  # 0-allowed groups' pods, and every pod on a healthy node
        in_groups = pods // 3 // (GROUP // 2) * (GROUP // 2)
        for i in range(pods):
            group = i // (GROUP // 2) if i < in_groups else None
            ns, node = f"team-{(i if group is None else group) % namespaces:03d}", faulty[i % len(faulty)]
            blocked = group is not None and group % 10 == 0
            self._pod(f"train-{i:05d}", ns, node, group, (self.must_stay if blocked else self.may_go))
            if group is not None and i % (GROUP // 2) == 0:
                for k in range(GROUP // 2):  # the group's partners, on healthy nodes
                    self._pod(f"partner-{group:05d}-{k}", ns, healthy[(group * 3 + k) % len(healthy)], group,
                              self.must_stay)
                self.pdbs.append({"metadata": {"name": f"group-{group:05d}", "namespace": ns}, "spec": {
                    "minAvailable": GROUP if blocked else GROUP // 2,
                    "selector": {"matchLabels": {"group": f"{group:05d}"}}}})

    def _pod(self, name: str, ns: str, node: str, group: int | None, kind: set[tuple[str, str]]) -> None:
        labels = {"app": "train"} | ({"group": f"{group:05d}"} if group is not None else {})
        self.bodies.append({"metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 0,  # no kubelet finishes a graceful deletion here
            "containers": [{"name": "main", "image": "registry.example.com/train:1"}]}})
        kind.add((ns, name))

    def create(self, admin: KubeClient) -> None:
        ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}

        def one(body: dict[str, Any]) -> None:
            meta = body["metadata"]
            admin.create(PODS, body, meta["namespace"])
            admin.patch(PODS, meta["name"], {"status": ready}, meta["namespace"], subresource="status")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, self.bodies))
            list(pool.map(lambda pdb: admin.create(PDBS, pdb, pdb["metadata"]["namespace"]), self.pdbs))


def watch_deletions(client: KubeClient, gone: dict[tuple[str, str], float], stop: threading.Event) -> None:
    """When each pod left the API server, as its DELETED event arrives here."""
    rv = client.list_page(PODS, None, limit=1)["metadata"]["resourceVersion"]
    while not stop.is_set():
        try:
            for event in client.watch(PODS, None, resource_version=rv, timeout_seconds=30):
                meta = event.object.get("metadata", {})
                rv = meta.get("resourceVersion", rv)
                if event.type == "DELETED":
                    gone.setdefault((meta.get("namespace", ""), meta.get("name", "")), time.time())
                if stop.is_set():
                    return
        except Exception as exc:  # a watch that ended: resume
            log(f"pod watch: {exc}")


def count_evictions(client: KubeClient) -> Counter[tuple[str, int]]:
    """Each eviction the controller sends, by pod path and the status it got back."""
    answers: Counter[tuple[str, int]] = Counter()
    attempt = client._attempt

    def counted(method: str, path: str, *rest: Any) -> Any:
        conn, response = attempt(method, path, *rest)
        if method == "POST" and path.endswith("/eviction"):
            answers[(path, response.status)] += 1
        return conn, response

    client._attempt = counted  # type: ignore[method-assign,assignment]
    return answers


def drain_figures(work: Workload, gone: dict[tuple[str, str], float],
                  answers: Counter[tuple[str, int]]) -> dict[str, Any]:
    went = sorted(gone[p] for p in work.may_go if p in gone)
    by_status: Counter[int] = Counter()
    successes: Counter[str] = Counter()
    for (path, status), n in answers.items():
        by_status[status] += n
        if status == 201:
            successes[path] += n
    return {
        "pods_may_go": len(work.may_go), "pods_gone": len(went), "pdbs": len(work.pdbs),
        "evictions_per_s": round((len(went) - 1) / (went[-1] - went[0]), 1) if len(went) > 1 else None,
        "drain_span_s": round(went[-1] - went[0], 1) if went else None,
        "eviction_answers": {str(k): v for k, v in sorted(by_status.items())},
        "pods_evicted_twice": sum(1 for n in successes.values() if n > 1),
        "gone_that_must_stay": sum(1 for p in work.must_stay if p in gone),
    }


def watch_cordons(client: KubeClient, seen: dict[str, float], stop: threading.Event) -> None:
    """Each node's first cordon, as its watch event arrives here."""
    listed = client.list(NODES)
    rv = listed["metadata"]["resourceVersion"]
    while not stop.is_set():
        try:
            for event in client.watch(NODES, resource_version=rv, timeout_seconds=30):
                obj = event.object
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if (obj.get("spec") or {}).get("unschedulable"):
                    seen.setdefault(obj["metadata"]["name"], time.time())
                if stop.is_set():
                    return
        except Exception as exc:  # a watch that ended: resume
            log(f"watch: {exc}")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(os.environ.get("BENCH_BURST_DIR", "/tmp/gpuremediate-bench-burst"))
    workdir.mkdir(parents=True, exist_ok=True)
    server: Emulator | RealServer = RealServer(args.kubeconfig) if args.kubeconfig else Emulator(workdir)
    try:
        config = load_config(server.kubeconfig)
        admin = KubeClient(config, qps=5000, burst=5000)
        for ns in (NAMESPACE, "gpuremediate-jobs", "gpu-operator"):
            with contextlib.suppress(errors.AlreadyExists):
                admin.create(NAMESPACES, {"metadata": {"name": ns}})
        names = [f"gpu-{i:05d}" for i in range(args.nodes)]
        log(f"creating {len(names)} nodes")
        if isinstance(server, RealServer):
            server.register(names)
        else:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda n: admin.create(NODES, node_body(n)), names))
        step = max(1, len(names) // args.faults)
        faulty = names[::step][:args.faults]
        work: Workload | None = None
        if args.drain:
            faulty_set = set(faulty)
            work = Workload(faulty, [n for n in names if n not in faulty_set], args.pods, args.namespaces)
            for k in range(args.namespaces):
                with contextlib.suppress(errors.AlreadyExists):
                    admin.create(NAMESPACES, {"metadata": {"name": f"team-{k:03d}"}})
            for k in range(args.namespaces):  # pods are refused until the ServiceAccount controller made it
                wait_for(functools.partial(admin.get, SERVICEACCOUNTS, "default", f"team-{k:03d}"), 60,
                         f"ServiceAccount team-{k:03d}/default")
            log(f"creating {len(work.bodies)} pods, {len(work.pdbs)} PDBs")
            work.create(admin)
        source = ConditionBurst(admin, names, faulty, args.spread) if args.conditions else \
            BurstSource(names, faulty, args.spread)
        # raised: a burst under test, not a storm to stop: no storm look either (issue 49: it would hold the burst)
        breaker = ("threshold_percent = 99\nlook_s = 0\n" if args.breaker == "raised" else "")
        budget = "100%" if args.drain else "0"
        rules = CONDITION_RULE if args.conditions else ""
        policy = loads_policy(f'[budget]\nmax_unavailable = "{budget}"\n[breaker]\n{breaker}{rules}', "burst-policy")
        settings = Settings(namespace=NAMESPACE, scrape_interval_s=args.interval, resync_s=10.0,
                            qps=args.qps, burst=args.burst)
        client = KubeClient(config, qps=args.qps, burst=args.burst)
        sent = count_requests(client)
        answers = count_evictions(client)
        controller = Controller(settings, policy, client=client, source=source)
        seen: dict[str, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=watch_cordons, args=(admin, seen, stop), daemon=True)
        watcher.start()
        gone: dict[tuple[str, str], float] = {}
        if work is not None:
            threading.Thread(target=watch_deletions, args=(admin, gone, stop), daemon=True).start()
        assert controller.start_caches(300), "node cache did not sync"
        controller.start_loops()
        time.sleep(2 * args.interval)  # a quiet cycle or two first
        requests_before = Counter(sent)
        metrics_before = server.metrics() if isinstance(server, RealServer) else ""
        cpu0 = time.process_time()
        server_cpu0 = server.cpu_s() if isinstance(server, Emulator) else 0.0
        burst_t0 = time.time()
        log(f"burst: {len(faulty)} of {len(names)} nodes fault over {args.spread:g} s")
        source.begin()
        deadline = time.time() + args.spread + args.timeout
        expect = len(faulty) if args.breaker == "raised" else None
        opened_at: float | None = None
        while time.time() < deadline:
            if opened_at is None and controller.ctx.breakers.latest().is_open:
                opened_at = time.time()
            if expect is not None and len(seen) >= expect and (
                    work is None or sum(1 for p in work.may_go if p in gone) >= len(work.may_go)):
                break
            if expect is None and controller.ctx.breakers.latest().is_open and time.time() > (
                    source.t0 or 0) + args.spread + 3 * args.interval:
                break
            time.sleep(0.2)
        cpu = time.process_time() - cpu0
        burst_wall = time.time() - burst_t0
        server_cpu = server.cpu_s() - server_cpu0 if isinstance(server, Emulator) else None
        time.sleep(1.0)
        stop.set()
        controller.stop()
        requests = Counter(sent) - requests_before
        lags = [seen[n] - source.has[n] for n in seen if n in source.has]
        stamps = sorted(seen[n] for n in seen if n in source.has)
        result: dict[str, Any] = {
            "nodes": len(names), "faults": len(faulty), "spread_s": args.spread, "breaker": args.breaker,
            "through": "node conditions" if args.conditions else "readings", "interval_s": args.interval,
            "qps": args.qps, "burst": args.burst, "cordoned": len(stamps),
            "cordon_p50_s": round(percentile(lags, 50), 2), "cordon_p90_s": round(percentile(lags, 90), 2),
            "cordon_max_s": round(max(lags), 2) if lags else None,
            "cordons_per_s": round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 1) if len(stamps) > 1 else None,
            "cpu_s": round(cpu, 1), "requests": dict(sorted(requests.items())),
            # the emulator's CPU over the burst, as a share of one core: near 1.0 it is the bound, not the controller
            "emulator_cpu_s": round(server_cpu, 1) if server_cpu is not None else None,
            "emulator_core_share": round(server_cpu / burst_wall, 2) if server_cpu is not None else None,
            "breaker_open": controller.ctx.breakers.latest().is_open,
            "breaker_reason": controller.ctx.breakers.latest().reason,
            "look": look_figures(controller.ctx.breakers.latest().look),
            "load": os.getloadavg()[0],
        }
        if work is not None:
            result |= drain_figures(work, gone, answers)
        if isinstance(server, RealServer):
            result |= server_figures(metrics_before, server.metrics())
        if args.breaker == "default":
            result["cordoned_past_threshold"] = max(0, len(stamps) - int(0.30 * len(names)))
            # the storm is readable from source.t0 on (all of it with --spread 0): how long until the breaker
            # opened (polled every 0.2 s here)
            result["breaker_open_after_s"] = (round(opened_at - (source.t0 or opened_at), 2)
                                              if opened_at is not None else None)
        return result
    finally:
        server.stop()


def look_figures(look: Look | None) -> dict[str, Any] | None:
    """The breaker's last storm look (issue 49): how many faults it held, for how long, how it ended."""
    if look is None:
        return None
    return {"held": len(look.nodes), "outcome": look.outcome or "looking",
            "lasted_s": round(look.ended_at - look.opened_at, 1) if look.ended_at is not None else None}


def resource_of(path: str) -> str:
    """``/api/v1/nodes/n1/status`` → ``nodes/status``; ``/api/v1/namespaces/ns/events`` → ``events``."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        parts = parts[parts.index("namespaces") + 2:]
    else:
        parts = parts[3:] if parts[:1] == ["apis"] else parts[2:]
    return parts[0] + (f"/{parts[2]}" if len(parts) > 2 else "") if parts else path


def count_requests(client: KubeClient) -> Counter[str]:
    """The requests ``client`` sends, by method and resource (retries included), counted as they go."""
    sent: Counter[str] = Counter()
    attempt = client._attempt

    def counted(method: str, path: str, *rest: Any) -> Any:
        sent[f"{method} {resource_of(path)}"] += 1
        return attempt(method, path, *rest)

    client._attempt = counted  # type: ignore[method-assign,assignment]
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--faults", type=int, default=750)
    parser.add_argument("--spread", type=float, default=10.0, help="seconds over which the faults appear")
    parser.add_argument("--breaker", choices=("raised", "default"), default="raised")
    parser.add_argument("--interval", type=float, default=5.0, help="the controller's --scrape-interval")
    parser.add_argument("--qps", type=float, default=Settings.qps, help="the controller's --kube-api-qps")
    parser.add_argument("--burst", type=int, default=Settings.burst, help="the controller's --kube-api-burst")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--drain", action="store_true", help="the drain burst: pods and PDBs on the faulted nodes")
    parser.add_argument("--conditions", action="store_true",
                        help="the faults come as the node agents' conditions (KernelDeadlock), not in the readings")
    parser.add_argument("--pods", type=int, default=10000, help="--drain: pods on the faulted nodes")
    parser.add_argument("--namespaces", type=int, default=100, help="--drain: team namespaces the pods are in")
    parser.add_argument("--kubeconfig", help="a real control plane instead of the emulator")
    parser.add_argument("--cleanup", action="store_true", help="with --kubeconfig: delete what a run left, only")
    args = parser.parse_args()
    if args.cleanup:
        RealServer.cleanup(KubeClient(load_config(args.kubeconfig), qps=5000, burst=5000))
        return 0
    result = run(args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
