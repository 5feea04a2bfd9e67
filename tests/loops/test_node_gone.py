"""Issue 47: a Node deleted by someone else mid-flow (an autoscaler, a person). Its flow ends with a Warning Event
and a metric, what the flow made for it is deleted (here a DrainRequest a plugin never completes, and a Job of
ours labelled for the node), and a Node that joins later under the same name (a new uid) starts fresh. Also: the
autoscaler marks ride the flow's record writes on a real controller."""

from __future__ import annotations

import time
from typing import Any

from e2e.plugins.remediation import install_crd
from gpuremediate.actions.autoscaler_marks import CA_SCALE_DOWN_DISABLED, KARPENTER_DO_NOT_DISRUPT
from gpuremediate.actions.jobs import JOB_LABEL, NODE_LABEL
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.resources import JOBS, NODES
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.waiting import wait_for

from .test_custom_plugins import (  # noqa: F401 (the fixture)
    DRAIN_API,
    NODE,
    SYSTEM_NS,
    FaultySource,
    World,
    _events,
    _requests,
    _state,
    drain_policy,
    permissive_drain_request_crd,
    world,
)

JOBS_NS = "gpuremediate-jobs"


def _leftover_job(made: World) -> None:
    """A Job of ours on the node (as a repair attempt's would be), to be cleaned with the node."""
    made.kube.create(JOBS, {"metadata": {"name": "reset-gpu-left", "namespace": JOBS_NS,
                                          "labels": {JOB_LABEL: "reset-gpu", NODE_LABEL: NODE}},
                             "spec": {"template": {"spec": {"nodeName": NODE, "restartPolicy": "Never",
                                                            "containers": [{"name": "c", "image": "x"}]}}}},
                      JOBS_NS)


def test_a_node_deleted_mid_drain_ends_its_flow_cleans_its_objects_and_comes_back_fresh(world: World) -> None:  # noqa: F811
    kube = world.kube
    res = install_crd(kube, permissive_drain_request_crd(), DRAIN_API, "DrainRequest")
    controller = world.start(drain_policy(timeout=300.0), xid=79)
    controller.node_gone.job_grace_s = 1.0  # the Node does not come back: its Jobs go after the grace
    wait_for(lambda: bool(_requests(kube, res)), 20, f"the DrainRequest (state {_state(kube)})")
    annotations = kube.get(NODES, NODE)["metadata"]["annotations"]
    assert annotations.get(KARPENTER_DO_NOT_DISRUPT) == "true" and annotations.get(CA_SCALE_DOWN_DISABLED) == "true"
    _leftover_job(world)
    old_uid = kube.get(NODES, NODE)["metadata"]["uid"]

    kube.delete(NODES, NODE)  # an autoscaler's scale-down, mid-drain
    wait_for(lambda: _events(kube, "GPUNodeDeletedMidFlow"), 10, "the GPUNodeDeletedMidFlow Event")
    event = _events(kube, "GPUNodeDeletedMidFlow")[0]
    assert event["type"] == "Warning" and event["involvedObject"].get("uid") == old_uid
    assert "while draining" in event["message"] and "DrainRequest" in event["message"], event["message"]
    assert "Job reset-gpu-left" in event["message"], event["message"]
    wait_for(lambda: _requests(kube, res) == [], 10, "the DrainRequest deleted")
    wait_for(lambda: kube.list(JOBS, JOBS_NS)["items"] == [], 10, "the node's Job deleted")
    assert 'gpuremediate_nodes_deleted_mid_flow_total{state="draining"} 1' in \
        controller.metrics.registry.render(), "the metric"

    controller.detect.source.xid = None  # type: ignore[attr-defined]  # the new machine's GPU is fine
    kube.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}}})
    new = kube.get(NODES, NODE)
    assert new["metadata"]["uid"] != old_uid
    time.sleep(1.0)  # a controller that inherited the old flow would now drain the new node
    assert _requests(kube, res) == [] and _state(kube) == "-", "the new Node inherited the old flow"
    assert not kube.get(NODES, NODE)["metadata"].get("annotations"), "marks or a record on the new Node"
    assert len(_events(kube, "GPUNodeDeletedMidFlow")) == 1


