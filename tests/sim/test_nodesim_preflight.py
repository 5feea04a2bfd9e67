"""NodeSim plays the preflight init container (issue 46) from the node's simulated GPUs: the real check
(``gpuremediate.preflight.run_preflight``) against gpu-sim's nvidia-smi, as sim.cluster wires it."""

from __future__ import annotations

import tempfile
from typing import Any

from test_nodesim import env, wait

from gpuremediate.actions.idle_check import build_idle_check
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import JOBS, NODES, PODS
from gpuremediate.policy.config import default_policy
from gpuremediate.policy.preflight import PreflightPolicy
from gpuremediate.preflight import run_preflight
from gpuremediate.signals.nvidiasmi import NvidiaSmiSource
from gpuremediate.signals.workload import PREFLIGHT, failure_of, reduce
from gpuremediate.vocab.preflight import CONTAINER_NAME, FAILED, parse_message
from sim.gpusim import GpuSim, gpu_uuid
from sim.kubeapi import KubeAPIServer
from sim.nodesim import NodeSim

__all__ = ["env"]
Env = tuple[KubeAPIServer, KubeClient, NodeSim]


def with_gpusim(sim: NodeSim) -> GpuSim:
    gpus = GpuSim(port=0, files_dir=tempfile.mkdtemp(prefix="gpusim-"))

    def check(node: str, _pod: dict[str, Any]) -> tuple[int, str]:
        source = NvidiaSmiSource(gpus.host_dir(node) + "/nvidia-smi", node, 5.0, runner=gpus.nvidia_smi_runner(node))
        outcome = run_preflight(source, default_policy().for_node({}), None)
        return outcome.exit_code, outcome.message

    sim.preflight = check
    for name in ("gpu-1", "gpu-2"):
        sim.add_node(name)
        gpus.add_node(name, gpus=8)
    return gpus


def preflight_pod(name: str, node: str, restart: str = "Always") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"gpuremediate.io/preflight": "injected"}},
            "spec": {"nodeName": node, "restartPolicy": restart,
                     "initContainers": [{"name": CONTAINER_NAME, "image": "gpuremediate:test", "args": ["preflight"]}],
                     "containers": [{"name": "train", "image": "trainer:1"}]}}


def test_a_healthy_gpu_passes_and_the_pod_runs(env: Env) -> None:
    _, client, sim = env
    with_gpusim(sim)
    client.create(PODS, preflight_pod("job", "gpu-1"), "work")
    sim.start()
    pod = wait(lambda: (p := client.get(PODS, "job", "work"))["status"]["phase"] == "Running" and p)
    init = pod["status"]["initContainerStatuses"][0]
    assert init["name"] == CONTAINER_NAME and init["state"]["terminated"]["exitCode"] == 0


def test_a_faulted_gpu_fails_the_init_container_naming_it(env: Env) -> None:
    _, client, sim = env
    gpus = with_gpusim(sim)
    gpus.inject_dbe("gpu-2", 2, 1)
    client.create(PODS, preflight_pod("crashing", "gpu-2"), "work")
    client.create(PODS, preflight_pod("once", "gpu-2", restart="Never"), "work")
    sim.start()
    failed = wait(lambda: (p := client.get(PODS, "once", "work"))["status"]["phase"] == "Failed" and p)
    ended = failed["status"]["initContainerStatuses"][0]["state"]["terminated"]
    message = parse_message(ended["message"])
    assert ended["exitCode"] == 1 and message is not None
    assert (message.result, message.gpus, message.check) == (FAILED, (gpu_uuid("gpu-2", 2),), "ecc-dbe")
    pending = wait(lambda: (p := client.get(PODS, "crashing", "work"))["status"].get("initContainerStatuses") and p)
    status = pending["status"]["initContainerStatuses"][0]
    assert pending["status"]["phase"] == "Pending" and status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["message"] == ended["message"]
    assert not pending["status"].get("containerStatuses")  # the job's containers never started
    found = failure_of(reduce(pending))  # what the controller's watch of Pending preflight pods reads
    assert found is not None and (found.how, found.node) == (PREFLIGHT, "gpu-2")
    sim.tick()
    assert client.get(PODS, "crashing", "work")["status"]["phase"] == "Pending"  # not run later either


