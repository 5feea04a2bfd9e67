"""A labelled synthetic GPU fleet for the degradation detector (issue 29): readings with their ground truth.

``nodes`` nodes x 8 GPUs in racks of 16 (even racks H100, odd A100), scraped every ``step_s`` for ``days``.
Deterministic by seed. What it plays:

- **work**: each rack is cut into blocks of 1-16 nodes; a block runs one multi-node job after another (4 h-2 days,
  5 min-2 h idle between), every job at its own clock level (0.86-1.0 of peak, moving with its phases), each
  GPU with its own small offset and noise; a job dips together for a checkpoint now and then (low utilisation);
  some single nodes are shared by 4 jobs of 4, 2, 1 and 1 GPUs (the 1-GPU jobs have no peers);
- **slow GPUs** (ground truth): a busy GPU at 0.5-0.8 of its clock with power or thermal clock event reasons, for
  2 min to 6 h (cut short when its job ends);
- **degraded links** (ground truth): a GPU's PCIe replay counter (or, on H100, its NVLink CRC errors) rising at
  10-120 a minute for 10 min to 12 h;
- **healthy noise**: idle GPUs (the idle clock event reason), checkpoint dips, job phase changes, sporadic single
  PCIe replays (about two a GPU-day), and hot racks: a whole rack at 0.85-0.95 clock with the SW thermal reason
  for 1-8 h.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpuremediate.signals.model import SOURCE_OK, GpuReading, NodeReadings, PodRef

GPUS = 8
RACK = 16
MODELS = (("NVIDIA H100 80GB HBM3", 1980.0), ("NVIDIA A100-SXM4-80GB", 1410.0))
IDLE_CLOCK = 210.0
SLOW_BITS = (0x4, 0x40, 0x4 | 0x8, 0x80)  # SW power cap, HW thermal, power cap + HW slowdown, HW power brake
HOT_BIT = 0x20  # SW thermal
IDLE_BIT = 0x1
SHARED_SPLIT = ((0, 1, 2, 3), (4, 5), (6,), (7,))
KIND_SLOW, KIND_LINK, KIND_TREND = "slow-gpu", "link-degraded", "trend"
TREND_CODES = ("sbe-rate", "remapped-rows", "retired-pending")


@dataclass(frozen=True)
class Spec:
    nodes: int = 1000
    days: float = 7.0
    step_s: float = 60.0
    seed: int = 1
    slow_per_day: float = 60.0  # per 1,000 nodes
    links_per_day: float = 12.0  # per 1,000 nodes
    hot_racks_per_day: float = 2.0  # per 1,000 nodes
    sporadic_replays_per_day: float = 2.0  # per GPU
    trends_per_day: float = 12.0  # per 1,000 nodes
    sporadic_sbe_per_day: float = 5.0  # per GPU
    noisy_sbe_share: float = 0.02  # GPUs with a steady, healthy 20 single-bit errors an hour


@dataclass(frozen=True)
class Episode:
    kind: str  # KIND_SLOW, KIND_LINK or KIND_TREND
    node: str
    uuid: str
    start: float
    end: float
    size: float  # slow: the clock factor; link: errors a minute; trend: SBEs a minute, new rows, pending pages
    code: str = ""  # link: "pcie" or "nvlink"; trend: TREND_CODES; slow: "peers" when it has peers to be judged


@dataclass
class _Job:
    start: float
    end: float
    name: str
    levels: tuple[float, ...]  # per 3 h phase
    dips: frozenset[int]  # the minutes (since start, // 60) of checkpoint dips: 2 minutes each


@dataclass(eq=False)  # by identity: a rack's slots are looked up by object
class _Slot:
    """The GPUs of a block (or a shared node's jobs) that run the same jobs."""

    nodes: tuple[int, ...]
    gpus: tuple[int, ...]
    jobs: list[_Job] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)


