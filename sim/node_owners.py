"""What owns a simulated GPU node (issue 47): Cluster API's Machine and MachineSet, or Karpenter's NodeClaim, served
as CRDs with their real schemas' essentials, and a small owner controller that replaces a deleted one.

The kinds (the CRDs' ``openAPIV3Schema`` trimmed to the fields that matter here, required ones kept required):

- ``cluster.x-k8s.io/v1beta1`` Machine and MachineSet, namespaced, status subresource: Cluster API's CRDs
  (``config/crd/bases/cluster.x-k8s.io_machines.yaml`` and ``..._machinesets.yaml``; the API reference at
  https://pkg.go.dev/sigs.k8s.io/cluster-api/api/v1beta1 and https://cluster-api.sigs.k8s.io/). MachineSpec
  requires ``clusterName``, ``bootstrap`` and ``infrastructureRef``; MachineSetSpec ``clusterName`` and
  ``selector``. Cluster API 1.11 serves v1beta2 beside v1beta1 (the controller reads v1beta2 first, then v1beta1):
  the emulator serves v1beta1 only, so the fallback is what the scenarios go through. Checked against
  core/config/crd/bases/ of kubernetes-sigs/cluster-api at ae7ff047 (v1.14.0-rc.0+): every field written here is
  in its v1beta1 schema with these types; not served here: the MachineSet's scale subresource, most status fields.
- Karpenter checked at kubernetes-sigs/karpenter 22664681 (v1.14.0+): the operator enum has Gte and Lte; the
  CEL rules (spec immutable, requirement keys outside karpenter.sh) are not run by the emulator. Its registration
  also puts the ``karpenter.sh/termination`` finalizer and ``karpenter.sh/initialized`` on the Node: not done here
  (a Node deleted directly is gone at once, not drained by Karpenter first).
- ``karpenter.sh/v1`` NodeClaim, cluster-scoped, status subresource (``pkg/apis/crds/karpenter.sh_nodeclaims.yaml``
  of kubernetes-sigs/karpenter; aws/karpenter-provider-aws v1.7.3 ships the same). NodeClaimSpec requires
  ``nodeClassRef`` (group, kind, name) and ``requirements``.

The owner controller (``OwnerSim``), one thread, playing what the real ones do to a node being replaced:

- adopting: one Machine per node, owned (``controller: true``) by the MachineSet ``gpu-workers``, with the
  ``machine.cluster.x-k8s.io`` finalizer, ``status.nodeRef`` and the annotations Cluster API's machine controller
  puts on its Node (``cluster.x-k8s.io/machine``, ``cluster-name``, ``cluster-namespace``, ``owner-kind``,
  ``owner-name``) and ``spec.providerID``; or one NodeClaim per node with the ``karpenter.sh/termination`` finalizer,
  ``status.nodeName``/``providerID``, and on the Node what Karpenter's registration controller sets
  (``pkg/controllers/nodeclaim/lifecycle/registration.go``): an ownerReference to the NodeClaim, the labels
  ``karpenter.sh/nodepool`` and ``karpenter.sh/registered``;
- a Machine or NodeClaim being deleted (its ``deletionTimestamp``): after ``drain_s`` (the time the real ones take
  to drain, not the drain itself) the Node is deleted (with its exporter pod, as the
  pod garbage collector would) and the finalizer removed; after ``replace_delay_s`` a replacement object is created
  (the MachineSet's replica count restored; for Karpenter as if pods were left pending) and a new Node registers
  under a new name (NodeSim, gpu-sim and an exporter pod for it), optionally with a startup taint; or, with
  ``same_name``, under the old node's name (a new Node object, so a new uid, on another machine: gpu-sim's host
  under that name starts afresh with other GPU UUIDs), as a bare-metal provider re-provisioning the same host, or
  a cloud naming nodes by a reused address, does. Either way the new owner object has a new name.

What it does not do: drain the node before deleting it (the real machine controller drains honouring PDBs, and
Karpenter taints ``karpenter.sh/disrupted`` and drains), wait for volumes to detach, MachineHealthChecks,
MachineDeployments, scaling a MachineSet, NodePools or a Karpenter that replaces only when pods are pending (here it
always does), conversions between versions, ``required`` and enum validation
(the emulator prunes unknown fields and checks types only), and a Machine deleted without an owner (never
replaced: the controller refuses those itself).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CRDS, NODES, Resource
from sim.ticker import Ticker

log = logging.getLogger(__name__)

CLUSTER_API = "cluster-api"
KARPENTER = "karpenter"
PROVIDERS = (CLUSTER_API, KARPENTER)

CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSION = "v1beta1"
MACHINES = Resource(CAPI_GROUP, CAPI_VERSION, "machines", "Machine", True)
MACHINESETS = Resource(CAPI_GROUP, CAPI_VERSION, "machinesets", "MachineSet", True)
KARPENTER_GROUP = "karpenter.sh"
NODECLAIMS = Resource(KARPENTER_GROUP, "v1", "nodeclaims", "NodeClaim", False)

CAPI_NAMESPACE = "default"
CLUSTER_NAME = "gpu-sim"
MACHINESET = "gpu-workers"
NODEPOOL = "gpu"
MACHINE_FINALIZER = "machine.cluster.x-k8s.io"
NODECLAIM_FINALIZER = "karpenter.sh/termination"

_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_LIST = {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_OBJECT_REF = {"type": "object", "x-kubernetes-map-type": "atomic", "properties": {
    k: _STR for k in ("apiVersion", "kind", "name", "namespace", "uid", "resourceVersion", "fieldPath")}}
_TAINT = {"type": "object", "required": ["effect", "key"],
          "properties": {"key": _STR, "value": _STR, "effect": {"type": "string", "enum": [
              "NoSchedule", "PreferNoSchedule", "NoExecute"]}, "timeAdded": _STR}}

MACHINE_SPEC: dict[str, Any] = {
    "type": "object", "required": ["bootstrap", "clusterName", "infrastructureRef"],
    "properties": {
        "clusterName": {"type": "string", "minLength": 1, "maxLength": 63},
        "bootstrap": {"type": "object", "properties": {"configRef": _OBJECT_REF, "dataSecretName": _STR}},
        "infrastructureRef": _OBJECT_REF, "version": _STR, "failureDomain": _STR,
        "providerID": {"type": "string", "minLength": 1, "maxLength": 512},
        "nodeDrainTimeout": _STR, "nodeVolumeDetachTimeout": _STR, "nodeDeletionTimeout": _STR}}


def _schema(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"apiVersion": _STR, "kind": _STR, "metadata": {"type": "object"},
                                             "spec": spec, "status": {"type": "object", "properties": status}}}


def _crd(group: str, version: str, kind: str, plural: str, scope: str, schema: dict[str, Any],
         columns: list[tuple[str, str]], categories: tuple[str, ...]) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": scope,
                     "names": {"kind": kind, "listKind": kind + "List", "plural": plural,
                               "singular": kind.lower(), "categories": list(categories)},
                     "versions": [{"name": version, "served": True, "storage": True,
                                   "subresources": {"status": {}},
                                   "additionalPrinterColumns": [{"name": n, "type": "string", "jsonPath": p}
                                                                for n, p in columns],
                                   "schema": {"openAPIV3Schema": schema}}]}}


def machine_crd() -> dict[str, Any]:
    status = {"nodeRef": _OBJECT_REF, "phase": _STR, "bootstrapReady": _BOOL, "infrastructureReady": _BOOL,
              "addresses": _LIST, "conditions": _LIST, "observedGeneration": _INT, "lastUpdated": _STR}
    return _crd(CAPI_GROUP, CAPI_VERSION, "Machine", "machines", "Namespaced", _schema(MACHINE_SPEC, status),
                [("Cluster", ".spec.clusterName"), ("NodeName", ".status.nodeRef.name"),
                 ("ProviderID", ".spec.providerID"), ("Phase", ".status.phase")], ("cluster-api",))


def machineset_crd() -> dict[str, Any]:
    selector = {"type": "object", "x-kubernetes-map-type": "atomic",
                "properties": {"matchLabels": _STR_MAP, "matchExpressions": _LIST}}
    template = {"type": "object", "properties": {
        "metadata": {"type": "object", "properties": {"labels": _STR_MAP, "annotations": _STR_MAP}},
        "spec": MACHINE_SPEC}}
    spec = {"type": "object", "required": ["clusterName", "selector"], "properties": {
        "clusterName": {"type": "string", "minLength": 1, "maxLength": 63}, "replicas": _INT,
        "minReadySeconds": _INT, "deletePolicy": {"type": "string", "enum": ["Random", "Newest", "Oldest"]},
        "selector": selector, "template": template}}
    status = {k: _INT for k in ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas",
                                "observedGeneration")} | {"selector": _STR, "conditions": _LIST}
    return _crd(CAPI_GROUP, CAPI_VERSION, "MachineSet", "machinesets", "Namespaced", _schema(spec, status),
                [("Cluster", ".spec.clusterName")], ("cluster-api",))


def nodeclaim_crd() -> dict[str, Any]:
    requirement = {"type": "object", "required": ["key", "operator"], "properties": {
        "key": _STR, "operator": {"type": "string", "enum": [
            "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"]},
        "values": {"type": "array", "items": _STR}, "minValues": _INT}}
    spec = {"type": "object", "required": ["nodeClassRef", "requirements"], "properties": {
        "nodeClassRef": {"type": "object", "required": ["group", "kind", "name"],
                         "properties": {"group": _STR, "kind": _STR, "name": _STR}},
        "requirements": {"type": "array", "items": requirement},
        "taints": {"type": "array", "items": _TAINT}, "startupTaints": {"type": "array", "items": _TAINT},
        "resources": {"type": "object", "properties": {"requests": _STR_MAP}},
        "expireAfter": _STR, "terminationGracePeriod": _STR}}
    status = {"nodeName": _STR, "providerID": _STR, "imageID": _STR, "capacity": _STR_MAP,
              "allocatable": _STR_MAP, "conditions": _LIST, "lastPodEventTime": _STR}
    return _crd(KARPENTER_GROUP, "v1", "NodeClaim", "nodeclaims", "Cluster", _schema(spec, status),
                [("Node", ".status.nodeName"), ("ID", ".status.providerID")], ("karpenter",))


def crds(provider: str) -> list[dict[str, Any]]:
    return [machineset_crd(), machine_crd()] if provider == CLUSTER_API else [nodeclaim_crd()]


def install(client: KubeClient, provider: str, timeout: float = 10.0) -> None:
    """The provider's CRDs created (kept if there) and served."""
    for crd in crds(provider):
        with contextlib.suppress(errors.AlreadyExists):
            client.create(CRDS, crd)
    resources = (MACHINESETS, MACHINES) if provider == CLUSTER_API else (NODECLAIMS,)
    deadline = time.monotonic() + timeout
    for res in resources:
        while True:
            try:
                client.list(res, CAPI_NAMESPACE if res.namespaced else None, limit=1)
                break
            except errors.NotFound:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def _suffix() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))


