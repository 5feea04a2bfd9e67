"""A failing trend scheduled into a maintenance window (issue 29): ``[degradation] trend_action = "maintenance"``.

Single-bit ECC errors climbing on one GPU are a trend, not a fault: the controller files a MaintenanceRequest whose
drain starts when the next trend window opens, and does nothing to the node before. In an open window the request
runs at once: drained, the GPU reset, validated, back in service; the trend that outlives it is not scheduled again.
A dry run files nothing and says what it would file.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e.harness import Cluster
from e2e.test_maintenance import MRS, POLICY, condition, delete_and_wait_gone, get, install_crd, wait_phase
from gpuremediate.loops.trend_maintenance import FILED_FOR_LABEL, TRENDS_ANNOTATION
from gpuremediate.state.maintenance import parse_time
from gpuremediate.vocab.window import DAYS, Window
from sim.gpusim import gpu_uuid

GPU = 3
LEAD_S = POLICY["maintenance"]["prepare_lead_s"]


@pytest.fixture
def mc(cluster: Cluster) -> Cluster:
    install_crd(cluster)
    return cluster


def trend_policy(days: str, hours: str) -> dict[str, dict[str, Any]]:
    return {**POLICY, "degradation": {"trends": True, "trend_action": "maintenance", "sbe_min": 100,
                                      "sbe_window_s": 3600, "trend_window_days": days,
                                      "trend_window_hours": hours, "trend_window_zone": "UTC"}}


def trend_requests(c: Cluster, node: str) -> list[dict[str, Any]]:
    return [obj for obj in c.kube.list(MRS)["items"]
            if (obj["metadata"].get("labels") or {}).get(FILED_FOR_LABEL) == "trend"
            and obj["spec"]["healthEvent"]["nodeName"] == node]


def wait_filed(c: Cluster, node: str, timeout: float = 20.0) -> dict[str, Any]:
    found = c.wait(lambda: trend_requests(c, node), timeout, f"a trend MaintenanceRequest for {node}",
                   seen=lambda: c.summary(node))
    assert len(found) == 1, found
    return found[0]


def start_errors(c: Cluster, node: str) -> None:
    """A first read of the GPU's counter (its base), then 500 single-bit errors on GPU 3. The base is a completed
    detect cycle that read every node (``gpuremediate_nodes_unknown`` 0 once a cycle is counted): the gauge reads 0
    before any cycle ran, and a cycle that ran before the exporters' pods had their IPs (seconds on a real server)
    read no node; errors injected then are in the counter's first reading, so no increase, no trend (issue 43)."""
    def every_node_read() -> bool:
        metrics = c.metrics()  # one scrape: the cycle's gauges are set before the cycle is counted
        return (metrics.value("gpuremediate_detect_cycles_total") >= 1
                and metrics.value("gpuremediate_nodes_unknown") == 0)
    c.wait(every_node_read, 15, "a detect cycle that read every node (the counter's base)",
           seen=lambda: c.metrics().value("gpuremediate_nodes_unknown"))
    c.inject(node, GPU, "sbe", 500)


def test_a_trend_waits_for_its_window_and_nothing_happens_before(mc: Cluster) -> None:
    node = mc.nodes[0]
    later = DAYS[(time.gmtime().tm_wday + 3) % 7]  # a window days away: the request must wait for it
    mc.workload("train-0", node)
    mc.start_controller(trend_policy(later, "02:00-06:00"))
    start_errors(mc, node)
    obj = wait_filed(mc, node)
    opening = Window.parse(later, "02:00-06:00", "UTC").next_opening(time.time())
    assert parse_time(obj["spec"]["startTime"], "startTime") == opening + LEAD_S  # the drain starts at the opening
    event = obj["spec"]["healthEvent"]
    assert event["recommendedAction"] == "COMPONENT_RESET" and event["errorCode"] == ["sbe-rate"]
    assert [e["entityValue"] for e in event["entitiesImpacted"]] == [gpu_uuid(node, GPU)]  # by UUID, not index
    assert obj["metadata"]["annotations"][TRENDS_ANNOTATION].startswith("trend:sbe-rate:")
    mc.wait_event(node, "GPUTrendMaintenanceScheduled", obj["metadata"]["name"], timeout=10)
    name = obj["metadata"]["name"]
    mc.wait(lambda: condition(get(mc, name), "HealthEventEmitted").get("reason") == "WaitingForStartTime", 10,
            "the request waiting for its window", seen=lambda: get(mc, name))
    mc.holds(lambda: mc.state(node) == "healthy" and not mc.unschedulable(node) and len(trend_requests(mc, node)) == 1,
             2.0, "no cordon, no drain, no second request before the window", seen=lambda: mc.summary(node))
    assert "workloads/train-0" not in mc.evicted()
    assert mc.metrics().value("gpuremediate_trend_maintenance_requests_total", result="filed") == 1


def test_in_an_open_window_the_trend_is_drained_reset_validated_once(mc: Cluster) -> None:
    node = mc.nodes[1]
    mc.workload("train-1", node)
    mc.start_controller(trend_policy("Mon-Sun", "00:00-24:00"))
    start_errors(mc, node)
    obj = wait_filed(mc, node)
    name = obj["metadata"]["name"]
    done = wait_phase(mc, name, "Completed", timeout=40)
    assert condition(done, "Remediated")["status"] == "True"
    assert condition(done, "Validated")["reason"] == "Passed"
    assert "workloads/train-1" in mc.evicted()
    assert mc.job_runs(node, "validate") >= 1
    mc.wait(lambda: mc.state(node) == "healthy" and not mc.unschedulable(node), 20, f"{node} back in service",
            seen=lambda: mc.summary(node))
    # The reset zeroed the volatile counter, but the hour's increase stands: the same trend, already served.
    mc.holds(lambda: len(trend_requests(mc, node)) == 1 and mc.state(node) == "healthy", 2.0,
             "the trend that outlived its maintenance is not scheduled again", seen=lambda: trend_requests(mc, node))
    delete_and_wait_gone(mc, name)  # cleaning up a finished request: the node's record says it was served
    mc.holds(lambda: not trend_requests(mc, node) and mc.state(node) == "healthy", 2.0,
             "a served trend is not filed again once its request is deleted", seen=lambda: trend_requests(mc, node))


def test_dry_run_files_no_request_and_says_what_it_would(mc: Cluster) -> None:
    node = mc.nodes[0]
    mc.start_controller(trend_policy("Mon-Sun", "00:00-24:00"), dry_run=True)
    start_errors(mc, node)
    event = mc.wait_event(node, "GPUTrendMaintenanceScheduled", "would file MaintenanceRequest", timeout=20)
    assert "(dry-run)" in event["message"]
    mc.holds(lambda: not trend_requests(mc, node) and mc.state(node) == "healthy" and not mc.unschedulable(node),
             1.5, "nothing filed, nothing touched in a dry run", seen=lambda: mc.summary(node))
    assert mc.metrics().value("gpuremediate_trend_maintenance_requests_total", result="dry_run") == 1
