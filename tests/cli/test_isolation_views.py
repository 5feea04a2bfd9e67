"""``status`` and ``explain`` for a node with one GPU isolated by a DeviceTaintRule (``[isolation] scope = "gpu"``):
``7/8 GPUs`` in the table, -o wide and -o json alike; the GPU, the rule and what the flow waits for in words."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gpuremediate import fleet
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states

RULE = "gpur-gpu-a-gpu-3-0123456789"
ISOLATION = r.Isolation(r.SCOPE_GPU, uuid="GPU-3", rule=RULE, driver="gpu.nvidia.com", pool="gpu-a", device="gpu-3",
                        effect="NoExecute", effect_since=90.0)
WAITING = "isolation: waiting for the eviction controller to delete workloads/w3 (claim workloads/w3)"


def node(record: r.NodeRecord) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-a", "annotations": {r.RECORD_ANNOTATION: r.encode(record)}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}}


def draining() -> r.NodeRecord:
    fault = r.Fault("xid", "48", ("GPU-3",), "xid:48", "reset-gpu", 80.0, 80.0, "XID 48")
    action = r.ActionInProgress("drain", "", 1, 85.0, detail=WAITING)
    return r.NodeRecord(state=states.DRAINING, since=80.0, reason="xid-48", fault=fault, action=action,
                        isolation=ISOLATION)


def test_status_says_seven_of_eight_gpus_in_every_output() -> None:
    row = fleet.row_for(node(draining()), now=100.0)
    assert row.isolated == ("GPU-3",) and row.gpus_in_service == "7/8 GPUs"
    assert "draining (7/8 GPUs)" in fleet.render_status([row], now=100.0)
    wide = fleet.render_status([row], now=100.0, wide=True)
    assert " 7/8 " in wide.splitlines()[1]
    as_json = json.loads(json.dumps(row.as_dict()))
    assert as_json["isolatedGPUs"] == ["GPU-3"] and as_json["gpusInService"] == 7 and as_json["gpus"] == 8


def test_a_node_level_node_shows_no_fraction() -> None:
    record = r.NodeRecord(state=states.DRAINING, since=80.0, isolation=r.Isolation(r.SCOPE_NODE, why="MIG"))
    row = fleet.row_for(node(record), now=100.0)
    assert row.isolated == () and row.gpus_in_service == ""
    assert "GPUs)" not in fleet.render_status([row], now=100.0)


def test_explain_names_the_gpu_the_rule_and_what_it_waits_for() -> None:
    text = fleet.explain(draining(), "gpu-a", now=100.0)
    assert f"GPU GPU-3 (gpu.nvidia.com/gpu-a/gpu-3) taken out alone by DeviceTaintRule {RULE}, effect NoExecute" in text
    assert "Drain: waiting for the eviction controller to delete workloads/w3" in text


def test_explain_says_why_a_flow_is_node_level() -> None:
    escalated = r.NodeRecord(state=states.DRAINING, since=80.0, isolation=r.Isolation(
        r.SCOPE_NODE, uuid="GPU-3", why="XID 48 on GPU-5 while GPU GPU-3 is isolated: node-level", rule=RULE))
    text = fleet.explain(escalated, "gpu-a", now=100.0)
    assert "Isolation: node-level: XID 48 on GPU-5 while GPU GPU-3 is isolated" in text
    assert f"DeviceTaintRule {RULE} stays until the node is validated" in text


def by_device_plugin(effect: str) -> r.NodeRecord:
    isolation = r.Isolation(r.SCOPE_GPU, uuid="GPU-3", why="no DRA device taint", via=r.VIA_DEVICE_PLUGIN,
                            effect=effect, effect_since=90.0)
    return dataclasses.replace(draining(), isolation=isolation, action=None)


def test_a_gpu_the_device_plugin_holds_out_is_seven_of_eight_and_explained() -> None:
    row = fleet.row_for(node(by_device_plugin(r.EFFECT_UNHEALTHY)), now=100.0)
    assert row.isolated == ("GPU-3",) and row.gpus_in_service == "7/8 GPUs"
    text = fleet.explain(by_device_plugin(r.EFFECT_UNHEALTHY), "gpu-a", now=100.0)
    assert "GPU GPU-3 taken out alone by the device plugin" in text and "DeviceTaintRule" not in text


def test_a_gpu_the_device_plugin_has_not_dropped_yet_is_not_counted_out() -> None:
    row = fleet.row_for(node(by_device_plugin("")), now=100.0)
    assert row.isolated == () and row.gpus_in_service == ""
    text = fleet.explain(by_device_plugin(""), "gpu-a", now=100.0)
    assert "waiting for 10s for the node's allocatable nvidia.com/gpu to show it gone" in text
