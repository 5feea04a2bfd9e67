"""Informer: list + watch one resource type in a thread, keep an in-memory store, call handlers.

A ``transform`` (client-go's SetTransform) is applied to every object before it is stored or handed to
a handler, so the store keeps only what the controller reads: ``strip_node`` drops what a kubelet
writes in bulk (managedFields, the image list, volumes). Pods are never cached cluster-wide: an
Informer on pods must name a namespace (the exporter pods') or one node (``fieldSelector=spec.nodeName=<node>``,
the pods of a node being drained).

``pack_unless(keep)`` keeps the objects whose key ``keep`` does not take packed (kube/packed.py): a sharded
replica's Nodes of the other shards. Reads and handlers still get whole objects.
"""

from __future__ import annotations

import builtins
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.packed import Packed, Packer
from gpuremediate.kube.resources import Resource
from gpuremediate.kube.watch import WatchEvent, WatchStream, resumable_watch, retry_delay

log = logging.getLogger(__name__)

AddHandler = Callable[[dict[str, Any]], None]
UpdateHandler = Callable[[dict[str, Any], dict[str, Any]], None]
DeleteHandler = Callable[[dict[str, Any]], None]
Transform = Callable[[dict[str, Any]], dict[str, Any]]

# What a Node carries that nothing here reads (checked with grep: labels, annotations, uid,
# resourceVersion, spec.unschedulable, status.conditions, capacity/allocatable and nodeInfo.bootID are).
NODE_STATUS_UNREAD = ("images", "volumesInUse", "volumesAttached", "daemonEndpoints", "addresses", "config",
                      "runtimeHandlers", "features")
ANNOTATIONS_UNREAD = ("kubectl.kubernetes.io/last-applied-configuration",)


def strip_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without managedFields and kubectl's last-applied copy (a new dict; ``obj`` is untouched)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    meta = {k: v for k, v in meta.items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and any(a in annotations for a in ANNOTATIONS_UNREAD):
        meta["annotations"] = {k: v for k, v in annotations.items() if k not in ANNOTATIONS_UNREAD}
    return {**obj, "metadata": meta}


def strip_node(node: dict[str, Any]) -> dict[str, Any]:
    """A Node with only what the controller reads (``strip_metadata`` plus the bulky status lists), its keys
    interned and its repeated values shared (``compact_node``)."""
    out = strip_metadata(node)
    status = out.get("status")
    if isinstance(status, dict) and any(k in status for k in NODE_STATUS_UNREAD):
        out["status"] = {k: v for k, v in status.items() if k not in NODE_STATUS_UNREAD}
    return compact_node(out)


# ---- values a fleet repeats, one copy for the cache ----------------------------------------------------------
#
# A JSON decoder makes a new string for every value it reads: 100,000 Nodes hold 100,000 copies of "true",
# "NVIDIA-H100-80GB-HBM3", "kubelet has sufficient memory available" and NFD's list of its labels. A realistic
# GPU Node's label and condition values were over half of its cached bytes (bench/scale_100k.py,
# bytes_per_cached_node). ``shared_value`` hands back one copy of each, from a table of its own rather than
# sys.intern (an interned string lives as long as the interpreter on 3.12, and a fleet's values churn).
# Per-node values (names, uids, times, IDs) never enter the table: within one Node they are shared through a
# table that lives as long as the strip (``_NodeCompactor.own``), so a Node's seven condition times cost its
# two or three distinct ones.

SHARED_VALUES_CAP = 1 << 16  # about 4 MB of table at most; a GPU fleet's vocabulary is a few hundred values
_shared_values: dict[str, str] = {}

# Keys whose string values are the Node's own, wherever they appear (metadata, spec, taints, conditions, nodeInfo).
PER_NODE_FIELDS = frozenset({
    "name", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "lastHeartbeatTime",
    "lastTransitionTime", "timeAdded", "bootID", "machineID", "systemUUID", "providerID", "podCIDR", "podCIDRs",
    "externalID",
})
PER_NODE_LABELS = frozenset({"kubernetes.io/hostname", "nvidia.com/gfd.timestamp"})
# Annotations are shared only under these prefixes (values a fleet repeats: NFD's list of its labels, the TTL,
# attach-detach): others (CNI addresses, CSI node ids, the GPU operator's upgrade times, our own records) are
# mostly one node's own and would only churn the table.
SHARED_ANNOTATION_PREFIXES = ("nfd.node.kubernetes.io/", "node.alpha.kubernetes.io/", "volumes.kubernetes.io/",
                              "cluster-autoscaler.kubernetes.io/")


