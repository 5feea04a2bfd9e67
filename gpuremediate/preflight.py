"""``gpuremediate preflight`` (issue 46): are the GPUs given to this pod fit to start a job on? Run as the init
container the preflight webhook adds (docs/preflight.md), or by hand.

Three checks, in order, the first that fails ending the run (a pod's start waits for all of them):

1. nvidia-smi, read and judged as ``gpuremediate check`` does (the same reading and policy), kept to the pod's GPUs
   (``--gpus``, else ``NVIDIA_VISIBLE_DEVICES``, else ``CUDA_VISIBLE_DEVICES``: indices or UUIDs; ``all`` or unset:
   every GPU nvidia-smi lists). A GPU fails on a finding whose action is not ``none`` and which may not wait
   (a lost GPU, a double-bit ECC error, a failed row remap, hot now...). A GPU given to the pod that nvidia-smi
   does not list, or names lost ("Unable to determine the device handle for GPU...: GPU is lost", exit 15, what
   an XID 79 leaves), fails as lost: the device plugin handed it over, the driver cannot reach it. Without a list
   of the pod's GPUs, fewer GPUs seen than ``--expect-gpus`` (the webhook passes the pod's ``nvidia.com/gpu``)
   fails too: never "fit" on fewer GPUs than the pod was given.
2. ``dcgmi diag -r 1`` (DCGM's quick deployment checks, seconds) when dcgmi is in the image; a GPU fails only when
   the diagnostic itself reports a test failed (its JSON, ``-j``); dcgmi unable to reach a host engine is unknown.
3. An operator's command (``--command``: an NCCL all-reduce for a gang, say) within ``--command-timeout``: a
   non-zero exit fails the pod's GPUs; not found or out of time is unknown.

Exit 0: fit. Exit 1: a GPU failed; the one line written to the termination log (``/dev/termination-log``, the
kubelet's default ``terminationMessagePath``) names the GPU and the finding (``vocab.preflight``). Exit 3: the
preflight could not tell (no nvidia-smi, a time-out, no GPU given): never "the GPU is bad"; ``--on-unknown pass``
exits 0 instead so the pod still starts (its line says ``preflight unknown``). 64: a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from gpuremediate.check import EXIT_CANNOT_CHECK, Report, run_check, timeout_seconds
from gpuremediate.policy.config import Policy, PolicyError, default_policy, load_policy
from gpuremediate.signals.model import NodeReadings
from gpuremediate.signals.nvidiasmi import DEFAULT_TIMEOUT_S, NvidiaSmiError, NvidiaSmiSource, run_process_group
from gpuremediate.vocab.findings import ACTION_NONE, KIND_GPU_LOST, Finding, by_severity
from gpuremediate.vocab.preflight import FAILED, UNKNOWN, failed_message, unknown_message

EXIT_FIT = 0
EXIT_FAILED = 1
EXIT_UNKNOWN = EXIT_CANNOT_CHECK  # 3, as check's "could not check"
EXIT_USAGE = 64
PASSED = "passed"
TERMINATION_LOG = "/dev/termination-log"
DCGM_TIMEOUT_S = 120.0
COMMAND_TIMEOUT_S = 300.0
NO_GPUS = ("none", "void", "")
EXIT_NO_DEVICES = 6  # nvidia-smi(1): "a query to find an object was unsuccessful" ("No devices were found")
MIG_MODE = "DCGM_FI_DEV_MIG_MODE"

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class Step:
    """One check's result."""

    name: str  # nvidia-smi | dcgm-diag | command
    result: str  # PASSED | FAILED | UNKNOWN
    gpus: tuple[str, ...] = ()
    check: str = ""  # the finding kind (nvidia-smi) or the check's name
    text: str = ""


@dataclass
class Outcome:
    exit_code: int
    message: str  # the termination line; "" when fit
    steps: list[Step] = field(default_factory=list)


# ---------------------------------------------------------------- the pod's GPUs


def pod_gpus(env: Mapping[str, str], given: str | None = None) -> tuple[str, ...] | None:
    """The GPUs given to the pod (indices or UUIDs); None: every GPU nvidia-smi lists; (): none at all."""
    for text in (given, env.get("NVIDIA_VISIBLE_DEVICES"), env.get("CUDA_VISIBLE_DEVICES")):
        if text is None:
            continue
        text = text.strip()
        if text == "all":
            return None
        if text in NO_GPUS:
            return ()
        return tuple(p.strip() for p in text.split(",") if p.strip())
    return None


