"""The roles shipped for people (manifests/base/rbac-people.yaml) against the calls the CLI really makes.

Two users of the API emulator, each bound exactly as docs/operate.md's `kubectl create ...binding` lines bind
its group: one to gpuremediate-viewer, one to gpuremediate-operator (the emulator enforces those rules only). The
viewer runs every command that only reads (status, explain with --policy, breaker status, each -o); the operator
runs them too, and release, pause, resume, breaker reset. Every call must be allowed; the viewer's writes must be
refused with the API server's refusal and the role that grants them (exit 2, no traceback); every granted
(verb, resource, name) must be used by some command, as tests/manifests/test_rbac_calls.py asks of the controller.
"""

from __future__ import annotations

import contextlib
import io
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from manifests_support import ROOT, Grant, allows, named, of_kind, rules_by_scope

from gpuremediate import cli
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import CONFIGMAPS, NAMESPACES, NODES, PODS
from gpuremediate.signals.fabric import CLIQUE_LABEL
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_QUARANTINE, KIND_ROW_REMAP_FAILURE
from gpuremediate.vocab.record import Fault, NodeRecord, node_patch, record_from_node
from sim.kubeapi import KubeAPIServer

NS = "gpuremediate-system"
VIEWER, OPERATOR = "gpuremediate-viewer", "gpuremediate-operator"
DOCS = ROOT / "docs" / "operate.md"
BINDING = re.compile(r"kubectl (?:-n (\S+) )?create (clusterrolebinding|rolebinding) \S+ "
                     r"--(clusterrole|role)=(\S+) --group=(\S+)")
POLICY = '[drain]\nskip_namespaces = ["kube-system"]\n'

Call = tuple[str, str, str, str | None, str | None]  # (verb, group, resource, namespace, name)

# Granted on purpose, never called by these runs (each says why). None so far.
ALLOWED_UNUSED: dict[tuple[str, str, str, str, str | None, str | None], str] = {}


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    rc: int
    out: str
    err: str
    calls: tuple[Call, ...]


def documented_bindings() -> dict[str, list[tuple[str, str, str | None]]]:
    """group -> [(role kind, role name, binding namespace or None)], from docs/operate.md's binding commands."""
    found: dict[str, list[tuple[str, str, str | None]]] = {}
    for namespace, kind, role_kind, role, group in BINDING.findall(DOCS.read_text(encoding="utf-8")):
        where = f"{kind} --{role_kind} -n {namespace}"
        assert (kind == "rolebinding") == bool(namespace) == (role_kind == "role"), where
        found.setdefault(group, []).append(("Role" if role_kind == "role" else "ClusterRole", role, namespace or None))
    return found


def group_grants(group: str) -> list[Grant]:
    """The rules a member of ``group`` gets from the documented bindings (a RoleBinding: its namespace only)."""
    grants: list[Grant] = []
    for kind, name, namespace in documented_bindings()[group]:
        matches = [r for r in of_kind(kind, under="base") if r["metadata"]["name"] == name
                   and (kind == "ClusterRole" or r["metadata"]["namespace"] == namespace)]
        assert len(matches) == 1, f"docs/operate.md binds {kind} {name} ({namespace}): not in manifests/base"
        grants += [Grant(name, namespace, rule) for rule in matches[0]["rules"]]
    return grants


def group_of(role: str) -> str:
    groups = [g for g, refs in documented_bindings().items() if {name for _, name, _ in refs} == {role}]
    assert len(groups) == 1, f"docs/operate.md: no group bound to both parts of {role}: {documented_bindings()}"
    return groups[0]


def _fault(kind: str = KIND_ROW_REMAP_FAILURE) -> Fault:
    return Fault(kind, "", ("GPU-1",), f"{kind}:GPU-1", ACTION_QUARANTINE, 900.0, 900.0, "row remapping failed")


def _node(admin: KubeClient, name: str, record: NodeRecord, labels: dict[str, str] | None = None) -> None:
    admin.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
                         "spec": {"unschedulable": True},
                         "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}})
    admin.patch(NODES, name, node_patch(record))


def _pod(admin: KubeClient, name: str, namespace: str, node: str) -> None:
    admin.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}, namespace)


