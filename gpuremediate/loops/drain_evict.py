"""The built-in drain: evict (or wait for, or delete) the drain's pods as ``[drain]`` modes say.

Each step reads the node's pods (from a watch of that node's pods, started with the drain: no LIST per retry; a
LIST confirms that none is left before the drain is done), sends an eviction for each Immediate pod that has
none in flight, records the answers of those sent earlier — a PDB's refusal names the PDB in ``blocked`` — and
requeues; an answer requeues the node too. Evictions run in a pool shared by every node the loop drains
(``EVICTIONS_IN_FLIGHT`` at once), so a burst of drains is not one round trip after another: the loop's one
thread only decides and sends, as kubectl drain sends one eviction per pod at once. At the drain's timeout the
pods whose mode is DeleteAfterTimeout are deleted and waited for; any other pod left fails the drain.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

from gpuremediate.actions import evict as eviction
from gpuremediate.actions.events import WARNING
from gpuremediate.actions.nodes import Node, is_ready, name_of
from gpuremediate.actions.pods import is_terminating, pod_key
from gpuremediate.actions.workload_notice import WorkloadNotice, why_of
from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ConfigError, parse_rfc3339
from gpuremediate.kube.resources import PODS
from gpuremediate.loops.drainer import DrainContext
from gpuremediate.loops.step import CONFLICT, Done, Failed, InProgress, StepResult
from gpuremediate.policy.config import Policy
from gpuremediate.policy.workflow import DrainPolicy
from gpuremediate.vocab.record import BLOCK_PDB, NodeRecord, block, unblock

log = logging.getLogger("gpuremediate.loops.drain")  # the drain loop's logger, as before the split

EVICTIONS_IN_FLIGHT = 32  # evictions sent at once over all the nodes draining (the client's rate limit paces them)


def always(policy: Policy, record: NodeRecord) -> bool:
    """The table's last row (``loops.drainers``): the built-in drain takes any drain no other row took."""
    return True


