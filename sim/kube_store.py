"""Object storage and lifecycle: one global resourceVersion counter, create/update/delete with the
semantics of kube-apiserver's generic registry (finalizers, graceful pod deletion, preconditions,
propagation finalizers), and a bounded event history that watches replay from.
"""

from __future__ import annotations

import copy
import marshal
import random
import string
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sim import kube_errors as errs
from sim.kube_resources import ResourceType

Obj = dict[str, Any]
META_ORDER = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
              "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
              "ownerReferences", "finalizers", "managedFields")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def clone(obj: Any) -> Any:
    """A deep copy of a stored object: through marshal, about six times faster than ``copy.deepcopy`` on a GPU
    Node (a 100,000-Node LIST page copies 500 of them); ``copy.deepcopy`` for what marshal cannot take."""
    try:
        return marshal.loads(marshal.dumps(obj))
    except ValueError:  # a type marshal does not know (a subclass, an object): the general copy
        return copy.deepcopy(obj)


def now_time(offset_s: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def order_metadata(meta: dict[str, Any], alphabetical: bool = False) -> dict[str, Any]:
    if alphabetical:
        return {k: meta[k] for k in sorted(meta)}
    ordered = {k: meta[k] for k in META_ORDER if k in meta}
    ordered.update({k: v for k, v in meta.items() if k not in ordered})
    return ordered


def shape(rt: ResourceType, obj: Obj) -> Obj:
    """Key order as the real server writes it (typed objects: kind first; CRs: apiVersion first, sorted meta)."""
    head = ("apiVersion", "kind") if rt.custom else ("kind", "apiVersion")
    out: Obj = {k: obj[k] for k in head if k in obj}
    out["metadata"] = order_metadata(obj.get("metadata", {}), alphabetical=rt.custom)
    out.update({k: v for k, v in obj.items() if k not in out})
    return out


@dataclass
class WatchEvent:
    rv: int
    key: str
    type: str
    obj: Obj
    prev: Obj | None = None  # the stored object before this change (None for ADDED)


class Store:
    """Thread-safe object store keyed by (storage key, namespace, name)."""

    def __init__(self, history: int = 1000, first_rv: int = 100) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = first_rv
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self.history: deque[WatchEvent] = deque(maxlen=history)
        self.compacted_rv = 0  # rv of the newest event that fell out of the history
        self.listeners: list[Callable[[WatchEvent], None]] = []
        # Indexes kept by _record, for the garbage collector: a scan of every object per deletion made a drain
        # of 10,000 pods quadratic.
        self._uids: set[str] = set()
        self._owned: dict[str, set[tuple[str, str, str]]] = {}  # owner uid -> (key, namespace, name) of dependents

    # --- raw storage -----------------------------------------------------------------------------
    def get(self, key: str, namespace: str, name: str) -> Obj | None:
        with self.lock:
            obj = self.objects.get(key, {}).get((namespace, name))
            return clone(obj) if obj is not None else None

    def list_all(self, key: str, namespace: str = "") -> list[Obj]:
        return self.select(key, namespace)

    def select(self, key: str, namespace: str = "", keep: Callable[[Obj], bool] | None = None) -> list[Obj]:
        """Copies of the stored objects `keep` accepts, in (namespace, name) order. `keep` sees the stored
        object itself (it must not change it): only what it returns is copied, so a selective list of a
        large bucket costs what it returns, not the bucket."""
        with self.lock:
            bucket = self.objects.get(key, {})
            keys = sorted(k for k, obj in bucket.items()
                          if (not namespace or k[0] == namespace) and (keep is None or keep(obj)))
            return [clone(bucket[k]) for k in keys]

    def select_page(self, key: str, namespace: str, keep: Callable[[Obj], bool], order: Callable[[Obj], str],
                    after: str = "", limit: int = 0) -> tuple[list[Obj], int]:
        """A LIST page: copies of at most ``limit`` (0: all) accepted objects whose ``order`` key is past
        ``after``, in that key's order (etcd's: the key as a string), and how many accepted ones come after them.
        Only the page is copied: paging 20,000 Nodes 500 at a time copies each once, not once a page."""
        with self.lock:
            bucket = self.objects.get(key, {})
            found = [(order(obj), obj) for k, obj in bucket.items() if (not namespace or k[0] == namespace)
                     and keep(obj)]
            found = sorted((pair for pair in found if not after or pair[0] > after), key=lambda pair: pair[0])
            page = found[:limit] if limit else found
            return [clone(obj) for _, obj in page], len(found) - len(page)

    def uids(self) -> set[str]:
        with self.lock:
            return set(self._uids)

    def has_uid(self, uid: object) -> bool:
        with self.lock:
            return uid in self._uids

    def owned_by(self, uid: str) -> list[tuple[str, Obj]]:
        """Copies of the objects with an ownerReference to ``uid``, each with its storage key."""
        with self.lock:
            found = ((key, self.objects.get(key, {}).get((ns, name)))
                     for key, ns, name in sorted(self._owned.get(uid, ())))
            return [(key, clone(obj)) for key, obj in found if obj is not None]

    def _index(self, key: str, ident: tuple[str, str], prev: Obj | None, now: Obj | None) -> None:
        if prev is not None:
            self._uids.discard(prev["metadata"].get("uid"))
            for owner in _owner_uids(prev):
                dependents = self._owned.get(owner)
                if dependents is not None:
                    dependents.discard((key, *ident))
                    if not dependents:
                        del self._owned[owner]
        if now is not None:
            if now["metadata"].get("uid"):
                self._uids.add(now["metadata"]["uid"])
            for owner in _owner_uids(now):
                self._owned.setdefault(owner, set()).add((key, *ident))

    def current_rv(self) -> int:
        with self.lock:
            return self.rv

    def _record(self, key: str, event_type: str, obj: Obj) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        meta = obj["metadata"]
        bucket = self.objects.setdefault(key, {})
        ident = (meta.get("namespace", ""), meta["name"])
        prev = bucket.get(ident)
        if event_type == "DELETED":
            bucket.pop(ident, None)
        else:
            bucket[ident] = clone(obj)
        self._index(key, ident, prev, bucket.get(ident))
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        event = WatchEvent(self.rv, key, event_type, clone(obj), prev)
        self.history.append(event)
        self.changed.notify_all()
        for listener in list(self.listeners):
            listener(event)
        return clone(obj)

    def events_after(self, rv: int) -> list[WatchEvent]:
        """The history's events past ``rv``, oldest first: walked from the newest back, so a watch that is
        keeping up costs the events it is sent, not the history (each of a fleet's watches wakes on every write,
        the store locked meanwhile; with 20,000 events kept, a scan from the oldest cost each write milliseconds
        per watch)."""
        with self.lock:
            newer: list[WatchEvent] = []
            for event in reversed(self.history):
                if event.rv <= rv:
                    break
                newer.append(event)
            newer.reverse()
            return newer

    # --- lifecycle --------------------------------------------------------------------------------
    def create(self, rt: ResourceType, obj: Obj, namespace: str, dry_run: bool = False,
               mutate: Callable[[Obj], None] | None = None) -> Obj:
        """Store a new object; `mutate` runs once uid and name exist (e.g. labels keyed on the uid)."""
        with self.lock:
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, namespace, meta["generateName"])
            if rt.namespaced:
                meta["namespace"] = namespace
                self._require_namespace(namespace)
            else:
                meta.pop("namespace", None)
            if self.get(rt.key, namespace, meta["name"]) is not None:
                raise errs.already_exists(rt.resource, rt.group, meta["name"])
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_time()
            for transient in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(transient, None)
            if rt.generation:
                meta["generation"] = 1
            if mutate is not None:
                mutate(obj)
            obj = shape(rt, obj)
            if dry_run:
                return obj
            return self._record(rt.key, "ADDED", obj)

    def restore(self, rt: ResourceType, objs: Iterable[Obj], namespace: str = "") -> int:
        """Objects as a restored etcd holds them before any client watches (a bench's fleet of 100,000 Nodes):
        each stored as ``create`` would store it, but with no watch event (a watch starts past them) and no copy
        (``objs`` are handed over). Returns how many."""
        count = 0
        with self.lock:
            if rt.namespaced:
                self._require_namespace(namespace)
            bucket = self.objects.setdefault(rt.key, {})
            for obj in objs:
                meta = obj.setdefault("metadata", {})
                if rt.namespaced:
                    meta["namespace"] = namespace
                ident = (namespace if rt.namespaced else "", meta["name"])
                if ident in bucket:
                    raise errs.already_exists(rt.resource, rt.group, meta["name"])
                self.rv += 1
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_time(), resourceVersion=str(self.rv))
                if rt.generation:
                    meta["generation"] = 1
                bucket[ident] = shape(rt, obj)
                self._index(rt.key, ident, None, bucket[ident])
                count += 1
            # no event of theirs to replay: a watch from before them is too old, as after a compaction
            self.compacted_rv = max(self.compacted_rv, self.rv)
        return count

    def _require_namespace(self, namespace: str) -> None:
        if self.get("/namespaces", "", namespace) is None:
            raise errs.not_found("namespaces", "", namespace)

    def _generate_name(self, rt: ResourceType, namespace: str, prefix: str) -> str:
        for _ in range(100):
            name = prefix + "".join(random.choice(_NAME_CHARS) for _ in range(5))
            if self.get(rt.key, namespace, name) is None:
                return name
        return prefix + "".join(random.choice(string.ascii_lowercase) for _ in range(10))

    def update(self, rt: ResourceType, new: Obj, old: Obj, dry_run: bool = False) -> Obj:
        """Store `new` over `old` (the caller merged status/spec per subresource); a no-op keeps the rv."""
        with self.lock:
            current = self.objects.get(rt.key, {}).get((old["metadata"].get("namespace", ""), old["metadata"]["name"]))
            if current is None:
                raise errs.not_found(rt.resource, rt.group, old["metadata"]["name"])
            if current["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise errs.raced(rt.resource, rt.group, old["metadata"]["name"])
            new = shape(rt, new)
            if _same_ignoring_rv(new, current):
                return clone(current)
            if dry_run:
                return new
            removed = _finalized(new)
            stored = self._record(rt.key, "MODIFIED", new)
            if removed:
                self._record(rt.key, "DELETED", clone(stored))
            return stored

    def delete(self, rt: ResourceType, namespace: str, name: str, *, grace: int | None = None,
               propagation: str | None = None, preconditions: dict[str, Any] | None = None,
               dry_run: bool = False) -> tuple[Obj, bool]:
        """Returns (object, removed now)."""
        with self.lock:
            obj = self.get(rt.key, namespace, name)
            if obj is None:
                raise errs.not_found(rt.resource, rt.group, name)
            _check_preconditions(rt, obj, preconditions or {})
            meta = obj["metadata"]
            grace_s = self._grace(rt, obj, grace)
            if meta.get("deletionTimestamp"):
                return self._delete_again(rt, obj, grace_s, dry_run)
            self._add_propagation_finalizer(rt, meta, propagation)
            if dry_run:
                return obj, not meta.get("finalizers") and grace_s == 0
            meta["deletionTimestamp"] = now_time(grace_s)
            meta["deletionGracePeriodSeconds"] = grace_s
            if grace_s > 0 or meta.get("finalizers"):
                return self._record(rt.key, "MODIFIED", obj), False
            return self._remove(rt, obj), True

    def _remove(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.returns_object_on_delete and rt.resource == "pods":
            obj = self._record(rt.key, "MODIFIED", obj)
        return self._record(rt.key, "DELETED", obj)

    def _delete_again(self, rt: ResourceType, obj: Obj, grace_s: int, dry_run: bool) -> tuple[Obj, bool]:
        meta = obj["metadata"]
        current = int(meta.get("deletionGracePeriodSeconds") or 0)
        if rt.resource != "pods" or grace_s >= current or dry_run:
            return obj, False
        meta["deletionTimestamp"] = now_time(grace_s)
        meta["deletionGracePeriodSeconds"] = grace_s
        if grace_s == 0 and not meta.get("finalizers"):
            return self._remove(rt, obj), True
        return self._record(rt.key, "MODIFIED", obj), False

    @staticmethod
    def _grace(rt: ResourceType, obj: Obj, grace: int | None) -> int:
        if rt.resource != "pods":
            return 0
        spec, phase = obj.get("spec", {}), obj.get("status", {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        return max(0, int(grace))

    @staticmethod
    def _add_propagation_finalizer(rt: ResourceType, meta: dict[str, Any], propagation: str | None) -> None:
        policy = propagation or rt.default_propagation
        finalizer = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(policy)
        if finalizer and finalizer not in meta.get("finalizers", []):
            meta["finalizers"] = [*meta.get("finalizers", []), finalizer]

    def remove_finalizer(self, rt: ResourceType, obj: Obj, finalizer: str) -> None:
        """Controller helper: drop one finalizer from the stored object (deleting it if it was the last)."""
        with self.lock:
            current = self.get(rt.key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if current is None or finalizer not in current["metadata"].get("finalizers", []):
                return
            updated = clone(current)
            rest = [f for f in updated["metadata"]["finalizers"] if f != finalizer]
            if rest:
                updated["metadata"]["finalizers"] = rest
            else:
                updated["metadata"].pop("finalizers")
            self.update(rt, updated, current)


def _owner_uids(obj: Obj) -> set[str]:
    return {str(ref["uid"]) for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("uid")}


def _same_ignoring_rv(a: Obj, b: Obj) -> bool:
    def strip(o: Obj) -> Obj:  # a shallow copy: the comparison reads, it never writes
        meta = {k: v for k, v in o["metadata"].items() if k not in ("resourceVersion", "managedFields")}
        return {**o, "metadata": meta}
    return strip(a) == strip(b)


def _finalized(obj: Obj) -> bool:
    meta = obj["metadata"]
    return bool(meta.get("deletionTimestamp")) and not meta.get("finalizers") \
        and int(meta.get("deletionGracePeriodSeconds") or 0) == 0


def _check_preconditions(rt: ResourceType, obj: Obj, pre: dict[str, Any]) -> None:
    meta = obj["metadata"]
    name = meta["name"]
    if pre.get("uid") and pre["uid"] != meta["uid"]:
        raise _precondition(rt, name, f"the UID in the precondition ({pre['uid']}) does not match the UID in "
                            f"record ({meta['uid']}). The object might have been deleted and then recreated")
    if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
        raise _precondition(rt, name, f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does "
                            f"not match the ResourceVersion in record ({meta['resourceVersion']}). "
                            "The object might have been modified")


def _precondition(rt: ResourceType, name: str, why: str) -> errs.ApiError:
    msg = f'Operation cannot be fulfilled on {rt.kind} "{name}": {why}'
    details: dict[str, Any] = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.kind
    return errs.ApiError(409, errs.status(409, msg, "Conflict", details))
