"""The shipped RBAC against the calls the controller really makes.

`gpuremediate run`, with the base Deployment's own args, runs against a SimCluster under its own
token, and the emulator enforces exactly the rules the base manifests bind to the controller's
ServiceAccount (aggregated ClusterRoles cluster-wide, each Role in its namespace). A flow that
touches every path the controller has drives it: XID 79 -> drain (a PDB refuses an eviction with
429 first) -> reboot Job -> validation Job -> healthy; a DBE drained with DeleteAfterTimeout ->
reset Job -> healthy; a reset that times out twice (Job deleted) -> quarantined; an exporter that
goes down twice (an Event created, then patched); breaker state written; the leader Lease taken,
renewed and released. Then: every call must be allowed (no missing permission) and every granted
verb must have been used, except the ones listed in ALLOWED_UNUSED with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from manifests_support import (
    CONTROLLER_USER,
    allows,
    controller_calls,
    controller_grants,
    controller_under_rbac,
)

from gpuremediate.kube.resources import EVENTS, NODES, PDBS
from gpuremediate.vocab.record import record_from_node
from sim.cluster import SimCluster
from sim.waiting import wait_for

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)

# The same, for one namespace only (the permission is used elsewhere in this flow).
ALLOWED_UNUSED_IN: dict[tuple[str, str, str, str], str] = {
    ("gpuremediate-system", "", "events", "create"): "the fleet-unknown Event on the controller's own Pod "
                                                     "(most nodes unknown; tests/loops/test_detect_unknown.py)",
    ("gpuremediate-system", "", "events", "patch"): "a repeat of that Event",
    ("gpuremediate-system", "", "secrets", "get"): "the notifications Secret: [notifications] is off in this flow "
                                                   "(tests/notify and e2e/test_operability.py read it)",
    ("gpuremediate-system", "", "configmaps", "update"): "the breaker's state after its first write (this flow's "
                                                         "faults come in one read: one create; "
                                                         "tests/loops/test_detect_storm.py) and the dry-run journal "
                                                         "(tests/actions/test_dry_run_journal.py)",
}

# Granted on purpose, but this flow cannot reach the code that uses it (each says why).
ALLOWED_UNUSED: dict[Permission, str] = {
    # The maintenance loop only starts when the MaintenanceRequest CRD is served (the emulator
    # here does not install it); e2e/test_maintenance*.py drives those calls.
    ("gpuremediate.io", "maintenancerequests", "get"): "maintenance flow not driven here",
    ("gpuremediate.io", "maintenancerequests", "list"): "maintenance flow not driven here",
    ("gpuremediate.io", "maintenancerequests", "watch"): "maintenance flow not driven here",
    ("gpuremediate.io", "maintenancerequests", "patch"): "maintenance flow not driven here",
    ("gpuremediate.io", "maintenancerequests", "create"): "trend maintenance: e2e/test_trend_maintenance.py",
    ("gpuremediate.io", "maintenancerequests/status", "patch"): "maintenance flow not driven here",
    # [customDrain] is off by default; with it on the controller creates, reads (get, list by
    # label) and deletes DrainRequests instead of evicting. e2e's plugin scenarios drive it.
    ("nvsentinel.nvidia.com", "drainrequests", "create"): "custom drain is off in this flow",
    ("nvsentinel.nvidia.com", "drainrequests", "get"): "custom drain is off in this flow",
    ("nvsentinel.nvidia.com", "drainrequests", "list"): "custom drain is off in this flow",
    ("nvsentinel.nvidia.com", "drainrequests", "delete"): "custom drain is off in this flow",
    # [isolation] scope = "gpu" is off by default (node-level); e2e/test_gpu_isolation.py drives these calls
    # and tests/manifests/test_rbac_isolation.py runs that flow under the shipped role.
    ("cluster.x-k8s.io", "machines", "get"): "replace is off in this flow (tests/loops/test_remediate_replace.py)",
    ("cluster.x-k8s.io", "machines", "delete"): "replace is off in this flow",
    ("karpenter.sh", "nodeclaims", "get"): "replace is off in this flow (tests/actions/test_replace.py)",
    ("karpenter.sh", "nodeclaims", "delete"): "replace is off in this flow",
    ("resource.k8s.io", "devicetaintrules", "get"): "GPU-level isolation is off in this flow",
    ("resource.k8s.io", "devicetaintrules", "list"): "GPU-level isolation is off in this flow",
    ("resource.k8s.io", "devicetaintrules", "create"): "GPU-level isolation is off in this flow",
    ("resource.k8s.io", "devicetaintrules", "update"): "GPU-level isolation is off in this flow",
    ("resource.k8s.io", "devicetaintrules", "delete"): "GPU-level isolation is off in this flow",
    ("resource.k8s.io", "resourceslices", "list"): "GPU-level isolation is off in this flow",
    ("resource.k8s.io", "resourceclaims", "get"): "GPU-level isolation is off in this flow",
    ("resource.k8s.io", "resourceclaims", "create"): "GPU-level isolation is off in this flow",
}

POLICY = """
[drain]
retry_s = 0.3

