"""The preflight's words (issue 46), shared by the check that runs in a pod's init container
(``gpuremediate preflight``), the webhook that adds it and the failed-pod reader that turns its failure into a
``preflight-failed`` finding: the container's name, the opt-in and opt-out marks, and its one-line termination
message.

The message is the contract between the init container and the controller (``/dev/termination-log``, which the
kubelet copies into the container's ``state.terminated.message``, at most 4096 bytes)::

    preflight failed: GPU GPU-5e3f...,GPU-77aa...: ecc-dbe: <what was seen>
    preflight unknown: <why the preflight could not run>

Only ``failed`` names a GPU and makes a finding; ``unknown`` never does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONTAINER_NAME = "gpuremediate-preflight"
NAMESPACE_LABEL = "gpuremediate.io/preflight"  # on a namespace: "enabled" opts its GPU pods in
NAMESPACE_ENABLED = "enabled"
POD_ANNOTATION = "gpuremediate.io/preflight"  # on a pod: "skip" opts it out
POD_SKIP = "skip"
POD_LABEL = "gpuremediate.io/preflight"  # on a pod: the webhook added the preflight (its value: "injected")
POD_INJECTED = "injected"
KIND_PREFLIGHT = "preflight-failed"

FAILED = "failed"
UNKNOWN = "unknown"
MAX_MESSAGE = 1024  # bytes of the one line written (the kubelet keeps 4096 per container, 12 KiB per pod)

_LINE = re.compile(r"^preflight (?P<result>failed|unknown): (?P<rest>.*)$")
_FAILED = re.compile(r"^GPU (?P<gpus>\S*): (?P<check>[A-Za-z0-9_.-]+): (?P<text>.*)$")


@dataclass(frozen=True)
class PreflightMessage:
    """A preflight's termination message, read back."""

    result: str  # FAILED | UNKNOWN
    gpus: tuple[str, ...]  # the GPUs named (UUIDs; pci<bus id> for a lost GPU, an index where neither was read)
    check: str  # the finding kind or the check that failed (dcgm-diag, command); "" for unknown
    text: str


def failed_message(gpus: tuple[str, ...], check: str, text: str) -> str:
    """One line naming the GPUs and the check; cut to MAX_MESSAGE bytes."""
    named = ",".join("".join(g.split()) for g in gpus) or "all"
    return _cut(f"preflight {FAILED}: GPU {named}: {check}: {_one_line(text)}")


def unknown_message(reason: str) -> str:
    return _cut(f"preflight {UNKNOWN}: {_one_line(reason)}")


def parse_message(message: str) -> PreflightMessage | None:
    """The message's parts, or None when it is not a preflight's line."""
    line = _LINE.match(message.strip().splitlines()[0] if message.strip() else "")
    if line is None:
        return None
    if line["result"] == UNKNOWN:
        return PreflightMessage(UNKNOWN, (), "", line["rest"])
    failed = _FAILED.match(line["rest"])
    if failed is None:
        return None
    gpus = tuple(g for g in failed["gpus"].split(",") if g and g != "all")
    return PreflightMessage(FAILED, gpus, failed["check"], failed["text"])


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cut(line: str) -> str:
    data = line.encode("utf-8")
    return line if len(data) <= MAX_MESSAGE else data[:MAX_MESSAGE - 3].decode("utf-8", "ignore") + "..."
