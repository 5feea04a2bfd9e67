"""Readings from ``nvidia-smi`` on this machine (Linux and Windows), for ``gpuremediate check``.

One ``--query-gpu`` CSV call gives everything on current drivers. Drivers that reject a field
(the remapped-rows fields arrived with Ampere-era drivers) get a reduced query plus ``-q``, whose
indented text carries remapped rows and retired pages. Placeholder cells (``[N/A]``, ``N/A``,
``[Not Supported]``, ``[Unknown Error]``, ...) are missing readings, never zero.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuremediate.signals import fabric
from gpuremediate.signals.model import (
    GpuReading,
    LostGpu,
    NodeReadings,
    plausible_count,
    plausible_flag,
    plausible_temp,
)

SOURCE = "nvidia-smi"

BASE_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "temperature.gpu",
    "temperature.memory",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.double_bit.count",
    "retired_pages.pending",
    "mig.mode.current",
)
REMAP_FIELDS = (
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)
QUERY_FIELDS = BASE_FIELDS + REMAP_FIELDS
# Asked apart (drivers before the fabric API reject them, and that must not cost the main query); ``-q`` has them
# as its "Fabric" section (State, Status, CliqueId, ClusterUUID) when it is read anyway.
FABRIC_FIELDS = ("index", "fabric.state", "fabric.status", "fabric.cliqueId", "fabric.clusterUuid")
# The driver's verdict on the GPU (NVML's nvmlDeviceGpuRecoveryAction_t, DCGM field 1523; R570 and later): asked
# with the fabric fields, apart from them where a driver knows one group and not the other. ``-q`` writes it as
# ``    GPU Recovery Action                                : None`` (driver 590.48.01, every capture in the
# reference data; ``--query-gpu=gpu_recovery_action`` writes ``None`` too).
RECOVERY_FIELD = "gpu_recovery_action"
RECOVERY_Q_KEY = "GPU Recovery Action"
OPTIONAL_GROUPS: tuple[tuple[str, ...], ...] = (FABRIC_FIELDS[1:], (RECOVERY_FIELD,))
OPTIONAL_FIELDS = ("index", *(f for group in OPTIONAL_GROUPS for f in group))
# Its words, as nvidia-smi prints them ("None" in the captures) and as NVIDIA names them elsewhere: the GPU memory
# error management guide ("None", "Reset", "Reboot", "Drain P2P", "Drain and Reset") and the driver's own names in
# its Xid 154 text (open-gpu-kernel-modules gpu.c _gpuRecoveryActionName: "GPU Reset Required", "Node Reboot
# Required", "Drain P2P", "Drain and Reset", "Recover IMEX Domain"); lower case, "required" dropped.
RECOVERY_WORDS: Mapping[str, int] = {
    "none": 0, "reset": 1, "gpu reset": 1, "reboot": 2, "node reboot": 2, "drain p2p": 3, "drain and reset": 4,
    "drain p2p and reset": 4, "drain p2p and reset gpu": 4, "recover imex domain": 5, "bus reset": 6,
    "system reboot": 7,
}

WINDOWS_LOCATIONS = (
    r"C:\Windows\System32\nvidia-smi.exe",
    r"C:\Program Files\NVIDIA Corporation\NVSMI\nvidia-smi.exe",
)

# What nvidia-smi's exit codes mean (nvidia-smi(1), "RETURN VALUE").
EXIT_REASONS: Mapping[int, str] = {
    2: "an argument or option was invalid",
    3: "the requested operation is not available on the target device",
    4: "the current user does not have permission to access this device",
    6: "a query to find an object was unsuccessful",
    8: "a device's external power cables are not properly attached",
    9: "the NVIDIA driver is not loaded",
    10: "the NVIDIA kernel detected an interrupt issue with a GPU",
    12: "the NVML shared library could not be found or loaded",
    13: "the local version of NVML does not implement this function",
    14: "the infoROM is corrupted",
    15: "the GPU has fallen off the bus or has otherwise become inaccessible",
    18: "the NVIDIA driver and the NVML library versions do not match",
}


class NvidiaSmiError(RuntimeError):
    """nvidia-smi could not be run or could not talk to the driver: the check cannot be made."""

    def __init__(self, reason: str, *, exit_code: int | None = None, output: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code
        self.output = output.strip()

    def __str__(self) -> str:
        return f"{self.reason}: {self.output}" if self.output else self.reason


# ---------------------------------------------------------------- finding and running it


def find_nvidia_smi(
    explicit: str | None = None,
    *,
    platform: str = sys.platform,
    which: Callable[[str], str | None] = shutil.which,
    is_file: Callable[[str], bool] = os.path.isfile,
) -> str:
    """The nvidia-smi to run: ``explicit``, else on PATH, else (Windows) its usual install places."""
    if explicit:
        if not is_file(explicit):
            raise NvidiaSmiError(f"nvidia-smi not found at {explicit}")
        return explicit
    found = which("nvidia-smi")
    if found:
        return found
    if platform == "win32":
        for candidate in WINDOWS_LOCATIONS:
            if is_file(candidate):
                return candidate
        raise NvidiaSmiError("nvidia-smi.exe not found on PATH, in C:\\Windows\\System32 or in NVSMI")
    raise NvidiaSmiError("nvidia-smi not found on PATH (is the NVIDIA driver installed?)")


Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]
DEFAULT_TIMEOUT_S = 30.0
EXIT_GPU_LOST = 15
# "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost.  Reboot the system to recover
# this GPU" (some drivers write "GPU0000:..." without the space, or "Unknown Error" as the cause)
LOST_LINE = re.compile(r"Unable to determine the device handle for GPU ?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
                       r"[0-9A-Fa-f]{2}(?:\.[0-7])?):\s*(?P<why>.*)")


def run_process_group(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` in a process group of its own: on timeout the whole group is killed, so a
    wrapper script's child neither survives nor keeps the pipes (and this call) open."""
    posix = os.name == "posix"
    with subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
        start_new_session=posix,
        creationflags=0 if posix else subprocess.CREATE_NEW_PROCESS_GROUP,  # type: ignore[attr-defined]
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    if os.name == "posix":
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    else:  # Windows: taskkill /T ends the tree under the wrapper
        subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], capture_output=True, check=False)
        proc.kill()



