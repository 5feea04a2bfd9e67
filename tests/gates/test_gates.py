"""Drain gates (pure) and the Prometheus alerts reader they use."""

from __future__ import annotations

import json

import pytest

from gpuremediate.policy import gates
from gpuremediate.policy.selector import parse_selector
from gpuremediate.signals.alerts import AlertsError, AlertsReader, firing_names
from gpuremediate.vocab.record import OUTCOME_REPAIR_FAILED, OUTCOME_REPAIRED, HistoryEntry

# The shape of Prometheus' documented GET /api/v1/alerts answer (prometheus.io, HTTP API, "Alerts").
ALERTS = {
    "status": "success",
    "data": {"alerts": [
        {"activeAt": "2018-07-04T20:27:12.60602144+02:00", "annotations": {}, "labels": {"alertname": "my-alert"},
         "state": "firing", "value": "1e+00"},
        {"activeAt": "2018-07-04T20:27:12.6+02:00", "annotations": {}, "labels": {"alertname": "slow-burn"},
         "state": "pending", "value": "1e+00"},
    ]},
}


def pod(name: str, labels: dict[str, str], phase: str = "Running", deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "team", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def test_firing_alerts_only_and_pending_ignored() -> None:
    assert firing_names(json.dumps(ALERTS).encode()) == {"my-alert"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>", "not JSON"),
        (b'{"status":"error","errorType":"bad_data","error":"nope"}', "alerts query failed: bad_data: nope"),
        (b'{"status":"success","data":{}}', "no data.alerts list"),
    ],
)
def test_unusable_alerts_answers_are_named(body: bytes, message: str) -> None:
    with pytest.raises(AlertsError, match=message):
        firing_names(body)


@pytest.mark.parametrize(
    ("firing", "names", "expected"),
    [
        ({"my-alert"}, ["my-alert", "other"], "blocking alert firing: my-alert"),
        ({"unrelated"}, ["my-alert"], ""),
        (None, ["my-alert"], "blocking alerts unknown (boom): waiting"),
        (None, [], ""),  # no blocking alerts configured: the gate is off even without Prometheus
    ],
)
def test_alert_gate(firing: set[str] | None, names: list[str], expected: str) -> None:
    assert gates.blocking_alerts(firing, names, "boom") == expected


def test_reader_caches_and_remembers_a_failure() -> None:
    calls: list[str] = []
    answers = [OSError("connection refused"), json.dumps(ALERTS).encode()]
    now = [0.0]

    def fetch(url: str, _timeout: float) -> bytes:
        calls.append(url)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    reader = AlertsReader("http://prom:9090/", ttl_s=10, fetch=fetch, clock=lambda: now[0])
    firing, why = reader.firing()
    assert firing is None and "connection refused" in why and "http://prom:9090/api/v1/alerts" in why
    assert reader.firing()[0] is None and len(calls) == 1  # within the TTL: no second request
    now[0] = 10.0
    assert reader.firing() == ({"my-alert"}, "")
    assert len(calls) == 2


def test_reader_refuses_a_non_http_url() -> None:
    with pytest.raises(AlertsError, match="must start with http"):
        AlertsReader("ftp://prom")


def test_blocking_pods_name_running_matches_only() -> None:
    selectors = [("app=backup", parse_selector("app=backup")), ("critical", parse_selector("critical"))]
    pods = [
        pod("b1", {"app": "backup"}),
        pod("b2", {"app": "backup"}, phase="Succeeded"),
        pod("b3", {"app": "backup"}, deleting=True),
        pod("c1", {"critical": "yes"}),
        pod("t1", {"app": "train"}),
    ]
    assert gates.blocking_pods(pods, selectors) == "blocking pods running: team/b1 (app=backup), team/c1 (critical)"
    assert gates.blocking_pods(pods[4:], selectors) == ""


def test_settle_delay_counts_from_the_last_repaired_return() -> None:
    histories = [
        [HistoryEntry(at=100.0, kind="xid", code="79", action="reboot", outcome=OUTCOME_REPAIRED)],
        [HistoryEntry(at=500.0, kind="xid", code="48", action="reset-gpu", outcome=OUTCOME_REPAIR_FAILED)],
        [HistoryEntry(at=300.0, kind="ecc", code="dbe", action="reset-gpu", outcome=OUTCOME_REPAIRED)],
    ]
    returned = gates.last_return(histories)
    assert returned == 300.0
    assert gates.settle_remaining(returned, 400.0, 300.0) == 200.0
    assert gates.settle_remaining(returned, 700.0, 300.0) == 0.0
    assert gates.settle_remaining(returned, 400.0, 0.0) == 0.0  # off by default
    assert gates.settle_remaining(None, 400.0, 300.0) == 0.0
    assert gates.settle_reason(200.0, 300.0) == "settling: a node returned less than 300s ago (200s left)"