def test_the_preflight_over_gpu_sim_fails_a_lost_gpu_and_never_fits_fewer_than_given() -> None:
    """XID 79 (gpu-sim's gpu_lost: nvidia-smi names the GPU lost, exit 15) fails it naming the GPU's bus id; a GPU
    gone without a trace fails it when the pod's GPU count is known (--expect-gpus), else nvidia-smi shows no fault."""
    gpus = GpuSim(port=0, files_dir=tempfile.mkdtemp(prefix="gpusim-"))
    gpus.add_node("n", gpus=8)
    source = NvidiaSmiSource(gpus.host_dir("n") + "/nvidia-smi", "n", 5.0, runner=gpus.nvidia_smi_runner("n"))
    policy = default_policy().for_node({})
    gpus.gpu_lost("n", 3)
    lost = parse_message(run_preflight(source, policy, None, expected=8).message)
    assert lost is not None and (lost.result, lost.gpus, lost.check) == (FAILED, ("pci0000:5d:00.0",), "gpu-lost")
    gpus.reboot("n")
    gpus.gpu_lost("n", 3, log_xid=False)
    assert run_preflight(source, policy, None).exit_code == 0  # 7 fine GPUs, the pod's count not known
    gone = parse_message(run_preflight(source, policy, None, expected=8).message)
    assert gone is not None and gone.text == "the pod was given 8 GPU(s), nvidia-smi lists 7: the driver cannot reach 1"
    named = parse_message(run_preflight(source, policy, (gpu_uuid("n", 2), gpu_uuid("n", 3))).message)
    assert named is not None and named.gpus == (gpu_uuid("n", 3),)



def idle_check(client: KubeClient, node: str) -> str:
    """An idle-node check's Job (loops.idle_check: the preflight is its container), its pod bound to ``node`` as
    kube-scheduler would (the emulator binds only pods with claims); the pod's name."""
    body = client.get(NODES, node)
    job = build_idle_check(body, f"idle-check/{node}", namespace="work", image="gpuremediate:test",
                           policy=PreflightPolicy(), gpus={"nvidia.com/gpu": 8}, service_account="default")
    client.create(JOBS, job, "work")
    prefix = job["metadata"]["name"] + "-"
    pod = wait(lambda: next((p for p in client.list(PODS, "work")["items"]
                             if p["metadata"]["name"].startswith(prefix)), None))
    client.patch(PODS, pod["metadata"]["name"], {"spec": {"nodeName": node}}, "work")
    return str(pod["metadata"]["name"])


def test_an_idle_check_job_pod_is_played_from_the_nodes_gpus(env: Env) -> None:
    _, client, sim = env
    gpus = with_gpusim(sim)
    gpus.inject_dbe("gpu-2", 5, 1)
    sim.set_job_outcome("gpu-1", succeed=False, duration_s=0.0)  # the preflight decides, not the Job outcome
    sim.set_job_outcome("gpu-2", succeed=True, duration_s=0.0)
    sim.start()
    first, second = idle_check(client, "gpu-1"), idle_check(client, "gpu-2")
    passed = wait(lambda: (p := client.get(PODS, first, "work"))["status"]["phase"] == "Succeeded" and p)
    assert passed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    failed = wait(lambda: (p := client.get(PODS, second, "work"))["status"]["phase"] == "Failed" and p)
    ended = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    message = parse_message(ended["message"])
    assert ended["exitCode"] == 1 and message is not None
    assert (message.gpus, message.check) == ((gpu_uuid("gpu-2", 5),), "ecc-dbe")
    found = failure_of(reduce(failed))  # the failed-pod watch's reading: the same as an init container's
    assert found is not None and (found.how, found.node) == (PREFLIGHT, "gpu-2")
