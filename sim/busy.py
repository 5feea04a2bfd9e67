"""Other writers of Nodes, as on a real cluster: kube-controller-manager, kubelets, and other tools.

On a real control plane a Node is written all the time by components other than gpuremediate, so a
resourceVersion-guarded node patch meets 409 Conflict in normal operation. ``BusyWriter`` plays them
against any API server, at ``writes_per_s`` across the nodes:

- annotations and labels of its own (``sim.example.com/*``; never the controller's ``gpuremediate.io/*``),
  written with a merge patch the way tools and controllers do;
- status heartbeats: the Ready condition's ``lastHeartbeatTime`` (a strategic merge on ``type``, so a
  heartbeat never changes a condition's status);
- reactions: it watches the Nodes and writes one right after someone else changed its metadata or spec
  (as kube-controller-manager reacts to a cordon within milliseconds), so a controller's second write
  in a row, guarded by the resourceVersion of its first, meets a 409 (capture 31);
- with ``taints`` (what the node lifecycle controller does; leave it off where a real
  kube-controller-manager runs): ``node.kubernetes.io/not-ready:NoSchedule`` while Ready is False (a
  reboot) and ``node.kubernetes.io/unschedulable:NoSchedule`` while the node is cordoned, each added and
  removed with a resourceVersion-guarded patch (retried on 409 next round).

``writes_from_env`` reads the switch ``GPUREMEDIATE_SIM_BUSY``: unset → ``DEFAULT_WRITES_PER_S``,
``0``/``off`` → off, a number → that many writes per second.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Sequence
from typing import Any

from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NODES
from sim.kube_store import now_time

ENV_SWITCH = "GPUREMEDIATE_SIM_BUSY"
DEFAULT_WRITES_PER_S = 8.0
KEY_PREFIX = "sim.example.com/"
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
CONDITION_TAINTS = (NOT_READY_TAINT, UNSCHEDULABLE_TAINT)
CONDITION_IDENTITIES = frozenset((t["key"], t["effect"]) for t in CONDITION_TAINTS)


def writes_from_env(environ: dict[str, str] | None = None) -> float:
    """The busy writer's rate from ``GPUREMEDIATE_SIM_BUSY`` (0.0: off); a bad value is a clear error."""
    raw = (os.environ if environ is None else environ).get(ENV_SWITCH, "").strip().lower()
    if raw == "":
        return DEFAULT_WRITES_PER_S
    if raw in ("0", "off", "false", "no"):
        return 0.0
    try:
        rate = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_SWITCH}={raw!r}: expected a number of node writes per second, or 0/off") from None
    if not rate >= 0:
        raise ValueError(f"{ENV_SWITCH}={raw!r}: the rate cannot be negative")
    return rate


