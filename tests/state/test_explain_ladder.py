"""explain's escalation line: the rung and attempt of a repair, against the policy's ladder when it is given."""

from __future__ import annotations

from typing import Any

from gpuremediate import fleet
from gpuremediate.policy.config import loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import ActionInProgress, Fault, NodeRecord, node_patch

POLICY = loads_policy("""
[remediation]
max_attempts = 3
[remediation.ladders]
reset-gpu = [{action = "reset-gpu"}, {action = "reboot", attempts = 1}, {action = "rma"}]
[actions.rma]
apiGroup = "repair.example.com"
kind = "RMA"
maxAttempts = 4
""")


class OneNode:
    def __init__(self, record: NodeRecord) -> None:
        self.node = {"metadata": {"name": "n1", "labels": {}, **node_patch(record)["metadata"]}}

    def get(self, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        return self.node


def _repairing(kind: str, rung: int, attempt: int = 1) -> NodeRecord:
    fault = Fault("xid", "79", (), "f", "reset-gpu", 1.0, 1.0, "")
    return NodeRecord(state=states.REPAIRING, since=1.0, fault=fault,
                      action=ActionInProgress(kind, f"job-{kind}", attempt, 2.0, rung=rung))


def test_explain_with_the_policy_shows_the_rung_of_the_ladder_and_its_attempts() -> None:
    text = fleet.explain_node(OneNode(_repairing("reboot", 1)), "n1", POLICY)  # type: ignore[arg-type]
    assert "Escalation ladder: rung 2/3 reboot, attempt 1/1." in text, text
    first = fleet.explain_node(OneNode(_repairing("reset-gpu", 0, 2)), "n1", POLICY)  # type: ignore[arg-type]
    assert "rung 1/3 reset-gpu, attempt 2/3." in first  # the rung's attempts default to max_attempts
    custom = fleet.explain_node(OneNode(_repairing("rma", 2)), "n1", POLICY)  # type: ignore[arg-type]
    assert "rung 3/3 rma, attempt 1/4." in custom  # ... or the custom action's maxAttempts


def test_explain_without_the_policy_shows_what_the_record_holds() -> None:
    text = fleet.explain(_repairing("reboot", 1), "n1")
    assert "Escalation ladder: rung 2 reboot, attempt 1." in text, text
    assert "Escalation" not in fleet.explain(_repairing("diagnostics", 0), "n1")
