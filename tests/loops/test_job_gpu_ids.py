"""Which GPUs a repair Job names (JobLoop.gpu_ids): the readings' indexes, else the fault's own UUIDs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpuremediate.loops.jobs import JobLoop, named_gpu_ids
from gpuremediate.signals.model import GpuReading, NodeReadings
from gpuremediate.vocab import states
from gpuremediate.vocab.record import Fault, NodeRecord

NODE = "gpu-node-1"
UUID1, UUID2 = "GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"


def loop(readings: NodeReadings | None) -> JobLoop:
    made = JobLoop.__new__(JobLoop)
    made.ctx = SimpleNamespace(readings={NODE: readings} if readings else {})  # type: ignore[assignment]
    return made


def readings(*gpus: tuple[str, str]) -> NodeReadings:
    return NodeReadings(node=NODE, source="exporter", gpus=tuple(GpuReading(node=NODE, gpu=i, uuid=u) for i, u in gpus))


def record(*gpus: str) -> NodeRecord:
    fault = Fault(kind="xid", code="48", gpus=gpus, fingerprint="f", action="reset-gpu", first_seen=1.0,
                  last_seen=1.0, message="")
    return NodeRecord(state=states.REPAIRING, since=1.0, fault=fault)


NODE_OBJ: dict[str, Any] = {"metadata": {"name": NODE}}


def test_the_readings_give_the_faulty_gpus_indexes() -> None:
    seen = readings(("0", UUID2), ("1", UUID1))
    assert loop(seen).gpu_ids(NODE_OBJ, record(UUID1)) == (["1"], [UUID1])
    assert loop(seen).gpu_ids(NODE_OBJ, record()) == (["0", "1"], sorted([UUID1, UUID2]))  # names none: all


def test_without_readings_the_fault_names_its_gpus_by_uuid() -> None:
    """A controller restarted before its first scrape, or the exporter gone: never every GPU of the node."""
    assert loop(None).gpu_ids(NODE_OBJ, record(UUID1)) == ([UUID1], [UUID1])
    assert loop(None).gpu_ids(NODE_OBJ, record()) == ([], [])


def test_a_gpu_missing_from_the_readings_is_named_by_the_fault() -> None:
    assert loop(readings(("0", UUID2))).gpu_ids(NODE_OBJ, record(UUID1)) == ([UUID1], [UUID1])


def test_a_gpu_the_exporter_knew_without_a_uuid_is_named_by_its_index() -> None:
    assert named_gpu_ids(NODE, [f"{NODE}/gpu3", UUID1]) == ["3", UUID1]
    assert loop(None).gpu_ids(NODE_OBJ, record(f"{NODE}/gpu3")) == (["3"], [])
