"""Command-line entry point: the only module that reads flags."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from collections.abc import Sequence

from gpuremediate import __version__, fleet
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP, PAUSE_ANNOTATION, RESET_ANNOTATION, BreakerStore
from gpuremediate.config import (
    MAX_INTERVAL_S,
    MAX_LEASE_S,
    MAX_SCRAPE_TIMEOUT_S,
    SOURCES,
    Settings,
    SettingsError,
    parse_addr,
    parse_duration,
)
from gpuremediate.fleet import FleetError
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, load_config
from gpuremediate.kube.errors import KubeError
from gpuremediate.kube.shards import shard_status_lines
from gpuremediate.obs.log import setup_logging
from gpuremediate.policy.config import PolicyError, PolicyFile, default_policy, load_policy
from gpuremediate.policy.safety import Pause
from gpuremediate.shutdown import Shutdown


def _add_kube_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")


def _add_namespace_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "gpuremediate-system"),
                   help="the controller's namespace, where ConfigMap gpuremediate-breaker lives")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    _add_kube_flags(p)
    p.add_argument("--policy", help="TOML policy file (default: the built-in policy)")
    p.add_argument("--dry-run", action="store_true", help="decide and report everything, mutate nothing")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "gpuremediate-system"),
                   help="the controller's namespace: leader Lease, breaker state (default: $POD_NAMESPACE)")
    p.add_argument("--jobs-namespace", default="gpuremediate-jobs", help="where repair/validation Jobs run")
    p.add_argument("--metrics-addr", default=":8080", help="[HOST]:PORT for /metrics /healthz /readyz")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.add_argument("--leader-elect", action="store_true", help="run leader election on a Lease (for >1 replica)")
    p.add_argument("--lease-name", default="gpuremediate")
    p.add_argument("--leader-elect-lease-duration", default="15s",
                   help="how long others wait after the leader's last renewal before taking over")
    p.add_argument("--leader-elect-renew-deadline", default="10s",
                   help="the leader stops writing when its last renewal is this old")
    p.add_argument("--leader-elect-retry-period", default="2s", help="how often the lease is renewed or tried")
    p.add_argument("--identity", default="",
                   help="this replica's name in the Leases (default: $POD_NAME, else the host name)")
    p.add_argument("--shards", type=int, default=1,
                   help="split the GPU nodes into this many shards, one Lease gpuremediate-shard-<i> each; every "
                        "replica acts on the shards it holds (default 1: one leader, with --leader-elect)")
    p.add_argument("--source", choices=SOURCES, default="exporter", help="where GPU health comes from")
    p.add_argument("--exporter-namespace", default="gpu-operator")
    p.add_argument("--exporter-selector", default="app=nvidia-dcgm-exporter")
    p.add_argument("--exporter-port", type=int, default=9400)
    p.add_argument("--exporter-path", default="/metrics")
    p.add_argument("--scrape-timeout", default="5s")
    p.add_argument("--prometheus-url", default="")
    p.add_argument("--prometheus-token-file", default="")
    p.add_argument("--prometheus-ca-file", default="")
    p.add_argument("--prometheus-node-label", default="Hostname")
    p.add_argument("--prometheus-query-timeout", default="",
                   help="how long one Prometheus query may take (default: 10s + 4ms per GPU node)")
    p.add_argument("--prometheus-max-bytes", type=int, default=64 * 1024 * 1024,
                   help="the largest Prometheus answer read, after gzip (default 64 MiB)")
    p.add_argument("--prometheus-fault-poll", default="1s",
                   help="how often new faults are asked for between reads (one small query; off: never)")
    p.add_argument("--scrape-interval", default="15s", help="how often GPU health is read")
    p.add_argument("--resync", default="10s", help="how often every in-flight node is reconciled again")
    p.add_argument("--gpu-node-selector", default="",
                   help="label selector for GPU nodes (default: nodes with nvidia.com/gpu or nvidia.com/mig-* "
                        "capacity, or the label nvidia.com/gpu.present=true)")
    p.add_argument("--maintenance-group", default="gpuremediate.io",
                   help="API group of MaintenanceRequest (nvsentinel.dgxc.nvidia.com for NVSentinel's)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    host, port = parse_addr(args.metrics_addr)
    return Settings(
        kubeconfig=args.kubeconfig,
        context=args.context,
        policy_path=args.policy,
        dry_run=args.dry_run,
        namespace=args.namespace,
        jobs_namespace=args.jobs_namespace,
        metrics_host=host,
        metrics_port=port,
        log_format=args.log_format,
        log_level=args.log_level,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_duration_s=parse_duration(args.leader_elect_lease_duration, "--leader-elect-lease-duration",
                                        MAX_LEASE_S),
        renew_deadline_s=parse_duration(args.leader_elect_renew_deadline, "--leader-elect-renew-deadline",
                                        MAX_LEASE_S),
        retry_period_s=parse_duration(args.leader_elect_retry_period, "--leader-elect-retry-period", MAX_LEASE_S),
        shards=args.shards,
        identity=args.identity,
        source=args.source,
        exporter_namespace=args.exporter_namespace,
        exporter_selector=args.exporter_selector,
        exporter_port=args.exporter_port,
        exporter_path=args.exporter_path,
        scrape_timeout_s=parse_duration(args.scrape_timeout, "--scrape-timeout", MAX_SCRAPE_TIMEOUT_S),
        prometheus_url=args.prometheus_url,
        prometheus_token_file=args.prometheus_token_file,
        prometheus_ca_file=args.prometheus_ca_file,
        prometheus_node_label=args.prometheus_node_label,
        prometheus_query_timeout_s=(parse_duration(args.prometheus_query_timeout, "--prometheus-query-timeout",
                                                   MAX_SCRAPE_TIMEOUT_S) if args.prometheus_query_timeout else 0.0),
        prometheus_max_bytes=args.prometheus_max_bytes,
        prometheus_fault_poll_s=(0.0 if args.prometheus_fault_poll == "off" else
                                 parse_duration(args.prometheus_fault_poll, "--prometheus-fault-poll", MAX_INTERVAL_S)),
        scrape_interval_s=parse_duration(args.scrape_interval, "--scrape-interval", MAX_INTERVAL_S),
        resync_s=parse_duration(args.resync, "--resync", MAX_INTERVAL_S),
        gpu_node_selector=args.gpu_node_selector,
        maintenance_group=args.maintenance_group,
    ).validate()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuremediate",
        description="Keeps the GPU nodes of a Kubernetes cluster healthy: detect, drain, repair, validate.",
    )
    parser.add_argument("--version", action="version", version=f"gpuremediate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("version", help="print the version")

    _add_run_flags(sub.add_parser("run", help="run the controller (in-cluster, or with --kubeconfig)"))

    status = sub.add_parser("status", help="a table of the GPU nodes: state, since, fault, action, blocked")
    _add_kube_flags(status)
    status.add_argument("--json", action="store_true")
    _add_namespace_flag(status)

    explain = sub.add_parser("explain", help="why a node is where it is: its record and history in words")
    _add_kube_flags(explain)
    explain.add_argument("node")
    explain.add_argument("--policy", help="the controller's policy file (to count the pods a drain skips, and show "
                                                   "the escalation ladder's rung and attempts)")

    release = sub.add_parser("release", help="a person clears a quarantined node: it goes back through validation")
    _add_kube_flags(release)
    release.add_argument("node")
    release.add_argument("--by", default="", help="who releases it (default: the local user)")

    breaker = sub.add_parser("breaker", help="the circuit breaker")
    _add_kube_flags(breaker)
    breaker.add_argument("action", choices=("status", "reset"))
    _add_namespace_flag(breaker)

    pause = sub.add_parser("pause", help="start no new work anywhere until `gpuremediate resume`")
    _add_kube_flags(pause)
    _add_namespace_flag(pause)
    pause.add_argument("--reason", required=True, help="why (shown in status, explain and the node's blocked)")
    pause.add_argument("--by", default="", help="who pauses (default: the local user)")

    resume = sub.add_parser("resume", help="undo `gpuremediate pause`: new work starts again")
    _add_kube_flags(resume)
    _add_namespace_flag(resume)

    demo = sub.add_parser("demo", help="the embedded default: a simulated GPU cluster healing itself")
    demo.add_argument("--nodes", type=int, default=6)
    demo.add_argument("--speed", type=float, default=1.0, help="> 1 runs the timeline faster")
    demo.add_argument("--no-color", action="store_true")

    from gpuremediate import check
    from gpuremediate.agent import cli as agent_cli
    from gpuremediate.replay import cli as replay_cli

    check.add_arguments(sub.add_parser("check", help="check this machine's GPUs with nvidia-smi"))
    agent_cli.add_parser(sub)
    replay_cli.add_parser(sub)
    plugin = sub.add_parser("plugin", help="run a reference plugin (NVSentinel plugin contracts)")
    plugins = plugin.add_subparsers(dest="plugin", metavar="PLUGIN", required=True)
    from gpuremediate.plugins import drain_window

    drain_window.add_arguments(plugins.add_parser("drain-window", help="drain DrainRequests in a maintenance window"))
    return parser


def main(argv: Sequence[str] | None = None, shutdown: Shutdown | None = None) -> int:
    """``shutdown``: a SIGTERM handler installed already (``__main__`` does it before the imports)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "version":
        print(f"gpuremediate {__version__}")
        return 0
    try:
        return _dispatch(parser, args, shutdown)
    except (SettingsError, PolicyError, FleetError, KubeError) as exc:
        print(f"gpuremediate {args.command}: {exc}", file=sys.stderr)
        return 2


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace, shutdown: Shutdown | None) -> int:
    if args.command == "check":
        from gpuremediate import check

        return check.main(args)
    if args.command == "agent":
        from gpuremediate.agent import cli as agent_cli

        return agent_cli.main(args, shutdown)
    if args.command == "replay":
        from gpuremediate.replay import cli as replay_cli

        return replay_cli.main(args)
    if args.command == "run":
        return _run(args, shutdown or Shutdown().install())
    if args.command == "plugin":
        from gpuremediate.plugins import drain_window

        return drain_window.main(args, shutdown)
    if args.command == "demo":
        try:
            from gpuremediate import demo
        except ModuleNotFoundError as exc:
            print(f"gpuremediate demo: needs the simulators (package 'sim') beside the package: run it from a source "
                  f"checkout with `make demo` ({exc})", file=sys.stderr)
            return 3

        return demo.main(nodes=args.nodes, speed=args.speed, color=not args.no_color and sys.stdout.isatty())
    client = KubeClient(load_config(args.kubeconfig, args.context))
    if args.command == "status":
        rows = fleet.status_rows(client)
        if args.json:
            print(json.dumps([r.as_dict() for r in rows], indent=2))
        else:
            print(fleet.render_status(rows, header_lines=_safety_lines(client, args.namespace)), end="")
        return 0
    if args.command == "explain":
        policy = load_policy(args.policy) if args.policy else None
        print(fleet.explain_node(client, args.node, policy), end="")
        return 0
    if args.command in ("pause", "resume"):
        return _pause(client, args)
    if args.command == "release":
        record = fleet.release(client, args.node, args.by or getpass.getuser())
        print(f"{args.node}: {record.state} ({record.message}); validation decides whether it returns to service")
        return 0
    if args.command == "breaker":
        return _breaker(client, args)
    parser.error(f"unknown command {args.command!r}")
    return 2  # unreachable: parser.error exits


