"""``gpuremediate demo``: the embedded default. A simulated GPU cluster (API emulator, gpu-sim as
the dcgm-exporter of every node, a kubelet stand-in, the node agent on every node reading gpu-sim's
kernel log and nvidia-smi) and the real controller, in one process.
Faults are injected on a timeline and each node is shown walking through its states.

``--keep`` (``make sandbox``) then leaves the cluster and the controller running, its API server on https,
and writes a kubeconfig (its CA and an admin token) for kubectl and the CLI: the place to try ``pause``,
``release`` and ``breaker reset`` on a fleet that answers. It runs until Ctrl-C."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.fleet import StatusRow, explain_node, render_status, status_rows
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import EVENTS
from gpuremediate.kube.watch import WatchStream
from gpuremediate.obs.log import setup_logging
from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.workflow import BreakerPolicy
from gpuremediate.shutdown import Shutdown
from gpuremediate.vocab import states
from sim.cluster import SimCluster

SANDBOX_KUBECONFIG = str(Path(tempfile.gettempdir()) / "gpuremediate-sandbox.kubeconfig")

DEMO_POLICY = """
[thermal]
hold_s = 2.0        # seconds hot before the cordon (production default: 60)
clear_hold_s = 3.0  # seconds cool before it clears (production default: 300)

[budget]
max_unavailable = "2"

[breaker]
threshold_percent = 90.0  # five of six nodes fault within seconds in this demo; the default is 30 (the sandbox says so)
# The storm look (issue 49) counts faults' arrival: the demo's come a second apart (a fleet's, hours), so they are
# counted over 1 s and a look needs more than 3 nodes (50 % of six): the sandbox's loop, all at once, is a storm.
look_percent = 50.0
look_window_s = 1.0

[repeat_offender]
count = 3           # the 4th fault needing repair within the window quarantines the node
"""

# The timeline faults five nodes (gpu-node-1..5); with a sixth healthy one they stay under the demo's breaker
# threshold (90 %). Fewer nodes would open the breaker on the demo's own story.
MIN_NODES = 6

COLORS = {
    states.HEALTHY: "32", states.CORDONED: "33", states.DRAINING: "35", states.REPAIRING: "36",
    states.VALIDATING: "34", states.QUARANTINED: "31", states.MAINTENANCE: "37",
}


# The Event the controller writes for each transition (gpuremediate.actions.nodes): its reason names the state it
# moved to, its message says "<from> → <to> (<reason>): <message>[; cordoned]".
STATE_OF_REASON = {
    "GPUNodeHealthy": states.HEALTHY, "GPUNodeCordoned": states.CORDONED, "GPUNodeDraining": states.DRAINING,
    "GPUNodeRepairing": states.REPAIRING, "GPUNodeValidating": states.VALIDATING,
    "GPUNodeQuarantined": states.QUARANTINED, "GPUNodeMaintenance": states.MAINTENANCE,
}
BLOCKED_REASON = "GPURemediationBlocked"  # message "waiting (<blocked reason>: <detail>)"
_TRANSITION = re.compile(r"[a-z]+ → [a-z]+ \((?P<reason>[^)]*)\)(?:: (?P<message>.*))?", re.S)


@dataclass(frozen=True)
class Told:
    """One line of the story: a transition (``state`` is where the node went) or a wait (``waiting``)."""

    node: str
    state: str
    detail: str
    waiting: bool = False


class StoryEvents:
    """Every transition the controller made, in the order it made them, from its Events on the Nodes.

    Sampling the nodes' state missed a step that lasted less than one look (`draining` between two reads, issue 50);
    an Event is written for each transition, and a repeat of the same one bumps its ``count``. A watch on them hands
    each write over in order: each new Event and each count that grew is one more step."""

    SELECTOR = "source=gpuremediate,involvedObject.kind=Node"

    def __init__(self, client: KubeClient, namespace: str = "default") -> None:
        self.client = client
        self.namespace = namespace
        self.counts: dict[str, int] = {}  # Event name -> the count already told
        self._written: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stopped = threading.Event()
        self._stream: WatchStream | None = None
        self._rv = ""
        self._thread: threading.Thread | None = None

    def start(self) -> StoryEvents:
        self._relist()
        self._thread = threading.Thread(target=self._watch, name="demo-story", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._stream is not None:
            self._stream.close()
        if self._thread is not None:
            self._thread.join(5)

    def _relist(self) -> None:
        """Everything there now (in name order: only after a watch gap; the diff of counts finds what is new)."""
        listed = self.client.list(EVENTS, self.namespace, field_selector=self.SELECTOR)
        for event in listed.get("items") or []:
            self._written.put(event)
        self._rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self) -> None:
        while not self._stopped.is_set():
            try:
                self._stream = self.client.watch(EVENTS, self.namespace, resource_version=self._rv,
                                                 field_selector=self.SELECTOR, timeout_seconds=300)
                for change in self._stream:
                    if change.type in ("ADDED", "MODIFIED"):
                        self._written.put(change.object)
                    self._rv = change.resource_version or self._rv
            except errors.Gone:
                self._relist()
            except errors.KubeError:
                self._stopped.wait(0.5)

    def new(self) -> list[Told]:
        """The steps written since the last call, oldest first."""
        fresh: list[Told] = []
        while True:
            try:
                event = self._written.get_nowait()
            except queue.Empty:
                return fresh
            name, count = str((event.get("metadata") or {}).get("name", "")), int(event.get("count") or 1)
            told = _told(event)
            if told is not None and count > self.counts.get(name, 0):
                fresh += [told] * (count - self.counts.get(name, 0))
                self.counts[name] = count


def _told(event: dict[str, Any]) -> Told | None:
    involved = event.get("involvedObject")
    node = str(involved.get("name", "")) if isinstance(involved, dict) else ""
    reason, message = str(event.get("reason") or ""), str(event.get("message") or "")
    if reason == BLOCKED_REASON:
        waiting = message.removeprefix("waiting (").removesuffix(")")
        return Told(node, "", waiting, waiting=True)
    state = STATE_OF_REASON.get(reason)
    if state is None:
        return None
    match = _TRANSITION.fullmatch(message)
    if match is None:
        return Told(node, state, _cut(message))
    detail = f"({match['reason']})" + (f" {_cut(match['message'])}" if match["message"] else "")
    return Told(node, state, detail)


def _cut(text: str) -> str:
    return text if len(text) <= 100 else text[:99].rstrip() + "…"


@dataclass
class Step:
    at: float
    what: str
    act: Callable[[SimCluster], object]


def _driver_hang(cluster: SimCluster, node: str) -> None:
    """A hung driver takes the exporter down with it: only the agent's nvidia-smi timeouts tell."""
    cluster.gpusim.set_down(node, "refuse")
    cluster.gpusim.driver_hang(node)


