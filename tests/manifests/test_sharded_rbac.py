"""manifests/overlays/sharded's RBAC against the calls two sharded replicas really make.

Two `gpuremediate run` processes with the base Deployment's args plus the overlay's `--shards=4` run
against a SimCluster under the controller ServiceAccount's token, the emulator enforcing exactly the rules
the base and the overlay bind to it. They share the four shard Leases, repair two DBEs one after the other
under a budget of 1 (a drain admitted through ConfigMap gpuremediate-budget; the second admission prunes the
first once it is done) and release their Leases on SIGTERM. Every call must be allowed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from manifests_support import (
    ROOT,
    allows,
    controller_calls,
    controller_grants,
    deployment_args,
    kubeconfig_under_rbac,
)

from gpuremediate.kube.resources import CONFIGMAPS, NODES
from gpuremediate.kube.shards import list_shard_leases
from gpuremediate.vocab.record import record_from_node
from sim.cluster import SimCluster
from sim.waiting import wait_for

NAMESPACE = "gpuremediate-system"
POLICY = '[drain]\nretry_s = 0.3\n\n[budget]\nmax_unavailable = "1"\n\n[breaker]\nenabled = false\n'
FAULTY = ("gpu-node-1", "gpu-node-3")


SHARDED_ARGS = ("--shards=4", "--leader-elect-lease-duration=3s", "--leader-elect-renew-deadline=2s",
                "--leader-elect-retry-period=0.5s")


def _grants() -> list[Any]:
    return controller_grants("base") + controller_grants("overlays/sharded")


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimCluster, list[str]]]:
    tmp = tmp_path_factory.mktemp("sharded-rbac")
    cluster = SimCluster(nodes=4, gpus=4, job_duration_s=0.3, reboot_down_s=0.5).start()
    try:
        yield cluster, _drive(cluster, tmp)
    finally:
        cluster.stop()


def _drive(cluster: SimCluster, tmp: Path) -> list[str]:
    kubeconfig = kubeconfig_under_rbac(cluster, tmp, _grants())
    policy = tmp / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
    argv = [sys.executable, "-m", "gpuremediate", *deployment_args(policy, cluster, kubeconfig, *SHARDED_ARGS)]
    logs = [tmp / f"replica-{i}.log" for i in range(2)]
    procs = []
    for i, path in enumerate(logs):
        env = {**os.environ, "POD_NAMESPACE": NAMESPACE, "POD_NAME": f"gpuremediate-shard-test-{i}",
               "PYTHONPATH": str(ROOT)}
        with path.open("w") as log:
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        wait_for(lambda: sorted(lease.holder for lease in list_shard_leases(cluster.kube, NAMESPACE))
                 == ["gpuremediate-shard-test-0"] * 2 + ["gpuremediate-shard-test-1"] * 2, 60,
                 "the four shard Leases split two and two",
                 seen=lambda: [(s.index, s.holder) for s in list_shard_leases(cluster.kube, NAMESPACE)])
        for node in FAULTY:
            cluster.gpusim.inject_dbe(node, 0)
        wait_for(lambda: all(_healthy_after_repair(cluster, n) for n in FAULTY), 90, "both faulty nodes repaired",
                 seen=lambda: [record_from_node(cluster.kube.get(NODES, n)) for n in FAULTY])
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return [path.read_text(encoding="utf-8") for path in logs]


def _healthy_after_repair(cluster: SimCluster, node: str) -> bool:
    record = record_from_node(cluster.kube.get(NODES, node))
    return getattr(record, "state", "") == "healthy" and bool(getattr(record, "history", ()))


def test_every_call_of_the_sharded_replicas_is_allowed(flow: tuple[SimCluster, list[str]]) -> None:
    cluster, logs = flow
    grants = _grants()
    missing = sorted({c for c in controller_calls(cluster) if not any(allows(g, *c) for g in grants)}, key=str)
    assert not missing, f"calls the manifests do not allow (403): {missing}"
    for log in logs:
        assert "Forbidden" not in log and " 403" not in log and "Traceback" not in log, log


def test_the_shard_calls_ran_and_the_leases_were_released(flow: tuple[SimCluster, list[str]]) -> None:
    cluster, _ = flow
    calls = controller_calls(cluster)
    for verb in ("list", "create", "update"):
        assert any(c[0] == verb and c[2] == "leases" for c in calls), verb
    budget = [c for c in calls if c[2] == "configmaps" and c[4] == "gpuremediate-budget"]
    assert {c[0] for c in budget} >= {"get", "update"}, budget  # and a create (its audit names no object)
    assert not any(c[2] == "leases" and c[4] == "gpuremediate" for c in calls), "no leader Lease with --shards"
    assert all(lease.holder == "" for lease in list_shard_leases(cluster.kube, NAMESPACE))
    admitted = json.loads(cluster.kube.get(CONFIGMAPS, "gpuremediate-budget", NAMESPACE)["data"]["admitted"])
    assert len(admitted) == 1 and set(admitted) <= set(FAULTY), admitted  # the first was pruned by the second
