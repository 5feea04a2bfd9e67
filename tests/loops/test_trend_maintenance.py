"""Trend maintenance's decisions (loops/trend_maintenance.py): when a request is filed, its name, its body."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuremediate.kube import errors
from gpuremediate.kube.resources import Resource
from gpuremediate.loops.trend_maintenance import (
    FILED_FOR_LABEL,
    TRENDS_ANNOTATION,
    TrendMaintenance,
    request_name,
)
from gpuremediate.obs.controller_metrics import ControllerMetrics
from gpuremediate.policy.config import PolicyError, loads_policy
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings
from gpuremediate.state.maintenance import parse_time
from gpuremediate.vocab.degradation import DegradationPolicy
from gpuremediate.vocab.findings import KIND_SLOW_GPU, KIND_TREND, Finding

MRS = Resource("gpuremediate.io", "v1alpha1", "maintenancerequests", "MaintenanceRequest", False)
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# Wednesday 2026-12-02 10:00 UTC: the default window (Sat,Sun 02:00-06:00 UTC) next opens Saturday 02:00.
WEDNESDAY = datetime(2026, 12, 2, 10, 0, tzinfo=UTC).timestamp()
SATURDAY_2AM = datetime(2026, 12, 5, 2, 0, tzinfo=UTC).timestamp()
POLICY = DegradationPolicy(trends=True, trend_action="maintenance")


def trend(gpu: str = "3", code: str = "sbe-rate", since: float = 100.0) -> Finding:
    return Finding("n1", KIND_TREND, code, (gpu,), "none", f"trend:{code}:{gpu}:{since:.3f}",
                   f"GPU {gpu}: {code}", urgent=False)


class Requests:
    """The maintenance loop's informer, as the scheduler reads it."""

    def __init__(self, *objs: dict[str, Any], synced: bool = True) -> None:
        self.objs = list(objs)
        self.synced = synced

    def has_synced(self) -> bool:
        return self.synced

    def list(self) -> list[dict[str, Any]]:
        return list(self.objs)


