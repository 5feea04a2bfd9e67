"""MIG pods are GPU pods for the drain scope ``gpu``, and the validation Job asks for every GPU slice
(issue 13): the pods filter and the Job body."""

from __future__ import annotations

from typing import Any

from gpuremediate.actions.jobs import JobSpec, build_job
from gpuremediate.actions.pods import SCOPE_GPU, pods_to_drain


def pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"namespace": "w", "name": name},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}, "status": {"phase": "Running"}}


PODS = [pod("whole", {"nvidia.com/gpu": "1"}), pod("slice", {"nvidia.com/mig-1g.10gb": "1"}),
        pod("big-slice", {"nvidia.com/mig-3g.40gb": "1"}), pod("cpu", {"cpu": "2"}),
        pod("shared", {"nvidia.com/gpu.shared": "1"})]


def names(pods: list[Any]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def test_scope_gpu_drains_mig_pods_too() -> None:
    assert names(pods_to_drain(PODS, SCOPE_GPU)) == ["big-slice", "slice", "whole"]


def test_scope_gpu_follows_the_configured_names() -> None:
    chosen = pods_to_drain(PODS, SCOPE_GPU, gpu_resources=("nvidia.com/gpu", "nvidia.com/gpu.shared"))
    assert names(chosen) == ["shared", "whole"]


def spec() -> JobSpec:
    return JobSpec(image="dcgm", command=("dcgmi", "diag", "-r", "2"), request_all_gpus=True)


def test_validation_job_asks_for_every_mig_profile() -> None:
    held = {"nvidia.com/mig-1g.10gb": 14, "nvidia.com/mig-3g.40gb": 4, "nvidia.com/gpu": 0}
    job = build_job("validate", "n1", "fp", 1, spec(), namespace="jobs", gpus=held)
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    wanted = {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4"}
    assert resources == {"limits": wanted, "requests": wanted}


def test_a_count_is_that_many_whole_gpus_and_nothing_asks_for_nothing() -> None:
    job = build_job("validate", "n1", "fp", 1, spec(), namespace="jobs", gpus=8)
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    empty = build_job("validate", "n1", "fp", 1, spec(), namespace="jobs", gpus={})
    assert "resources" not in empty["spec"]["template"]["spec"]["containers"][0]