def timeline(nodes: int = 6) -> list[Step]:
    hang = [Step(5.0, "gpu-node-5: the GPU driver hangs (nvidia-smi and the exporter stop answering)",
                 lambda c: _driver_hang(c, "gpu-node-5"))] if nodes >= 5 else []
    return [
        Step(1.0, "gpu-node-1 GPU 3: XID 79 (GPU fallen off the bus) in the kernel log and the exporter",
             lambda c: c.gpusim.kernel_xid("gpu-node-1", 3, 79)),
        Step(2.0, "gpu-node-2 GPU 1: volatile double-bit ECC error",
             lambda c: c.gpusim.inject_dbe("gpu-node-2", 1, 1)),
        Step(3.0, "gpu-node-3 GPU 0: 93 °C", lambda c: c.gpusim.set_temp("gpu-node-3", 0, 93.0)),
        Step(4.0, "gpu-node-4 GPU 2: XID 48 (double-bit ECC), 1st time",
             lambda c: c.gpusim.inject_xid("gpu-node-4", 2, 48)),
        *hang,
        Step(9.0, "gpu-node-3 GPU 0: back to 60 °C", lambda c: c.gpusim.set_temp("gpu-node-3", 0, 60.0)),
    ]


class Demo:
    def __init__(self, nodes: int, speed: float, color: bool, out: TextIO | None = None, *, keep: bool = False,
                 kubeconfig_out: str = SANDBOX_KUBECONFIG, stop: Shutdown | None = None) -> None:
        """``keep``: after the timeline the cluster and the controller run on (over TLS) until ``stop`` is
        requested (Ctrl-C), with a kubeconfig for them written to ``kubeconfig_out``."""
        self.speed = max(0.1, speed)
        self.color = color
        self.out = out or sys.stdout
        self.keep, self.kubeconfig_out = keep, kubeconfig_out
        self.stop = stop or Shutdown()
        self.cluster = SimCluster(nodes=max(MIN_NODES, nodes), agents=True, tls=keep)
        self.told: dict[str, str] = {}  # node -> the state its last transition took it to
        self.story: StoryEvents | None = None
        self.started = 0.0
        self.repeat_faults = 1

    def say(self, text: str) -> None:
        print(f"{time.monotonic() - self.started:6.1f}s  {text}", file=self.out, flush=True)

    def paint(self, state: str) -> str:
        return f"\033[{COLORS.get(state, '0')}m{state}\033[0m" if self.color else state

    def run(self) -> int:
        print("Starting a simulated cluster: Kubernetes API emulator, gpu-sim exporters, node simulator...",
              file=self.out, flush=True)
        with self.cluster as cluster:
            self.story = StoryEvents(cluster.kube).start()
            try:
                return self._run_in(cluster)
            finally:
                self.story.stop()

    def _run_in(self, cluster: SimCluster) -> int:
        self._workloads(cluster)
        settings = Settings(kubeconfig=cluster.kubeconfig, exporter_port=cluster.exporter_port,
                            scrape_interval_s=0.5 / self.speed, resync_s=0.5 / self.speed, metrics_port=0)
        controller = Controller(settings, loads_policy(DEMO_POLICY, "<demo policy>"), client=cluster.kube)
        if not controller.start_caches(30):
            print("the node cache did not sync", file=sys.stderr)
            return 1
        controller.start_loops()
        try:
            self._play(cluster)
            if self.keep:
                self._results(cluster, controller)
                return self._sandbox(cluster)
        finally:
            controller.stop()
        self._results(cluster, controller)
        return 0

    def _results(self, cluster: SimCluster, controller: Controller) -> None:
        print("\n$ gpuremediate status\n" + render_status(status_rows(cluster.kube)), file=self.out)
        print("$ gpuremediate explain gpu-node-4\n" + explain_node(cluster.kube, "gpu-node-4"), file=self.out)
        self._summary(controller, status_rows(cluster.kube))

    def _sandbox(self, cluster: SimCluster) -> int:
        """The cluster stays up: a kubeconfig for it, what to try, then every state change until Ctrl-C."""
        assert cluster.api is not None  # the demo always runs its own emulator
        path = self.kubeconfig_out
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # written afresh, readable by its owner only: it holds an admin token
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        cluster.api.write_kubeconfig(path, embed_ca=True)
        exporter = cluster.gpusim.url_for(cluster.node_names[0]).rsplit("/", 1)[0]
        policy = loads_policy(DEMO_POLICY, "<demo policy>").cluster
        threshold, window, budget = policy.breaker.threshold_percent, policy.breaker.window_s, \
            policy.budget.max_unavailable
        default = BreakerPolicy().threshold_percent
        nodes = " ".join(name.rsplit("-", 1)[-1] for name in cluster.node_names)
        print(f"""
Sandbox: the simulated cluster and the controller keep running ({cluster.api.url}, TLS), until Ctrl-C.
kubeconfig (its CA and an admin token): {path}

  export KUBECONFIG={path}
  kubectl get nodes
  gpuremediate status -o wide                  # or: kubectl gpuremediate status
  gpuremediate explain gpu-node-4
  gpuremediate release gpu-node-4 --by you     # back through validation, then healthy
  gpuremediate pause --reason "trying it"      # new faults wait (BLOCKED paused); then: gpuremediate resume
  gpu-sim inject --url {exporter} --node gpu-node-2 --gpu 0 --fault xid --value 79   # a new fault
  for n in {nodes}; do gpu-sim inject --url {exporter} --node gpu-node-$n --gpu 1 --fault xid --value 79; done
  gpuremediate breaker status                  # open once more than {threshold:g}% of the nodes fault in {window:g}s
  gpuremediate breaker reset

The sandbox's policy is the demo's (gpuremediate/demo.py DEMO_POLICY): [budget] max_unavailable = "{budget}",
[breaker] threshold_percent = {threshold:g} (the default is {default:g}: five of the demo's six nodes fault at once).
""", file=self.out, flush=True)
        try:
            while not self.stop.wait(0.5):
                self._report(cluster)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)  # the cluster it names is gone
        print("sandbox stopped", file=self.out, flush=True)
        return 0

    def _workloads(self, cluster: SimCluster) -> None:
        for name in cluster.node_names:
            cluster.workload(f"train-{name[-1]}", name, gpus=8, labels={"app": "train"})
        print(f"{len(cluster.node_names)} GPU nodes x 8 GPUs, one training pod each. Injecting faults:\n",
              file=self.out, flush=True)

    def _play(self, cluster: SimCluster) -> None:
        self.started = time.monotonic()
        steps = timeline(len(cluster.node_names))
        deadline = self.started + 90.0 / self.speed
        while time.monotonic() < deadline and not self.stop.requested:
            elapsed = (time.monotonic() - self.started) * self.speed
            while steps and steps[0].at <= elapsed:
                step = steps.pop(0)
                self.say(f"⚡ {step.what}")
                step.act(cluster)
            self._report(cluster)
            if not steps and self._settled(status_rows(cluster.kube)):
                self._report(cluster)
                return
            time.sleep(0.1)
        self.say("demo timeline over")

    def _report(self, cluster: SimCluster) -> None:
        """Say every transition (and wait) the controller recorded since the last look, in its order."""
        assert self.story is not None
        for told in self.story.new():
            if told.waiting:
                state = self.told.get(told.node, states.HEALTHY)
                self.say(f"  {told.node:<11} {self.paint(state):<11} waiting: {told.detail}")
                continue
            self.told[told.node] = told.state
            self.say(f"  {told.node:<11} {self.paint(told.state):<11} {told.detail}")
            self._repeat_offender(cluster, told)

    def _repeat_offender(self, cluster: SimCluster, told: Told) -> None:
        """gpu-node-4 keeps failing: a new XID 48 each time it comes back, until it is quarantined."""
        if told.node == "gpu-node-4" and told.state == states.HEALTHY and self.repeat_faults < 4:
            self.repeat_faults += 1
            threading.Timer(1.0 / self.speed, self._refault, args=(cluster,)).start()

    def _refault(self, cluster: SimCluster) -> None:
        self.say(f"⚡ gpu-node-4 GPU 2: XID 48 again ({self.repeat_faults}{_ordinal(self.repeat_faults)} time)")
        cluster.gpusim.inject_xid("gpu-node-4", 2, 48)

    def _settled(self, rows: list[StatusRow]) -> bool:
        """Every node at its end, on the Nodes and in the story told (the last Events written and said)."""
        done = {r.node: r.state for r in rows}
        return (self.repeat_faults >= 4 and done.get("gpu-node-4") == states.QUARANTINED
                and self.told.get("gpu-node-4") == states.QUARANTINED
                and all(s == states.HEALTHY for n, s in done.items() if n != "gpu-node-4")
                and all(s == states.HEALTHY for n, s in self.told.items() if n != "gpu-node-4"))

    def _summary(self, controller: Controller, rows: list[StatusRow]) -> None:
        m = controller.metrics
        counts = (f"Evictions: {int(m.evictions.value(result='evicted', dry_run='false'))}; "
                  f"transitions: {_total(m.registry.render(), 'gpuremediate_transitions_total')}.")
        if not self._settled(rows):  # a loaded machine, a breaker: say so rather than tell the planned story
            unfinished = ", ".join(f"{r.node} {r.state}" + (f" ({r.blocked})" if r.blocked else "")
                                   for r in rows if r.state != (states.QUARANTINED if r.node == "gpu-node-4"
                                                                 else states.HEALTHY))
            print(f"The timeline ended before every node reached its end: {unfinished or 'gpu-node-4 not yet told'}.\n"
                  "`gpuremediate explain NODE` says why.\n" + counts, file=self.out)
            return
        print("What happened: gpu-node-1 rebooted, gpu-node-2 had its GPU reset, both validated and returned;\n"
              "gpu-node-3 was cordoned while hot and uncordoned once cool (its pods stayed);\n"
              "gpu-node-5's exporter went down with its driver: its agent's GPUDriverResponsive=False got it\n"
              "rebooted instead of left unknown;\n"
              "gpu-node-4 was repaired three times, then quarantined as a repeat offender: it needs a person\n"
              "(`gpuremediate explain gpu-node-4`, then `gpuremediate release gpu-node-4`).\n" + counts, file=self.out)


def _ordinal(n: int) -> str:
    return {1: "st", 2: "nd", 3: "rd"}.get(n, "th")


def _total(text: str, name: str) -> int:
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")))


def main(nodes: int = 6, speed: float = 1.0, color: bool = False, keep: bool = False,
         kubeconfig_out: str = SANDBOX_KUBECONFIG) -> int:
    setup_logging("text", "critical")
    logging.getLogger("gpuremediate").setLevel(logging.CRITICAL)
    stop = Shutdown().install() if keep else None  # Ctrl-C ends the sandbox (and a timeline under way) cleanly
    return Demo(nodes, speed, color, keep=keep, kubeconfig_out=kubeconfig_out, stop=stop).run()
