"""Flags + environment → one frozen Settings object (the policy file is loaded beside it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

SOURCES = ("exporter", "prometheus")


class SettingsError(ValueError):
    """A flag or environment value is unusable; the message names it."""


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
    scrape_interval_s: float = 15.0
    resync_s: float = 10.0
    gpu_node_selector: str = ""  # empty: any node with nvidia.com/gpu capacity
    maintenance_group: str = "gpuremediate.io"
    qps: float = 20.0
    burst: int = 40

    def validate(self) -> Settings:
        if self.source not in SOURCES:
            raise SettingsError(f"--source: expected one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.source == "prometheus" and not self.prometheus_url:
            raise SettingsError("--prometheus-url is required with --source=prometheus")
        if self.scrape_interval_s <= 0:
            raise SettingsError(f"--scrape-interval: must be > 0, got {self.scrape_interval_s}")
        if self.resync_s <= 0:
            raise SettingsError(f"--resync: must be > 0, got {self.resync_s}")
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s * 1.2 > 0:
            raise SettingsError(
                "--leader-elect-lease-duration > --leader-elect-renew-deadline > 1.2 x --leader-elect-retry-period "
                f"> 0 is required, got {self.lease_duration_s:g}s, {self.renew_deadline_s:g}s, "
                f"{self.retry_period_s:g}s")
        if not 0 <= self.metrics_port <= 65535:
            raise SettingsError(f"--metrics-addr: port out of range: {self.metrics_port}")
        if self.log_format not in ("text", "json"):
            raise SettingsError(f"--log-format: expected text or json, got {self.log_format!r}")
        return self

    @property
    def who(self) -> str:
        return self.identity or os.environ.get("POD_NAME") or os.uname().nodename


def parse_addr(addr: str) -> tuple[str, int]:
    """``:8080`` / ``127.0.0.1:8080`` / ``[::1]:8080`` → (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise SettingsError(f"--metrics-addr: expected [HOST]:PORT, got {addr!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_duration(text: str, what: str) -> float:
    """``15``, ``15s``, ``500ms``, ``5m``, ``2h``, ``7d`` → seconds."""
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
    if value < 0:
        raise SettingsError(f"{what}: must not be negative, got {text!r}")
    return value
