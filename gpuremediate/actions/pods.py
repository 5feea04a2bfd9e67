"""Which pods a drain touches: small composable pure filters (draino's shape), plus the node's pod list.

A pod is never evicted because of what it is not: mirror pods (the kubelet owns them), DaemonSet
pods (they would come straight back and tolerate the cordon), finished pods, and gpuremediate's own
repair and validation pods are skipped whatever the scope. Pods in the policy's
``drain.skip_namespaces`` (system namespaces) are neither evicted nor waited for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuremediate.gpu_resources import DEFAULT_NAMES, requests_gpu
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import PODS

Pod = Mapping[str, Any]
PodFilter = Callable[[Pod], bool]

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
OWN_JOB_LABEL = "gpuremediate.io/job"

SCOPE_ALL = "all"
SCOPE_GPU = "gpu"
SCOPE_IMPACTED = "impacted"
SCOPES = (SCOPE_ALL, SCOPE_GPU, SCOPE_IMPACTED)


def pod_key(pod: Pod) -> tuple[str, str]:
    meta = pod.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


def is_mirror(pod: Pod) -> bool:
    return MIRROR_ANNOTATION in (pod.get("metadata", {}).get("annotations") or {})


def is_daemonset_owned(pod: Pod) -> bool:
    owners = pod.get("metadata", {}).get("ownerReferences") or []
    return any(o.get("kind") == "DaemonSet" and o.get("controller", False) for o in owners)


def is_finished(pod: Pod) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def is_own_job_pod(pod: Pod) -> bool:
    return OWN_JOB_LABEL in (pod.get("metadata", {}).get("labels") or {})


def is_terminating(pod: Pod) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def in_set(keys: Iterable[tuple[str, str]]) -> PodFilter:
    wanted = set(keys)
    return lambda pod: pod_key(pod) in wanted


def never_drained(pod: Pod) -> bool:
    return is_mirror(pod) or is_daemonset_owned(pod) or is_finished(pod) or is_own_job_pod(pod)


def scope_filter(scope: str, impacted: Iterable[tuple[str, str]] = (),
                 gpu_resources: Iterable[str] = DEFAULT_NAMES) -> PodFilter:
    """``gpu``: pods asking for any of ``gpu_resources`` (whole GPUs and MIG slices alike)."""
    if scope == SCOPE_ALL:
        return lambda pod: True
    if scope == SCOPE_GPU:
        names = tuple(gpu_resources)
        return lambda pod: requests_gpu(pod, names)
    if scope == SCOPE_IMPACTED:
        return in_set(impacted)
    raise ValueError(f"drain scope: expected one of {', '.join(SCOPES)}, got {scope!r}")


def in_namespaces(namespaces: Iterable[str]) -> PodFilter:
    skipped = frozenset(namespaces)
    return lambda pod: pod_key(pod)[0] in skipped


def pods_to_drain(pods: Iterable[Pod], scope: str, impacted: Iterable[tuple[str, str]] = (),
                  skip_namespaces: Iterable[str] = (), gpu_resources: Iterable[str] = DEFAULT_NAMES) -> list[Pod]:
    """The pods a drain of this scope must see gone, in a stable order."""
    wanted, skipped = scope_filter(scope, impacted, gpu_resources), in_namespaces(skip_namespaces)
    chosen = [p for p in pods if not never_drained(p) and not skipped(p) and wanted(p)]
    return sorted(chosen, key=pod_key)


def skipped_by_namespace(pods: Iterable[Pod], skip_namespaces: Iterable[str]) -> dict[str, int]:
    """How many pods a drain leaves alone because of their namespace, per namespace (finished ones aside)."""
    skipped = in_namespaces(skip_namespaces)
    counts: dict[str, int] = {}
    for pod in pods:
        if skipped(pod) and not is_finished(pod):
            counts[pod_key(pod)[0]] = counts.get(pod_key(pod)[0], 0) + 1
    return counts


def list_node_pods(client: KubeClient, node: str) -> list[dict[str, Any]]:
    """All pods bound to one node: a field-selected list, never a cluster-wide pod watch."""
    result = client.list(PODS, None, field_selector=f"spec.nodeName={node}")
    items: list[dict[str, Any]] = result.get("items", [])
    return items


MAX_NODE_WATCHES = 64  # nodes whose pods are watched at once; a drain beyond them lists its pods each step
SYNC_WAIT_S = 10.0  # how long a first read waits for a node's watch to list its pods before it lists them itself


class NodePods:
    """The pods of the nodes being drained, each node from a watch of its own (``fieldSelector=spec.nodeName=<node>``,
    every namespace), started by the drain's first look at its pods and stopped when it is over (``stop_node``, or
    ``keep_only`` at each resync). A drain step reads its node's pods from that cache, not a LIST per retry (187
    LISTs in 40 s while 5 nodes drained at 1,000 nodes: every Node update and requeue listed again), and each
    change of one of its pods calls ``on_change(node)`` so the drain sees a pod gone at once. ``confirm`` is the
    LIST a drain makes before it calls itself done: a cache may lag, the API server does not. Watches are
    bounded (``max_watches``); beyond them, and while a watch has not listed yet, a read is a LIST as before."""

    def __init__(self, client: KubeClient, on_change: Callable[[str], None] | None = None,
                 max_watches: int = MAX_NODE_WATCHES, sync_wait_s: float = SYNC_WAIT_S) -> None:
        self.client = client
        self.on_change = on_change
        self.max_watches = max_watches
        self.sync_wait_s = sync_wait_s
        self._informers: dict[str, Informer] = {}
        self._lock = threading.Lock()

    def pods(self, node: str) -> list[dict[str, Any]]:
        """The node's pods as its watch shows them (started on the first call); a LIST while it cannot."""
        informer = self._informer(node)
        if informer is None or not informer.wait_for_sync(self.sync_wait_s):
            return list_node_pods(self.client, node)
        return informer.list()

    def confirm(self, node: str) -> list[dict[str, Any]]:
        """The node's pods as the API server has them now (one LIST)."""
        return list_node_pods(self.client, node)

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._informers)

    def stop_node(self, node: str) -> None:
        with self._lock:
            informer = self._informers.pop(node, None)
        if informer is not None:
            informer.stop(timeout=0)

    def keep_only(self, nodes: Iterable[str]) -> None:
        """Stop the watches of nodes no longer draining."""
        keep = set(nodes)
        for node in self.watched() - keep:
            self.stop_node(node)

    def stop(self) -> None:
        self.keep_only(())

    def _informer(self, node: str) -> Informer | None:
        if not callable(getattr(self.client, "watch", None)):
            return None  # a client that cannot watch (replay's cluster): a LIST each read, as before
        with self._lock:
            informer = self._informers.get(node)
            if informer is not None or len(self._informers) >= self.max_watches:
                return informer
            informer = Informer(self.client, PODS, None, field_selector=f"spec.nodeName={node}")
            self._informers[node] = informer
        if self.on_change is not None:
            changed = self.on_change
            informer.add_handler(on_add=lambda _pod: changed(node), on_update=lambda _old, _new: changed(node),
                                 on_delete=lambda _pod: changed(node))
        return informer.start()
