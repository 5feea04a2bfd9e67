"""The e2e run's last line about 409s says what they are (issue 50: `409 Conflicts met by the controller: 527 in 71
scenarios` meant nothing to a reader of `make test`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from e2e.conftest import CONFLICTS, pytest_terminal_summary


class _Terminal:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_line(self, line: str, **_: Any) -> None:
        self.lines.append(line)


def _summary(met: dict[str, int]) -> list[str]:
    stash = pytest.Stash()
    stash[CONFLICTS] = met
    terminal = _Terminal()
    pytest_terminal_summary(terminal, SimpleNamespace(stash=stash))  # type: ignore[arg-type]
    return terminal.lines


def test_the_409_line_says_what_they_are_and_that_they_are_expected() -> None:
    lines = _summary({"test_reboot": 12, "test_storm": 40, "test_quiet": 0, "test_reset": 3})
    assert lines == ["busy cluster (GPUREMEDIATE_SIM_BUSY): the controller's Node writes met 55 409 Conflicts "
                     "(another writer changed the Node first; it read the Node again and decided again: expected, "
                     "not a failure) in 3 of 4 scenarios; most: test_storm 40, test_reboot 12, test_reset 3"], lines


def test_no_line_when_no_scenario_ran() -> None:
    assert _summary({}) == []
