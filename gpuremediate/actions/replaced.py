"""The history of replaced nodes: ConfigMap ``gpuremediate-replaced`` (the Node, and its record, go away).

Data key ``replaced``: a JSON list, newest last, at most ``LIMIT`` entries, each one replacement of one Node (its
name and uid, its ``spec.providerID``: the instance, the fault, the provider and the object deleted). An entry is
written (``deleting``) before the delete and marked ``deleted`` after it, each write guarded by the ConfigMap's
resourceVersion: a controller killed between the two finds the entry and never sends a second delete for it
(``Replacer``). ``status``, ``explain`` and the replay (``replay.replaced``) read it to show what happened to a
node that no longer exists.

What it can follow: the Node (name and uid) and the instance it ran on (``providerID``). What it cannot: the
hardware after the replacement, since a replaced node comes back on another instance (a cloud's) or another
machine; the repeat-offender rule follows a node's record, which starts fresh on the new Node.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuremediate.actions.replace import NoTarget, Target, delete_target, find_target
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import CONFIGMAPS

REPLACED_CONFIGMAP = "gpuremediate-replaced"
REPLACED_KEY = "replaced"
LIMIT = 200  # entries kept (newest last): a ConfigMap holds at most 1 MiB, one entry is ~400 bytes
ATTEMPTS = 5

DELETING = "deleting"  # written before the delete
DELETED = "deleted"  # the delete was sent (or the object found gone)


class HistoryError(RuntimeError):
    """The ConfigMap could not be read or written: nothing is deleted (asked again later)."""


@dataclass(frozen=True)
class Entry:
    node: str
    node_uid: str
    provider_id: str
    provider: str
    target: str  # "Machine ns/name" or "NodeClaim name"
    target_uid: str
    fault: str
    at: float
    state: str = DELETING


def read_entries(configmap: Mapping[str, Any] | None) -> list[Entry]:
    raw = ((configmap or {}).get("data") or {}).get(REPLACED_KEY) or "[]"
    try:
        items = json.loads(raw)
        return [Entry(**{f.name: item[f.name] for f in dataclasses.fields(Entry) if f.name in item}) for item in items]
    except (ValueError, TypeError, KeyError) as exc:
        raise HistoryError(f"ConfigMap {REPLACED_CONFIGMAP} key {REPLACED_KEY}: not a list of entries ({exc}); fix "
                           f"or delete the key") from exc


class ReplacedHistory:
    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    def entries(self) -> list[Entry]:
        return read_entries(self._read())

    def find(self, node_uid: str) -> Entry | None:
        return next((e for e in reversed(self.entries()) if e.node_uid == node_uid), None)

    def update(self, change: Callable[[list[Entry]], list[Entry] | None]) -> None:
        """Apply ``change`` to the list (None: no write) under the resourceVersion, re-read on a 409."""
        for _ in range(ATTEMPTS):
            current = self._read()
            after = change(read_entries(current))
            if after is None or self._write(current, after[-LIMIT:]):
                return
        raise HistoryError(f"ConfigMap {self.namespace}/{REPLACED_CONFIGMAP}: {ATTEMPTS} conflicting writes")

    def _read(self) -> dict[str, Any] | None:
        try:
            return self.client.get(CONFIGMAPS, REPLACED_CONFIGMAP, self.namespace)
        except errors.NotFound:
            return None
        except (errors.ApiError, errors.TransportError) as exc:
            raise HistoryError(f"ConfigMap {self.namespace}/{REPLACED_CONFIGMAP} unreadable: {exc}") from exc

    def _write(self, current: dict[str, Any] | None, entries: list[Entry]) -> bool:
        data = {REPLACED_KEY: json.dumps([dataclasses.asdict(e) for e in entries], separators=(",", ":"))}
        try:
            if current is None:
                self.client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "data": data,
                                                "metadata": {"name": REPLACED_CONFIGMAP, "namespace": self.namespace}},
                                   self.namespace)
            else:
                self.client.replace(CONFIGMAPS, REPLACED_CONFIGMAP, {**current, "data": {
                    **(current.get("data") or {}), **data}}, self.namespace)
        except (errors.Conflict, errors.AlreadyExists):
            return False
        except (errors.ApiError, errors.TransportError) as exc:
            raise HistoryError(f"ConfigMap {self.namespace}/{REPLACED_CONFIGMAP} not written: {exc}") from exc
        return True


@dataclass(frozen=True)
class Outcome:
    done: bool  # the replacement is under way (deleted now or before): the node goes away
    detail: str  # what was done, or why not (said to the person the ladder goes to)
    target: Target | None = None


class Replacer:
    """Once per Node (uid): the history entry first, then the delete, then the entry marked deleted."""

    def __init__(self, client: KubeClient, history: ReplacedHistory, *, dry_run: bool = False) -> None:
        self.client = client
        self.history = history
        self.dry_run = dry_run

    def replace(self, node: Mapping[str, Any], fault: str, now: float, provider: str = "auto") -> Outcome:
        meta = node.get("metadata") or {}
        name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
        known = self.history.find(uid) if uid else None
        if known is not None and known.state == DELETED:
            return Outcome(True, f"{known.target} was deleted at {known.at:.0f} (the history says so): not again")
        found = find_target(self.client, node, provider)
        if isinstance(found, NoTarget) and known is not None and not self.dry_run:
            # written before a delete a restart interrupted: the delete went (the object is gone), nothing to send
            self.history.update(lambda entries: _marked(entries, uid))
            return Outcome(True, f"{known.target} is gone since the history's entry: not deleted again")
        if isinstance(found, NoTarget):
            return Outcome(False, found.why)
        if self.dry_run:
            return Outcome(False, f"would replace: delete {found.describe()} ({found.provider})", found)
        if known is not None and known.target_uid != found.uid:
            return Outcome(True, f"{known.target} was deleted before; {found.describe()} is another object: "
                                 f"not deleted")
        if known is None:
            entry = Entry(name, uid, str((node.get("spec") or {}).get("providerID") or ""), found.provider,
                          found.describe(), found.uid, fault, now)
            self.history.update(lambda entries: [*entries, entry])
        # Being deleted already: our delete went before a restart (killed before the entry was marked), or its
        # owner's own remediation took it: never sent twice.
        deleted = False if found.deleting else delete_target(self.client, found)
        self.history.update(lambda entries: _marked(entries, uid))
        verb = "deleted" if deleted else ("already being deleted: not deleted again" if found.deleting
                                          else "found already gone")
        return Outcome(True, f"{found.describe()} {verb} ({found.provider}): its owner replaces the node", found)


def _marked(entries: list[Entry], node_uid: str) -> list[Entry] | None:
    if not any(e.node_uid == node_uid and e.state == DELETING for e in entries):
        return None
    return [dataclasses.replace(e, state=DELETED) if e.node_uid == node_uid else e for e in entries]
