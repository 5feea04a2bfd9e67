"""Builders shared by the policy tests (a unique module name: tests/ dirs share sys.path)."""

from __future__ import annotations

from typing import Any

from gpuremediate.policy.config import Policy, default_policy
from gpuremediate.policy.evaluate import Evaluation, PolicyMemory, evaluate
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings

NODE = "gpu-node-1"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def gpu(index: str = "0", uuid: str | None = UUID, **fields: Any) -> GpuReading:
    return GpuReading(node=NODE, gpu=index, uuid=uuid, **fields)


def node(*gpus: GpuReading, status: str = SOURCE_OK) -> NodeReadings:
    return NodeReadings(node=NODE, source="exporter", status=status, observed_at=0.0, gpus=gpus)


def run(readings: NodeReadings, policy: Policy | None = None, memory: PolicyMemory | None = None,
        now: float = 1000.0) -> Evaluation:
    return evaluate(readings, policy or default_policy().defaults, memory or PolicyMemory(), now)


def fingerprints(evaluation: Evaluation) -> list[str]:
    return [finding.fingerprint for finding in evaluation.findings]