def run_nvidia_smi(
    path: str, args: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S, runner: Runner | None = None
) -> str:
    """stdout of ``nvidia-smi args``; NvidiaSmiError (with the exit code and message) otherwise."""
    try:
        proc = (runner or run_process_group)([path, *args], timeout_s)
    except FileNotFoundError:
        raise NvidiaSmiError(f"nvidia-smi not found at {path}") from None
    except PermissionError:
        raise NvidiaSmiError(f"nvidia-smi at {path} is not executable") from None
    except subprocess.TimeoutExpired:
        raise NvidiaSmiError(f"nvidia-smi did not answer within {timeout_s:g} s") from None
    except OSError as e:
        raise NvidiaSmiError(f"cannot run nvidia-smi at {path}: {e}") from None
    if proc.returncode != 0:
        meaning = EXIT_REASONS.get(proc.returncode, "unexpected failure")
        raise NvidiaSmiError(
            f"nvidia-smi exited {proc.returncode} ({meaning})",
            exit_code=proc.returncode,
            output=(proc.stdout or "") + (proc.stderr or ""),
        )
    return proc.stdout


# ---------------------------------------------------------------- parsing


def cell(raw: str | None) -> str | None:
    """A CSV cell or ``-q`` value, or None when nvidia-smi says it has none."""
    if raw is None:
        return None
    text = raw.strip()
    if not text or text.upper() in ("N/A", "NA") or (text.startswith("[") and text.endswith("]")):
        return None
    if text.startswith(("Requested functionality has been deprecated", "Not Supported", "Unknown Error")):
        return None
    return text


def number(raw: str | None) -> float | None:
    """A numeric cell (units such as ``C``/``MiB`` tolerated); None for a placeholder or junk."""
    text = cell(raw)
    if text is None:
        return None
    head = text.split()[0]
    try:
        return float(int(head, 16)) if head.lower().startswith("0x") else float(head)
    except ValueError:
        return None