class BusyWriter:
    def __init__(self, client: KubeClient, nodes: Sequence[str], *, writes_per_s: float = DEFAULT_WRITES_PER_S,
                 taints: bool = True, seed: int | None = None) -> None:
        if writes_per_s <= 0:
            raise ValueError(f"writes_per_s must be positive, got {writes_per_s}")
        self.client = client
        self.nodes = list(nodes)
        self.interval_s = 1.0 / writes_per_s
        self.taints = taints
        self.random = random.Random(seed)
        self.writes = 0  # successful node writes, for reports
        self.conflicts = 0  # its own guarded taint patches that met a 409
        self.reactions = 0  # writes made right after another writer's change
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Informer | None = None

    # --- lifecycle -----------------------------------------------------------------------------------
    def start(self, *, reactive: bool = True) -> BusyWriter:
        self._stop.clear()
        if reactive:
            self._watch = Informer(self.client, NODES, transform=lambda node: node)
            self._watch.add_handler(on_update=self.react)
            self._watch.start()
        self._thread = threading.Thread(target=self._run, name="busy-writer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def react(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Another writer changed this node's metadata or spec: write it at once (taints first)."""
        name = str(new["metadata"]["name"])
        if self._stop.is_set() or name not in self.nodes or _others_part(old) == _others_part(new):
            return
        try:
            if self.taints and wanted_condition_taints(new) != _condition_taints(new):
                self.sync_taints(new)
            else:
                self.client.patch(NODES, name, {"metadata": {"annotations": {
                    f"{KEY_PREFIX}reacted": str(self.reactions + 1)}}})
                self.writes += 1
            self.reactions += 1
        except (errors.ApiError, errors.TransportError) as exc:
            self.errors.append(str(exc))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.round()
            except (errors.ApiError, errors.TransportError) as exc:
                self.errors.append(str(exc))

    # --- one round: the condition taints kept right, then one random write -----------------------------
    def round(self) -> None:
        if self.taints:
            for node in self.client.list(NODES)["items"]:
                if node["metadata"]["name"] in self.nodes:
                    self.sync_taints(node)
        if self.nodes:
            self.random_write(self.random.choice(self.nodes))

    def random_write(self, name: str) -> None:
        what = self.random.choice(("annotation", "annotation", "label", "heartbeat"))
        with contextlib.suppress(errors.NotFound):
            if what == "heartbeat":
                self.heartbeat(name)
            else:
                key = f"{KEY_PREFIX}busy-{self.random.randrange(4)}"
                value = f"v{self.random.randrange(1_000_000)}"
                self.client.patch(NODES, name, {"metadata": {f"{what}s": {key: value}}})
            self.writes += 1

    def heartbeat(self, name: str) -> None:
        patch = {"status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": now_time()}]}}
        self.client.patch(NODES, name, patch, patch_type="strategic", subresource="status")

    def sync_taints(self, node: dict[str, Any]) -> None:
        """Add or remove the condition taints this node should or should not carry (guarded by its
        resourceVersion, as the node lifecycle controller's patch is)."""
        spec = node.get("spec") or {}
        current = list(spec.get("taints") or [])
        wanted = wanted_condition_taints(node)
        kept = [t for t in current if _identity(t) not in CONDITION_IDENTITIES
                or _identity(t) in {_identity(w) for w in wanted}]
        missing = [dict(w) for w in wanted if _identity(w) not in {_identity(t) for t in current}]
        taints = kept + missing
        if taints == current:
            return
        patch = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                 "spec": {"taints": taints or None}}
        try:
            self.client.patch(NODES, node["metadata"]["name"], patch)
        except errors.Conflict:
            self.conflicts += 1  # changed since listed: the next round reads it again
        except errors.NotFound:
            pass
        else:
            self.writes += 1


def wanted_condition_taints(node: dict[str, Any]) -> list[dict[str, str]]:
    """not-ready while the Ready condition is False, unschedulable while cordoned (TaintNodesByCondition)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    out = []
    if ready == "False":
        out.append(NOT_READY_TAINT)
    if (node.get("spec") or {}).get("unschedulable"):
        out.append(UNSCHEDULABLE_TAINT)
    return out


def _others_part(node: dict[str, Any]) -> tuple[object, ...]:
    """What other writers change and this one reacts to: metadata labels and annotations (not its own keys)
    and the spec (not the condition taints it keeps itself)."""
    meta = node.get("metadata") or {}
    spec = dict(node.get("spec") or {})
    spec["taints"] = [t for t in spec.get("taints") or [] if _identity(t) not in CONDITION_IDENTITIES]
    return _not_mine(meta.get("labels")), _not_mine(meta.get("annotations")), spec


def _not_mine(items: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (items or {}).items() if not k.startswith(KEY_PREFIX)}


def _condition_taints(node: dict[str, Any]) -> list[dict[str, str]]:
    """The condition taints the node carries, in CONDITION_TAINTS order (as wanted_condition_taints)."""
    have = {_identity(t) for t in (node.get("spec") or {}).get("taints") or []}
    return [t for t in CONDITION_TAINTS if _identity(t) in have]


def _identity(taint: dict[str, Any]) -> tuple[str, str]:
    return str(taint.get("key")), str(taint.get("effect"))
