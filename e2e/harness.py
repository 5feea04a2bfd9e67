"""The e2e harness: one small ``Cluster`` API that every scenario suite uses, on three targets.

Target (env ``GPUREMEDIATE_E2E_TARGET``):

- ``emulator`` (default): ``sim.cluster.SimCluster`` runs in the test process (API emulator, gpu-sim,
  node simulator); the controller runs as a SUBPROCESS (``python -m gpuremediate run``) with a
  per-scenario policy file, scrape/resync ``EmulatorCluster.INTERVAL_S``, JSON logs captured.
  (Set ``GPUREMEDIATE_E2E_INTERVAL`` to change that interval.)
- ``apiserver``: a bare control plane at ``KUBECONFIG`` (kube-apiserver + kube-controller-manager +
  kube-scheduler, no kubelets: the envtest/KWOK way). As ``emulator``, but the API server is that
  one: NodeSim plays the kubelets and gpu-sim the exporters in this process (the agents and the GPU
  Operator's operands too, where a scenario asks), the controller is a subprocess that reaches the server
  through a recording proxy (e2e/proxy.py: the audit of its requests); the CRDs of manifests/crds and the
  ServiceAccounts of manifests/base are installed; each scenario starts by cleaning what earlier ones left
  (pods force-deleted with grace 0, since no kubelet finishes a deletion). Only the controller's Events
  are read. Every scenario runs there. See e2e/README.md.
- ``kubeconfig``: any cluster with manifests/overlays/kind applied (``e2e/kind/run.sh``);
  everything goes through the API (faults via the pod proxy to gpu-sim, metrics via the service
  proxy, the controller by scaling its Deployment between 0 and 1 with the scenario's policy in
  its ConfigMap; every scenario starts with fresh gpu-sim pods and no leftovers). Scenarios needing
  in-process control call ``cluster.require(...)`` and are skipped there with the reason.

Fixtures (e2e/conftest.py): ``cluster`` — a fresh, started cluster per test, controller NOT yet
started; on failure the controller's log tail is printed. A scenario that needs a differently simulated
world makes its own with ``make_cluster(tmp, agents=True | gpu_operator=True | products=...)``; on a
target other than the emulator, a scenario that starts an API server of its own fails.

The API (``c`` is the ``cluster`` fixture)::

    c.nodes                                   # GPU node names, sorted
    c.start_controller(policy=None, dry_run=False)  # policy: {"drain": {"mode": ...}} merged over BASE_POLICY
    c.stop_controller(); c.kill_controller(); c.restart_controller()   # SIGTERM / SIGKILL / kill+start
    c.metrics() -> Metrics                    # .value(name, **labels) sums matching samples (0.0 if none)
    c.wait_metric(name, want, **labels) -> Metrics  # a counter moves after its write and Event: wait for it
    c.controller_log() -> str                 # what the controller logged so far (all runs)
    c.log_problems() -> list[str]             # after stop_controller(): tracebacks, non-zero exit on SIGTERM
    c.conflicts_met() -> int                  # the controller's node writes that met a 409 (busy cluster)
    c.inject(node, gpu, fault, value=None)    # gpu-sim faults: xid|dbe|row-remap-failure|row-remap-pending|temp|...
    c.reset_gpu(node, gpu); c.exporter_down(node, mode="refuse"); c.exporter_up(node)
    c.set_validation(node, ok)                # in-process NodeSim targets (c.require skips on kubeconfig)
    c.audit_mark() / c.mutations_since(mark)  # the controller's mutating requests (no Events/status): the
                                              # emulator's audit, or apiserver's recording proxy
    c.add_node(name, gpus=8)                  # a node joining mid-scenario (deleted after it on apiserver)
    c.uninstall_crd("plural.group")           # a cluster without that CRD (apiserver reinstalls it after)
    c.job_runs(node, kind) -> int             # Job pods of that kind that ran on the node
    c.workload(name, node, gpus=1, labels=None) -> pod;  c.pdb(name, selector, min_available=1)
    c.dra_workload(name, node, gpu) -> pod    # holds GPU ``gpu`` through a ResourceClaim (make_cluster(tmp, dra=True))
    c.set_pdb_min_available(name, value)
    c.node(name) -> dict; c.record(name) -> NodeRecord | None; c.state(name) -> str ("healthy" if untouched)
    c.label(name) -> str | None (the gpuremediate.io/state label); c.unschedulable(name) -> bool
    c.cordon(name) / c.uncordon(name)         # as a person would (kubectl cordon/uncordon)
    c.set_label(name, key, value|None)
    c.events(node) -> list[dict]; c.event_reasons(node) -> list[str]  (oldest first)
    c.wait_event(node, reason, text="")      # wait for an Event (written after the node write it reports)
    c.evicted() -> set["ns/name"]             # workload pods disrupted (deletionTimestamp set or deleted)
    c.jobs(node=None, kind=None) -> list[dict]  # repair/validation Jobs (label gpuremediate.io/job = kind)
    c.cli(*args) -> CompletedProcess          # `gpuremediate ARGS --kubeconfig ...`
    c.wait(predicate, timeout, describe, seen=None)   # timeouts scaled for the target
    with c.invariant(check, describe): ...    # check() -> problem text | None, polled all along; fails at exit

``wait_for`` is also usable alone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpuremediate.actions.budget_claims import BUDGET_CONFIGMAP
from gpuremediate.actions.dry_run_journal import JOURNAL_CONFIGMAP
from gpuremediate.actions.nodes import EVENT_REASONS
from gpuremediate.actions.operands import OPERAND_ANNOTATION
from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import (
    CONFIGMAPS,
    CRDS,
    DAEMONSETS,
    DEPLOYMENTS,
    EVENTS,
    JOBS,
    LEASES,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    SECRETS,
    SERVICEACCOUNTS,
    Resource,
)
from gpuremediate.obs.event_queue import COMPONENT as EVENT_COMPONENT
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals import exposition
from gpuremediate.state.maintenance import CLAIM_ANNOTATION
from gpuremediate.vocab.record import NodeRecord, RecordError, record_from_node
from sim.waiting import wait_for

if TYPE_CHECKING:
    from e2e.ledger import Ledger, Made
    from e2e.proxy import RecordingProxy

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD_NS = "workloads"
SYSTEM_NS = "gpuremediate-system"
JOBS_NS = "gpuremediate-jobs"
EXPORTER_NS = "gpu-operator"
STATE_LABEL = "gpuremediate.io/state"
JOB_LABEL = "gpuremediate.io/job"
BREAKER_CONFIGMAP = "gpuremediate-breaker"
NOTIFICATIONS_SECRET = "gpuremediate-notifications"  # [notifications].secret's default: a scenario's webhook URL
METRIC_WAIT_S = 5.0  # a metric's wait for the counter to catch up with what was seen (scaled by slow)
CONFLICT_LOG_TEXT = "changed since read"  # gpuremediate.actions: a node patch that met 409 Conflict

# Short timers for every scenario; a scenario's own sections are merged over these.
BASE_POLICY: dict[str, dict[str, Any]] = {
    "thermal": {"hold_s": 0, "clear_hold_s": 1.0},
    "drain": {"retry_s": 0.3, "timeout_s": 30},
    "remediation": {"max_attempts": 2, "reboot_ready_timeout_s": 20},
    "remediation.reset_gpu": {"timeout_s": 20},
    "remediation.reboot": {"timeout_s": 20},
    "validation.job": {"timeout_s": 20},
    "budget": {"max_unavailable": "1"},
}


class E2EError(AssertionError):
    """A wait timed out or the harness could not do what a scenario asked."""


# ---- waiting ------------------------------------------------------------------------------------


def holds_for(
    predicate: Callable[[], object],
    seconds: float,
    describe: str,
    *,
    seen: Callable[[], object] | None = None,
    interval: float = 0.05,
) -> None:
    """Poll ``predicate`` for ``seconds``; fail at the first falsy value, naming what should have held and
    what was seen (``seen()`` if given, else the predicate's value). "Nothing happens" checked throughout a
    period, not at its last instant."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if not value:
            observed = seen() if seen is not None else value
            raise E2EError(f"{describe} stopped holding after "
                           f"{seconds - max(0.0, deadline - time.monotonic()):.2f}s; seen: {observed!r}")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


# ---- policy -------------------------------------------------------------------------------------


def policy_toml(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """BASE_POLICY merged with ``sections`` ({"drain": {"mode": "AllowCompletion"}, ...}) as TOML."""
    merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in BASE_POLICY.items()}
    for table, values in sections.items():
        merged.setdefault(table, {}).update(values)
    lines: list[str] = []
    for table, values in merged.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):  # label lists, ladders, [[conditions.rules]] as inline tables
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"policy value {value!r}: expected bool, number, string, array or table")


