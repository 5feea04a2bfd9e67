"""A repair or validation in progress reads its Job from one watch, not a GET a second (issue 21's bench: 288 Job
GETs a minute with 3 nodes in repair, 60 a minute per node)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.jobs import JOB_LABEL, SUCCEEDED, ActionJobs, job_outcome
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import JOBS, NAMESPACES
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

NS = "gpuremediate-jobs"
USER = "controller"


@pytest.fixture
def cluster() -> Iterator[tuple[KubeAPIServer, KubeClient, KubeClient]]:
    srv = KubeAPIServer().start()
    srv.add_token("controller-token", USER)
    admin = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    admin.create(NAMESPACES, {"metadata": {"name": NS}})
    ours = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken("controller-token")))
    try:
        yield srv, admin, ours
    finally:
        ours.close()
        admin.close()
        srv.stop()


def job(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {JOB_LABEL: "reboot"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "reboot", "image": "busybox"}]}}}}


def job_gets(srv: KubeAPIServer) -> int:
    return sum(1 for r in list(srv.requests) if r[0] == USER and r[1] == "get" and r[3] == "jobs")


def test_reads_of_a_running_job_come_from_the_watch_and_see_it_finish(
        cluster: tuple[KubeAPIServer, KubeClient, KubeClient]) -> None:
    srv, admin, ours = cluster
    admin.create(JOBS, job("gpur-reboot-a"), NS)
    jobs = ActionJobs(ours, NS)
    try:
        assert jobs.read("gpur-reboot-a") is not None  # before the watch listed: a GET
        wait_for(lambda: jobs._informer is not None and jobs._informer.has_synced(), 10, "the Jobs' watch")
        gets = job_gets(srv)
        for _ in range(50):
            assert jobs.read("gpur-reboot-a") is not None
        assert job_gets(srv) == gets  # fifty looks, no request
        finished = admin.get(JOBS, "gpur-reboot-a", NS)
        finished["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
        admin.replace(JOBS, "gpur-reboot-a", finished, NS, subresource="status")
        wait_for(lambda: job_outcome(jobs.read("gpur-reboot-a")) == SUCCEEDED, 10, "the Job's end through the watch")
        assert job_gets(srv) == gets
    finally:
        jobs.stop()


def test_a_job_the_watch_does_not_hold_is_asked_for(cluster: tuple[KubeAPIServer, KubeClient, KubeClient]) -> None:
    srv, admin, ours = cluster
    jobs = ActionJobs(ours, NS)
    try:
        assert jobs.read("gpur-reboot-none") is None
        wait_for(lambda: jobs._informer is not None and jobs._informer.has_synced(), 10, "the Jobs' watch")
        admin.create(JOBS, job("gpur-reboot-new"), NS)
        gets = job_gets(srv)
        # just created: the watch may not have it yet, the server does; "missing" is the server's word only
        assert jobs.read("gpur-reboot-new") is not None
        assert jobs.read("gpur-reboot-none") is None
        assert job_gets(srv) >= gets + 1
    finally:
        jobs.stop()


def test_another_label_is_not_watched_and_a_stopped_reader_starts_no_watch(
        cluster: tuple[KubeAPIServer, KubeClient, KubeClient]) -> None:
    srv, admin, ours = cluster
    other = job("someone-elses")
    other["metadata"]["labels"] = {"app": "other"}
    admin.create(JOBS, other, NS)
    jobs = ActionJobs(ours, NS)
    jobs.read("someone-elses")
    wait_for(lambda: jobs._informer is not None and jobs._informer.has_synced(), 10, "the Jobs' watch")
    assert jobs._informer is not None and jobs._informer.list() == []
    jobs.stop()
    assert jobs.read("someone-elses") is not None  # a GET
    assert jobs._informer is None


class NoWatchClient:
    """A client without watch (replay's cluster)."""

    def __init__(self, inner: KubeClient) -> None:
        self.inner = inner

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.get(*args, **kwargs)


def test_a_client_that_cannot_watch_gets_each_time(cluster: tuple[KubeAPIServer, KubeClient, KubeClient]) -> None:
    srv, admin, ours = cluster
    admin.create(JOBS, job("gpur-reboot-b"), NS)
    jobs = ActionJobs(NoWatchClient(ours), NS)  # type: ignore[arg-type]
    for _ in range(3):
        assert jobs.read("gpur-reboot-b") is not None
    assert job_gets(srv) == 3
