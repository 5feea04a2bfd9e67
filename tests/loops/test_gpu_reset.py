"""reset-gpu on a GPU Operator node, against the simulated operator (sim.cluster.OperatorSim): the operands off
through their deploy labels, the reset, the labels back; failures restore first; people's labels are kept."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpuremediate.actions.nodes import EXCLUDE_LABEL
from gpuremediate.actions.operands import OPERAND_ANNOTATION
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import EVENTS, JOBS, NODES
from gpuremediate.policy.config import PolicyFile, loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import RECORD_ANNOTATION, NodeRecord, encode, record_from_node
from sim.cluster import DEPLOY_LABEL, OPERANDS, OperatorOptions, SimCluster
from sim.waiting import wait_for
from tests.loops.test_conflicts import ConflictingClient, _repeated_events, job_service_account
from tests.reliability.harness import reliability_settings

NODE = "gpu-node-1"
DEPLOY_LABELS = [DEPLOY_LABEL + operand for operand in OPERANDS]
POLICY = """
[thermal]
hold_s = 0.3
[drain]
retry_s = 0.2
timeout_s = 4
[remediation]
max_attempts = {attempts}
[remediation.reset_gpu]
timeout_s = 10
[validation.job]
timeout_s = 5
[budget]
max_unavailable = "1"
[breaker]
enabled = false
[gpu_operator]
enabled = {enabled}
gone_timeout_s = {gone}
back_timeout_s = 15
"""


def policy(*, attempts: int = 2, enabled: bool = True, gone: float = 10) -> PolicyFile:
    return loads_policy(POLICY.format(attempts=attempts, enabled=str(enabled).lower(), gone=gone), "test-policy")


def make_cluster(**kwargs: Any) -> SimCluster:
    return SimCluster(**{"nodes": 2, "gpus": 2, "job_duration_s": 0.2, "reboot_down_s": 0.3, "gpu_operator": True,
                         **kwargs})


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    with make_cluster() as made:
        job_service_account(made.kube)
        yield made


class Controllers:
    """In-process controllers on the cluster, stopped at the end."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.running: list[Controller] = []

    def start(self, policy_file: PolicyFile, client: KubeClient | None = None) -> Controller:
        client = client or KubeClient(load_config(self.cluster.kubeconfig), qps=500, burst=1000, timeout=10.0)
        controller = Controller(reliability_settings(self.cluster), policy_file, client=client)
        assert controller.start_caches(timeout=20.0)
        controller.start_loops()
        self.running.append(controller)
        return controller

    def stop_all(self) -> None:
        for controller in self.running:
            controller.stop()
        self.running.clear()


@pytest.fixture
def controllers(cluster: SimCluster) -> Iterator[Controllers]:
    made = Controllers(cluster)
    yield made
    made.stop_all()


def node_of(cluster: SimCluster) -> dict[str, Any]:
    return cluster.kube.get(NODES, NODE)


def record_of(cluster: SimCluster) -> NodeRecord | None:
    record = record_from_node(node_of(cluster))
    return record if isinstance(record, NodeRecord) else None


def state_of(cluster: SimCluster) -> str:
    record = record_of(cluster)
    return record.state if record else "healthy"


def deploy_labels(cluster: SimCluster) -> dict[str, str | None]:
    labels = node_of(cluster)["metadata"].get("labels") or {}
    return {label: labels.get(label) for label in DEPLOY_LABELS}


def annotation(cluster: SimCluster) -> str | None:
    return (node_of(cluster)["metadata"].get("annotations") or {}).get(OPERAND_ANNOTATION)


def repaired(cluster: SimCluster) -> bool:
    record = record_of(cluster)
    return record is not None and record.state == states.HEALTHY and len(record.history) >= 1


def jobs(cluster: SimCluster, kind: str | None = None) -> list[dict[str, Any]]:
    """Every Job the controllers created for NODE (of ``kind``), finished ones included."""
    selector = f"gpuremediate.io/job={kind}" if kind else "gpuremediate.io/job"
    return [j for j in cluster.kube.list(JOBS, "gpuremediate-jobs", label_selector=selector)["items"]
            if j["spec"]["template"]["spec"]["nodeName"] == NODE]


