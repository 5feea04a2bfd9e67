"""A real Prometheus for tests and benchmarks: backfilled with ``promtool tsdb create-blocks-from
openmetrics``, scraping local targets if asked, on a free loopback port with a temporary directory.

Debian's ``prometheus`` package provides both binaries (``apt-get install -y prometheus``).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Labels = Mapping[str, str]
Point = tuple[float, float]  # (unix seconds, value)


def binaries() -> tuple[str, str] | None:
    """(prometheus, promtool), or None when either is not installed."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    return (prometheus, promtool) if prometheus and promtool else None


def _label_text(labels: Labels) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items()))


def openmetrics(families: Mapping[str, Iterable[tuple[Labels, Sequence[Point]]]]) -> str:
    """OpenMetrics text of gauge families, every sample timestamped (what promtool backfills)."""
    out: list[str] = []
    for name, series in families.items():
        out.append(f"# TYPE {name} gauge")
        for labels, points in series:
            lab = _label_text(labels)
            out.extend(f"{name}{{{lab}}} {value:g} {ts:.3f}" for ts, value in points)
    out.append("# EOF")
    return "\n".join(out) + "\n"


def backfill(text: str, data_dir: Path, promtool: str) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    source = data_dir.parent / "backfill.om"
    source.write_text(text)
    # Blocks of up to 1 day; recent data goes in its own block, which Prometheus >= 2.39 accepts.
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
                    str(source), str(data_dir)], check=True, capture_output=True, timeout=600)
    source.unlink()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Target:
    address: str  # host:port
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class PromServer:
    """``prometheus`` serving ``workdir/data``; scrapes ``targets`` every ``scrape_interval``."""

    workdir: Path
    prometheus: str
    targets: Sequence[Target] = ()
    scrape_interval: str = "1s"
    honor_labels: bool = False
    rule_files: Sequence[Path] = ()
    evaluation_interval: str = "15s"
    metric_relabel_configs: Sequence[Mapping[str, Any]] = ()  # the scrape job's, as in prometheus.yml
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        lines = ["global:", f"  scrape_interval: {self.scrape_interval}",
                 f"  scrape_timeout: {self.scrape_interval}", f"  evaluation_interval: {self.evaluation_interval}"]
        if self.rule_files:
            lines += ["rule_files:"] + [f'  - "{path}"' for path in self.rule_files]
        lines.append("scrape_configs:")
        if self.targets:
            lines += ["  - job_name: dcgm", f"    honor_labels: {str(self.honor_labels).lower()}"]
            if self.metric_relabel_configs:  # JSON is YAML's flow style
                lines.append(f"    metric_relabel_configs: {json.dumps(list(self.metric_relabel_configs))}")
            lines.append("    static_configs:")
            for t in self.targets:
                labels = ", ".join(f'{k}: "{v}"' for k, v in t.labels.items())
                lines += [f'      - targets: ["{t.address}"]', f"        labels: {{{labels}}}"]
        else:
            lines[-1] += " []"
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 60.0) -> PromServer:
        (self.workdir / "prometheus.yml").write_text(self.config())
        for _ in range(3):  # a free port can be taken between the probe and the bind: try another
            port = free_port()
            log = (self.workdir / "prometheus.log").open("wb")
            self.proc = subprocess.Popen(
                [self.prometheus, f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                 "--storage.tsdb.retention.time=30d", "--log.level=warn", "--web.enable-lifecycle"],
                stdout=log, stderr=subprocess.STDOUT)
            log.close()
            self.url = f"http://127.0.0.1:{port}"
            if self._ready(timeout_s):
                return self
            self.stop()
        raise RuntimeError(f"prometheus did not become ready; see {self.workdir / 'prometheus.log'}")

    def reload(self) -> None:
        """Rewrite the configuration (targets, rule files) and have the running Prometheus load it."""
        (self.workdir / "prometheus.yml").write_text(self.config())
        request = urllib.request.Request(self.url + "/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=60) as resp:
            resp.read()

    def _ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> PromServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


POLICY_FAMILIES = (
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
)


def gpu_labels(node: str, gpu: int, exporter_ip: str = "10.0.0.1") -> dict[str, str]:
    """Labels of one GPU's series as Prometheus stores them behind a ServiceMonitor (honor_labels false):
    the exporter's own pod/namespace as pod/namespace, the workload's as exported_*."""
    return {
        "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu:02d}", "pci_bus_id": f"00000000:{gpu + 1:02X}:00.0",
        "device": f"nvidia{gpu}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": node,
        "DCGM_FI_DRIVER_VERSION": "570.124.06", "instance": f"{exporter_ip}:9400", "job": "nvidia-dcgm-exporter",
        "container": "nvidia-dcgm-exporter", "namespace": "gpu-operator", "pod": f"nvidia-dcgm-exporter-{node}",
        "exported_container": "train", "exported_namespace": "ml", "exported_pod": f"train-{node}-{gpu}",
    }


def fleet_families(nodes: Mapping[str, tuple[float, float]], gpus: int = 8, step_s: float = 15.0,
                   xid: Mapping[str, tuple[int, int]] | None = None,
                   ) -> dict[str, list[tuple[Labels, list[Point]]]]:
    """dcgm-exporter series for each node over its (first, last) sample time; ``xid``: node -> (gpu, code)."""
    xid = xid or {}
    families: dict[str, list[tuple[Labels, list[Point]]]] = {name: [] for name in POLICY_FAMILIES}
    for node, (first, last) in nodes.items():
        times = [first + i * step_s for i in range(int((last - first) // step_s) + 1)]
        for gpu in range(gpus):
            labels = gpu_labels(node, gpu)
            code = xid[node][1] if node in xid and xid[node][0] == gpu else 0
            values = {"DCGM_FI_DEV_XID_ERRORS": code, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
                      "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0, "DCGM_FI_DEV_GPU_TEMP": 40 + gpu,
                      "DCGM_FI_DEV_MEMORY_TEMP": 45 + gpu}
            for name in POLICY_FAMILIES:
                families[name].append((labels, [(t, float(values[name])) for t in times]))
    return families