def select(readings: NodeReadings, wanted: tuple[str, ...] | None) -> tuple[NodeReadings, list[str]]:
    """The readings of the wanted GPUs (by index or UUID) and the wanted ones nvidia-smi does not list. A MIG
    device's UUID names no GPU nvidia-smi lists: any such entry keeps every GPU (the runtime showed only the pod's)."""
    if wanted is None or any(w.startswith("MIG-") for w in wanted):
        return readings, []
    keep = [g for g in readings.gpus if g.gpu in wanted or (g.uuid or "") in wanted]
    seen = {g.gpu for g in keep} | {g.uuid for g in keep}
    return replace(readings, gpus=tuple(keep)), [w for w in wanted if w not in seen]


class _PodGpus:
    """An nvidia-smi source kept to the pod's GPUs (lost GPUs are kept: nvidia-smi cannot say whose they are), and
    what it saw: the given GPUs not listed, how many GPUs (read or lost), whether MIG is on, "No devices"."""

    def __init__(self, source: NvidiaSmiSource, wanted: tuple[str, ...] | None) -> None:
        self.source, self.wanted, self.missing = source, wanted, list[str]()
        self.node = source.node
        self.seen, self.mig, self.no_devices = 0, False, ""

    def read_node(self) -> NodeReadings:
        try:
            everything = self.source.read_node()
        except NvidiaSmiError as e:
            if e.exit_code == EXIT_NO_DEVICES:  # the driver answered and lists no GPU at all
                self.no_devices = _first_line(e.output) if e.output else e.reason
                self.missing = list(self.wanted or ())
            raise
        readings, self.missing = select(everything, self.wanted)
        self.seen = len(readings.gpus) + len(readings.lost_gpus)
        self.mig = any(g.extra.get(MIG_MODE) == 1.0 for g in readings.gpus)
        return readings


def failing(findings: Sequence[Finding]) -> list[Finding]:
    """The findings a job should not start on: an action, and not one that may wait for a window."""
    return by_severity(f for f in findings if f.action != ACTION_NONE and f.urgent)


def nvidia_smi_step(source: NvidiaSmiSource, policy: Policy, wanted: tuple[str, ...] | None,
                    kernel_log: str = "no", expected: int = 0) -> Step:
    """nvidia-smi's judgement of the pod's GPUs (``wanted``; None: every GPU listed, of which ``expected`` at
    least when known)."""
    if wanted == ():
        return Step("nvidia-smi", UNKNOWN, text="no GPU given to the pod (NVIDIA_VISIBLE_DEVICES none)")
    pod = _PodGpus(source, wanted)
    report: Report = run_check(pod, policy, kernel_log=kernel_log)  # type: ignore[arg-type]  # read_node is all
    bad = failing(report.findings)
    if bad:
        worst = bad[0]
        gpus = tuple(g.rsplit("/", 1)[-1] for g in worst.gpus)  # a key "<node>/pci..." names the pod's host name
        if worst.kind == KIND_GPU_LOST and pod.missing:
            gpus = tuple(pod.missing)  # the pod's names for the GPU nvidia-smi knows only by its bus id
        return Step("nvidia-smi", FAILED, gpus, worst.kind, worst.message)
    if pod.missing:
        listed = f"it lists {pod.seen}" if not pod.no_devices else pod.no_devices
        return Step("nvidia-smi", FAILED, tuple(pod.missing), KIND_GPU_LOST,
                    f"GPU {','.join(pod.missing)} given to the pod is not listed by nvidia-smi ({listed}): the "
                    "driver cannot reach it")
    if pod.no_devices and expected > 0:
        return Step("nvidia-smi", FAILED, (), KIND_GPU_LOST,
                    f"the pod was given {expected} GPU(s), nvidia-smi lists none ({pod.no_devices})")
    if report.exit_code == EXIT_CANNOT_CHECK:
        detail = f" ({report.detail.strip().splitlines()[0]})" if report.detail.strip() else ""
        return Step("nvidia-smi", UNKNOWN, text=f"nvidia-smi: {report.reason}{detail}")
    if wanted is None and not pod.mig and pod.seen < expected:  # MIG: a GPU lists as one, holds many devices
        return Step("nvidia-smi", FAILED, (), KIND_GPU_LOST,
                    f"the pod was given {expected} GPU(s), nvidia-smi lists {pod.seen}: the driver cannot reach "
                    f"{expected - pod.seen}")
    return Step("nvidia-smi", PASSED)


# ---------------------------------------------------------------- dcgmi diag