def _seed(admin: KubeClient) -> None:
    """A quarantined node for each user's release, a draining node in an NVLink domain with a pod the policy's
    drain.skip_namespaces skips (explain --policy lists them), no breaker ConfigMap yet (pause creates it)."""
    for namespace in (NS, "team-a"):
        admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    quarantined = NodeRecord(state=states.QUARANTINED, since=1000.0, reason="row-remap-failure",
                             message="row remapping failed", fault=_fault(), cordoned_by_us=True)
    _node(admin, "gpu-q-operator", quarantined)
    _node(admin, "gpu-q-viewer", quarantined)
    draining = NodeRecord(state=states.DRAINING, since=1000.0, reason="row-remap-failure", fault=_fault(),
                          cordoned_by_us=True)
    _node(admin, "gpu-d", draining, {CLIQUE_LABEL: "cluster-a.1"})
    _pod(admin, "dcgm", "kube-system", "gpu-d")
    _pod(admin, "train", "team-a", "gpu-d")


def _reads(policy: Path) -> list[list[str]]:
    return [["status"], ["status", "-o", "wide"], ["status", "-o", "json"], ["status", "-o", "yaml"],
            ["explain", "gpu-d"], ["explain", "gpu-d", "-o", "json"], ["explain", "gpu-d", "--policy", str(policy)],
            ["breaker", "status"], ["breaker", "status", "-o", "json"]]


def _writes(node: str) -> list[list[str]]:
    return [["pause", "--reason", "driver upgrade", "--by", "bob"], ["resume"], ["breaker", "reset"],
            ["release", node, "--by", "bob"]]


class Person:
    """One user of the emulator, bound as docs/operate.md binds ``role``'s group; runs CLI commands in-process."""

    def __init__(self, srv: KubeAPIServer, tmp: Path, role: str) -> None:
        self.user, self.srv = f"{role}-user", srv
        token = secrets.token_hex(16)
        srv.add_token(token, self.user, ["system:authenticated", group_of(role)])
        self.grants = group_grants(group_of(role))
        rules, namespaced = rules_by_scope(self.grants)
        srv.enforce_rbac(self.user, rules, namespaced=namespaced)
        self.kubeconfig = srv.write_kubeconfig(tmp / f"{role}.kubeconfig", token)

    def run(self, argv: list[str]) -> Run:
        before = len(self.srv.requests)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main([*argv, "--kubeconfig", self.kubeconfig])
        calls = tuple((verb, group, f"{res}/{sub}" if sub else res, ns, name)
                      for user, verb, group, res, sub, ns, name in list(self.srv.requests)[before:]
                      if user == self.user and res)
        return Run(tuple(argv), rc, out.getvalue(), err.getvalue(), calls)


@dataclass
class World:
    admin: KubeClient
    people: dict[str, Person]
    runs: dict[str, list[Run]]  # "viewer", "operator", and "viewer-writes" (the viewer's refused writes)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The commands, in a fixed order: the viewer's writes before the operator's (no breaker ConfigMap yet) and
    after (it exists), the viewer's reads last."""
    tmp = tmp_path_factory.mktemp("rbac-cli")
    policy = tmp / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
    srv = KubeAPIServer().start()
    admin = KubeClient(load_config(srv.write_kubeconfig(tmp / "admin.kubeconfig")))
    try:
        _seed(admin)
        viewer, operator = Person(srv, tmp, VIEWER), Person(srv, tmp, OPERATOR)
        refused_before = [viewer.run(argv) for argv in _writes("gpu-q-viewer")]  # no breaker ConfigMap: create
        operator_runs = [operator.run(argv) for argv in [*_reads(policy), *_writes("gpu-q-operator")]]
        refused_after = [viewer.run(argv) for argv in _writes("gpu-q-viewer")]  # the operator made it: update
        runs = {"viewer-writes": refused_before + refused_after, "operator": operator_runs,
                "viewer": [viewer.run(argv) for argv in _reads(policy)]}
        yield World(admin, {"viewer": viewer, "operator": operator}, runs)
    finally:
        admin.close()
        srv.stop()


def _refused(run: Run, grants: list[Grant]) -> list[Call]:
    return [c for c in run.calls if not any(allows(g, *c) for g in grants)]


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_every_command_succeeds_and_every_call_is_allowed(who: str, world: World) -> None:
    person = world.people[who]
    for run in world.runs[who]:
        assert run.rc == 0, f"{who}: {' '.join(run.argv)} exited {run.rc}: {run.err}"
        assert "Forbidden" not in run.out + run.err and "Traceback" not in run.err, (run.argv, run.out, run.err)
        assert run.calls, f"{who}: {' '.join(run.argv)} made no call"
        assert not _refused(run, person.grants), f"{who}: {' '.join(run.argv)}: calls not granted"


