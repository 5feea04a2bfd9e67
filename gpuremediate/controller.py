"""The controller process: caches, loops, leader election, the observability port, shutdown.

Wiring only; every decision lives in ``state``/``policy`` and every effect in ``actions``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.actions.events import EventRecorder
from gpuremediate.actions.nodes import NodeView, NodeWriter, is_excluded, is_gpu_node, labels_of, name_of
from gpuremediate.config import Settings
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.leader import LeaderElector
from gpuremediate.kube.resources import NODES
from gpuremediate.loops.base import LoopContext, NodeLoop
from gpuremediate.loops.detect import DetectLoop
from gpuremediate.loops.drain import DrainLoop
from gpuremediate.loops.maintenance import MaintenanceLoop
from gpuremediate.loops.quarantine import QuarantineLoop
from gpuremediate.loops.remediate import RemediateLoop
from gpuremediate.loops.validate import ValidateLoop
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.obs.server import ObservabilityServer
from gpuremediate.policy.config import PolicyFile
from gpuremediate.policy.selector import parse_selector
from gpuremediate.signals.sources import ExporterSource, PrometheusSource, Source

log = logging.getLogger(__name__)


class MetricsObserver:
    """Per-scrape metrics from the exporter source."""

    def __init__(self, metrics: ControllerMetrics, source: str) -> None:
        self.metrics = metrics
        self.source = source

    def scrape(self, node: str, seconds: float, ok: bool, reason: str) -> None:
        self.metrics.scrape_seconds.observe(seconds, source=self.source)
        if not ok:
            self.metrics.scrape_errors.inc(source=self.source)


def node_filter(settings: Settings) -> Callable[[Mapping[str, Any]], bool]:
    if not settings.gpu_node_selector:
        return is_gpu_node
    selector = parse_selector(settings.gpu_node_selector)
    return lambda node: selector.matches(labels_of(node))


def build_source(settings: Settings, client: KubeClient, metrics: ControllerMetrics, view: NodeView) -> Source:
    if settings.source == "prometheus":
        token = Path(settings.prometheus_token_file).read_text().strip() if settings.prometheus_token_file else None
        return PrometheusSource(settings.prometheus_url, token=token, ca_file=settings.prometheus_ca_file or None,
                                node_label=settings.prometheus_node_label, timeout_s=settings.scrape_timeout_s)
    return ExporterSource(
        client,
        namespace=settings.exporter_namespace,
        label_selector=settings.exporter_selector,
        port=settings.exporter_port,
        path=settings.exporter_path,
        timeout_s=settings.scrape_timeout_s,
        observer=MetricsObserver(metrics, "exporter"),
        expected_nodes=lambda: [name_of(n) for n in view.gpu_nodes() if not is_excluded(n)],
    )


class Controller:
    def __init__(
        self,
        settings: Settings,
        policy: PolicyFile,
        *,
        client: KubeClient | None = None,
        source: Source | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = ControllerMetrics()
        self.metrics.dry_run.set(1.0 if settings.dry_run else 0.0)
        self.client = client or KubeClient(load_config(settings.kubeconfig, settings.context),
                                           qps=settings.qps, burst=settings.burst)
        self.informer = Informer(self.client, NODES)
        view = NodeView(self.informer, node_filter(settings))
        events = EventRecorder(self.client, namespace=settings.event_namespace, host=settings.who,
                               dry_run=settings.dry_run)
        writer = NodeWriter(self.client, view, events, self.metrics, dry_run=settings.dry_run)
        breakers = BreakerStore(self.client, settings.namespace, dry_run=settings.dry_run)
        self.ctx = LoopContext(client=self.client, settings=settings, policy=policy, metrics=self.metrics,
                               events=events, nodes=view, writer=writer, breakers=breakers, clock=clock)
        self.detect = DetectLoop(self.ctx, source or build_source(settings, self.client, self.metrics, view))
        self.node_loops: list[NodeLoop] = [
            DrainLoop(self.ctx), RemediateLoop(self.ctx), ValidateLoop(self.ctx), QuarantineLoop(self.ctx)
        ]
        self.informer.add_handler(on_add=self._on_node, on_update=lambda _old, new: self._on_node(new))
        self.maintenance: MaintenanceLoop | None = None  # started by start_loops when the CRD is served
        self.acting = False
        self.lost_lease = False
        self._stopped = threading.Event()

    def _on_node(self, node: dict[str, Any]) -> None:
        if self.acting and self.ctx.nodes.node_filter(node):
            for loop in self.node_loops:
                loop.on_node(node)
            if self.maintenance is not None:
                self.maintenance.on_node(node)

    # ---- lifecycle ---------------------------------------------------------------------------------

    def start_caches(self, timeout: float = 60.0) -> bool:
        self.informer.start()
        return self.informer.wait_for_sync(timeout)

    def start_loops(self) -> None:
        log.info("starting loops", extra={"dry_run": self.settings.dry_run})
        self.acting = True
        self.metrics.leader.set(1.0)
        self.detect.start()
        for loop in self.node_loops:
            loop.start()
        drain = next(loop for loop in self.node_loops if isinstance(loop, DrainLoop))
        self.maintenance = MaintenanceLoop.discover(self.ctx, cancel=drain.cancel)
        if self.maintenance is not None:
            self.maintenance.start()

    def stop(self) -> None:
        self.acting = False
        self.ctx.stop.set()
        self.detect.stop()
        for loop in self.node_loops:
            loop.stop()
        if self.maintenance is not None:
            self.maintenance.stop()
        self.informer.stop()
        self.metrics.leader.set(0.0)
        self._stopped.set()

    def ready(self) -> tuple[bool, str]:
        if not self.informer.has_synced():
            return False, "node cache not synced"
        if self.acting and not (self.detect.running and all(loop.running for loop in self.node_loops)):
            return False, "a loop is not running"
        if self.acting and self.maintenance is not None and not self.maintenance.running:
            return False, "the maintenance loop is not running"
        return True, "ok" if self.acting else "ok (standby: not the leader)"

    def alive(self) -> tuple[bool, str]:
        if self.lost_lease:
            return False, "lost the leader lease"
        return True, "ok"

    # ---- the process ---------------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (0) or a lost lease (1: the process restarts as a follower)."""
        server = ObservabilityServer(self.metrics.registry, self.ready, self.settings.metrics_host,
                                     self.settings.metrics_port, alive=self.alive).start()
        log.info("observability port open", extra={"port": server.port})
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stopped.set())
        if not self.start_caches():
            log.error("node cache did not sync; exiting")
            server.stop()
            return 1
        elector = self._elector()
        if elector is None:
            self.start_loops()
        else:
            threading.Thread(target=elector.run, name="leader-election", daemon=True).start()
        self._stopped.wait()
        self.stop()  # stop acting first: nothing may be written once the lease is released
        if elector is not None:
            elector.stop()
        server.stop()
        return 1 if self.lost_lease else 0

    def _elector(self) -> LeaderElector | None:
        if not self.settings.leader_elect:
            return None
        return LeaderElector(
            self.client, self.settings.namespace, self.settings.lease_name, self.settings.who,
            on_started_leading=self.start_loops, on_stopped_leading=self._lost,
        )

    def _lost(self) -> None:
        # Called also when we release the lease on shutdown; only a lease lost while acting is an error.
        if self.acting and not self.ctx.stop.is_set():
            log.error("lost the leader lease: stopping all action")
            self.lost_lease = True
            self.acting = False
            self.ctx.stop.set()
            self._stopped.set()