def flag(raw: str | None) -> float | None:
    """Yes/No (or Enabled/Disabled) as 1.0/0.0; None when missing."""
    text = cell(raw)
    if text is None:
        return None
    low = text.lower()
    if low in ("yes", "enabled", "true", "1"):
        return 1.0
    if low in ("no", "disabled", "false", "0"):
        return 0.0
    return None


def parse_query_csv(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """``--format=csv,noheader,nounits`` rows as dicts keyed by the requested field names."""
    rows = []
    for lineno, line in enumerate(text.replace("\r", "").splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise NvidiaSmiError(
                f"nvidia-smi CSV line {lineno} has {len(cells)} cells, expected {len(fields)}", output=line
            )
        rows.append(dict(zip(fields, cells, strict=True)))
    return rows


def parse_q(text: str) -> dict[str, dict[str, str]]:
    """``nvidia-smi -q`` as {normalised PCI bus id: {"Section.Sub.Key": value}} per GPU.

    Repeated sections (MIG devices, processes) keep their last value; nothing read here needs them.
    """
    gpus: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []
    for line in text.replace("\r", "").splitlines():
        if line.startswith("GPU ") and ":" in line[4:]:
            current = gpus.setdefault(normalise_bus_id(line[4:].strip()), {})
            stack = []
            continue
        if current is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, value = line.strip().partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([s for _, s in stack] + [key])
        if sep and value.strip():
            current[path] = value.strip()
        else:
            stack.append((indent, key))
    return gpus


def normalise_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` / ``0000:3b:00.0`` / ``PCI:0000:3b:00`` -> ``0000:3b:00.0``."""
    text = bus_id.strip().lower().removeprefix("pci:")
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return text
    domain, bus, devfn = parts
    if "." not in devfn:
        devfn += ".0"
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{devfn}"
    except ValueError:
        return text


# ---------------------------------------------------------------- readings


@dataclass(frozen=True)
class SmiGpu:
    """One GPU as nvidia-smi describes it, before it becomes a GpuReading."""

    row: Mapping[str, str]
    q: Mapping[str, str]

    def get(self, field: str, q_key: str | None = None) -> str | None:
        value = cell(self.row.get(field))
        if value is None and q_key is not None:
            value = cell(self.q.get(q_key))
        return value


def gpu_reading(node: str, gpu: SmiGpu) -> GpuReading:
    extra = {
        name: v
        for name, v in (
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", number(gpu.get("ecc.errors.uncorrected.aggregate.total"))),
            ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
             number(gpu.get("remapped_rows.correctable", "Remapped Rows.Correctable Error"))),
            ("DCGM_FI_DEV_RETIRED_DBE",
             number(gpu.get("retired_pages.double_bit.count", "Retired Pages.Double Bit ECC"))),
            ("DCGM_FI_DEV_RETIRED_PENDING",
             flag(gpu.get("retired_pages.pending", "Retired Pages.Pending Page Blacklist"))),
            ("DCGM_FI_DEV_MIG_MODE", flag(gpu.get("mig.mode.current", "MIG Mode.Current"))),
            # as the exporter's field 1523, so that [recovery_action] judges it
            ("DCGM_FI_DEV_GPU_RECOVERY_ACTION", recovery_action(gpu.get(RECOVERY_FIELD, RECOVERY_Q_KEY))),
        )
        if v is not None
    }
    return GpuReading(
        node=node,
        gpu=gpu.get("index") or "?",
        uuid=gpu.get("uuid", "GPU UUID"),
        pci_bus_id=gpu.get("pci.bus_id"),
        model=gpu.get("name", "Product Name"),
        # the signal model's physical ranges, as for the exporter: a 0 C sensor or a garbage count is missing
        ecc_dbe_volatile=plausible_count(number(gpu.get("ecc.errors.uncorrected.volatile.total"))),
        row_remap_failure=plausible_flag(
            flag(gpu.get("remapped_rows.failure", "Remapped Rows.Remapping Failure Occurred"))
        ),
        row_remap_pending=plausible_flag(flag(gpu.get("remapped_rows.pending", "Remapped Rows.Pending"))),
        uncorrectable_remapped_rows=plausible_count(
            number(gpu.get("remapped_rows.uncorrectable", "Remapped Rows.Uncorrectable Error"))
        ),
        gpu_temp=plausible_temp(number(gpu.get("temperature.gpu", "Temperature.GPU Current Temp"))),
        memory_temp=plausible_temp(number(gpu.get("temperature.memory", "Temperature.Memory Current Temp"))),
        extra=extra,
        fabric=fabric.from_smi(gpu.get("fabric.state", "Fabric.State"), gpu.get("fabric.status", "Fabric.Status"),
                               gpu.get("fabric.cliqueId", "Fabric.CliqueId"),
                               gpu.get("fabric.clusterUuid", "Fabric.ClusterUUID")),
    )


def recovery_action(raw: str | None) -> float | None:
    """The GPU Recovery Action's words (or number) as NVML's value; None when missing or not known."""
    text = cell(raw)
    if text is None:
        return None
    words = " ".join(text.lower().replace("required", " ").split())
    if words in RECOVERY_WORDS:
        return float(RECOVERY_WORDS[words])
    value = number(words)
    return value if value is not None and value == int(value) and 0 <= value <= 255 else None


def node_readings(
    node: str, rows: Sequence[Mapping[str, str]], q: Mapping[str, Mapping[str, str]], observed_at: float
) -> NodeReadings:
    smi_gpus = [SmiGpu(row, q.get(normalise_bus_id(row.get("pci.bus_id", "")), {})) for row in rows]
    gpus = tuple(gpu_reading(node, gpu) for gpu in smi_gpus)
    drivers = sorted({v for r in rows if (v := cell(r.get("driver_version")))})
    meta = {"driver_version": ",".join(drivers)} if drivers else {}
    problems = tuple(
        f"GPU {gpu.get('index') or '?'}: GPU Recovery Action {text!r} is not one this version knows (not judged)"
        for gpu in smi_gpus
        if (text := gpu.get(RECOVERY_FIELD, RECOVERY_Q_KEY)) is not None and recovery_action(text) is None
    )
    return NodeReadings(node=node, source=SOURCE, observed_at=observed_at, gpus=gpus, meta=meta, problems=problems)


class NvidiaSmiSource:
    """A Source over the local nvidia-smi: ``read()`` returns this machine's readings."""

    def __init__(
        self,
        path: str | None = None,
        node: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._explicit = path
        self.node = node or socket.gethostname()
        self._timeout_s = timeout_s
        self._runner = runner
        self._clock = clock
        self._rejected: set[tuple[str, ...]] = set()  # OPTIONAL_GROUPS this driver does not know: not asked again

    def read(self) -> list[NodeReadings]:
        return [self.read_node()]

    def read_node(self) -> NodeReadings:
        """This machine's readings; NvidiaSmiError when nvidia-smi cannot tell.

        A GPU nvidia-smi reports lost (exit 15) is listed in ``lost_gpus``; the others are still read.
        """
        path = find_nvidia_smi(self._explicit)
        observed_at = self._clock()
        rows, needs_q, lost = self._query(path)
        q = self._q(path) if needs_q and rows else {}
        rows = rows if q or not rows else self._with_optional(path, rows)
        readings = dataclasses.replace(node_readings(self.node, rows, q, observed_at), lost_gpus=lost)
        if any(g.extra.get("DCGM_FI_DEV_MIG_MODE") == 1.0 for g in readings.gpus):
            readings = self._with_mig_devices(path, readings)
        return readings

    def _query(self, path: str) -> tuple[list[dict[str, str]], bool, tuple[LostGpu, ...]]:
        """The query rows, whether ``-q`` must fill in what the query could not give, and lost GPUs."""
        fields: Sequence[str] = QUERY_FIELDS
        try:
            try:
                return parse_query_csv(self._run(path, _query_args(fields)), fields), False, ()
            except NvidiaSmiError as e:
                if "not a valid field" not in e.output:
                    raise
            fields = BASE_FIELDS
            return parse_query_csv(self._run(path, _query_args(fields)), fields), True, ()
        except NvidiaSmiError as e:
            if e.exit_code != EXIT_GPU_LOST:
                raise
            rows, lost = parse_lost_output(e.output, fields)
            return rows, fields is BASE_FIELDS, lost

    def _with_optional(self, path: str, rows: list[dict[str, str]]) -> list[dict[str, str]]:
        """The rows with their GPUs' fabric and recovery-action cells, in one call while the driver knows both
        groups; a group it rejects is not asked again; unchanged where nvidia-smi fails otherwise."""
        groups = [group for group in OPTIONAL_GROUPS if group not in self._rejected]
        if not groups:
            return rows
        found, unknown_field = self._optional_rows(path, groups)
        if unknown_field and len(groups) > 1:  # a group this driver does not know: each apart, this once
            found = [row for group in groups for row in self._optional_rows(path, [group])[0]]
        by_index: dict[str, dict[str, str]] = {}
        for row in found:
            by_index.setdefault(row["index"], {}).update(row)
        return [row | by_index.get(row.get("index", ""), {}) for row in rows]

    def _optional_rows(self, path: str, groups: Sequence[tuple[str, ...]]) -> tuple[list[dict[str, str]], bool]:
        """The rows of ``groups``' fields, and whether the driver rejected a field (one group: remembered)."""
        fields = ("index", *(f for group in groups for f in group))
        try:
            return parse_query_csv(self._run(path, _query_args(fields)), fields), False
        except NvidiaSmiError as e:
            unknown_field = "not a valid field" in e.output
            if unknown_field and len(groups) == 1:
                self._rejected.add(groups[0])
            return [], unknown_field

    def _q(self, path: str) -> dict[str, dict[str, str]]:
        try:
            return parse_q(self._run(path, ["-q"]))
        except NvidiaSmiError as e:
            if e.exit_code != EXIT_GPU_LOST:
                raise
            return parse_q(e.output)  # the readable GPUs' sections, with a lost one among them

    def _with_mig_devices(self, path: str, readings: NodeReadings) -> NodeReadings:
        try:
            devices = parse_mig_list(self._run(path, ["-L"]))
        except NvidiaSmiError as e:
            return dataclasses.replace(readings, problems=(*readings.problems, f"MIG devices not listed: {e}"))
        gpus = tuple(dataclasses.replace(g, mig_devices=devices.get(g.uuid or "", ())) for g in readings.gpus)
        return dataclasses.replace(readings, gpus=gpus)

    def _run(self, path: str, args: Sequence[str]) -> str:
        return run_nvidia_smi(path, args, self._timeout_s, self._runner)


def parse_lost_output(output: str, fields: Sequence[str]) -> tuple[list[dict[str, str]], tuple[LostGpu, ...]]:
    """What nvidia-smi printed when it exited 15: the rows of the GPUs it could read, and the lost ones
    (one entry without a bus id when it did not name the GPU)."""
    rows: list[dict[str, str]] = []
    lost: list[LostGpu] = []
    for line in output.replace("\r", "").splitlines():
        match = LOST_LINE.search(line)
        if match:
            lost.append(LostGpu(normalise_bus_id(match.group("bus")), " ".join(match.group("why").split())))
        elif line.count(",") == len(fields) - 1:
            rows.extend(parse_query_csv(line, fields))
    if not lost:
        lost.append(LostGpu("", f"nvidia-smi exited {EXIT_GPU_LOST} ({EXIT_REASONS[EXIT_GPU_LOST]})"))
    return rows, tuple(lost)


_MIG_GPU = re.compile(r"^GPU \d+: .*\(UUID: (?P<uuid>GPU-[^)]+)\)")
_MIG_DEVICE = re.compile(r"^\s+MIG (?P<profile>\S+)\s+Device\s+\d+:")


def parse_mig_list(text: str) -> dict[str, tuple[str, ...]]:
    """``nvidia-smi -L`` → {GPU UUID: MIG device profiles, in order}."""
    devices: dict[str, tuple[str, ...]] = {}
    current = None
    for line in text.replace("\r", "").splitlines():
        gpu, mig = _MIG_GPU.match(line), _MIG_DEVICE.match(line)
        if gpu:
            current = gpu.group("uuid")
            devices[current] = ()
        elif mig and current is not None:
            devices[current] = (*devices[current], mig.group("profile"))
    return devices


def _query_args(fields: Sequence[str]) -> list[str]:
    return [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
