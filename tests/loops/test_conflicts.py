"""Every effect of the loops happens once, even when every other guarded node write meets a 409.

A real cluster's other writers (kube-controller-manager's taints, kubelets' heartbeats) change a Node
between the controller's read and its resourceVersion-guarded patch all the time (capture 31 of
../shared/data/kube-apiserver-1.36). The loop then re-reads and decides again; whatever it did
before the write (a metric, an Event, a "done" log line, a create) must not happen a second time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gpuremediate.controller import Controller
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import EVENTS, NODES, SERVICEACCOUNTS, Resource
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.cluster import SimCluster
from sim.waiting import wait_for
from tests.reliability.harness import reliability_policy, reliability_settings

NODE = "gpu-node-1"
DONE_LOGS = ("transition", "job created", "drain started", "drain request created", "repair attempt failed",
             "eviction")


class ConflictingClient(KubeClient):
    """Before every other resourceVersion-guarded node patch, another writer bumps the node: a 409."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guarded = 0
        self.conflicts = 0
        self._lock = threading.Lock()

    def patch(self, res: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None,
              **kwargs: Any) -> dict[str, Any]:
        if res is NODES and (patch.get("metadata") or {}).get("resourceVersion"):
            with self._lock:
                self.guarded += 1
                bump = self.guarded % 2 == 1
            if bump:
                self.conflicts += 1
                other = {"metadata": {"annotations": {"example.com/other-writer": str(self.guarded)}}}
                super().patch(NODES, name, other)
        result: dict[str, Any] = super().patch(res, name, patch, namespace, **kwargs)
        return result


def job_service_account(kube: KubeClient) -> None:
    """The repair and validation Jobs' ServiceAccount (a real API server refuses their pods without it)."""
    body = {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "gpuremediate-job", "namespace": "gpuremediate-jobs"}}
    with contextlib.suppress(errors.AlreadyExists):
        kube.create(SERVICEACCOUNTS, body, "gpuremediate-jobs")


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, gpus=2, job_duration_s=0.2, reboot_down_s=0.3) as made:
        job_service_account(made.kube)
        yield made


def _controller(cluster: SimCluster, policy_text: str = "") -> tuple[Controller, ConflictingClient]:
    client = ConflictingClient(load_config(cluster.kubeconfig), qps=500, burst=1000, timeout=10.0)
    policy = reliability_policy(1)
    controller = Controller(reliability_settings(cluster), policy, client=client)
    assert controller.start_caches(timeout=20.0)
    controller.start_loops()
    return controller, client


def _state(cluster: SimCluster) -> str:
    record = record_from_node(cluster.kube.get(NODES, NODE))
    return record.state if isinstance(record, NodeRecord) else str(record)


def _history_len(cluster: SimCluster) -> int:
    record = record_from_node(cluster.kube.get(NODES, NODE))
    return len(record.history) if isinstance(record, NodeRecord) else 0


def _repeated_events(cluster: SimCluster) -> list[str]:
    items = cluster.kube.list(EVENTS, "default")["items"]
    ours = [e for e in items if (e.get("source") or {}).get("component") == "gpuremediate"
            and (e.get("involvedObject") or {}).get("name") == NODE]
    seen = Counter((e["reason"], e["message"]) for e in ours)
    for event in ours:
        seen[(event["reason"], event["message"])] += int(event.get("count") or 1) - 1
    return [f"{reason}: {message} x{n}" for (reason, message), n in seen.items() if n > 1]


LOG_FIELDS = ("node", "from", "to", "reason", "job", "request", "pod", "result", "detail", "attempt")


def _log_key(record: logging.LogRecord) -> tuple[str, tuple[tuple[str, str], ...]]:
    fields = tuple(sorted((k, str(v)) for k, v in record.__dict__.items() if k in LOG_FIELDS))
    return record.getMessage(), fields


def _repeated_logs(records: list[logging.LogRecord]) -> list[str]:
    seen = Counter(_log_key(r) for r in records if r.getMessage() in DONE_LOGS and getattr(r, "node", None) == NODE)
    return [f"{message} {fields} x{n}" for (message, fields), n in seen.items() if n > 1]


def _run_flow(cluster: SimCluster, caplog: pytest.LogCaptureFixture, fault: str) -> tuple[Controller, int]:
    controller, client = _controller(cluster)
    try:
        cluster.workload("train", NODE, gpus=1)
        cluster.gpusim.inject(NODE, 0, "xid", 79 if fault == "reboot" else 48)
        wait_for(lambda: _history_len(cluster) >= 1 and _state(cluster) == states.HEALTHY, 30,
                 f"{NODE} repaired, validated and healthy (it is {_state(cluster)})")
    finally:
        controller.stop()
    return controller, client.conflicts


@pytest.mark.parametrize("fault", ["reboot", "reset-gpu"])
def test_no_effect_is_repeated_when_every_other_node_write_conflicts(
    cluster: SimCluster, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    caplog.set_level(logging.INFO, logger="gpuremediate")
    controller, conflicts = _run_flow(cluster, caplog, fault)
    assert conflicts >= 4, "the test did not make the controller's node writes conflict"
    metrics = controller.ctx.metrics
    assert metrics.remediation_seconds.count(action=fault) == 1
    assert metrics.drain_seconds.count() == 1
    moves = [line for line in metrics.transitions.render() if not line.endswith(" 1")]
    assert moves == [], "a transition counted more than once"
    faults = [line for line in metrics.faults.render() if not line.startswith("#")]
    assert faults and all(line.endswith(" 1") for line in faults), f"a fault counted more than once: {faults}"
    assert _repeated_events(cluster) == []
    assert _repeated_logs(caplog.records) == []
