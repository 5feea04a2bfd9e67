"""A fleet's readings are held between cycles (40,000 GPUs at 5,000 nodes): what each one costs is kept
small without changing a value (issue 16's steady-RSS goal)."""

from __future__ import annotations

import sys
from types import MappingProxyType

from gpuremediate.signals import sources
from gpuremediate.signals.model import EMPTY, GpuReading, NodeReadings, PodRef, frozen_mapping


def test_readings_have_no_per_instance_dict() -> None:
    gpu = GpuReading("n", "0", gpu_temp=40.0)
    for obj in (gpu, NodeReadings("n", "prometheus", gpus=(gpu,)), PodRef("ns", "p")):
        assert not hasattr(obj, "__dict__")
    assert sys.getsizeof(gpu) < 200


def test_empty_mappings_are_one_shared_object_and_values_are_kept() -> None:
    built = GpuReading("n", "0", xid_counts=MappingProxyType({}), extra=MappingProxyType({}))
    assert built.xid_counts is EMPTY and built.xid_messages is EMPTY and built.extra is EMPTY
    assert GpuReading("n", "1").xid_counts is EMPTY
    counted = GpuReading("n", "2", xid_counts=frozen_mapping({79: 1.0, 13: 2.0}))
    assert list(counted.xid_counts.items()) == [(13, 2.0), (79, 1.0)]
    assert frozen_mapping({}) is EMPTY
    assert built == GpuReading("n", "0")


def test_identity_label_pairs_shared_across_a_fleet_are_held_once() -> None:
    def item(node: str, gpu: int) -> dict[str, object]:
        return {"metric": {"Hostname": node, "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}",
                           "modelName": "NVIDIA H100 80GB HBM3", "namespace": "gpu-operator",
                           "pod": f"dcgm-{node}", "exported_pod": f"train-{node}-{gpu}", "exported_namespace": "ml"},
                "value": [100.0, "1"]}

    src = sources.PrometheusSource("http://127.0.0.1:1")
    result = [item(f"node-{n}", g) for n in range(3) for g in range(2)]
    src._query = lambda _query, _what: (result, 100.0)  # type: ignore[method-assign,assignment]
    src._refresh_identity(set())
    first, other = src._identity[("node-0", "0", "")][0], src._identity[("node-2", "1", "")][0]
    assert dict(first) == {"modelName": "NVIDIA H100 80GB HBM3", "namespace": "ml", "pod": "train-node-0-0"}
    assert first[0] is other[0] and first[1] is other[1]  # the model's and the namespace's pair: one object
