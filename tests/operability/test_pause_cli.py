"""The pause switch in ConfigMap gpuremediate-breaker and the commands around it: pause, resume, status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate import cli, fleet
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP, PAUSE_ANNOTATION, PAUSE_KEY, BreakerStore
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.resources import CONFIGMAPS, NAMESPACES
from gpuremediate.policy.safety import CircuitBreaker, DomainTrip, Pause
from sim.kubeapi import KubeAPIServer

NS = "gpuremediate-system"


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[KubeClient, str]]:
    srv = KubeAPIServer().start()
    kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    client = KubeClient(load_config(kubeconfig))
    client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    try:
        yield client, str(kubeconfig)
    finally:
        client.close()
        srv.stop()


def test_pause_and_resume_commands_write_the_pause_key_and_status_shows_it(
        api: tuple[KubeClient, str], capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    flags = ["--kubeconfig", kubeconfig, "--namespace", NS]
    assert cli.main(["pause", "--reason", "cluster upgrade", "--by", "alice", *flags]) == 0
    assert "paused by alice: cluster upgrade" in capsys.readouterr().out
    stored = json.loads(client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)["data"][PAUSE_KEY])
    assert (stored["paused"], stored["by"], stored["reason"]) == (True, "alice", "cluster upgrade")
    assert cli.main(["status", *flags]) == 0
    assert capsys.readouterr().out.startswith("PAUSED by alice ")
    assert cli.main(["resume", *flags]) == 0
    assert "resumed" in capsys.readouterr().out
    assert not BreakerStore(client, NS).latest_pause().paused
    assert cli.main(["status", *flags]) == 0
    assert capsys.readouterr().out.startswith("NODE")


def test_the_breaker_keeps_the_pause_and_the_pause_keeps_the_breaker(api: tuple[KubeClient, str]) -> None:
    client, _ = api
    store = BreakerStore(client, NS)
    store.set_pause(Pause(paused=True, by="alice", reason="upgrade"))
    store.save(CircuitBreaker(open=True, opened_at=1.0, reason="5 of 10 faulted"))  # the detect loop trips it
    fresh = BreakerStore(client, NS)
    assert fresh.load().is_open and fresh.latest_pause().reason == "upgrade"
    fresh.reset(by="bob")  # breaker reset: the pause stays
    assert BreakerStore(client, NS).latest_pause().paused
    store.set_pause(Pause())  # resume: the breaker as it is stays
    assert BreakerStore(client, NS).load().reset_by == "bob"


def test_an_unreadable_pause_key_is_treated_as_paused(api: tuple[KubeClient, str]) -> None:
    client, _ = api
    client.create(CONFIGMAPS, {"metadata": {"name": BREAKER_CONFIGMAP, "namespace": NS},
                               "data": {"state": "{}", PAUSE_KEY: '{"paused": "yes"}'}}, NS)
    pause = BreakerStore(client, NS).latest_pause()
    assert pause.paused and "pause state unreadable" in pause.reason


def test_the_pause_annotation_wins_and_resume_says_it_still_pauses(
        api: tuple[KubeClient, str], capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    client.create(CONFIGMAPS, {"metadata": {"name": BREAKER_CONFIGMAP, "namespace": NS,
                                            "annotations": {PAUSE_ANNOTATION: "os-upgrade"}}, "data": {}}, NS)
    pause = BreakerStore(client, NS).latest_pause()
    assert (pause.paused, pause.reason) == (True, "os-upgrade")
    assert cli.main(["resume", "--kubeconfig", kubeconfig, "--namespace", NS]) == 0
    assert f"the annotation {PAUSE_ANNOTATION}" in capsys.readouterr().out
    annotations = client.get(CONFIGMAPS, BREAKER_CONFIGMAP, NS)["metadata"]["annotations"]
    assert annotations == {PAUSE_ANNOTATION: "os-upgrade"}, "a person's resume removed the tool's annotation"


def test_status_header_lines_name_the_pause_the_breaker_and_each_open_domain() -> None:
    trip = DomainTrip("topology.kubernetes.io/rack", "r7", "3 of 4 nodes faulted", 100.0)
    lines = fleet.safety_lines(Pause(paused=True, by="alice", reason="upgrade", at=40.0),
                               CircuitBreaker(open=True, reason="9 of 20 faulted", domains=(trip,)), now=100.0)
    assert lines == ["PAUSED by alice 1m ago: upgrade (no new work; `gpuremediate resume`)",
                     "CIRCUIT BREAKER OPEN: 9 of 20 faulted (`gpuremediate breaker reset`)",
                     "DOMAIN BREAKER OPEN for topology.kubernetes.io/rack=r7: 3 of 4 nodes faulted"]
    assert fleet.safety_lines(Pause(), CircuitBreaker()) == []
    assert fleet.render_status([], header_lines=lines[:1]).startswith("PAUSED by alice")


def test_breaker_status_lists_open_domains(api: tuple[KubeClient, str], capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    trip = DomainTrip("topology.kubernetes.io/rack", "r7", "3 of 4 nodes faulted", 100.0)
    BreakerStore(client, NS).save(CircuitBreaker(domains=(trip,)))
    assert cli.main(["breaker", "status", "--kubeconfig", kubeconfig, "--namespace", NS]) == 0
    assert "domain breaker open for topology.kubernetes.io/rack=r7" in capsys.readouterr().out
    assert cli.main(["breaker", "reset", "--kubeconfig", kubeconfig, "--namespace", NS]) == 0
    assert BreakerStore(client, NS).load().domains == ()
