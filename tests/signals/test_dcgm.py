"""dcgm-exporter series → NodeReadings: real scrapes and the exporter's edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuremediate.signals.dcgm import readings_from_samples
from gpuremediate.signals.exposition import Sample, parse
from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings, PodRef

DATA = Path(__file__).resolve().parent / "data" / "dcgm-exporter"
L4_UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
A100_NODE = "vks-cluster-0-0-np1-worker-xtxww-xw4wp-wn7j2"


def readings(text: str, node: str | None = None, node_label: str | None = None) -> list[NodeReadings]:
    result = parse(text, strict=False)
    return readings_from_samples(result.samples, node=node, source="exporter", observed_at=100.0,
                                 malformed_lines=len(result.malformed), node_label=node_label)


def scrape(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def series(name: str, value: str, **labels: str) -> str:
    base = {"gpu": "0", "UUID": "GPU-a", "Hostname": "node-a"} | labels
    body = ",".join(f'{k}="{v}"' for k, v in base.items() if v != "-")
    return f"{name}{{{body}}} {value}\n"


def only_gpu(text: str) -> GpuReading:
    [node] = readings(text)
    [gpu] = node.gpus
    return gpu


def test_l4_scrape_grouped_by_hostname() -> None:
    [node] = readings(scrape("scrape-L4-default.prom"))
    assert (node.node, node.source, node.status, node.observed_at, node.malformed_lines) == (
        "i-030791dc5a37cd257", "exporter", SOURCE_OK, 100.0, 0)
    assert dict(node.meta) == {"driver_version": "580.105.08"}
    [gpu] = node.gpus
    assert (gpu.gpu, gpu.uuid, gpu.pci_bus_id, gpu.model, gpu.mig_instance) == (
        "0", L4_UUID, "00000000:31:00.0", "NVIDIA L4", None)
    # the L4 has no memory temperature sensor: DCGM_FI_DEV_MEMORY_TEMP reads 0, which is no reading
    assert (gpu.gpu_temp, gpu.memory_temp, gpu.row_remap_failure, gpu.uncorrectable_remapped_rows) == (
        31.0, None, 0.0, 0.0)
    # the default counters have no XID series until an XID happens, and no ECC / pending remap
    assert (gpu.xid, gpu.ecc_dbe_volatile, gpu.row_remap_pending, dict(gpu.xid_counts)) == (None, None, None, {})
    assert gpu.extra["DCGM_FI_DEV_POWER_USAGE"] == 16.365
    assert gpu.extra["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 4742776.0
    assert gpu.extra["DCGM_FI_PROF_PCIE_TX_BYTES"] == 112603.0
    assert len(gpu.extra) == 19 and "DCGM_FI_DEV_GPU_TEMP" not in gpu.extra
    assert gpu.key == L4_UUID


def test_a100_scrape_with_err_code_labels_and_a_zero_xid() -> None:
    gpu = only_gpu(scrape("scrape-A100-vgpu-xid-labels.prom"))
    assert gpu.node == A100_NODE
    assert (gpu.uuid, gpu.model, gpu.xid, gpu.gpu_temp, gpu.memory_temp) == (
        "GPU-f809e614-a528-4083-acbf-334600000000", "GRID A100-8C", 0, None, None)  # vGPU: memory temp 0
    assert gpu.extra["DCGM_FI_DEV_FB_FREE"] == 7531.0 and gpu.extra["DCGM_FI_DEV_SM_CLOCK"] == 1410.0


def test_exporter_test_response_has_no_dcgm_field() -> None:
    text = scrape("exporter-test-response.prom")
    assert readings(text) == []
    [node] = readings(text, node="spec-node")
    assert (node.node, node.gpus) == ("spec-node", ())


def test_given_node_owns_every_series_whatever_its_hostname() -> None:
    text = series("DCGM_FI_DEV_GPU_TEMP", "50", Hostname="a") + series("DCGM_FI_DEV_GPU_TEMP", "60", gpu="1",
                                                                        Hostname="b", UUID="GPU-b")
    [node] = readings(text, node="from-spec")
    assert [(g.node, g.gpu, g.gpu_temp) for g in node.gpus] == [("from-spec", "0", 50.0), ("from-spec", "1", 60.0)]


def test_both_hostname_spellings_and_a_chosen_node_label() -> None:
    text = (series("DCGM_FI_DEV_GPU_TEMP", "40", Hostname="old")
            + series("DCGM_FI_DEV_GPU_TEMP", "41", Hostname="-", hostname="new")
            + series("DCGM_FI_DEV_GPU_TEMP", "42", Hostname="-", kubernetes_node="k8s")
            + series("DCGM_FI_DEV_GPU_TEMP", "43", Hostname="-"))  # no node label: cannot be placed
    assert [(n.node, n.gpus[0].gpu_temp) for n in readings(text)] == [("k8s", 42.0), ("new", 41.0), ("old", 40.0)]
    assert [n.node for n in readings(text, node_label="kubernetes_node")] == ["k8s"]


@pytest.mark.parametrize("placeholder", ["9223372036854775794", "9223372036854775807", "9.22e18", "NaN", "+Inf"])
def test_placeholders_and_nan_are_missing_not_readings(placeholder: str) -> None:
    text = "".join(series(name, placeholder) for name in (
        "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE"))
    gpu = only_gpu(text)
    assert (gpu.gpu_temp, gpu.ecc_dbe_volatile, gpu.xid) == (None, None, None)
    assert dict(gpu.extra) == {}


# dcgm_structs.h: DCGM_INT32_BLANK 0x7ffffff0, DCGM_FP64_BLANK 2**47, DCGM_INT64_BLANK 0x7ffffffffffffff0,
# each followed by NOT_FOUND (+1), NOT_SUPPORTED (+2), NOT_PERMISSIONED (+3)
DCGM_BLANKS = ["2147483632", "2147483633", "2147483634", "2147483635", "2147483647",
               "140737488355328", "140737488355329.0", "1.40737488355330e14", "140737488355331",
               "9223372036854775792", "9223372036854775795"]


@pytest.mark.parametrize("blank", DCGM_BLANKS)
def test_dcgm_blanks_of_every_width_are_missing(blank: str) -> None:
    names = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
             "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
             "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_FB_FREE")
    text = "".join(series(name, blank) for name in names) + series("DCGM_EXP_XID_ERRORS_COUNT", blank, xid="79")
    gpu = only_gpu(text)
    assert (gpu.gpu_temp, gpu.memory_temp, gpu.ecc_dbe_volatile, gpu.xid, gpu.row_remap_failure,
            gpu.row_remap_pending, gpu.uncorrectable_remapped_rows) == (None,) * 7
    assert dict(gpu.extra) == {} and dict(gpu.xid_counts) == {}


@pytest.mark.parametrize(("name", "value"), [
    ("DCGM_FI_DEV_GPU_TEMP", "9.2e18"), ("DCGM_FI_DEV_GPU_TEMP", "0"), ("DCGM_FI_DEV_GPU_TEMP", "-5"),
    ("DCGM_FI_DEV_GPU_TEMP", "4000"), ("DCGM_FI_DEV_MEMORY_TEMP", "0"), ("DCGM_FI_DEV_XID_ERRORS", "4294967295"),
    ("DCGM_FI_DEV_XID_ERRORS", "-1"), ("DCGM_FI_DEV_XID_ERRORS", "79.5"), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "7"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "-1"), ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "-3"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "3e9"),
])
def test_values_outside_the_physical_range_are_missing(name: str, value: str) -> None:
    gpu = only_gpu(series(name, value) + series("DCGM_FI_DEV_SM_CLOCK", "1410"))
    assert (gpu.gpu_temp, gpu.memory_temp, gpu.xid, gpu.row_remap_failure, gpu.row_remap_pending,
            gpu.ecc_dbe_volatile, gpu.uncorrectable_remapped_rows) == (None,) * 7


def test_xid_count_for_an_implausible_code_is_dropped() -> None:
    gpu = only_gpu(series("DCGM_EXP_XID_ERRORS_COUNT", "1", xid="4294967295")
                   + series("DCGM_EXP_XID_ERRORS_COUNT", "2", xid="79"))
    assert dict(gpu.xid_counts) == {79: 2.0}


@pytest.mark.parametrize("labels", [{"gpu": "\u00b2"}, {"xid": "\u00b2"}, {"GPU_I_ID": "\u00b2"},
                                    {"gpu": "\u0663"}, {"xid": "junk"}])
def test_non_ascii_digit_labels_are_malformed_series_not_an_exception(labels: dict[str, str]) -> None:
    labels = {key: value.encode().decode("unicode_escape") for key, value in labels.items()}
    bad = series("DCGM_EXP_XID_ERRORS_COUNT", "3", **({"xid": "79"} | labels))
    good = series("DCGM_FI_DEV_GPU_TEMP", "50", gpu="1", UUID="GPU-b")
    [node] = readings(good + bad + good.replace("50", "51").replace('"1"', '"2"').replace("GPU-b", "GPU-c"))
    assert [(g.gpu, g.gpu_temp, dict(g.xid_counts)) for g in node.gpus] == [("1", 50.0, {}), ("2", 51.0, {})]
    assert node.malformed_lines == 1
    [problem] = node.problems
    assert "DCGM_EXP_XID_ERRORS_COUNT" in problem and "not a number" in problem


def test_xid_gauge_counts_and_health_fields() -> None:
    text = (series("DCGM_FI_DEV_XID_ERRORS", "79", err_code="79", err_msg="GPU has fallen off the bus")
            + series("DCGM_EXP_XID_ERRORS_COUNT", "2", xid="79") + series("DCGM_EXP_XID_ERRORS_COUNT", "1", xid="13")
            + series("DCGM_EXP_XID_ERRORS_COUNT", "5", xid="junk")
            + series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "3") + series("DCGM_FI_DEV_ROW_REMAP_PENDING", "1")
            + series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1") + series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "4"))
    gpu = only_gpu(text)
    assert gpu.xid == 79 and dict(gpu.xid_counts) == {13: 1.0, 79: 2.0}
    assert (gpu.ecc_dbe_volatile, gpu.row_remap_pending, gpu.row_remap_failure, gpu.uncorrectable_remapped_rows) == (
        3.0, 1.0, 1.0, 4.0)
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in gpu.extra


def test_raw_quotes_in_err_msg_still_give_the_xid() -> None:
    text = 'DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-x",err_msg="bad "thing"",Hostname="n"} 48\n'
    assert only_gpu(text).xid == 48


def test_mig_instances_are_separate_readings() -> None:
    text = (series("DCGM_FI_DEV_GPU_TEMP", "55", GPU_I_ID="2", GPU_I_PROFILE="1g.10gb")
            + series("DCGM_FI_DEV_GPU_TEMP", "56", GPU_I_ID="1")
            + series("DCGM_FI_DEV_GPU_TEMP", "57"))
    [node] = readings(text)
    assert [(g.gpu, g.mig_instance, g.gpu_temp) for g in node.gpus] == [("0", None, 57.0), ("0", "1", 56.0),
                                                                         ("0", "2", 55.0)]


def test_pods_lowercase_uuid_and_gpu_order() -> None:
    text = (series("DCGM_FI_DEV_GPU_TEMP", "1", gpu="10", UUID="-", uuid="GPU-low", pod="train-0",
                   namespace="ml", container="c")
            + series("DCGM_FI_DEV_MEMORY_TEMP", "2", gpu="10", UUID="-", uuid="GPU-low", pod="train-1",
                     namespace="ml")
            + series("DCGM_FI_DEV_GPU_TEMP", "3", gpu="2", pod="", namespace=""))
    [node] = readings(text)
    assert [g.gpu for g in node.gpus] == ["2", "10"]
    ten = node.gpus[1]
    assert ten.uuid == "GPU-low" and ten.pods == (PodRef("ml", "train-0"), PodRef("ml", "train-1"))
    assert node.gpus[0].pods == ()


def test_series_without_a_gpu_label_or_other_exporters_are_ignored() -> None:
    samples = [Sample("DCGM_FI_DEV_GPU_TEMP", (("Hostname", "n"),), 1.0),
               Sample("node_load1", (("Hostname", "n"), ("gpu", "0")), 1.0)]
    assert readings_from_samples(samples, node=None, source="prometheus", observed_at=0.0) == []


def test_malformed_line_count_is_carried() -> None:
    text = series("DCGM_FI_DEV_GPU_TEMP", "50") + 'DCGM_FI_DEV_GPU_TEMP{gpu="1 2\n'
    [node] = readings(text)
    assert node.malformed_lines == 1 and len(node.gpus) == 1


def test_a_label_set_missing_a_comma_invents_no_gpu() -> None:
    # NVIDIA's README sample line shape: `{gpu="0" UUID="..."}`
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="0" UUID="GPU-a",Hostname="node-a"} 97\n' + series("DCGM_FI_DEV_GPU_TEMP", "40",
                                                                                         gpu="1", UUID="GPU-b")
    [node] = readings(text)
    assert [(g.gpu, g.uuid, g.gpu_temp) for g in node.gpus] == [("1", "GPU-b", 40.0)]
    assert node.malformed_lines == 1


def unshared(samples: list[Sample]) -> list[Sample]:
    """The same samples, each with a label tuple of its own (the parser shares one per label text)."""
    return [Sample(s.name, tuple(tuple(pair) for pair in s.labels), s.value, s.timestamp) for s in samples]


@pytest.mark.parametrize("name", ["scrape-A100-vgpu-xid-labels.prom", "scrape-L4-default.prom"])
def test_shared_label_sets_read_as_copies_do(name: str) -> None:
    samples = parse(scrape(name), strict=False).samples
    shared = {id(s.labels) for s in samples}
    assert len(shared) < len(samples)  # the parser does share them: what is read once per label set
    for node in (None, "the-node"):
        assert readings_from_samples(samples, node=node, source="exporter", observed_at=1.0) == \
            readings_from_samples(unshared(samples), node=node, source="exporter", observed_at=1.0)


def test_each_series_of_a_malformed_label_set_counts() -> None:
    text = "".join(series(name, "1", gpu="x1") for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
                                                            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"))
    [node] = readings(text + series("DCGM_FI_DEV_GPU_TEMP", "40", gpu="1"))
    assert [g.gpu for g in node.gpus] == ["1"] and node.malformed_lines == 3
    assert [p.split(":")[0] for p in node.problems] == ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
                                                        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]


# issue 45: the lenient parser keeps a raw quote inside a label value (prometheus_client rejects the line); in a
# label the controller keys a GPU or a node on, it is a corrupted line: skipped and counted, never a name
@pytest.mark.parametrize(("label", "good", "bad", "node"), [
    ("UUID", L4_UUID, 'GPU-c2f76b33"7953-256e-8f33-1343419b1a1c', "the-node"),
    ("pci_bus_id", "00000000:31:00.0", '00000000"31:00.0', "the-node"),
    ("Hostname", "i-030791dc5a37cd257", 'i-030791dc5"37cd257', None),
])
def test_a_quote_in_a_key_label_of_the_l4_scrape_is_a_malformed_line(
    label: str, good: str, bad: str, node: str | None
) -> None:
    text = scrape("scrape-L4-default.prom")
    first = next(line for line in text.splitlines() if line.startswith("DCGM_"))
    corrupted = first.replace(f'{label}="{good}"', f'{label}="{bad}"')
    assert corrupted != first
    parsed = parse(text.replace(first, corrupted), strict=False)
    assert not parsed.malformed and any(s.label(label) == bad for s in parsed.samples)  # the parser kept the value
    [reading] = readings(text.replace(first, corrupted), node=node)  # no node named after a corrupted Hostname
    clean = readings(text, node=node)[0]
    assert reading.malformed_lines == 1
    assert label == "Hostname" or "holds a quote" in reading.problems[0]
    assert [(g.uuid, g.pci_bus_id) for g in reading.gpus] == [(L4_UUID, "00000000:31:00.0")]
    assert reading.node == clean.node and reading.gpus[0].extra == {
        k: v for k, v in clean.gpus[0].extra.items() if k != first.partition("{")[0]}