class Client:
    def __init__(self, fail: Exception | None = None) -> None:
        self.created: list[dict[str, Any]] = []
        self.fail = fail

    def create(self, res: Resource, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.created.append(body)
        return body


def scheduler(requests: Requests, client: Client, *, dry_run: bool = False
              ) -> tuple[TrendMaintenance, list[tuple[str, str, str, str]], ControllerMetrics]:
    events: list[tuple[str, str, str, str]] = []
    metrics = ControllerMetrics()
    made = TrendMaintenance(client, MRS, requests, metrics,  # type: ignore[arg-type]
                            lambda *e: events.append(e), lambda: 1800.0, dry_run=dry_run)
    return made, events, metrics


def readings() -> NodeReadings:
    gpus = tuple(GpuReading(node="n1", gpu=str(i), uuid=f"GPU-uuid-{i}", model="H100") for i in range(8))
    return NodeReadings(node="n1", source="exporter", status=SOURCE_OK, gpus=gpus)


def request(node: str, *, phase: str = "", ours: bool = False, trends: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"mr-{node}-{phase or 'new'}"}
    if ours:
        meta["labels"] = {FILED_FOR_LABEL: "trend"}
        meta["annotations"] = {TRENDS_ANNOTATION: trends}
    return {"metadata": meta, "spec": {"healthEvent": {"nodeName": node}}, "status": {"phase": phase} if phase else {}}


def test_a_trend_files_one_request_starting_at_the_window_opening_plus_the_lead() -> None:
    client = Client()
    made, events, metrics = scheduler(Requests(), client)
    name = made.schedule("n1", [trend("GPU-uuid-3")], readings(), POLICY, WEDNESDAY)
    [body] = client.created
    assert body["metadata"]["name"] == name and name.startswith("trend-n1-")
    assert parse_time(body["spec"]["startTime"], "startTime") == SATURDAY_2AM + 1800.0
    event = body["spec"]["healthEvent"]
    assert event["nodeName"] == "n1" and event["isHealthy"] is False
    assert event["recommendedAction"] == "COMPONENT_RESET"
    assert event["entitiesImpacted"] == [{"entityType": "GPU", "entityValue": "GPU-uuid-3"}]
    assert body["metadata"]["annotations"][TRENDS_ANNOTATION] == "trend:sbe-rate:GPU-uuid-3:100.000"
    assert [e[1] for e in events] == ["GPUTrendMaintenanceScheduled"] and "2026-12-05T02:00:00Z" in events[0][2]
    assert metrics.trend_requests.value(result="filed") == 1


def test_a_gpu_without_uuid_is_filed_by_its_index() -> None:
    client = Client()
    made, _, _ = scheduler(Requests(), client)
    no_uuid = NodeReadings(node="n1", source="exporter", status=SOURCE_OK,
                           gpus=(GpuReading(node="n1", gpu="5", uuid="", model="H100"),))
    made.schedule("n1", [trend("n1/gpu5")], no_uuid, POLICY, WEDNESDAY)
    assert client.created[0]["spec"]["healthEvent"]["entitiesImpacted"] == [{"entityType": "GPU",
                                                                              "entityValue": "5"}]


def test_no_request_while_any_request_for_the_node_is_unfinished_or_the_cache_unsynced() -> None:
    for requests in (Requests(request("n1", phase="Pending")), Requests(request("n1")), Requests(synced=False)):
        client = Client()
        made, events, _ = scheduler(requests, client)
        assert made.schedule("n1", [trend()], readings(), POLICY, WEDNESDAY) == ""
        assert client.created == [] and events == []


def test_a_finished_request_of_ours_covers_its_trends_and_only_new_ones_are_filed() -> None:
    old = trend(since=100.0)
    done = request("n1", phase="Completed", ours=True, trends=old.fingerprint)
    someone_elses = request("n1", phase="Completed", trends="")
    client = Client()
    made, _, _ = scheduler(Requests(done, someone_elses, request("n2", phase="Pending")), client)
    assert made.schedule("n1", [old], readings(), POLICY, WEDNESDAY) == ""
    new = trend("GPU-uuid-1", "remapped-rows", since=500.0)
    made.schedule("n1", [old, new, Finding("n1", KIND_SLOW_GPU, "sm-clock", ("0",), "cordon", "slow", "x")],
                  readings(), POLICY, WEDNESDAY)
    [body] = client.created
    assert body["metadata"]["annotations"][TRENDS_ANNOTATION] == new.fingerprint
    assert body["spec"]["healthEvent"]["errorCode"] == ["remapped-rows"]


def test_filing_again_is_a_conflict_and_nothing_more() -> None:
    exists = errors.AlreadyExists(409, {"reason": "AlreadyExists", "message": "exists"})
    made, events, metrics = scheduler(Requests(), Client(exists))
    assert made.schedule("n1", [trend()], readings(), POLICY, WEDNESDAY).startswith("trend-n1-")
    assert events == [] and metrics.trend_requests.value(result="filed") == 0


def test_a_refused_request_is_said_once_and_retried() -> None:
    client = Client(errors.Invalid(422, {"reason": "Invalid", "message": "spec.healthEvent.message: Too long"}))
    made, events, metrics = scheduler(Requests(), client)
    for _ in range(3):
        assert made.schedule("n1", [trend()], readings(), POLICY, WEDNESDAY) == ""
    assert [e[1] for e in events] == ["GPUTrendMaintenanceFailed"] and "Too long" in events[0][2]
    assert metrics.trend_requests.value(result="refused") == 3


def test_a_dry_run_files_nothing_and_says_so_once() -> None:
    client = Client()
    made, events, metrics = scheduler(Requests(), client, dry_run=True)
    for _ in range(2):
        made.schedule("n1", [trend()], readings(), POLICY, WEDNESDAY)
    assert client.created == [] and len(events) == 1 and "would file" in events[0][2]
    assert metrics.trend_requests.value(result="dry_run") == 1


def test_an_open_window_starts_the_drain_now() -> None:
    client = Client()
    made, _, _ = scheduler(Requests(), client)
    policy = DegradationPolicy(trends=True, trend_action="maintenance", trend_window_days="Mon-Sun",
                               trend_window_hours="00:00-24:00")
    made.schedule("n1", [trend()], readings(), policy, WEDNESDAY)
    assert parse_time(client.created[0]["spec"]["startTime"], "startTime") == WEDNESDAY + 1800.0


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=253),
       st.lists(st.text(min_size=1, max_size=40), max_size=4))
def test_request_names_are_dns_subdomains_and_differ_by_trend(node: str, fingerprints: list[str]) -> None:
    node = node.strip("-.") or "n"
    name = request_name(node, fingerprints)
    assert len(name) <= 253 and DNS_SUBDOMAIN.match(name)
    assert request_name(node, [*fingerprints, "another"]) != name


def test_a_bad_trend_window_is_a_policy_error_naming_the_setting() -> None:
    for setting, value, said in (("trend_window_days", "Someday", "weekday"),
                                 ("trend_window_hours", "06:00-06:00", "empty"),
                                 ("trend_window_zone", "Nowhere/City", "time zone")):
        try:
            loads_policy(f'[degradation]\n{setting} = "{value}"\n', "policy.toml")
        except PolicyError as exc:
            assert f"degradation.{setting}" in str(exc) and said in str(exc)
        else:
            raise AssertionError(f"{setting} = {value!r} was accepted")


def test_a_trend_that_began_before_the_nodes_last_maintenance_ended_was_served() -> None:
    client = Client()
    made, _, _ = scheduler(Requests(), client)
    assert made.schedule("n1", [trend(since=100.0)], readings(), POLICY, WEDNESDAY, served_at=200.0) == ""
    assert made.schedule("n1", [trend(since=300.0)], readings(), POLICY, WEDNESDAY, served_at=200.0) != ""
    assert len(client.created) == 1
