"""The workload judge (issue 29): a node whose pods keep failing with GPU errors (``signals.workload`` reads them
from the cluster's Failed pods) gets a ``workload-gpu-errors`` finding once ``[workload] min_pods`` distinct pods
failed that way there within ``window_s``."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gpuremediate.signals.workload import ADMISSION, WorkloadSignal
from gpuremediate.vocab.findings import ACTION_CORDON, Finding
from gpuremediate.vocab.schema import between, duration, setting

KIND_WORKLOAD = "workload-gpu-errors"


@dataclass(frozen=True)
class WorkloadPolicy:
    """``[workload]``: pods failing on a node with GPU errors as a finding for that node."""

    enabled: bool = setting(True, "watch the cluster's Failed pods (one watch, each reduced to its GPU error) and "
                            "give a node whose pods keep failing with GPU errors a workload-gpu-errors finding")
    min_pods: int = setting(3, "distinct pods failed with a GPU error on the node within window_s",
                            check=between(1, 10_000))
    window_s: float = setting(600.0, "seconds the failures are counted over", check=duration(10))
    action: str = setting(ACTION_CORDON, "what the finding does (cordon: no new pods land on the node, the "
                          "others finish; reboot, reset-gpu, quarantine or a custom action)", action=True)


class WorkloadJudge:
    """Judges a ``WorkloadSignal``'s failures, node by node; remembers each node's run of failures (its
    fingerprint) while the run lasts."""

    def __init__(self, signal: WorkloadSignal) -> None:
        self.signal = signal
        self._runs: dict[str, str] = {}  # node -> the fingerprint of its run of failures, while it has one
        self._lock = threading.Lock()

    def findings(self, node: str, now: float, *, min_pods: int, window_s: float, action: str) -> list[Finding]:
        """One finding when ``min_pods`` distinct pods failed on ``node`` with a GPU error within ``window_s``;
        its fingerprint is the first failure of the run, kept while the run lasts: a run is one fault."""
        found = self.signal.failures(node, now, window_s)
        if len(found) < max(1, min_pods):
            with self._lock:
                self._runs.pop(node, None)  # the run ended: the next one is a fault of its own
            return []
        first, last = found[0], found[-1]
        with self._lock:  # a run longer than the window keeps the fingerprint it began with
            fingerprint = self._runs.setdefault(node, f"{KIND_WORKLOAD}/{first.pod}@{first.at:.0f}")
        how = "refused at admission" if all(f.how == ADMISSION for f in found) else "failed with GPU errors"
        message = (f"{len(found)} pods {how} on this node within {window_s:.0f}s (last: {last.pod}: {last.text}); "
                   f"action {action}")
        return [Finding(node=node, kind=KIND_WORKLOAD, code=first.how, gpus=(), action=action,
                        fingerprint=fingerprint, message=message)]
