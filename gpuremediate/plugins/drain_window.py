"""``gpuremediate plugin drain-window``: a drain plugin (NVSentinel's DrainRequest contract) that
drains only inside a maintenance window.

Per DrainRequest (informer + work queue, one reconcile at a time):

- ``DrainComplete=True`` already: nothing to do (idempotent).
- outside the window: ``DrainDeferred=True`` (reason ``OutsideDrainWindow``, the next opening in
  the message) and a requeue at the opening; no pod is read or touched.
- inside: every pod of ``spec.podsToDrain`` still present (and still on ``spec.nodeName``) is
  evicted through the Eviction API, so PodDisruptionBudgets are honoured (a 429 is reported in
  ``DrainDeferred``'s message and retried); ``DrainComplete=True`` only once every listed pod is
  gone.

Status is written through the ``/status`` subresource with the object's resourceVersion
(a conflict requeues) and each condition's ``observedGeneration``; an unchanged status is not
written at all.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuremediate.actions import evict as eviction
from gpuremediate.actions.custom import condition_is
from gpuremediate.config import SettingsError, parse_duration
from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer, object_key
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import PODS, Resource
from gpuremediate.kube.workqueue import WorkQueue, run_worker
from gpuremediate.obs.log import add_log_flags, setup_logging
from gpuremediate.shutdown import Shutdown
from gpuremediate.vocab.window import Window, WindowError

log = logging.getLogger(__name__)

DRAIN_COMPLETE = "DrainComplete"
DRAIN_DEFERRED = "DrainDeferred"


@dataclass(frozen=True)
class PluginSettings:
    api_version: str = "nvsentinel.nvidia.com/v1alpha1"
    kind: str = "DrainRequest"
    namespace: str = ""  # "" = every namespace
    complete_condition: str = DRAIN_COMPLETE
    retry_s: float = 5.0  # while pods terminate or a PDB refuses
    max_defer_s: float = 3600.0  # a deferred request is looked at again at least this often
    resync_s: float = 60.0


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]], new: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """meta.SetStatusCondition: replace by type; lastTransitionTime moves only when status changes."""
    out = [dict(c) for c in conditions if c.get("type") != new["type"]]
    old = next((c for c in conditions if c.get("type") == new["type"]), None)
    changed = old is None or old.get("status") != new["status"]
    stamp = _rfc3339(now) if changed or not old else old.get("lastTransitionTime", _rfc3339(now))
    out.append({**new, "lastTransitionTime": stamp})
    return out


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    def key(c: Mapping[str, Any]) -> tuple[str, ...]:
        return tuple(str(c.get(k, "")) for k in ("type", "status", "reason", "message", "observedGeneration"))

    return sorted(map(key, a)) == sorted(map(key, b))


class DrainWindowPlugin:
    def __init__(self, client: KubeClient, window: Window, settings: PluginSettings | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.window = window
        self.settings = settings or PluginSettings()
        self.clock = clock
        self.res: Resource | None = None
        self.queue = WorkQueue(base_delay=0.5, max_delay=60.0)
        self.informer: Informer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- one request ------------------------------------------------------------------------------

    def resource(self) -> Resource:
        if self.res is None:
            self.res = self.client.resolve(self.settings.api_version, self.settings.kind)
        return self.res

    def reconcile(self, key: str) -> float | None:
        """One pass over one request; seconds until the next pass, or None when nothing is left."""
        namespace, _, name = key.rpartition("/")
        res = self.resource()  # a kind the server does not serve is an error, not a deleted request
        try:
            request = self.client.get(res, name, namespace or None)
        except errors.NotFound:
            return None
        if condition_is(request, self.settings.complete_condition, "True"):
            return None
        now = self.clock()
        if not self.window.is_open(now):
            return self._defer(request, now)
        return self._drain(request, now)

    def _defer(self, request: dict[str, Any], now: float) -> float:
        opens = self.window.next_opening(now)
        message = f"outside the drain window ({self.window.text}); next opening {_rfc3339(opens)}"
        self._write(request, [self._cond(request, DRAIN_DEFERRED, "True", "OutsideDrainWindow", message)], now)
        log.info("drain deferred", extra={"request": object_key(request), "opens": _rfc3339(opens)})
        return max(0.5, min(opens - now + 0.5, self.settings.max_defer_s))

    def _drain(self, request: dict[str, Any], now: float) -> float | None:
        spec = request.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        listed = [(ns, pod) for ns, pods in sorted((spec.get("podsToDrain") or {}).items()) for pod in pods or []]
        remaining, refused = self._evict_listed(listed, node)
        if remaining:
            why = f"; eviction refused: {', '.join(refused)}" if refused else ""
            message = f"draining: {remaining} of {len(listed)} listed pod(s) still present on {node or '?'}{why}"
            reason = "EvictionBlocked" if refused else "Draining"
            self._write(request, [self._cond(request, DRAIN_DEFERRED, "False", reason, message)], now)
            return self.settings.retry_s
        done = f"drained {len(listed)} pod(s) from {node or '?'}"
        self._write(request, [
            self._cond(request, DRAIN_DEFERRED, "False", "DrainWindowOpen", f"inside the drain window; {done}"),
            self._cond(request, self.settings.complete_condition, "True", "DrainComplete", done),
        ], now)
        log.info("drain complete", extra={"request": object_key(request), "pods": len(listed)})
        return None

    def _evict_listed(self, listed: list[tuple[str, str]], node: str) -> tuple[int, list[str]]:
        """Evict what is still there; (pods still present, why evictions were refused)."""
        remaining, refused = 0, []
        for namespace, name in listed:
            try:
                pod = self.client.get(PODS, name, namespace)
            except errors.NotFound:
                continue
            if node and (pod.get("spec") or {}).get("nodeName") not in (None, "", node):
                continue  # a new pod that reused the name elsewhere: not ours to drain
            remaining += 1
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            outcome = eviction.evict(self.client, pod)
            if outcome.result == eviction.GONE:
                remaining -= 1
            elif outcome.result == eviction.BLOCKED:
                refused.append(f"{namespace}/{name} (PodDisruptionBudget {outcome.pdb or '?'})")
            elif outcome.result == eviction.FAILED:
                refused.append(f"{namespace}/{name} ({outcome.message})")
            log.info("eviction", extra={"pod": f"{namespace}/{name}", "result": outcome.result, "pdb": outcome.pdb})
        return remaining, refused

    @staticmethod
    def _cond(request: Mapping[str, Any], type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
        generation = int((request.get("metadata") or {}).get("generation") or 0)
        return {"type": type_, "status": status, "reason": reason, "message": message,
                "observedGeneration": generation}

    def _write(self, request: dict[str, Any], conditions: list[dict[str, Any]], now: float) -> None:
        status = dict(request.get("status") or {})
        before: list[dict[str, Any]] = list(status.get("conditions") or [])
        after = before
        for cond in conditions:
            after = set_condition(after, cond, now)
        if _same(before, after):
            return
        body = {**request, "status": {**status, "conditions": after}}
        meta = request.get("metadata") or {}
        self.client.replace(self.resource(), meta["name"], body, meta.get("namespace"), subresource="status")

    # ---- the controller ---------------------------------------------------------------------------

    def start(self) -> DrainWindowPlugin:
        ns = self.settings.namespace or None
        self.informer = Informer(self.client, self.resource(), ns)
        self.informer.add_handler(on_add=self._enqueue, on_update=lambda _old, new: self._enqueue(new))
        self.informer.start()
        for target in (self._work, self._resync):
            thread = threading.Thread(target=target, name=f"drain-window-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the informer and the threads, waiting ``timeout`` for all of them together."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self.queue.shutdown()
        if self.informer is not None:
            self.informer.stop(timeout)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _enqueue(self, obj: dict[str, Any]) -> None:
        if not condition_is(obj, self.settings.complete_condition, "True"):
            self.queue.add(object_key(obj))

    def _resync(self) -> None:
        while not self._stop.wait(self.settings.resync_s):
            for obj in self.informer.list() if self.informer else []:
                self._enqueue(obj)

    def _work(self) -> None:
        run_worker(self.queue, self.reconcile, self._stop, what="drain-window")

# ---- the command ----------------------------------------------------------------------------------


class DeprecatedAlias(argparse.Action):
    """An old spelling of a flag that still works and says, once on stderr, which flag replaced it."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, replaced_by: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.replaced_by = replaced_by

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated: use {self.replaced_by}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("--days", default="Mon,Tue,Wed,Thu,Fri", help="weekdays the window opens, e.g. Mon,Tue or Sat-Sun")
    p.add_argument("--hours", default="00:00-24:00", help="HH:MM-HH:MM; may cross midnight (22:00-06:00)")
    p.add_argument("--timezone", default="UTC", help="IANA time zone of --days/--hours (default UTC)")
    p.add_argument("--request-namespace", default="", metavar="NS",
                   help="only requests in this namespace (default: all); not -n/--namespace, which everywhere "
                        "else names the controller's namespace")
    p.add_argument("--namespace", dest="request_namespace", action=DeprecatedAlias, default=argparse.SUPPRESS,
                   metavar="NS", replaced_by="--request-namespace",
                   help="deprecated: the old spelling of --request-namespace (still works)")
    p.add_argument("--api-version", default=PluginSettings.api_version, help="API version of the request kind")
    p.add_argument("--kind", default=PluginSettings.kind, help="the request kind (plural from discovery)")
    p.add_argument("--complete-condition", default=DRAIN_COMPLETE, help="condition set True when drained")
    p.add_argument("--retry", default="5s", help="recheck interval while pods terminate or a PDB refuses")
    p.add_argument("--resync", default="60s", help="how often every request is looked at again")
    add_log_flags(p)


