"""The reliability checker's own invariants on hand-made logs: a custom resource created twice, and a
controller write past its lease's renew deadline (or without the lease), are violations."""

from __future__ import annotations

import threading
from typing import Any

from .harness import (
    CONTROLLER_USER_PREFIX,
    FENCE_SLACK_S,
    PERSON_USER,
    Audit,
    Checker,
    Created,
    LeaseWrite,
)

CONTROLLER = f"{CONTROLLER_USER_PREFIX}1"
DEADLINE = 2.0


class Log:
    """What the Checker reads from a Recorder, filled by the test."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.node_changes: list[Any] = []
        self.jobs: list[Any] = []
        self.evictions: list[Any] = []
        self.created: list[Created] = []
        self.lease_writes: list[LeaseWrite] = []
        self.audit: list[Audit] = []


def _checker(log: Log) -> Checker:
    return Checker(log, limit=1, initial_nodes=[], renew_deadline=DEADLINE)  # type: ignore[arg-type]


def _patch(at: float, user: str = CONTROLLER) -> Audit:
    return Audit(at, user, "patch", "nodes", "", None, "gpu-node-1")


def _codes(checker: Checker) -> list[str]:
    checker.process()
    return [v.code for v in checker.violations]


def test_writes_within_the_renew_deadline_of_the_last_renewal_pass() -> None:
    log = Log()
    log.lease_writes += [LeaseWrite(10.0, CONTROLLER, "reliability-1"), LeaseWrite(11.5, CONTROLLER, "reliability-1")]
    log.audit += [_patch(10.5), _patch(11.5 + DEADLINE + FENCE_SLACK_S - 0.01),
                  Audit(30.0, CONTROLLER, "update", "leases", "", "ns", "gpuremediate")]  # its own Lease: exempt
    assert _codes(_checker(log)) == []


def test_a_write_after_the_renew_deadline_is_a_violation() -> None:
    log = Log()
    log.lease_writes.append(LeaseWrite(10.0, CONTROLLER, "reliability-1"))
    log.audit.append(_patch(10.0 + DEADLINE + FENCE_SLACK_S + 0.5))
    checker = _checker(log)
    assert _codes(checker) == ["write-after-renew-deadline"]
    assert "after its last lease renewal" in checker.violations[0].text


def test_a_write_before_the_lease_or_after_its_release_is_a_violation() -> None:
    log = Log()
    log.audit.append(_patch(5.0))
    log.lease_writes += [LeaseWrite(10.0, CONTROLLER, "reliability-1"), LeaseWrite(11.0, CONTROLLER, "")]
    log.audit.append(_patch(11.2))
    checker = _checker(log)
    assert _codes(checker) == ["write-after-renew-deadline", "write-after-renew-deadline"]
    assert "before it acquired" in checker.violations[0].text and "after it released" in checker.violations[1].text


def test_a_person_writing_is_no_fence_violation() -> None:
    log = Log()
    log.audit.append(_patch(50.0, user=PERSON_USER))
    assert _codes(_checker(log)) == []


def test_a_custom_resource_created_twice_is_a_violation() -> None:
    log = Log()
    key = "gpuremediate.io/remediations"
    log.created += [Created(1, 1.0, CONTROLLER, key, "ns", "fix-node-1-1"),
                    Created(2, 2.0, CONTROLLER, key, "ns", "fix-node-1-2"),
                    Created(3, 3.0, CONTROLLER, key, "ns", "fix-node-1-1")]
    assert _codes(_checker(log)) == ["cr-twice"]


def test_a_custom_resource_recreated_after_a_person_deleted_it_is_a_violation() -> None:
    log = Log()
    key = "nvsentinel.nvidia.com/drainrequests"
    log.created += [Created(1, 1.0, CONTROLLER, key, "ns", "drain-node-1"),
                    Created(2, 2.0, PERSON_USER, key, "ns", "drain-node-1", deleted=True),
                    Created(3, 3.0, CONTROLLER, key, "ns", "drain-node-1")]
    checker = _checker(log)
    assert _codes(checker) == ["cr-recreated-after-delete"]
    assert f"deleted before by {PERSON_USER}" in checker.violations[0].text
