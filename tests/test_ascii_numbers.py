"""Numbers people type are ASCII digits: str.isdigit() also takes '²' and '٣', and int() then fails or
reads a number nobody wrote. Every such field gives its own clear error, never a traceback."""

from __future__ import annotations

import pytest

from gpuremediate.config import SettingsError, parse_addr
from gpuremediate.policy.config import PolicyError, loads_policy
from gpuremediate.policy.safety import Budget
from gpuremediate.vocab.window import WindowError, parse_hours


@pytest.mark.parametrize("addr", [":8²", "127.0.0.1:٨٠٨٠"])
def test_metrics_addr_port(addr: str) -> None:
    with pytest.raises(SettingsError, match="--metrics-addr"):
        parse_addr(addr)


@pytest.mark.parametrize("value", ["²", "٣", "٣%"])
def test_budget_max_unavailable(value: str) -> None:
    with pytest.raises(PolicyError, match=r"budget\.max_unavailable"):
        loads_policy(f'[budget]\nmax_unavailable = "{value}"\n')
    with pytest.raises(ValueError, match="maxUnavailable"):
        Budget(value)


@pytest.mark.parametrize("hours", ["0²:00-04:00", "٠٢:00-04:00"])
def test_window_hours(hours: str) -> None:
    with pytest.raises(WindowError, match="HH:MM"):
        parse_hours(hours)
