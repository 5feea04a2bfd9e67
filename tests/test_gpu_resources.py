"""GPU resource names in one place (issue 13): single and mixed MIG strategies, configurable names, what a
validation Job must hold (capacity) and why it cannot (allocatable short of it)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuremediate.actions.nodes import gpu_count, is_gpu_node
from gpuremediate.gpu_resources import (
    is_gpu_resource,
    node_gpu_resources,
    pod_gpu_requests,
    requests_gpu,
    resource_pattern_problem,
    validation_hold,
)
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab.schema import PolicyError

# What the NVIDIA device plugin and GPU feature discovery put on an 8 x H100 node with MIG (GFD labels).
MIXED = {"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4", "nvidia.com/gpu": "2"}
SINGLE = {"nvidia.com/gpu": "56"}  # 8 GPUs x 7 x 1g.10gb, each MIG device one nvidia.com/gpu


def node(capacity: dict[str, str], allocatable: dict[str, str] | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "labels": labels or {}},
            "status": {"capacity": {"cpu": "64", **capacity},
                       "allocatable": {"cpu": "63", **(capacity if allocatable is None else allocatable)}}}


def pod(limits: dict[str, str], *, init: bool = False, section: str = "limits") -> dict[str, Any]:
    container = {"name": "main", "resources": {section: limits}}
    key = "initContainers" if init else "containers"
    return {"metadata": {"namespace": "w", "name": "p"}, "spec": {key: [container]}}


@pytest.mark.parametrize("limits", [{"nvidia.com/gpu": "1"}, {"nvidia.com/mig-1g.10gb": "1"},
                                    {"nvidia.com/mig-3g.40gb": "2", "cpu": "1"}])
def test_whole_gpus_and_mig_slices_are_gpu_pods(limits: dict[str, str]) -> None:
    assert requests_gpu(pod(limits))
    assert requests_gpu(pod(limits, init=True))
    assert requests_gpu(pod(limits, section="requests"))


@pytest.mark.parametrize("limits", [{}, {"cpu": "4"}, {"nvidia.com/gpu": "0"}, {"nvidia.com/mig-1g.10gb": "0"},
                                    {"nvidia.com/gpu.shared": "1"}, {"example.com/mig-1g": "1"}])
def test_other_resources_and_zero_counts_are_not(limits: dict[str, str]) -> None:
    assert not requests_gpu(pod(limits))


def test_configured_names_replace_the_defaults() -> None:
    shared = pod({"nvidia.com/gpu.shared": "1"})
    assert requests_gpu(shared, ("nvidia.com/gpu", "nvidia.com/gpu.shared"))
    assert not requests_gpu(pod({"nvidia.com/mig-1g.10gb": "1"}), ("nvidia.com/gpu",))
    assert pod_gpu_requests(pod({"nvidia.com/mig-1g.10gb": "2", "nvidia.com/gpu": "1", "cpu": "3"})) == {
        "nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2}


def test_a_star_matches_a_prefix_only_at_the_end() -> None:
    assert is_gpu_resource("nvidia.com/mig-2g.20gb", ("nvidia.com/mig-*",))
    assert not is_gpu_resource("nvidia.com/mig", ("nvidia.com/mig-*",))
    assert is_gpu_resource("amd.com/gpu", ("amd.com/*",))
    assert not is_gpu_resource("nvidia.com/gpux", ("nvidia.com/gpu",))


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "nvidia.com/mig-*", "nvidia.com/mig-1g.10gb", "amd.com/*",
                                  "example.com/Gpu_A"])
def test_qualified_names_and_prefixes_are_accepted(name: str) -> None:
    assert resource_pattern_problem(name) == ""


@pytest.mark.parametrize("name", ["gpu", "nvidia.com/", "/gpu", "Nvidia.com/gpu", "nvidia.com/gpu-", "nvidia.com/*x",
                                  "nvidia.com/-*", "nvidia..com/gpu", "nvidia.com/" + "g" * 64])
def test_bad_names_are_refused_naming_the_key(name: str) -> None:
    assert resource_pattern_problem(name)
    with pytest.raises(PolicyError, match=r"gpu_resources\.names\[1\]: expected an extended resource name"):
        loads_policy(f'[gpu_resources]\nnames = ["nvidia.com/gpu", "{name}"]\n')


def test_the_policy_section_per_group() -> None:
    policy = loads_policy('[gpu_resources]\nnames = ["nvidia.com/gpu"]\nallocatable_wait_s = 60\n'
                          '[[groups]]\nname = "mig"\nselector = "nvidia.com/mig.strategy=mixed"\n'
                          '[groups.gpu_resources]\nnames = ["nvidia.com/mig-*"]\n')
    assert policy.for_node({}).gpu_resources.names == ("nvidia.com/gpu",)
    mig = policy.for_node({"nvidia.com/mig.strategy": "mixed"}).gpu_resources
    assert mig.names == ("nvidia.com/mig-*",) and mig.allocatable_wait_s == 60
    with pytest.raises(PolicyError, match=r"gpu_resources\.names: must name at least one"):
        loads_policy("[gpu_resources]\nnames = []\n")
    with pytest.raises(PolicyError, match=r"gpu_resources\.allocatable_wait_s"):
        loads_policy("[gpu_resources]\nallocatable_wait_s = -1\n")


def test_validation_holds_every_slice_of_a_mixed_node() -> None:
    hold = validation_hold(node(MIXED))
    assert hold.requests == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 14, "nvidia.com/mig-3g.40gb": 4}
    assert hold.problem == ""


def test_validation_holds_every_mig_device_of_a_single_strategy_node() -> None:
    assert validation_hold(node(SINGLE)).requests == {"nvidia.com/gpu": 56}


def test_validation_asks_for_capacity_and_names_what_the_device_plugin_holds_back() -> None:
    hold = validation_hold(node({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "7"}))
    assert hold.requests == {"nvidia.com/gpu": 8}  # not allocatable's 7: "all GPUs" means all of them
    assert hold.short == {"nvidia.com/gpu": (7, 8)}
    assert "nvidia.com/gpu 7 of 8 allocatable" in hold.problem and "1 GPU device(s) as unhealthy" in hold.problem
    mixed = validation_hold(node(MIXED, {**MIXED, "nvidia.com/mig-3g.40gb": "0"}))
    assert mixed.short == {"nvidia.com/mig-3g.40gb": (0, 4)}
    assert "4 GPU device(s)" in mixed.problem


def test_a_node_without_gpu_capacity_cannot_be_validated() -> None:
    hold = validation_hold(node({}, labels={"nvidia.com/gpu.present": "true"}))
    assert hold.requests == {} and "no GPU resource in its capacity" in hold.problem


def test_node_resources_leave_out_zero_and_unreadable_counts() -> None:
    n = node({"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-2g.20gb": "x"})
    assert node_gpu_resources(n) == {"nvidia.com/mig-1g.10gb": 7}


def test_gpu_count_is_physical_gpus() -> None:
    assert gpu_count(node({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "7"})) == 8  # capacity, not allocatable
    labels = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "8"}
    assert gpu_count(node(MIXED, labels=labels)) == 8
    # single: GFD overrides gpu.count with the MIG devices, as the capacity counts them; nothing tells GPUs
    assert gpu_count(node(SINGLE, labels={"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "56"})) == 56
    assert gpu_count(node(MIXED)) == 2  # no GFD labels: the whole GPUs the capacity lists


def test_a_mixed_mig_node_is_a_gpu_node_without_the_label() -> None:
    assert is_gpu_node(node({"nvidia.com/mig-1g.10gb": "7"}))
    assert not is_gpu_node(node({"cpu": "8"}))
