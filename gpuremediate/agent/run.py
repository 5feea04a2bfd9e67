"""The agent's loop: every interval, read the kernel log and nvidia-smi, assess, publish, export metrics.

Everything one cycle needs is injected (the Kubernetes client, the nvidia-smi source, the clocks), so a
test drives ``cycle()`` directly; ``run()`` only repeats it until the stop event.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuremediate.agent.health import Assessment, Inputs, SmiResult, assess, expected_gpus, update_inventory
from gpuremediate.agent.kmsg import (
    BOOT_ID_PATH,
    KIND_SXID,
    KMSG_PATH,
    KernelEvent,
    KmsgReader,
    ResumePoint,
    load_state,
    read_boot_id,
    save_state,
)
from gpuremediate.agent.metrics import AgentMetrics
from gpuremediate.agent.network import DEFAULT_SYSFS, NetworkWatch
from gpuremediate.agent.publish import DEFAULT_HEARTBEAT_S, ConditionPublisher
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NODES
from gpuremediate.policy.config import Policy
from gpuremediate.policy.evaluate import PolicyMemory
from gpuremediate.signals.model import GpuReading
from gpuremediate.signals.nvidiasmi import NvidiaSmiError, NvidiaSmiSource

log = logging.getLogger(__name__)

DEFAULT_STATE_PATH = "/var/lib/gpuremediate-agent/state.json"
MAX_RECENT_EVENTS = 10_000  # bounds the window (and the state file) under an XID storm


@dataclass(frozen=True)
class AgentSettings:
    node_name: str
    kmsg_path: str = KMSG_PATH
    state_path: str = DEFAULT_STATE_PATH
    boot_id_path: str = BOOT_ID_PATH
    nvidia_smi: str | None = None
    interval_s: float = 30.0
    smi_timeout_s: float = 20.0
    hang_after: int = 2  # nvidia-smi timeouts in a row before the driver counts as hung
    window_s: float = 300.0  # how long a kernel event counts for health (every one is counted in metrics)
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    expected_gpus: int | None = None  # default: from the node (health.expected_gpus)
    sysfs_root: str = DEFAULT_SYSFS  # where class/infiniband and class/net are read ([network], agent/network.py)


def monotonic_us() -> int:
    """The clock of /dev/kmsg's timestamps (the kernel's local clock, monotonic since boot)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class SmiRunner:
    """Runs nvidia-smi; on a timeout kills it and never waits on it again (a process stuck in the driver
    cannot be reaped): while it is still stuck, the next run is a timeout at once, not a new stuck process."""

    def __init__(self) -> None:
        self.timed_out = False
        self.stuck: list[subprocess.Popen[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        self.stuck = [p for p in self.stuck if p.poll() is None]
        if self.stuck:
            self.timed_out = True
            raise subprocess.TimeoutExpired(list(argv), timeout_s)
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace")
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                self.stuck.append(proc)
            self.timed_out = True
            raise
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        client: KubeClient,
        policy: Policy,
        *,
        metrics: AgentMetrics | None = None,
        smi: NvidiaSmiSource | None = None,
        clock: Callable[[], float] = time.time,
        kernel_clock_us: Callable[[], int] = monotonic_us,
    ) -> None:
        self.settings = settings
        self.client = client
        self.policy = policy
        self.metrics = metrics or AgentMetrics()
        self.runner = SmiRunner()
        self.smi = smi or NvidiaSmiSource(settings.nvidia_smi, settings.node_name, settings.smi_timeout_s,
                                          runner=self.runner)
        self.clock = clock
        self.kernel_clock_us = kernel_clock_us
        self.publisher = ConditionPublisher(client, settings.node_name, settings.heartbeat_s)
        self.memory = PolicyMemory()
        self.inventory: dict[str, GpuReading] = {}
        self.network = NetworkWatch(settings.node_name, settings.sysfs_root)
        self.timeouts_in_a_row = 0
        self.reader: KmsgReader | None = None
        self.point = ResumePoint("")
        self.kmsg_note = ""
        self.last_cycle = 0.0

    # ---- the kernel log ------------------------------------------------------------------------------

    def open_kernel_log(self) -> None:
        boot_id = read_boot_id(self.settings.boot_id_path)
        self.point, note = load_state(Path(self.settings.state_path), boot_id)
        if note:
            log.warning(note)
        try:
            self.reader = KmsgReader(self.settings.kmsg_path, self.point.seq)
        except OSError as exc:
            self.kmsg_note = (f"cannot read {self.settings.kmsg_path}: {exc} (needs CAP_SYSLOG when "
                              "kernel.dmesg_restrict=1, and the device in the container)")
            log.error(self.kmsg_note)
        self.metrics.kmsg_readable.set(1.0 if self.reader is not None else 0.0)

    def _follow_reboot(self) -> None:
        """A new boot id while running (a node that rebooted without the pod being recreated, as under
        gpu-sim): the old boot's window is dropped and the new boot's log is read from its start."""
        boot_id = read_boot_id(self.settings.boot_id_path)
        if not boot_id or boot_id == self.point.boot_id:
            return
        log.info("the node rebooted (new boot id): reading the new boot's kernel log from its start",
                 extra={"node": self.settings.node_name})
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self.open_kernel_log()

    def _kernel_events(self) -> tuple[KernelEvent, ...]:
        self._follow_reboot()
        if self.reader is None:
            return self.point.recent
        try:
            polled = self.reader.poll()
        except OSError as exc:  # EPIPE and EAGAIN are handled inside; anything else: this cycle without it
            log.warning("reading the kernel log failed; next cycle tries again", extra={"error": str(exc)})
            return self.point.recent
        self.metrics.kmsg_records.inc(float(polled.records))
        self.metrics.kmsg_missed.inc(float(polled.lost))
        for event in polled.events:
            self._count(event)
        horizon = self.kernel_clock_us() - int(self.settings.window_s * 1_000_000)
        recent = tuple(e for e in (*self.point.recent, *polled.events) if e.usec >= horizon)[-MAX_RECENT_EVENTS:]
        moved = replace(self.point, seq=polled.last_seq, recent=recent)
        if moved != self.point:
            self.point = moved
            try:
                save_state(Path(self.settings.state_path), moved)
            except OSError as exc:
                log.warning("cannot save the kernel-log resume point", extra={"error": str(exc)})
        return recent

    def _count(self, event: KernelEvent) -> None:
        if event.kind == KIND_SXID:
            self.metrics.sxid.inc(device=event.device or event.bus_id, sxid=str(event.code),
                                  severity="fatal" if event.fatal else "non-fatal")
            return
        self.metrics.xid.inc(pci_bus_id=event.bus_id, xid=str(event.code))

    # ---- nvidia-smi ----------------------------------------------------------------------------------

    def _read_smi(self) -> SmiResult:
        self.runner.timed_out = False
        started = time.monotonic()
        try:
            readings = self.smi.read_node()
        except NvidiaSmiError as exc:
            timed_out = self.runner.timed_out or "did not answer" in exc.reason
            self.timeouts_in_a_row = self.timeouts_in_a_row + 1 if timed_out else 0
            self.metrics.smi_failures.inc(reason="timeout" if timed_out else "error")
            return SmiResult(error=str(exc), timed_out=timed_out, exit_code=exc.exit_code)
        finally:
            self.metrics.smi_seconds.observe(time.monotonic() - started)
        self.timeouts_in_a_row = 0
        self.inventory = update_inventory(self.inventory, readings)
        return SmiResult(readings=readings)

    # ---- one cycle -----------------------------------------------------------------------------------

    def cycle(self) -> Assessment:
        events = self._kernel_events()
        smi = self._read_smi()
        now = self.clock()
        node = self._get_node()
        expected = expected_gpus(node, smi.readings, self.settings.expected_gpus)
        labels = (node.get("metadata") or {}).get("labels") or {} if node is not None else {}
        inputs = Inputs(self.settings.node_name, smi, events, expected, self.inventory, self.timeouts_in_a_row,
                        labels)
        result = assess(inputs, self.policy, self.memory, now, self.settings.hang_after)
        self.memory = result.memory
        network = self.network.cycle(self.policy.network, now, smi.readings)
        if network is not None:
            result = replace(result, conditions=(*result.conditions, network.condition))
            self.metrics.observe_network(network.readings, network.findings)
        if node is not None:
            self._publish(node, result, now)
        self.metrics.observe(result, smi, expected.count, self.inventory)
        self.last_cycle = now
        return result

    def _get_node(self) -> dict[str, Any] | None:
        try:
            return self.client.get(NODES, self.settings.node_name)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("cannot read the node; conditions not published this cycle",
                        extra={"node": self.settings.node_name, "error": str(exc)})
            return None

    def _publish(self, node: dict[str, Any], result: Assessment, now: float) -> None:
        try:
            if self.publisher.publish(node, result.conditions, now):
                self.metrics.status_writes.inc(result="ok")
        except (errors.ApiError, errors.TransportError) as exc:
            self.metrics.status_writes.inc(result="error")
            log.warning("cannot write the node's conditions; next cycle retries",
                        extra={"node": self.settings.node_name, "error": str(exc)})

    def run(self, stop: threading.Event) -> None:
        self.open_kernel_log()
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.cycle()
            except Exception:
                log.exception("agent cycle failed; next cycle in one interval")
            stop.wait(max(0.0, self.settings.interval_s - (time.monotonic() - started)))
        if self.reader is not None:
            self.reader.close()

    def alive(self) -> tuple[bool, str]:
        """Live while cycles keep completing (a cycle stuck for three intervals is not)."""
        if self.last_cycle == 0.0:
            return True, "starting"
        age = self.clock() - self.last_cycle
        if age > 3 * self.settings.interval_s + self.settings.smi_timeout_s:
            return False, f"no cycle completed for {age:.0f} s"
        return True, "ok"
