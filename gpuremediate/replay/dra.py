"""DRA in the replay's simulated cluster, for ``[isolation] scope = "gpu"``: each node publishes its GPUs in one
ResourceSlice as NVIDIA's DRA driver does (pool = node, ``uuid`` attribute), its workload pod holds them through
one ResourceClaim, and DeviceTaintRules are stored at ``resource.k8s.io/v1`` (the GA version, whose scheduler
honours ``NoSchedule``). A ``NoExecute`` rule on a device the workload holds evicts it, as kube-controller-manager's
device taint eviction controller would; the pod is then gone after the cluster's drain time, like an eviction.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuremediate.actions.device_taints import EFFECT_NO_EXECUTE, NVIDIA_DRIVER
from gpuremediate.kube import errors
from gpuremediate.kube.resources import (
    DEVICE_TAINT_RULE_API_VERSIONS,
    DEVICE_TAINT_RULE_KIND,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Resource,
)

DEVICE_TAINT_RULES = Resource("resource.k8s.io", "v1", "devicetaintrules", DEVICE_TAINT_RULE_KIND, False)
WORKLOAD_NAMESPACE = "workloads"
CLAIM_REF = "gpus"  # the pod's name for its claim (spec.resourceClaims[].name)

Evict = Callable[[str], None]  # node -> its workload pod is evicted now


def device_name(index: int) -> str:
    return f"gpu-{index}"


def claim_name(node: str) -> str:
    return f"workload-{node}-gpus"


class ReplayDra:
    """The DRA objects of the replay: slices and claims derived from each node's GPUs, rules as written."""

    def __init__(self, gpus: Mapping[str, Sequence[str]], evict: Evict) -> None:
        self.gpus = {node: list(uuids) for node, uuids in gpus.items()}  # node -> GPU UUIDs, by index
        self.evict = evict
        self.rules: dict[str, dict[str, Any]] = {}
        self.claims: dict[str, dict[str, Any]] = {}  # the validation Jobs' claims (the replay's Jobs just finish)
        self.created = 0  # rules ever created (the replay's figures)
        self._uid = 0

    def serves(self, res: Resource) -> bool:
        return res in (RESOURCE_SLICES, RESOURCE_CLAIMS, DEVICE_TAINT_RULES)

    @staticmethod
    def resolve(api_version: str, kind: str) -> Resource:
        if kind == DEVICE_TAINT_RULE_KIND and api_version == DEVICE_TAINT_RULE_API_VERSIONS[0]:
            return DEVICE_TAINT_RULES
        raise errors.NotFound(404, {"reason": "NotFound", "message": f"the server has no kind {kind!r} in "
                                    f"{api_version}", "details": {"kind": kind}})

    # ---- derived objects ------------------------------------------------------------------------------

    def slice_of(self, node: str) -> dict[str, Any]:
        devices = [{"name": device_name(i), "attributes": {"uuid": {"string": uuid}}}
                   for i, uuid in enumerate(self.gpus.get(node, []))]
        return {"apiVersion": RESOURCE_SLICES.api_version, "kind": RESOURCE_SLICES.kind,
                "metadata": {"name": f"{node}-{NVIDIA_DRIVER}"},
                "spec": {"driver": NVIDIA_DRIVER, "nodeName": node, "devices": devices,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}

    def claim_of(self, node: str, pod_uid: str) -> dict[str, Any]:
        results = [{"request": "gpus", "driver": NVIDIA_DRIVER, "pool": node, "device": device_name(i)}
                   for i in range(len(self.gpus.get(node, [])))]
        return {"apiVersion": RESOURCE_CLAIMS.api_version, "kind": RESOURCE_CLAIMS.kind,
                "metadata": {"name": claim_name(node), "namespace": WORKLOAD_NAMESPACE},
                "status": {"allocation": {"devices": {"results": results}},
                           "reservedFor": [{"resource": "pods", "name": f"workload-{node}", "uid": pod_uid}]}}

    @staticmethod
    def pod_claims(node: str) -> dict[str, Any]:
        """What the workload pod's spec gains: its claim, by name."""
        return {"resourceClaims": [{"name": CLAIM_REF, "resourceClaimName": claim_name(node)}]}

    # ---- the KubeClient calls ---------------------------------------------------------------------------

    def get(self, res: Resource, name: str, pod_uid: Callable[[str], str | None]) -> dict[str, Any]:
        if res == DEVICE_TAINT_RULES and name in self.rules:
            return copy.deepcopy(self.rules[name])
        if res == RESOURCE_CLAIMS and name in self.claims:
            return copy.deepcopy(self.claims[name])
        if res == RESOURCE_CLAIMS:
            node = name.removeprefix("workload-").removesuffix("-gpus")
            uid = pod_uid(node)
            if node in self.gpus and name == claim_name(node) and uid is not None:
                return self.claim_of(node, uid)
        raise _not_found(res, name)

    def list(self, res: Resource, *, label_selector: str | None, field_selector: str | None) -> list[dict[str, Any]]:
        if res == RESOURCE_SLICES:
            node = (field_selector or "").removeprefix("spec.nodeName=")
            return [self.slice_of(node)] if node in self.gpus else []
        if res == DEVICE_TAINT_RULES:
            wanted = _equalities(label_selector)
            return [copy.deepcopy(r) for r in self.rules.values()
                    if all((r["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())]
        return []

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        name = str(body["metadata"]["name"])
        if res == RESOURCE_CLAIMS:
            if name in self.claims:
                raise errors.AlreadyExists(409, {"reason": "AlreadyExists", "message": f"resourceclaim {name} exists",
                                                 "details": {"name": name}})
            self.claims[name] = copy.deepcopy(dict(body))
            return copy.deepcopy(self.claims[name])
        if name in self.rules:
            raise errors.AlreadyExists(409, {"reason": "AlreadyExists", "message": f"devicetaintrule {name} exists",
                                             "details": {"name": name}})
        self._uid += 1
        rule = copy.deepcopy(dict(body))
        rule["metadata"].update(uid=f"rule-uid-{self._uid}", generation=1, resourceVersion=str(self._uid))
        self.rules[name] = rule
        self.created += 1
        self._apply(rule)
        return copy.deepcopy(rule)

    def replace(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        current = self.rules.get(name)
        if current is None:
            raise _not_found(DEVICE_TAINT_RULES, name)
        if body["metadata"].get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
            raise errors.Conflict(409, {"reason": "Conflict", "message": f"devicetaintrule {name} changed"})
        self._uid += 1
        rule = copy.deepcopy(dict(body))
        generation = current["metadata"]["generation"] + (rule.get("spec") != current.get("spec"))
        rule["metadata"].update(uid=current["metadata"]["uid"], generation=generation, resourceVersion=str(self._uid))
        self.rules[name] = rule
        self._apply(rule)
        return copy.deepcopy(rule)

    def delete(self, name: str, preconditions: Mapping[str, str] | None) -> dict[str, Any]:
        current = self.rules.get(name)
        if current is None:
            raise _not_found(DEVICE_TAINT_RULES, name)
        if preconditions and preconditions.get("uid") not in (None, current["metadata"]["uid"]):
            raise errors.Conflict(409, {"reason": "Conflict", "message": f"devicetaintrule {name}: uid differs"})
        del self.rules[name]
        return {}

    def _apply(self, rule: Mapping[str, Any]) -> None:
        """The eviction controller: a NoExecute rule on a node's device evicts the pod holding it."""
        spec = rule.get("spec") or {}
        if (spec.get("taint") or {}).get("effect") != EFFECT_NO_EXECUTE:
            return
        selector = spec.get("deviceSelector") or {}
        node = str(selector.get("pool", ""))
        if selector.get("driver") == NVIDIA_DRIVER and node in self.gpus:
            self.evict(node)


def _equalities(label_selector: str | None) -> dict[str, str]:
    """``k=v,k2=v2`` (what the controller's selectors are) as a dict."""
    pairs = [term.split("=", 1) for term in (label_selector or "").split(",") if "=" in term]
    return {k.strip(): v.strip() for k, v in pairs}


def _not_found(res: Resource, name: str) -> errors.NotFound:
    return errors.NotFound(404, {"reason": "NotFound", "message": f"{res.plural} {name!r} not found",
                                 "details": {"name": name, "kind": res.plural}})
