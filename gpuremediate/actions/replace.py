"""Replacing a GPU node: what owns it, and the one delete that makes its owner replace it (issue 47).

Providers, chosen by what the Node says owns it:

- ``cluster-api``: the Cluster API machine controller annotates each Node with its Machine
  (``cluster.x-k8s.io/machine``) and the Machine's namespace (``cluster.x-k8s.io/cluster-namespace``). Deleting
  the Machine makes its MachineSet create a new one, as medik8s' machine-deletion-remediation does; a Machine
  without a controller owner (a MachineSet, or a control plane such as KubeadmControlPlane) would not come back,
  so it is never deleted: the ladder goes to a person, the reason says why.
- ``karpenter``: Karpenter's Node is owned by its NodeClaim (``ownerReferences`` kind ``NodeClaim``, karpenter.sh/v1,
  set by its registration controller: ``UpdateNodeOwnerReferences`` in pkg/utils/nodeclaim). Karpenter sets no
  ``karpenter.sh/nodeclaim`` label (pkg/apis/v1/labels.go); one that another tool sets is read as a fallback.
  Deleting the NodeClaim makes Karpenter drain and terminate the instance and provision a replacement for the pods
  left pending.
- anything else: no built-in target (``custom``: the custom remediation resource contract, ``actions.<name>``).

The delete carries a ``uid`` precondition (the object found when the record was written): a new Machine or
NodeClaim that took the old one's name is never deleted by a retry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import Resource

PROVIDER_CLUSTER_API = "cluster-api"
PROVIDER_KARPENTER = "karpenter"
PROVIDER_CUSTOM = "custom"
PROVIDERS = (PROVIDER_CLUSTER_API, PROVIDER_KARPENTER, PROVIDER_CUSTOM)

MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
MACHINE_NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"
NODECLAIM_LABEL = "karpenter.sh/nodeclaim"
CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSIONS = ("v1beta2", "v1beta1")  # v1beta2 since Cluster API 1.11; v1beta1 still served beside it
KARPENTER_GROUP = "karpenter.sh"
NODECLAIMS = Resource(KARPENTER_GROUP, "v1", "nodeclaims", "NodeClaim", False)


def machines(version: str) -> Resource:
    return Resource(CAPI_GROUP, version, "machines", "Machine", True)


@dataclass(frozen=True)
class Target:
    """The object whose deletion replaces the node."""

    provider: str
    resource: Resource
    name: str
    namespace: str | None
    uid: str
    deleting: bool = False  # its delete was sent (deletionTimestamp): ours before a restart, or another's

    def describe(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.resource.kind} {where}{self.name}"


@dataclass(frozen=True)
class NoTarget:
    """Why this node cannot be replaced by a built-in provider (said to the person the ladder goes to)."""

    provider: str  # the provider that would own it ("" none recognised)
    why: str


def provider_of(node: Mapping[str, Any]) -> str:
    """The provider the Node's own metadata names ("" none)."""
    meta = node.get("metadata") or {}
    if (meta.get("annotations") or {}).get(MACHINE_ANNOTATION):
        return PROVIDER_CLUSTER_API
    if _nodeclaim_name(node):
        return PROVIDER_KARPENTER
    return ""


def find_target(client: KubeClient, node: Mapping[str, Any], provider: str = "auto") -> Target | NoTarget:
    """The object to delete for ``node``, read from the API server now (its uid pins it); or why there is none.
    ``provider``: "auto" (what the Node names) or the one the policy asks for."""
    named = provider_of(node)
    if provider not in ("auto", named):
        return NoTarget(provider, f"the policy's provider is {provider}, but the node names "
                                  f"{named or 'no Cluster API Machine and no Karpenter NodeClaim'}")
    provider = named
    if provider == PROVIDER_CLUSTER_API:
        return _machine(client, node)
    if provider == PROVIDER_KARPENTER:
        return _nodeclaim(client, node)
    return NoTarget("", f"the node names no Cluster API Machine (annotation {MACHINE_ANNOTATION}) and no Karpenter "
                        f"NodeClaim (an ownerReference or the label {NODECLAIM_LABEL})")


def delete_target(client: KubeClient, target: Target) -> bool:
    """Delete it, only if it is still the object found (uid). True: deleted now; False: already gone (or another
    object has the name now: not ours to delete)."""
    try:
        client.delete(target.resource, target.name, target.namespace, propagation_policy="Background",
                      preconditions={"uid": target.uid})
    except errors.NotFound:
        return False
    except errors.Conflict:  # the precondition failed: a new object under the name
        return False
    return True


def gone(client: KubeClient, target: Target) -> bool:
    """The target no longer exists (or the name is another object's now)."""
    try:
        obj = client.get(target.resource, target.name, target.namespace)
    except errors.NotFound:
        return True
    return str((obj.get("metadata") or {}).get("uid") or "") != target.uid


def _machine(client: KubeClient, node: Mapping[str, Any]) -> Target | NoTarget:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    name = str(annotations[MACHINE_ANNOTATION])
    namespace = str(annotations.get(MACHINE_NAMESPACE_ANNOTATION) or "default")
    for version in CAPI_VERSIONS:
        res = machines(version)
        with contextlib.suppress(errors.NotFound):
            machine = client.get(res, name, namespace)
            owner = _controller_owner(machine)
            if owner is None:
                return NoTarget(PROVIDER_CLUSTER_API, f"Machine {namespace}/{name} has no controller owner (a "
                                f"MachineSet or a control plane) that would replace it: deleting it would only "
                                f"remove the node")
            return Target(PROVIDER_CLUSTER_API, res, name, namespace, _uid(machine), _deleting(machine))
    return NoTarget(PROVIDER_CLUSTER_API, f"Machine {namespace}/{name} (annotation {MACHINE_ANNOTATION}) not found "
                    f"in {CAPI_GROUP} {' or '.join(CAPI_VERSIONS)}")


def _nodeclaim(client: KubeClient, node: Mapping[str, Any]) -> Target | NoTarget:
    name = _nodeclaim_name(node)
    try:
        claim = client.get(NODECLAIMS, name)
    except errors.NotFound:
        return NoTarget(PROVIDER_KARPENTER, f"NodeClaim {name} not found ({KARPENTER_GROUP}/v1)")
    return Target(PROVIDER_KARPENTER, NODECLAIMS, name, None, _uid(claim), _deleting(claim))


def _nodeclaim_name(node: Mapping[str, Any]) -> str:
    meta = node.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "NodeClaim" and str(ref.get("apiVersion", "")).startswith(KARPENTER_GROUP + "/"):
            return str(ref.get("name") or "")
    return str((meta.get("labels") or {}).get(NODECLAIM_LABEL) or "")


def _controller_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") is True:
            return dict(ref)
    return None


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _deleting(obj: Mapping[str, Any]) -> bool:
    """Its delete was accepted and its finalizers run (a Machine drains its node first): a second delete adds
    nothing."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))
