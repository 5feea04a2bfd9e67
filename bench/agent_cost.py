"""What one `gpuremediate agent` process costs (issue 12): CPU and RSS over a minute.

    .venv/bin/python bench/agent_cost.py                     # default 30 s interval, 60 s measured
    .venv/bin/python bench/agent_cost.py --interval 5s --xid-rate 1 --seconds 60

The agent runs as its own process (``python -m gpuremediate.agent``) against the API emulator (in this
process), a fake nvidia-smi replaying a real H200 capture and a kernel-log file (``--kmsg``) that gets
``--xid-rate`` NVRM Xid lines per second. Measured from /proc after a warm-up: the agent's own CPU
(utime+stime), its children's (the fake nvidia-smi is a Python script, so this part is NOT what the
real nvidia-smi costs), VmRSS at the end and VmHWM (peak).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuremediate.kube.client import KubeClient  # noqa: E402
from gpuremediate.kube.config import ClusterConfig, StaticToken  # noqa: E402
from gpuremediate.kube.resources import NODES  # noqa: E402
from sim.kubeapi import KubeAPIServer  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
XID = "NVRM: Xid (PCI:0000:83:00): 13, pid=99, name=python3, Graphics Exception"


def fakes() -> object:
    spec = importlib.util.spec_from_file_location("fakes", ROOT / "tests/fixtures/nvidia-smi/fakes.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_s(pid: int) -> tuple[float, float]:
    """(own utime+stime, waited-for children's cutime+cstime) in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / TICKS
    children = (int(fields[13]) + int(fields[14])) / TICKS
    return own, children


def mem_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", default="30s")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--xid-rate", type=float, default=0.0, help="kernel-log Xid lines per second")
    ap.add_argument("--sysfs", default="", help="the agent's --sysfs (bench/nic_cost.py: a simulated NIC tree)")
    opts = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="agent-cost-"))
    helpers = fakes()
    smi = helpers.install_nvidia_smi(tmp / "bin")  # type: ignore[attr-defined]
    capture = helpers.CAPTURES / "linux-x86_64__nvidia-h200__590.48.01.txt"  # type: ignore[attr-defined]
    kmsg = tmp / "kmsg"
    kmsg.write_text("6,0,1,-;Linux version 6.8.0\n")
    server = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=server.url, token_source=StaticToken(server.admin_token)))
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"},
                          "status": {"capacity": {"nvidia.com/gpu": "1"}}})
    kubeconfig = server.write_kubeconfig(tmp / "kubeconfig")
    env = {**os.environ, "FAKE_SMI_CAPTURE": str(capture), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "gpuremediate.agent", "--kubeconfig", kubeconfig, "--node-name", "gpu-node-1",
            "--nvidia-smi", str(smi), "--kmsg", str(kmsg), "--state-file", str(tmp / "state.json"),
            "--interval", opts.interval, "--metrics-addr", "127.0.0.1:0", "--log-level", "warning",
            *(["--sysfs", opts.sysfs] if opts.sysfs else [])]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT)
    seq = 1
    try:
        time.sleep(opts.warmup)
        own0, child0 = cpu_s(proc.pid)
        start = time.monotonic()
        while time.monotonic() - start < opts.seconds:
            if opts.xid_rate > 0:
                with kmsg.open("a") as fh:
                    fh.write(f"4,{seq},{seq * 1000},-;{XID}\n")
                seq += 1
                time.sleep(1.0 / opts.xid_rate)
            else:
                time.sleep(1.0)
        elapsed = time.monotonic() - start
        own1, child1 = cpu_s(proc.pid)
        rss, hwm = mem_kib(proc.pid, "VmRSS"), mem_kib(proc.pid, "VmHWM")
        conditions = [c["type"] for c in (client.get(NODES, "gpu-node-1").get("status") or {}).get("conditions", [])]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        client.close()
        server.stop()
    print(f"interval {opts.interval}, {elapsed:.0f} s measured, {seq - 1} Xid lines written")
    print(f"agent CPU: {own1 - own0:.2f} s ({100 * (own1 - own0) / elapsed:.2f} % of one core)")
    print(f"children CPU (fake nvidia-smi, a Python script; not the real tool's cost): {child1 - child0:.2f} s")
    print(f"agent RSS: {rss / 1024:.1f} MiB now, {hwm / 1024:.1f} MiB peak")
    print(f"conditions on the node: {', '.join(conditions)}; agent exit code after SIGTERM: {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
