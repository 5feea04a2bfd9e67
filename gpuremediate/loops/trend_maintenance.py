"""Trend maintenance (issue 29): a failing trend becomes a MaintenanceRequest whose drain starts when the next trend
window opens (``[degradation] trend_action = "maintenance"``); never an immediate drain.

Level-triggered, from the detect pass: a healthy node showing trends its policy schedules gets one request, unless

- one of the node's requests (anyone's) is not finished: that maintenance comes first, the trends are looked at
  again after it;
- our requests for the node already cover every trend it shows (``TRENDS_ANNOTATION`` lists the trends'
  fingerprints; a finished request counts, so a trend that outlives its maintenance is not scheduled twice).

The request's name comes from the node and its trends, so filing it again (a restart, a stale cache, another
replica) is a 409 and nothing more. From there it is an ordinary MaintenanceRequest (loops/maintenance.py):
claimed on the Node, prepared ``prepare_lead_s`` before its ``startTime`` — which is therefore the window's
opening plus that lead, so the cordon and drain start inside the window — within the budget, then the
recommended action, validation, and back. Deleting it cancels it as any request. A dry run files nothing: an
Event says what it would file.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuremediate.actions.events import NORMAL, WARNING
from gpuremediate.kube import errors
from gpuremediate.kube.cache import Informer
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import Resource
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.signals.model import NodeReadings
from gpuremediate.state import maintenance as mr
from gpuremediate.vocab.degradation import DegradationPolicy
from gpuremediate.vocab.findings import KIND_TREND, Finding

log = logging.getLogger(__name__)

TRENDS_ANNOTATION = "gpuremediate.io/trends"  # the trend fingerprints a request of ours was filed for
FILED_FOR_LABEL = "gpuremediate.io/filed-for"
FILED_FOR_TREND = "trend"
CHECK_NAME = "gpuremediate-trend"
NAME_PREFIX = "trend-"
MAX_NAME = 253
EventSink = Callable[[str, str, str, str], object]  # (node, reason, message, type)


def request_name(node: str, fingerprints: Sequence[str]) -> str:
    """``trend-<node>-<digest of node and trends>``, a DNS subdomain however long the node's name."""
    digest = hashlib.sha256("\n".join([node, *sorted(fingerprints)]).encode()).hexdigest()[:10]
    room = MAX_NAME - len(NAME_PREFIX) - len(digest) - 1
    return f"{NAME_PREFIX}{node[:room].rstrip('.-')}-{digest}"


def drain_start(policy: DegradationPolicy, now: float) -> float:
    """When the next trend window opens (now, while one is open)."""
    return policy.trend_window().next_opening(now)


def request_body(res: Resource, node: str, trends: Sequence[Finding], readings: NodeReadings | None,
                 policy: DegradationPolicy, start_time: float) -> dict[str, Any]:
    fingerprints = sorted(f.fingerprint for f in trends)
    message = "; ".join(f.message for f in trends)
    return {
        "apiVersion": res.api_version, "kind": mr.KIND,
        "metadata": {
            "name": request_name(node, fingerprints),
            "labels": {"app.kubernetes.io/managed-by": "gpuremediate", FILED_FOR_LABEL: FILED_FOR_TREND},
            "annotations": {TRENDS_ANNOTATION: ",".join(fingerprints)},
        },
        "spec": {
            "startTime": mr.rfc3339(start_time),
            "healthEvent": {
                "nodeName": node, "isHealthy": False, "isFatal": False, "agent": "gpuremediate",
                "componentClass": "GPU", "checkName": CHECK_NAME, "recommendedAction": policy.trend_recommended,
                "message": f"failing trend: {message}"[:4096],
                "errorCode": sorted({f.code for f in trends}),
                "entitiesImpacted": [{"entityType": "GPU", "entityValue": gpu}
                                     for gpu in _gpu_entities(trends, readings)],
            },
        },
    }


def _gpu_entities(trends: Sequence[Finding], readings: NodeReadings | None) -> list[str]:
    """The trends' GPUs as the maintenance loop matches them: the UUID (a GPU's key when known), else the index."""
    entity = {g.key: g.uuid or g.gpu for g in readings.gpus} if readings is not None else {}
    return sorted({entity.get(key) or key for f in trends for key in f.gpus})


