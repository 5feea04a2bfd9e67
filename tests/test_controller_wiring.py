"""What the controller hands its parts from the policy file (no API call is made to build them)."""

from __future__ import annotations

from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.policy.config import loads_policy


def test_the_node_writer_gets_the_policy_taint() -> None:
    client = KubeClient(ClusterConfig(server="http://127.0.0.1:1", token_source=StaticToken("t")))
    policy = loads_policy('[taint]\nenabled = true\nkey = "example.com/gpu-broken"\n')
    controller = Controller(Settings(), policy, client=client, source=object())  # type: ignore[arg-type]
    assert controller.ctx.writer.taint.enabled and controller.ctx.writer.taint.key == "example.com/gpu-broken"
    plain = Controller(Settings(), loads_policy(""), client=client, source=object())  # type: ignore[arg-type]
    assert not plain.ctx.writer.taint.enabled
