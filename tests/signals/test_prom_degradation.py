"""What the Prometheus source asks for the degradation detector (signals/prom_degradation.py), without a server:
the plan follows the policy groups (the loosest threshold of each), and nothing is asked while every group is off."""

from __future__ import annotations

import dataclasses

from gpuremediate.signals import prom_degradation
from gpuremediate.signals.exposition import Sample
from gpuremediate.signals.trends import BUCKETS
from gpuremediate.vocab.degradation import DegradationPolicy

OFF = DegradationPolicy()
SLOW = DegradationPolicy(enabled=True)


def test_nothing_is_asked_while_every_group_is_off() -> None:
    assert prom_degradation.plan_for([OFF, OFF]) is None


def test_the_plan_takes_the_loosest_threshold_of_the_groups() -> None:
    strict = dataclasses.replace(SLOW, slow_ratio=0.7, busy_util_pct=80.0, link_clear_s=600.0)
    loose = dataclasses.replace(SLOW, slow_ratio=0.9, busy_util_pct=40.0, link_clear_s=3600.0)
    plan = prom_degradation.plan_for([strict, OFF, loose])
    assert plan is not None and plan.slow and not plan.pending
    assert (plan.slow_ratio, plan.busy_util_pct, plan.link_window_s) == (0.9, 40.0, 3600.0)
    assert plan.sbe_window_s == plan.rows_window_s == 0.0  # no group watches trends


def test_trends_alone_ask_for_counters_over_their_window_and_no_clock() -> None:
    plan = prom_degradation.plan_for([dataclasses.replace(OFF, trends=True, sbe_window_s=3600.0, rows_new_min=0)])
    assert plan is not None and not plan.slow and plan.pending and plan.link_window_s == 0.0
    assert plan.sbe_window_s == 3600.0 * (1 + 1 / BUCKETS) and plan.rows_window_s == 0.0
    assert prom_degradation.nodes_query(plan, ("Hostname",), full=False) == ""  # trends: every FULL_EVERY reads
    query = prom_degradation.nodes_query(plan, ("Hostname",), full=True)
    assert "DCGM_FI_DEV_SM_CLOCK" not in query and "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" not in query
    assert f"offset {int(3600 * (1 + 1 / BUCKETS) + prom_degradation.SHIP_MARGIN_S)}s" in query


def test_peer_statistics_need_all_three_series_of_a_model() -> None:
    def sample(name: str, model: str, value: float) -> Sample:
        return Sample(name, (("modelName", model),), value)

    got = prom_degradation.fleet_peers([
        sample(prom_degradation.PEER_MEDIAN, "H100", 1980.0), sample(prom_degradation.PEER_MAD, "H100", 10.0),
        sample(prom_degradation.PEER_COUNT, "H100", 40.0), sample(prom_degradation.PEER_MEDIAN, "A100", 1410.0)])
    assert set(got) == {"H100"}
    assert (got["H100"].median, got["H100"].count) == (1980.0, 40)
    assert got["H100"].spread == 10.0 * 1.4826