def test_the_runs_did_what_each_command_says(world: World) -> None:
    """The calls counted above are the real ones: the operator's writes landed, explain --policy listed pods."""
    admin, ran = world.admin, world.runs
    released = record_from_node(admin.get(NODES, "gpu-q-operator"))
    assert isinstance(released, NodeRecord) and released.state == states.VALIDATING
    breaker = admin.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)
    assert '"paused": false' in breaker["data"]["pause"]  # paused, then resumed
    calls = {c for run in ran["operator"] for c in run.calls}
    assert ("create", "", "configmaps", NS, None) in calls  # pause before the controller wrote it
    assert ("update", "", "configmaps", NS, BREAKER_CONFIGMAP) in calls
    assert ("patch", "", "nodes", None, "gpu-q-operator") in calls
    by_policy = next(r for r in ran["viewer"] if "--policy" in r.argv)
    assert ("list", "", "pods", None, None) in by_policy.calls
    assert "kube-system" in by_policy.out, by_policy.out


def test_the_viewers_writes_are_refused_clearly(world: World) -> None:
    admin = world.admin
    for run in world.runs["viewer-writes"]:
        command = run.argv[0]
        assert run.rc == cli.EXIT_ERROR, (run.argv, run.rc, run.err)
        assert "Traceback" not in run.err and run.out == "", (run.argv, run.out, run.err)
        assert run.err.startswith(f"gpuremediate {command}: 403 Forbidden: "), run.err
        assert "cannot " in run.err and OPERATOR in run.err, run.err
        assert _refused(run, world.people["viewer"].grants), f"{run.argv}: refused, but not for a call the role lacks"
    refused = {c[0] for run in world.runs["viewer-writes"] for c in _refused(run, world.people["viewer"].grants)}
    assert refused == {"create", "update", "patch"}, refused
    quarantined = record_from_node(admin.get(NODES, "gpu-q-viewer"))
    assert isinstance(quarantined, NodeRecord) and quarantined.state == states.QUARANTINED


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_every_granted_permission_is_used_or_explained(who: str, world: World) -> None:
    """Each (verb, resource, namespace, resourceName) a role grants is called by one of its user's commands."""
    person = world.people[who]
    calls = {c for run in world.runs[who] for c in run.calls}
    unused = []
    for g in person.grants:
        for group, resource, verb, namespace in sorted(g.permissions(), key=str):
            for name in g.rule.get("resourceNames") or [None]:
                key = (g.role, group, resource, verb, namespace, name)
                used = any(c[:3] == (verb, group, resource) and allows(g, *c) and name in (None, c[4])
                           for c in calls)
                if not used and key not in ALLOWED_UNUSED:
                    unused.append(f"{g.role}{f' ({namespace})' if namespace else ''}: {verb} {group or 'core'}/"
                                  f"{resource}{f' {name}' if name else ''}")
    assert not unused, f"granted but never called (remove, or add to ALLOWED_UNUSED with a reason): {unused}"


def test_the_docs_bind_both_parts_of_each_role_and_the_operator_can_do_what_the_viewer_can() -> None:
    viewer, operator = group_grants(group_of(VIEWER)), group_grants(group_of(OPERATOR))
    assert {(g.namespace, g.role) for g in viewer} == {(None, VIEWER), (NS, VIEWER)}
    for g in viewer:
        for group, resource, verb, namespace in g.permissions():
            for name in g.rule.get("resourceNames") or [None]:
                call = (verb, group, resource, namespace, name)
                assert any(allows(o, *call) for o in operator), f"the operator lacks the viewer's {call}"


def test_no_role_is_bound_to_people_and_none_widens_the_built_in_roles() -> None:
    """A platform team binds its own groups; the built-in view/edit/admin (bound per namespace by RoleBindings)
    get nothing of ours: not Nodes, which would reach every cluster-wide binding of them."""
    for binding in of_kind("ClusterRoleBinding", "RoleBinding", under="base"):
        assert binding["roleRef"]["name"] not in (VIEWER, OPERATOR), binding["metadata"]["name"]
    for role in of_kind("ClusterRole"):
        labels = role["metadata"].get("labels", {})
        built_in = [k for k in labels if k.startswith("rbac.authorization.k8s.io/aggregate-to-")]
        cluster_scoped = {r for rule in role.get("rules", []) for r in rule["resources"]} & {"nodes", "nodes/status"}
        assert not (built_in and cluster_scoped), f"{role['metadata']['name']} gives {cluster_scoped} to {built_in}"
    for name in (VIEWER, OPERATOR):
        assert "aggregationRule" not in named("ClusterRole", name)
