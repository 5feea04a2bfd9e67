"""The GPU Operator reset sequence survives a controller that dies right after any one of its writes.

A first run counts the controller's writes from the fault to healthy (Events left out: they are told, not
kept). Then, for each K, a controller dies just after its K-th write landed — nothing it sends afterwards
reaches the API server, as for a killed process — and a successor, which never saw the exporter's readings
(the operands may be off), finishes the repair. Each time: one reset Job, of the faulty GPU only,
the operand labels back as they were, the annotation gone, the node healthy.
"""

from __future__ import annotations

import threading
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from sim.cluster import SimCluster
from sim.gpusim import gpu_uuid
from sim.waiting import wait_for
from tests.loops.test_conflicts import job_service_account
from tests.loops.test_gpu_reset import (
    DEPLOY_LABELS,
    NODE,
    Controllers,
    annotation,
    deploy_labels,
    job_gpu_ids,
    make_cluster,
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
                if self.die_after is not None and len(self.writes) >= self.die_after:
                    self.dead.set()
        return reply


def _client(cluster: SimCluster, die_after: int | None) -> DyingClient:
    return DyingClient(load_config(cluster.kubeconfig), qps=500, burst=1000, timeout=10.0, die_after=die_after)


def _run(die_after: int | None) -> tuple[list[str], str]:
    """One fault, a controller that dies after its ``die_after``-th write, a successor; what was wrong ("")."""
    with make_cluster() as cluster:
        job_service_account(cluster.kube)
        controllers = Controllers(cluster)
        try:
            first = _client(cluster, die_after)
            controllers.start(policy(), client=first)
            cluster.gpusim.inject(NODE, 1, "xid", 48)
            wait_for(lambda: first.dead.is_set() or repaired(cluster), 40, "the controller's death or the repair")
            controllers.stop_all()
            if die_after is not None:
                controllers.start(policy())
            wait_for(lambda: repaired(cluster), 40, f"{NODE} repaired", seen=lambda: record_of(cluster))
            return first.writes, _problems(cluster)
        finally:
            controllers.stop_all()


def _problems(cluster: SimCluster) -> str:
    problems = []
    ids = [job_gpu_ids(j) for j in reset_jobs(cluster)]
    if len(ids) != 1 or ids[0] not in ("1", gpu_uuid(NODE, 1)):  # its index, or its UUID where none was read
        problems.append(f"reset Jobs' GPU_IDS {ids}, not GPU 1's")
    if deploy_labels(cluster) != dict.fromkeys(DEPLOY_LABELS, "true"):
        problems.append(f"operand labels {deploy_labels(cluster)}")
    if annotation(cluster) is not None:
        problems.append(f"operand annotation left: {annotation(cluster)}")
    return "; ".join(problems)


def test_a_controller_dying_after_any_write_is_succeeded_by_one_that_finishes_the_reset() -> None:
    writes, problem = _run(None)
    assert problem == "", problem
    assert sum(1 for w in writes if w.startswith("POST") and "/jobs" in w) >= 2  # the reset and the validation
    failures = []
    for k in range(1, len(writes) + 1):
        died_after, problem = _run(k)
        if problem:
            failures.append(f"dead after write {k} ({died_after[-1]}): {problem}")
    assert failures == [], "\n".join(failures)
