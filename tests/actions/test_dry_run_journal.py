"""The dry run's journal (actions/dry_run_journal.py): what it would have written, read back by the CLI;
bounded; ended or stale when the dry run is gone."""

from __future__ import annotations

from gpuremediate.actions.dry_run_journal import MAX_BYTES, DryRunJournal, Journal, read_journal
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES
from gpuremediate.vocab import states
from gpuremediate.vocab.record import NodeRecord
from sim.kubeapi import KubeAPIServer

NS = "gpuremediate-system"


def test_the_journal_round_trips_and_keeps_only_what_the_dry_run_would_change() -> None:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    try:
        client.create(NAMESPACES, {"metadata": {"name": NS}})
        now = [1000.0]
        journal = DryRunJournal(client, NS, "replica-a", clock=lambda: now[0])
        journal.note_record("gpu-1", NodeRecord(state=states.DRAINING, since=999.0))
        journal.note_record("gpu-2", NodeRecord(state=states.QUARANTINED, since=998.0))
        journal.note_record("gpu-2", NodeRecord())  # back to healthy: no longer shown
        journal.note_record("gpu-3", NodeRecord(thermal_hold_ends={"GPU-1": 1060.0}))  # healthy, a GPU watched
        journal.note_transition("gpu-1", states.HEALTHY, states.DRAINING, "xid-79", "m")
        journal.note_breaker({"open": True, "reason": "storm"})
        journal.flush()
        read = read_journal(client, NS)
        assert read is not None and read.live(now[0]) and read.identity == "replica-a"
        assert set(read.records) == {"gpu-1", "gpu-3"} and read.records["gpu-1"].state == states.DRAINING
        assert [(d.node, d.to_state) for d in read.decisions] == [("gpu-1", states.DRAINING)]
        assert read.breaker == {"open": True, "reason": "storm"}
        assert not read.live(now[0] + 121), "a journal not updated for two minutes is a dry run that was killed"
        journal.start()
        journal.stop()
        ended = read_journal(client, NS)
        assert ended is not None and ended.ended and not ended.live(now[0])
    finally:
        client.close()
        srv.stop()


def test_a_journal_past_its_size_keeps_the_newest_records_and_says_how_many_it_left_out() -> None:
    big = "x" * 5000
    journal = Journal(records={f"gpu-{i}": NodeRecord(state=states.DRAINING, since=float(i), message=big[:1000])
                               for i in range(2000)})
    data = journal.to_data()
    assert len(data["records"]) <= MAX_BYTES + 64 * 1024
    back = Journal.from_data(data)
    assert back.left_out > 0 and len(back.records) + back.left_out == 2000
    assert "gpu-1999" in back.records and "gpu-0" not in back.records
