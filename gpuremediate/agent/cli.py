"""``gpuremediate agent`` flags and entry point (``add_parser`` for gpuremediate/cli.py; also
``python -m gpuremediate.agent``)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from typing import Any

from gpuremediate.agent.kmsg import BOOT_ID_PATH, KMSG_PATH
from gpuremediate.agent.network import DEFAULT_SYSFS
from gpuremediate.agent.publish import DEFAULT_HEARTBEAT_S
from gpuremediate.agent.run import DEFAULT_STATE_PATH, DEFAULT_WRITE_SPACING_S, Agent, AgentSettings
from gpuremediate.config import SettingsError, parse_addr, parse_duration
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import load_config
from gpuremediate.kube.errors import KubeError
from gpuremediate.obs.log import add_log_flags, setup_logging
from gpuremediate.obs.server import ObservabilityServer
from gpuremediate.policy.config import PolicyError, default_policy, load_policy
from gpuremediate.shutdown import Shutdown

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                   help="this node's name (default: $NODE_NAME from the downward API, else the hostname)")
    p.add_argument("--policy", help="TOML policy file, the controller's (default: the built-in policy)")
    p.add_argument("--nvidia-smi", help="path of nvidia-smi (default: on PATH)")
    p.add_argument("--interval", default="30s", help="how often the GPUs are checked")
    p.add_argument("--nvidia-smi-timeout", default="20s", help="nvidia-smi taking longer is a timeout")
    p.add_argument("--hang-after", type=int, default=2, help="timeouts in a row before the driver counts as hung")
    p.add_argument("--xid-window", default="5m", help="how long a kernel-log XID/SXID counts for health")
    p.add_argument("--heartbeat", default=f"{DEFAULT_HEARTBEAT_S:g}s",
                   help="conditions are rewritten at least this often (the controller ignores stale ones)")
    p.add_argument("--min-write-interval", default=f"{DEFAULT_WRITE_SPACING_S:g}s",
                   help="a kernel-log fault is written at once; what follows within this is coalesced into the "
                        "next write (a flood of Xid lines is one status write per interval)")
    p.add_argument("--expected-gpus", type=int, default=0,
                   help="GPUs the driver should report (default: the node's nvidia.com/gpu capacity; set it when "
                        "MIG or time-slicing makes the capacity differ from the physical count)")
    p.add_argument("--kmsg", default=KMSG_PATH, help="the kernel log device")
    p.add_argument("--state-file", default=DEFAULT_STATE_PATH, help="where the kernel-log resume point is kept")
    p.add_argument("--boot-id", default=BOOT_ID_PATH,
                   help="the file naming this boot (a new value: the kernel log starts again)")
    p.add_argument("--sysfs", default=DEFAULT_SYSFS,
                   help="where the node's sysfs is mounted (class/infiniband, class/net: the RDMA NICs, [network])")
    p.add_argument("--metrics-addr", default=":9500", help="[HOST]:PORT for /metrics /healthz /readyz")
    add_log_flags(p)


def add_parser(subparsers: argparse._SubParsersAction[Any]) -> None:
    add_arguments(subparsers.add_parser(
        "agent", help="node agent (DaemonSet): kernel-log XIDs/SXIDs, nvidia-smi, GPU count → NodeConditions"))


def settings_from_args(args: argparse.Namespace) -> AgentSettings:
    if args.hang_after < 1:
        raise SettingsError(f"--hang-after: must be at least 1, got {args.hang_after}")
    if args.expected_gpus < 0:
        raise SettingsError(f"--expected-gpus: must not be negative, got {args.expected_gpus}")
    return AgentSettings(
        node_name=args.node_name or socket.gethostname(),
        kmsg_path=args.kmsg,
        state_path=args.state_file,
        boot_id_path=args.boot_id,
        nvidia_smi=args.nvidia_smi,
        interval_s=parse_duration(args.interval, "--interval"),
        smi_timeout_s=parse_duration(args.nvidia_smi_timeout, "--nvidia-smi-timeout"),
        hang_after=args.hang_after,
        window_s=parse_duration(args.xid_window, "--xid-window"),
        heartbeat_s=parse_duration(args.heartbeat, "--heartbeat"),
        write_spacing_s=parse_duration(args.min_write_interval, "--min-write-interval"),
        expected_gpus=args.expected_gpus or None,
        sysfs_root=args.sysfs,
    )


def main(args: argparse.Namespace, shutdown: Shutdown | None = None) -> int:
    try:
        setup_logging(args.log_format, args.log_level)
        settings = settings_from_args(args)
        host, port = parse_addr(args.metrics_addr)
        policy = (load_policy(args.policy) if args.policy else default_policy()).for_node({})
        client = KubeClient(load_config(args.kubeconfig, args.context), qps=5.0, burst=10)
    except (SettingsError, PolicyError, KubeError) as exc:
        print(f"gpuremediate agent: {exc}", file=sys.stderr)
        return 2
    agent = Agent(settings, client, policy)
    server = ObservabilityServer(agent.metrics.registry, lambda: (agent.last_cycle > 0, "first cycle done"),
                                 host, port, alive=agent.alive).start()
    stop = threading.Event()
    worker = threading.Thread(target=agent.run, args=(stop,), name="agent", daemon=True)
    worker.start()
    log.info("agent started", extra={"node": settings.node_name, "metrics_port": server.port})
    shutdown = shutdown or Shutdown().install()
    while worker.is_alive() and not shutdown.wait(timeout=1.0):
        pass
    stop.set()
    worker.join(settings.smi_timeout_s + 5.0)
    server.stop()
    client.close()
    return 0