# ---- metrics ------------------------------------------------------------------------------------


class Metrics:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = exposition.parse(text).samples

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels`` (0.0 when none)."""
        total = 0.0
        for sample in self.samples:
            if sample.name == name and all(sample.label(k) == v for k, v in labels.items()):
                total += sample.value
        return total

    def has(self, name: str, **labels: str) -> bool:
        return any(s.name == name and all(s.label(k) == v for k, v in labels.items()) for s in self.samples)


# ---- the cluster --------------------------------------------------------------------------------


class Cluster:
    """What both targets share: everything done through the Kubernetes API."""

    target = "base"
    slow = 1.0  # timeouts are multiplied by this (a real cluster is slower than the emulator)
    simulated_nodes = False  # NodeSim plays the kubelets in this process (a reboot gets a new bootID)

    def __init__(self) -> None:
        self.nodes: list[str] = []
        self._kube: KubeClient | None = None
        self._pods: Informer | None = None
        self._evicted: set[str] = set()
        self._evicted_lock = threading.Lock()

    # -- to implement per target
    def start(self) -> Cluster:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start_controller(self, policy: Mapping[str, Mapping[str, Any]] | None = None, *,
                         dry_run: bool = False) -> None:
        raise NotImplementedError

    def stop_controller(self) -> None:
        raise NotImplementedError

    def kill_controller(self) -> None:
        raise NotImplementedError

    def restart_controller(self) -> None:
        raise NotImplementedError

    def metrics_text(self) -> str:
        raise NotImplementedError

    def controller_log(self) -> str:
        raise NotImplementedError

    def controller_stacks(self) -> str:
        """The running controller's thread stacks ("" where it does not run here): for a failure's report."""
        return ""

    def gpusim(self, node: str, endpoint: str, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def set_validation(self, node: str, ok: bool) -> None:
        raise NotImplementedError

    def kubeconfig_args(self) -> list[str]:
        raise NotImplementedError

    def require(self, what: str) -> None:
        """Skip the scenario on a target that cannot do ``what`` (emulator can do everything)."""

    def log_problems(self) -> list[str]:
        """Tracebacks in the controller's log, unclean exits (emulator; elsewhere the log is not all ours)."""
        return []

    def conflicts_met(self) -> int:
        """How many of the controller's guarded node writes met a 409 (its log says each one)."""
        return sum(1 for line in self.controller_log().splitlines() if CONFLICT_LOG_TEXT in line)

    def add_node(self, name: str, gpus: int = 8) -> None:
        """A GPU node that joins the cluster mid-scenario (no exporter serves it)."""
        self.require("add a node to the cluster")

    def uninstall_crd(self, name: str) -> None:
        """The CustomResourceDefinition ``name`` (plural.group) gone and its kind no longer served, for a
        scenario about a cluster without it (absent already: nothing to do)."""
        try:
            crd = self.kube.get(CRDS, name)
        except errors.NotFound:
            return
        res = crd_resource(crd)
        with contextlib.suppress(errors.NotFound):
            self.kube.delete(CRDS, name)
        self.wait(lambda: not _served(self.kube, res), 20, f"the {res.kind} CRD {name} gone")

    def audit_mark(self) -> int:
        self.require("read the API server's audit of requests")
        return 0

    def mutations_since(self, mark: int) -> list[tuple[str, ...]]:
        self.require("read the API server's audit of requests")
        return []

    def job_runs(self, node: str, kind: str) -> int:
        """How many times a Job of ``kind`` ran on ``node``: its pods (a Job's retries included)."""
        jobs = {j["metadata"]["name"] for j in self.jobs(node, kind)}
        pods = self.kube.list(PODS, JOBS_NS, label_selector=JOB_LABEL)["items"]
        return sum(1 for p in pods if (p["metadata"].get("labels") or {}).get("job-name") in jobs)

    # -- shared
    @property
    def kube(self) -> KubeClient:
        assert self._kube is not None, "start() the cluster first"
        return self._kube

    def metrics(self) -> Metrics:
        return Metrics(self.metrics_text())

    def wait_metric(self, name: str, want: float, /, **labels: str) -> Metrics:
        """The controller's metrics once ``name`` (summed over the samples with ``labels``) reads ``want``.
        A counter moves after the write it counts, and after the Event that reports it (faults_total once the
        record write landed; a histogram after the node write): a scenario that saw the write or the Event
        waits for its metric instead of racing it. Returns the reading that matched."""
        seen: list[float] = []

        def matched() -> Metrics | None:
            m = self.metrics()
            seen.append(m.value(name, **labels))
            return m if seen[-1] == want else None

        shown = ",".join(f"{k}={v}" for k, v in labels.items())
        found = self.wait(matched, METRIC_WAIT_S, f"{name}{{{shown}}} = {want:g}", seen=lambda: seen[-1:])
        assert found is not None
        return found

    def wait(self, predicate: Callable[[], T], timeout: float, describe: str, *,
             seen: Callable[[], object] | None = None) -> T:
        return wait_for(predicate, timeout * self.slow, describe, seen=seen)

    def holds(self, predicate: Callable[[], object], seconds: float, describe: str, *,
              seen: Callable[[], object] | None = None) -> None:
        """``predicate`` stays true for ``seconds`` (not scaled by ``slow``: a hold, not a deadline)."""
        holds_for(predicate, seconds, describe, seen=seen)

    def _watch_pods(self) -> None:
        self._pods = Informer(self.kube, PODS, namespace=WORKLOAD_NS)
        self._pods.add_handler(on_update=lambda _old, new: self._note_pod(new, deleted=False),
                               on_delete=lambda old: self._note_pod(old, deleted=True))
        self._pods.start()
        if not self._pods.wait_for_sync(10 * self.slow):
            raise E2EError("the workload pod watch did not sync")

    def _note_pod(self, pod: Mapping[str, Any], *, deleted: bool) -> None:
        meta = pod.get("metadata") or {}
        if deleted or meta.get("deletionTimestamp"):
            with self._evicted_lock:
                self._evicted.add(f"{meta.get('namespace')}/{meta.get('name')}")

    def _stop_pod_watch(self) -> None:
        if self._pods is not None:
            self._pods.stop()
            self._pods = None

    # faults
    def inject(self, node: str, gpu: int, fault: str, value: float | None = None) -> None:
        body: dict[str, Any] = {"node": node, "gpu": gpu, "fault": fault}
        if value is not None:
            body["value"] = value
        self.gpusim(node, "inject", body)

    def reset_gpu(self, node: str, gpu: int) -> None:
        self.gpusim(node, "reset", {"node": node, "gpu": gpu})

    def exporter_down(self, node: str, mode: str = "refuse") -> None:
        self.gpusim(node, "down", {"node": node, "mode": mode})

    def exporter_up(self, node: str) -> None:
        self.gpusim(node, "down", {"node": node, "mode": None})

    # workloads
    def workload(self, name: str, node: str, *, gpus: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        return self.kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOAD_NS, "labels": labels or {"app": name}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": self.workload_image(), "resources": resources}]},
        }, WORKLOAD_NS)

    def workload_image(self) -> str:
        return "cuda:sample"

    def dra_workload(self, name: str, node: str, gpu: int) -> dict[str, Any]:
        """A pod on ``node`` holding GPU ``gpu`` through a ResourceClaim of its own name, allocated as kube-scheduler
        would (``make_cluster(tmp, dra=True)``: NodeSim publishes the slices)."""
        from sim.dra_claims import run_on_gpu
        from sim.nodesim_dra import device_name

        pod, _claim = run_on_gpu(self.kube, name, WORKLOAD_NS, node, device_name(gpu), labels={"app": name})
        return pod

    def pdb(self, name: str, selector: dict[str, str], *, min_available: int | str = 1) -> dict[str, Any]:
        return self.kube.create(PDBS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": WORKLOAD_NS},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}},
        }, WORKLOAD_NS)

    def set_pdb_min_available(self, name: str, value: int | str) -> None:
        self.kube.patch(PDBS, name, {"spec": {"minAvailable": value}}, WORKLOAD_NS)

    def pod_exists(self, name: str) -> bool:
        try:
            pod = self.kube.get(PODS, name, WORKLOAD_NS)
        except errors.NotFound:
            return False
        return not (pod.get("metadata") or {}).get("deletionTimestamp")

    def evicted(self) -> set[str]:
        with self._evicted_lock:
            return set(self._evicted)

    # nodes
    def node(self, name: str) -> dict[str, Any]:
        return self.kube.get(NODES, name)

    def record(self, name: str) -> NodeRecord | None:
        rec = record_from_node(self.node(name))
        if isinstance(rec, RecordError):
            raise E2EError(f"{name}: record unreadable: {rec}")
        return rec

    def state(self, name: str) -> str:
        rec = self.record(name)
        return rec.state if rec is not None else "healthy"

    def label(self, name: str) -> str | None:
        return ((self.node(name).get("metadata") or {}).get("labels") or {}).get(STATE_LABEL)

    def unschedulable(self, name: str) -> bool:
        return bool((self.node(name).get("spec") or {}).get("unschedulable", False))

    def cordon(self, name: str) -> None:
        self.kube.patch(NODES, name, {"spec": {"unschedulable": True}})

    def uncordon(self, name: str) -> None:
        self.kube.patch(NODES, name, {"spec": {"unschedulable": None}})

    def set_label(self, name: str, key: str, value: str | None) -> None:
        self.kube.patch(NODES, name, {"metadata": {"labels": {key: value}}})

    def wait_state(self, name: str, state: str, timeout: float = 15.0) -> NodeRecord:
        def reached() -> NodeRecord | None:
            rec = self.record(name)
            return rec if rec is not None and rec.state == state else None

        rec = self.wait(reached, timeout, f"{name} to reach {state}", seen=lambda: self.summary(name))
        assert rec is not None
        # The transition's Event is written right after the node: wait for it too, so that a scenario's
        # Event assertions do not race the controller.
        reason = EVENT_REASONS.get(state)
        if reason is not None and rec.reason:
            self.wait_event(name, reason, f"→ {state} ({rec.reason})")
        return rec

    def wait_event(self, node: str, reason: str, text: str = "", timeout: float = 5.0) -> dict[str, Any]:
        """The node's Event of ``reason`` whose message holds ``text``: an Event is written after the
        node write it reports, so a scenario that saw the write waits for its Event instead of racing it."""
        def found() -> dict[str, Any] | None:
            return next((e for e in self.events(node) if e.get("reason") == reason
                         and text in str(e.get("message", ""))), None)

        event = self.wait(found, timeout, f"the {reason} Event of {node}" + (f" saying {text!r}" if text else ""),
                          seen=lambda: [(e.get("reason"), e.get("message")) for e in self.events(node)])
        assert event is not None
        return event

    def blocked_record(self, name: str, reason: str) -> NodeRecord | None:
        """The node's record while it waits for ``reason`` (budget, pdb, breaker, window, gpu-pods), else None."""
        rec = self.record(name)
        return rec if rec is not None and rec.blocked is not None and rec.blocked.reason == reason else None

    def summary(self, name: str) -> str:
        """One line about a node for failure messages."""
        try:
            rec = self.record(name)
            unsched = self.unschedulable(name)
        except (errors.KubeError, E2EError) as exc:
            return f"{name}: {exc}"
        if rec is None:
            return f"{name}: untouched, unschedulable={unsched}"
        action = f"{rec.action.kind}/{rec.action.name}#{rec.action.attempt}" if rec.action else "-"
        blocked = f"{rec.blocked.reason}: {rec.blocked.detail}" if rec.blocked else "-"
        return (f"{name}: state={rec.state} reason={rec.reason} unschedulable={unsched} action={action} "
                f"blocked={blocked} events={self.event_reasons(name)}")

    # events and jobs
    def events(self, node: str) -> list[dict[str, Any]]:
        """The controller's Events about ``node``: kube-controller-manager and kubelets (or the emulator
        playing them) write Node Events too (RegisteredNode, NodeNotSchedulable...)."""
        items = self.kube.list(EVENTS, "default")["items"]
        mine = [e for e in items if (e.get("involvedObject") or {}).get("kind") == "Node"
                and (e.get("involvedObject") or {}).get("name") == node and _from_controller(e)]
        return sorted(mine, key=lambda e: (e.get("firstTimestamp") or "", (e.get("metadata") or {})
                                           .get("creationTimestamp") or "", int((e.get("metadata") or {})
                                           .get("resourceVersion") or 0)))

    def event_reasons(self, node: str) -> list[str]:
        return [str(e.get("reason")) for e in self.events(node)]

    def jobs(self, node: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        selector = f"{JOB_LABEL}={kind}" if kind else JOB_LABEL
        items = self.kube.list(JOBS, JOBS_NS, label_selector=selector)["items"]
        if node is None:
            return items
        return [j for j in items if _job_node(j) == node]

    # people
    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuremediate", *args, *self.kubeconfig_args()],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_child_env())

    @contextlib.contextmanager
    def invariant(self, check: Callable[[], str | None], describe: str, interval: float = 0.05) -> Iterator[None]:
        """Poll ``check`` in a thread while the block runs; fail at exit if it ever reported a problem."""
        problems: list[str] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                with contextlib.suppress(errors.KubeError, OSError):
                    problem = check()
                    if problem:
                        problems.append(problem)
                done.wait(interval)

        thread = threading.Thread(target=watch, name="e2e-invariant", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(5)
        if problems:
            raise E2EError(f"invariant broken ({describe}) {len(problems)} time(s); first: {problems[0]}")


def _job_node(job: Mapping[str, Any]) -> str:
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    labels = (job.get("metadata") or {}).get("labels") or {}
    return str(labels.get("gpuremediate.io/node", ""))


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


# ---- the controller as a subprocess -------------------------------------------------------------


class ControllerProcess:
    """``python -m gpuremediate run ARGS``; its JSON log is collected line by line."""

    def __init__(self, args: list[str], log: list[str]) -> None:
        self.args = args
        self.log = log
        self.port: int | None = None
        self._port_seen = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuremediate", "run", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=_child_env(),
        )
        self._reader = threading.Thread(target=self._read, name="controller-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip("\n"))
            if self.port is None and "observability port open" in line:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self.port = int(json.loads(line)["port"])
                    self._port_seen.set()
        self._port_seen.set()

    def wait_port(self, timeout: float) -> int:
        self._port_seen.wait(timeout)
        if self.port is None:
            tail = "\n".join(self.log[-20:])
            raise E2EError(f"the controller did not report its port within {timeout}s "
                           f"(exit code {self.proc.poll()}); log tail:\n{tail}")
        return self.port

    def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(2)
        return self.proc.returncode

    def thread_stacks(self, wait_s: float = 1.0) -> str:
        """Every thread's stack of the running controller (its SIGUSR1 handler writes them to its log)."""
        if self.proc.poll() is not None:
            return ""
        before = len(self.log)
        self.proc.send_signal(signal.SIGUSR1)
        time.sleep(wait_s)
        return "\n".join(self.log[before:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self._reader.join(2)


MUTATING_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


class EmulatorCluster(Cluster):
    target = "emulator"
    simulated_nodes = True
    INTERVAL_S = float(os.environ.get("GPUREMEDIATE_E2E_INTERVAL", "0.3"))

    def __init__(self, tmp: Path, nodes: int = 4, *, kubeconfig: str | None = None, **sim_options: Any) -> None:
        """``sim_options``: more of ``SimCluster``'s (``agents=True``, ``gpu_operator=True``, ``products=``...)."""
        super().__init__()
        from sim.cluster import SimCluster

        self.tmp = tmp
        self.sim = SimCluster(nodes=nodes, job_duration_s=0.2, reboot_down_s=0.5, kubeconfig=kubeconfig,
                              **sim_options)
        self.nodes = list(self.sim.node_names)
        self.added_nodes: list[str] = []
        self.proc: ControllerProcess | None = None
        self.log: list[str] = []
        self.shutdown_failures: list[str] = []
        self._last_start: tuple[Mapping[str, Mapping[str, Any]] | None, bool] = (None, False)

    def start(self) -> EmulatorCluster:
        self.sim.start()
        self._kube = self.sim.kube
        self._watch_pods()
        return self

    def stop(self) -> None:
        self.stop_controller()
        self._stop_pod_watch()
        self.sim.stop()

    def kubeconfig_args(self) -> list[str]:
        return ["--kubeconfig", self.sim.kubeconfig]

    # controller
    def start_controller(self, policy: Mapping[str, Mapping[str, Any]] | None = None, *,
                         dry_run: bool = False) -> None:
        if self.proc is not None and self.proc.proc.poll() is None:
            raise E2EError("the controller is already running")
        self._last_start = (policy, dry_run)
        path = self.tmp / "policy.toml"
        path.write_text(policy_toml(policy or {}))
        interval = f"{self.INTERVAL_S}s"
        args = [*self.controller_args(), "--policy", str(path), "--metrics-addr", "127.0.0.1:0",
                "--log-format", "json", "--scrape-interval", interval, "--resync", interval,
                "--scrape-timeout", "2s"]
        if dry_run:
            args.append("--dry-run")
        self.log.append(f"---- controller start: {' '.join(args)}")
        self.proc = ControllerProcess(args, self.log)
        self.proc.wait_port(20)
        self.wait(self._ready, 20, "the controller's /readyz to answer 200")

    def controller_args(self) -> list[str]:
        """``gpuremediate run`` flags that point a controller at this cluster (its API server, the exporters)."""
        return self.sim.controller_args()

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self._url("/readyz"), timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def _url(self, path: str) -> str:
        if self.proc is None or self.proc.port is None:
            raise E2EError("the controller is not running")
        return f"http://127.0.0.1:{self.proc.port}{path}"

    def stop_controller(self) -> None:
        if self.proc is not None:
            code = self.proc.terminate()
            self.log.append(f"---- controller stopped (exit code {code})")
            if code != 0:
                self.shutdown_failures.append(f"exit code {code} after SIGTERM")
            self.proc = None

    def log_problems(self) -> list[str]:
        """Tracebacks in the controller's log and unclean exits on SIGTERM (a crash is always a bug)."""
        tracebacks = [line[:300] for line in self.log if '"exc": ' in line or line.startswith("Traceback")]
        return self.shutdown_failures + tracebacks

    def kill_controller(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.log.append("---- controller killed (SIGKILL)")
            self.proc = None

    def restart_controller(self) -> None:
        self.kill_controller()
        policy, dry_run = self._last_start
        self.start_controller(policy, dry_run=dry_run)

    def controller_exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.proc.poll()

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self._url("/metrics"), timeout=5) as resp:
            return str(resp.read().decode())

    def controller_log(self) -> str:
        return "\n".join(self.log)

    def controller_stacks(self) -> str:
        return self.proc.thread_stacks() if self.proc is not None else ""

    # the simulated world
    def gpusim(self, node: str, endpoint: str, body: dict[str, Any]) -> None:
        url = self.sim.gpusim.url_for(node).rsplit("/", 1)[0] + "/" + endpoint
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        if endpoint == "down" and body.get("mode") is None:
            self.sim.gpusim.set_down(node, None)  # a refusing node has no listener to receive "up"
            return
        with urllib.request.urlopen(req, timeout=5) as resp:
            if resp.status != 200:
                raise E2EError(f"gpu-sim {endpoint} {body}: HTTP {resp.status}")

    def set_validation(self, node: str, ok: bool) -> None:
        self.sim.set_validation(node, ok)

    def add_node(self, name: str, gpus: int = 8) -> None:
        """NodeSim registers ``name`` (labelled ADDED_NODE_LABEL, so a server that outlives the scenario
        loses it at the next start); it stays out of ``nodes`` and no exporter serves it."""
        assert self.sim.nodesim is not None
        self.sim.nodesim.add_node(name, gpus=gpus, labels={ADDED_NODE_LABEL: "true"})
        self.added_nodes.append(name)

    def audit_log(self) -> list[tuple[str, str, str, str, str, str | None, str | None]] | None:
        """The requests the API server saw, ``(user, verb, group, resource, subresource, namespace, name)``
        each: the emulator's own audit (None where it is not the emulator)."""
        return None if self.sim.api is None else self.sim.api.requests

    def audit_mark(self) -> int:
        log = self.audit_log()
        if log is None:
            return super().audit_mark()
        return len(log)

    def mutations_since(self, mark: int) -> list[tuple[str, ...]]:
        """Mutating requests after ``mark`` except Events, status writes and the background components'
        (the node simulator's Leases and pods, the busy writer's node writes)."""
        from sim.cluster import BACKGROUND_USERS

        log = self.audit_log()
        if log is None:
            return super().mutations_since(mark)
        return [tuple(str(x) for x in r[1:]) for r in log[mark:]
                if r[1] in MUTATING_VERBS and r[3] != "events" and r[4] != "status"
                and r[0] not in BACKGROUND_USERS]

    def job_runs(self, node: str, kind: str) -> int:
        """How many times a Job pod of ``kind`` ran to completion on ``node`` (the simulated kubelet's log)."""
        return sum(1 for n, k, _ok in self.sim.job_log if n == node and k == kind)


# ---- any cluster through a kubeconfig -----------------------------------------------------------

CONTROLLER_DEPLOYMENT = "gpuremediate"
CONTROLLER_SELECTOR = "app.kubernetes.io/name=gpuremediate"
POLICY_CONFIGMAP = "gpuremediate-policy"
METRICS_PROXY = f"/api/v1/namespaces/{SYSTEM_NS}/services/gpuremediate-metrics:metrics/proxy/metrics"
GPUSIM_IMAGE = "gpu-sim:dev"
GPUSIM_PORT = 9400
GPUSIM_SELECTOR = "app=nvidia-dcgm-exporter"
GPUSIM_URL = f"http://gpu-sim.gpu-operator.svc:{GPUSIM_PORT}"
RECORD_ANNOTATION = "gpuremediate.io/record"
EXCLUDE_LABEL = "gpuremediate.io/exclude"
CLUSTER_TAINT_PREFIXES = ("node.kubernetes.io/", "node-role.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
NODE_LEASE_NS = "kube-node-lease"  # the kubelets' (NodeSim's) Leases, one per node
ADDED_NODE_LABEL = "e2e.gpuremediate.io/added"  # a node a scenario added (Cluster.add_node): deleted after it
# What scenarios create that a real cluster keeps from one scenario to the next (CRDs may be absent).
SCENARIO_RESOURCES = (
    Resource("nvsentinel.nvidia.com", "v1alpha1", "drainrequests", "DrainRequest", True),
    Resource("remediation.example.com", "v1alpha1", "remediationrequests", "RemediationRequest", True),
    Resource("gpuremediate.io", "v1alpha1", "maintenancerequests", "MaintenanceRequest", False),
    Resource("nvsentinel.dgxc.nvidia.com", "v1alpha1", "maintenancerequests", "MaintenanceRequest", False),
)


class KubeconfigCluster(Cluster):
    """A real cluster (kind via e2e/kind/run.sh) with manifests/overlays/kind applied: the controller
    Deployment and the gpu-sim DaemonSet. Each scenario starts from a clean world (``reset_world``) with
    the controller scaled to 0; ``start_controller`` writes the scenario's policy into the ConfigMap and
    scales it to 1 replica, so the new pod reads that policy. It cannot SIGKILL a process: "kill" is a
    grace-0 pod delete (the kubelet still sends SIGTERM first)."""

    target = "kubeconfig"
    slow = 8.0  # the Deployment scrapes every 2 s, and real pods take seconds to start and stop

    def __init__(self, kubeconfig: str | None) -> None:
        super().__init__()
        self.kubeconfig = kubeconfig
        self.log: list[str] = []  # logs of the controller pods already stopped
        self.problems: list[str] = []

    def start(self) -> KubeconfigCluster:
        self._kube = KubeClient(load_config(self.kubeconfig), qps=50, burst=100)
        nodes = self.kube.list(NODES, label_selector="nvidia.com/gpu.present=true")["items"]
        self.nodes = sorted(str(n["metadata"]["name"]) for n in nodes)
        if not self.nodes:
            raise E2EError("no GPU nodes (label nvidia.com/gpu.present=true) in this cluster")
        self._check_deployed()
        with contextlib.suppress(errors.AlreadyExists):
            self.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": WORKLOAD_NS}})
        # A pod is refused until its namespace's default ServiceAccount exists (a controller makes it).
        self.wait(lambda: self.kube.get(SERVICEACCOUNTS, "default", WORKLOAD_NS), 5,
                  f"the default ServiceAccount of namespace {WORKLOAD_NS}")
        self.stop_controller()  # as applied it runs two replicas with the overlay's own policy
        self.problems.clear()  # a restart before this scenario is not the scenario's
        self.reset_world()
        self._watch_pods()
        return self

    def stop(self) -> None:
        """The controller stopped; the world stays as the scenario left it (the next start resets it)."""
        try:
            self._stop_pod_watch()
            self.stop_controller()
        finally:
            self.kube.close()

    def _check_deployed(self) -> None:
        try:
            self.kube.get(DEPLOYMENTS, CONTROLLER_DEPLOYMENT, SYSTEM_NS)
        except errors.NotFound:
            raise E2EError(f"no Deployment {SYSTEM_NS}/{CONTROLLER_DEPLOYMENT}: apply manifests/overlays/kind "
                           "first (e2e/kind/run.sh does)") from None
        if not self._gpusim_pods():
            raise E2EError(f"no gpu-sim pods ({GPUSIM_SELECTOR}) in {EXPORTER_NS}: apply manifests/overlays/kind")

    def require(self, what: str) -> None:
        import pytest

        pytest.skip(f"target kubeconfig cannot {what}")

    def uninstall_crd(self, name: str) -> None:
        self.require("run without a CRD the kind overlay installs (the deployed controller and plugins need it)")

    def kubeconfig_args(self) -> list[str]:
        return ["--kubeconfig", self.kubeconfig] if self.kubeconfig else []

    # -- the world between scenarios
    def reset_world(self) -> None:
        """What the emulator target gets by starting afresh: no workloads, PDBs, Jobs (nor their pods),
        scenario custom resources or controller Events; a fresh gpu-sim on every node; records, state
        labels, exclusions, maintenance claims and cordons gone; the breaker closed."""
        clean_world(self.kube, self.nodes)
        self._restart_gpusims()

    def _gpusim_pods(self) -> list[dict[str, Any]]:
        items = self.kube.list(PODS, EXPORTER_NS, label_selector=GPUSIM_SELECTOR)["items"]
        return [p for p in items if not (p.get("metadata") or {}).get("deletionTimestamp")]

    def _restart_gpusims(self) -> None:
        """A new gpu-sim pod on every node (the DaemonSet makes it): no fault, heat or row-remap failure
        left from an earlier scenario. gpu-sim's state lives in its process, so a reboot is not enough."""
        old = self._gpusim_pods()
        for pod in old:
            with contextlib.suppress(errors.NotFound):
                self.kube.delete(PODS, pod["metadata"]["name"], EXPORTER_NS, grace_period_seconds=0)
        old_uids = {p["metadata"]["uid"] for p in old}

        def fresh_everywhere() -> bool:
            ready = {p["spec"].get("nodeName") for p in self._gpusim_pods()
                     if p["metadata"]["uid"] not in old_uids and _pod_ready(p)}
            return set(self.nodes) <= ready

        self.wait(fresh_everywhere, 15, "a new Ready gpu-sim pod on every GPU node",
                  seen=lambda: [_pod_summary(p) for p in self._gpusim_pods()])

    # -- workloads: real pods that really start, asking for the (patched-on) nvidia.com/gpu capacity
    def workload(self, name: str, node: str, *, gpus: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        pod = self.kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": WORKLOAD_NS, "labels": labels or {"app": name}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                     # the gpu-sim image is loaded into every node: no registry needed
                     "containers": [{"name": "main", "image": GPUSIM_IMAGE, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sleep", "infinity"], "resources": resources}]},
        }, WORKLOAD_NS)
        self.wait(lambda: _pod_ready(self.kube.get(PODS, name, WORKLOAD_NS)), 10, f"workload {name} Ready on {node}",
                  seen=lambda: _pod_summary(self.kube.get(PODS, name, WORKLOAD_NS)))
        return pod

    # -- the controller: the Deployment
    def start_controller(self, policy: Mapping[str, Mapping[str, Any]] | None = None, *,
                         dry_run: bool = False) -> None:
        if dry_run:
            self.require("switch the deployed controller to --dry-run (use manifests/overlays/dry-run)")
        self.stop_controller()
        sections = {k: dict(v) for k, v in self._job_sections().items()}
        for table, values in (policy or {}).items():
            sections.setdefault(table, {}).update(values)
        text = policy_toml(sections)
        loads_policy(text, "the scenario's policy")  # a bad one fails here, not as a crash-looping pod
        self.kube.patch(CONFIGMAPS, POLICY_CONFIGMAP, {"data": {"policy.toml": text}}, SYSTEM_NS)
        self._scale(1)
        self._wait_controller_ready()

    def _job_sections(self) -> dict[str, dict[str, Any]]:
        """kind: the repair Jobs call gpu-sim on their node (the Service is node-local) instead of GPUs."""
        # The same commands as manifests/overlays/kind/policy.toml: the gpu-sim image holds /app/gpusim.py only.
        client = f"python /app/gpusim.py {{}} --url={GPUSIM_URL} --node=$(NODE_NAME)"
        job = {"image": GPUSIM_IMAGE, "privileged": False}
        return {
            "remediation": {"reboot_wait_for_boot_id": False},
            "remediation.reset_gpu": {**job, "command": client.format("reset") + " --gpus=$(GPU_IDS)"},
            "remediation.reboot": {**job, "command": client.format("reboot"), "host_pid": False},
            "validation.job": {**job, "command": client.format("validate")},
        }

    def _scale(self, replicas: int) -> None:
        self.kube.patch(DEPLOYMENTS, CONTROLLER_DEPLOYMENT, {"spec": {"replicas": replicas}}, SYSTEM_NS)

    def _controller_pods(self, *, terminating: bool = False) -> list[dict[str, Any]]:
        items = self.kube.list(PODS, SYSTEM_NS, label_selector=CONTROLLER_SELECTOR)["items"]
        return [p for p in items if terminating or not (p.get("metadata") or {}).get("deletionTimestamp")]

    def _wait_controller_ready(self) -> None:
        self.wait(lambda: any(_pod_ready(p) for p in self._controller_pods()), 15, "a Ready controller pod",
                  seen=lambda: [_pod_summary(p) for p in self._controller_pods(terminating=True)])

    def _note_pods_going(self, pods: list[dict[str, Any]]) -> None:
        """Keep the logs of controller pods about to go, and note any container restart (a crash)."""
        for pod in pods:
            name = pod["metadata"]["name"]
            restarts = sum(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses")
                           or [])
            if restarts:
                self.problems.append(f"controller pod {name} restarted {restarts} time(s)")
                self.log.append(f"---- {name} (previous container)\n" + self._pod_log(name, previous=True))
            self.log.append(f"---- {name}\n" + self._pod_log(name))

    def _pod_log(self, name: str, *, previous: bool = False) -> str:
        path = f"/api/v1/namespaces/{SYSTEM_NS}/pods/{name}/log" + ("?previous=true" if previous else "")
        try:
            return self._raw("GET", path).decode(errors="replace")
        except errors.KubeError as exc:
            return f"(no log: {exc})"

    def stop_controller(self) -> None:
        """Scaled to 0, and every controller pod gone (so nothing acts while the world is reset)."""
        self._scale(0)
        self._note_pods_going(self._controller_pods(terminating=True))
        self.wait(lambda: not self._controller_pods(terminating=True), 10, "no controller pod left",
                  seen=lambda: [_pod_summary(p) for p in self._controller_pods(terminating=True)])

    def kill_controller(self) -> None:
        """Scaled to 0 and its pods deleted with grace 0: gone at once, as far as the API is concerned."""
        self._scale(0)
        pods = self._controller_pods(terminating=True)
        self._note_pods_going(pods)
        for pod in pods:
            with contextlib.suppress(errors.NotFound):
                self.kube.delete(PODS, pod["metadata"]["name"], SYSTEM_NS, grace_period_seconds=0)

    def restart_controller(self) -> None:
        """Killed, then a new pod with the same policy (the ConfigMap still holds it)."""
        self.kill_controller()
        self._scale(1)
        self._wait_controller_ready()

    def log_problems(self) -> list[str]:
        """Controller containers that restarted during the scenario (a crash or a failed liveness probe)."""
        return list(self.problems)

    def metrics_text(self) -> str:
        return self._raw("GET", METRICS_PROXY).decode()

    def controller_log(self) -> str:
        current = [f"---- {p['metadata']['name']}\n{self._pod_log(p['metadata']['name'])}"
                   for p in self._controller_pods(terminating=True)]
        return "\n".join([*self.log, *current])

    # -- gpu-sim through the API server's pod proxy
    def gpusim(self, node: str, endpoint: str, body: dict[str, Any]) -> None:
        pods = [p for p in self._gpusim_pods() if p["spec"].get("nodeName") == node and _pod_ready(p)]
        if not pods:
            raise E2EError(f"no Ready gpu-sim pod on {node}: {[_pod_summary(p) for p in self._gpusim_pods()]}")
        pod = pods[0]["metadata"]["name"]
        self._raw("POST", f"/api/v1/namespaces/{EXPORTER_NS}/pods/{pod}:{GPUSIM_PORT}/proxy/{endpoint}", body)

    def exporter_down(self, node: str, mode: str = "refuse") -> None:
        if mode == "refuse":
            self.require("bring back a gpu-sim that refuses connections: the pod port the API server's proxy "
                         "reaches is its only listener (modes 500 and hang work)")
        super().exporter_down(node, mode)

    def set_validation(self, node: str, ok: bool) -> None:
        self.require("choose a validation outcome per node (the validation Job runs for real)")

    def _raw(self, method: str, path: str, body: Any = None) -> bytes:
        """A request outside the typed client (proxy and log subresources): the client's own transport and auth."""
        retry = "read" if method == "GET" else "mutation"
        reply = self.kube._call(method, path, query=None, body=body, content_type="application/json", retry=retry)
        return bytes(reply.body)


# ---- a bare control plane through a kubeconfig ---------------------------------------------------

CRD_DIR = ROOT / "manifests" / "crds"


def clean_world(kube: KubeClient, nodes: list[str]) -> None:
    """What a scenario or its controller leaves on an API server that outlives it, found by what marks it (not
    by name): workload pods and PDBs (pods deleted with grace 0: no kubelet may be there to finish a graceful
    deletion); the controller's Jobs and their pods (label ``gpuremediate.io/job``), its ResourceClaims,
    DeviceTaintRules and custom resources (label ``app.kubernetes.io/managed-by=gpuremediate``; finalizers
    removed: no controller runs to remove them), its Events in every namespace (its component), the Leases of its
    namespace (leader, shards), the breaker's state, the shards' budget claims and a dry run's journal; every
    object of the scenario kinds (MaintenanceRequests, DrainRequests...) and a webhook scenario's Secret; a
    simulated GPU Operator's DaemonSets and pods; the nodes a scenario added (label); and the records, state
    labels, exclusions, claims,
    operand-label records, cordons and taints on ``nodes`` (the node simulator's next registration of a node
    resets its status and GPU labels: sim.nodesim.NodeSim.add_node). What the test process itself made is removed
    by its record (ApiserverCluster, e2e/ledger.py) where there is one."""
    _delete_all(kube, PODS, WORKLOAD_NS, grace_period_seconds=0)
    _delete_all(kube, PDBS, WORKLOAD_NS)
    for job in _listed(kube, JOBS, label_selector=JOB_LABEL):
        _remove(kube, JOBS, job, propagation_policy="Background")
    for pod in _listed(kube, PODS, label_selector=JOB_LABEL):  # a Job pod holding GPUs blocks the next ones
        _remove(kube, PODS, pod, grace_period_seconds=0)
    _delete_all(kube, PODS, JOBS_NS, grace_period_seconds=0)
    # the breaker's state, the shards' budget claims, a dry run's journal of what it would have done
    for configmap in (BREAKER_CONFIGMAP, BUDGET_CONFIGMAP, JOURNAL_CONFIGMAP):
        with contextlib.suppress(errors.NotFound):
            kube.delete(CONFIGMAPS, configmap, SYSTEM_NS)
    # The leader Lease (a SIGKILLed controller's: no 15 s wait to take over) and the shard Leases (a --shards 3
    # replica's left unheld would count as a third shard in a --shards 2 scenario): every Lease of its namespace.
    _delete_all(kube, LEASES, SYSTEM_NS)
    with contextlib.suppress(errors.NotFound):  # a webhook scenario's receiver URL
        kube.delete(SECRETS, NOTIFICATIONS_SECRET, SYSTEM_NS)
    for res in SCENARIO_RESOURCES:
        _delete_custom(kube, res)
    for event in _listed(kube, EVENTS):  # every namespace: pods and PyTorchJobs in workloads are told too
        if _from_controller(event):
            _remove(kube, EVENTS, event)
    _clean_operands(kube)
    _clean_dra(kube, nodes)
    for added in kube.list(NODES, label_selector=ADDED_NODE_LABEL)["items"]:
        _remove(kube, NODES, added)
    for node in nodes:
        with contextlib.suppress(errors.NotFound):  # not registered yet: the first scenario on this server
            kube.patch(NODES, node, {
                "metadata": {"annotations": {RECORD_ANNOTATION: None, CLAIM_ANNOTATION: None,
                                             OPERAND_ANNOTATION: None},
                             "labels": {STATE_LABEL: None, EXCLUDE_LABEL: None}},
                "spec": {"unschedulable": None}})
            _drop_scenario_taints(kube, node)


def _listed(kube: KubeClient, res: Resource, namespace: str | None = None, **options: Any) -> list[dict[str, Any]]:
    """Every object of ``res`` (in every namespace unless one is named); none where the kind is not served."""
    try:
        return list(kube.list(res, namespace, **options)["items"])
    except errors.NotFound:
        return []


def _remove(kube: KubeClient, res: Resource, obj: Mapping[str, Any], **options: Any) -> None:
    """Delete ``obj`` (that one: its uid a precondition), its finalizers removed if it has any."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") if res.namespaced else None
    with contextlib.suppress(errors.NotFound, errors.Conflict):
        if meta.get("finalizers"):
            kube.patch(res, meta["name"], {"metadata": {"finalizers": None}}, namespace)
        kube.delete(res, meta["name"], namespace, preconditions={"uid": meta["uid"]} if meta.get("uid") else None,
                    **options)


def _clean_dra(kube: KubeClient, nodes: list[str]) -> None:
    """The workloads' ResourceClaims and the controller's (label), its DeviceTaintRules, and the simulated nodes'
    ResourceSlices (a scenario without ``dra=True`` has no DRA driver; one with it publishes them again): none
    where DRA is not served. Claims lose the scheduler's finalizer first (``resource.kubernetes.io/
    delete-protection``: the resourceclaim controller would drop it only once their pods are gone)."""
    from gpuremediate.actions.custom import MANAGED_BY, MANAGED_BY_LABEL
    from gpuremediate.actions.device_taints import DeviceTaints, DeviceTaintsNotServed
    from gpuremediate.kube.resources import RESOURCE_CLAIMS, RESOURCE_SLICES
    from sim.nodesim_dra import DRIVER

    for claim in [*_listed(kube, RESOURCE_CLAIMS, WORKLOAD_NS),
                  *_listed(kube, RESOURCE_CLAIMS, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}")]:
        _remove(kube, RESOURCE_CLAIMS, claim)
    for node in nodes:
        for item in _listed(kube, RESOURCE_SLICES, field_selector=f"spec.nodeName={node},spec.driver={DRIVER}"):
            _remove(kube, RESOURCE_SLICES, item)
    taints = DeviceTaints(kube)
    with contextlib.suppress(DeviceTaintsNotServed):
        for rule in taints.owned():
            taints.release_rule(rule.name)


def remove_made(kube: KubeClient, ledger: Ledger, keep: Callable[[Made], bool]) -> list[str]:
    """Delete what the ledger says the test process made, newest first, except what ``keep`` keeps (finalizers
    removed, pods with grace 0, each guarded by its uid: an object made again since under that name stays); the
    ledger forgets what it deleted. Then pods bound to a node that no longer exists go too (a DaemonSet
    controller's on a deleted node). What could not be deleted, for the caller to report."""
    gone: list[Made] = []
    failed: list[str] = []
    for made in reversed(ledger.made()):
        if keep(made):
            continue
        res, namespace = made.resource, made.namespace or None
        options: dict[str, Any] = {"grace_period_seconds": 0} if made.plural == "pods" else \
            {"propagation_policy": "Background"}
        try:
            current = kube.get(res, made.name, namespace)
            if (current.get("metadata") or {}).get("uid") == made.uid:
                _remove(kube, res, current, **options)
        except errors.NotFound:
            pass
        except errors.KubeError as exc:
            failed.append(f"{made}: {exc}")
            continue
        gone.append(made)
    ledger.forget(gone)
    names = {str(n["metadata"]["name"]) for n in kube.list(NODES)["items"]}
    for pod in _listed(kube, PODS):
        if (pod.get("spec") or {}).get("nodeName") and pod["spec"]["nodeName"] not in names:
            _remove(kube, PODS, pod, grace_period_seconds=0)
    return failed


def world_fixture(nodes: list[str]) -> Callable[[Made], bool]:
    """What the harness keeps on the server between scenarios (``remove_made``'s ``keep``): namespaces, CRDs,
    ServiceAccounts and DeviceClasses; the exporters' DaemonSet; the nodes ``nodes`` with their Leases and
    exporter pods (NodeSim registers a kept node again with this cluster's status and labels)."""
    from sim.cluster import EXPORTER_DAEMONSET, EXPORTER_NAMESPACE

    kept = set(nodes)
    exporters = {f"{EXPORTER_DAEMONSET}-{node}" for node in nodes}

    def keep(made: Made) -> bool:
        if made.plural in ("namespaces", "customresourcedefinitions", "serviceaccounts", "deviceclasses"):
            return True
        if made.plural == "daemonsets":
            return (made.namespace, made.name) == (EXPORTER_NAMESPACE, EXPORTER_DAEMONSET)
        if made.plural == "nodes":
            return made.name in kept
        if made.plural == "leases" and made.namespace == NODE_LEASE_NS:
            return made.name in kept
        if made.plural == "pods" and made.namespace == EXPORTER_NAMESPACE:
            return made.name in exporters
        return False

    return keep


def _clean_operands(kube: KubeClient) -> None:
    """A simulated GPU Operator's DaemonSets and pods (sim.cluster.OperatorSim; their pods deleted with grace
    0, a stuck one's finalizer removed): the next cluster on the server may be no GPU Operator one."""
    from sim.cluster import OPERAND_DAEMONSETS, STUCK_FINALIZER

    for name in OPERAND_DAEMONSETS:
        with contextlib.suppress(errors.NotFound):
            kube.delete(DAEMONSETS, name, EXPORTER_NS, propagation_policy="Background")
    pods: list[dict[str, Any]] = []
    with contextlib.suppress(errors.NotFound):  # no namespace yet: the first cluster on this server
        pods = kube.list(PODS, EXPORTER_NS)["items"]
    for pod in pods:
        meta = pod["metadata"]
        with contextlib.suppress(errors.NotFound):
            if STUCK_FINALIZER in (meta.get("finalizers") or []):
                kube.patch(PODS, meta["name"], {"metadata": {"finalizers": [
                    f for f in meta["finalizers"] if f != STUCK_FINALIZER] or None}}, EXPORTER_NS)
            if (meta.get("labels") or {}).get("app") in OPERAND_DAEMONSETS:
                kube.delete(PODS, meta["name"], EXPORTER_NS, grace_period_seconds=0)


def add_taint(kube: KubeClient, node: str, taint: dict[str, Any]) -> None:
    """``taint`` added to ``node`` as a person's kubectl would: ``spec.taints`` is one list, replaced guarded by the
    resourceVersion it was read at, read again on a 409 (kube-controller-manager writes the same list)."""
    for _ in range(10):
        current = kube.get(NODES, node)
        taints = (current.get("spec") or {}).get("taints") or []
        try:
            kube.patch(NODES, node, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                                     "spec": {"taints": [*taints, taint]}})
            return
        except errors.Conflict:
            continue
    raise E2EError(f"could not add taint {taint.get('key')} to {node}: 10 conflicts in a row")


def _drop_scenario_taints(kube: KubeClient, node: str) -> None:
    """Taints a scenario or the controller put on ``node`` (``[taint]``, a person's): the cluster's own
    (``node.kubernetes.io/*``, a node role's) stay. ``spec.taints`` is one list: replaced guarded by the
    resourceVersion read, again on a 409 (kube-controller-manager writes the same list)."""
    for _ in range(10):
        current = kube.get(NODES, node)
        taints = (current.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if str(t.get("key", "")).startswith(CLUSTER_TAINT_PREFIXES)]
        if kept == taints:
            return
        try:
            kube.patch(NODES, node, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                                     "spec": {"taints": kept or None}})
            return
        except errors.Conflict:
            continue
    raise E2EError(f"could not remove the scenario's taints from {node}: 10 conflicts in a row")


def _delete_all(kube: KubeClient, res: Resource, namespace: str, **options: Any) -> None:
    with contextlib.suppress(errors.NotFound):  # the namespace itself may not exist yet
        for item in kube.list(res, namespace)["items"]:
            with contextlib.suppress(errors.NotFound):
                kube.delete(res, item["metadata"]["name"], namespace, **options)


def _delete_custom(kube: KubeClient, res: Resource) -> None:
    """Every object of a scenario kind, finalizers removed first (no controller runs to remove them)."""
    try:
        items = kube.list(res)["items"]
    except errors.NotFound:
        return  # its CRD is not installed
    for item in items:
        meta = item["metadata"]
        namespace = meta.get("namespace") if res.namespaced else None
        with contextlib.suppress(errors.NotFound):
            if meta.get("finalizers"):
                kube.patch(res, meta["name"], {"metadata": {"finalizers": None}}, namespace)
            kube.delete(res, meta["name"], namespace)


def shipped_crds() -> list[dict[str, Any]]:
    """The CustomResourceDefinitions under manifests/crds (kustomization files left out)."""
    from gpuremediate.kube import miniyaml

    out: list[dict[str, Any]] = []
    for path in sorted(CRD_DIR.rglob("*.yaml")):
        for doc in miniyaml.load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                out.append(doc)
    return out


def crd_resource(crd: Mapping[str, Any]) -> Resource:
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("served", True))
    return Resource(spec["group"], version, spec["names"]["plural"], spec["names"]["kind"],
                    spec.get("scope") == "Namespaced")


def _served(kube: KubeClient, res: Resource) -> bool:
    try:
        kube.list(res, limit=1)
    except errors.NotFound:
        return False
    return True


class ApiserverCluster(EmulatorCluster):
    """GPUREMEDIATE_E2E_TARGET=apiserver: the emulator target's in-process world (NodeSim, gpu-sim, the
    busy writer without the condition taints that kube-controller-manager writes there) and controller
    subprocess, against the API server at ``kubeconfig``. The server outlives each scenario, so the world the
    next one starts from is made by removal: every object the test process creates there is noted in a ledger
    (e2e/ledger.py; its file outlives a killed run) and ``stop`` deletes it all but the world's fixtures
    (``world_fixture``: namespaces, CRDs, ServiceAccounts, the exporters' DaemonSet, the default cluster's nodes),
    then sweeps what the controller made by its labels (``clean_world``), a failed scenario alike; ``start`` does
    the same for what a killed run left and for the kept nodes this scenario does not have, waits for the
    namespaces' default ServiceAccounts, and installs the shipped CRDs and ServiceAccounts if absent."""

    target = "apiserver"
    slow = 2.0  # a real control plane answers in milliseconds, but its first create after a CRD takes ~2 s
    KEPT_NODES = 4  # the default cluster's nodes (EmulatorCluster's nodes=4) stay registered between scenarios

    def __init__(self, tmp: Path, kubeconfig: str, *, ledger: Path | None = None, **sim_options: Any) -> None:
        from e2e.ledger import Ledger, ledger_path

        self.kubeconfig = kubeconfig
        self.ledger = Ledger(ledger or ledger_path(load_config(kubeconfig).server))
        super().__init__(tmp, kubeconfig=kubeconfig, client_class=self.ledger.client_class(), **sim_options)
        self.proxy: RecordingProxy | None = None
        self.proxy_kubeconfig = ""
        self.leftovers: list[str] = []  # what stop could not delete (an API error), for a failing test to show

    def _admin(self) -> KubeClient:
        return self.ledger.client_class()(load_config(self.kubeconfig), qps=100, burst=200)

    def start(self) -> ApiserverCluster:
        from e2e.proxy import RecordingProxy
        from sim.cluster import install_service_accounts

        admin = self._admin()
        try:
            self._clean(admin, self.nodes)
            self._install_crds(admin)
            for ns in (SYSTEM_NS, JOBS_NS):
                with contextlib.suppress(errors.AlreadyExists):
                    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            install_service_accounts(admin)
        finally:
            admin.close()
        super().start()  # SimCluster waits for each namespace's default ServiceAccount before its first pod
        # The controller talks to the server through a recording proxy: the audit of its requests.
        self.proxy = RecordingProxy(load_config(self.kubeconfig)).start()
        self.proxy_kubeconfig = str(self.proxy.write_kubeconfig(self.tmp / "proxy.kubeconfig"))
        return self

    def _clean(self, admin: KubeClient, nodes: list[str]) -> None:
        """What the test process made (but the fixtures and ``nodes``), then what the controller made."""
        self.leftovers = remove_made(admin, self.ledger, world_fixture(nodes))
        clean_world(admin, nodes)

    def controller_args(self) -> list[str]:
        args = super().controller_args()
        if self.proxy is not None:
            args[args.index("--kubeconfig") + 1] = self.proxy_kubeconfig
        return args

    def audit_log(self) -> list[tuple[str, str, str, str, str, str | None, str | None]] | None:
        """The controller's requests, as the recording proxy in front of the server saw them."""
        return None if self.proxy is None else self.proxy.requests

    def _install_crds(self, admin: KubeClient) -> None:
        for crd in shipped_crds():
            with contextlib.suppress(errors.AlreadyExists):
                admin.create(CRDS, crd)
            res = crd_resource(crd)
            self.wait(functools.partial(_served, admin, res), 10, f"the {res.kind} CRD served")

    def stop(self) -> None:
        """The scenario's world removed (passed or failed): all it made but the fixtures, and the default nodes
        reset."""
        from sim.cluster import node_name

        try:
            super().stop()
        finally:
            if self.proxy is not None:
                self.proxy.stop()
            kept = [node_name(i) for i in range(1, self.KEPT_NODES + 1)]
            admin = self._admin()
            try:
                self._clean(admin, [n for n in self.nodes if n in kept])
            finally:
                admin.close()


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _pod_summary(pod: Mapping[str, Any]) -> str:
    """name@node phase ready, and why a container waits or stopped (ImagePullBackOff, CrashLoopBackOff...)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    why = []
    for cs in status.get("containerStatuses") or []:
        for state in ("waiting", "terminated"):
            reason = ((cs.get("state") or {}).get(state) or {}).get("reason")
            if reason:
                why.append(f"{cs.get('name')}: {reason}")
    gone = " terminating" if meta.get("deletionTimestamp") else ""
    return (f"{meta.get('name')}@{(pod.get('spec') or {}).get('nodeName')} {status.get('phase')}"
            f" ready={_pod_ready(pod)}{gone} {status.get('reason') or ''} {'; '.join(why)}".rstrip())


def _from_controller(event: Mapping[str, Any]) -> bool:
    return (event.get("source") or {}).get("component") == EVENT_COMPONENT or \
        event.get("reportingComponent") == EVENT_COMPONENT


def target_name() -> str:
    return os.environ.get("GPUREMEDIATE_E2E_TARGET", "emulator")


def make_cluster(tmp: Path, **sim_options: Any) -> Cluster:
    """The target's cluster. ``sim_options`` shape the simulated world (``sim.cluster.SimCluster``'s:
    ``agents=True``, ``gpu_operator=True``, ``products={...}``) on the targets that simulate it; the
    ``kubeconfig`` target skips the scenario."""
    target = target_name()
    if target == "emulator":
        return EmulatorCluster(tmp, **sim_options)
    if target == "kubeconfig":
        cluster = KubeconfigCluster(os.environ.get("KUBECONFIG"))
        if sim_options:
            cluster.require(f"simulate {', '.join(sorted(sim_options))} (its nodes and exporters are real pods)")
        return cluster
    if target == "apiserver":
        if "node_owners" in sim_options:
            import pytest

            pytest.skip("target apiserver: the simulated Cluster API / Karpenter owner (sim.node_owners) runs only "
                        "on the emulator (its CRDs, Machines and NodeClaims are not in the ledger's cleanup)")
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig:
            raise E2EError("GPUREMEDIATE_E2E_TARGET=apiserver needs KUBECONFIG: the bare control plane's kubeconfig")
        return ApiserverCluster(tmp, kubeconfig, **sim_options)
    raise E2EError(f"GPUREMEDIATE_E2E_TARGET: expected emulator, apiserver or kubeconfig, got {target!r}")


__all__ = ["BASE_POLICY", "ApiserverCluster", "Cluster", "E2EError", "Metrics", "Resource", "make_cluster",
           "policy_toml", "wait_for"]
