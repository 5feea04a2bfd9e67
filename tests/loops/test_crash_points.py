"""A repair survives a controller that dies right after any one of its writes.

A first run counts the controller's writes from the fault to healthy (Events left out: they are told, not
kept). Then, for each K, a controller dies just after its K-th write landed — nothing it sends afterwards
reaches the API server, as for a killed process — and a successor, which never saw the exporter's readings
(the operands may be off), finishes the repair. Two flows: the GPU Operator reset sequence, and a ladder whose
refused reset escalates to a reboot after diagnostics. Each time: no object created twice, the reset of the
faulty GPU only, the operand labels back as they were, the annotation gone, the node healthy and uncordoned.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.policy.config import PolicyFile, loads_policy
from sim.cluster import SimCluster
from sim.gpusim import gpu_uuid
from sim.waiting import wait_for
from tests.loops.test_conflicts import job_service_account
from tests.loops.test_gpu_reset import (
    DEPLOY_LABELS,
    NODE,
    POLICY,
    Controllers,
    annotation,
    deploy_labels,
    job_gpu_ids,
    jobs,
    make_cluster,
    node_of,
    policy,
    record_of,
    repaired,
    reset_jobs,
)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class DyingClient(KubeClient):
    """Counts its writes; after the ``die_after``-th has landed, every request fails as if the process died."""

    def __init__(self, *args: Any, die_after: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.die_after = die_after
        self.writes: list[str] = []
        self.created: list[str] = []  # "<collection path> <name>" of every create that landed
        self.dead = threading.Event()
        self._lock = threading.Lock()

    def _send(self, method: str, path: str, **kwargs: Any) -> Any:  # type: ignore[override]
        if self.dead.is_set():
            raise errors.TransportError(f"{method} {path}: the controller is dead")
        counted = method in MUTATING and "/events" not in path
        reply = super()._send(method, path, **kwargs)
        if counted:
            with self._lock:
                self.writes.append(f"{method} {path}")
                body = kwargs.get("body")
                if method == "POST" and isinstance(body, dict):
                    self.created.append(f"{path} {(body.get('metadata') or {}).get('name', '')}")
                if self.die_after is not None and len(self.writes) >= self.die_after:
                    self.dead.set()
        return reply


def _client(cluster: SimCluster, die_after: int | None) -> DyingClient:
    return DyingClient(load_config(cluster.kubeconfig), qps=500, burst=1000, timeout=10.0, die_after=die_after)


@dataclass(frozen=True)
class Flow:
    """A fault on NODE, the policy that repairs it, and what must hold once it is healthy again."""

    policy: PolicyFile
    problems: Callable[[SimCluster], list[str]]


def _run(flow: Flow, die_after: int | None) -> tuple[list[str], str]:
    """One fault, a controller that dies after its ``die_after``-th write, a successor; what was wrong ("")."""
    with make_cluster() as cluster:
        job_service_account(cluster.kube)
        controllers = Controllers(cluster)
        try:
            first = _client(cluster, die_after)
            controllers.start(flow.policy, client=first)
            cluster.gpusim.inject(NODE, 1, "xid", 48)
            wait_for(lambda: first.dead.is_set() or repaired(cluster), 40, "the controller's death or the repair")
            controllers.stop_all()
            successor = _client(cluster, None)
            if die_after is not None:
                controllers.start(flow.policy, client=successor)
            wait_for(lambda: repaired(cluster), 40, f"{NODE} repaired", seen=lambda: record_of(cluster))
            twice = [c for c, n in Counter(first.created + successor.created).items() if n > 1]
            recreated = [f"created twice (deleted in between): {twice}"] if twice else []
            return first.writes, "; ".join(flow.problems(cluster) + _common_problems(cluster) + recreated)
        finally:
            controllers.stop_all()


def _common_problems(cluster: SimCluster) -> list[str]:
    problems = []
    if deploy_labels(cluster) != dict.fromkeys(DEPLOY_LABELS, "true"):
        problems.append(f"operand labels {deploy_labels(cluster)}")
    if annotation(cluster) is not None:
        problems.append(f"operand annotation left: {annotation(cluster)}")
    if node_of(cluster)["spec"].get("unschedulable"):
        problems.append("left cordoned")
    return problems


def _one_reset_of_gpu_1(cluster: SimCluster) -> list[str]:
    ids = [job_gpu_ids(j) for j in reset_jobs(cluster)]
    if len(ids) != 1 or ids[0] not in ("1", gpu_uuid(NODE, 1)):  # its index, or its UUID where none was read
        return [f"reset Jobs' GPU_IDS {ids}, not GPU 1's"]
    return []


def _escalated_to_one_reboot(cluster: SimCluster) -> list[str]:
    record = record_of(cluster)
    outcomes = [(h.action, h.outcome) for h in record.history] if record else []
    kinds = Counter(j["metadata"]["labels"]["gpuremediate.io/job"] for j in jobs(cluster))
    problems = []
    if outcomes != [("reset-gpu", "escalated"), ("reboot", "repaired")]:
        problems.append(f"history {outcomes}")
    if kinds["diagnostics"] != 1 or kinds["reset-gpu"] != 1 or kinds["reboot"] != 1:
        problems.append(f"Jobs by kind {dict(kinds)}")
    return problems


OPERATOR_RESET = Flow(policy(), _one_reset_of_gpu_1)
# The operands hold the GPUs and the sequence is off: the bare reset is refused, the ladder reboots.
LADDER = Flow(loads_policy(POLICY.format(attempts=1, enabled="false", gone=10) + """
[remediation.ladders]
reset-gpu = [{action = "reset-gpu"}, {action = "reboot"}]
[remediation.diagnostics]
enabled = true
""", "test-policy"), _escalated_to_one_reboot)


@pytest.mark.parametrize("flow", [OPERATOR_RESET, LADDER], ids=["operator-reset", "ladder-with-diagnostics"])
def test_a_controller_dying_after_any_write_is_succeeded_by_one_that_finishes_the_repair(flow: Flow) -> None:
    writes, problem = _run(flow, None)
    assert problem == "", problem
    assert sum(1 for w in writes if w.startswith("POST") and "/jobs" in w) >= 2  # a repair and the validation
    failures = []
    for k in range(1, len(writes) + 1):
        died_after, problem = _run(flow, k)
        if problem:
            failures.append(f"dead after write {k} ({died_after[-1]}): {problem}")
    assert failures == [], "\n".join(failures)
