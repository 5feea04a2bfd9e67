"""What the controller hands its parts from the policy file (no API call is made to build them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuremediate import controller as controller_module
from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.policy.config import load_policy, loads_policy
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord, node_patch


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


def test_an_empty_policy_file_is_said_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                               ) -> None:
    """A policy file that sets nothing (a template that rendered empty) runs on the defaults, said in the start
    log and by gpuremediate_policy_file_empty; one that sets anything is not."""
    client = KubeClient(ClusterConfig(server="http://127.0.0.1:1", token_source=StaticToken("t")))
    empty, set_one = tmp_path / "empty.toml", tmp_path / "one.toml"
    empty.write_text("# only a comment\n\n", encoding="utf-8")
    set_one.write_text("[budget]\nmax_unavailable = \"2\"\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="gpuremediate.controller"):
        quiet = Controller(Settings(policy_path=str(empty)), load_policy(empty), client=client,
                           source=object())  # type: ignore[arg-type]
    assert "policy file sets nothing" in caplog.text
    assert "gpuremediate_policy_file_empty 1" in quiet.metrics.registry.render()
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpuremediate.controller"):
        told = Controller(Settings(policy_path=str(set_one)), load_policy(set_one), client=client,
                          source=object())  # type: ignore[arg-type]
    assert "policy file sets nothing" not in caplog.text
    assert "gpuremediate_policy_file_empty 0" in told.metrics.registry.render()


def test_a_node_relabelled_out_of_the_selector_mid_flow_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 41: a node moved out of --gpu-node-selector while draining waited silently. One warning and one
    Event say it; a healthy node leaving the selector, or the same node seen again, says nothing more."""
    client = KubeClient(ClusterConfig(server="http://127.0.0.1:1", token_source=StaticToken("t")))
    controller = Controller(Settings(gpu_node_selector="pool=gpu"), loads_policy(""), client=client,
                            source=object())  # type: ignore[arg-type]
    told: list[tuple[str, str, str]] = []
    controller.ctx.events.node_event = lambda node, reason, message, *_a, **_k: told.append(  # type: ignore[method-assign]
        (node, reason, message))
    controller.acting = True
    draining = NodeRecord(state=states.DRAINING, since=1.0, reason="xid-79", cordoned_by_us=True)

    def node(name: str, labels: dict[str, str], record: NodeRecord | None) -> dict[str, Any]:
        annotations = {} if record is None else node_patch(record)["metadata"]["annotations"]
        return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}

    with caplog.at_level("WARNING", logger="gpuremediate.controller"):
        controller._on_node(node("gpu-1", {"pool": "cpu"}, draining))
        controller._on_node(node("gpu-1", {"pool": "cpu"}, draining))  # a heartbeat: nothing new to say
        controller._on_node(node("gpu-2", {"pool": "cpu"}, None))  # nothing of ours on it
    assert [(n, r) for n, r, _m in told] == [("gpu-1", "GPUNodeNotSelected")]
    assert "draining" in told[0][2] and "gpuremediate release gpu-1" in told[0][2]
    assert caplog.text.count("left the GPU node selector mid-flow") == 1
