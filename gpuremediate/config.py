"""Flags + environment → one frozen Settings object (the policy file is loaded beside it)."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpuremediate.kube.handover import SHARD_HASHES
from gpuremediate.kube.shards import MAX_SHARDS
from gpuremediate.vocab.schema import DNS_LABEL_WANTED, DNS_SUBDOMAIN_WANTED, is_dns_label, is_dns_subdomain

SOURCES = ("exporter", "prometheus")
SCRAPE_INTERVAL_S = 15.0  # --scrape-interval's default
# ... with --source=prometheus: its fault poll finds an XID about a second after Prometheus has it whatever this
# is, and each full read makes Prometheus read every GPU's temperatures (at 5,000 nodes 80,000 series, 1.5-3
# CPU-seconds of a loaded Prometheus): every 15 s that alone was most of the 5 CPU-s a minute it may cost.
PROMETHEUS_READ_INTERVAL_S = 60.0
MAX_DURATION_S = 30 * 86400.0  # far below threading's TIMEOUT_MAX; no wait of this controller is longer
MAX_SCRAPE_TIMEOUT_S = 600.0
MAX_INTERVAL_S = 86400.0
MAX_LEASE_S = 3600.0
HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class SettingsError(ValueError):
    """A flag or environment value is unusable; the message names it."""

MAX_QPS = 10_000.0  # client-side requests a second to the API server: past this, a typo
MAX_LOOP_WORKERS = 64


@dataclass(frozen=True)
class Settings:
    kubeconfig: str | None = None
    context: str | None = None
    policy_path: str | None = None
    dry_run: bool = False
    namespace: str = "gpuremediate-system"  # the controller's own: lease, breaker state
    jobs_namespace: str = "gpuremediate-jobs"
    event_namespace: str = "default"  # Node events must live in "default"
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8080
    log_format: str = "text"
    log_level: str = "info"
    leader_elect: bool = False
    lease_name: str = "gpuremediate"
    lease_duration_s: float = 15.0  # client-go's defaults; a leader acts only within renew_deadline_s of a renewal
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    shards: int = 1  # >1: each replica owns the nodes of the gpuremediate-shard-<i> Leases it holds
    shard_hash: str = "sha256"  # how a node's name picks its shard; hashmod: as Prometheus' hashmod relabelling
    identity: str = ""
    source: str = "exporter"
    exporter_namespace: str = "gpu-operator"
    exporter_selector: str = "app=nvidia-dcgm-exporter"
    exporter_port: int = 9400
    exporter_path: str = "/metrics"
    scrape_timeout_s: float = 5.0
    prometheus_url: str = ""
    prometheus_token_file: str = ""
    prometheus_ca_file: str = ""
    prometheus_node_label: str = "Hostname"
    prometheus_query_timeout_s: float = 0.0  # 0: scales with the fleet (the source's own default)
    prometheus_max_bytes: int = 0  # 0: scales with the fleet (the source's own default)
    prometheus_fault_poll_s: float = 1.0  # the fault fast path between reads; 0: off
    prometheus_shard_label: str = ""  # the series' hashmod shard label: a sharded replica asks for its shards only
    scrape_interval_s: float = 15.0  # --scrape-interval; without it PROMETHEUS_READ_INTERVAL_S for that source
    resync_s: float = 10.0
    # Workers per node loop (drain, repair, validate, quarantine): nodes stepped at once. A step is a few API calls
    # in a row; on a slow API server (seconds a request) one worker made every node wait for all the others.
    loop_workers: int = 4
    gpu_node_selector: str = ""  # empty: any node with a GPU resource (nvidia.com/gpu, nvidia.com/mig-*)
    maintenance_group: str = "gpuremediate.io"
    # A burst's pace (bench/burst.py, 750 of 5,000 nodes faulting at once: 20/40 cordoned 6 a second, P90 116 s;
    # 200/400 55 a second, P90 13 s). At steady state the controller sends nothing, and the server's API
    # Priority and Fairness keeps a burst within its flow's share (429 + Retry-After, honoured).
    qps: float = 200.0
    burst: int = 400
    preflight_webhook_port: int = 0  # 0: the preflight webhook is not served (issue 46)
    preflight_webhook_cert_dir: str = "/var/run/gpuremediate/webhook-tls"
    preflight_image: str = ""

    def validate(self) -> Settings:
        """Every flag checked at start, so a bad one is one clear line and exit 2, never a fault later."""
        if self.source not in SOURCES:
            raise SettingsError(f"--source: expected one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.source == "prometheus" and not self.prometheus_url:
            raise SettingsError("--prometheus-url is required with --source=prometheus")
        if self.log_format not in ("text", "json"):
            raise SettingsError(f"--log-format: expected text or json, got {self.log_format!r}")
        for flag, seconds, maximum in self._durations():
            check_duration(seconds, flag, maximum)
        if not (0 < self.qps <= MAX_QPS) or not (1 <= self.burst <= MAX_QPS):
            raise SettingsError(f"--kube-api-qps / --kube-api-burst: expected 0 < qps <= {MAX_QPS:g} and "
                                f"1 <= burst <= {MAX_QPS:g}, got {self.qps:g} / {self.burst}")
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s * 1.2 > 0:
            raise SettingsError(
                "--leader-elect-lease-duration > --leader-elect-renew-deadline > 1.2 x --leader-elect-retry-period "
                f"> 0 is required, got {self.lease_duration_s:g}s, {self.renew_deadline_s:g}s, "
                f"{self.retry_period_s:g}s")
        if not 1 <= self.loop_workers <= MAX_LOOP_WORKERS:
            raise SettingsError(f"--loop-workers: expected 1 to {MAX_LOOP_WORKERS}, got {self.loop_workers}")
        if not 1 <= self.shards <= MAX_SHARDS:
            raise SettingsError(f"--shards: expected 1 to {MAX_SHARDS}, got {self.shards}")
        if self.shard_hash not in SHARD_HASHES:
            raise SettingsError(f"--shard-hash: expected one of {', '.join(SHARD_HASHES)}, got {self.shard_hash!r}")
        if self.prometheus_shard_label:
            self._validate_shard_label()
        if any(c.isspace() for c in self.identity) or len(self.identity) > 253:
            raise SettingsError(f"--identity: no whitespace allowed, at most 253 characters, got {self.identity!r}")
        check_host(self.metrics_host, "--metrics-addr")
        if not 0 <= self.metrics_port <= 65535:
            raise SettingsError(f"--metrics-addr: port out of range: {self.metrics_port}")
        if not 0 <= self.preflight_webhook_port <= 65535:
            raise SettingsError("--preflight-webhook-port: expected 0 (off) to 65535, got "
                                f"{self.preflight_webhook_port}")
        if self.preflight_webhook_port and not self.preflight_image.strip():
            raise SettingsError("--preflight-image is required with --preflight-webhook-port (the controller's image)")
        if not 1 <= self.exporter_port <= 65535:
            raise SettingsError(f"--exporter-port: expected 1-65535, got {self.exporter_port}")
        if not self.exporter_path.startswith("/") or any(c.isspace() for c in self.exporter_path):
            raise SettingsError(f"--exporter-path: expected a URL path starting with /, got {self.exporter_path!r}")
        for flag, name in (("--namespace", self.namespace), ("--jobs-namespace", self.jobs_namespace),
                           ("--exporter-namespace", self.exporter_namespace)):
            check_dns_label(name, flag)
        check_dns_subdomain(self.lease_name, "--lease-name")
        check_dns_subdomain(self.maintenance_group, "--maintenance-group")
        for flag, selector in (("--exporter-selector", self.exporter_selector),
                               ("--gpu-node-selector", self.gpu_node_selector)):
            check_selector(selector, flag)
        if self.source == "prometheus":
            self._validate_prometheus()
        return self

    def _durations(self) -> list[tuple[str, float, float]]:
        return [
            ("--scrape-timeout", self.scrape_timeout_s, MAX_SCRAPE_TIMEOUT_S),
            *([("--prometheus-query-timeout", self.prometheus_query_timeout_s, MAX_SCRAPE_TIMEOUT_S)]
              if self.prometheus_query_timeout_s else []),
            ("--scrape-interval", self.scrape_interval_s, MAX_INTERVAL_S),
            ("--resync", self.resync_s, MAX_INTERVAL_S),
            ("--leader-elect-lease-duration", self.lease_duration_s, MAX_LEASE_S),
            ("--leader-elect-renew-deadline", self.renew_deadline_s, MAX_LEASE_S),
            ("--leader-elect-retry-period", self.retry_period_s, MAX_LEASE_S),
        ]

    def _validate_shard_label(self) -> None:
        label = self.prometheus_shard_label
        if not LABEL_NAME.fullmatch(label) or label.startswith("__"):
            raise SettingsError(f"--prometheus-shard-label: not a Prometheus label name: {label!r}")
        if self.source != "prometheus" or not self.sharded or self.shard_hash != "hashmod":
            raise SettingsError("--prometheus-shard-label needs --source=prometheus, --shards above 1 and "
                                "--shard-hash=hashmod (the label is Prometheus' hashmod of the node name mod --shards: "
                                "docs/sizing.md)")

    def _validate_prometheus(self) -> None:
        if self.prometheus_max_bytes and not 1024 <= self.prometheus_max_bytes <= 4 * 1024**3:
            raise SettingsError(f"--prometheus-max-bytes: expected 1024 to 4 GiB, got {self.prometheus_max_bytes}")
        url = urlsplit(self.prometheus_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise SettingsError(f"--prometheus-url: expected an http:// or https:// URL with a host, got "
                                f"{self.prometheus_url!r}")
        try:
            url.port  # noqa: B018  (raises ValueError for a port out of range)
        except ValueError as exc:
            raise SettingsError(f"--prometheus-url: {exc}") from None
        if self.prometheus_token_file:
            check_readable(self.prometheus_token_file, "--prometheus-token-file")
        if self.prometheus_ca_file:
            check_readable(self.prometheus_ca_file, "--prometheus-ca-file")
            try:
                ssl.create_default_context(cafile=self.prometheus_ca_file)
            except (ssl.SSLError, ValueError) as exc:
                raise SettingsError(f"--prometheus-ca-file: not a PEM CA bundle: {exc}") from None
        if not LABEL_NAME.fullmatch(self.prometheus_node_label):
            raise SettingsError(f"--prometheus-node-label: not a Prometheus label name: "
                                f"{self.prometheus_node_label!r}")

    @property
    def sharded(self) -> bool:
        return self.shards > 1

    @property
    def who(self) -> str:
        return self.identity or os.environ.get("POD_NAME") or os.uname().nodename


def parse_addr(addr: str) -> tuple[str, int]:
    """``:8080`` / ``127.0.0.1:8080`` / ``[::1]:8080`` → (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise SettingsError(f"--metrics-addr: expected [HOST]:PORT, got {addr!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_duration(text: str, what: str, maximum: float = MAX_DURATION_S) -> float:
    """``15``, ``15s``, ``500ms``, ``5m``, ``2h``, ``7d`` → seconds: finite, above 0, at most ``maximum``."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    raw = text.strip()
    for suffix in ("ms", "s", "m", "h", "d"):
        if raw.endswith(suffix):
            number, scale = raw[: -len(suffix)], units[suffix]
            break
    else:
        number, scale = raw, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise SettingsError(f"{what}: expected a duration like 15s, 5m or 2h, got {text!r}") from None
    return check_duration(value, what, maximum, shown=text)


def check_duration(seconds: float, what: str, maximum: float = MAX_DURATION_S, *, shown: str | None = None) -> float:
    shown = shown if shown is not None else f"{seconds:g}s"
    if not math.isfinite(seconds):
        raise SettingsError(f"{what}: expected a finite duration, got {shown!r}")
    if seconds < 0:
        raise SettingsError(f"{what}: must not be negative, got {shown!r}")
    if seconds == 0:
        raise SettingsError(f"{what}: must be above 0, got {shown!r}")
    if seconds > maximum:
        raise SettingsError(f"{what}: at most {_human(maximum)}, got {shown!r}")
    return seconds


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def check_dns_label(name: str, what: str) -> None:
    if not is_dns_label(name):
        raise SettingsError(f"{what}: {DNS_LABEL_WANTED}, got {name!r}")


def check_dns_subdomain(name: str, what: str) -> None:
    if not is_dns_subdomain(name):
        raise SettingsError(f"{what}: {DNS_SUBDOMAIN_WANTED}, got {name!r}")


def check_selector(text: str, what: str) -> None:
    from gpuremediate.policy.selector import SelectorError, parse_selector

    try:
        parse_selector(text)
    except SelectorError as exc:
        raise SettingsError(f"{what}: not a label selector: {exc}") from None


def check_host(host: str, what: str) -> None:
    """An IP address or a host name (a dotted quad that is no IPv4 address is refused, not looked up)."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if ":" in host or all(part.isascii() and part.isdigit() for part in host.split(".")) or not all(
            HOST_LABEL.fullmatch(part) for part in host.split(".")) or len(host) > 253:
        raise SettingsError(f"{what}: {host!r} is not an IP address or a host name")


def check_readable(path: str, what: str) -> None:
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise SettingsError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from None