[budget]
max_unavailable = "4"

[breaker]
# never opens with 4 nodes (it still records every fault in its ConfigMap)
threshold_percent = 100.0

[[groups]]
name = "delete-drain"
selector = "rbac-test/group=delete"
[groups.drain]
mode = "DeleteAfterTimeout"
timeout_s = 1.0
retry_s = 0.3

[[groups]]
name = "slow-repair"
selector = "rbac-test/group=slow"
[groups.remediation.reset_gpu]
timeout_s = 1.0
"""


def _wait(what: str, check: Callable[[], bool], timeout: float = 45.0, seen: Callable[[], str] = str) -> None:
    wait_for(check, timeout, what, seen=seen, interval=0.1)


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimCluster, str]]:
    tmp = tmp_path_factory.mktemp("rbac")
    cluster = SimCluster(nodes=4, gpus=4, job_duration_s=0.3, reboot_down_s=0.5).start()
    try:
        yield cluster, _drive(cluster, tmp)
    finally:
        cluster.stop()


def _state(cluster: SimCluster, node: str) -> str:
    record = record_from_node(cluster.kube.get(NODES, node))
    return "healthy" if record is None else str(getattr(record, "state", "malformed"))


def _states(cluster: SimCluster) -> str:
    return ", ".join(f"{n}={_state(cluster, n)}" for n in cluster.node_names)


def _drive(cluster: SimCluster, tmp: Path) -> str:
    kube, sim = cluster.kube, cluster.gpusim
    for node, group in (("gpu-node-2", "delete"), ("gpu-node-4", "slow")):
        kube.patch(NODES, node, {"metadata": {"labels": {"rbac-test/group": group}}})
    assert cluster.nodesim is not None
    cluster.nodesim.set_job_outcome("gpu-node-4", succeed=True, duration_s=60.0)
    cluster.workload("guarded", "gpu-node-1", labels={"app": "guarded"})
    cluster.workload("stubborn", "gpu-node-2")
    cluster.pdb("guarded", {"app": "guarded"}, min_available=1)

    with controller_under_rbac(cluster, tmp, POLICY) as log_path:
        _faults_and_waits(cluster, sim)
    return log_path.read_text(encoding="utf-8")


def _faults_and_waits(cluster: SimCluster, sim: Any) -> None:
    kube = cluster.kube
    _wait("the controller to take the lease",
          lambda: any(r[0] == CONTROLLER_USER and r[3] == "leases" and r[1] == "create"
                      for r in list(cluster.api.requests)))
    sim.inject_xid("gpu-node-1", 0, 79)
    sim.inject_dbe("gpu-node-2", 1)

    def pdb_blocked() -> bool:
        record = record_from_node(kube.get(NODES, "gpu-node-1"))
        blocked = getattr(record, "blocked", None)
        return blocked is not None and blocked.reason == "pdb"

    _wait("gpu-node-1's drain to be refused by the PDB (429)", pdb_blocked, seen=lambda: _states(cluster))
    # A read's new faults are counted in one breaker write: the first batch creates the ConfigMap, a later
    # fault updates it (injected with the others, all three were one create, and update looked unused).
    sim.inject_dbe("gpu-node-4", 2)
    kube.delete(PDBS, "guarded", "workloads")

    sim.set_down("gpu-node-3", "refuse")
    _wait("GPUHealthUnknown for gpu-node-3", lambda: _events(cluster, "gpu-node-3", "GPUHealthUnknown") >= 1)
    sim.set_down("gpu-node-3", None)
    _wait("GPUHealthKnown for gpu-node-3", lambda: _events(cluster, "gpu-node-3", "GPUHealthKnown") >= 1)
    sim.set_down("gpu-node-3", "refuse")
    _wait("the repeated GPUHealthUnknown to bump its Event's count (a patch)",
          lambda: _events(cluster, "gpu-node-3", "GPUHealthUnknown") >= 2)
    sim.set_down("gpu-node-3", None)

    done = {("gpu-node-1", "reboot"), ("gpu-node-1", "validate"), ("gpu-node-2", "reset-gpu"),
            ("gpu-node-2", "validate")}
    _wait("reboot+validate on gpu-node-1, reset+validate on gpu-node-2",
          lambda: done <= {(n, k) for n, k, ok in cluster.job_log if ok}, seen=lambda: str(cluster.job_log))
    _wait("gpu-node-1 and gpu-node-2 healthy, gpu-node-4 quarantined",
          lambda: [_state(cluster, n) for n in ("gpu-node-1", "gpu-node-2", "gpu-node-4")]
          == ["healthy", "healthy", "quarantined"], seen=lambda: _states(cluster))


def _events(cluster: SimCluster, node: str, reason: str) -> int:
    items = cluster.kube.list(EVENTS, "default")["items"]
    return sum(int(e.get("count", 1)) for e in items
               if e.get("reason") == reason and e["involvedObject"]["name"] == node)


def test_the_flow_ran_and_the_lease_was_released(flow: tuple[SimCluster, str]) -> None:
    cluster, log = flow
    calls = controller_calls(cluster)
    assert ("create", "", "pods/eviction", "workloads", "guarded") in calls
    assert ("delete", "", "pods", "workloads", "stubborn") in calls
    assert any(c[0] == "delete" and c[2] == "jobs" for c in calls), "no Job was deleted after its timeout"
    assert any(c[0] in ("create", "update") and c[2] == "configmaps" for c in calls), "the breaker state was never written"
    assert calls[-1][:3] == ("update", "coordination.k8s.io", "leases"), f"lease not released last: {calls[-1]}"
    assert "Traceback" not in log, log


def test_every_call_is_allowed_by_the_shipped_rules(flow: tuple[SimCluster, str]) -> None:
    cluster, log = flow
    grants = controller_grants()
    missing = sorted({c for c in controller_calls(cluster) if not any(allows(g, *c) for g in grants)},
                     key=str)
    assert not missing, f"calls the manifests do not allow (403): {missing}"
    assert "Forbidden" not in log and " 403" not in log, log


def test_every_granted_verb_is_used_or_explained(flow: tuple[SimCluster, str]) -> None:
    cluster, _ = flow
    grants = controller_grants()
    used: set[tuple[str, str, str, str, str | None]] = set()
    for call in controller_calls(cluster):
        for g in grants:
            if allows(g, *call):
                used.add((g.role, *call[1:3], call[0], g.namespace))
    unused = []
    for g in grants:
        for group, resource, verb, namespace in sorted(g.permissions(), key=str):
            allowed = ((group, resource, verb) in ALLOWED_UNUSED
                       or (namespace, group, resource, verb) in ALLOWED_UNUSED_IN)
            if (g.role, group, resource, verb, namespace) not in used and not allowed:
                unused.append(f"{g.role}{f' ({namespace})' if namespace else ''}: {verb} {group or 'core'}/{resource}")
    assert not unused, f"granted but never used (remove, or add to ALLOWED_UNUSED with a reason): {unused}"


def test_allow_list_names_only_permissions_that_are_granted() -> None:
    granted = {(group, resource, verb) for g in controller_grants() for group, resource, verb, _ in g.permissions()}
    stale = set(ALLOWED_UNUSED) - granted
    in_namespace = {(ns, group, resource, verb) for g in controller_grants()
                    for group, resource, verb, ns in g.permissions()}
    stale_in = sorted(key for key in ALLOWED_UNUSED_IN if key not in in_namespace)
    assert not stale_in, f"ALLOWED_UNUSED_IN lists permissions the manifests no longer grant: {stale_in}"
    assert not stale, f"ALLOWED_UNUSED lists permissions the manifests no longer grant: {sorted(stale)}"