def test_a_node_that_comes_back_under_its_name_with_the_old_record_copied_is_not_that_record(world: World) -> None:  # noqa: F811
    """A Node re-created from saved YAML (the old record annotation on it, a new uid): the record is not this
    Node's, so it is replaced by a fresh one (never a flow resumed on the wrong machine)."""
    kube = world.kube
    res = install_crd(kube, permissive_drain_request_crd(), DRAIN_API, "DrainRequest")
    controller = world.start(drain_policy(timeout=300.0), xid=79)
    wait_for(lambda: bool(_requests(kube, res)), 20, "the DrainRequest")
    saved: dict[str, Any] = kube.get(NODES, NODE)
    kube.delete(NODES, NODE)
    wait_for(lambda: _requests(kube, res) == [], 10, "the DrainRequest deleted")
    controller.detect.source.xid = None  # type: ignore[attr-defined]
    meta = saved["metadata"]
    kube.create(NODES, {"metadata": {"name": NODE, "labels": meta["labels"], "annotations": meta["annotations"]}})
    wait_for(lambda: (r := record_from_node(kube.get(NODES, NODE))) is not None and isinstance(r, NodeRecord)
             and r.state == states.HEALTHY and r.reason == states.RECORD_MALFORMED, 10, "a fresh record")
    assert _requests(kube, res) == [], "a flow resumed on the re-created Node"


def test_a_node_deleted_while_the_controller_was_down_is_swept_at_start(world: World) -> None:  # noqa: F811
    """The controller stops mid-drain (its DrainRequest out, a repair Job of ours running), the Node is deleted while
    none runs, then a controller starts: the sweep ends that node's flow as the watched delete would (the Event, the
    metric with state unknown, the DrainRequest now, the Job after the grace), and a node that exists keeps its
    running Job and its record."""
    kube = world.kube
    res = install_crd(kube, permissive_drain_request_crd(), DRAIN_API, "DrainRequest")
    first = world.start(drain_policy(timeout=300.0), xid=79)
    wait_for(lambda: bool(_requests(kube, res)), 20, f"the DrainRequest (state {_state(kube)})")
    _leftover_job(world)
    kube.create(NODES, {"metadata": {"name": "gpu-node-2", "labels": {"nvidia.com/gpu.present": "true"}}})
    kube.create(JOBS, {"metadata": {"name": "validate-kept", "namespace": JOBS_NS,
                                    "labels": {JOB_LABEL: "validate", NODE_LABEL: "gpu-node-2"}},
                       "spec": {"template": {"spec": {"nodeName": "gpu-node-2", "restartPolicy": "Never",
                                                      "containers": [{"name": "c", "image": "x"}]}}}}, JOBS_NS)
    first.stop()
    world.controllers.remove(first)
    kept = kube.get(NODES, "gpu-node-2")
    kube.delete(NODES, NODE)  # no controller runs: no one sees the delete

    settings = Settings(namespace=SYSTEM_NS, scrape_interval_s=0.1, resync_s=0.3)
    second = Controller(settings, loads_policy(drain_policy(timeout=300.0), "test-policy"), client=kube,
                        source=FaultySource(None))
    world.controllers.append(second)
    second.node_gone.job_grace_s = 1.5
    assert second.start_caches(timeout=20)
    second.start_loops()
    wait_for(lambda: _events(kube, "GPUNodeDeletedMidFlow"), 10, "the GPUNodeDeletedMidFlow Event")
    event = _events(kube, "GPUNodeDeletedMidFlow")[0]
    assert event["involvedObject"]["name"] == NODE and "no gpuremediate controller ran" in event["message"]
    assert "DrainRequest" in event["message"] and "Job reset-gpu-left (in 1.5 s" in event["message"], event["message"]
    assert 'gpuremediate_nodes_deleted_mid_flow_total{state="unknown"} 1' in second.metrics.registry.render()
    wait_for(lambda: _requests(kube, res) == [], 10, "the DrainRequest deleted")
    wait_for(lambda: [j["metadata"]["name"] for j in kube.list(JOBS, JOBS_NS)["items"]] == ["validate-kept"], 10,
             "the gone node's Job deleted after the grace, the other one kept")
    assert kube.get(NODES, "gpu-node-2")["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
    assert len(_events(kube, "GPUNodeDeletedMidFlow")) == 1


def test_a_node_back_within_the_grace_keeps_its_jobs_after_the_sweep(world: World) -> None:  # noqa: F811
    """The sweep measures the Jobs' grace from itself: a Node of that name back before it ends keeps them (its new
    flow follows a reboot Job still running there)."""
    kube = world.kube
    kube.delete(NODES, NODE)
    _leftover_job(world)  # a Job of ours whose Node went while no controller ran
    settings = Settings(namespace=SYSTEM_NS, scrape_interval_s=0.1, resync_s=0.3)
    controller = Controller(settings, loads_policy(drain_policy(timeout=300.0), "test-policy"), client=kube,
                            source=FaultySource(None))
    world.controllers.append(controller)
    controller.node_gone.job_grace_s = 1.0
    assert controller.start_caches(timeout=20)
    controller.start_loops()
    wait_for(lambda: _events(kube, "GPUNodeDeletedMidFlow"), 10, "the GPUNodeDeletedMidFlow Event")
    kube.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}}})
    time.sleep(2.0)  # past the grace: a sweep that did not look again would have deleted it
    assert [j["metadata"]["name"] for j in kube.list(JOBS, JOBS_NS)["items"]] == ["reset-gpu-left"]


