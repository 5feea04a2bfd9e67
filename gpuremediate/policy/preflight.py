"""The preflight judge (issue 46): a node where ``[preflight] min_failures`` pods' preflight init containers failed
a GPU within ``window_s`` (``signals.workload`` reads them from the failed pods) gets a ``preflight-failed``
finding naming the GPUs the preflight named. A preflight that could not tell ("unknown") is never read as a
failure, so it never makes a finding.

The finding goes where every other finding goes: the detect pass's batch (the breaker counts it and judges how fast
such faults arrive: a bad image failing every preflight opens the breaker, it does not cordon the fleet), the
node's record (the repeat-offender rule counts its repairs), the action's flow."""

from __future__ import annotations

import re
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpuremediate.signals.workload import PREFLIGHT, Failure, WorkloadSignal
from gpuremediate.vocab.findings import ACTION_REBOOT, ACTION_RESET_GPU, KIND_GPU_LOST, Finding
from gpuremediate.vocab.preflight import KIND_PREFLIGHT, parse_message
from gpuremediate.vocab.schema import PolicyError, _show, between, dns_subdomain, duration, one_of, setting

PREFLIGHT_ONLY = frozenset({PREFLIGHT})


def _words_or_empty(value: Any, path: str) -> None:
    try:
        shlex.split(value)
    except ValueError as exc:
        raise PolicyError(f"{path}: cannot split {_show(value)} like a shell: {exc}") from None


def _off_or_interval(value: Any, path: str) -> None:
    if value != 0:
        between(300, 30 * 24 * 3600)(value, path)


@dataclass(frozen=True)
class PreflightPolicy:
    """``[preflight]``: the preflight the webhook adds to GPU pods, and its failures as findings."""

    enabled: bool = setting(True, "read failed preflights (the webhook's init container, docs/preflight.md) from the "
                            "failed-pod watch and give the node a preflight-failed finding; the webhook itself is "
                            "off until installed (chart preflight.enabled) and a namespace opts in")
    min_failures: int = setting(1, "distinct pods whose preflight failed on the node within window_s",
                                check=between(1, 10_000))
    window_s: float = setting(3600.0, "seconds the failed preflights are counted over", check=duration(10))
    action: str = setting(ACTION_RESET_GPU, "what the finding does (reset-gpu: cordoned, drained, the GPU reset and "
                          "the node validated before it is schedulable again; cordon, reboot, quarantine or a custom "
                          "action)", action=True)
    on_unknown: str = setting("pass", "a preflight that cannot tell (no nvidia-smi, a time-out): pass lets the pod "
                              "start, fail holds it (its init container exits 3); never a finding either way",
                              check=one_of("pass", "fail"))
    dcgm_diag: bool = setting(True, "also run `dcgmi diag -r 1` where the image has dcgmi")
    command: str = setting("", "an operator's check run last in the init container (shell words, no shell: an NCCL "
                           "test for a gang, say); a non-zero exit fails the pod's GPUs", check=_words_or_empty)
    command_timeout_s: float = setting(300.0, "time bound of command; past it the preflight is unknown",
                                       check=between(1, 3600))
    idle_check_interval_s: float = setting(0.0, "0: off. Else a GPU node seen with no GPU pod for this long (in "
                                           "service, not cordoned, in no remediation state) gets the same preflight "
                                           "as a low-priority Job, at most once per interval (docs/preflight.md)",
                                           check=_off_or_interval)
    idle_check_max_jobs: int = setting(2, "idle-check Jobs running at once, fleet-wide (read from the top-level "
                                       "[preflight]; a group's value is not used)", check=between(1, 1000))
    idle_check_timeout_s: float = setting(600.0, "an idle-check Job's activeDeadlineSeconds (a pod that waited "
                                          "unscheduled or was preempted ends as unknown)", check=between(60, 3600))
    idle_check_priority_class: str = setting("gpuremediate-idle-check", "the PriorityClass of the idle-check pod: "
                                             "negative value, preemptionPolicy Never (the chart and kustomize ship "
                                             "it), so any real pod preempts it", check=dns_subdomain)


