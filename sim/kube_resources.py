"""The resource types the emulator serves: built-ins and those a CRD defines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass
class ResourceType:
    group: str
    version: str
    resource: str  # plural
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    generation: bool = False  # metadata.generation moves on spec changes
    create_status: str = "keep"  # keep | clear | drop | pod | namespace
    returns_object_on_delete: bool = False
    top_fields: frozenset[str] | None = None  # known top-level fields (None: no unknown-field check)
    storage: str = ""  # shared storage key (events are stored once, served by two groups)
    custom: bool = False
    schema: dict[str, Any] | None = None
    default_propagation: str = "Background"
    crd_categories: tuple[str, ...] = field(default_factory=tuple)
    printer_columns: tuple[dict[str, Any], ...] = ()  # a CRD version's additionalPrinterColumns (sim.kube_tables)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return self.storage or f"{self.group}/{self.resource}"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def discovery(self) -> list[dict[str, Any]]:
        entry: dict[str, Any] = {"name": self.resource, "singularName": self.singular or self.kind.lower(),
                                 "namespaced": self.namespaced, "kind": self.kind, "verbs": ALL_VERBS}
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        out = [entry]
        for sub in self.subresources:
            verbs = ["create"] if sub == "eviction" else ["get", "patch", "update"]
            kind = "Eviction" if sub == "eviction" else self.kind
            sub_entry: dict[str, Any] = {"name": f"{self.resource}/{sub}", "singularName": "",
                                         "namespaced": self.namespaced, "kind": kind, "verbs": verbs}
            if sub == "eviction":
                sub_entry.update(group="policy", version="v1")
            out.append(sub_entry)
        return out


def _fields(*names: str) -> frozenset[str]:
    return frozenset(("apiVersion", "kind", "metadata", *names))


def builtin_types() -> list[ResourceType]:
    spec_status = _fields("spec", "status")
    return [
        ResourceType("", "v1", "namespaces", "Namespace", False, short_names=("ns",), subresources=("status",),
                     create_status="namespace", returns_object_on_delete=True, top_fields=spec_status),
        ResourceType("", "v1", "nodes", "Node", False, short_names=("no",), subresources=("status",),
                     top_fields=spec_status),
        ResourceType("", "v1", "pods", "Pod", True, short_names=("po",), subresources=("status", "eviction"),
                     create_status="pod", returns_object_on_delete=True, top_fields=spec_status),
        ResourceType("", "v1", "configmaps", "ConfigMap", True, short_names=("cm",),
                     top_fields=_fields("data", "binaryData", "immutable")),
        ResourceType("", "v1", "secrets", "Secret", True,
                     top_fields=_fields("data", "stringData", "type", "immutable")),
        ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, short_names=("sa",),
                     returns_object_on_delete=True,
                     top_fields=_fields("secrets", "imagePullSecrets", "automountServiceAccountToken")),
        ResourceType("", "v1", "events", "Event", True, short_names=("ev",), storage="events",
                     top_fields=_fields("involvedObject", "reason", "message", "source", "firstTimestamp",
                                        "lastTimestamp", "count", "type", "eventTime", "series", "action",
                                        "related", "reportingComponent", "reportingInstance")),
        ResourceType("events.k8s.io", "v1", "events", "Event", True, short_names=("ev",), storage="events",
                     top_fields=_fields("eventTime", "series", "reportingController", "reportingInstance",
                                        "action", "reason", "regarding", "related", "note", "type",
                                        "deprecatedSource", "deprecatedFirstTimestamp",
                                        "deprecatedLastTimestamp", "deprecatedCount")),
        ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, top_fields=_fields("spec")),
        ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, short_names=("pdb",),
                     subresources=("status",), generation=True, create_status="clear", top_fields=spec_status),
        ResourceType("batch", "v1", "jobs", "Job", True, subresources=("status",), generation=True,
                     create_status="clear", top_fields=spec_status, default_propagation="Orphan"),
        ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, short_names=("ds",),
                     subresources=("status",), generation=True, create_status="clear", top_fields=spec_status),
        ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False,
                     top_fields=_fields("rules", "aggregationRule")),
        # Stored only (RBAC is what enforce_rbac says; no controller runs Deployments or Services): so that
        # the manifests apply (kubectl apply --server-side -k).
        ResourceType("apps", "v1", "deployments", "Deployment", True, short_names=("deploy",),
                     subresources=("status",), generation=True, create_status="clear", top_fields=spec_status),
        ResourceType("", "v1", "services", "Service", True, short_names=("svc",), subresources=("status",),
                     top_fields=spec_status),
        ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True, top_fields=_fields("rules")),
        ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True,
                     top_fields=_fields("subjects", "roleRef")),
        ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False,
                     top_fields=_fields("subjects", "roleRef")),
        # Called on create (sim.kube_webhooks); stored as given (no defaulting of sideEffects, matchPolicy...).
        ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                     "MutatingWebhookConfiguration", False, generation=True, top_fields=_fields("webhooks")),
        ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                     False, short_names=("crd", "crds"), subresources=("status",), generation=True,
                     create_status="clear", top_fields=spec_status),
    ]


DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2")  # what a v1.36 server with --runtime-config=resource.k8s.io/v1beta2=true serves


def dra_types(versions: tuple[str, ...] = DRA_VERSIONS, taint_rule_versions: tuple[str, ...] = ("v1beta2",)
              ) -> list[ResourceType]:
    """resource.k8s.io as v1.36 serves it (sim.kube_dra validates and defaults it): ResourceSlice, ResourceClaim
    (status subresource), ResourceClaimTemplate (stored only), DeviceClass in each of ``versions`` (one storage:
    v1beta2 has v1's shape), and
    DeviceTaintRule (status subresource) in ``taint_rule_versions`` only: () is a cluster without the
    DRADeviceTaintRules gate (or a 1.35 one), ("v1beta2",) a 1.36 one with it, ("v1", ...) 1.37 (GA)."""
    spec = _fields("spec")
    out: list[ResourceType] = []
    for version in versions:
        out.append(ResourceType(DRA_GROUP, version, "deviceclasses", "DeviceClass", False, generation=True,
                                top_fields=spec))
        if version in taint_rule_versions:
            out.append(_device_taint_rules(version))
        out += [ResourceType(DRA_GROUP, version, "resourceclaims", "ResourceClaim", True, subresources=("status",),
                             create_status="clear", top_fields=_fields("spec", "status")),
                # stored only: no resourceclaim controller makes claims from templates here
                ResourceType(DRA_GROUP, version, "resourceclaimtemplates", "ResourceClaimTemplate", True,
                             top_fields=spec),
                ResourceType(DRA_GROUP, version, "resourceslices", "ResourceSlice", False, generation=True,
                             top_fields=spec)]
    out += [_device_taint_rules(v) for v in taint_rule_versions if v not in versions]
    return out


def _device_taint_rules(version: str) -> ResourceType:
    return ResourceType(DRA_GROUP, version, "devicetaintrules", "DeviceTaintRule", False, subresources=("status",),
                        generation=True, create_status="clear", top_fields=_fields("spec", "status"))


def from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CustomResourceDefinition."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        subresources = ("status",) if "status" in (version.get("subresources") or {}) else ()
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        out.append(ResourceType(
            spec["group"], version["name"], names["plural"], names["kind"], spec.get("scope") == "Namespaced",
            singular=names.get("singular", names["kind"].lower()), short_names=tuple(names.get("shortNames", ())),
            subresources=subresources, generation=True, create_status="drop" if subresources else "keep",
            custom=True, schema=schema, crd_categories=tuple(names.get("categories", ())),
            printer_columns=tuple(version.get("additionalPrinterColumns") or ())))
    return out


def prune(value: Any, schema: dict[str, Any] | None, path: str, dropped: list[str]) -> Any:
    """Structural pruning: drop fields the schema does not declare; record their paths."""
    if schema is None or not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    if props is None and extra is None:
        return value
    out: dict[str, Any] = {}
    for key, sub in value.items():
        sub_path = f"{path}.{key}" if path else key
        if props is not None and key in props:
            out[key] = prune(sub, props[key], sub_path, dropped)
        elif isinstance(extra, dict):
            out[key] = prune(sub, extra, sub_path, dropped)
        elif extra is True:
            out[key] = sub
        else:
            dropped.append(sub_path)
    return out


_JSON_TYPES = {"integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,),
               "object": (dict,), "array": (list,)}


def type_errors(value: Any, schema: dict[str, Any] | None, path: str) -> list[tuple[str, str, str]]:
    """(field, actual type name, expected type) for every schema type mismatch."""
    if schema is None or value is None:
        return []
    expected = schema.get("type")
    if expected in _JSON_TYPES:
        ok = isinstance(value, _JSON_TYPES[expected]) and not (expected != "boolean" and isinstance(value, bool))
        if not ok:
            return [(path, type_name(value), expected)]
    errors: list[tuple[str, str, str]] = []
    if isinstance(value, dict):
        for key, sub_schema in (schema.get("properties") or {}).items():
            if key in value:
                errors += type_errors(value[key], sub_schema, f"{path}.{key}" if path else key)
    return errors


def type_name(value: Any) -> str:
    for name, kinds in (("boolean", (bool,)), ("integer", (int,)), ("number", (float,)), ("string", (str,)),
                        ("object", (dict,)), ("array", (list,))):
        if isinstance(value, kinds):
            return name
    return "null"