def prepare_run(args: argparse.Namespace) -> tuple[Settings, PolicyFile, ClusterConfig]:
    """Everything ``run`` reads and checks before it starts: flags, the policy file, the kubeconfig.
    A bad one raises SettingsError, PolicyError or KubeError naming it (main: one line, exit 2)."""
    settings = settings_from_args(args)
    policy = load_policy(settings.policy_path) if settings.policy_path else default_policy()
    return settings, policy, load_config(settings.kubeconfig, settings.context)


def _run(args: argparse.Namespace, shutdown: Shutdown) -> int:
    from gpuremediate.controller import Controller

    settings, policy, config = prepare_run(args)
    setup_logging(settings.log_format, settings.log_level)
    controller = Controller(settings, policy, client=KubeClient(config, qps=settings.qps, burst=settings.burst))
    return 0 if shutdown.requested else controller.run(shutdown)


def _breaker(client: KubeClient, args: argparse.Namespace) -> int:
    store = BreakerStore(client, args.namespace, read_only=args.action == "status")  # status writes nothing
    breaker = store.reset() if args.action == "reset" else store.load()
    state = "open" if breaker.is_open else "closed"
    detail = breaker.reason if breaker.is_open else (f"reset by {breaker.reset_by}" if breaker.reset_by else "")
    print(f"circuit breaker: {state}" + (f" ({detail})" if detail else ""))
    for trip in breaker.domains:
        print(f"domain breaker open for {trip.label}={trip.value}: {trip.reason}")
    if store.reset_requested is not None:
        print(f"reset requested (annotation {RESET_ANNOTATION}={store.reset_requested}): the controller applies it")
    return 0