def preflight_args(policy: PreflightPolicy, *, on_unknown: str, expect_gpus: str = "") -> list[str]:
    """``gpuremediate preflight``'s arguments for ``policy`` (the webhook's init container, the idle-check Job):
    ``on_unknown`` pass (exit 0) or exit (exit 3); ``expect_gpus``: the whole GPUs given, fewer seen fails."""
    args = ["preflight", "--on-unknown", on_unknown, "--dcgmi", "auto" if policy.dcgm_diag else "no"]
    if expect_gpus:
        args += ["--expect-gpus", expect_gpus]
    if policy.command:
        args += ["--command", policy.command, "--command-timeout", f"{policy.command_timeout_s:g}"]
    return args


class PreflightJudge:
    """Judges a ``WorkloadSignal``'s failed preflights, node by node (a run of failures is one fault)."""

    def __init__(self, signal: WorkloadSignal) -> None:
        self.signal = signal
        self._runs: dict[str, str] = {}  # node -> the fingerprint of its run of failed preflights
        self._lock = threading.Lock()

    def failed(self, node: str, now: float, window_s: float) -> list[Failure]:
        return self.signal.failures(node, now, window_s, hows=PREFLIGHT_ONLY)

    def findings(self, node: str, now: float, policy: PreflightPolicy) -> list[Finding]:
        found = self.failed(node, now, policy.window_s) if policy.enabled else []
        if len(found) < policy.min_failures:
            with self._lock:
                self._runs.pop(node, None)
            return []
        first, last = found[0], found[-1]
        with self._lock:
            fingerprint = self._runs.setdefault(node, f"{KIND_PREFLIGHT}/{first.pod}@{first.at:.0f}")
        parsed = parse_message(last.text)
        gpus = tuple(dict.fromkeys(gpu_key(node, g) for f in found for g in _gpus(f)))
        check = parsed.check if parsed is not None else ""
        action = action_for(check, policy.action)
        message = (f"{len(found)} pod(s)' preflight failed on this node within {policy.window_s:.0f}s (last: "
                   f"{last.pod} at {_stamp(last.at)}: {last.text}); action {action}")
        return [Finding(node=node, kind=KIND_PREFLIGHT, code=check, gpus=gpus, action=action,
                        fingerprint=fingerprint, message=message)]


# The finding's message, read back for ``explain``: written above, read here, one place.
_MESSAGE = re.compile(r"^(?P<count>\d+) pod\(s\)' preflight failed on this node within \d+s \(last: (?P<pod>\S+) at "
                      r"(?P<at>\S+): (?P<line>.*)\); action \S+$")


@dataclass(frozen=True)
class LastPreflight:
    """The failed preflight a ``preflight-failed`` finding's message names."""

    count: int  # pods whose preflight failed within the window
    pod: str  # namespace/name
    at: str  # when its init container ended (RFC 3339)
    line: str  # its termination message
    gpus: tuple[str, ...]
    check: str


def last_preflight(message: str) -> LastPreflight | None:
    """The last failed preflight a finding's message names; None for any other message."""
    match = _MESSAGE.match(message.strip())
    if match is None:
        return None
    parsed = parse_message(match["line"])
    return LastPreflight(int(match["count"]), match["pod"], match["at"], match["line"],
                         parsed.gpus if parsed is not None else (), parsed.check if parsed is not None else "")


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def action_for(check: str, action: str) -> str:
    """The policy's action, but a reboot for a lost GPU where it says reset-gpu: ``nvidia-smi --gpu-reset`` needs
    the GPU on the bus, and only a reboot brings back one that fell off it (XID 79, whose catalog bucket is a
    reboot); the reset would fail and quarantine the node."""
    return ACTION_REBOOT if check == KIND_GPU_LOST and action == ACTION_RESET_GPU else action


def _gpus(failure: Failure) -> tuple[str, ...]:
    parsed = parse_message(failure.text)
    return parsed.gpus if parsed is not None else ()


def gpu_key(node: str, named: str) -> str:
    """A GPU as findings name it: its UUID, else ``<node>/gpuN`` (an index) or ``<node>/pci<bus>`` (a lost GPU)."""
    if named.startswith("GPU-") or named.startswith("MIG-"):
        return named
    return f"{node}/gpu{named}" if named.isdigit() else f"{node}/{named}"