class EvictionDrain:
    """The ``Drainer`` that evicts; one per drain loop (it paces eviction attempts per pod)."""

    def __init__(self) -> None:
        self._next_attempt: dict[str, float] = {}  # pod uid -> monotonic time of its next eviction attempt
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        # node -> its evictions sent and not yet recorded: pod uid -> the answer to come
        self._sent: dict[str, dict[str, Future[eviction.EvictionOutcome | BaseException]]] = {}
        self.notice = WorkloadNotice()
        self._waiting: dict[str, int] = {}  # node -> the pod count its last "waiting" line gave
        self._refused: dict[str, set[tuple[str, str]]] = {}  # node -> pods whose eviction was last refused

    def close(self) -> None:
        """No eviction is sent after this; those in flight end on their own (their answers are not recorded)."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
            self._sent.clear()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def step(self, ctx: DrainContext, node: Node, record: NodeRecord) -> StepResult:
        policy = ctx.policy.drain
        now = ctx.clock()
        pods = ctx.targets(node, record)
        if not pods:  # the watch shows none left: the API server says whether that is so (a cache may lag)
            pods = ctx.targets(node, record, confirm=True)
        if not pods:
            ctx.stop_watching(name_of(node))
            self._answers(ctx, node, wait=True)  # counted and logged; the pods are gone either way
            return Done(at=now)
        assert record.action is not None
        if record.action.deadline is not None and now >= record.action.deadline:
            return self._timed_out(ctx, node, record, pods, now, policy)
        immediate = [p for p in pods if policy.mode_of(pod_key(p)[0]) == "Immediate"]
        if immediate:  # the others (AllowCompletion, DeleteAfterTimeout) are waited for meanwhile
            return self._evict(ctx, node, record, immediate, now, policy)
        return self._note_waiting(node, pods, policy)

    def _timed_out(self, ctx: DrainContext, node: Node, record: NodeRecord, pods: Sequence[Mapping[str, Any]],
                   now: float, policy: DrainPolicy) -> StepResult:
        """At the drain's timeout: pods whose mode is DeleteAfterTimeout (all of them with ``timeout_action =
        delete``) are deleted and waited for; any other pod left fails the drain (quarantine: a person decides)."""
        deletable = [p for p in pods if policy.timeout_action == "delete"
                     or policy.mode_of(pod_key(p)[0]) == "DeleteAfterTimeout"]
        if policy.pod_events:
            self.notice.tell(ctx.events, record, [p for p in deletable if not is_terminating(p)],
                             why_of(name_of(node), record, "deleted at the end of gpuremediate's drain timeout"))
        self._delete(ctx, deletable, policy)
        left = [p for p in pods if p not in deletable]
        if left:
            names = ", ".join("/".join(pod_key(p)) for p in left[:5])
            return Failed(f"drain timed out with {len(left)} pod(s) left ({names})", at=now)
        stuck = [p for p in pods if stuck_terminating(p, now, policy.stuck_s)]
        if stuck:
            return self._end_stuck(ctx, node, stuck, now)
        return self._note_waiting(node, pods, policy)

    def _end_stuck(self, ctx: DrainContext, node: Node, stuck: Sequence[Mapping[str, Any]], now: float) -> StepResult:
        """Pods deleted at the timeout that stay Terminating past their grace and ``stuck_s``. On a NotReady node
        (its kubelet cannot confirm anything) they are force-deleted once, as the pod garbage collector does for an
        out-of-service node; what remains (a finalizer, a D-state process a reboot ends) no longer holds the drain:
        it is done, the repair follows, and an Event names the pods."""
        name = name_of(node)
        force = [p for p in stuck if not is_ready(node) and not _forced(p)]
        if force:
            log.warning("force-deleting pods stuck terminating on a NotReady node",
                        extra={"node": name, "pods": len(force)})
            for pod in force:
                namespace, pod_name = pod_key(pod)
                with contextlib.suppress(errors.NotFound):
                    ctx.client.delete(PODS, pod_name, namespace, grace_period_seconds=0, dry_run=ctx.writer.dry_run)
            return InProgress(1.0)
        names = ", ".join("/".join(pod_key(p)) for p in stuck[:5])
        message = (f"drain timed out; {len(stuck)} pod(s) stuck terminating past their grace period ({names}): "
                   f"going on to the repair")
        log.warning("drain ends with pods stuck terminating", extra={"node": name, "pods": names})
        with self._lock:
            self._waiting.pop(name, None)
        return Done(at=now, then=lambda: ctx.events.node_event(name, "GPUDrainTimedOut", message, WARNING))

    def _evict(self, ctx: DrainContext, node: Node, record: NodeRecord, pods: Sequence[Mapping[str, Any]],
               now: float, policy: DrainPolicy) -> StepResult:
        grace = None if policy.grace_period_s < 0 else policy.grace_period_s
        name = name_of(node)
        sent = self._in_flight(name)
        due = [p for p in pods if not is_terminating(p) and pod_uid(p) not in sent
               and self._attempt_due(p, policy.retry_s)]
        if policy.pod_events and not self._closed:
            self.notice.tell(ctx.events, record, due, why_of(name, record, "evicted by gpuremediate's drain"))
        self._send(ctx, name, due, grace)
        answers = self._answers(ctx, node)  # those of earlier steps, and of this one's that came already
        if not answers:
            return InProgress(policy.retry_s)  # nothing new learnt: keep what the record says
        blocked = next((a for a in answers if a.result in (eviction.BLOCKED, eviction.FAILED)), None)
        # The block stays while a refused pod is still there: another pod's eviction answered later lifts nothing.
        with self._lock:  # keep_only (a resync, another worker) prunes these maps
            refused = self._refused.setdefault(name, set())
            for answer in answers:
                (refused.add if answer.result in (eviction.BLOCKED, eviction.FAILED) else refused.discard)(
                    (answer.namespace, answer.name))
            refused &= {pod_key(p) for p in pods}
        after = record if blocked is None and refused else unblock(record)
        if blocked is not None:
            detail = f"{blocked.namespace}/{blocked.pdb}" if blocked.pdb else \
                f"{blocked.namespace}/{blocked.name}: {blocked.message}"
            after = block(record, BLOCK_PDB, detail, now)
        if after != record and ctx.writer.write(node, after) is None:
            return CONFLICT
        return InProgress(policy.retry_s)

    def _send(self, ctx: DrainContext, node: str, pods: Sequence[Mapping[str, Any]], grace: int | None) -> None:
        """An eviction per pod into the shared pool, each in a copy of this thread's context (the shard fence knows
        which node it is for); its answer requeues the node. A client that cannot watch (replay's cluster, whose
        clock only the replay moves) is asked here, one pod after another, as before the pool."""
        if not callable(getattr(ctx.client, "watch", None)):
            self._send_inline(ctx, node, pods, grace)
            return
        with self._lock:
            if self._closed or not pods:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(EVICTIONS_IN_FLIGHT, thread_name_prefix="evict")
            mine = self._sent.setdefault(node, {})
            for pod in pods:
                future = self._pool.submit(contextvars.copy_context().run, _evict_one, ctx.client, pod,
                                           ctx.writer.dry_run, grace)
                mine[pod_uid(pod)] = future
                future.add_done_callback(functools.partial(_requeue, ctx, node))

    def _send_inline(self, ctx: DrainContext, node: str, pods: Sequence[Mapping[str, Any]], grace: int | None) -> None:
        for pod in pods:
            answered: Future[eviction.EvictionOutcome | BaseException] = Future()
            answered.set_result(_evict_one(ctx.client, pod, ctx.writer.dry_run, grace))
            with self._lock:
                self._sent.setdefault(node, {})[pod_uid(pod)] = answered

    def _in_flight(self, node: str) -> set[str]:
        with self._lock:
            return set(self._sent.get(node, {}))

    def _answers(self, ctx: DrainContext, node: Node, wait: bool = False) -> list[eviction.EvictionOutcome]:
        """The answers to the node's evictions that have come (all of them with ``wait``), counted and logged
        here, in the loop's thread. An eviction that got no answer (a transport error, a write the shard fence
        refused, one cancelled at shutdown) is logged and counted as an API error, not recorded: the pod's next
        attempt, after the drain's ``retry_s``, sends it again."""
        name = name_of(node)
        with self._lock:
            mine = self._sent.get(name, {})
            ready = {uid: f for uid, f in mine.items() if wait or f.done()}
            for uid in ready:
                del mine[uid]
            if not mine:
                self._sent.pop(name, None)
        dry = "true" if ctx.writer.dry_run else "false"
        answers: list[eviction.EvictionOutcome] = []
        for future in ready.values():
            answer = _answer(future)
            if isinstance(answer, BaseException):  # not answered (the pod's next attempt retries it): no record
                if isinstance(answer, errors.KubeError):
                    ctx.metrics.count_api_error(answer)
                log.warning("eviction not answered; retried", extra={"node": name, "error": str(answer)})
                continue
            ctx.metrics.evictions.inc(result=answer.result, dry_run=dry)
            log.info("eviction", extra={"node": name, "pod": f"{answer.namespace}/{answer.name}",
                                        "result": answer.result, "pdb": answer.pdb, "dry_run": dry})
            answers.append(answer)
        return answers

    def keep_only(self, nodes: set[str]) -> None:
        """Forget the evictions of nodes no longer draining (a person's uncordon, a drain that failed)."""
        with self._lock:
            for name in set(self._sent) - nodes:
                del self._sent[name]
            for name in set(self._waiting) - nodes:
                del self._waiting[name]
            for name in set(self._refused) - nodes:
                del self._refused[name]

    def _attempt_due(self, pod: Mapping[str, Any], retry_s: float) -> bool:
        """One eviction attempt per pod per ``retry_s``, however often the node is reconciled
        (informer events, resyncs and requeues all queue it)."""
        uid = pod_uid(pod)
        now = time.monotonic()
        with self._lock:
            if now < self._next_attempt.get(uid, 0.0):
                return False
            self._next_attempt = {k: t for k, t in self._next_attempt.items() if t > now}
            self._next_attempt[uid] = now + retry_s
        return True

    def _note_waiting(self, node: Node, pods: Sequence[Mapping[str, Any]], policy: DrainPolicy) -> StepResult:
        """Waiting for pods to go: one line when the count changes, not one per step."""
        name = name_of(node)
        with self._lock:
            told, self._waiting[name] = self._waiting.get(name), len(pods)
        if told != len(pods):
            log.info("drain waiting for pods to finish", extra={"node": name, "pods": len(pods)})
        return InProgress(policy.retry_s)

    @staticmethod
    def _delete(ctx: DrainContext, pods: Sequence[Mapping[str, Any]], policy: DrainPolicy) -> None:
        grace = None if policy.grace_period_s < 0 else policy.grace_period_s
        for pod in pods:
            if is_terminating(pod):
                continue
            namespace, name = pod_key(pod)
            with contextlib.suppress(errors.NotFound):
                ctx.client.delete(PODS, name, namespace, grace_period_seconds=grace, dry_run=ctx.writer.dry_run)


