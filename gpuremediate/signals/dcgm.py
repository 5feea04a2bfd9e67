"""dcgm-exporter series → per-GPU readings grouped by node.

One reading per GPU (per MIG instance when a series carries ``GPU_I_ID``). DCGM's blank values of
every width, NaN, infinities and values outside a field's physical range (a temperature of 0 from a
sensor the GPU lacks, an XID of 4294967295) are missing, never readings: see ``signals.model``.
A series whose ``gpu``, ``GPU_I_ID`` or ``xid`` label is not a plain number is malformed: skipped,
counted in ``malformed_lines`` and named in ``problems``. So is one whose label that names the GPU or the node
(``KEY_LABELS``: UUID, gpu, pci_bus_id, Hostname, ...) holds a quote: no real UUID, bus id or host name has one,
and the lenient parser keeps a raw quote inside a value (``signals.exposition``), so a line corrupted on the way
(``UUID="GPU-c2f76b33"7953-..."``) would otherwise name a GPU or a node that is not there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpuremediate.signals import fabric
from gpuremediate.signals.exposition import Labels, Sample
from gpuremediate.signals.model import (
    GpuReading,
    NodeReadings,
    PodRef,
    ascii_int,
    frozen_mapping,
    is_dcgm_blank,
    plausible_count,
    plausible_flag,
    plausible_temp,
    plausible_xid,
)

NODE_LABEL_CANDIDATES = ("Hostname", "hostname", "node", "kubernetes_node")
# the labels a GPU and its node are keyed on: a quote in one is a corrupted line, never a name
KEY_LABELS = ("gpu", "GPU_I_ID", "UUID", "uuid", "pci_bus_id", *NODE_LABEL_CANDIDATES)
DRIVER_VERSION_LABEL = "DCGM_FI_DRIVER_VERSION"

XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT_SERIES = "DCGM_EXP_XID_ERRORS_COUNT"
# DCGM field → the GpuReading attribute it fills
NAMED_FIELDS: Mapping[str, str] = {
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_volatile",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failure",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "row_remap_pending",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "uncorrectable_remapped_rows",
    "DCGM_FI_DEV_GPU_TEMP": "gpu_temp",
    "DCGM_FI_DEV_MEMORY_TEMP": "memory_temp",
}
# GpuReading attribute → what makes its value a reading (else it is missing)
PLAUSIBLE: Mapping[str, Callable[[float], float | None]] = {
    "ecc_dbe_volatile": plausible_count,
    "row_remap_failure": plausible_flag,
    "row_remap_pending": plausible_flag,
    "uncorrectable_remapped_rows": plausible_count,
    "gpu_temp": plausible_temp,
    "memory_temp": plausible_temp,
}
MAX_PROBLEMS = 10  # problems named per node; the count is always complete


@dataclass
class _GpuBuilder:
    node: str
    gpu: str
    mig_instance: str | None
    identity: dict[str, str] = field(default_factory=dict)  # uuid, pci_bus_id, model: first non-empty wins
    values: dict[str, float] = field(default_factory=dict)
    xid: int | None = None
    xid_counts: dict[int, float] = field(default_factory=dict)
    xid_messages: dict[int, tuple[str, ...]] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    pods: set[PodRef] = field(default_factory=set)
    fabric_labels: dict[str, str] = field(default_factory=dict)  # DCGM's string fabric fields, as labels

    def build(self) -> GpuReading:
        return GpuReading(
            node=self.node,
            gpu=self.gpu,
            uuid=self.identity.get("uuid"),
            pci_bus_id=self.identity.get("pci_bus_id"),
            model=self.identity.get("model"),
            mig_instance=self.mig_instance,
            xid=self.xid,
            xid_counts=frozen_mapping(self.xid_counts),
            xid_messages=frozen_mapping(self.xid_messages),
            pods=tuple(sorted(self.pods, key=lambda pod: (pod.namespace, pod.name))),
            extra=frozen_mapping(self.extra),
            ecc_dbe_volatile=self.values.get("ecc_dbe_volatile"),
            row_remap_failure=self.values.get("row_remap_failure"),
            row_remap_pending=self.values.get("row_remap_pending"),
            uncorrectable_remapped_rows=self.values.get("uncorrectable_remapped_rows"),
            gpu_temp=self.values.get("gpu_temp"),
            memory_temp=self.values.get("memory_temp"),
            fabric=fabric.from_dcgm(self.extra, self.fabric_labels),
        )


def readings_from_samples(
    samples: Iterable[Sample],
    *,
    node: str | None,
    source: str,
    observed_at: float,
    malformed_lines: int = 0,
    node_label: str | None = None,
) -> list[NodeReadings]:
    """Group dcgm-exporter samples into one ``NodeReadings`` per node.

    With ``node`` (scraping one exporter pod: its spec.nodeName) every series belongs to that node and
    the result always holds exactly that node. Without it (e.g. series from Prometheus) the node comes
    from ``node_label``, or the first of Hostname, hostname, node, kubernetes_node a series carries;
    a series with none of them cannot be placed and is left out.
    """
    gpus: dict[tuple[str, str, str | None], _GpuBuilder] = {}
    drivers: dict[str, str] = {}
    problems: dict[str, list[str]] = {}
    labels_to_try = (node_label,) if node_label else NODE_LABEL_CANDIDATES
    series: dict[int, _Series] = {}  # id(labels) -> what they say (a GPU's label set is in many families)
    unplaced = 0  # lines whose node label holds a quote: no node to name them under, counted as unreadable lines
    for sample in samples:
        name = sample.name
        if not name.startswith("DCGM_"):
            continue
        known = series.get(id(sample.labels))
        if known is None:
            known = series[id(sample.labels)] = _Series(sample.labels, node, labels_to_try)
        if known.key is None:
            unplaced += known.unplaced
            continue
        if known.malformed or (name == XID_COUNT_SERIES and _label_problem(name, known.labels)):
            problems.setdefault(known.key[0], []).append(_label_problem(name, known.labels))
            continue
        builder = known.builder
        if builder is None:
            builder = known.builder = gpus.get(known.key) or gpus.setdefault(known.key, _GpuBuilder(*known.key))
            _add_identity(builder, known.labels)
            if known.labels.get(DRIVER_VERSION_LABEL):
                drivers.setdefault(known.key[0], known.labels[DRIVER_VERSION_LABEL])
        _add_value(builder, name, known.labels, sample.value)
    nodes = sorted({key[0] for key in gpus} | set(problems) | ({node} if node is not None else set()))
    return [_node_readings(name, gpus, drivers, source, observed_at, malformed_lines + unplaced,
                           problems.get(name, []))
            for name in nodes]


class _Series:
    """One label set of the samples, read once: its GPU (``key``: node, gpu, MIG instance; None when it names
    no GPU or no node, and is left out), whether its gpu / GPU_I_ID labels are malformed, and its builder
    once a sample of it was taken. ``raw`` keeps the labels alive, so their id stays theirs for the call."""

    __slots__ = ("builder", "key", "labels", "malformed", "raw", "unplaced")

    def __init__(self, raw: Labels, node: str | None, labels_to_try: tuple[str | None, ...]) -> None:
        self.raw, self.labels = raw, dict(raw)
        gpu = self.labels.get("gpu")
        owner = node if node is not None else _node_of(self.labels, labels_to_try)
        self.unplaced = bool(owner and '"' in owner)  # a corrupted node name: never a node of its own
        self.key = (owner, gpu, self.labels.get("GPU_I_ID") or None) if gpu and owner and not self.unplaced else None
        self.malformed = bool(self.key and _label_problem("", self.labels))
        self.builder: _GpuBuilder | None = None


def _label_problem(name: str, labels: Mapping[str, str]) -> str:
    """Why a series' key labels cannot be read ("" when they can): a quote in one, a number that is not."""
    for label in KEY_LABELS:
        text = labels.get(label)
        if text and '"' in text:
            return f"{name}: label {label}={text[:40]!r} holds a quote (a corrupted line); series skipped"
    for label in ("gpu", "GPU_I_ID") + (("xid",) if name == XID_COUNT_SERIES else ()):
        text = labels.get(label)
        if text and ascii_int(text) is None:
            return f"{name}: label {label}={text[:40]!r} is not a number; series skipped"
    return ""


