"""A fleet's readings are held between cycles (40,000 GPUs at 5,000 nodes): what each one costs is kept
small without changing a value (issue 16's steady-RSS goal)."""

from __future__ import annotations

import json
import sys
import tracemalloc
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


def _answer(elements: int) -> bytes:
    """A readings answer shaped as Prometheus sends it: 8 GPUs x 2 signals per node."""
    result = [{"metric": {"Hostname": f"node-{i // 16}", "gpu": str(i % 8), "UUID": f"GPU-{i // 2:08d}",
                          sources.NAME_LABEL: ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP")[i % 2]},
               "value": [100.0, str(40 + i % 8)]} for i in range(elements)]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_an_answer_is_never_held_whole_as_dicts_while_decoded() -> None:
    body = _answer(20_000)
    tracemalloc.start()
    try:
        result, eval_time = sources.parse_query_response(body, 0.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert eval_time == 100.0 and len(result) == 20_000
    assert peak < 4 * len(body)  # the text decoded once and the compact elements (decoded whole: 6x)


def test_decoded_elements_share_their_label_pairs_and_keep_every_value() -> None:
    result, _ = sources.parse_query_response(_answer(32), 0.0)
    samples = sources.vector_samples(result)
    assert samples == sources.vector_samples(json.loads(_answer(32))["data"]["result"])
    first, same_node = samples[0].labels, samples[2].labels
    assert dict(first)["Hostname"] == dict(same_node)["Hostname"] == "node-0"
    assert first[0] is same_node[0]  # ("Hostname", "node-0"): one object for the node's 16 series
    assert (samples[0].name, samples[1].name, samples[1].value) == ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
                                                                     41.0)


def test_elements_that_are_not_points_are_skipped_as_before() -> None:
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"metric": "a", "value": "b"}, "value": [1.0, "2"]},  # labels named like the element's keys
        {"metric": {"Hostname": "n"}, "value": [1.0, "not a number"]},
        {"metric": "not labels", "value": [1.0, "1"]}]}}).encode()
    result, eval_time = sources.parse_query_response(body, 0.0)
    assert [sources._point(item) for item in result] == [((("metric", "a"), ("value", "b")), 2.0), None, None]
    assert eval_time == 1.0
