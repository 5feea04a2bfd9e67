"""The controller caps glibc's malloc arenas before its threads start (gpuremediate/malloc_arenas.py): counted
from glibc's own ``malloc_stats`` in a fresh interpreter whose threads each allocate."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

THREADS_ALLOCATING = """
import ctypes, sys, threading
from gpuremediate.malloc_arenas import limit_malloc_arenas
print(limit_malloc_arenas() if sys.argv[1] == "limit" else None, flush=True)
together = threading.Barrier(8)  # all alive at once: no thread finds an arena an ended one left free
def work():
    blocks = [bytearray(4096) for _ in range(2000)]
    together.wait()
    del blocks
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL(None).malloc_stats()
"""


def _arenas(mode: str, env: dict[str, str]) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", THREADS_ALLOCATING, mode], capture_output=True, text=True,
                          timeout=60, env=env, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), len(re.findall(r"^Arena \d+:", done.stderr, re.M))


@pytest.fixture
def glibc_env() -> dict[str, str]:
    if not os.confstr("CS_GNU_LIBC_VERSION"):
        pytest.skip("not glibc: no malloc arenas to cap")
    return {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}


def test_the_cap_holds_threads_to_two_arenas(glibc_env: dict[str, str]) -> None:
    said, capped = _arenas("limit", glibc_env)
    assert said == "True"
    assert capped <= 2
    _, default = _arenas("default", glibc_env)
    assert default > 2, "glibc's default gave these threads no arenas of their own: the test shows nothing"


def test_a_value_in_the_environment_wins(glibc_env: dict[str, str]) -> None:
    said, arenas = _arenas("limit", {**glibc_env, "MALLOC_ARENA_MAX": "4"})
    assert said == "False"
    assert 2 < arenas <= 4
