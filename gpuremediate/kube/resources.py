"""Resource types: where each kind lives in the REST API (group, version, plural, scope)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def base(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The URL path of the collection, or of one object and optionally its subresource."""
        if self.namespaced and name is not None and not namespace:
            raise ValueError(f"{self.kind} is namespaced: a namespace is required to address {name!r}")
        if not self.namespaced and namespace:
            raise ValueError(f"{self.kind} is cluster-scoped: namespace {namespace!r} must not be given")
        parts = [self.base]
        if namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            if not name:
                raise ValueError(f"{self.kind}: an empty name cannot be addressed")
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append(subresource)
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return "/".join(parts)


NODES = Resource("", "v1", "nodes", "Node", False)
PODS = Resource("", "v1", "pods", "Pod", True)
EVENTS = Resource("", "v1", "events", "Event", True)
EVENTS_V1 = Resource("events.k8s.io", "v1", "events", "Event", True)
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", True)
SECRETS = Resource("", "v1", "secrets", "Secret", True)
JOBS = Resource("batch", "v1", "jobs", "Job", True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount", True)
SERVICES = Resource("", "v1", "services", "Service", True)
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", True)
CLUSTERROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)
CLUSTERROLEBINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False
)

# Dynamic Resource Allocation (resource.k8s.io): v1 since Kubernetes 1.34. A cluster older than that, or one
# without DRA, answers 404 for these paths.
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False)
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)

# DeviceTaintRule (KEP-5055) has no static version: resource.k8s.io/v1alpha3 from 1.33 (alpha, gate
# DRADeviceTaints), v1beta2 in 1.36 (gate DRADeviceTaintRules and --runtime-config=resource.k8s.io/v1beta2=true),
# v1 (GA, always on) from 1.37. Discover it (KubeClient.resolve), preferring the most stable version served.
DEVICE_TAINT_RULE_KIND = "DeviceTaintRule"
DEVICE_TAINT_RULE_API_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1alpha3")

BUILTINS: tuple[Resource, ...] = (
    NODES, PODS, EVENTS, EVENTS_V1, PDBS, LEASES, CONFIGMAPS, SECRETS, JOBS, NAMESPACES, CRDS,
    SERVICEACCOUNTS, SERVICES, DAEMONSETS, DEPLOYMENTS, CLUSTERROLES, CLUSTERROLEBINDINGS,
    RESOURCE_SLICES, RESOURCE_CLAIMS, DEVICE_CLASSES,
)

_BUILTIN_INDEX: dict[tuple[str, str], Resource] = {(r.api_version, r.kind): r for r in BUILTINS}


def builtin(api_version: str, kind: str) -> Resource | None:
    """The statically known Resource for apiVersion/kind, or None for a kind that needs discovery."""
    return _BUILTIN_INDEX.get((api_version, kind))


def split_api_version(api_version: str) -> tuple[str, str]:
    """("group", "version") of an apiVersion; the core group is ""."""
    if not api_version or api_version.count("/") > 1:
        raise ValueError(f"malformed apiVersion {api_version!r}")
    group, _, version = api_version.rpartition("/")
    if not version:
        raise ValueError(f"malformed apiVersion {api_version!r}")
    return group, version


def discovery_path(api_version: str) -> str:
    group, version = split_api_version(api_version)
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


def from_api_resource_list(api_version: str, body: dict[str, object]) -> dict[str, Resource]:
    """kind -> Resource from an APIResourceList (subresources such as pods/status are skipped)."""
    group, version = split_api_version(api_version)
    found: dict[str, Resource] = {}
    entries = body.get("resources")
    if not isinstance(entries, list):
        return found
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        name, kind = entry.get("name"), entry.get("kind")
        if not isinstance(name, str) or not isinstance(kind, str) or "/" in name:
            continue
        found[kind] = Resource(group, version, name, kind, bool(entry.get("namespaced")))
    return found
