"""The validation claim of an isolated GPU: made once; a refused create is asked for again only every
CLAIM_RETRY_S, not on every step of the validate loop (a step runs about every second while the Job waits)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.loops import validate
from gpuremediate.loops.validate import ValidateLoop
from gpuremediate.policy.config import Policy
from gpuremediate.vocab.record import SCOPE_GPU, Isolation, NodeRecord
from gpuremediate.vocab.states import VALIDATING

NODE = {"metadata": {"name": "gpu-node-1"}}
JOB = {"metadata": {"name": "gpur-validate-gpu-node-1-x-1", "uid": "job-uid"}}
RECORD = NodeRecord(state=VALIDATING, isolation=Isolation(scope=SCOPE_GPU, uuid="GPU-1", rule="r",
                                                          driver="gpu.nvidia.com", pool="gpu-node-1", device="gpu-3"))


class Client:
    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.calls: list[str] = []

    def get(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.calls.append("get")
        raise errors.NotFound(404, {"reason": "NotFound", "message": "no", "details": {"name": name}})

    def create(self, res: Any, body: dict[str, Any], namespace: str | None = None, **_: Any) -> dict[str, Any]:
        self.calls.append("create")
        if self.refuse:
            self.refuse -= 1
            raise errors.Forbidden(403, {"reason": "Forbidden", "message": "resourceclaims is forbidden"})
        return body


def loop(client: Client) -> ValidateLoop:
    ctx = SimpleNamespace(client=client, settings=SimpleNamespace(jobs_namespace="jobs"),
                          policy_for=lambda _node: Policy())
    return ValidateLoop(ctx)  # type: ignore[arg-type]


def test_a_refused_claim_is_asked_for_again_only_after_the_retry_time(monkeypatch: pytest.MonkeyPatch) -> None:
    client = Client(refuse=1)
    validating = loop(client)
    validating._make_claim(NODE, RECORD, JOB, JOB["metadata"]["name"])
    validating._make_claim(NODE, RECORD, JOB, JOB["metadata"]["name"])  # the next step: no request
    assert client.calls == ["get", "create"]
    monkeypatch.setattr(validate, "CLAIM_RETRY_S", 0.0)
    validating._make_claim(NODE, RECORD, JOB, JOB["metadata"]["name"])  # made now
    validating._make_claim(NODE, RECORD, JOB, JOB["metadata"]["name"])  # made: never asked again
    assert client.calls == ["get", "create", "get", "create"]
