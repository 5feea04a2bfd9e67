"""The agent against the API emulator, a fake nvidia-smi (a real capture replayed) and a kernel-log file."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuremediate.actions.node_status import find_condition
from gpuremediate.agent import kmsg
from gpuremediate.agent.run import Agent, AgentSettings, SmiRunner
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NODES
from gpuremediate.policy import conditions as c
from gpuremediate.policy.config import default_policy
from gpuremediate.signals.nvidiasmi import NvidiaSmiSource
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NODE = "gpu-node-1"
XID_79 = "NVRM: Xid (PCI:0000:83:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
NPD = {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock", "message": "ok",
       "lastHeartbeatTime": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z"}


def _load_fakes() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "fakes.py"
    spec = importlib.util.spec_from_file_location("nvsmi_fakes_agent", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fakes = _load_fakes()
H200 = fakes.CAPTURES / "linux-x86_64__nvidia-h200__590.48.01.txt"  # one GPU at 00000000:83:00.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0
        self.kernel_us = 10_000_000

    def wall(self) -> float:
        return self.now

    def kernel(self) -> int:
        return self.kernel_us

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.kernel_us += int(seconds * 1_000_000)


@dataclass
class World:
    server: KubeAPIServer
    client: KubeClient
    tmp: Path
    smi: Path
    clock: Clock

    @property
    def kmsg(self) -> Path:
        return self.tmp / "kmsg"

    def log(self, seq: int, message: str) -> None:
        with self.kmsg.open("a", encoding="utf-8") as fh:
            fh.write(f"4,{seq},{self.clock.kernel_us},-;{message}\n")

    def agent(self, smi: str | None = None, **settings: Any) -> Agent:
        options: dict[str, Any] = {"node_name": NODE, "kmsg_path": str(self.kmsg),
                                   "state_path": str(self.tmp / "state.json"),
                                   "boot_id_path": str(self.tmp / "boot_id"), "smi_timeout_s": 0.5,
                                   "sysfs_root": str(self.tmp / "sys"), **settings}
        runner = SmiRunner()
        source = NvidiaSmiSource(smi or str(self.smi), NODE, options["smi_timeout_s"], runner=runner)
        agent = Agent(AgentSettings(**options), self.client, default_policy().for_node({}), smi=source,
                      clock=self.clock.wall, kernel_clock_us=self.clock.kernel)
        agent.runner = runner
        agent.open_kernel_log()
        return agent

    def node(self) -> dict[str, Any]:
        return self.client.get(NODES, NODE)

    def condition(self, ctype: str) -> dict[str, Any]:
        found = find_condition(self.node(), ctype)
        assert found is not None, f"no {ctype} condition on the node"
        return dict(found)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("FAKE_SMI_CAPTURE", str(H200))
    smi = fakes.install_nvidia_smi(tmp_path / "bin")
    (tmp_path / "boot_id").write_text("boot-a\n")
    (tmp_path / "kmsg").write_text("6,0,1,-;Linux version 6.8.0\n")
    server = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=server.url, token_source=StaticToken(server.admin_token)),
                        backoff_base=0.01, backoff_cap=0.05)
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                          "status": {"capacity": {"nvidia.com/gpu": "1"}, "conditions": [NPD]}})
    try:
        yield World(server, client, tmp_path, smi, Clock())
    finally:
        client.close()
        server.stop()


def statuses(world: World) -> dict[str, tuple[str, str]]:
    return {t: (world.condition(t)["status"], world.condition(t)["reason"]) for t in c.AGENT_CONDITIONS}


def test_publishes_its_conditions_and_leaves_others(world: World) -> None:
    world.agent().cycle()
    assert statuses(world) == {
        c.GPU_HEALTHY: ("True", "NoGPUFault"), c.GPU_DRIVER_RESPONSIVE: ("True", "NvidiaSmiAnswered"),
        c.GPU_COUNT_MATCHES: ("True", "CountMatches"), c.GPU_FABRIC_HEALTHY: ("True", "NoFatalSXid"),
        c.GPU_NETWORK_HEALTHY: ("True", "NoRdmaDevice")}
    assert find_condition(world.node(), "KernelDeadlock") == NPD


def test_kernel_xid_turns_gpuhealthy_false_with_a_new_transition_time(world: World) -> None:
    agent = world.agent()
    agent.cycle()
    healthy_since = world.condition(c.GPU_HEALTHY)["lastTransitionTime"]
    world.clock.advance(60)
    world.log(1, XID_79)
    agent.cycle()
    faulty = world.condition(c.GPU_HEALTHY)
    assert faulty["status"] == "False" and faulty["reason"].startswith("Needs")
    assert "XID 79" in faulty["message"]
    assert faulty["lastTransitionTime"] != healthy_since
    assert world.condition(c.GPU_DRIVER_RESPONSIVE)["lastTransitionTime"] == healthy_since  # no change, no move
    # the controller's side of the seam: the default table turns it into an action
    view = c.condition_view(world.node(), c.ConditionsPolicy(), world.clock.now)
    assert [f.code for f in view.findings] == [c.GPU_HEALTHY] and view.agent_reporting


def test_every_occurrence_is_counted_and_a_restart_does_not_replay(world: World) -> None:
    world.log(1, XID_79)
    world.log(2, XID_79)
    first = world.agent()
    first.cycle()
    counted = first.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="79")
    assert counted == 2.0
    first.reader.close()  # type: ignore[union-attr]
    restarted = world.agent()
    restarted.cycle()
    assert restarted.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="79") == 0.0
    assert world.condition(c.GPU_HEALTHY)["status"] == "False"  # the window survived the restart
    world.log(3, XID_79)
    restarted.cycle()
    assert restarted.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="79") == 1.0


def test_a_new_boot_reads_its_log_from_the_start(world: World) -> None:
    world.log(1, XID_79)
    first = world.agent()
    first.cycle()
    first.reader.close()  # type: ignore[union-attr]
    (world.tmp / "boot_id").write_text("boot-b\n")
    world.kmsg.write_text("6,0,1,-;Linux version 6.8.0\n")  # the new boot's buffer
    world.clock.kernel_us = 5_000_000
    world.log(1, XID_79)
    rebooted = world.agent()
    rebooted.cycle()
    assert rebooted.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="79") == 1.0


def test_a_reboot_seen_while_running_drops_the_old_boots_window(world: World) -> None:
    agent = world.agent()
    world.log(1, XID_79)
    agent.cycle()
    assert world.condition(c.GPU_HEALTHY)["status"] == "False"
    (world.tmp / "boot_id").write_text("boot-b\n")
    world.kmsg.write_text("6,0,1,-;Linux version 6.8.0\n")  # the new boot's buffer, SEQ from 0 again
    agent.cycle()
    assert world.condition(c.GPU_HEALTHY)["status"] == "True"
    world.log(1, XID_79)  # SEQ 1 again, in the new boot: a new occurrence, not one already read
    agent.cycle()
    assert world.condition(c.GPU_HEALTHY)["status"] == "False"
    assert agent.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="79") == 2.0


def test_an_xid_counts_for_the_window_then_clears_and_a_repeat_is_a_new_occurrence(world: World) -> None:
    agent = world.agent(window_s=300.0)
    world.log(1, XID_79)
    agent.cycle()
    first = world.condition(c.GPU_HEALTHY)
    world.clock.advance(301)
    agent.cycle()
    assert world.condition(c.GPU_HEALTHY)["status"] == "True"
    world.clock.advance(60)
    world.log(2, XID_79)
    agent.cycle()
    again = world.condition(c.GPU_HEALTHY)
    assert again["status"] == "False"
    fingerprints = {c.condition_view({"metadata": {"name": NODE}, "status": {"conditions": [cond]}},
                                     c.ConditionsPolicy(), world.clock.now).findings[0].fingerprint
                    for cond in (first, again)}
    assert len(fingerprints) == 2


def test_fewer_gpus_than_capacity_is_a_missing_gpu(world: World) -> None:
    world.client.patch(NODES, NODE, {"status": {"capacity": {"nvidia.com/gpu": "2"}}}, subresource="status")
    world.agent().cycle()
    missing = world.condition(c.GPU_COUNT_MATCHES)
    assert (missing["status"], missing["reason"]) == ("False", "GPUMissing")
    assert "1 of 2" in missing["message"]


def hanging_smi(tmp: Path) -> str:
    script = tmp / "bin" / "hung-nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_hung_nvidia_smi_marks_the_driver_unresponsive_after_two_timeouts(world: World) -> None:
    agent = world.agent(smi=hanging_smi(world.tmp), hang_after=2)
    agent.cycle()
    assert world.condition(c.GPU_DRIVER_RESPONSIVE)["status"] == "Unknown"
    agent.cycle()
    hung = world.condition(c.GPU_DRIVER_RESPONSIVE)
    assert (hung["status"], hung["reason"]) == ("False", "NvidiaSmiTimeout")
    assert agent.metrics.smi_failures.value(reason="timeout") == 2.0
    # exporter down + driver hung: the controller acts on it instead of leaving the node unknown
    verdict = c.merge_node([], False, "exporter unreachable",
                           c.condition_view(world.node(), c.ConditionsPolicy(), world.clock.now))
    assert verdict.unknown == "" and verdict.findings[0].action == "reboot"


def test_writes_only_on_change_or_heartbeat(world: World) -> None:
    agent = world.agent(heartbeat_s=300.0)
    agent.cycle()
    version = world.node()["metadata"]["resourceVersion"]
    world.clock.advance(30)
    agent.cycle()
    assert world.node()["metadata"]["resourceVersion"] == version
    world.clock.advance(300)
    agent.cycle()
    beat = world.condition(c.GPU_HEALTHY)
    assert world.node()["metadata"]["resourceVersion"] != version
    assert beat["lastHeartbeatTime"] != beat["lastTransitionTime"]


def test_unreadable_kernel_log_still_publishes_and_says_so(world: World) -> None:
    agent = world.agent(kmsg_path=str(world.tmp / "no-such-kmsg"))
    agent.cycle()
    assert agent.metrics.kmsg_readable.value() == 0.0
    assert "CAP_SYSLOG" in agent.kmsg_note
    assert world.condition(c.GPU_HEALTHY)["status"] == "True"


def test_metrics_render_the_conditions(world: World) -> None:
    agent = world.agent()
    agent.cycle()
    text = agent.metrics.registry.render()
    assert 'gpuremediate_agent_condition{type="GPUHealthy",status="True",reason="NoGPUFault"} 1' in text
    assert 'gpuremediate_agent_gpus{source="capacity"} 1' in text
    assert 'gpuremediate_agent_gpus{source="driver"} 1' in text
    assert ('gpuremediate_agent_gpu_info{pci_bus_id="0000:83:00.0",uuid="GPU-00000000-0000-0000-0000-000000000000",'
            'model="NVIDIA H200"} 1') in text


def test_the_api_down_does_not_stop_the_cycle(world: World) -> None:
    agent = world.agent()
    world.server.inject("GET", rf"/api/v1/nodes/{NODE}$", count=100, status=503)
    result = agent.cycle()
    assert {w.type for w in result.conditions} == set(c.AGENT_CONDITIONS)
    assert agent.metrics.status_writes.value(result="ok") == 0.0


def test_smi_runner_never_waits_on_a_stuck_process(tmp_path: Path) -> None:
    runner = SmiRunner()
    script = tmp_path / "stuck"
    # ignores SIGTERM; SIGKILL works here, so the runner reaps it: the next run starts afresh
    script.write_text(f"#!{sys.executable}\nimport signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "time.sleep(30)\n")
    script.chmod(0o755)
    import subprocess

    with pytest.raises(subprocess.TimeoutExpired):
        runner([str(script)], 0.3)
    assert runner.timed_out and runner.stuck == []
    assert os.path.exists(script)


def test_an_xid_logged_before_the_window_is_counted_but_not_a_fault(world: World) -> None:
    """A fresh agent on a node up for days reads the whole buffer: old XIDs are history, not health."""
    with world.kmsg.open("a", encoding="utf-8") as fh:
        fh.write(f"4,1,{world.clock.kernel_us - 400_000_000},-;{XID_79}\n")
    agent = world.agent(window_s=300.0)
    agent.cycle()
    assert agent.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="79") == 1.0
    assert world.condition(c.GPU_HEALTHY)["status"] == "True"


# ---- the follower (issue 48): the kernel log as it is written, one write a spacing ----------------------------

XID_48 = "NVRM: Xid (PCI:0000:83:00): 48, pid=1234, name=python3, An uncorrectable double bit error"


def following(world: World, **settings: Any) -> Agent:
    agent = world.agent(**settings)
    agent.following = True  # as run() sets it: the cycle takes the follower's window, reads no log itself
    agent.cycle()
    return agent


def writes(agent: Agent) -> float:
    return agent.metrics.status_writes.value(result="ok")


def test_the_follower_publishes_a_fatal_xid_without_waiting_for_a_cycle(world: World) -> None:
    agent = following(world)
    before = writes(agent)
    world.log(1, XID_79)
    assert agent.follow_once() is True
    faulty = world.condition(c.GPU_HEALTHY)
    assert faulty["status"] == "False" and "XID 79" in faulty["message"]
    assert writes(agent) == before + 1
    assert world.condition(c.GPU_DRIVER_RESPONSIVE)["status"] == "True"  # the last cycle's nvidia-smi, reused


def test_a_flood_of_xid_lines_is_a_few_writes_and_every_line_is_counted(world: World) -> None:
    agent = following(world, write_spacing_s=0.05)
    before = writes(agent)
    seq = 0
    for code_line in (XID_79, XID_48, XID_79):
        for _ in range(150):
            seq += 1
            world.log(seq, code_line)
        agent.follow_once()  # at most one write per call: one write carries the 150 lines read meanwhile
    while agent.follow_once():
        pass
    assert agent.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="79") == 300.0
    assert agent.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="48") == 150.0
    assert 1 <= writes(agent) - before <= 3
    assert "XID 48" in world.condition(c.GPU_HEALTHY)["message"]


def test_a_line_within_the_spacing_waits_for_it_and_then_goes_in_one_write(world: World) -> None:
    agent = following(world, write_spacing_s=0.2)
    world.log(1, XID_79)
    assert agent.follow_once() is True
    world.log(2, XID_48)
    assert agent.follow_once() is False  # read, but a write was made less than the spacing ago
    assert "XID 48" not in world.condition(c.GPU_HEALTHY)["message"]
    assert agent.follow_once() is True  # the spacing waited out: it goes now
    assert "XID 48" in world.condition(c.GPU_HEALTHY)["message"]


def test_the_resume_point_is_saved_before_the_write_so_a_restart_reports_nothing_again(world: World) -> None:
    first = following(world)
    world.log(1, XID_79)
    assert first.follow_once() is True
    saved, _ = kmsg.load_state(world.tmp / "state.json", "boot-a")
    assert saved.seq == 1 and [e.seq for e in saved.recent] == [1]
    first.reader.close()  # type: ignore[union-attr]
    reported = world.condition(c.GPU_HEALTHY)
    world.clock.advance(10)
    restarted = following(world)
    assert restarted.metrics.xid.value(pci_bus_id="0000:83:00.0", xid="79") == 0.0  # not counted again
    again = world.condition(c.GPU_HEALTHY)
    assert again["status"] == "False"  # the window survived the restart
    assert again["lastTransitionTime"] == reported["lastTransitionTime"]  # the same occurrence, not a new one


def test_before_the_first_cycle_the_follower_reads_but_leaves_publishing_to_the_cycle(world: World) -> None:
    agent = world.agent()
    agent.following = True
    world.log(1, XID_79)
    assert agent.follow_once() is False
    assert find_condition(world.node(), c.GPU_HEALTHY) is None
    agent.cycle()
    assert world.condition(c.GPU_HEALTHY)["status"] == "False"


def test_run_follows_the_log_while_the_cycle_waits_its_interval(world: World) -> None:
    agent = world.agent(interval_s=3600.0)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: find_condition(world.node(), c.GPU_HEALTHY) is not None, 20, "the first cycle's write")
        world.log(1, XID_79)
        wait_for(lambda: world.condition(c.GPU_HEALTHY)["status"] == "False", 20, "the follower's write")
    finally:
        stop.set()
        thread.join(10)