def reset_jobs(cluster: SimCluster) -> list[dict[str, Any]]:
    return jobs(cluster, "reset-gpu")


def job_gpu_ids(job: dict[str, Any]) -> str:
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    return next(e["value"] for e in env if e["name"] == "GPU_IDS")


def events(cluster: SimCluster, reason: str) -> list[str]:
    items = cluster.kube.list(EVENTS, "default")["items"]
    return [e["message"] for e in items if e.get("reason") == reason
            and (e.get("involvedObject") or {}).get("name") == NODE]


def wait_events(cluster: SimCluster, reason: str) -> list[str]:
    """The node's Events of ``reason`` once there is one (the recorder writes them after the write they report)."""
    wait_for(lambda: events(cluster, reason), 10, f"a {reason} Event")
    return events(cluster, reason)


class StepWatch:
    """The reset steps the record went through, polled all along."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.steps: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            record = record_of(self.cluster)
            step = record.action.step if record and record.action else ""
            if step and (not self.steps or self.steps[-1] != step):
                self.steps.append(step)

    def done(self) -> list[str]:
        self.stop.set()
        self.thread.join(5)
        return self.steps


def test_the_bare_reset_is_refused_while_the_operands_hold_the_gpus(cluster: SimCluster,
                                                                     controllers: Controllers) -> None:
    controllers.start(policy(attempts=1, enabled=False))
    cluster.gpusim.inject(NODE, 1, "xid", 48)
    wait_for(lambda: state_of(cluster) == states.QUARANTINED, 30, f"{NODE} quarantined after the refused reset")
    assert cluster.reset_refusals and "In use by another client" in cluster.reset_refusals[0][1]
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "true")  # the bare reset touches no label


def test_the_sequence_takes_the_operands_off_resets_and_brings_them_back(cluster: SimCluster,
                                                                         controllers: Controllers) -> None:
    controllers.start(policy())
    watch = StepWatch(cluster)
    cluster.gpusim.inject(NODE, 1, "xid", 48)
    wait_for(lambda: repaired(cluster), 40, f"{NODE} repaired, validated and healthy")
    assert watch.done() == ["operands-gone", "reset", "operands-back"]
    assert cluster.reset_refusals == []  # nothing held the GPUs when the Job ran
    assert [job_gpu_ids(j) for j in reset_jobs(cluster)] == ["1"]  # the faulty GPU only (H100: one by one)
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "true")
    assert annotation(cluster) is None
    assert cluster.gpusim.node(NODE).gpu(1).xid is None
    assert len(wait_events(cluster, "GPUOperandsOff")) == 1 and len(wait_events(cluster, "GPUOperandsRestored")) == 1


def test_an_operand_labelled_on_but_not_deployed_is_not_waited_for() -> None:
    """The operator labels every GPU node gpu.deploy.dcgm=true; its chart deploys no standalone DCGM by default."""
    with make_cluster(gpu_operator=OperatorOptions(disabled=frozenset({"dcgm"}))) as cluster:
        job_service_account(cluster.kube)
        made = Controllers(cluster)
        try:
            made.start(policy(attempts=1))
            cluster.gpusim.inject(NODE, 1, "xid", 48)
            wait_for(lambda: repaired(cluster), 40, f"{NODE} repaired without a DCGM pod to wait for")
        finally:
            made.stop_all()
        assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "true")
        assert not events(cluster, "GPURemediationFailed")


def test_a_label_changed_by_someone_mid_sequence_is_left_as_they_set_it(cluster: SimCluster,
                                                                        controllers: Controllers) -> None:
    assert cluster.nodesim is not None
    cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=2.0)  # a reset step long enough to act in
    controllers.start(policy())
    cluster.gpusim.inject(NODE, 1, "xid", 48)
    gfd = DEPLOY_LABEL + "gpu-feature-discovery"

    def in_reset() -> bool:
        record = record_of(cluster)
        return record is not None and record.action is not None and record.action.step == "reset"

    wait_for(in_reset, 30, "the reset step")
    cluster.kube.patch(NODES, NODE, {"metadata": {"labels": {gfd: "paused-by-admin"}}})
    wait_for(lambda: repaired(cluster), 40, f"{NODE} repaired and healthy")
    labels = deploy_labels(cluster)
    assert labels[gfd] == "paused-by-admin"
    assert all(value == "true" for label, value in labels.items() if label != gfd)
    restored = wait_events(cluster, "GPUOperandsRestored")
    assert any("left nvidia.com/gpu.deploy.gpu-feature-discovery" in m for m in restored)


def test_operands_that_do_not_leave_in_time_are_restored_before_the_attempt_fails(cluster: SimCluster,
                                                                                   controllers: Controllers) -> None:
    assert cluster.operator is not None
    cluster.operator.stuck(NODE, "dcgm")  # nv-hostengine's pod stays (stuck terminating)
    controllers.start(policy(attempts=1, gone=1.5))
    cluster.gpusim.inject(NODE, 1, "xid", 48)
    wait_for(lambda: state_of(cluster) == states.QUARANTINED, 30, f"{NODE} quarantined after the timeout")
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "true")  # restored, then failed
    assert annotation(cluster) is None
    assert reset_jobs(cluster) == []  # no reset was tried while the GPUs were held
    failed = wait_events(cluster, "GPURemediationFailed")
    assert failed and "operand pods still on the node" in failed[0] and "nvidia-dcgm-gpu-node-1" in failed[0]


def test_a_node_that_leaves_the_sequence_another_way_gets_its_operands_back(cluster: SimCluster,
                                                                            controllers: Controllers) -> None:
    assert cluster.operator is not None
    cluster.operator.stuck(NODE, "dcgm")  # the sequence waits in operands-gone
    controllers.start(policy(attempts=1, gone=60))
    cluster.gpusim.inject(NODE, 1, "xid", 48)

    def waiting_for_operands() -> bool:
        record = record_of(cluster)
        return record is not None and record.action is not None and record.action.step == "operands-gone"

    wait_for(waiting_for_operands, 30, "the operands-gone step")
    assert annotation(cluster) is not None and "false" in deploy_labels(cluster).values()
    # A person takes the node out of gpuremediate's hands: kubectl label node ... gpuremediate.io/exclude=true
    cluster.kube.patch(NODES, NODE, {"metadata": {"labels": {EXCLUDE_LABEL: "true"}}})
    wait_for(lambda: annotation(cluster) is None, 20, "the operand labels put back once the sequence stopped")
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "true")
    record = record_of(cluster)
    assert record is not None and record.action is not None and record.action.step == "operands-gone"  # as left
    restored = wait_events(cluster, "GPUOperandsRestored")
    assert restored and "the node is excluded" in restored[-1], restored


def test_a_restarted_controller_resumes_and_restores_the_labels(cluster: SimCluster,
                                                                 controllers: Controllers) -> None:
    assert cluster.nodesim is not None
    cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=2.0)
    first = controllers.start(policy())
    cluster.gpusim.inject(NODE, 1, "xid", 48)

    def step() -> str:
        record = record_of(cluster)
        return record.action.step if record and record.action else ""

    wait_for(lambda: step() == "reset", 30, "the reset step")
    first.stop()
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "false")  # off, as the record says
    controllers.start(policy())
    wait_for(lambda: repaired(cluster), 40, f"{NODE} repaired by the second controller")
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "true")
    assert len(reset_jobs(cluster)) == 1  # the first controller's Job, found again: not a second one


def test_a_controller_killed_before_the_reset_job_resets_only_the_gpu_it_chose(cluster: SimCluster,
                                                                               controllers: Controllers) -> None:
    """The exporter is gone once the operands are off: a successor cannot read which GPU was faulty, so the GPUs
    chosen when the operands went off are in the record (it reset every GPU of the node)."""
    assert cluster.nodesim is not None
    cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=30.0)
    first = controllers.start(policy())
    cluster.gpusim.inject(NODE, 1, "xid", 48)
    wait_for(lambda: len(reset_jobs(cluster)) == 1, 30, "the reset Job")
    first.stop()
    cluster.kube.delete(JOBS, name_of_job(reset_jobs(cluster)[0]), "gpuremediate-jobs", propagation_policy="Background")
    wait_for(lambda: not reset_jobs(cluster), 10, "the Job gone")
    record = record_of(cluster)
    assert record is not None and record.action is not None and record.action.step == "reset"
    assert record.action.gpu_ids == ("1",)
    killed = dataclasses.replace(record, action=dataclasses.replace(record.action, created_at=None))
    cluster.kube.patch(NODES, NODE, {"metadata": {"annotations": {RECORD_ANNOTATION: encode(killed)}}})
    cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=0.2)
    controllers.start(policy())
    wait_for(lambda: repaired(cluster), 40, f"{NODE} repaired by the second controller")
    assert [job_gpu_ids(j) for j in reset_jobs(cluster)] == ["1"]


def name_of_job(job: dict[str, Any]) -> str:
    return str(job["metadata"]["name"])


def test_nothing_is_repeated_when_every_other_node_write_conflicts(cluster: SimCluster, controllers: Controllers,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuremediate")
    client = ConflictingClient(load_config(cluster.kubeconfig), qps=500, burst=1000, timeout=10.0)
    controllers.start(policy(), client=client)
    cluster.gpusim.inject(NODE, 1, "xid", 48)
    wait_for(lambda: repaired(cluster), 40, f"{NODE} repaired despite the conflicts")
    assert client.conflicts >= 4, "the test did not make the controller's node writes conflict"
    assert _repeated_events(cluster) == []
    assert len(reset_jobs(cluster)) == 1
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "true")


def test_an_nvlink_group_node_resets_every_gpu_in_one_job() -> None:
    with make_cluster(products={NODE: "Tesla-V100-SXM2-32GB"}) as v100:
        job_service_account(v100.kube)
        local = Controllers(v100)
        try:
            local.start(policy())
            v100.gpusim.inject(NODE, 1, "xid", 48)
            wait_for(lambda: repaired(v100), 40, f"{NODE} repaired")
            assert [job_gpu_ids(j) for j in reset_jobs(v100)] == ["0,1"]
            assert v100.reset_refusals == []
        finally:
            local.stop_all()


def test_a_reset_job_that_fails_restores_the_labels_then_fails_the_attempt(cluster: SimCluster,
                                                                           controllers: Controllers) -> None:
    cluster.gpusim.hold(NODE, "nvidia-persistenced")  # a client the operator does not run: the reset is refused
    controllers.start(policy(attempts=1))
    cluster.gpusim.inject(NODE, 1, "xid", 48)
    wait_for(lambda: state_of(cluster) == states.QUARANTINED, 30, f"{NODE} quarantined after the failed reset")
    assert "nvidia-persistenced" in cluster.reset_refusals[0][1]
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "true") and annotation(cluster) is None
    record = record_of(cluster)
    assert record is not None and "reset-gpu Job" in record.message and "failed" in record.message


def test_an_unreadable_annotation_fails_the_attempt_and_touches_no_label(cluster: SimCluster,
                                                                         controllers: Controllers) -> None:
    assert cluster.nodesim is not None
    cluster.nodesim.set_job_outcome(NODE, succeed=True, duration_s=2.0)
    client = ConflictingClient(load_config(cluster.kubeconfig), qps=500, burst=1000, timeout=10.0)
    controllers.start(policy(attempts=1), client=client)
    cluster.gpusim.inject(NODE, 1, "xid", 48)

    def in_reset() -> bool:
        record = record_of(cluster)
        return record is not None and record.action is not None and record.action.step == "reset"

    wait_for(in_reset, 30, "the reset step")
    cluster.kube.patch(NODES, NODE, {"metadata": {"annotations": {OPERAND_ANNOTATION: "{edited"}}})
    wait_for(lambda: state_of(cluster) == states.QUARANTINED, 30, f"{NODE} quarantined")
    assert deploy_labels(cluster) == dict.fromkeys(DEPLOY_LABELS, "false")  # which were ours is unknown now
    assert annotation(cluster) is None  # said once, then gone: no later attempt or restart says it again
    unknown = wait_events(cluster, "GPUOperandsUnknown")
    assert len(unknown) == 1 and "is not JSON" in unknown[0]
    assert _repeated_events(cluster) == []  # every other guarded write met a 409: still said once
