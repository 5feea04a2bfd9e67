"""A Job's activeDeadlineSeconds (= the attempt's timeout) often ends it before the controller's own deadline:
the Job controller fails it with reason DeadlineExceeded. That is a timed-out attempt, not a failed one."""

from __future__ import annotations

from types import SimpleNamespace

from gpuremediate.actions.jobs import ActionJobs, JobSpec, build_job, ensure_job
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import JOBS
from gpuremediate.loops.jobs import TIMED_OUT, JobLoop
from gpuremediate.vocab.record import ActionInProgress
from sim.waiting import wait_for

from .conftest import NS


def test_job_failed_by_its_active_deadline_is_a_timed_out_attempt(client: KubeClient) -> None:
    job = build_job("reset-gpu", "n1", "xid-79/gpu0", 1, JobSpec(image="x", command=("true",), timeout_s=1),
                    namespace=NS)
    name = job["metadata"]["name"]
    ensure_job(client, job)  # no kubelet runs it: it stays active until its deadline

    def failed() -> bool:
        conds = client.get(JOBS, name, NS).get("status", {}).get("conditions") or []
        return any(c["type"] == "Failed" and c["status"] == "True" for c in conds)

    assert wait_for(failed, 4.0)
    loop = JobLoop.__new__(JobLoop)
    jobs = ActionJobs(client, NS)
    loop.ctx = SimpleNamespace(client=client, settings=SimpleNamespace(jobs_namespace=NS),  # type: ignore[assignment]
                               clock=lambda: 0.0, writer=SimpleNamespace(dry_run=False), jobs=jobs)
    action = ActionInProgress(kind="reset-gpu", name=name, attempt=1, started=0.0, deadline=3600.0)
    try:
        assert loop.attempt_outcome(action, recreate=lambda: None) == TIMED_OUT
    finally:
        jobs.stop()