class DegradationFleet:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.horizon = spec.days * 86400.0
        self.names = [f"gpu-{n:05d}" for n in range(spec.nodes)]
        self.models = [MODELS[(n // RACK) % 2] for n in range(spec.nodes)]
        self.offsets = [[1.0 + self.rng.uniform(-0.01, 0.01) for _ in range(GPUS)] for _ in range(spec.nodes)]
        self.slots: list[_Slot] = []
        self.slot_of: dict[tuple[int, int], _Slot] = {}
        self._cut_racks()
        self.episodes: list[Episode] = []
        self.hot: list[tuple[int, float, float]] = []  # rack, start, end
        self._place_episodes()

    # ---- layout --------------------------------------------------------------------------------------

    def _cut_racks(self) -> None:
        serial = 0
        for rack_start in range(0, self.spec.nodes, RACK):
            node = rack_start
            end = min(rack_start + RACK, self.spec.nodes)
            while node < end:
                size = min(self.rng.choice((1, 2, 4, 8, 16)), end - node)
                members = tuple(range(node, node + size))
                if size == 1 and self.rng.random() < 0.3:
                    for part in SHARED_SPLIT:
                        serial = self._slot(members, part, serial)
                else:
                    serial = self._slot(members, tuple(range(GPUS)), serial)
                node += size

    def _slot(self, nodes: tuple[int, ...], gpus: tuple[int, ...], serial: int) -> int:
        slot = _Slot(nodes, gpus)
        t = -self.rng.uniform(0, 86400.0)  # the first job began before the run
        while t < self.horizon:
            length = self.rng.uniform(4 * 3600.0, 48 * 3600.0)
            base = self.rng.uniform(0.86, 1.0)
            phases = int(length // 10800) + 1
            levels = tuple(min(1.0, base * self.rng.uniform(0.96, 1.04)) for _ in range(phases))
            dips = frozenset(int(self.rng.uniform(0, length / 60)) for _ in range(int(length // 3600)))
            slot.jobs.append(_Job(t, t + length, f"j{serial}", levels, dips))
            slot.starts.append(t)
            serial += 1
            t += length + self.rng.uniform(300.0, 7200.0)
        self.slots.append(slot)
        for node in nodes:
            for gpu in gpus:
                self.slot_of[(node, gpu)] = slot
        return serial

    def job_at(self, node: int, gpu: int, t: float) -> _Job | None:
        slot = self.slot_of[(node, gpu)]
        index = bisect.bisect_right(slot.starts, t) - 1
        if index < 0:
            return None
        job = slot.jobs[index]
        return job if job.start <= t < job.end else None

    def uuid(self, node: int, gpu: int) -> str:
        return f"GPU-{node:05d}-{gpu}"

    # ---- ground truth --------------------------------------------------------------------------------

    def _count(self, per_day_per_1000: float) -> int:
        return round(per_day_per_1000 * self.spec.days * self.spec.nodes / 1000.0)

    def _place_episodes(self) -> None:
        for _ in range(self._count(self.spec.slow_per_day)):
            self._place_slow()
        for _ in range(self._count(self.spec.links_per_day)):
            self._place_link()
        for _ in range(self._count(self.spec.trends_per_day)):
            self._place_trend()
        racks = max(1, math.ceil(self.spec.nodes / RACK))
        for _ in range(self._count(self.spec.hot_racks_per_day)):
            start = self.rng.uniform(0, self.horizon)
            self.hot.append((self.rng.randrange(racks), start, start + self.rng.uniform(3600.0, 8 * 3600.0)))

    def _place_slow(self) -> None:
        while True:
            node, gpu = self.rng.randrange(self.spec.nodes), self.rng.randrange(GPUS)
            start = self.rng.uniform(0, self.horizon - 600.0)
            job = self.job_at(node, gpu, start)
            if job is None:
                continue
            length = math.exp(self.rng.uniform(math.log(120.0), math.log(6 * 3600.0)))
            end = min(start + length, job.end, self.horizon)
            slot = self.slot_of[(node, gpu)]
            judged = "peers" if len(slot.gpus) >= 3 and len(slot.gpus) * len(slot.nodes) >= 5 else ""
            self.episodes.append(Episode(KIND_SLOW, self.names[node], self.uuid(node, gpu), start, end,
                                         self.rng.uniform(0.5, 0.8), judged))
            return

    def _place_link(self) -> None:
        node, gpu = self.rng.randrange(self.spec.nodes), self.rng.randrange(GPUS)
        start = self.rng.uniform(0, self.horizon - 600.0)
        length = math.exp(self.rng.uniform(math.log(600.0), math.log(12 * 3600.0)))
        code = "nvlink" if self.models[node][1] > 1500 and self.rng.random() < 0.4 else "pcie"
        self.episodes.append(Episode(KIND_LINK, self.names[node], self.uuid(node, gpu), start,
                                     min(start + length, self.horizon), self.rng.uniform(10.0, 120.0), code))

    def _place_trend(self) -> None:
        node, gpu = self.rng.randrange(self.spec.nodes), self.rng.randrange(GPUS)
        start = self.rng.uniform(0, self.horizon - 3600.0)
        code = self.rng.choice(TREND_CODES)
        length = math.exp(self.rng.uniform(math.log(1800.0), math.log(2 * 86400.0)))
        if code == "remapped-rows":
            length = self.rng.uniform(3600.0, 12 * 3600.0)
        size = {"sbe-rate": self.rng.uniform(3.0, 30.0), "remapped-rows": float(self.rng.randint(2, 6)),
                "retired-pending": float(self.rng.randint(1, 4))}[code]
        self.episodes.append(Episode(KIND_TREND, self.names[node], self.uuid(node, gpu), start,
                                     min(start + length, self.horizon), size, code))

    def healthy_gpu_days(self) -> float:
        """GPU-days outside every episode (the part a finding there is false on)."""
        total = self.spec.nodes * GPUS * self.spec.days
        return total - sum(e.end - e.start for e in self.episodes) / 86400.0

    # ---- the scrapes ---------------------------------------------------------------------------------

    def racks(self) -> int:
        return max(1, math.ceil(self.spec.nodes / RACK))

    def passes(self, racks: range | None = None) -> Iterator[tuple[float, list[NodeReadings]]]:
        """(time, the readings of every node of ``racks``, all by default) for each scrape. Each rack has its own
        noise, so a rack reads the same whichever racks are read with it (jobs and peers never span racks)."""
        chosen = racks if racks is not None else range(self.racks())
        plays = [_RackPlay(self, rack) for rack in chosen]
        for step in range(int(self.horizon // self.spec.step_s)):
            t = step * self.spec.step_s
            hot = {rack: 0.85 + 0.1 * ((rack * 7919 + int(s)) % 100) / 100 for rack, s, e in self.hot if s <= t < e}
            yield t, [reading for play in plays for reading in play.step(t, hot.get(play.rack))]


class _RackPlay:
    """One rack's scrapes, step by step: its slots' jobs, counters and noise."""

    def __init__(self, fleet: DegradationFleet, rack: int) -> None:
        self.fleet, self.rack = fleet, rack
        self.nodes = range(rack * RACK, min((rack + 1) * RACK, fleet.spec.nodes))
        self.noise = random.Random(fleet.spec.seed * 1_000_003 + rack)
        self.slots = list(dict.fromkeys(fleet.slot_of[(n, g)] for n in self.nodes for g in range(GPUS)).keys())
        self.cursor = [0] * len(self.slots)
        self.replays = {n: [float(self.noise.randrange(0, 50)) for _ in range(GPUS)] for n in self.nodes}
        self.nvlink = {n: [0.0] * GPUS for n in self.nodes}
        self.sporadic = fleet.spec.sporadic_replays_per_day * fleet.spec.step_s / 86400.0
        self.sporadic_sbe = fleet.spec.sporadic_sbe_per_day * fleet.spec.step_s / 86400.0
        self.sbe = {n: [0.0] * GPUS for n in self.nodes}
        self.rows = {n: [float(self.noise.randrange(0, 4)) for _ in range(GPUS)] for n in self.nodes}
        share = fleet.spec.noisy_sbe_share
        self.noisy = {(n, g) for n in self.nodes for g in range(GPUS) if self.noise.random() < share}
        self.rows_added: dict[Episode, int] = {}
        self.fleet_now = 0.0
        self.episodes: dict[tuple[int, int], list[Episode]] = {}
        index = {fleet.names[n]: n for n in self.nodes}
        for episode in fleet.episodes:
            if episode.node in index:
                self.episodes.setdefault((index[episode.node], int(episode.uuid[-1])), []).append(episode)

    def _work(self, t: float) -> dict[tuple[int, int], tuple[float, float, tuple[PodRef, ...]]]:
        """(level, util, pods) of each busy GPU now (level: the share of peak before noise)."""
        busy: dict[tuple[int, int], tuple[float, float, tuple[PodRef, ...]]] = {}
        for i, slot in enumerate(self.slots):
            while self.cursor[i] + 1 < len(slot.jobs) and slot.jobs[self.cursor[i] + 1].start <= t:
                self.cursor[i] += 1
            job = slot.jobs[self.cursor[i]]
            if not job.start <= t < job.end:
                continue
            minute = int((t - job.start) // 60)
            dip = minute in job.dips or minute - 1 in job.dips
            level = 0.7 if dip else job.levels[min(int((t - job.start) // 10800), len(job.levels) - 1)]
            for node in slot.nodes:
                pods = (PodRef("ml", f"{job.name}-worker-{node}"),)
                for gpu in slot.gpus:
                    busy[(node, gpu)] = (level, 15.0 if dip else -1.0, pods)
        return busy

    def step(self, t: float, hot: float | None) -> list[NodeReadings]:
        fleet, noise = self.fleet, self.noise
        self.fleet_now = t
        busy = self._work(t)
        out = []
        for node in self.nodes:
            name = fleet.names[node]
            model, peak = fleet.models[node]
            gpus = []
            for gpu in range(GPUS):
                work = busy.get((node, gpu))
                pods: tuple[PodRef, ...] = ()
                if work is None:
                    clock, util, bits = IDLE_CLOCK, 0.0, IDLE_BIT
                else:
                    level, util, pods = work
                    clock, bits = peak * level, 0
                    if util < 0:  # working: noise around the job's level
                        clock = min(peak, clock * fleet.offsets[node][gpu] * (0.985 + 0.03 * noise.random()))
                        util = 88.0 + 11.0 * noise.random()
                    if hot is not None:
                        clock, bits = clock * hot * (0.98 + 0.04 * noise.random()), bits | HOT_BIT
                if noise.random() < self.sporadic:
                    self.replays[node][gpu] += 1
                if noise.random() < self.sporadic_sbe or ((node, gpu) in self.noisy and noise.random() < 1 / 3):
                    self.sbe[node][gpu] += 1
                pending = 0.0
                for episode in self.episodes.get((node, gpu), ()):
                    if episode.start <= t < episode.end:
                        if episode.kind == KIND_TREND:
                            pending = max(pending, self._trend(episode, node, gpu, noise))
                            continue
                        clock, bits, counters = _episode_effect(episode, clock, util, bits, noise)
                        if episode.code == "pcie":
                            self.replays[node][gpu] += counters
                        elif episode.code == "nvlink":
                            self.nvlink[node][gpu] += counters
                extra = {"DCGM_FI_DEV_SM_CLOCK": float(round(clock)), "DCGM_FI_DEV_GPU_UTIL": float(round(util)),
                         "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": float(bits),
                         "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": self.replays[node][gpu],
                         "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": self.sbe[node][gpu],
                         "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": self.rows[node][gpu],
                         "DCGM_FI_DEV_RETIRED_PENDING": pending}
                if peak > 1500:
                    extra["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] = self.nvlink[node][gpu]
                gpus.append(GpuReading(node=name, gpu=str(gpu), uuid=f"GPU-{node:05d}-{gpu}", model=model,
                                       extra=extra, pods=pods))
            out.append(NodeReadings(node=name, source="exporter", status=SOURCE_OK, observed_at=t, gpus=tuple(gpus)))
        return out

    def _trend(self, episode: Episode, node: int, gpu: int, noise: random.Random) -> float:
        """A trend episode's step: single-bit errors or new rows added; the pages pending retirement now."""
        if episode.code == "sbe-rate":
            self.sbe[node][gpu] += float(max(0, round(episode.size * (0.5 + noise.random()))))
        elif episode.code == "remapped-rows":
            spacing = (episode.end - episode.start) / episode.size  # one new row each spacing, the first half in
            due = min(int(episode.size), int((self.fleet_now - episode.start) / spacing + 0.5))
            added = self.rows_added.get(episode, 0)
            if due > added:
                self.rows[node][gpu] += due - added
                self.rows_added[episode] = due
        else:
            return episode.size
        return 0.0


def _episode_effect(episode: Episode, clock: float, util: float, bits: int,
                    noise: random.Random) -> tuple[float, int, float]:
    """A slow episode's clock and reasons on a busy GPU; a link episode's errors this step."""
    if episode.kind == KIND_SLOW:
        if util <= 0:
            return clock, bits, 0.0
        return clock * episode.size, bits | SLOW_BITS[int(episode.start) % len(SLOW_BITS)], 0.0
    return clock, bits, float(max(0, round(episode.size * (0.5 + noise.random()))))