def _pause(client: KubeClient, args: argparse.Namespace) -> int:
    store = BreakerStore(client, args.namespace)
    if args.command == "pause":
        pause = store.set_pause(Pause(paused=True, by=args.by or getpass.getuser(), reason=args.reason,
                                      at=time.time()))
    else:
        pause = store.set_pause(Pause())
    if pause.paused:
        print(f"paused by {pause.by}: {pause.reason}" + ("" if args.command == "pause" else
              f" (the annotation {PAUSE_ANNOTATION} on ConfigMap {BREAKER_CONFIGMAP} still pauses: remove it)"))
    else:
        print("resumed: new work starts again")
    return 0


def _safety_lines(client: KubeClient, namespace: str) -> list[str]:
    """The pause and breaker lines for status; a reader without access to the ConfigMap gets a line saying so."""
    store = BreakerStore(client, namespace, read_only=True)  # a reset annotation is the controller's to apply
    try:
        breaker = store.load()
    except KubeError as exc:
        lines = [f"pause and breaker unknown: ConfigMap {namespace}/{BREAKER_CONFIGMAP} unreadable ({exc})"]
    else:
        lines = fleet.safety_lines(store.latest_pause(), breaker)
    return lines + shard_status_lines(client, namespace, time.time())


if __name__ == "__main__":
    sys.exit(main())