def settings_from_args(args: argparse.Namespace) -> tuple[Window, PluginSettings]:
    window = Window.parse(args.days, args.hours, args.timezone)
    settings = PluginSettings(api_version=args.api_version, kind=args.kind, namespace=args.request_namespace,
                              complete_condition=args.complete_condition,
                              retry_s=parse_duration(args.retry, "--retry"),
                              resync_s=parse_duration(args.resync, "--resync"))
    return window, settings


def main(args: argparse.Namespace, shutdown: Shutdown | None = None) -> int:
    shutdown = (shutdown or Shutdown()).install()
    try:
        window, settings = settings_from_args(args)
    except (WindowError, SettingsError) as exc:
        print(f"gpuremediate plugin drain-window: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_format, args.log_level)
    client = KubeClient(load_config(args.kubeconfig, args.context))
    plugin = DrainWindowPlugin(client, window, settings)
    while not shutdown.requested:
        try:
            plugin.start()
            break
        except errors.NotFound as exc:  # the CRD is not installed yet
            log.warning("request kind not served yet; retrying", extra={"error": str(exc)})
            shutdown.wait(5.0)
    else:
        return 0
    log.info("drain-window plugin running", extra={"window": window.text, "kind": settings.kind})
    shutdown.wait()
    plugin.stop()
    return 0
