"""`make demo` works: the embedded default walks every injected fault to its end state."""

import io
import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from gpuremediate import cli
from gpuremediate.demo import Demo
from gpuremediate.shutdown import Shutdown
from sim.waiting import wait_for


def test_demo_heals_the_fleet_and_quarantines_the_repeat_offender() -> None:
    out = io.StringIO()
    assert Demo(nodes=6, speed=2.0, color=False, out=out).run() == 0
    text = out.getvalue()
    status = text.split("$ gpuremediate status")[1].split("$ gpuremediate explain")[0]
    states = {line.split()[0]: line.split()[1] for line in status.splitlines() if line.startswith("gpu-node-")}
    assert states == {
        "gpu-node-1": "healthy", "gpu-node-2": "healthy", "gpu-node-3": "healthy",
        "gpu-node-4": "quarantined", "gpu-node-5": "healthy", "gpu-node-6": "healthy",
    }, text
    for expected in ("(xid-48)", "(thermal)", "(thermal-cleared)", "(repeat-offender)", "(condition)",
                     "GPUDriverResponsive=False", "reboot done", "reset-gpu done", "validation-passed"):
        assert expected in text, f"{expected!r} missing from the demo output:\n{text}"
    # gpu-node-1's XID 79 and gpu-node-2's ECC error reach both sources: whichever the controller sees first (the
    # agent's NodeCondition or the scrape) opens the fault, so either reason is right.
    both = (("gpu-node-1", "(xid-79)", "NeedsReboot"), ("gpu-node-2", "(ecc-dbe)", "NeedsResetGpu"))
    for node, metric, condition in both:
        draining = [line for line in text.splitlines() if f"{node}  draining" in line]
        assert any(metric in line or condition in line for line in draining), f"{node} never drained:\n{text}"
    assert "gpu-node-4: quarantined" in text and "gpuremediate release gpu-node-4" in text


def test_demo_keep_leaves_a_tls_sandbox_that_kubectl_and_the_cli_reach(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`gpuremediate demo --keep` (`make sandbox`): after the timeline the cluster runs on over https, with a
    kubeconfig (CA data + token) that kubectl and `gpuremediate status` use, until Ctrl-C."""
    kubeconfig = tmp_path / "sandbox.kubeconfig"
    out, stop = io.StringIO(), Shutdown()
    demo = Demo(nodes=4, speed=3.0, color=False, out=out, keep=True, kubeconfig_out=str(kubeconfig), stop=stop)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(demo.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: "Sandbox:" in out.getvalue(), timeout=240, describe="the sandbox's instructions",
                 seen=out.getvalue)
        text = out.getvalue()
        assert f"kubeconfig (its CA and an admin token): {kubeconfig}" in text and "(https://127.0.0.1:" in text
        for command in ("kubectl get nodes", "gpuremediate release gpu-node-4", "gpuremediate pause --reason",
                        "gpuremediate breaker reset", "gpu-sim inject --url http://"):
            assert command in text, command
        written = kubeconfig.read_text()
        assert "certificate-authority-data: " in written and "token: " in written and "server: https://" in written
        assert kubeconfig.stat().st_mode & 0o077 == 0  # an admin token: its owner's only
        capsys.readouterr()
        assert cli.main(["status", "--kubeconfig", str(kubeconfig), "-o", "json"]) == 0
        rows = {r["node"]: r["state"] for r in json.loads(capsys.readouterr().out)}
        assert set(rows) == {"gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"}
        if shutil.which("kubectl") is not None:  # kubectl refuses a bearer token over plain http: this is https
            done = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "get", "nodes"], capture_output=True,
                                  text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            listed = [line.split()[0] for line in done.stdout.splitlines()[1:]]
            assert listed == ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"], done.stdout
    finally:
        stop.request()  # Ctrl-C
        thread.join(60)
    assert result == [0] and out.getvalue().rstrip().endswith("sandbox stopped")
    assert not kubeconfig.exists()  # the cluster it named is gone
