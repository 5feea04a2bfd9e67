"""Replay of issue 46's failed preflights: a pods history whose pod's ``gpuremediate-preflight`` container (the
webhook's init container, or an idle-node check's Job) wrote ``preflight failed`` is the node's ``preflight-failed``
finding at that time, acted on as the policy says; an "unknown" line is no finding; ``[preflight] enabled = false``
reads none."""

from __future__ import annotations

from pathlib import Path

from gpuremediate.vocab.preflight import CONTAINER_NAME, KIND_PREFLIGHT
from sim.history import Fleet, _failed_pod, _stamp
from tests.replay.helpers import HOUR, T0, fleet, moves, run

FAILED_LINE = "preflight failed: GPU GPU-0bad: ecc-dbe: GPU GPU-0bad has 2 volatile double-bit ECC error(s)"
UNKNOWN_LINE = "preflight unknown: nvidia-smi timed out after 10s"


def preflight_pod(name: str, node: str, at: float, message: str, *, init: bool = True) -> dict[str, object]:
    """A pod whose preflight ended at T0+``at`` with ``message`` (exit 1, or 3 for unknown): an init container
    (the webhook's) or the container of an idle-node check's Job."""
    code = 3 if message.startswith("preflight unknown") else 1
    ended = {"exitCode": code, "reason": "Error", "message": message, "startedAt": _stamp(T0 + at - 5),
             "finishedAt": _stamp(T0 + at)}
    status = {"name": CONTAINER_NAME, "ready": False, "restartCount": 0, "image": "gpuremediate:0.1.0",
              "state": {"terminated": ended}}
    return _failed_pod(name, node, T0 + at - 5, {"initContainerStatuses" if init else "containerStatuses": [status]})


def with_pods(*pods: dict[str, object]) -> Fleet:
    scenario = fleet(count=4, hours=3.0)
    scenario.pods = list(pods)
    return scenario


def test_a_failed_preflight_in_the_pods_history_is_acted_on_at_its_time(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(preflight_pod("train-0", "node-1", HOUR, FAILED_LINE)))

    first = moves(result)[0]
    assert first == (HOUR, "node-1", "healthy", "draining", KIND_PREFLIGHT)  # reset-gpu: drained first
    assert result.summary()["failed_pods"] == {"in_history": 1, "gpu_errors": 1}


def test_an_idle_checks_failed_pod_is_read_the_same_way(tmp_path: Path) -> None:
    result = run(tmp_path, with_pods(preflight_pod("gpur-idle-check-node-2-1-abcde", "node-2", HOUR, FAILED_LINE,
                                                   init=False)), '[preflight]\naction = "cordon"\n')

    assert moves(result)[0] == (HOUR, "node-2", "healthy", "cordoned", KIND_PREFLIGHT)


def test_an_unknown_preflight_and_a_policy_that_reads_none_make_no_move(tmp_path: Path) -> None:
    unknown = run(tmp_path / "unknown", with_pods(preflight_pod("train-0", "node-1", HOUR, UNKNOWN_LINE)))
    off = run(tmp_path / "off", with_pods(preflight_pod("train-0", "node-1", HOUR, FAILED_LINE)),
              "[preflight]\nenabled = false\n")

    assert unknown.moves == [] and off.moves == []
