"""NVLink fabric readings (issue 28): nvidia-smi's Fabric section and fabric.* fields, DCGM's fabric and IMEX fields."""

from __future__ import annotations

import pytest

from gpuremediate.signals import fabric
from gpuremediate.signals.dcgm import readings_from_samples
from gpuremediate.signals.exposition import parse
from gpuremediate.signals.fabric_model import GpuFabric
from gpuremediate.signals.nvidiasmi import SmiGpu, gpu_reading, parse_q

CLUSTER = "9c6f5af3-53bf-49b5-a436-b66766c413c3"


def test_smi_completed_success_names_the_clique_as_gfd_does() -> None:
    got = fabric.from_smi("Completed", "Success", "4026", CLUSTER.upper())
    assert got == GpuFabric(state=fabric.STATE_COMPLETED, status="Success", cluster_uuid=CLUSTER, clique_id=4026)
    assert got is not None and got.clique == f"{CLUSTER}.4026"


def test_smi_error_status_is_kept_only_once_completed() -> None:
    done = fabric.from_smi("Completed", "Insufficient Resources", "0", fabric.ZERO_UUID)
    assert done == GpuFabric(state=fabric.STATE_COMPLETED, status="Insufficient Resources", clique_id=0)
    assert done is not None and done.clique is None  # the all-zero UUID: no NVLink domain
    booting = fabric.from_smi("In Progress", "Insufficient Resources", None, None)
    assert booting == GpuFabric(state=fabric.STATE_IN_PROGRESS)


@pytest.mark.parametrize("state", [None, "", "Bogus", "N/A"])
def test_smi_nothing_known_is_no_reading(state: str | None) -> None:
    assert fabric.from_smi(state, None, None, None) is None
    assert fabric.from_smi(state, "Success", "x", "not-a-uuid") is None


@pytest.mark.parametrize("raw", ["-1", "4294967295", "１２", "1.5", "abc"])
def test_clique_ids_out_of_range_are_missing(raw: str) -> None:
    assert fabric.clique_id(raw) is None


def test_q_fabric_section_of_a_real_h100_capture_layout() -> None:
    text = """GPU 00000000:00:09.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 0
        ClusterUUID                       : 00000000-0000-0000-0000-000000000000
        Health
            Summary                       : N/A
"""
    q = parse_q(text)["0000:00:09.0"]
    reading = gpu_reading("n", SmiGpu({"index": "0"}, q))
    # an HGX H100 outside any multi-node domain: completed, Success, no clique: nothing to act on, no domain
    assert reading.fabric == GpuFabric(state=fabric.STATE_COMPLETED, status="Success", clique_id=0)
    assert reading.fabric is not None and reading.fabric.clique is None


def test_smi_query_cells_win_and_placeholders_are_missing() -> None:
    row = {"index": "0", "fabric.state": "In Progress", "fabric.status": "[N/A]", "fabric.cliqueId": "[N/A]",
           "fabric.clusterUuid": "[N/A]"}
    assert gpu_reading("n", SmiGpu(row, {})).fabric == GpuFabric(state=fabric.STATE_IN_PROGRESS)
    assert gpu_reading("n", SmiGpu({"index": "0"}, {})).fabric is None  # a non-NVLink GPU or an old driver


def series(name: str, value: str, **labels: str) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in ({"gpu": "0", "UUID": "GPU-a", "Hostname": "tray-1"} | labels).items())
    return f"{name}{{{body}}} {value}\n"


def dcgm_fabric(text: str) -> GpuFabric | None:
    [node] = readings_from_samples(parse(text, strict=False).samples, node=None, source="exporter", observed_at=1.0)
    [gpu] = node.gpus
    return gpu.fabric


def test_dcgm_fields_and_string_labels() -> None:
    labels = {fabric.FIELD_CLUSTER_UUID: CLUSTER, fabric.FIELD_IMEX_DOMAIN: "UP"}
    text = (series(fabric.FIELD_FM_STATUS, "3", **labels) + series(fabric.FIELD_CLIQUE_ID, "7", **labels)
            + series(fabric.FIELD_IMEX_DAEMON, "5", **labels) + series("DCGM_FI_DEV_GPU_TEMP", "40", **labels))
    assert dcgm_fabric(text) == GpuFabric(state=fabric.STATE_COMPLETED, status="Success", cluster_uuid=CLUSTER,
                                          clique_id=7, imex_daemon=5, imex_domain="UP")


@pytest.mark.parametrize(("raw", "state", "status"), [
    ("0", fabric.STATE_NOT_SUPPORTED, None), ("1", fabric.STATE_NOT_STARTED, None),
    ("2", fabric.STATE_IN_PROGRESS, None), ("4", fabric.STATE_COMPLETED, "Failure (error code 3)"),
])
def test_dcgm_fabric_manager_status_enum(raw: str, state: str, status: str | None) -> None:
    text = series(fabric.FIELD_FM_STATUS, raw) + series(fabric.FIELD_FM_ERROR, "3")
    got = dcgm_fabric(text)
    assert got is not None and (got.state, got.status) == (state, status)


@pytest.mark.parametrize("raw", ["5", "6", "7", "-1", "9223372036854775792", "NaN", "1.5"])
def test_dcgm_unrecognized_too_old_blank_and_garbage_fm_status_is_missing(raw: str) -> None:
    text = series(fabric.FIELD_FM_STATUS, raw) + series("DCGM_FI_DEV_GPU_TEMP", "40",
                                                        DCGM_FI_IMEX_DOMAIN_STATUS="<<<NULL>>>")
    assert dcgm_fabric(text) is None


@pytest.mark.parametrize("raw", ["8", "-4", "2147483632", "1.5"])
def test_dcgm_imex_daemon_outside_its_enum_is_missing(raw: str) -> None:
    assert dcgm_fabric(series(fabric.FIELD_IMEX_DAEMON, raw)) is None


def test_a_node_without_fabric_fields_has_no_fabric_reading() -> None:
    assert dcgm_fabric(series("DCGM_FI_DEV_GPU_TEMP", "40")) is None