def _walk(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def dcgm_failures(output: str) -> list[tuple[str, str]]:
    """(GPU, what) for each result dcgmi's JSON marks failed. Its JSON has no published stable schema (DCGM's
    "Diagnostic Errors" page): results are found by a ``status`` of ``Fail`` anywhere, the GPU by ``gpu_id``,
    ``gpu_ids`` or ``entity_id``, the test by the nearest ``name``/``test_name``."""
    try:
        doc = json.loads(output)
    except ValueError:
        return []
    found: list[tuple[str, str]] = []

    def visit(node: Any, test: str) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item, test)
            return
        if not isinstance(node, Mapping):
            return
        test = str(node.get("name") or node.get("test_name") or test)
        if str(node.get("status") or node.get("result") or "").lower() == "fail":
            gpu = node.get("gpu_id", node.get("gpu_ids", node.get("entity_id", "")))
            warnings = [str(w.get("warning") or w.get("message") or "") for w in _walk(node.get("warnings") or [])
                        if isinstance(w, Mapping)]
            found.append((str(gpu), f"{test}: {'; '.join(w for w in warnings if w) or 'failed'}"))
        for value in node.values():
            visit(value, test)

    visit(doc, "")
    return found


def dcgm_step(path: str, timeout_s: float, runner: Runner = run_process_group) -> Step:
    try:
        proc = runner([path, "diag", "-r", "1", "-j"], timeout_s)
    except subprocess.TimeoutExpired:
        return Step("dcgm-diag", UNKNOWN, text=f"dcgmi diag -r 1 did not finish within {timeout_s:g} s")
    except OSError as e:
        return Step("dcgm-diag", UNKNOWN, text=f"cannot run dcgmi at {path}: {e}")
    failures = dcgm_failures(proc.stdout or "")
    if failures:
        gpus = tuple(dict.fromkeys(g for g, _ in failures if g))
        return Step("dcgm-diag", FAILED, gpus, "dcgm-diag", "; ".join(w for _, w in failures))
    if proc.returncode != 0:
        said = _first_line((proc.stdout or "") + (proc.stderr or ""))
        return Step("dcgm-diag", UNKNOWN, text=f"dcgmi diag exited {proc.returncode} with no test failed: {said}")
    return Step("dcgm-diag", PASSED)


# ---------------------------------------------------------------- the operator's command


def command_step(argv: Sequence[str], timeout_s: float, gpus: tuple[str, ...],
                 runner: Runner = run_process_group) -> Step:
    shown = shlex.join(argv)
    try:
        proc = runner(argv, timeout_s)
    except subprocess.TimeoutExpired:
        return Step("command", UNKNOWN, text=f"{shown} did not finish within {timeout_s:g} s")
    except OSError as e:
        return Step("command", UNKNOWN, text=f"cannot run {shown}: {e}")
    if proc.returncode != 0:
        said = _last_line((proc.stdout or "") + (proc.stderr or ""))
        return Step("command", FAILED, gpus, "command", f"{shown} exited {proc.returncode}: {said}")
    return Step("command", PASSED)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "(no output)")


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "(no output)")


# ---------------------------------------------------------------- the run


def outcome_of(steps: Sequence[Step]) -> Outcome:
    failed = next((s for s in steps if s.result == FAILED), None)
    if failed is not None:
        return Outcome(EXIT_FAILED, failed_message(failed.gpus, failed.check, failed.text), list(steps))
    unknown = [s.text for s in steps if s.result == UNKNOWN]
    if unknown:
        return Outcome(EXIT_UNKNOWN, unknown_message("; ".join(unknown)), list(steps))
    return Outcome(EXIT_FIT, "", list(steps))


def run_preflight(
    source: NvidiaSmiSource, policy: Policy, wanted: tuple[str, ...] | None, *, dcgmi: str | None = None,
    dcgm_timeout_s: float = DCGM_TIMEOUT_S, command: Sequence[str] = (), command_timeout_s: float = COMMAND_TIMEOUT_S,
    kernel_log: str = "no", runner: Runner = run_process_group, expected: int = 0,
) -> Outcome:
    """The checks in order; the first that fails ends the run (the pod's start waits for every one)."""
    steps = [nvidia_smi_step(source, policy, wanted, kernel_log, expected)]
    if steps[-1].result != FAILED and dcgmi:
        steps.append(dcgm_step(dcgmi, dcgm_timeout_s, runner))
    if steps[-1].result != FAILED and command:
        steps.append(command_step(command, command_timeout_s, wanted or (), runner))
    return outcome_of(steps)


def write_termination_log(path: str, line: str) -> str:
    """Write the line where the kubelet reads it; a note when it cannot (not in a pod: no /dev/termination-log)."""
    if not path or not line:
        return ""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(line)
    except OSError as e:
        return f"termination log {path} not written: {e.strerror or e}"
    return ""


# ---------------------------------------------------------------- entry point


EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_FIT}  fit: the pod's GPUs passed every check that ran
  {EXIT_FAILED}  a GPU failed (the termination log names it and the finding)
  {EXIT_UNKNOWN}  unknown: the preflight could not tell (no nvidia-smi, a time-out); never "the GPU is bad"
     (--on-unknown pass exits 0 instead)
  {EXIT_USAGE} usage error: no verdict
"""


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--gpus", help="the GPUs to check, indices or UUIDs, comma-separated (default: "
                                       "NVIDIA_VISIBLE_DEVICES, else CUDA_VISIBLE_DEVICES, else every GPU listed)")
    parser.add_argument("--expect-gpus", dest="expect_gpus", type=_count, default=0, metavar="N",
                        help="how many GPUs the pod was given (the webhook passes its nvidia.com/gpu); with no list "
                             "of them, fewer seen fails the preflight (default 0: not known)")
    parser.add_argument("--nvidia-smi", dest="nvidia_smi", help="path to nvidia-smi (default: found on PATH)")
    parser.add_argument("--policy", help="TOML policy file (default: built-in policy)")
    parser.add_argument("--kernel-log", choices=("auto", "yes", "no"), default="no",
                        help="also read NVRM Xid lines from the kernel log (default: no; a pod seldom may)")
    parser.add_argument("--timeout", type=timeout_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"how long each nvidia-smi call may take (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--dcgmi", default="auto", metavar="auto|no|PATH",
                        help="run `dcgmi diag -r 1`: auto (when dcgmi is on PATH, the default), no, or its path")
    parser.add_argument("--dcgm-timeout", dest="dcgm_timeout", type=timeout_seconds, default=DCGM_TIMEOUT_S,
                        metavar="SECONDS", help=f"time bound of dcgmi diag (default {DCGM_TIMEOUT_S:g})")
    parser.add_argument("--command", default="", help="an operator's check, run after the others (shell words, "
                                                      "no shell); a non-zero exit fails the pod's GPUs")
    parser.add_argument("--command-timeout", dest="command_timeout", type=timeout_seconds,
                        default=COMMAND_TIMEOUT_S, metavar="SECONDS",
                        help=f"time bound of --command (default {COMMAND_TIMEOUT_S:g}); past it: unknown")
    parser.add_argument("--on-unknown", dest="on_unknown", choices=("exit", "pass"), default="exit",
                        help=f"when the preflight cannot tell: exit {EXIT_UNKNOWN} (default) or pass (exit 0, "
                             "the pod starts; the termination log still says unknown)")
    parser.add_argument("--termination-log", dest="termination_log", default=TERMINATION_LOG, metavar="PATH",
                        help=f"where the one-line result is written (default {TERMINATION_LOG}; '' for nowhere)")
    return parser


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _dcgmi_path(choice: str) -> str | None:
    if choice == "no":
        return None
    if choice == "auto":
        return shutil.which("dcgmi")
    return choice


def _load(path: str | None) -> Policy:
    return (load_policy(path) if path else default_policy()).for_node({})


def main(args: argparse.Namespace, out: TextIO | None = None, env: Mapping[str, str] | None = None) -> int:
    out = out or sys.stdout
    try:
        command = shlex.split(args.command)
    except ValueError as e:
        out.write(f"usage: --command: {e}\n")
        return EXIT_USAGE
    try:
        policy = _load(args.policy)
    except (PolicyError, OSError) as e:
        outcome = outcome_of([Step("policy", UNKNOWN, text=f"policy: {e}")])
    else:
        try:
            wanted = pod_gpus(os.environ if env is None else env, args.gpus)
            source = NvidiaSmiSource(path=args.nvidia_smi, timeout_s=args.timeout)
            outcome = run_preflight(source, policy, wanted, dcgmi=_dcgmi_path(args.dcgmi),
                                    dcgm_timeout_s=args.dcgm_timeout, command=command,
                                    command_timeout_s=args.command_timeout, kernel_log=args.kernel_log,
                                    expected=args.expect_gpus)
        except NvidiaSmiError as e:  # raised outside read_node (finding the binary): still unknown
            outcome = outcome_of([Step("nvidia-smi", UNKNOWN, text=f"nvidia-smi: {e}")])
    for step in outcome.steps:
        out.write(f"{step.name}: {step.result}" + (f": {step.text}" if step.text else "") + "\n")
    line = outcome.message or "preflight passed"
    out.write(line + "\n")
    note = write_termination_log(args.termination_log, outcome.message)
    if note:
        out.write(f"note: {note}\n")
    if outcome.exit_code == EXIT_UNKNOWN and args.on_unknown == "pass":
        return EXIT_FIT
    return outcome.exit_code
