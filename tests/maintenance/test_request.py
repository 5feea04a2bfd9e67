"""MaintenanceRequests, the pure part: reading a request, its fault, its status from the node record."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.loops.maintenance import resolve_gpus
from gpuremediate.signals.model import GpuReading, NodeReadings
from gpuremediate.state import decide as d
from gpuremediate.state import maintenance as m
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states as s

START = 1_800_000_000.0


def obj(action: str = "NONE", **event: Any) -> dict[str, Any]:
    health = {"nodeName": "gpu-1", "isHealthy": False, "recommendedAction": action, "message": "window", **event}
    return {"metadata": {"name": "mr-1", "uid": "uid-1", "generation": 2, "creationTimestamp": "2027-01-15T08:00:00Z"},
            "spec": {"startTime": m.rfc3339(START), "healthEvent": health}}


@pytest.mark.parametrize(("recommended", "action"), [
    ("NONE", "none"), ("COMPONENT_RESET", "reset-gpu"), ("RESTART_VM", "reboot"), ("RESTART_BM", "reboot"),
    ("REPLACE_VM", "quarantine"), ("CONTACT_SUPPORT", "quarantine"),
])
def test_recommended_action_picks_the_path(recommended: str, action: str) -> None:
    req = m.parse_request(obj(recommended))
    assert (req.action, req.node, req.start, req.generation) == (action, "gpu-1", START, 2)
    assert req.fingerprint == "maintenance/mr-1/uid-1" and req.claim == "mr-1/uid-1"


def test_custom_takes_the_custom_action_name() -> None:
    assert m.parse_request(obj("CUSTOM", customRecommendedAction="vendor-fix")).action == "vendor-fix"
    with pytest.raises(m.RequestError, match="customRecommendedAction"):
        m.parse_request(obj("CUSTOM"))


def test_absent_action_is_none_and_absent_start_is_now() -> None:
    raw = obj()
    del raw["spec"]["healthEvent"]["recommendedAction"], raw["spec"]["startTime"]
    req = m.parse_request(raw)
    assert req.action == "none" and req.start is None and req.prepare_at(60) is None


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda o: o["spec"]["healthEvent"].update(isHealthy=True), "isHealthy"),
    (lambda o: o["spec"]["healthEvent"].pop("nodeName"), "nodeName"),
    (lambda o: o["spec"]["healthEvent"].update(recommendedAction="RUN_FIELDDIAG"), "recommendedAction"),
    (lambda o: o["spec"].update(startTime="tomorrow"), "startTime"),
    (lambda o: o["spec"].update(startTime="2027-01-15T08:00:00"), "time zone"),
    (lambda o: o["spec"].pop("healthEvent"), "healthEvent"),
    (lambda o: o["spec"]["healthEvent"].update(processingStrategy="STORE_ONLY"), "STORE_ONLY"),
])
def test_bad_requests_name_what_is_wrong(mutate: Any, field: str) -> None:
    raw = copy.deepcopy(obj())
    mutate(raw)
    with pytest.raises(m.RequestError, match=field):
        m.parse_request(raw)


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                    max_leaves=10))
def test_any_health_event_parses_or_raises_request_error(event: Any) -> None:
    raw = {"metadata": {"name": "x", "uid": "u"}, "spec": {"healthEvent": event}}
    with contextlib.suppress(m.RequestError):
        m.parse_request(raw)


def test_gpu_entities_resolve_by_uuid_or_index_and_unknown_means_all() -> None:
    gpus = (GpuReading("gpu-1", "0", uuid="GPU-a"), GpuReading("gpu-1", "3", uuid="GPU-d"))
    readings = NodeReadings("gpu-1", "exporter", gpus=gpus)
    req = m.parse_request(obj(entitiesImpacted=[{"entityType": "GPU", "entityValue": "3"},
                                                {"entityType": "GPU_UUID", "entityValue": "GPU-a"},
                                                {"entityType": "NVSWITCH", "entityValue": "0"}]))
    assert req.gpus == ("3", "GPU-a")
    assert resolve_gpus(req.gpus, readings) == ("GPU-a", "GPU-d")
    assert resolve_gpus(("GPU-zzz",), readings) == ()
    assert resolve_gpus(req.gpus, None) == ()


@settings(max_examples=100, deadline=None)
@given(starts=st.lists(st.none() | st.integers(0, 4_000_000_000), min_size=2, max_size=2),
       created=st.lists(st.integers(0, 4_000_000_000), min_size=2, max_size=2))
def test_which_request_starts_first_is_decided_one_way(starts: list[int | None], created: list[int]) -> None:
    """A claim yields to a request that starts earlier: never both ways (a claim would pass to and fro)."""
    a, b = (m.Request("a", "1", 1, float(c), "gpu-1", "NONE", "none", None if t is None else float(t), (), "")
            for t, c in zip(starts, created, strict=True))
    assert not (a.starts_before(b) and b.starts_before(a))
    asks = [t if t is not None else c for t, c in zip(starts, created, strict=True)]
    assert a.starts_before(b) == (asks[0] < asks[1])  # startTime; without one (now): its creation


def test_claims_round_trip_and_reject_garbage() -> None:
    assert m.parse_claim(m.claim_value("mr-1", "uid-1")) == ("mr-1", "uid-1")
    assert m.parse_claim("") is None and m.parse_claim("no-uid/") is None


# ---- status from the node record ------------------------------------------------------------


def flow(action: str = "none") -> tuple[m.Request, r.NodeRecord]:
    req = m.parse_request(obj({"none": "NONE", "reboot": "RESTART_BM", "quarantine": "REPLACE_VM"}[action]))
    entered = d.enter_maintenance(None, m.fault_for(req, (), START - 100), False, START - 100).record
    return req, d.start_maintenance(entered, False, START - 99).record


def test_progress_follows_the_record_for_a_none_request() -> None:
    req, draining = flow()
    prog = m.observe(req, draining, None, START - 100)
    assert prog.phase == m.PREPARING and prog.condition(m.PREPARED_COND).status == m.FALSE  # type: ignore[union-attr]
    waiting = r.block(draining, r.BLOCK_BUDGET, "budget full", START - 98)
    assert m.observe(req, waiting, None, None).condition(m.PREPARED_COND).reason == "WaitingForBudget"  # type: ignore[union-attr]
    held = d.complete_drain(draining, START - 10).record
    assert m.drained_states(req, held)
    prog = m.observe(req, held, held.since, START - 100)
    assert prog.phase == m.PREPARED
    assert prog.condition(m.PREPARED_COND).reason == "DrainedBeforeStartTime"  # type: ignore[union-attr]
    late = m.observe(req, held, START + 30, START - 100).condition(m.PREPARED_COND)
    assert late is not None and late.reason == "DrainedAfterStartTime" and "30s after" in late.message


def test_progress_of_a_reboot_request_to_completion() -> None:
    req, draining = flow("reboot")
    repairing = d.complete_drain(draining, START).record
    assert m.observe(req, repairing, START, None).phase == m.REMEDIATING
    validating = d.complete_repair(repairing, True, START + 5, 2).record
    prog = m.observe(req, validating, START, None)
    assert prog.phase == m.VALIDATING and prog.condition(m.REMEDIATED).status == m.TRUE  # type: ignore[union-attr]
    healthy = d.complete_validation(validating, True, START + 9).record
    done = m.observe(req, healthy, START, None)
    assert done.phase == m.COMPLETED and done.condition(m.VALIDATED).reason == "Passed"  # type: ignore[union-attr]
    failed = d.complete_validation(validating, False, START + 9).record
    assert m.observe(req, failed, START, None).phase == m.FAILED


def test_quarantine_request_waits_for_a_person_and_a_person_stop_fails_it() -> None:
    req, draining = flow("quarantine")
    quarantined = d.complete_drain(draining, START).record
    prog = m.observe(req, quarantined, START, None)
    assert prog.phase == m.PREPARED and prog.condition(m.REMEDIATED).reason == "AwaitingPerson"  # type: ignore[union-attr]
    req, draining = flow()
    held = d.complete_drain(draining, START).record
    stopped = d.on_person_uncordoned(held, START + 1).record
    assert m.observe(req, stopped, START, None).phase == m.FAILED


def test_status_keeps_transition_times_while_a_condition_holds() -> None:
    req, draining = flow()
    first = m.status_body(m.observe(req, draining, None, START - 100), {}, 2, 100.0)
    again = m.status_body(m.observe(req, draining, None, START - 100), first, 2, 200.0)
    assert again == first and again["observedGeneration"] == 2 and again["startedAt"] == m.rfc3339(START - 100)
    held = d.complete_drain(draining, START - 10).record
    moved = m.status_body(m.observe(req, held, held.since, None), first, 2, 300.0)
    emitted = next(c for c in moved["conditions"] if c["type"] == m.EMITTED)
    prepared = next(c for c in moved["conditions"] if c["type"] == m.PREPARED_COND)
    assert emitted["lastTransitionTime"] == m.rfc3339(100.0)  # unchanged status: time kept
    assert prepared["lastTransitionTime"] == m.rfc3339(300.0)  # False -> True: new time
    assert [c["type"] for c in moved["conditions"]] == [m.EMITTED, m.PREPARED_COND, m.VALIDATED]
    assert moved["startedAt"] == first["startedAt"] and moved["preparedAt"] == m.rfc3339(START - 10)


def test_a_recreated_request_does_not_recognise_its_predecessors_record() -> None:
    _req, draining = flow()
    held = d.complete_drain(draining, START).record
    successor = m.parse_request({**obj(), "metadata": {**obj()["metadata"], "uid": "uid-2"}})
    assert not m.drained_states(successor, held)
    assert successor.fingerprint not in held.handled and held.fault is not None
    assert held.fault.fingerprint != successor.fingerprint
    assert held.state == s.MAINTENANCE