class HeldShards:
    """--shards as the controller reads it: NODE in shard 0, every other node in shard 1; ``held`` the shards held."""

    def __init__(self, held: set[int]) -> None:
        self.held = held

    def shard_index(self, name: str) -> int:
        return 0 if name == NODE else 1

    def owned(self) -> frozenset[int]:
        return frozenset(self.held)

    def owns(self, name: str) -> bool:
        return self.shard_index(name) in self.held


def test_a_shard_taken_over_later_is_swept_for_nodes_deleted_meanwhile(world: World) -> None:  # noqa: F811
    """A sharded replica sweeps the shards it holds at start; a shard it acquires later (its holder gone) is swept
    then, once: the deleted node's Job found and its flow ended."""
    kube = world.kube
    kube.delete(NODES, NODE)
    _leftover_job(world)  # a Job of ours whose Node went while no replica held its shard
    settings = Settings(namespace=SYSTEM_NS, scrape_interval_s=0.1, resync_s=0.3)
    controller = Controller(settings, loads_policy(drain_policy(timeout=300.0), "test-policy"), client=kube,
                            source=FaultySource(None))
    world.controllers.append(controller)
    shards = HeldShards({1})
    controller.shards = controller.ctx.shards = shards  # type: ignore[assignment]
    controller.node_gone.job_grace_s = 0.5
    assert controller.start_caches(timeout=20)
    controller.start_loops()
    wait_for(lambda: 'gpuremediate_detect_cycles_total 2' in controller.metrics.registry.render(), 10, "running")
    assert _events(kube, "GPUNodeDeletedMidFlow") == [], "shard 0 is not held: its nodes are not this one's to sweep"
    assert [j["metadata"]["name"] for j in kube.list(JOBS, JOBS_NS)["items"]] == ["reset-gpu-left"]

    shards.held.add(0)  # shard 0's holder is gone: its Lease taken
    controller._shards_changed(shards.owned())
    wait_for(lambda: _events(kube, "GPUNodeDeletedMidFlow"), 10, "the GPUNodeDeletedMidFlow Event")
    assert "no gpuremediate controller ran" in _events(kube, "GPUNodeDeletedMidFlow")[0]["message"]
    wait_for(lambda: kube.list(JOBS, JOBS_NS)["items"] == [], 10, "the gone node's Job deleted after the grace")
    assert len(_events(kube, "GPUNodeDeletedMidFlow")) == 1


def test_what_is_gathered_for_a_node_added_again_right_after_its_delete_is_kept(world: World) -> None:  # noqa: F811
    """The delete's cleanup runs later, on the report queue; what the loops keep under the name is dropped at the
    delete itself, in the watch's order, so a Node added again under the name right after keeps what the loops
    gather for it meanwhile (here the detect loop's memory of it)."""
    import threading

    kube = world.kube
    controller = world.start(drain_policy(timeout=300.0), xid=None)
    gate = threading.Event()
    controller.reports.submit(lambda: gate.wait(30))  # the queue busy: the delete's cleanup waits behind this
    old_uid = kube.get(NODES, NODE)["metadata"]["uid"]
    kube.delete(NODES, NODE)
    kube.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}}})
    wait_for(lambda: (controller.ctx.nodes.informer.get(NODE) or {}).get("metadata", {}).get("uid") not in
             (None, old_uid), 10, "the new Node in the cache")
    controller.detect.memory[NODE] = {"thermal": {"GPU-new": {"hot_since": time.time()}}}  # gathered for the new one
    gate.set()
    assert controller.reports.flush(10)
    assert NODE in controller.detect.memory, "the old Node's cleanup dropped what was gathered for the new one"
