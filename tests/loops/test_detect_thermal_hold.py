"""A GPU running hot within its thermal hold (issue 24): the detect cycle writes the node's record when the hold
starts (the timer in policy_memory, and when the hold ends in thermal_hold_ends), not again while it lasts, and
once more when it ends (cooled: nothing watched; or cordoned). `explain` counts down from that record alone,
without the policy file."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate import cli
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NAMESPACE = "gpuremediate-system"
NODE = "gpu-hot"
GPU = "GPU-hot-0"
HOLD_S = 60.0
POLICY = loads_policy(f"[thermal]\nhold_s = {HOLD_S}\n[breaker]\nenabled = false\n")


class Thermometer:
    """One node, one GPU, at ``celsius``."""

    def __init__(self) -> None:
        self.celsius = 95.0

    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=NODE, source="prometheus", status=SOURCE_OK,
                             gpus=(GpuReading(node=NODE, gpu="0", uuid=GPU, gpu_temp=self.celsius),))]


class Hold:
    """The API emulator, one GPU node, a controller on a clock the test moves (started 50 s before now, so
    that now is 50 s into a hold that starts at the first cycle)."""

    def __init__(self, tmp: Path) -> None:
        self.srv = KubeAPIServer().start()
        self.kubeconfig = str(self.srv.write_kubeconfig(tmp / "kubeconfig"))
        self.client = KubeClient(load_config(self.kubeconfig))
        self.client.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        self.client.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}},
                                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        # A new Node registers tainted not-ready until the node lifecycle sees it Ready and lifts the taint, a write
        # of its own a moment later: waited for, or the first cycle's record write could meet that change to the
        # taints (which a decision reads) and be decided again at the next cycle instead of sent
        wait_for(lambda: not any(t.get("key") == "node.kubernetes.io/not-ready"
                                 for t in (self.client.get(NODES, NODE).get("spec") or {}).get("taints") or []),
                 timeout=30, describe="the node lifecycle lifting the not-ready taint")
        self.start = time.time() - 50.0
        self.at = self.start
        self.gpu = Thermometer()
        self.controller = Controller(Settings(namespace=NAMESPACE), POLICY, client=self.client, source=self.gpu,
                                     clock=lambda: self.at)
        assert self.controller.start_caches(timeout=20)

    def cycle(self, at: float) -> NodeRecord | None:
        self.at = self.start + at
        self.controller.detect.cycle()
        record = record_from_node(self.client.get(NODES, NODE))
        assert not isinstance(record, Exception), record
        return record

    def record_writes(self) -> int:
        return sum(1 for _u, verb, _g, resource, _s, _ns, name in self.srv.requests
                   if resource == "nodes" and name == NODE and verb == "patch")

    def close(self) -> None:
        self.controller.stop()
        self.client.close()
        self.srv.stop()


@pytest.fixture
def hold(tmp_path: Path) -> Iterator[Hold]:
    made = Hold(tmp_path)
    yield made
    made.close()


def test_the_hold_is_written_when_it_starts_with_when_it_ends_and_explain_counts_down_from_it(
        hold: Hold, capsys: pytest.CaptureFixture[str]) -> None:
    started = hold.cycle(0.0)
    assert started is not None and started.state == states.HEALTHY and not hold.client.get(NODES, NODE)["spec"].get(
        "unschedulable")
    assert started.policy_memory["thermal"][GPU]["hot_since"] == hold.start
    assert started.thermal_hold_ends == {GPU: hold.start + HOLD_S}
    writes = hold.record_writes()
    assert writes == 1, hold.srv.requests

    assert cli.main(["explain", NODE, "--kubeconfig", hold.kubeconfig]) == 0  # no --policy
    out = capsys.readouterr().out
    assert "never acted on this node" not in out and "[thermal].hold_s is over" not in out, out
    ends = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(hold.start + HOLD_S))
    assert re.search(rf"Watching: GPU {GPU} hot for 5\ds of its 60 s hold: cordoned in \d+s \(at {ends}\) if it "
                     r"stays hot\.", out), out
    assert cli.main(["status", "--kubeconfig", hold.kubeconfig]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(NODE))
    assert re.search(r"^gpu-hot\s+healthy\s+\S+\s+thermal \(watched, cordon in \d+s\)", row), row

    assert hold.cycle(30.0) == started and hold.record_writes() == writes  # still hot: nothing new to write

    cordoned = hold.cycle(HOLD_S + 1)
    assert cordoned is not None and cordoned.state == states.CORDONED and cordoned.thermal_hold_ends == {}
    assert hold.client.get(NODES, NODE)["spec"].get("unschedulable") is True


def test_a_gpu_cooling_within_its_hold_is_written_as_watched_no_more(hold: Hold) -> None:
    assert hold.cycle(0.0) is not None
    hold.gpu.celsius = 60.0
    cooled = hold.cycle(20.0)
    assert cooled is not None and cooled.state == states.HEALTHY and cooled.thermal_hold_ends == {}
    assert not cooled.policy_memory.get("thermal"), cooled.policy_memory
    assert hold.record_writes() == 2
