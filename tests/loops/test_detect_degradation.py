"""A slow GPU, end to end through the controller against the API emulator (issue 29): its node is cordoned
after the hold, its pods stay (no eviction, no delete), and once it runs at its peers' speed for the clear hold
the node is uncordoned again. A degraded link, with action drain, goes draining."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate import fleet
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import NAMESPACES, NODES, PODS
from gpuremediate.policy.config import PolicyFile, loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings, PodRef
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.kubeapi import KubeAPIServer

NAMESPACE = "gpuremediate-system"
NODES_N = 4
PEAK = 1980.0
SLOW_NODE, SLOW_GPU = "gpu-1", "GPU-gpu-1-3"
POLICY = ("[breaker]\nenabled = false\n[degradation]\nenabled = true\nhold_s = 120\nclear_hold_s = 180\n"
          "link_hold_s = 120\nlink_gap_s = 120\nlink_clear_s = 600\n")


class Fleet:
    """NODES_N nodes x 8 busy GPUs of one job; ``slow`` GPUs run at 60 % clock, ``replays`` their PCIe total."""

    def __init__(self) -> None:
        self.slow: set[str] = set()
        self.replays: dict[str, float] = {}
        self.sbe: dict[str, float] = {}

    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=f"gpu-{n}", source="exporter", status=SOURCE_OK,
                             gpus=tuple(self._gpu(f"gpu-{n}", i) for i in range(8))) for n in range(NODES_N)]

    def _gpu(self, node: str, index: int) -> GpuReading:
        uuid = f"GPU-{node}-{index}"
        extra = {"DCGM_FI_DEV_SM_CLOCK": PEAK * (0.6 if uuid in self.slow else 1.0), "DCGM_FI_DEV_GPU_UTIL": 97.0,
                 "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": self.replays.get(uuid, 3.0),
                 "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": self.sbe.get(uuid, 0.0)}
        return GpuReading(node=node, gpu=str(index), uuid=uuid, model="NVIDIA H100 80GB HBM3", extra=extra,
                          pods=(PodRef("ml", f"train-worker-{node[-1]}"),))


class Cluster:
    def __init__(self, tmp: Path, policy: PolicyFile) -> None:
        self.srv = KubeAPIServer().start()
        self.client = KubeClient(load_config(str(self.srv.write_kubeconfig(tmp / "kubeconfig"))))
        for name in (NAMESPACE, "ml"):
            self.client.create(NAMESPACES, {"metadata": {"name": name}})
        for n in range(NODES_N):
            node = f"gpu-{n}"
            self.client.create(NODES, {"metadata": {"name": node, "labels": {"nvidia.com/gpu.present": "true"}},
                                       "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                                  "capacity": {"nvidia.com/gpu": "8"}}})
            self.client.create(PODS, {"metadata": {"name": f"train-worker-{n}", "namespace": "ml"},
                                      "spec": {"nodeName": node, "containers": [{
                                          "name": "c", "image": "x",
                                          "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
        self.start = time.time()
        self.at = self.start
        self.fleet = Fleet()
        self.controller = Controller(Settings(namespace=NAMESPACE), policy, client=self.client, source=self.fleet,
                                     clock=lambda: self.at)
        assert self.controller.start_caches(timeout=20)

    def cycle(self, at: float, node: str = SLOW_NODE) -> tuple[NodeRecord | None, bool]:
        self.at = self.start + at
        self.controller.detect.cycle()
        obj = self.client.get(NODES, node)
        record = record_from_node(obj)
        assert not isinstance(record, Exception), record
        return record, bool((obj.get("spec") or {}).get("unschedulable"))

    def pod_removals(self) -> list[tuple[str, str, str]]:
        return [(verb, sub, name) for _u, verb, _g, resource, sub, _ns, name in self.srv.requests
                if resource == "pods" and (sub == "eviction" or verb == "delete")]

    def close(self) -> None:
        self.controller.stop()
        self.client.close()
        self.srv.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path, loads_policy(POLICY))
    yield made
    made.close()


def test_a_slow_gpu_cordons_its_node_without_eviction_and_recovery_uncordons(cluster: Cluster) -> None:
    cluster.fleet.slow.add(SLOW_GPU)
    record, cordoned = cluster.cycle(0)
    assert not cordoned and (record is None or record.state == states.HEALTHY)
    record, cordoned = cluster.cycle(60)
    assert not cordoned  # within the hold
    record, cordoned = cluster.cycle(120)
    assert cordoned and record is not None and record.state == states.CORDONED
    assert record.fault is not None and record.fault.kind == "slow-gpu" and record.fault.gpus == (SLOW_GPU,)
    for at in (180, 240, 300):
        record, cordoned = cluster.cycle(at)
        assert cordoned and record is not None and record.state == states.CORDONED  # no drain follows
    assert cluster.pod_removals() == []
    assert all(not cluster.cycle(300, f"gpu-{n}")[1] for n in (0, 2, 3))  # its peers are untouched
    said = fleet.explain_node(cluster.client, SLOW_NODE)
    assert "60% of its peers' median SM clock" in said and "keeping up with its peers" in said
    cluster.fleet.slow.clear()
    record, cordoned = cluster.cycle(360)
    assert cordoned  # calm since 360: the clear hold runs
    record, cordoned = cluster.cycle(540)
    assert not cordoned and record is not None and record.state == states.HEALTHY
    assert record.history == () or all(h.kind == "slow-gpu" for h in record.history)
    assert cluster.pod_removals() == []
    assert cluster.controller.metrics.faults.value(kind="slow-gpu", code="sm-clock") == 1.0


def test_degradation_off_by_default_finds_nothing(tmp_path: Path) -> None:
    made = Cluster(tmp_path, loads_policy("[breaker]\nenabled = false\n"))
    try:
        made.fleet.slow.add(SLOW_GPU)
        for at in range(0, 900, 60):
            record, cordoned = made.cycle(at)
            assert not cordoned and (record is None or record.state == states.HEALTHY)
    finally:
        made.close()


def test_a_degraded_link_with_action_drain_drains_the_node(tmp_path: Path) -> None:
    made = Cluster(tmp_path, loads_policy(POLICY + 'link_action = "drain"\n'))
    try:
        states_seen = []
        for minute in range(6):
            made.fleet.replays[SLOW_GPU] = 3.0 + 15.0 * minute
            record, _ = made.cycle(60.0 * minute)
            states_seen.append(record.state if record is not None else states.HEALTHY)
        assert states_seen[:3] == [states.HEALTHY] * 3
        assert states_seen[-1] == states.DRAINING
        assert record is not None and record.fault is not None and record.fault.kind == "link-degraded"
        assert record.fault.action == "drain"
    finally:
        made.close()


@pytest.mark.parametrize("action", ["none", "cordon"])
def test_a_failing_trend_is_reported_or_cordoned_never_drained(tmp_path: Path, action: str) -> None:
    made = Cluster(tmp_path, loads_policy(f'[breaker]\nenabled = false\n[degradation]\ntrends = true\n'
                                          f'trend_action = "{action}"\n'))
    try:
        for minute in range(0, 40, 5):
            made.fleet.sbe[SLOW_GPU] = 30.0 * minute
            record, cordoned = made.cycle(60.0 * minute)
        assert record is not None and made.pod_removals() == []
        if action == "cordon":
            assert cordoned and record.state == states.CORDONED and record.fault is not None
            assert record.fault.kind == "trend" and record.fault.code == "sbe-rate" and not record.fault.urgent
        else:
            assert not cordoned and record.state == states.HEALTHY
            assert any(fp.startswith(f"trend:sbe-rate:{SLOW_GPU}:") for fp in record.handled)
    finally:
        made.close()