def _node_of(labels: Mapping[str, str], candidates: Iterable[str | None]) -> str | None:
    for candidate in candidates:
        if candidate and labels.get(candidate):
            return labels[candidate]
    return None


def _add_identity(builder: _GpuBuilder, labels: Mapping[str, str]) -> None:
    for key, label in (("uuid", "UUID"), ("uuid", "uuid"), ("pci_bus_id", "pci_bus_id"), ("model", "modelName")):
        if labels.get(label) and key not in builder.identity:
            builder.identity[key] = labels[label]
    for label in fabric.LABEL_FIELDS:
        if labels.get(label) and label not in builder.fabric_labels:
            builder.fabric_labels[label] = labels[label]
    if labels.get("pod") and labels.get("namespace"):
        builder.pods.add(PodRef(labels["namespace"], labels["pod"]))


def _add_value(builder: _GpuBuilder, name: str, labels: Mapping[str, str], value: float) -> None:
    if is_dcgm_blank(value):
        return
    if name == XID_FIELD:
        builder.xid = 0 if value == 0 else plausible_xid(value)  # 0: no XID since the exporter started
        _add_message(builder, builder.xid, labels)
    elif name == XID_COUNT_SERIES:
        code, count = plausible_xid(ascii_int(labels.get("xid"))), plausible_count(value)
        if code is not None and count is not None:
            builder.xid_counts[code] = count
            _add_message(builder, code, labels)
    elif name in NAMED_FIELDS:
        attr = NAMED_FIELDS[name]
        reading = PLAUSIBLE[attr](value)
        if reading is not None:
            builder.values[attr] = reading
    elif name.startswith("DCGM_FI_"):
        builder.extra[name] = value


def _add_message(builder: _GpuBuilder, code: int | None, labels: Mapping[str, str]) -> None:
    message = labels.get("err_msg")
    if code and message and message not in builder.xid_messages.get(code, ()):
        builder.xid_messages[code] = (*builder.xid_messages.get(code, ()), message)


def _node_readings(
    node: str,
    gpus: Mapping[tuple[str, str, str | None], _GpuBuilder],
    drivers: Mapping[str, str],
    source: str,
    observed_at: float,
    malformed_lines: int,
    problems: list[str],
) -> NodeReadings:
    mine = sorted((key for key in gpus if key[0] == node), key=_gpu_order)
    meta = {"driver_version": drivers[node]} if node in drivers else {}
    return NodeReadings(
        node=node,
        source=source,
        observed_at=observed_at,
        gpus=tuple(gpus[key].build() for key in mine),
        malformed_lines=malformed_lines + len(problems),
        meta=MappingProxyType(meta),
        problems=tuple(problems[:MAX_PROBLEMS]),
    )


def _gpu_order(key: tuple[str, str, str | None]) -> tuple[int, str, int]:
    _, gpu, mig = key  # both checked by _label_problem: ASCII digits
    return (ascii_int(gpu) or 0, gpu, -1 if mig is None else ascii_int(mig) or 0)
