"""The controller's metrics (design §7), all prefixed ``gpuremediate_``."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuremediate.kube import errors
from gpuremediate.obs.metrics import Counter, Gauge, Histogram, Registry

PREFIX = "gpuremediate_"
API_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)  # client-go's request latency


@dataclass
class ControllerMetrics:
    registry: Registry = field(default_factory=Registry)

    def __post_init__(self) -> None:
        r = self.registry
        self.nodes = Gauge(PREFIX + "nodes", "GPU nodes by remediation state.", ["state"])
        self.node_state = Gauge(
            PREFIX + "node_state", "1 per GPU node out of healthy, labelled with its state (healthy nodes have no "
            "series: as many series as nodes out of service).", ["node", "state"]
        )
        self.node_unknown = Gauge(
            PREFIX + "node_health_unknown", "1 per GPU node whose health is unknown (none while most of the fleet's "
            "is: gpuremediate_fleet_health_unknown says so).", ["node"]
        )
        self.transitions = Counter(
            PREFIX + "transitions_total", "Node state transitions.", ["from", "to", "reason", "dry_run"]
        )
        self.faults = Counter(PREFIX + "faults_total", "GPU faults detected (new occurrences).", ["kind", "code"])
        self.detect_cycles = Counter(
            PREFIX + "detect_cycles_total", "Detect cycles completed (each read every GPU node this replica owns)."
        )
        self.evictions = Counter(PREFIX + "evictions_total", "Pod eviction attempts by result.", ["result", "dry_run"])
        self.drain_seconds = Histogram(PREFIX + "drain_seconds", "Time from drain start to drain complete.")
        self.remediation_seconds = Histogram(
            PREFIX + "remediation_seconds", "Time a remediation action took.", ["action"]
        )
        self.escalations = Counter(
            PREFIX + "escalations_total", "Repairs moved to the next escalation ladder rung.", ["from", "to"]
        )
        self.diagnostics = Counter(
            PREFIX + "diagnostics_total", "Diagnostics Jobs before a first repair, by outcome.", ["outcome"]
        )
        self.budget_in_use = Gauge(PREFIX + "budget_in_use", "GPU nodes out of service, counted against the budget.")
        self.budget_limit = Gauge(PREFIX + "budget_limit", "Most GPU nodes allowed out of service at once.")
        self.isolated_gpus = Gauge(
            PREFIX + "isolated_gpus",
            "GPUs taken out alone, by a DeviceTaintRule of ours or the device plugin (their nodes stay in service)."
        )
        self.degradation_gpus = Gauge(
            PREFIX + "degradation_gpus", "GPUs the [degradation] detector finds now, by finding kind.", ["kind"]
        )
        self.nic_nodes = Gauge(
            PREFIX + "nic_nodes", "GPU nodes with a NIC finding of this kind now (the agent's GPUNetworkHealthy, or "
            "node_exporter's InfiniBand series judged by the controller).", ["kind"]
        )
        self.circuit_breaker_open = Gauge(PREFIX + "circuit_breaker_open", "1 while the circuit breaker is open.")
        self.breaker_look_held = Gauge(
            PREFIX + "breaker_look_held", "New faults (GPU nodes) held by the breaker's storm look now: faults arrived "
            "faster than [breaker] look_nodes / look_percent, and wait up to look_s to see whether the storm passes "
            "the threshold."
        )
        self.breaker_looks = Counter(
            PREFIX + "breaker_looks_total", "Storm looks of the breaker, by outcome: opened (a look began), released "
            "(it ended under the threshold: its faults went on), breaker-open (the storm passed the threshold "
            "during it).", ["outcome"]
        )
        self.policy_empty = Gauge(
            PREFIX + "policy_file_empty", "1 when the policy file (--policy) sets nothing (empty or only comments): "
            "the built-in defaults apply."
        )
        self.paused = Gauge(PREFIX + "paused", "1 while new work is paused (`gpuremediate pause` or the annotation).")
        self.domains_tripped = Gauge(
            PREFIX + "domain_breaker_open", "Failure domains (label values) whose breaker is open: no new work there."
        )
        self.trend_requests = Counter(
            PREFIX + "trend_maintenance_requests_total", "MaintenanceRequests filed for failing trends ([degradation] "
            "trend_action = \"maintenance\"), by result (filed, dry_run, refused).", ["result"]
        )
        self.domain_nodes_out = Gauge(
            PREFIX + "domain_nodes_out", "GPU nodes out of service per NVLink domain ([fabric] domain_label), for the "
            "domains with at least one.", ["domain"]
        )
        self.domain_action_trays = Counter(
            PREFIX + "domain_action_trays_total", "Trays taken into their NVLink domain's domain action ([fabric] "
            "domain_action), by the action: one per tray of each domain decision.", ["action"]
        )
        self.preflight_admissions = Counter(
            PREFIX + "preflight_admissions_total", "Pods the preflight webhook answered, by what it decided.",
            ["result"])
        self.preflight_admission_seconds = Histogram(
            PREFIX + "preflight_admission_seconds", "Time the preflight webhook took to answer one AdmissionReview.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.preflights_failed = Counter(
            PREFIX + "preflights_failed_total", "Pods whose preflight failed a GPU, as the failed-pod watch read "
            "them (each pod once).")
        self.idle_checks = Counter(
            PREFIX + "idle_checks_total", "Idle-node preflight Jobs by result (passed, failed, unknown).", ["result"])
        self.notifications = Counter(
            PREFIX + "notifications_total", "Webhook notifications by kind and result (sent, failed, dropped).",
            ["kind", "result"],
        )
        self.api_request_seconds = Histogram(
            PREFIX + "api_request_duration_seconds", "Kubernetes API requests by HTTP method: time from sending "
            "one to its response's headers (a watch: until its stream opens; each retry is one).", ["verb"],
            buckets=API_BUCKETS)
        self.api_rate_limiter_seconds = Histogram(
            PREFIX + "api_rate_limiter_duration_seconds", "Time a Kubernetes API request waited on the controller's "
            "own rate limit (--qps, --burst) before it was sent, by HTTP method.", ["verb"], buckets=API_BUCKETS)
        self.scrape_seconds = Histogram(
            PREFIX + "scrape_seconds",
            "Time to read one node's GPU metrics.",
            ["source"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.scrape_errors = Counter(PREFIX + "scrape_errors_total", "Failed metric reads.", ["source"])
        self.scrape_malformed = Counter(
            PREFIX + "scrape_malformed_lines_total",
            "Lines of a node's metrics that could not be read (skipped, never guessed at), per detect cycle's read.",
            ["source"],
        )
        self.unknown_nodes = Gauge(
            PREFIX + "nodes_unknown", "GPU nodes whose health is unknown (exporter down or stale)."
        )
        self.leader = Gauge(PREFIX + "leader", "1 while this replica holds the leader lease.")
        self.blocked_nodes = Gauge(PREFIX + "blocked_nodes", "Nodes waiting, by reason.", ["reason"])
        self.dry_run = Gauge(PREFIX + "dry_run", "1 when running in dry-run mode (no mutation is sent).")
        self.maintenance_request_age = Gauge(
            PREFIX + "maintenance_request_age_seconds", "Age of each active MaintenanceRequest.", ["name"]
        )
        self.api_errors = Counter(PREFIX + "api_errors_total", "Kubernetes API errors by reason.", ["reason"])
        self.permission_denied = Counter(
            PREFIX + "permission_denied_total", "Requests RBAC refused (403) on plugin kinds, by what was refused.",
            ["verb", "group", "resource", "namespace"],
        )
        self.fleet_unknown = Gauge(
            PREFIX + "fleet_health_unknown", "1 while most GPU nodes' health is unknown (the source itself failing)."
        )
        self.source_problem = Gauge(
            PREFIX + "source_problem",
            "1 while the detect loop says its GPU-health source cannot be read: never-read (no read succeeded since "
            "start), slow (a read longer than --scrape-interval).", ["problem"],
        )
        self.prometheus_mode = Gauge(
            PREFIX + "prometheus_mode",
            "--source=prometheus: 1 for how the source reads (recorded: gpuremediate's recording rules' output; "
            "raw: dcgm-exporter's series, aggregated at every query).", ["mode"],
        )
        self.events_dropped = Counter(
            PREFIX + "events_dropped_total",
            "Events and conditions not written (reason: queue-full, rate-limited, stopped).", ["reason"]
        )
        self.fenced_writes = Counter(
            PREFIX + "fenced_writes_total",
            "Writes refused before they were sent: this replica's leader lease was past its renew deadline.",
        )
        self.shards = Gauge(PREFIX + "shards", "--shards: the number of shard Leases (1: not sharded, one leader).")
        self.shards_held = Gauge(PREFIX + "shards_held", "Shard Leases (--shards) this replica holds now.")
        self.shard_nodes = Gauge(PREFIX + "shard_nodes", "GPU nodes in each shard this replica holds.", ["shard"])
        self.clock_offset = Gauge(
            PREFIX + "clock_offset_seconds",
            "This machine's wall clock minus the controller's (the API server's time, advanced by the monotonic "
            "clock): a step of the machine's clock shows here and moves no timeout.",
        )
        self.records_refused = Gauge(
            PREFIX + "nodes_record_refused",
            "GPU nodes whose record the API server refuses (annotations full): their fault is held, not acted on.",
        )
        self.nodes_deleted_mid_flow = Counter(
            PREFIX + "nodes_deleted_mid_flow_total",
            "GPU nodes deleted by someone else while in a flow, by the state they were in (the flow ended there).",
            ["state"],
        )
        self.replacements = Counter(
            PREFIX + "replacements_total",
            "GPU nodes whose owner was told to replace them (the replace rung: a Machine or NodeClaim deleted), by "
            "provider.",
            ["provider"],
        )
        self.nodes_replaced = Counter(
            PREFIX + "nodes_replaced_total",
            "GPU nodes gone after our own replace (their flow ended as replaced).",
        )
        self.mode_waiting = Gauge(
            PREFIX + "mode_handover_waiting",
            "1 while this replica acts on nothing because replicas of another --leader-elect / --shards mode act.",
        )
        for metric in (
            self.nodes,
            self.node_state,
            self.node_unknown,
            self.transitions,
            self.faults,
            self.detect_cycles,
            self.evictions,
            self.drain_seconds,
            self.remediation_seconds,
            self.escalations,
            self.diagnostics,
            self.budget_in_use,
            self.budget_limit,
            self.isolated_gpus,
            self.degradation_gpus,
            self.nic_nodes,
            self.trend_requests,
            self.circuit_breaker_open,
            self.breaker_look_held,
            self.breaker_looks,
            self.paused,
            self.policy_empty,
            self.domains_tripped,
            self.domain_nodes_out,
            self.domain_action_trays,
            self.notifications,
            self.preflight_admissions,
            self.preflight_admission_seconds,
            self.preflights_failed,
            self.idle_checks,
            self.scrape_seconds,
            self.scrape_errors,
            self.scrape_malformed,
            self.unknown_nodes,
            self.leader,
            self.blocked_nodes,
            self.dry_run,
            self.maintenance_request_age,
            self.api_errors,
            self.fleet_unknown,
            self.source_problem,
            self.prometheus_mode,
            self.events_dropped,
            self.permission_denied,
            self.fenced_writes,
            self.shards,
            self.shards_held,
            self.shard_nodes,
            self.mode_waiting,
            self.records_refused,
            self.nodes_deleted_mid_flow,
            self.replacements,
            self.nodes_replaced,
            self.clock_offset,
            self.api_request_seconds,
            self.api_rate_limiter_seconds,
        ):
            r.register(metric)

    def preflight_admission(self, result: str, seconds: float) -> None:
        self.preflight_admissions.inc(result=result)
        self.preflight_admission_seconds.observe(seconds)

    def api_request(self, verb: str, seconds: float, limiter_wait_s: float) -> None:
        """One API request's attempt (kube/client.py's ``RequestObserver``)."""
        self.api_request_seconds.observe(seconds, verb=verb)
        self.api_rate_limiter_seconds.observe(limiter_wait_s, verb=verb)

    def count_api_error(self, exc: errors.KubeError) -> None:
        reason = exc.reason if isinstance(exc, errors.ApiError) else "Transport"
        self.api_errors.inc(reason=reason or "Unknown")