@dataclass
class Owned:
    """One node's owner object as this controller made it."""

    name: str  # the Machine's or NodeClaim's
    uid: str
    node: str


# join(name, taints) registers a new GPU node (NodeSim, gpu-sim, its exporter pod); leave(name) takes one away.
Join = Callable[[str, list[dict[str, Any]]], None]
Leave = Callable[[str], None]


class OwnerSim(Ticker):
    thread_name = "node-owners"

    def __init__(self, client: KubeClient, provider: str, join: Join, leave: Leave, *, replace_delay_s: float = 0.5,
                 startup_taint: dict[str, Any] | None = None, drain_s: float = 0.0, same_name: bool = False,
                 tick_s: float = 0.1) -> None:
        if provider not in PROVIDERS:
            raise ValueError(f"node owner provider: expected one of {', '.join(PROVIDERS)}, got {provider!r}")
        super().__init__(tick_s)
        self.client = client
        self.provider = provider
        self.join = join
        self.leave = leave
        self.replace_delay_s = replace_delay_s
        self.startup_taint = startup_taint
        self.drain_s = drain_s
        self.same_name = same_name  # the replacement registers under the old node's name (a new uid)
        self._deleting_since: dict[str, float] = {}  # owner object name -> when first seen deleted
        self.owned: dict[str, Owned] = {}  # by the owner object's name
        self.replaced: list[tuple[str, str]] = []  # (old node, new node), in order
        self._due: list[float] = []  # when each pending replacement is created
        self._joined = 0
        self._machineset_uid = ""

    @property
    def resource(self) -> Resource:
        return MACHINES if self.provider == CLUSTER_API else NODECLAIMS

    @property
    def namespace(self) -> str | None:
        return CAPI_NAMESPACE if self.provider == CLUSTER_API else None

    def adopt(self, nodes: list[str]) -> OwnerSim:
        """Install the CRDs and give each of ``nodes`` (registered already) its owner object."""
        install(self.client, self.provider)
        if self.provider == CLUSTER_API:
            self._machineset_uid = self._machineset(len(nodes))
        for node in nodes:
            self._own(node)
        return self

    def owner_of(self, node: str) -> Owned | None:
        return next((o for o in self.owned.values() if o.node == node), None)

    def tick(self) -> None:
        now = time.monotonic()
        for owned in list(self.owned.values()):
            obj = self._get(owned.name)
            if obj is None or obj["metadata"].get("uid") != owned.uid or obj["metadata"].get("deletionTimestamp"):
                since = self._deleting_since.setdefault(owned.name, now)
                if now - since >= self.drain_s:
                    self._terminate(owned, obj)
        while self._due and self._due[0] <= now:
            self._due.pop(0)
            self._replacement()

    # -- the owner objects ---------------------------------------------------------------------------
    def _machineset(self, replicas: int) -> str:
        labels = {"cluster.x-k8s.io/cluster-name": CLUSTER_NAME, "cluster.x-k8s.io/set-name": MACHINESET}
        body = {"apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}", "kind": "MachineSet",
                "metadata": {"name": MACHINESET, "namespace": CAPI_NAMESPACE, "labels": labels},
                "spec": {"clusterName": CLUSTER_NAME, "replicas": replicas, "deletePolicy": "Random",
                         "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels}, "spec": self._machine_spec("")}}}
        try:
            made = self.client.create(MACHINESETS, body, CAPI_NAMESPACE)
        except errors.AlreadyExists:
            made = self.client.get(MACHINESETS, MACHINESET, CAPI_NAMESPACE)
        return str(made["metadata"]["uid"])

    @staticmethod
    def _machine_spec(node: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "clusterName": CLUSTER_NAME, "bootstrap": {"dataSecretName": f"{MACHINESET}-bootstrap"},
            "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "SimMachine",
                                  "name": node or MACHINESET, "namespace": CAPI_NAMESPACE},
            "version": "v1.36.0"}
        if node:
            spec["providerID"] = f"sim://{node}"
        return spec

    def _own(self, node: str) -> Owned:
        owned = self._machine(node) if self.provider == CLUSTER_API else self._nodeclaim(node)
        self.owned[owned.name] = owned
        return owned

    def _machine(self, node: str) -> Owned:
        name = f"{MACHINESET}-{_suffix()}"
        body = {"apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}", "kind": "Machine",
                "metadata": {"name": name, "namespace": CAPI_NAMESPACE, "finalizers": [MACHINE_FINALIZER],
                             "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER_NAME,
                                        "cluster.x-k8s.io/set-name": MACHINESET},
                             "ownerReferences": [{"apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}", "kind": "MachineSet",
                                                  "name": MACHINESET, "uid": self._machineset_uid,
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": self._machine_spec(node)}
        made = self.client.create(MACHINES, body, CAPI_NAMESPACE)
        node_obj = self.client.get(NODES, node)
        self.client.patch(MACHINES, name, {"status": {
            "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_obj["metadata"]["uid"]},
            "phase": "Running", "bootstrapReady": True, "infrastructureReady": True}}, CAPI_NAMESPACE,
            subresource="status")
        self.client.patch(NODES, node, {"spec": {"providerID": f"sim://{node}"}, "metadata": {"annotations": {
            "cluster.x-k8s.io/machine": name, "cluster.x-k8s.io/cluster-name": CLUSTER_NAME,
            "cluster.x-k8s.io/cluster-namespace": CAPI_NAMESPACE, "cluster.x-k8s.io/owner-kind": "MachineSet",
            "cluster.x-k8s.io/owner-name": MACHINESET}}})
        return Owned(name, str(made["metadata"]["uid"]), node)

    def _nodeclaim(self, node: str) -> Owned:
        name = f"{NODEPOOL}-{_suffix()}"
        body = {"apiVersion": f"{KARPENTER_GROUP}/v1", "kind": "NodeClaim",
                "metadata": {"name": name, "finalizers": [NODECLAIM_FINALIZER],
                             "labels": {"karpenter.sh/nodepool": NODEPOOL}},
                "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": NODEPOOL},
                         "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                           "values": ["p5.48xlarge"]}]}}
        made = self.client.create(NODECLAIMS, body)
        uid = str(made["metadata"]["uid"])
        self.client.patch(NODECLAIMS, name, {"status": {"nodeName": node, "providerID": f"sim://{node}"}},
                          subresource="status")
        self.client.patch(NODES, node, {"spec": {"providerID": f"sim://{node}"}, "metadata": {
            "labels": {"karpenter.sh/nodepool": NODEPOOL, "karpenter.sh/registered": "true"},
            "ownerReferences": [{"apiVersion": f"{KARPENTER_GROUP}/v1", "kind": "NodeClaim", "name": name,
                                 "uid": uid, "blockOwnerDeletion": True}]}})
        return Owned(name, uid, node)

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.client.get(self.resource, name, self.namespace)
        except errors.NotFound:
            return None

    # -- a deleted owner object: its node goes, a replacement comes -------------------------------------
    def _terminate(self, owned: Owned, obj: dict[str, Any] | None) -> None:
        log.info("node owner deleted", extra={"node": owned.node, "owner": owned.name})
        with contextlib.suppress(errors.NotFound):
            self.client.delete(NODES, owned.node)
        # Then its pods, as the pod garbage collector deletes those of a Node that no longer exists: gone first,
        # they let a drain held on one of them finish before the Node's delete was seen (a flaky e2e scenario).
        self.leave(owned.node)
        if obj is not None and obj["metadata"].get("uid") == owned.uid:
            finalizers = [f for f in obj["metadata"].get("finalizers") or []
                          if f not in (MACHINE_FINALIZER, NODECLAIM_FINALIZER)]
            with contextlib.suppress(errors.NotFound):
                self.client.patch(self.resource, owned.name, {"metadata": {
                    "finalizers": finalizers, "resourceVersion": obj["metadata"]["resourceVersion"]}},
                    self.namespace)
        del self.owned[owned.name]
        self._deleting_since.pop(owned.name, None)
        self.replaced.append((owned.node, ""))
        self._due.append(time.monotonic() + self.replace_delay_s)

    def _replacement(self) -> None:
        index = next(i for i, (_old, new) in enumerate(self.replaced) if not new)
        old = self.replaced[index][0]
        if self.same_name:
            node = old
        else:
            self._joined += 1
            node = f"gpu-node-new-{self._joined}"
        self.join(node, [dict(self.startup_taint)] if self.startup_taint else [])
        self._own(node)
        self.replaced[index] = (old, node)
