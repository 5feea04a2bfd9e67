"""Record the canned Prometheus answers test_sources.py serves, from a real Prometheus.

    .venv/bin/python bench/record_prom_fixture.py   # writes tests/signals/data/prometheus-2.42/

The fleet is the one tests/signals/test_prometheus_real.py backfills (fresh-1 with an XID 79 on GPU 1,
old-1 whose samples stopped 200 s before the query), fixed in time so the files are reproducible.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import promlab  # noqa: E402
from gpuremediate.signals import sources  # noqa: E402

OUT = ROOT / "tests" / "signals" / "data" / "prometheus-2.42"
QUERIES = {
    "readings.json": sources.policy_query(),
    "freshness.json": sources.freshness_query(),
    "identity.json": sources.identity_query(),
    "error-400-parse.json": "sum(",
    "error-422-execution.json": 'timestamp({__name__=~"DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_XID_ERRORS"})',
}


def answer(url: str, query: str, at: float) -> tuple[int, bytes]:
    full = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(full, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def main() -> int:
    found = promlab.binaries()
    if found is None:
        print("prometheus/promtool not installed: apt-get install -y prometheus", file=sys.stderr)
        return 2
    prometheus, promtool = found
    at = float(int(time.time()) // 60 * 60)  # the query's evaluation time; the data ends just before it
    families = promlab.fleet_families({"fresh-1": (at - 300, at - 1), "old-1": (at - 500, at - 200)},
                                      gpus=2, xid={"fresh-1": (1, 79)})
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        promlab.backfill(promlab.openmetrics(families), work / "data", promtool)
        with promlab.PromServer(work, prometheus) as server:
            for name, query in QUERIES.items():
                code, body = answer(server.url, query, at)
                doc = json.loads(body)
                (OUT / name).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
                print(f"{name}: HTTP {code}, {len(body)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
