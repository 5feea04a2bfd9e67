"""The controller's clock (gpuremediate.clock) and the API server's time (kube.server_time): a step of the
machine's clock moves no timeout; the clock takes the server's time when the loops start."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from gpuremediate.clock import SteadyClock
from gpuremediate.kube.server_time import ServerTime


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def said() -> Iterator[Said]:
    """What gpuremediate.clock logs (its own handler: another test's logging setup may stop propagation)."""
    handler, logger = Said(), logging.getLogger("gpuremediate.clock")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


class Machine:
    """A wall clock that NTP steps and a monotonic clock that never does."""

    def __init__(self) -> None:
        self.mono = 100.0
        self.step = 0.0

    def wall(self) -> float:
        return 1_800_000_000.0 + self.mono + self.step

    def monotonic(self) -> float:
        return self.mono


def test_a_step_of_the_machine_s_clock_moves_no_duration(said: Said) -> None:
    machine = Machine()
    offsets: list[float] = []
    clock = SteadyClock(wall=machine.wall, monotonic=machine.monotonic, on_offset=offsets.append)
    started = clock()
    machine.mono += 10.0
    machine.step = 3600.0  # NTP steps the clock an hour ahead
    assert clock() - started == pytest.approx(10.0)
    machine.mono += 5.0
    machine.step = -3600.0  # and back, past where it was
    assert clock() - started == pytest.approx(15.0)
    assert offsets == [pytest.approx(3600.0), pytest.approx(-3600.0)]  # each step said once
    assert sum("stepped by +3600.0 s" in line for line in said.lines) == 1
    assert clock.offset_from_wall() == pytest.approx(-3600.0)


def test_small_wobbles_of_the_wall_clock_are_not_steps() -> None:
    machine = Machine()
    offsets: list[float] = []
    clock = SteadyClock(wall=machine.wall, monotonic=machine.monotonic, on_offset=offsets.append)
    for wobble in (0.5, -0.7, 1.9, 0.0):
        machine.step = wobble
        clock()
    assert offsets == []


def test_the_clock_takes_the_server_s_time_once_and_keeps_it(said: Said) -> None:
    machine = Machine()
    offsets: list[float] = []
    clock = SteadyClock(wall=machine.wall, monotonic=machine.monotonic, on_offset=offsets.append)
    server_epoch = machine.wall() + 120.0  # this machine runs two minutes behind the API server
    clock.anchor(server_epoch - machine.monotonic())
    assert clock() == pytest.approx(server_epoch) and clock.anchored == "server"
    assert offsets == [pytest.approx(-120.0)] and any("-120.0 s off the API server's" in line for line in said.lines)
    clock.anchor(server_epoch + 500 - machine.monotonic())  # once only: a later estimate moves nothing
    assert clock() == pytest.approx(server_epoch)


def test_without_a_server_date_the_machine_s_clock_is_kept() -> None:
    machine = Machine()
    clock = SteadyClock(wall=machine.wall, monotonic=machine.monotonic)
    clock.anchor(None)
    assert clock() == pytest.approx(machine.wall()) and clock.anchored == ""


def test_the_server_s_time_is_the_largest_lower_bound_of_its_dates() -> None:
    mono = [50.0]
    server = ServerTime(monotonic=lambda: mono[0])
    assert server.offset() is None
    # The server's clock is at epoch 1_800_000_000.7 when our monotonic clock reads 50.0.
    for delay, at in ((0.0, 1_800_000_000.7), (0.45, 1_800_000_001.15), (0.05, 1_800_000_002.01)):
        mono[0] = at - 1_800_000_000.7 + 50.0 + delay  # read ``delay`` after the server stamped it
        stamp = int(at)
        server.note(_http_date(stamp))
    server.note("not a date")
    server.note(None)
    assert server.samples == 3
    offset = server.offset()
    assert offset is not None and 1_800_000_000.7 - 50.0 - 0.1 <= offset <= 1_800_000_000.7 - 50.0


def _http_date(epoch: int) -> str:
    from email.utils import formatdate
    return formatdate(epoch, usegmt=True)