def trend_since(finding: Finding) -> float:
    """When the trend began: the last part of its fingerprint (``trend:<code>:<gpu>:<since>``)."""
    try:
        return float(finding.fingerprint.rpartition(":")[2])
    except ValueError:
        return float("inf")  # not one of ours: never taken for served


def covered(requests: Sequence[Mapping[str, Any]]) -> set[str]:
    """The trend fingerprints our requests for a node were filed for."""
    out: set[str] = set()
    for obj in requests:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        out.update(fp for fp in str(annotations.get(TRENDS_ANNOTATION, "")).split(",") if fp)
    return out


def unfinished(obj: Mapping[str, Any]) -> bool:
    """A request that still has the node (or will): not finished, not rejected, not being deleted."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (obj.get("status") or {}).get("phase") not in (*mr.TERMINAL_PHASES, mr.REJECTED)


class TrendMaintenance:
    """Files the MaintenanceRequests of trends; the maintenance loop's informer is its memory."""

    def __init__(self, client: KubeClient, res: Resource, requests: Informer, metrics: ControllerMetrics,
                 events: EventSink, prepare_lead: Callable[[], float], *, dry_run: bool = False) -> None:
        self.client = client
        self.prepare_lead = prepare_lead  # [maintenance] prepare_lead_s, read at each filing (a policy reload)
        self.res = res
        self.requests = requests
        self.metrics = metrics
        self.events = events
        self.dry_run = dry_run
        self._said: set[str] = set()  # request names a dry run or a refusal has already told of (once each)

    def schedule(self, node: str, findings: Sequence[Finding], readings: NodeReadings | None,
                 policy: DegradationPolicy, now: float, served_at: float = 0.0) -> str:
        """File the request the node's trends need now; its name, or "" when none is filed. ``served_at``: when the
        node's last maintenance flow ended (its record's history): a trend that began before it was served, even
        if its request has since been deleted."""
        if not self.requests.has_synced():
            return ""  # not knowing the node's requests, one could be filed twice under different trends
        mine = [obj for obj in self.requests.list() if mr.node_name_of(obj) == node]
        if any(unfinished(obj) for obj in mine):
            return ""
        done = covered([obj for obj in mine if _ours(obj)])
        trends = [f for f in findings if f.kind == KIND_TREND and f.fingerprint not in done
                  and trend_since(f) >= served_at]
        if not trends:
            return ""
        start = drain_start(policy, now)
        body = request_body(self.res, node, trends, readings, policy, start + self.prepare_lead())
        return self._file(node, body, start, policy)

    def _file(self, node: str, body: dict[str, Any], start: float, policy: DegradationPolicy) -> str:
        name = body["metadata"]["name"]
        when = (f"its drain starts {mr.rfc3339(start)} (window {policy.trend_window().text}), then "
                f"{policy.trend_recommended}")
        if self.dry_run:
            if name not in self._said:
                self._said.add(name)
                self.metrics.trend_requests.inc(result="dry_run")
                self.events(node, "GPUTrendMaintenanceScheduled", f"would file MaintenanceRequest {name}: {when}",
                            NORMAL)
            return name
        try:
            self.client.create(self.res, body)
        except errors.AlreadyExists:
            return name  # filed already (the cache had not shown it yet)
        except (errors.Invalid, errors.Forbidden) as exc:
            self.metrics.trend_requests.inc(result="refused")
            if name not in self._said:
                self._said.add(name)
                log.error("trend maintenance: the API server refused the MaintenanceRequest",
                          extra={"node": node, "request": name, "error": str(exc)})
                self.events(node, "GPUTrendMaintenanceFailed", f"MaintenanceRequest {name} refused: {exc}", WARNING)
            return ""
        self.metrics.trend_requests.inc(result="filed")
        log.info("trend maintenance filed", extra={"node": node, "request": name, "drain_start": mr.rfc3339(start)})
        self.events(node, "GPUTrendMaintenanceScheduled", f"filed MaintenanceRequest {name}: {when}", NORMAL)
        return name


def _ours(obj: Mapping[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(FILED_FOR_LABEL) == FILED_FOR_TREND
