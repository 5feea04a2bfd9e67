"""Fixtures for the e2e scenarios: ``cluster`` (see e2e/harness.py for the API and the targets)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness import Cluster, E2EError, make_cluster, target_name

LOG_TAIL_LINES = 60


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"e2e_report_{report.when}", report)
    return report


CONFLICTS = pytest.StashKey[dict[str, int]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[CONFLICTS] = {}


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """How many 409s the controller met per scenario: the busy cluster at work (GPUREMEDIATE_SIM_BUSY)."""
    met = config.stash.get(CONFLICTS, {})
    if met:
        hit = sorted((n, test) for test, n in met.items() if n)
        most = ", ".join(f"{test.rsplit('::', 1)[-1]} {n}" for n, test in hit[-3:][::-1]) or "none"
        terminalreporter.write_line(
            f"busy cluster (GPUREMEDIATE_SIM_BUSY): the controller's Node writes met {sum(met.values())} 409 Conflicts "
            f"(another writer changed the Node first; it read the Node again and decided again: expected, not a "
            f"failure) in {len(hit)} of {len(met)} scenarios; most: {most}")


@pytest.fixture(scope="session", autouse=True)
def only_the_targets_cluster() -> Iterator[None]:
    """On a target other than the emulator, a scenario that starts an API server of its own (a SimCluster
    made without the target's kubeconfig, a KubeAPIServer) fails at once: it would pass on that target
    without touching the target's server. Clusters come from ``make_cluster``. (Session-scoped: it is in
    place before any scenario's fixture, of whatever scope, starts.)"""
    target = target_name()
    if target == "emulator":
        yield
        return
    from sim.kubeapi import KubeAPIServer

    def refuse(self: KubeAPIServer) -> KubeAPIServer:
        raise E2EError(f"a scenario started an in-process API server on target {target}: make its cluster "
                       "with e2e.harness.make_cluster (its options shape the simulated world)")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KubeAPIServer, "start", refuse)
        yield


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A fresh, started cluster (controller not started); the controller's log tail on failure."""
    c = make_cluster(tmp_path).start()
    try:
        yield c
    finally:
        request.config.stash[CONFLICTS][request.node.name] = c.conflicts_met()
        report = getattr(request.node, "e2e_report_call", None)
        failed = report is not None and report.failed
        if failed:
            summaries = []
            for node in c.nodes:
                try:
                    summaries.append(c.summary(node))
                except Exception as exc:  # the cluster may be what broke
                    summaries.append(f"{node}: {exc}")
            stacks = c.controller_stacks()
            dumped = set(stacks.splitlines())
            tail = [line for line in c.controller_log().splitlines() if line not in dumped]
            print(f"\n---- nodes ({c.target})\n" + "\n".join(summaries))
            print(f"---- controller log (last {LOG_TAIL_LINES} lines)\n" + "\n".join(tail[-LOG_TAIL_LINES:]))
            if stacks:
                print(f"---- controller threads at the failure\n{stacks}")
        c.stop()
