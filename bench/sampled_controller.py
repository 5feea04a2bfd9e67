"""``python -m gpuremediate`` under a sampling profiler: where the controller's CPU goes, every thread (issue 29).

    BENCH_PROFILE_OUT=/tmp/profile.txt .venv/bin/python bench/sampled_controller.py run --kubeconfig ...

Every ``BENCH_PROFILE_INTERVAL_S`` (default 0.005 s) a thread looks at every other thread's stack
(``sys._current_frames``) and counts, for each thread that is running Python (not waiting on a lock, a socket or
a sleep), the innermost frame of this repository's code and the stack's frames of it. Every 20 s it writes the
counts, largest first, to ``BENCH_PROFILE_OUT``. A sample says where a thread was, not that it held the CPU:
threads waiting in C (a socket read, a lock) are counted as "waiting" and left out of the shares.

``BENCH_PROFILE_UNDER=fast_cycle`` (a function name of ours) adds, for the threads with that frame on their stack,
their stacks from it inward (waiting ones too, ending in the C call they wait in): where one path's time goes.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOP = 40
WAITING = frozenset({"wait", "acquire", "_wait_for_tstate_lock", "select", "poll", "readinto", "recv_into", "accept",
                     "sleep", "get", "join"})


def _ours(frame: FrameType | None) -> list[str]:
    names = []
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(str(ROOT)) and "/bench/" not in path:
            names.append(f"{os.path.relpath(path, ROOT)}:{frame.f_code.co_name}")
        frame = frame.f_back
    return names


def _path_under(frame: FrameType, under: str) -> str | None:
    """The stack from the frame named ``under`` inward (ours, then the innermost frame's name), or None."""
    ours = _ours(frame)
    names = [name.rsplit(":", 1)[1] for name in ours]
    if under not in names:
        return None
    chain = ours[:names.index(under) + 1][::-1]
    return " > ".join([*chain, f"[{frame.f_code.co_name}]"])


def sample(out: Path, interval_s: float, under: str = "") -> None:
    paths: collections.Counter[str] = collections.Counter()
    inner: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    samples = waiting = 0
    me = threading.get_ident()
    written = time.monotonic()
    while True:
        time.sleep(interval_s)
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            path = _path_under(frame, under) if under else None
            if path is not None:
                paths[path] += 1
            if frame.f_code.co_name in WAITING:
                waiting += 1
                continue
            stack = _ours(frame)
            samples += 1
            inner[stack[0] if stack else f"(outside: {frame.f_code.co_name})"] += 1
            within.update(set(stack))
        if time.monotonic() - written > (2.0 if under else 20.0):
            written = time.monotonic()
            lines = [f"{samples} running samples ({waiting} waiting) every {interval_s:g} s"]
            lines += ["-- innermost repository frame"] + [f"{n / samples:6.1%} {name}" for name, n in
                                                          inner.most_common(TOP)]
            lines += ["-- anywhere on the stack"] + [f"{n / samples:6.1%} {name}" for name, n in
                                                     within.most_common(TOP)]
            if under:
                total = sum(paths.values())
                lines += [f"-- under {under}: {total} samples, waiting included"] + [
                    f"{n:6d} {path}" for path, n in paths.most_common(TOP)]
            tmp = out.with_suffix(".tmp")
            tmp.write_text("\n".join(lines) + "\n")
            tmp.replace(out)


def main() -> int:
    out = Path(os.environ.get("BENCH_PROFILE_OUT", "/tmp/gpuremediate-profile.txt"))
    interval = float(os.environ.get("BENCH_PROFILE_INTERVAL_S", "0.005"))
    under = os.environ.get("BENCH_PROFILE_UNDER", "")
    threading.Thread(target=sample, args=(out, interval, under), name="profile-sampler", daemon=True).start()
    from gpuremediate.cli import main as cli_main
    from gpuremediate.shutdown import Shutdown
    return cli_main(sys.argv[1:], shutdown=Shutdown().install())


if __name__ == "__main__":
    raise SystemExit(main())