def stuck_terminating(pod: Mapping[str, Any], now: float, stuck_s: float) -> bool:
    """Deleted, and still there ``stuck_s`` after its ``deletionTimestamp`` (the end of its grace period)."""
    text = (pod.get("metadata") or {}).get("deletionTimestamp")
    if not text:
        return False
    try:
        due = parse_rfc3339(str(text))
    except ConfigError:
        return False
    return now >= due + stuck_s


def _forced(pod: Mapping[str, Any]) -> bool:
    return (pod.get("metadata") or {}).get("deletionGracePeriodSeconds") == 0


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "/".join(pod_key(pod)))


def _evict_one(client: KubeClient, pod: Mapping[str, Any], dry_run: bool,
               grace: int | None) -> eviction.EvictionOutcome | BaseException:
    """One eviction's answer, or what kept it from being answered (returned: it is told in the loop's thread)."""
    try:
        return eviction.evict(client, pod, dry_run=dry_run, grace_period_seconds=grace)
    except (errors.KubeError, OSError) as exc:
        return exc


def _requeue(ctx: DrainContext, node: str, _answered: Future[eviction.EvictionOutcome | BaseException]) -> None:
    ctx.requeue(node)


def _answer(future: Future[eviction.EvictionOutcome | BaseException]) -> eviction.EvictionOutcome | BaseException:
    try:
        return future.result()
    except CancelledError as exc:  # shut down before it was sent
        return exc
