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
from gpuremediate.kube.resources import JOBS, NODES
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.waiting import wait_for

from .test_custom_plugins import (  # noqa: F401 (the fixture)
    DRAIN_API,
    NODE,
    SYSTEM_NS,
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
