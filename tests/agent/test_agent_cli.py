"""`gpuremediate agent` flags, and `python -m gpuremediate.agent` as a process against the emulator."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuremediate.agent import cli
from gpuremediate.config import SettingsError
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NODES
from gpuremediate.policy import conditions as c
from sim.kubeapi import KubeAPIServer
from sim.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    return parser.parse_args(["agent", *argv])


def test_add_parser_registers_the_agent_command_with_its_defaults() -> None:
    args = parse("--node-name", "n1")
    settings = cli.settings_from_args(args)
    assert args.command == "agent"
    assert (settings.node_name, settings.interval_s, settings.smi_timeout_s, settings.window_s,
            settings.heartbeat_s, settings.hang_after, settings.expected_gpus) == ("n1", 30.0, 20.0, 300.0, 300.0, 2,
                                                                                   None)


def test_the_boot_id_file_is_a_flag_for_gpu_sim_hosts() -> None:
    assert cli.settings_from_args(parse("--node-name", "n1")).boot_id_path == "/proc/sys/kernel/random/boot_id"
    settings = cli.settings_from_args(parse("--node-name", "n1", "--boot-id", "/var/run/gpu-sim/boot_id"))
    assert settings.boot_id_path == "/var/run/gpu-sim/boot_id"


@pytest.mark.parametrize(("argv", "error"), [
    (("--hang-after", "0"), "--hang-after: must be at least 1"),
    (("--expected-gpus", "-1"), "--expected-gpus: must not be negative"),
    (("--interval", "soon"), "--interval"),
])
def test_bad_flags_name_the_flag(argv: tuple[str, ...], error: str) -> None:
    with pytest.raises(SettingsError, match=error):
        cli.settings_from_args(parse("--node-name", "n1", *argv))


def test_a_bad_policy_file_is_exit_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text("[thermal]\ngpu_cordon_c = 'hot'\n")
    assert cli.main(parse("--node-name", "n1", "--policy", str(bad))) == 2
    assert "thermal.gpu_cordon_c" in capsys.readouterr().err


def _fakes_module() -> object:
    spec = importlib.util.spec_from_file_location("nvsmi_fakes_cli", ROOT / "tests/fixtures/nvidia-smi/fakes.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_agent_process_publishes_and_stops_on_sigterm(tmp_path: Path) -> None:
    fakes = _fakes_module()
    smi = fakes.install_nvidia_smi(tmp_path / "bin")  # type: ignore[attr-defined]
    capture = fakes.CAPTURES / "linux-x86_64__nvidia-h200__590.48.01.txt"  # type: ignore[attr-defined]
    now_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000  # /dev/kmsg's clock: the XID is a fresh one
    (tmp_path / "kmsg").write_text(f"6,0,1,-;Linux version 6.8.0\n4,1,{now_us},-;NVRM: Xid (PCI:0000:83:00): 79, "
                                   "pid=1, name=x, GPU has fallen off the bus.\n")
    server = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=server.url, token_source=StaticToken(server.admin_token)))
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"},
                          "status": {"capacity": {"nvidia.com/gpu": "1"}}})
    env = {**os.environ, "FAKE_SMI_CAPTURE": str(capture), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuremediate.agent", "--kubeconfig", server.write_kubeconfig(tmp_path / "kc"),
         "--node-name", "gpu-node-1", "--nvidia-smi", str(smi), "--kmsg", str(tmp_path / "kmsg"),
         "--state-file", str(tmp_path / "state.json"), "--metrics-addr", "127.0.0.1:0", "--log-level", "warning"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def healthy_condition() -> dict[str, str] | None:
            conds = (client.get(NODES, "gpu-node-1").get("status") or {}).get("conditions") or []
            return next((x for x in conds if x["type"] == c.GPU_HEALTHY), None)

        wait_for(lambda: healthy_condition() is not None, timeout=60, describe="the agent's GPUHealthy condition")
        found = healthy_condition()
        assert found is not None and found["status"] == "False" and "XID 79" in found["message"]
        assert (tmp_path / "state.json").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        client.close()
        server.stop()
    assert proc.returncode == 0, out
