"""manifests/overlays/sharded: its --shards and its RBAC agree (one Lease name per shard: RBAC names are no
patterns), and with the base Role the controller may do every call a sharded replica makes in its namespace."""

from __future__ import annotations

import re

from manifests_support import MANIFESTS, controller_grants

from gpuremediate.actions.budget_claims import BUDGET_CONFIGMAP
from gpuremediate.kube.miniyaml import load
from gpuremediate.kube.shards import shard_lease_name

NAMESPACE = "gpuremediate-system"


def _shards() -> int:
    kustomization = load((MANIFESTS / "overlays/sharded/kustomization.yaml").read_text(encoding="utf-8"))
    patches = " ".join(p["patch"] for p in kustomization["patches"])
    found = re.findall(r"value: --shards=(\d+)", patches)
    assert len(found) == 1, patches
    return int(found[0])


def _allowed(verb: str, group: str, resource: str, name: str) -> bool:
    grants = controller_grants("base") + controller_grants("overlays/sharded")
    for grant in grants:
        rule = grant.rule
        names = rule.get("resourceNames") or []
        if grant.namespace in (None, NAMESPACE) and group in rule["apiGroups"] and resource in rule["resources"] \
                and verb in rule["verbs"] and (not names or name in names):
            return True
    return False


def test_every_shard_lease_may_be_created_read_and_renewed() -> None:
    shards = _shards()
    assert shards > 1
    for index in range(shards):
        for verb in ("create", "get", "update"):
            assert _allowed(verb, "coordination.k8s.io", "leases", shard_lease_name(index)), (verb, index)
    assert not _allowed("get", "coordination.k8s.io", "leases", shard_lease_name(shards)), "no name beyond --shards"
    assert _allowed("list", "coordination.k8s.io", "leases", ""), "each round lists the namespace's Leases"


def test_the_admitted_set_may_be_created_read_and_updated() -> None:
    for verb in ("create", "get", "update"):
        assert _allowed(verb, "", "configmaps", BUDGET_CONFIGMAP), verb
    assert _allowed("list", "", "nodes", ""), "a finished claim is checked with a LIST of the node by name"
