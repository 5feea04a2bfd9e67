"""``[isolation]``: the setting, its validation, and which findings may take one GPU out instead of the node."""

from __future__ import annotations

import pytest

from gpuremediate.policy.config import PolicyError, default_policy, loads_policy
from gpuremediate.policy.gpu_operator import PRODUCT_LABEL, GpuOperatorPolicy
from gpuremediate.policy.isolation import node_level_reason
from gpuremediate.policy.workflow import Rung
from gpuremediate.vocab.findings import ACTION_REBOOT, ACTION_RESET_GPU, Finding
from gpuremediate.vocab.record import SCOPE_GPU, HistoryEntry

GPU3 = "GPU-3"
DAY = 86400.0


def finding(*gpus: str, action: str = ACTION_RESET_GPU) -> Finding:
    return Finding("n1", "xid", "48", tuple(gpus), action, f"xid:48:{','.join(gpus)}", "XID 48 (DBE)")


def why(f: Finding, *, labels: dict[str, str] | None = None, capacity: dict[str, str] | None = None,
        ladder: tuple[Rung, ...] = (Rung(ACTION_RESET_GPU),), history: tuple[HistoryEntry, ...] = (),
        now: float = 10 * DAY) -> str:
    return node_level_reason(f, labels or {}, capacity or {"nvidia.com/gpu": "8"}, ladder=ladder,
                             gpu_operator=GpuOperatorPolicy(), history=history, now=now, window_s=7 * DAY)


def test_default_is_node_level_and_a_group_can_choose_gpu() -> None:
    assert default_policy().defaults.isolation.scope == "node"
    loaded = loads_policy('[[groups]]\nname = "h100"\nselector = "pool=h100"\n[groups.isolation]\nscope = "gpu"\n')
    assert loaded.for_node({"pool": "h100"}).isolation.gpu_level
    assert not loaded.for_node({"pool": "a100"}).isolation.gpu_level


def test_a_bad_scope_names_the_key_and_the_choices() -> None:
    with pytest.raises(PolicyError, match=r"isolation\.scope: expected one of node, gpu, got 'device'"):
        loads_policy('[isolation]\nscope = "device"\n')


def test_before_ga_defaults_to_node_and_names_a_bad_choice() -> None:
    assert default_policy().defaults.isolation.before_ga == "node"
    assert loads_policy('[isolation]\nscope = "gpu"\nbefore_ga = "gpu"\n').defaults.isolation.before_ga == "gpu"
    with pytest.raises(PolicyError, match=r"isolation\.before_ga: expected one of node, gpu, got 'yes'"):
        loads_policy('[isolation]\nbefore_ga = "yes"\n')


def test_one_gpu_reset_is_gpu_level() -> None:
    assert why(finding(GPU3)) == ""


@pytest.mark.parametrize(("f", "words"), [
    (finding(), "names no GPU"),
    (finding(GPU3, "GPU-5"), "names 2 GPUs"),
    (finding(GPU3, action=ACTION_REBOOT), "not a per-GPU reset only (reboot)"),
])
def test_findings_that_are_not_one_gpu_reset_are_node_level(f: Finding, words: str) -> None:
    assert words in why(f)


def test_a_ladder_that_reaches_reboot_is_node_level() -> None:
    assert "reset-gpu, reboot" in why(finding(GPU3), ladder=(Rung(ACTION_RESET_GPU), Rung(ACTION_REBOOT)))


def test_whole_node_reset_boards_are_node_level() -> None:
    assert "reset only together" in why(finding(GPU3), labels={PRODUCT_LABEL: "Tesla-V100-SXM2-32GB"})


@pytest.mark.parametrize(("labels", "capacity"), [
    ({"nvidia.com/mig.strategy": "single"}, None),
    ({}, {"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "7"}),
])
def test_mig_nodes_are_node_level(labels: dict[str, str], capacity: dict[str, str] | None) -> None:
    assert why(finding(GPU3), labels=labels, capacity=capacity) == "the node has MIG GPUs"


def test_the_same_gpu_failing_again_after_its_return_is_node_level() -> None:
    returned = HistoryEntry(at=9 * DAY, kind="xid", code="48", action=ACTION_RESET_GPU, outcome="repaired",
                            gpus=(GPU3,), scope=SCOPE_GPU)
    assert "GPU-3 was isolated before" in why(finding(GPU3), history=(returned,))
    assert why(finding("GPU-5"), history=(returned,)) == "", "another GPU is not a recurrence"
    assert why(finding(GPU3), history=(returned,), now=20 * DAY) == "", "outside the repeat window"
    node_level = HistoryEntry(at=9 * DAY, kind="xid", code="48", action=ACTION_RESET_GPU, outcome="repaired",
                              gpus=(GPU3,), scope="node")
    assert why(finding(GPU3), history=(node_level,)) == ""
