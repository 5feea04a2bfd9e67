"""A synthetic history of a GPU fleet for ``gpuremediate replay``: a month of 200 nodes, 8 GPUs each,
with a handful of faults (dcgm-exporter series, as the controller reads them).

    python -m sim.history OUT [--nodes 200] [--days 30] [--start 2026-11-01T00:00:00Z]
                              [--openmetrics FILE --om-step 60s]
    python -m sim.history OUT --degradation [--nodes 16] [--days 2]   (``degradation_fleet``)
    python -m sim.history OUT --workload [--nodes 8] [--days 1]       (``workload_fleet``: failed pods)

writes ``OUT/scrapes/`` (the saved-scrapes layout of ``gpuremediate.replay.history``: one scrape per
node at the start, one at each change, one at the end; ``OUT/scrapes/pods.jsonl``, the failed pods, where the
scenario has any), ``OUT/nodes.json`` (a NodeList as
``kubectl get nodes -o json`` prints it) and ``OUT/policy-strict.toml`` (a small budget and a
touchy breaker, to compare with the default), and with ``--openmetrics`` one OpenMetrics file for
``promtool tsdb create-blocks-from openmetrics`` (every series every ``--om-step``: keep that to
small fleets or short ranges, a month of 200 nodes at 60 s is 300 million samples).

The faults (day offsets from the start; times are deterministic):
- XID 79 (fell off the bus → reboot) on one node, cleared 2 h later;
- ECC double-bit errors (→ reset-gpu), cleared after 1 h;
- one node with XID 48 four times in five days (repeat offender → quarantined the 4th time);
- a row-remap failure (→ quarantine at once);
- a GPU at 93 °C for 20 min (→ cordon, then thermal clear) and one hot for only 30 s (below the hold);
- a burst: XID 79 on 8 nodes within 4 minutes (a bad rollout: budget and breaker territory);
- an exporter down for 6 h (unknown); XID 13 (policy: none → a notice);
- 3 uncorrectable remapped rows (below the threshold of 8); XID 79 on a node labelled exclude.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DAY, HOUR, MINUTE = 86400.0, 3600.0, 60.0
GPUS = 8
FIELDS = {  # GpuState attribute -> DCGM series
    "xid": "DCGM_FI_DEV_XID_ERRORS",
    "dbe": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "remap_failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "remap_pending": "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "uncorrectable_rows": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "temp": "DCGM_FI_DEV_GPU_TEMP",
    "memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
}
# The series a fleet with ``degradation`` also serves (issue 29: the [degradation] detector's load, clocks, link and
# ECC counters; the driver's recovery action). Healthy: busy at full clock, no errors, recovery action 0 (NONE). A
# Fault's ``values`` set them (``sm_clock``, ``reasons``, ``recovery_action``...); its ``rates`` make the counters
# rise.
DEGRADATION_FIELDS = {
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "reasons": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "pcie_replays": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "nvlink_errors": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "sbe": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "remapped_rows": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "retired_pending": "DCGM_FI_DEV_RETIRED_PENDING",
    "recovery_action": "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
}
COUNTERS = frozenset({"pcie_replays", "nvlink_errors", "sbe", "remapped_rows"})
FULL_CLOCK = 1980.0  # MHz, an H100 busy at its boost clock
RATE_TICK_S = MINUTE  # a rising counter is scraped (and changes) once a minute
STRICT_POLICY = """# A stricter policy to compare with the default: at most 2 nodes out at once, a breaker that opens
# when more than 2% of the GPU nodes (and at least 3) fault within 10 minutes.
[budget]
max_unavailable = "2"