def shared_value(value: str) -> str:
    """The table's copy of ``value`` (``value`` itself the first time). Thread-safe for the informers' threads
    without a lock: dict.get, setdefault and clear each run whole under the GIL (str hashing and comparison call
    no Python code), so two threads racing on one value both get the copy setdefault kept, and the size check can
    only be off by a thread or two. Full: the table starts over, its old copies staying with the Nodes that hold
    them (a flood of one-off values costs sharing for a while, never memory beyond the cap)."""
    got = _shared_values.get(value)
    if got is None:
        if len(_shared_values) >= SHARED_VALUES_CAP:
            _shared_values.clear()
        got = _shared_values.setdefault(value, value)
    return got


def compact_node(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` as a new dict of the same content: keys interned, fleet-repeated values shared (``shared_value``),
    a value repeated inside the Node (its condition times, its name as hostname label) one copy.

    Keys: a list page's decoder shares the keys of its 500 Nodes already; a Node decoded from its own watch event
    (every Node, once the kubelets have reported) had its own, a third of what a toy Node held (3.4 to 2.3 KB,
    bench/scale_100k.py). Keys are a small vocabulary: sys.intern is fine for them."""
    return _NodeCompactor().walk(node)


class _NodeCompactor:
    """One Node's walk (its keys by sys.intern, its values by the table or ``own``); loops with local names, as it
    runs in the informer's thread for every watch event."""

    def __init__(self) -> None:
        self.own: dict[str, str] = {}

    def walk(self, obj: dict[str, Any]) -> dict[str, Any]:
        intern, field = sys.intern, self.field
        return {intern(k): field(k, v) for k, v in obj.items()}

    def field(self, key: str, value: Any) -> Any:
        if isinstance(value, str):
            if key in PER_NODE_FIELDS:
                return self.own.setdefault(value, value)
            return _shared_values.get(value) or shared_value(value)
        if isinstance(value, dict):
            if key == "labels":
                return self.strings(value, lambda k: k in PER_NODE_LABELS)
            if key == "annotations":
                return self.strings(value, lambda k: not k.startswith(SHARED_ANNOTATION_PREFIXES))
            return self.walk(value)
        if isinstance(value, list):
            return [self.field(key, v) for v in value]  # a list's items are its key's: podCIDRs, taints, conditions
        return value

    def strings(self, values: dict[str, Any], own: Callable[[str], bool]) -> dict[str, Any]:
        """Labels or annotations: a string each (anything else kept as it is); ``own(key)``: the Node's own."""
        intern, table, mine = sys.intern, _shared_values, self.own
        out: dict[str, Any] = {}
        for k, v in values.items():
            if isinstance(v, str):
                v = mine.setdefault(v, v) if own(k) else (table.get(v) or shared_value(v))
            out[intern(k)] = v
        return out


FAILED_PODS = "status.phase=Failed"  # the one cluster-wide pod watch allowed: each reduced by its transform


def default_transform(res: Resource) -> Transform:
    return strip_node if res.kind == "Node" else strip_metadata


def object_key(obj: dict[str, Any]) -> str:
    """'namespace/name', or 'name' for a cluster-scoped object."""
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name") or ""
    return f"{namespace}/{name}" if namespace else str(name)


@dataclass
class _Handlers:
    on_add: AddHandler | None
    on_update: UpdateHandler | None
    on_delete: DeleteHandler | None


class Informer:
    def __init__(
        self,
        client: KubeClient,
        res: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        watch_timeout_seconds: int = 300,
        error_backoff: float = 1.0,
        transform: Transform | None = None,
    ) -> None:
        if res.kind == "Pod" and not namespace and not (field_selector or "").startswith("spec.nodeName=") \
                and not ((field_selector == FAILED_PODS or label_selector) and transform is not None):
            raise ValueError("pods are never cached cluster-wide: an Informer on pods needs a namespace, "
                             "fieldSelector spec.nodeName=<node> (one node's pods), or status.phase=Failed (or a "
                             "labelled subset) with a transform that keeps a few fields of each")
        self.client = client
        self.transform = transform or default_transform(res)
        self.last_error = ""  # why the last list failed ("" once one succeeded)
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout_seconds = watch_timeout_seconds
        self.error_backoff = error_backoff
        self._store: dict[str, dict[str, Any] | Packed] = {}
        # pack_unless: the keys kept whole (the rest packed), the packer, and a count of changes to what ``keep``
        # takes (an event whose form was chosen before a change is chosen again when it is stored)
        self._keep: Callable[[str], bool] | None = None
        self._packer: Packer | None = None
        self._generation = 0
        self._lock = threading.RLock()
        self._handlers: list[_Handlers] = []
        self._synced = threading.Event()
        self._stopped = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self.relists = 0
        self._progress_at = 0.0

    # ---- public ------------------------------------------------------------------------------------------

    def add_handler(
        self,
        on_add: AddHandler | None = None,
        on_update: UpdateHandler | None = None,
        on_delete: DeleteHandler | None = None,
    ) -> None:
        """Register handlers; objects already in the store are replayed to on_add."""
        with self._lock:
            handlers = _Handlers(on_add, on_update, on_delete)
            self._handlers.append(handlers)
            existing = list(self._store.values())
        for obj in existing:
            self._call(handlers.on_add, self._unpacked(obj))

    def pack_unless(self, keep: Callable[[str], bool]) -> None:
        """From now on the store keeps packed (kube/packed.py) each object whose key ``keep`` does not take:
        ``get`` and ``list`` unpack them, handlers get them whole. Call ``repack`` whenever what ``keep`` takes
        may have changed; a key it takes is whole in the store once ``repack`` returns."""
        with self._lock:
            self._keep = keep
            self._packer = Packer(self.transform)
        self.repack()

    def repack(self) -> None:
        """Each stored object packed or whole as ``keep`` says now (the work done outside the lock: unpacking a
        shard's 5,000 realistic Nodes takes most of a second; an event stored meanwhile chose its own form)."""
        with self._lock:
            if self._keep is None:
                return
            self._generation += 1
            items = list(self._store.items())
        changed: list[tuple[str, dict[str, Any] | Packed, dict[str, Any] | Packed]] = []
        for key, obj in items:
            now = self._form(key, self._unpacked(obj) if isinstance(obj, Packed) and self._keeps(key) else obj)
            if now is not obj:
                changed.append((key, obj, now))
        with self._lock:
            for key, was, now in changed:
                if self._store.get(key) is was:
                    self._store[key] = now

    def _keeps(self, key: str) -> bool:
        keep = self._keep
        return keep is None or keep(key)

    def _form(self, key: str, obj: dict[str, Any] | Packed) -> dict[str, Any] | Packed:
        """How ``obj`` is stored under ``key`` now: whole, or packed."""
        if isinstance(obj, Packed) or self._keeps(key):
            return obj
        assert self._packer is not None
        return self._packer.pack(obj)

    def _unpacked(self, obj: dict[str, Any] | Packed) -> dict[str, Any]:
        if isinstance(obj, Packed):
            assert self._packer is not None
            return self._packer.unpack(obj)
        return obj

    def _decoded(self, obj: dict[str, Any] | Packed) -> dict[str, Any]:
        """``obj`` whole for a handler's look at what it was (decoded only: not kept)."""
        if isinstance(obj, Packed):
            assert self._packer is not None
            return self._packer.decoded(obj)
        return obj

    def start(self) -> Informer:
        if self._thread is not None:
            raise RuntimeError("informer already started")
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.res.plural}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        stream = self._stream
        if stream is not None:
            stream.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def last_progress(self) -> float:
        """When (time.monotonic) the last page of a list arrived; 0.0 before any."""
        return self._progress_at

    def _paged(self) -> None:
        self._progress_at = time.monotonic()

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        obj = self._stored(name, namespace)
        return None if obj is None else self._unpacked(obj)

    def get_stored(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object as stored, where it is stored whole; None where it is packed (``pack_unless``) or absent."""
        obj = self._stored(name, namespace)
        return obj if isinstance(obj, dict) else None

    def _stored(self, name: str, namespace: str | None) -> dict[str, Any] | Packed | None:
        with self._lock:
            return self._store.get(f"{namespace}/{name}" if namespace else name)

    def list(self) -> list[dict[str, Any]]:
        """Every object, whole (a packed one unpacked: with ``pack_unless``, a walk of the cache costs about 0.1
        ms a packed object; the keys alone are ``stored_keys``)."""
        with self._lock:
            stored = list(self._store.values())
        return [self._unpacked(obj) for obj in stored]

    def stored_keys(self) -> builtins.list[str]:
        """The keys of the objects stored: "namespace/name", or "name" for a cluster-scoped kind."""
        with self._lock:
            return list(self._store)

    # ---- the loop ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        rv = self._relist_until_done()
        if self._stopped.is_set():
            return
        resumable_watch(
            self.client, self.res, self.namespace, resource_version=rv, on_event=self._apply,
            relist=self._relist_until_done, stopped=self._stopped, label_selector=self.label_selector,
            field_selector=self.field_selector, timeout_seconds=self.watch_timeout_seconds,
            on_stream=self._set_stream, error_backoff=self.error_backoff,
        )

    def _set_stream(self, stream: WatchStream | None) -> None:
        self._stream = stream
        if stream is not None and self._stopped.is_set():
            stream.stop()

    def _relist_until_done(self) -> str:
        failures = 0
        while not self._stopped.is_set():
            try:
                return self._relist()
            except (errors.ApiError, errors.TransportError) as exc:
                failures += 1
                self.last_error = str(exc)
                log.warning("list of %s failed: %s", self.res.plural, exc)
                self._stopped.wait(retry_delay(self.error_backoff, failures))
        return ""

    def _relist(self) -> str:
        generation = self._generation
        listing = self.client.list(self.res, self.namespace, label_selector=self.label_selector,
                                   field_selector=self.field_selector, each=self._listed, on_page=self._paged)
        fresh: dict[str, dict[str, Any] | Packed] = dict(listing.get("items") or [])
        self.last_error = ""
        with self._lock:
            old, self._store = self._store, dict(fresh)
            self.relists += 1
            again = generation != self._generation
        if again:  # what keep takes changed during the list: its forms were chosen before
            self.repack()
        for key, obj in old.items():
            if key not in fresh:
                self._notify_delete(self._decoded(obj))
        for key, obj in fresh.items():
            if key in old:
                if _rv(old[key]) != _rv(obj):
                    self._notify_changed(old[key], self._unpacked(obj))
            else:
                self._notify_add(self._unpacked(obj))
        self._synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def _listed(self, obj: dict[str, Any]) -> tuple[str, dict[str, Any] | Packed]:
        key = object_key(obj)
        return key, self._form(key, self.transform(obj))

    def _apply(self, event: WatchEvent) -> None:
        generation = self._generation
        obj, key = self.transform(event.object), object_key(event.object)
        stored = self._form(key, obj) if event.type != "DELETED" else obj
        with self._lock:
            if generation != self._generation and event.type != "DELETED":
                stored = self._form(key, obj)  # a repack began since the form was chosen
            old = self._store.get(key)
            if event.type == "DELETED":
                self._store.pop(key, None)
            else:
                self._store[key] = stored
        if event.type == "DELETED":
            self._notify_delete(obj)
        elif old is None:
            self._notify_add(obj)
        else:
            self._notify_changed(old, obj)

    # ---- handlers ----------------------------------------------------------------------------------------

    def _notify_add(self, obj: dict[str, Any]) -> None:
        for handlers in list(self._handlers):
            self._call(handlers.on_add, obj)

    def _notify_changed(self, old: dict[str, Any] | Packed, new: dict[str, Any]) -> None:
        """An update, unless the key now holds another object (a uid of its own: deleted and created again under
        the name while a relist or a resumed watch missed the two events): then the old one's delete and the new
        one's add, so nothing of the old object is carried to the new one."""
        if _uid(old) and _uid(new) and _uid(old) != _uid(new):
            self._notify_delete(self._decoded(old))
            self._notify_add(new)
        else:
            self._notify_update(self._decoded(old), new)

    def _notify_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        for handlers in list(self._handlers):
            self._call(handlers.on_update, old, new)

    def _notify_delete(self, obj: dict[str, Any]) -> None:
        for handlers in list(self._handlers):
            self._call(handlers.on_delete, obj)

    def _call(self, handler: Callable[..., None] | None, *objs: dict[str, Any]) -> None:
        if handler is None:
            return
        try:
            handler(*objs)
        except Exception:
            log.exception("informer %s: handler failed", self.res.plural)


def _rv(obj: dict[str, Any] | Packed) -> str:
    if isinstance(obj, Packed):
        return obj.resource_version
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _uid(obj: dict[str, Any] | Packed) -> str:
    if isinstance(obj, Packed):
        return obj.uid
    return str((obj.get("metadata") or {}).get("uid") or "")
