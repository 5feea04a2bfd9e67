"""The controller process: caches, loops, leader election, the observability port, shutdown.

Wiring only; every decision lives in ``state``/``policy`` and every effect in ``actions``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.actions.budget_claims import BudgetClaims, is_done
from gpuremediate.actions.dry_run_journal import DryRunJournal
from gpuremediate.actions.events import NORMAL, WARNING, EventRecorder
from gpuremediate.actions.nodes import Node, NodeView, NodeWriter, is_excluded, is_gpu_node, labels_of, name_of
from gpuremediate.clock import SteadyClock
from gpuremediate.config import Settings
from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient, WriteFence
from gpuremediate.kube.config import load_config
from gpuremediate.kube.handover import HANDOVER_ANNOTATION, HANDOVER_VERSION, LEADER_MODE, ModeGuard
from gpuremediate.kube.leader import LeaderElector, LeaseLock
from gpuremediate.kube.resources import EVENTS, NODES, SECRETS
from gpuremediate.kube.shards import ShardSet
from gpuremediate.loops.base import LoopContext, NodeLoop
from gpuremediate.loops.detect import DetectLoop
from gpuremediate.loops.drain import DrainLoop
from gpuremediate.loops.idle_check import IdleCheckLoop
from gpuremediate.loops.maintenance import MaintenanceLoop
from gpuremediate.loops.new_node import NewNodeLoop
from gpuremediate.loops.node_gone import NodeGone
from gpuremediate.loops.quarantine import QuarantineLoop
from gpuremediate.loops.remediate import RemediateLoop
from gpuremediate.loops.trend_maintenance import TrendMaintenance
from gpuremediate.loops.validate import ValidateLoop
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.obs.event_queue import EventQueue, own_pod, pod_event_body
from gpuremediate.obs.notify import NotifyError, WebhookNotifier, url_from_secret
from gpuremediate.obs.server import ObservabilityServer
from gpuremediate.policy import safety
from gpuremediate.policy.config import PolicyFile
from gpuremediate.policy.fabric import breaker_domain_labels
from gpuremediate.policy.selector import parse_selector
from gpuremediate.shutdown import Shutdown
from gpuremediate.signals.alerts import AlertsError, AlertsReader
from gpuremediate.signals.sources import ExporterSource, PrometheusSource, ShardScope, Source
from gpuremediate.vocab import states
from gpuremediate.vocab.record import RECORD_ANNOTATION, NodeRecord, record_from_node
from gpuremediate.webhook.mutate import Settings as WebhookSettings
from gpuremediate.webhook.server import CertificateFiles, WebhookServer

log = logging.getLogger(__name__)

CACHE_SYNC_S = 60.0  # the node cache gives up after this long without a page of its list
MAINTENANCE_DISCOVERY_S = 60.0  # while MaintenanceRequests are not served, discovery is asked again this often
STOP_BOUND_S = 6.0  # loops and caches stop together within this; each loop's own join waits 5 s at most
RELEASE_BOUND_S = 2.0  # then the lease is released, last
REPORT_QUEUE_SIZE = 10_000  # Events and conditions waiting to be written; past it they are dropped and counted


class Stoppable(Protocol):
    def stop(self) -> None: ...


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


class ShardExporterSource(ExporterSource):
    """With --shards: only the exporter pods on nodes of the shards this replica holds now are scraped."""

    def __init__(self, *args: Any, owns: Callable[[str], bool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owns = owns

    def _pods(self) -> list[Mapping[str, Any]]:
        return [pod for pod in super()._pods() if self.owns(str((pod.get("spec") or {}).get("nodeName") or ""))]


def build_source(settings: Settings, client: KubeClient, metrics: ControllerMetrics, view: NodeView,
                 owns: Callable[[str], bool] = lambda _node: True,
                 clock: Callable[[], float] = time.time,
                 held: Callable[[], frozenset[int]] = frozenset,
                 owned_nodes: Callable[[], list[Node]] | None = None) -> Source:
    """The GPU-metrics source; ``owns`` narrows it to the nodes this replica acts on (--shards), ``held`` the shards
    it holds (--prometheus-shard-label: the queries select those shards' series), ``owned_nodes`` the GPU nodes
    ``owns`` takes (where given, instead of filtering the fleet's)."""

    def expected() -> list[str]:
        if owned_nodes is not None:  # the shards held now, from the view's index: not a walk of the fleet's Nodes
            return [name_of(n) for n in owned_nodes() if not is_excluded(n)]
        return [name_of(n) for n in view.gpu_nodes() if not is_excluded(n) and owns(name_of(n))]

    if settings.source == "prometheus":
        token = Path(settings.prometheus_token_file).read_text().strip() if settings.prometheus_token_file else None
        return PrometheusSource(
            settings.prometheus_url, token=token, ca_file=settings.prometheus_ca_file or None,
            node_label=settings.prometheus_node_label, timeout_s=settings.prometheus_query_timeout_s or None,
            max_bytes=settings.prometheus_max_bytes or None, expected_nodes=expected,
            fault_poll_s=settings.prometheus_fault_poll_s, clock=clock,
            fleet_size=view.gpu_count,  # every replica asks for the whole fleet (--shards too)
            keep=owns if settings.sharded else None,
            shard_scope=ShardScope(settings.prometheus_shard_label, settings.shards, held)
            if settings.prometheus_shard_label else None,
        )
    sharded: dict[str, Any] = {"owns": owns} if settings.sharded else {}
    return (ShardExporterSource if settings.sharded else ExporterSource)(
        client,
        namespace=settings.exporter_namespace,
        label_selector=settings.exporter_selector,
        port=settings.exporter_port,
        path=settings.exporter_path,
        timeout_s=settings.scrape_timeout_s,
        observer=MetricsObserver(metrics, "exporter"),
        expected_nodes=expected,
        clock=clock,
        **sharded,
    )


def build_alerts(settings: Settings, policy: PolicyFile) -> tuple[AlertsReader | None, str]:
    """The blocking-alerts reader (built once), or None and why drains with blocking alerts must wait."""
    gates = policy.cluster.gates
    if not gates.blocking_alerts:
        return None, ""
    url = gates.prometheus_url or settings.prometheus_url
    if not url:
        return None, "no Prometheus to ask: set [gates].prometheus_url or --prometheus-url"
    try:
        token = Path(settings.prometheus_token_file).read_text().strip() if settings.prometheus_token_file else None
        return AlertsReader(url, token=token, ca_file=settings.prometheus_ca_file or None,
                            ttl_s=gates.alerts_ttl_s), ""
    except (AlertsError, OSError) as exc:
        return None, str(exc)


def read_notifier(client: KubeClient, settings: Settings, policy: PolicyFile,
                  metrics: ControllerMetrics) -> tuple[WebhookNotifier | None, str]:
    """The webhook notifier from its Secret (read once, at start), or None and why there is none."""
    cfg = policy.cluster.notifications
    if not cfg.enabled:
        return None, ""
    what = f"Secret {settings.namespace}/{cfg.secret}"
    try:
        url = url_from_secret(client.get(SECRETS, cfg.secret, settings.namespace), cfg.secret_key)
        notifier = WebhookNotifier(url, fmt=cfg.format, cluster=cfg.cluster, timeout_s=cfg.timeout_s,
                                   retries=cfg.retries, events=cfg.events, template=cfg.template,
                                   on_result=lambda kind, result: metrics.notifications.inc(kind=kind, result=result))
    except errors.NotFound:
        return None, f"{what} not found"
    except (errors.ApiError, errors.TransportError) as exc:
        return None, f"{what} unreadable: {exc}"
    except NotifyError as exc:
        return None, str(exc)
    return notifier, ""


class Controller:
    def __init__(
        self,
        settings: Settings,
        policy: PolicyFile,
        *,
        client: KubeClient | None = None,
        source: Source | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock``: epoch seconds for every timeout and age (default: a SteadyClock, anchored to the API
        server's time when the loops start)."""
        self.settings = settings
        self.metrics = ControllerMetrics()
        clock = clock or SteadyClock(on_offset=self.metrics.clock_offset.set)
        self.metrics.dry_run.set(1.0 if settings.dry_run else 0.0)
        self.metrics.shards.set(float(settings.shards))
        if policy.empty and settings.policy_path:
            log.warning("the policy file sets nothing (empty or only comments): the built-in defaults apply",
                        extra={"policy": policy.source})
        self.metrics.policy_empty.set(1.0 if policy.empty and settings.policy_path else 0.0)
        self.client = client or KubeClient(load_config(settings.kubeconfig, settings.context),
                                           qps=settings.qps, burst=settings.burst)
        self.client.observe_request = self.metrics.api_request
        self.informer = Informer(self.client, NODES)
        view = NodeView(self.informer, node_filter(settings))
        events = EventRecorder(self.client, namespace=settings.event_namespace, host=settings.who,
                               dry_run=settings.dry_run)
        writer = NodeWriter(self.client, view, events, self.metrics, dry_run=settings.dry_run)
        # Reports of actions (Events, the GPURemediation condition) are written after the actions, at background
        # priority on the same rate limit: a burst of cordons is not paced by its own reports.
        self.reports = EventQueue(None, self.metrics.events_dropped, maxsize=REPORT_QUEUE_SIZE,
                                  priority=self.client.background, name="report-writer")
        events.defer = self.reports.submit
        writer.defer_condition = self.reports.submit_latest
        writer.taint = policy.cluster.taint
        writer.clock = clock
        breakers = BreakerStore(self.client, settings.namespace, dry_run=settings.dry_run)
        if settings.dry_run:  # what it would do, where the CLI reads it (no Node is written)
            writer.journal = journal = DryRunJournal(self.client, settings.namespace, settings.who, clock)
            breakers.on_dry_run_save = lambda breaker: journal.note_breaker(breaker.to_dict())
        self.shards = self._shard_set(settings) if settings.sharded else None
        if self.shards is not None:
            view.index_shards(self.shards.shard_index)  # a replica walks its share of the cache, not the fleet
            # the other shards' Nodes are read from the view's indexes, a few at a time otherwise: packed (kube/packed)
            self.informer.pack_unless(self.shards.holds_node)
        # Indexed labels: the breaker's failure domains, the budget's domains and every group's NVLink domain label
        # (a fault's domain, a domain's size and members come from the index, never a walk of the cache, whose other
        # shards' Nodes are packed); index_budget: the nodes the budget must see (a drain's admission, the gauge).
        view.index_labels(dict.fromkeys((*breaker_domain_labels(policy.cluster.breaker.domain_labels,
                                                                  policy.defaults.fabric),
                                         *(d.label for d in policy.cluster.budget.domains),
                                         *(p.fabric.domain_label for p in (policy.defaults,
                                                                           *(g.policy for g in policy.groups))
                                           if p.fabric.enabled and p.fabric.domain_label))))
        view.index_budget()
        claims = BudgetClaims(self.client, settings.namespace, lambda name: _looks_done(view, name), clock) \
            if self.shards is not None and not settings.dry_run else None
        self.ctx = LoopContext(client=self.client, settings=settings, policy=policy, metrics=self.metrics,
                               events=events, nodes=view, writer=writer, breakers=breakers, clock=clock,
                               shards=self.shards, claims=claims)
        shards = self.shards
        self.detect = DetectLoop(self.ctx, source or build_source(
            settings, self.client, self.metrics, view, self.ctx.owns, clock,
            held=shards.owned if shards is not None else frozenset,
            owned_nodes=self.ctx.owned_gpu_nodes if shards is not None else None))
        alerts, alerts_problem = build_alerts(settings, policy)
        if alerts_problem:
            log.error("blocking alerts cannot be read: drains wait while this lasts",
                      extra={"error": alerts_problem})
        self.node_loops: list[NodeLoop] = [
            DrainLoop(self.ctx, alerts, alerts_problem), RemediateLoop(self.ctx), ValidateLoop(self.ctx),
            QuarantineLoop(self.ctx), NewNodeLoop(self.ctx), IdleCheckLoop(self.ctx, self.detect.workload),
        ]
        self.informer.add_handler(on_add=self._on_node, on_update=self._on_node_update,
                                  on_delete=self._on_node_deleted)
        self.node_gone = NodeGone(self.ctx, self._forget_node)
        self.maintenance: MaintenanceLoop | None = None  # started by start_loops when the CRD is served
        self.acting = False
        self._left_mid_flow: set[str] = set()  # nodes told to be out of the selector while in a flow
        self.lost_lease = False
        self.elector: LeaderElector | None = None  # set by run() with --leader-elect
        self._shard_thread: threading.Thread | None = None  # run() with --shards: renews the shard Leases
        self._shards_swept: frozenset[int] = frozenset()  # the shards held when the last sweep of deleted nodes began
        self._lifecycle = threading.Lock()  # start_loops (elector thread) against stop (main thread)
        self._shutdown = Shutdown()

    def _on_node(self, node: dict[str, Any]) -> None:
        if not self.acting:
            return
        if not self.ctx.nodes.node_filter(node):
            self._note_left_mid_flow(node)
            return
        self._left_mid_flow.discard(name_of(node))
        for loop in self.node_loops:
            loop.on_node(node)
        if self.maintenance is not None:
            self.maintenance.on_node(node)

    def _on_node_deleted(self, node: dict[str, Any]) -> None:
        """Off the informer's thread: the cleanup makes API calls (loops.node_gone)."""
        if self.acting:
            self.node_gone.watched(name_of(node))  # now: a sweep under way leaves it to this handler
            self.reports.submit(lambda: self.node_gone.on_deleted(node))

    def _forget_node(self, name: str) -> None:
        self._left_mid_flow.discard(name)
        self.detect.forget_node(name)
        self.ctx.writer.forget(name)

    def _on_node_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self._on_node(new)
        if self.acting and self.ctx.nodes.node_filter(new):
            self.detect.condition_arrived(old, new)  # a condition turned to a fault: checked now, not next cycle

    def _note_left_mid_flow(self, node: Mapping[str, Any]) -> None:
        """A node relabelled out of --gpu-node-selector while its record says it is in a flow is no longer acted
        on (it stays as it is: cordoned, draining...): said once, by a warning and an Event, not left silent."""
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        name = name_of(node)
        if RECORD_ANNOTATION not in annotations or name in self._left_mid_flow or not self.ctx.owns(name):
            return
        record = record_from_node(node)
        if not isinstance(record, NodeRecord) or record.state == states.HEALTHY:
            return
        self._left_mid_flow.add(name)
        message = (f"no longer matches --gpu-node-selector ({self.settings.gpu_node_selector or 'a GPU resource'}) "
                   f"while {record.state}: gpuremediate leaves it as it is until it matches again or a person "
                   f"releases it (gpuremediate release {name})")
        log.warning("node left the GPU node selector mid-flow", extra={"node": name, "state": record.state})
        self.ctx.events.node_event(name, "GPUNodeNotSelected", message, WARNING)

    # ---- lifecycle ---------------------------------------------------------------------------------

    def start_caches(self, timeout: float = 60.0) -> bool:
        self.informer.start()
        return self.informer.wait_for_sync(timeout)

    def start_loops(self) -> None:
        """Start acting (the leader elector's thread calls this); nothing starts once stop() has begun."""
        notifier = self._read_notifier()  # an API call: outside the lock
        if isinstance(self.ctx.clock, SteadyClock):  # the informer's list and watch have told the server's time
            self.ctx.clock.anchor(self.client.server_time.offset())
        with self._lifecycle:
            if self.ctx.stop.is_set():
                return
            log.info("starting loops", extra={"dry_run": self.settings.dry_run})
            self.acting = True
            self.metrics.leader.set(1.0)
            if notifier is not None:
                self.ctx.writer.notifier = notifier.start()
            self.ctx.breakers.start()  # the breaker ConfigMap through a watch: no GET per cycle
            if self.ctx.writer.journal is not None:
                self.ctx.writer.journal.start()
            self.detect.start()
            for loop in self.node_loops:
                loop.start()
            # Nodes deleted while no controller ran: its own thread (it waits for the Jobs watch to list); with
            # --shards those of the shards held now, a shard taken later is swept when it is (_shards_changed)
            self._shards_swept = self.shards.owned() if self.shards is not None else frozenset()
            threading.Thread(target=self.node_gone.sweep, name="node-gone-sweep", daemon=True).start()
        if not self._start_maintenance():
            threading.Thread(target=self._rediscover_maintenance, name="maintenance-discovery", daemon=True).start()

    def _start_maintenance(self, *, quiet: bool = False) -> bool:
        """The maintenance loop started when the API server serves MaintenanceRequests (True), else False."""
        drain = next(loop for loop in self.node_loops if isinstance(loop, DrainLoop))
        maintenance = MaintenanceLoop.discover(self.ctx, cancel=drain.cancel, quiet=quiet)  # outside the lock
        with self._lifecycle:
            if maintenance is not None and not self.ctx.stop.is_set():
                self.maintenance = maintenance
                maintenance.start()
                self.detect.trend_maintenance = TrendMaintenance(
                    self.client, maintenance.res, maintenance.informer, self.metrics, self.detect.events.node_event,
                    lambda: self.ctx.policy.cluster.maintenance.prepare_lead_s, dry_run=self.settings.dry_run)
            self.detect.maintenance_discovered = True
        return maintenance is not None

    def _rediscover_maintenance(self) -> None:
        """The CRD installed after start (or discovery failing then): asked again every MAINTENANCE_DISCOVERY_S until
        served, so `kubectl apply -k manifests/crds` needs no restart. One GET of the group's discovery document a
        minute while it is not."""
        while not self.ctx.stop.wait(MAINTENANCE_DISCOVERY_S):
            if self._start_maintenance(quiet=True):
                log.info("maintenance requests enabled: the API server serves them now")
                return

    def _read_notifier(self) -> WebhookNotifier | None:
        """Read the notifications Secret once; without it the controller runs on, and says so. A dry run posts
        nothing anywhere (its Events say what would happen)."""
        if self.settings.dry_run:
            if self.ctx.policy.cluster.notifications.enabled:
                log.info("notifications are off in dry-run mode")
            return None
        notifier, problem = read_notifier(self.client, self.settings, self.ctx.policy, self.metrics)
        if problem:
            message = f"notifications are off: {problem}"
            log.error(message)
            self._controller_event("GPURemediationNotifyOff", message, WARNING)
        return notifier

    def _controller_event(self, reason: str, message: str, type_: str) -> None:
        """An Event on the controller's own Pod (none outside a Pod: the log says it)."""
        pod = own_pod()
        if pod is None or self.settings.dry_run:
            return
        namespace, name = pod
        try:
            self.client.create(EVENTS, pod_event_body(namespace, name, reason, message, type_, self.ctx.clock()),
                               namespace)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("could not record event", extra={"reason": reason, "error": str(exc)})

    def stop(self, timeout: float = STOP_BOUND_S) -> None:
        """Stop every loop and the caches, all at once, waiting at most ``timeout`` for them together."""
        with self._lifecycle:
            self.acting = False
            self.ctx.stop.set()
            parts: list[Stoppable] = [self.detect, *self.node_loops, self.informer, self.ctx.breakers, self.ctx.jobs]
            if self.maintenance is not None:
                parts.append(self.maintenance)
            if self.ctx.writer.notifier is not None:
                parts.append(self.ctx.writer.notifier)
            if self.ctx.writer.journal is not None:
                parts.append(self.ctx.writer.journal)
            parts.append(self.reports)  # what is queued is written within the bound (the write fence holds after)
        stoppers = [threading.Thread(target=part.stop, name=f"stop-{type(part).__name__}", daemon=True)
                    for part in parts]
        for stopper in stoppers:
            stopper.start()
        deadline = time.monotonic() + timeout
        for stopper in stoppers:
            stopper.join(max(0.0, deadline - time.monotonic()))
        stuck = [stopper.name for stopper in stoppers if stopper.is_alive()]
        if stuck:
            log.warning("not stopped within %gs: %s", timeout, ", ".join(stuck))
        self.metrics.leader.set(0.0)

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
        stuck = self.elector.check() if self.elector is not None else ""
        if stuck:
            return False, stuck
        if self._shard_thread is not None and not self._shard_thread.is_alive() and not self.ctx.stop.is_set():
            return False, "the shard lease thread stopped"
        return True, "ok"

    # ---- the process ---------------------------------------------------------------------------------

    def run(self, shutdown: Shutdown | None = None) -> int:
        """Serve until SIGTERM/SIGINT (0) or a lost lease (1: the process restarts as a follower)."""
        self._shutdown = shutdown = (shutdown or Shutdown()).install()
        server = ObservabilityServer(self.metrics.registry, self.ready, self.settings.metrics_host,
                                     self.settings.metrics_port, alive=self.alive).start()
        log.info("observability port open", extra={"port": server.port})
        webhook = self._start_webhook()
        elector: LeaderElector | None = None
        shards = self.shards
        try:
            if not self._sync_caches(shutdown, timeout=CACHE_SYNC_S):
                if shutdown.requested:
                    return 0
                log.error("node cache did not sync; exiting")
                return 1
            self.elector = elector = self._elector()
            if shards is not None:  # every replica acts, each on the shards it holds (none: nothing)
                self.client.write_fence = self._fence(shards.fence)
                self._shard_thread = threading.Thread(target=shards.run, name="shard-leases", daemon=True)
                self._shard_thread.start()
                self.start_loops()
            elif elector is None:
                self.start_loops()
            else:
                self.client.write_fence = self._fence(elector.fence)
                threading.Thread(target=elector.run, name="leader-election", daemon=True).start()
            shutdown.wait()
            log.info("shutting down", extra={"signal": shutdown.signum})
            return 1 if self.lost_lease else 0
        finally:
            self.stop()  # stop acting first: nothing may be written once the lease is released
            if elector is not None:
                elector.stop(RELEASE_BOUND_S)
            if shards is not None:
                shards.stop(RELEASE_BOUND_S)
            server.stop()
            if webhook is not None:
                webhook.stop()

    def _start_webhook(self) -> WebhookServer | None:
        """The preflight webhook (issue 46) on every replica, from the policy's defaults (a pod has no node yet)."""
        settings = self.settings
        if not settings.preflight_webhook_port:
            return None
        certs = CertificateFiles(os.path.join(settings.preflight_webhook_cert_dir, "tls.crt"),
                                 os.path.join(settings.preflight_webhook_cert_dir, "tls.key"))

        def current() -> WebhookSettings:
            defaults = self.ctx.policy.defaults
            return WebhookSettings(settings.preflight_image, defaults.preflight, defaults.gpu_resources.names)

        webhook = WebhookServer(current, certs, settings.metrics_host, settings.preflight_webhook_port,
                                observe=self.metrics.preflight_admission).start()
        log.info("preflight webhook port open", extra={"port": webhook.port})
        return webhook

    def _sync_caches(self, shutdown: Shutdown, timeout: float) -> bool:
        """start_caches, giving up when no page of the Node list came for ``timeout`` (a fleet's first list may
        take longer than that in all, on a loaded API server) or at once when shutdown is requested (the main
        thread must keep polling it)."""
        self.informer.start()
        started = time.monotonic()
        while not self.informer.wait_for_sync(shutdown.poll_s):
            if shutdown.requested or time.monotonic() > max(started, self.informer.last_progress()) + timeout:
                return False
        return True

    def _elector(self) -> LeaderElector | None:
        """The leader Lease (--leader-elect); with --shards S > 1 there is none: see docs/architecture.md."""
        settings = self.settings
        if not settings.leader_elect or settings.sharded:
            return None

        def watcher(name: str) -> LeaseLock:
            return LeaseLock(self.client, settings.namespace, name, settings.who, settings.lease_duration_s,
                             settings.renew_deadline_s)

        return LeaderElector(
            self.client, settings.namespace, settings.lease_name, settings.who,
            lease_duration=settings.lease_duration_s, renew_deadline=settings.renew_deadline_s,
            retry_period=settings.retry_period_s,
            on_started_leading=self.start_loops, on_stopped_leading=self._lost,
            guard=ModeGuard(settings.namespace, settings.who, LEADER_MODE, settings.lease_name, watcher),
            annotations={HANDOVER_ANNOTATION: HANDOVER_VERSION}, on_conflict=self._mode_conflict,
        )

    def _shard_set(self, settings: Settings) -> ShardSet:
        return ShardSet(self.client, settings.namespace, settings.who, settings.shards,
                        lease_duration=settings.lease_duration_s, renew_deadline=settings.renew_deadline_s,
                        retry_period=settings.retry_period_s, on_change=self._shards_changed,
                        leader_lease=settings.lease_name, on_conflict=self._mode_conflict,
                        shard_hash=settings.shard_hash, on_held=lambda _held: self.informer.repack())

    def _mode_conflict(self, why: str) -> None:
        """Replicas of another mode (a rollout changing --leader-elect / --shards) act instead of this one."""
        self.metrics.mode_waiting.set(1.0 if why else 0.0)
        event = ("GPURemediationWaitingForHandover", f"not acting: {why}", WARNING) if why else \
            ("GPURemediationHandedOver", "no replica of another mode acts any more: acting", NORMAL)
        # Not on the caller's thread: it renews the Leases, and an Event's create may be slow.
        threading.Thread(target=self._controller_event, args=event, name="handover-event", daemon=True).start()

    def _shards_changed(self, owned: frozenset[int]) -> None:
        """A shard taken (its nodes are queued at once) or lost (their steps stop: ``ctx.owns`` says no)."""
        self.metrics.shards_held.set(float(len(owned)))  # and per shard every detect cycle
        gained, self._shards_swept = owned - self._shards_swept, owned
        if self.acting:
            for loop in self.node_loops:
                loop.request_resync()  # on each loop's thread: this one renews the Leases
            if gained:  # its nodes deleted while no replica held it (or before its holder swept): found now
                self.detect.read_soon()  # and its nodes read now, not one interval on (the fast path needs a read)
                threading.Thread(target=self.node_gone.sweep, args=(gained,), name="node-gone-sweep",
                                 daemon=True).start()

    def _fence(self, check: WriteFence) -> WriteFence:
        """A lease fence on every write of this process, each refusal counted and the first one logged."""
        fenced = [False]

        def fence(method: str, path: str) -> None:
            try:
                check(method, path)
            except errors.NotLeader as exc:
                self.metrics.fenced_writes.inc()
                if not fenced[0]:
                    fenced[0] = True
                    log.warning("refusing writes: %s", exc.message)
                raise
            fenced[0] = False

        return fence

    def _lost(self) -> None:
        # Called also when we release the lease on shutdown; only a lease lost while acting is an error.
        if self.acting and not self.ctx.stop.is_set():
            log.error("lost the leader lease: stopping all action")
            self.lost_lease = True
            self.acting = False
            self.ctx.stop.set()
            self._shutdown.request()


def _looks_done(view: NodeView, name: str) -> bool:
    """The informer shows the node back in service (a budget claim's fresh GET then decides)."""
    node = view.get(name)
    return node is None or is_done(safety.node_view(node))
