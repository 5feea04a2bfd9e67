"""glibc's malloc arenas, limited for a long-running, many-threaded controller.

glibc gives threads that allocate at once arenas of their own, up to 8 per core, and each arena keeps what its
threads freed. The controller's threads (informers, loops, the source's read pool) each pass through large, short
lived allocations (a LIST page, a Prometheus answer), so a replica's RSS grows with the arenas, not with what it
holds: at 100,000 nodes, one replica of 20 held 291 MB at steady state and 336 MB at a read's peak with the default,
261 and 277 MB with 2 arenas, at the same CPU and read time (docs/sizing.md). The same as ``MALLOC_ARENA_MAX=2`` in
the environment, which is how Java and Python services commonly run in containers; a value set there wins.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

ARENAS = 2
M_ARENA_MAX = -8  # malloc.h: mallopt's parameter


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``arenas`` (call before threads start). False where the environment sets
    ``MALLOC_ARENA_MAX`` (glibc read it already) or the C library is not glibc (no ``mallopt``: musl, macOS)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: no process handle by None (Windows)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = mallopt(M_ARENA_MAX, arenas) == 1
    if not done:
        log.debug("mallopt(M_ARENA_MAX, %d) refused; malloc keeps its default arenas", arenas)
    return done
