"""[gpu_operator]: which nodes get the reset sequence, which GPUs reset together, and bad values named."""

from __future__ import annotations

import pytest

from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.gpu_operator import SCOPE_GPU, SCOPE_NODE, GpuOperatorPolicy
from gpuremediate.vocab.schema import PolicyError

OPERATOR_NODE = {"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true",
                 "nvidia.com/gpu.deploy.dcgm": "false"}


def test_the_sequence_applies_only_where_an_operand_is_deployed() -> None:
    policy = GpuOperatorPolicy()
    assert policy.applies(OPERATOR_NODE)
    assert policy.operands_on(OPERATOR_NODE) == ["nvidia.com/gpu.deploy.device-plugin",
                                                 "nvidia.com/gpu.deploy.dcgm-exporter"]
    assert not policy.applies({"nvidia.com/gpu.present": "true"})  # no operator: the bare reset Job
    assert not policy.applies({"nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade"})
    assert not GpuOperatorPolicy(enabled=False).applies(OPERATOR_NODE)


@pytest.mark.parametrize(("product", "scope"), [
    ("Tesla-V100-SXM2-32GB", SCOPE_NODE), ("Tesla-V100-SXM3-32GB-H", SCOPE_NODE),
    ("NVIDIA-H100-80GB-HBM3", SCOPE_GPU), ("NVIDIA-A100-SXM4-80GB", SCOPE_GPU), ("", SCOPE_GPU),
])
def test_auto_scope_resets_pre_ampere_nvlink_nodes_whole(product: str, scope: str) -> None:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    assert GpuOperatorPolicy().reset_scope(labels) == scope


def test_a_fixed_scope_wins_over_the_product() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert GpuOperatorPolicy(scope="node").reset_scope(labels) == SCOPE_NODE


def test_the_file_sets_operands_and_groups_override() -> None:
    text = """
[gpu_operator]
operands = ["device-plugin=nvidia-device-plugin-daemonset"]
gone_timeout_s = 30
[[groups]]
name = "dgx2"
selector = "pool=dgx2"
gpu_operator = {scope = "node"}
"""
    policy_file = loads_policy(text)
    assert policy_file.defaults.gpu_operator.apps == {"nvidia.com/gpu.deploy.device-plugin":
                                                      "nvidia-device-plugin-daemonset"}
    assert policy_file.for_node({"pool": "dgx2"}).gpu_operator.scope == "node"
    assert policy_file.for_node({"pool": "dgx2"}).gpu_operator.gone_timeout_s == 30.0


@pytest.mark.parametrize(("body", "message"), [
    ('operands = ["device-plugin"]', 'gpu_operator.operands[0]: expected "<operand>=<pod app label>"'),
    ('operands = ["bad key!=x"]', "gpu_operator.operands[0]: nvidia.com/gpu.deploy.bad key! is not a label key"),
    ("operands = []", "gpu_operator.operands: expected a non-empty array"),
    ('scope = "rack"', "gpu_operator.scope: expected one of auto, gpu, node"),
    ('off_value = "true"', 'gpu_operator.off_value: "true" deploys the operands'),
    ("gone_timeout_s = 0", "gpu_operator.gone_timeout_s: must be between 1 and 86400"),
    ('command = ""', "gpu_operator.command: must not be empty"),
])
def test_bad_values_are_named(body: str, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        loads_policy(f"[gpu_operator]\n{body}\n")
    assert message in str(err.value)


@pytest.mark.parametrize("value", ["-off", "a b", "x" * 64, ""])
def test_off_value_must_be_a_label_value(value: str) -> None:
    with pytest.raises(PolicyError) as err:
        loads_policy(f'[gpu_operator]\noff_value = "{value}"\n')
    assert str(err.value).startswith("gpu_operator.off_value: ")
