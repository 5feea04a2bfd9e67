"""The agent's loops: every interval, read nvidia-smi, assess, publish, export metrics; meanwhile a follower
thread reads the kernel log as it is written and publishes a fault it shows at once.

Everything one cycle needs is injected (the Kubernetes client, the nvidia-smi source, the clocks), so a
test drives ``cycle()`` (and ``follow_once()``) directly; ``run()`` starts the follower and repeats the cycle
until the stop event.

The follower blocks in poll(2) on /dev/kmsg. A record that changes the conditions is written at once; what
arrives within ``write_spacing_s`` of a write waits in the kernel's buffer and is read, judged and written as
one (a GPU printing hundreds of Xid lines a second is one status write a spacing, not hundreds): one thread
writes, so at most one write is in flight. The fast assessment reuses the last cycle's nvidia-smi readings,
GPU count and labels (and does not move the health memory: only the cycle, with fresh readings, does).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
FOLLOW_WAIT_S = 1.0  # the follower's longest wait in poll(2): a stop, and a new boot id, are seen this often
DEFAULT_WRITE_SPACING_S = 1.0  # kernel-log-driven status writes at most this often (a flood is coalesced)


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
    write_spacing_s: float = DEFAULT_WRITE_SPACING_S


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
        kmsg_wait: Callable[[float], object] | None = None,
    ) -> None:
        """``kmsg_wait``: how the follower waits for a record (default: the reader's poll(2), or a plain file's
        size); gpu-sim in process hands its own, woken by each line it logs."""
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
        self.kmsg_wait = kmsg_wait
        # The kernel window, the health memory and the publisher are the cycle's and the follower's: one at a time.
        self._lock = threading.RLock()
        self.following = False  # the follower reads the kernel log; the cycle only takes its window
        self.last_inputs: Inputs | None = None  # the last cycle's inputs: the follower's assessments reuse them
        self._saved = self.point
        self._follow = _FollowState()

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
            self._count_rest(self.reader)
            self.reader.close()
            self.reader = None
        self.open_kernel_log()

    def _count_rest(self, reader: KmsgReader) -> None:
        """What the old boot's log still held unread (gpu-sim keeps the old file open to us; a real reboot ends
        the agent too): counted in the metrics, not in the new boot's window."""
        try:
            rest = reader.poll()
        except OSError:
            return
        self.metrics.kmsg_records.inc(float(rest.records))
        self.metrics.kmsg_missed.inc(float(rest.lost))
        for event in rest.events:
            self._count(event)

    def _read_kernel_log(self, save: bool = True) -> bool:
        """The new records into the window; True when the resume point moved. ``save``: write the resume point now
        (the follower saves once a spacing, before the write that reports what it read)."""
        self._follow_reboot()
        if self.reader is None:
            return False
        try:
            polled = self.reader.poll()
        except OSError as exc:  # EPIPE, EINVAL and EAGAIN are handled inside; anything else: tried again later
            log.warning("reading the kernel log failed; tried again later", extra={"error": str(exc)})
            return False
        self.metrics.kmsg_records.inc(float(polled.records))
        self.metrics.kmsg_missed.inc(float(polled.lost))
        for event in polled.events:
            self._count(event)
        moved = replace(self.point, seq=polled.last_seq, recent=self._in_window((*self.point.recent, *polled.events)))
        if moved == self.point:
            return False
        self.point = moved
        if save:
            self._save_point()
        return True

    def _in_window(self, events: Sequence[KernelEvent]) -> tuple[KernelEvent, ...]:
        horizon = self.kernel_clock_us() - int(self.settings.window_s * 1_000_000)
        return tuple(e for e in events if e.usec >= horizon)[-MAX_RECENT_EVENTS:]

    def _save_point(self) -> None:
        if self.point == self._saved:
            return
        try:
            save_state(Path(self.settings.state_path), self.point)
            self._saved = self.point
        except OSError as exc:
            log.warning("cannot save the kernel-log resume point", extra={"error": str(exc)})

    def _kernel_events(self) -> tuple[KernelEvent, ...]:
        """The kernel events inside the window (read here unless the follower reads them)."""
        if not self.following:
            self._read_kernel_log()
        return self._in_window(self.point.recent)

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
        smi = self._read_smi()  # outside the lock: nvidia-smi may take its whole timeout
        with self._lock:
            events = self._kernel_events()
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
            self.last_inputs = inputs
            self.last_cycle = now
        return result

    # ---- the follower --------------------------------------------------------------------------------

    def follow(self, stop: threading.Event) -> None:
        """Read the kernel log as it is written until ``stop``; publish what it changes (``follow_once``)."""
        while not stop.is_set():
            try:
                self.follow_once(stop)
            except Exception:
                log.exception("following the kernel log failed; going on")
                stop.wait(FOLLOW_WAIT_S)
        with self._lock:
            self._save_point()

    def follow_once(self, stop: threading.Event | None = None) -> bool:
        """One wait and what follows it: wait for a record (while a write's spacing runs, wait that out instead:
        the records meanwhile are coalesced), read everything new, and once the spacing allows, save the resume
        point and publish. True when a status write was made."""
        state, spacing = self._follow, self.settings.write_spacing_s
        left = state.next_at - time.monotonic()
        if state.pending and left > 0:
            if stop is not None and stop.wait(left):
                return False
            if stop is None:
                time.sleep(left)
        elif not state.pending:
            self._wait_for_record(FOLLOW_WAIT_S)
        with self._lock:
            state.pending = self._read_kernel_log(save=False) or state.pending
            if not state.pending or time.monotonic() < state.next_at:
                return False
            self._save_point()  # before the write that reports them: a restart does not read them as new
            state.pending = False
            state.next_at = time.monotonic() + spacing
            return self._publish_fast()

    def _wait_for_record(self, timeout_s: float) -> None:
        if self.kmsg_wait is not None:
            self.kmsg_wait(timeout_s)
        elif self.reader is not None:
            self.reader.wait(timeout_s)
        else:
            time.sleep(timeout_s)  # unreadable: the boot id (a reopen) is still looked at this often

    def _publish_fast(self) -> bool:
        """The conditions again from the last cycle's inputs and the kernel window now; written when they differ
        from what was last published (no GET otherwise). Before the first cycle: nothing (the cycle publishes)."""
        if self.last_inputs is None:
            return False
        inputs = replace(self.last_inputs, events=self._in_window(self.point.recent))
        result = assess(inputs, self.policy, self.memory, self.last_cycle, self.settings.hang_after)
        if result.conditions == self.publisher.last_wanted:
            return False
        node = self._get_node()
        if node is None:
            return False
        return self._publish(node, result, self.clock())

    def _get_node(self) -> dict[str, Any] | None:
        try:
            return self.client.get(NODES, self.settings.node_name)
        except (errors.ApiError, errors.TransportError) as exc:
            log.warning("cannot read the node; conditions not published this cycle",
                        extra={"node": self.settings.node_name, "error": str(exc)})
            return None

    def _publish(self, node: dict[str, Any], result: Assessment, now: float) -> bool:
        try:
            if self.publisher.publish(node, result.conditions, now):
                self.metrics.status_writes.inc(result="ok")
                return True
        except (errors.ApiError, errors.TransportError) as exc:
            self.metrics.status_writes.inc(result="error")
            log.warning("cannot write the node's conditions; next cycle retries",
                        extra={"node": self.settings.node_name, "error": str(exc)})
        return False

    def run(self, stop: threading.Event) -> None:
        self.open_kernel_log()
        self.following = True
        follower = threading.Thread(target=self.follow, args=(stop,), name=f"kmsg-{self.settings.node_name}",
                                    daemon=True)
        follower.start()
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.cycle()
            except Exception:
                log.exception("agent cycle failed; next cycle in one interval")
            stop.wait(max(0.0, self.settings.interval_s - (time.monotonic() - started)))
        follower.join(FOLLOW_WAIT_S + 5.0)
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


@dataclass
class _FollowState:
    pending: bool = False  # records read (or waiting) that no write has carried yet
    next_at: float = field(default=0.0)  # time.monotonic() before which no kernel-log write is made
