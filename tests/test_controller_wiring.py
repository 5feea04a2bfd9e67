"""What the controller hands its parts from the policy file (no API call is made to build them)."""

from __future__ import annotations

import pytest

from gpuremediate import controller as controller_module
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


def test_a_dry_run_posts_no_notification_and_reads_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[bool] = []
    monkeypatch.setattr(controller_module, "read_notifier", lambda *a, **k: read.append(True) or (None, ""))
    client = KubeClient(ClusterConfig(server="http://127.0.0.1:1", token_source=StaticToken("t")))
    policy = loads_policy("[notifications]\nenabled = true\n")
    dry = Controller(Settings(dry_run=True), policy, client=client, source=object())  # type: ignore[arg-type]
    assert dry._read_notifier() is None and read == []
    acting = Controller(Settings(), policy, client=client, source=object())  # type: ignore[arg-type]
    acting._read_notifier()
    assert read == [True]  # the check above could fail


def test_shards_replace_the_leader_lease_and_claim_drains_fleet_wide() -> None:
    client = KubeClient(ClusterConfig(server="http://127.0.0.1:1", token_source=StaticToken("t")))
    policy = loads_policy("")
    sharded = Controller(Settings(shards=3, leader_elect=True, identity="replica-a"), policy, client=client,
                         source=object())  # type: ignore[arg-type]
    assert sharded.shards is not None and sharded.shards.shards == 3 and sharded.shards.identity == "replica-a"
    assert sharded._elector() is None and sharded.ctx.claims is not None
    dry = Controller(Settings(shards=3, dry_run=True), policy, client=client, source=object())  # type: ignore[arg-type]
    assert dry.ctx.claims is None  # a dry run admits nothing anywhere
    single = Controller(Settings(leader_elect=True), policy, client=client, source=object())  # type: ignore[arg-type]
    assert single.shards is None and single.ctx.claims is None and single._elector() is not None