[breaker]
threshold_percent = 2.0
window_s = 600.0
min_nodes = 3
"""


@dataclass(frozen=True)
class Fault:
    """From ``at`` to ``until``, GPU ``gpu`` of ``node`` shows ``values`` (GpuState fields), and its counters
    (``COUNTERS``) rise by ``rates`` a minute (they keep their total after ``until``)."""

    node: str
    gpu: int
    at: float
    until: float | None
    values: Mapping[str, float]
    rates: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Fleet:
    nodes: list[str]
    start: float
    end: float
    faults: list[Fault] = field(default_factory=list)
    down: list[tuple[str, float, float]] = field(default_factory=list)  # (node, from, to): exporter unreachable
    excluded: set[str] = field(default_factory=set)
    degradation: bool = False  # the scrapes carry DEGRADATION_FIELDS too
    pods: list[dict[str, object]] = field(default_factory=list)  # Failed Pod objects (written to pods.jsonl)


def node_name(i: int) -> str:
    return f"gpu-node-{i:03d}"


def base_temp(node: int, gpu: int) -> float:
    return float(44 + (node * 7 + gpu * 3) % 15)


def month_fleet(nodes: int = 200, days: float = 30.0, start: float = 1_793_491_200.0) -> Fleet:
    """The scenario of the module docstring, scaled to ``days`` (faults past the end are dropped)."""
    if nodes < 10:
        raise ValueError("the month scenario needs at least 10 nodes")
    names = [node_name(i) for i in range(nodes)]

    def n(i: int) -> str:
        return names[i % nodes]

    def t(day: float, hour: float = 0.0) -> float:
        return start + day * DAY + hour * HOUR

    faults = [
        Fault(n(17), 3, t(2, 4), t(2, 6), {"xid": 79}),
        Fault(n(42), 5, t(5, 10), t(5, 11), {"dbe": 2}),
        *(Fault(n(120), 1, t(8 + k * 1.25, 9), t(8 + k * 1.25, 10), {"xid": 48}) for k in range(4)),
        Fault(n(150), 6, t(22, 15), None, {"remap_failure": 1}),
        Fault(n(60), 1, t(11, 13), t(11, 13) + 20 * MINUTE, {"temp": 93}),
        Fault(n(61), 2, t(11, 14), t(11, 14) + 30, {"temp": 94}),
        *(Fault(n(130 + k), k % GPUS, t(18, 3) + k * 30, t(18, 6), {"xid": 79}) for k in range(8)),
        Fault(n(33), 0, t(12, 8), t(12, 9), {"xid": 13}),
        Fault(n(70), 4, t(16, 2), None, {"uncorrectable_rows": 3}),
        Fault(n(nodes - 1), 2, t(25, 12), t(25, 14), {"xid": 79}),
    ]
    fleet = Fleet(names, start, start + days * DAY, excluded={n(nodes - 1)},
                  down=[(n(99), t(7, 1), t(7, 7))])
    fleet.faults = [f for f in faults if f.at < fleet.end]
    fleet.down = [d for d in fleet.down if d[1] < fleet.end]
    return fleet


DEGRADATION_POLICY = """# [degradation] on (docs/degradation.md): slow GPUs and degraded links cordoned (no drain) until
# they recover; failing trends get a MaintenanceRequest whose drain starts in the next trend window
# (Sat,Sun 02:00-06:00 UTC).
[degradation]
enabled = true
trends = true
trend_action = "maintenance"
"""


def degradation_fleet(nodes: int = 16, days: float = 2.0, start: float = 1_793_491_200.0) -> Fleet:
    """Slow GPUs, degraded links and a failing trend among healthy noise, every GPU busy at its clock unless said
    (the series of ``DEGRADATION_FIELDS``); times are hours from the start:

    - slow-gpu: GPU 2 of node 3 at 60 % of its clock (HW thermal) from 6 h for 2 h, then recovered;
    - link-degraded: PCIe replays rising 30 a minute on GPU 5 of node 7 from 12 h for 30 min; NVLink CRC errors
      25 a minute on GPU 1 of node 9 from 27 h for 20 min;
    - trend: single-bit ECC errors 10 a minute on GPU 6 of node 11 from 20 h for 2 h (1,200 in all);
    - healthy noise: GPU 0 of node 5 slow for 2 min at 9 h (below the hold), three single PCIe replays on GPU 3
      of node 2 at 15 h, node 13 idle (idle clock, the idle reason) from 30 h for 4 h.
    """
    if nodes < 14:
        raise ValueError("the degradation scenario needs at least 14 nodes")
    names = [node_name(i) for i in range(nodes)]

    def t(hours: float) -> float:
        return start + hours * HOUR

    faults = [
        Fault(names[3], 2, t(6), t(8), {"sm_clock": 0.6 * FULL_CLOCK, "reasons": 0x40}),
        Fault(names[7], 5, t(12), t(12.5), {}, {"pcie_replays": 30.0}),
        Fault(names[9], 1, t(27), t(27) + 20 * MINUTE, {}, {"nvlink_errors": 25.0}),
        Fault(names[11], 6, t(20), t(22), {}, {"sbe": 10.0}),
        Fault(names[5], 0, t(9), t(9) + 2 * MINUTE, {"sm_clock": 0.6 * FULL_CLOCK, "reasons": 0x4}),
        Fault(names[2], 3, t(15), t(15) + 3 * MINUTE, {}, {"pcie_replays": 1.0}),
        *(Fault(names[13], gpu, t(30), t(34), {"util": 0.0, "sm_clock": 210.0, "reasons": 0x1})
          for gpu in range(GPUS)),
    ]
    fleet = Fleet(names, start, start + days * DAY, degradation=True)
    fleet.faults = [f for f in faults if f.at < fleet.end]
    return fleet


def _stamp(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _failed_pod(name: str, node: str, at: float, status: Mapping[str, object]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "creationTimestamp": _stamp(at - 5),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name.rsplit("-", 1)[0],
                                              "uid": f"uid-job-{name}", "controller": True}]},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "train", "image": "trainer:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            "status": {"phase": "Failed", "startTime": _stamp(at), **status}}


def admission_error(name: str, node: str, at: float) -> dict[str, object]:
    """A pod the kubelet refused at admission: the device plugin offered GPUs it cannot hand out (a GPU counts)."""
    return _failed_pod(name, node, at, {
        "reason": "UnexpectedAdmissionError",
        "message": "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
                   "nvidia.com/gpu. Requested: 8, Available: 7, which is unexpected"})


def container_error(name: str, node: str, at: float, reason: str, message: str, exit_code: int = 1) \
        -> dict[str, object]:
    """A pod whose container ended at ``at`` with ``reason`` and the termination ``message``."""
    ended = {"exitCode": exit_code, "reason": reason, "message": message, "startedAt": _stamp(at - 20),
             "finishedAt": _stamp(at)}
    return _failed_pod(name, node, at - 20, {
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": _stamp(at)}],
        "containerStatuses": [{"name": "train", "ready": False, "restartCount": 0, "image": "trainer:1",
                               "state": {"terminated": ended}}]})


WORKLOAD_POLICY_OFF = """# [workload] off: the failed pods are not counted (no finding, no cordon)
[workload]
enabled = false
"""


def workload_fleet(nodes: int = 8, days: float = 1.0, start: float = 1_793_491_200.0) -> Fleet:
    """Failed pods for the workload signal (``[workload]``: 3 GPU-error pods within 600 s by default); the metrics
    healthy throughout (the dead GPU the exporter does not show). Times are hours from the start:

    - node 2's GPU is gone for the device plugin: from 3 h a Job's pods are refused at admission
      (``UnexpectedAdmissionError``, ``nvidia.com/gpu`` unavailable), 5 in 10 minutes (one each 150 s): found and
      cordoned at the third, 300 s after the first;
    - node 4 runs pods that fail in their own code from 5 h: 3 OOMKilled, 3 with ``CUDA error: an illegal memory
      access was encountered`` within 10 minutes: the application's, not counted;
    - node 6: 3 pods ending with ``no CUDA-capable device is detected`` from 8 h, 20 minutes apart: a GPU error,
      but never 3 within the window (the signal counts only the last 600 s).
    """
    if nodes < 7:
        raise ValueError("the workload scenario needs at least 7 nodes")
    names = [node_name(i) for i in range(nodes)]

    def t(hours: float) -> float:
        return start + hours * HOUR

    pods = [admission_error(f"train-a-{k}", names[2], t(3) + k * 150) for k in range(5)]
    pods += [container_error(f"app-oom-{k}", names[4], t(5) + k * 100, "OOMKilled", "", 137) for k in range(3)]
    pods += [container_error(f"app-cuda-{k}", names[4], t(5) + 50 + k * 100, "Error",
                             "RuntimeError: CUDA error: an illegal memory access was encountered") for k in range(3)]
    pods += [container_error(f"probe-{k}", names[6], t(8) + k * 20 * MINUTE, "Error",
                             "RuntimeError: No CUDA GPUs are available: no CUDA-capable device is detected")
             for k in range(3)]
    return Fleet(names, start, start + days * DAY, pods=[p for p in pods if _time(p) < start + days * DAY])


def _time(pod: Mapping[str, object]) -> float:
    status = pod["status"]
    assert isinstance(status, Mapping)
    return datetime.datetime.fromisoformat(str(status["startTime"]).replace("Z", "+00:00")).timestamp()


# The fault mix of ``catalog_fleet``: XIDs of NVIDIA's catalog (gpuremediate/data) by how often a fleet sees
# them, a prior from published fleet reports (ECC, GSP and NVLink errors and fallen-off-the-bus lead; application
# XIDs are common but need no repair); the catalog itself gives each one's action (reset-gpu, reboot, none).
FAULT_MIX: tuple[tuple[int, int], ...] = (
    (48, 12), (64, 8), (95, 10), (119, 12), (120, 5), (74, 10), (109, 5),  # reset-gpu: one GPU
    (79, 12),  # reboot: the node
    (13, 12), (31, 8), (94, 6),  # none: the application's fault
)
FAULT_VISIBLE_S = HOUR  # how long a sampled XID stays in the exporter's series (until the repair clears it)


def catalog_fleet(nodes: int = 1000, days: float = 30.0, *, per_1000_gpu_days: float = 0.5, seed: int = 1,
                  start: float = 1_793_491_200.0) -> Fleet:
    """``nodes`` x 8 GPUs over ``days`` with faults drawn from ``FAULT_MIX`` at ``per_1000_gpu_days`` (0.5: about
    what published large-training-fleet reports give for GPU faults), on random GPUs at random times; by seed."""
    rng = random.Random(seed)
    names = [node_name(i) for i in range(nodes)]
    count = round(per_1000_gpu_days * nodes * GPUS * days / 1000.0)
    codes, weights = zip(*FAULT_MIX, strict=True)
    faults = []
    for code in rng.choices(codes, weights=weights, k=count):
        at = start + rng.uniform(0.0, days * DAY - FAULT_VISIBLE_S)
        faults.append(Fault(rng.choice(names), rng.randrange(GPUS), at, at + FAULT_VISIBLE_S, {"xid": float(code)}))
    return Fleet(names, start, start + days * DAY, sorted(faults, key=lambda f: f.at))


# ---- one node at one instant --------------------------------------------------------------------


def gpu_values(fleet: Fleet, node: str, gpu: int, at: float) -> dict[str, float]:
    index = fleet.nodes.index(node)
    values = {"xid": 0.0, "dbe": 0.0, "remap_failure": 0.0, "remap_pending": 0.0, "uncorrectable_rows": 0.0,
              "temp": base_temp(index, gpu), "memory_temp": base_temp(index, gpu) + 6,
              "util": 95.0, "sm_clock": FULL_CLOCK - (index * 3 + gpu * 5) % 20, "reasons": 0.0,
              "pcie_replays": 0.0, "nvlink_errors": 0.0, "sbe": 0.0, "remapped_rows": 0.0,
              "retired_pending": 0.0, "recovery_action": 0.0}
    for fault in fleet.faults:
        if fault.node != node or fault.gpu != gpu or at < fault.at:
            continue
        if fault.until is None or at < fault.until:
            values.update(fault.values)
        risen = (min(at, fault.until) if fault.until is not None else at) - fault.at
        for counter, per_minute in fault.rates.items():
            values[counter] += per_minute * (risen // RATE_TICK_S)
    return values


def is_down(fleet: Fleet, node: str, at: float) -> bool:
    return any(d[0] == node and d[1] <= at < d[2] for d in fleet.down)


def _labels(node: str, gpu: int) -> str:
    return (f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",'
            f'DCGM_FI_DRIVER_VERSION="550.54.15"')


def scrape_text(fleet: Fleet, node: str, at: float) -> str:
    """What dcgm-exporter on ``node`` serves at ``at`` (text format 0.0.4)."""
    lines = []
    for attr, series in _fields(fleet).items():
        lines.append(f"# TYPE {series} gauge")
        for gpu in range(GPUS):
            lines.append(f"{series}{{{_labels(node, gpu)}}} {gpu_values(fleet, node, gpu, at)[attr]:g}")
    return "\n".join(lines) + "\n"


def _fields(fleet: Fleet) -> dict[str, str]:
    return {**FIELDS, **DEGRADATION_FIELDS} if fleet.degradation else FIELDS


def change_times(fleet: Fleet, node: str) -> list[float]:
    times = {fleet.start, fleet.end}
    times.update(x for f in fleet.faults if f.node == node for x in (f.at, f.until) if x is not None)
    for f in fleet.faults:
        if f.node == node and f.rates:  # a rising counter: a scrape a tick while it rises
            last = f.until if f.until is not None else fleet.end
            times.update(f.at + k * RATE_TICK_S for k in range(1, int((last - f.at) // RATE_TICK_S) + 1))
    times.update(x for d in fleet.down if d[0] == node for x in (d[1], d[2]))
    return sorted(x for x in times if fleet.start <= x <= fleet.end)


# ---- writers ------------------------------------------------------------------------------------


def write_scrapes(fleet: Fleet, folder: Path) -> int:
    """The saved-scrapes folder; returns the number of files written."""
    count = 0
    for node in fleet.nodes:
        node_dir = folder / node
        node_dir.mkdir(parents=True, exist_ok=True)
        for at in change_times(fleet, node):
            stamp = f"{at:.0f}"
            if is_down(fleet, node, at):
                (node_dir / f"{stamp}.unknown").write_text("exporter unreachable (connection refused)\n")
            else:
                (node_dir / f"{stamp}.prom").write_text(scrape_text(fleet, node, at))
            count += 1
    if fleet.pods:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "pods.jsonl").write_text("".join(json.dumps(p, separators=(",", ":")) + "\n" for p in fleet.pods))
        count += 1
    return count


def node_list(fleet: Fleet) -> dict[str, object]:
    items = []
    for i, node in enumerate(fleet.nodes):
        labels = {"kubernetes.io/hostname": node, "nvidia.com/gpu.present": "true",
                  "pool": "training" if i % 4 else "inference"}
        if node in fleet.excluded:
            labels["gpuremediate.io/exclude"] = "true"
        items.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": node, "uid": f"uid-{node}", "labels": labels},
                      "spec": {},
                      "status": {"capacity": {"nvidia.com/gpu": str(GPUS)},
                                 "allocatable": {"nvidia.com/gpu": str(GPUS)},
                                 "conditions": [{"type": "Ready", "status": "True"}]}})
    return {"apiVersion": "v1", "kind": "NodeList", "items": items}


def openmetrics_lines(fleet: Fleet, step: float) -> Iterator[str]:
    """Every series every ``step`` seconds, grouped by metric family (promtool wants that), then # EOF."""
    count = int((fleet.end - fleet.start) // step) + 1
    for attr, series in _fields(fleet).items():
        yield f"# TYPE {series} gauge"
        for node in fleet.nodes:
            for gpu in range(GPUS):
                labels = _labels(node, gpu)
                for k in range(count):
                    at = fleet.start + k * step
                    if not is_down(fleet, node, at):
                        yield f"{series}{{{labels}}} {gpu_values(fleet, node, gpu, at)[attr]:g} {at:.0f}"
    yield "# EOF"


def write_openmetrics(fleet: Fleet, path: Path, step: float) -> None:
    with path.open("w", encoding="utf-8") as out:
        for line in openmetrics_lines(fleet, step):
            out.write(line + "\n")


def write_all(fleet: Fleet, out: Path, *, openmetrics: Path | None = None, om_step: float = 60.0) -> int:
    out.mkdir(parents=True, exist_ok=True)
    files = write_scrapes(fleet, out / "scrapes")
    (out / "nodes.json").write_text(json.dumps(node_list(fleet), indent=1))
    (out / "policy-strict.toml").write_text(STRICT_POLICY)
    if fleet.degradation:
        (out / "policy-degradation.toml").write_text(DEGRADATION_POLICY)
    if fleet.pods:
        (out / "policy-workload-off.toml").write_text(WORKLOAD_POLICY_OFF)
    if openmetrics is not None:
        write_openmetrics(fleet, openmetrics, om_step)
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.history", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder to write scrapes/, nodes.json, policy-strict.toml into")
    parser.add_argument("--nodes", type=int, help="default 200 (16 with --degradation)")
    parser.add_argument("--days", type=float, help="default 30 (2 with --degradation)")
    parser.add_argument("--start", type=float, default=1_793_491_200.0, help="unix seconds (default 2026-11-01)")
    parser.add_argument("--openmetrics", help="also write this OpenMetrics file (for promtool backfill)")
    parser.add_argument("--om-step", type=float, default=60.0, help="seconds between OpenMetrics samples")
    parser.add_argument("--catalog-mix", type=float, metavar="PER_1000_GPU_DAYS",
                        help="random faults of the XID catalog's mix at this rate instead of the scripted month")
    parser.add_argument("--seed", type=int, default=1, help="with --catalog-mix")
    parser.add_argument("--degradation", action="store_true",
                        help="the degradation scenario instead (slow GPUs, degraded links, a trend: "
                             "degradation_fleet), with OUT/policy-degradation.toml")
    parser.add_argument("--workload", action="store_true",
                        help="the workload scenario instead (pods failing with GPU errors and with the "
                             "application's: workload_fleet), with OUT/policy-workload-off.toml")
    args = parser.parse_args(argv)
    if args.workload:
        args.nodes, args.days = args.nodes or 8, args.days or 1.0
        fleet = workload_fleet(args.nodes, args.days, args.start)
    elif args.degradation:
        args.nodes, args.days = args.nodes or 16, args.days or 2.0
        fleet = degradation_fleet(args.nodes, args.days, args.start)
    else:
        args.nodes, args.days = args.nodes or 200, args.days or 30.0
        fleet = (catalog_fleet(args.nodes, args.days, per_1000_gpu_days=args.catalog_mix, seed=args.seed,
                               start=args.start) if args.catalog_mix is not None
                 else month_fleet(args.nodes, args.days, args.start))
    files = write_all(fleet, Path(args.out), openmetrics=Path(args.openmetrics) if args.openmetrics else None,
                      om_step=args.om_step)
    print(f"{args.out}: {files} scrapes of {len(fleet.nodes)} nodes over {args.days:g} days, "
          f"{len(fleet.faults)} faults" + (f", {len(fleet.pods)} failed pods" if fleet.pods else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
