"""Small hand-made histories for the replay tests, written as real saved scrapes (sim.history's writer)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuremediate.policy.config import PolicyFile, loads_policy
from gpuremediate.replay.engine import ReplayOptions, replay
from gpuremediate.replay.history import load_scrapes
from gpuremediate.replay.result import Move, ReplayResult
from sim.history import Fault, Fleet, node_list, write_scrapes

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
HOUR = 3600.0


def fleet(count: int = 4, hours: float = 12.0, faults: Sequence[Fault] = (),
          down: Sequence[tuple[str, float, float]] = (), excluded: Sequence[str] = ()) -> Fleet:
    return Fleet([f"node-{i}" for i in range(count)], T0, T0 + hours * HOUR, list(faults), list(down), set(excluded))


def xid(node: int, at: float, until: float | None, code: int = 79, gpu: int = 0) -> Fault:
    """XID ``code`` on GPU ``gpu`` of node-<node> from T0+at to T0+until (seconds)."""
    return Fault(f"node-{node}", gpu, T0 + at, None if until is None else T0 + until, {"xid": float(code)})


def fault(node: int, at: float, until: float | None, gpu: int = 0, **values: float) -> Fault:
    return Fault(f"node-{node}", gpu, T0 + at, None if until is None else T0 + until, values)


def run(tmp: Path, scenario: Fleet, policy: str = "", step: float = 30.0,
        labels: Mapping[str, str] | None = None) -> ReplayResult:
    """The replay of ``scenario``; ``labels`` are added to every node (as a `kubectl get nodes` would show)."""
    folder = tmp / "scrapes"
    write_scrapes(scenario, folder)
    policy_file: PolicyFile = loads_policy(policy, "test-policy")
    nodes: list[Mapping[str, object]] = node_list(scenario)["items"]  # type: ignore[assignment]
    for item in nodes:
        item["metadata"]["labels"].update(labels or {})  # type: ignore[index]
    return replay(load_scrapes(folder), policy_file, nodes, ReplayOptions(step_s=step))


def moves(result: ReplayResult, node: str | None = None) -> list[tuple[float, str, str, str, str]]:
    """(seconds after T0, node, from, to, reason) per transition."""
    return [(m.at - T0, m.node, m.from_state, m.to_state, m.reason) for m in result.moves
            if node is None or m.node == node]


def first(result: ReplayResult, node: str, to: str) -> Move:
    return next(m for m in result.moves if m.node == node and m.to_state == to)
