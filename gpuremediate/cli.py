"""Command-line entry point: the only module that reads flags."""

from __future__ import annotations

import argparse
import faulthandler
import getpass
import io
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from gpuremediate import __version__, fleet, structured
from gpuremediate.actions.breaker import BREAKER_CONFIGMAP, PAUSE_ANNOTATION, RESET_ANNOTATION, BreakerStore
from gpuremediate.actions.dry_run_journal import Journal, read_journal
from gpuremediate.actions.replaced import HistoryError
from gpuremediate.config import (
    MAX_INTERVAL_S,
    MAX_LEASE_S,
    MAX_SCRAPE_TIMEOUT_S,
    PROMETHEUS_READ_INTERVAL_S,
    SCRAPE_INTERVAL_S,
    SOURCES,
    Settings,
    SettingsError,
    parse_addr,
    parse_duration,
)
from gpuremediate.fleet import FleetError
from gpuremediate.kube import miniyaml
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, load_config
from gpuremediate.kube.errors import Forbidden, KubeError
from gpuremediate.kube.handover import SHARD_HASHES
from gpuremediate.kube.shards import list_shard_leases, shard_status_lines
from gpuremediate.malloc_arenas import limit_malloc_arenas
from gpuremediate.obs.log import add_log_flags, setup_logging
from gpuremediate.policy.config import PolicyError, PolicyFile, default_policy, load_policy
from gpuremediate.policy.safety import CircuitBreaker, Pause
from gpuremediate.shutdown import Shutdown
from gpuremediate.signals.fabric import CLIQUE_LABEL

EXIT_ERROR = 2  # a usage error (argparse's code), a bad setting, an API error; check has its own (64)
OUTPUTS = ("table", "wide", "json", "yaml")  # status and explain -o (explain's table is its text)
# The commands people run against the cluster: a refusal (403) names the verb and the object, and this says which
# shipped role grants them (manifests/base/rbac-people.yaml).
PEOPLE_COMMANDS = ("status", "explain", "breaker", "pause", "resume", "release")
FORBIDDEN_HINT = ("  (this user may not do it: role gpuremediate-viewer grants status, explain and breaker status; "
                  "gpuremediate-operator also release, pause, resume and breaker reset; docs/operate.md, "
                  "\"Roles for people\")")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default, as with argparse's ArgumentDefaultsHelpFormatter, except where
    the help says it in words already (``default: $POD_NAMESPACE, else ...``) or there is none to say (a
    switch, a flag that is unset by default). Descriptions and epilogs are printed as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == ""
        if (not action.option_strings or "default" in text.lower() or unset or action.default is argparse.SUPPRESS
                or action.nargs == 0):
            return text
        return text + " (default: %(default)s)"


class CliParser(argparse.ArgumentParser):
    """argparse with the exit code of a usage error chosen per command (``usage_exit``); its subcommands'
    parsers are CliParsers too, and every one shows the defaults in its help (``HelpFormatter``).
    ``commands``: the subcommands' parsers by name (``build_parser`` fills it)."""

    def __init__(self, *args: Any, usage_exit: int = EXIT_ERROR, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.usage_exit = usage_exit
        self.commands: Mapping[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_exit, f"{self.prog}: error: {message}\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse's, but arguments nobody knows are the command's usage error (argparse reports them
        from the top parser, with its exit code: ``check --bogus`` exited 2, check's "needs repair")."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            owner = self.commands.get(getattr(parsed, "command", None) or "", self)
            owner.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def _add_kube_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")


def _add_namespace_flag(p: argparse.ArgumentParser) -> None:
    """``-n/--namespace``: the controller's namespace, the same flag on every command that has one."""
    p.add_argument("-n", "--namespace", default=os.environ.get("POD_NAMESPACE", "gpuremediate-system"),
                   help="the controller's namespace: its Leases, ConfigMaps gpuremediate-breaker and "
                        "gpuremediate-dry-run, the notifications Secret (default: $POD_NAMESPACE, else "
                        "gpuremediate-system)")


def _add_output_flags(p: argparse.ArgumentParser, what: str, choices: Sequence[str] = OUTPUTS) -> None:
    """``-o table|wide|json|yaml`` and ``--json`` (the same as ``-o json``, kept for scripts)."""
    wide = "; wide adds the node's GPUs, the record's reason and who holds a wait" if "wide" in choices else ""
    p.add_argument("-o", "--output", choices=choices, default="table",
                   help=f"{what}{wide}; json and yaml print one object ({structured.API_VERSION}, its kind and "
                        "fields in docs/output.md)")
    p.add_argument("--json", dest="output", action="store_const", const="json", default=argparse.SUPPRESS,
                   help="the same as -o json (kept for scripts)")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    _add_kube_flags(p)
    p.add_argument("--policy", help="TOML policy file (default: the built-in policy)")
    p.add_argument("--dry-run", action="store_true", help="decide and report everything, mutate nothing")
    _add_namespace_flag(p)
    p.add_argument("--jobs-namespace", default="gpuremediate-jobs", help="where repair/validation Jobs run")
    p.add_argument("--metrics-addr", default=":8080", help="[HOST]:PORT for /metrics /healthz /readyz")
    add_log_flags(p)
    p.add_argument("--leader-elect", action="store_true", help="run leader election on a Lease (for >1 replica)")
    p.add_argument("--lease-name", default="gpuremediate", help="the leader Lease's name (in --namespace)")
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
    p.add_argument("--shard-hash", choices=SHARD_HASHES, default=SHARD_HASHES[0],
                   help="how a node's name picks its shard: sha256 (the default), or hashmod, as Prometheus' hashmod "
                        "relabelling of the node name mod --shards (for --prometheus-shard-label; a change of hash "
                        "hands over as a change of --shards does)")
    p.add_argument("--source", choices=SOURCES, default="exporter", help="where GPU health comes from")
    p.add_argument("--exporter-namespace", default="gpu-operator", help="where the dcgm-exporter pods run")
    p.add_argument("--exporter-selector", default="app=nvidia-dcgm-exporter",
                   help="label selector of the dcgm-exporter pods")
    p.add_argument("--exporter-port", type=int, default=9400, help="the exporter pods' metrics port")
    p.add_argument("--exporter-path", default="/metrics", help="the exporter pods' metrics path")
    p.add_argument("--scrape-timeout", default="5s", help="the longest one node's scrape may take")
    p.add_argument("--prometheus-url", default="", help="the Prometheus to read GPU health from (--source=prometheus)")
    p.add_argument("--prometheus-token-file", default="", help="file holding a bearer token for Prometheus")
    p.add_argument("--prometheus-ca-file", default="", help="CA bundle for an https Prometheus")
    p.add_argument("--prometheus-node-label", default="Hostname",
                   help="the dcgm-exporter series' label naming the node")
    p.add_argument("--prometheus-query-timeout", default="",
                   help="how long one Prometheus query may take (default: 10s + 4ms per GPU node, counted by the "
                        "Node informer from the first read on: 30s at 5,000 nodes)")
    p.add_argument("--prometheus-max-bytes", type=int, default=0,
                   help="the largest Prometheus answer read, after gzip (default: 64 MiB plus 8 KiB per GPU node, "
                        "counted as for the query timeout: 103 MiB at 5,000 nodes; a fixed 64 MiB read nothing past "
                        "about 25,000)")
    p.add_argument("--prometheus-fault-poll", default="1s",
                   help="how often new faults are asked for between reads (default 1s; one small query, never two "
                        "at once; a slow answer spaces the next by 20 times its length, a failure doubles the "
                        "spacing up to --scrape-interval; off: never)")
    p.add_argument("--prometheus-shard-label", default="",
                   help="with --shards and --shard-hash=hashmod: the label a hashmod relabelling of the node name "
                        "gives every GPU series (docs/sizing.md); each replica asks Prometheus for its own shards' "
                        "series only (default: every replica reads the fleet's answers)")
    p.add_argument("--scrape-interval", default="",
                   help="how often GPU health is read in full (default 15s; with --source=prometheus 60s: its fault "
                        "poll finds faults between reads, and a full read costs Prometheus a read of every GPU's "
                        "temperatures)")
    p.add_argument("--resync", default="10s", help="how often every in-flight node is reconciled again")
    p.add_argument("--gpu-node-selector", default="",
                   help="label selector for GPU nodes (default: nodes with nvidia.com/gpu or nvidia.com/mig-* "
                        "capacity, or the label nvidia.com/gpu.present=true)")
    p.add_argument("--kube-api-qps", type=float, default=Settings.qps,
                   help="requests a second to the API server, on average (client-side, as client-go's QPS; the "
                        "server's API Priority and Fairness answers 429 with Retry-After past its own share; a "
                        "cordon is about 3 requests, so this paces a mass failure: 20 cordoned 6 nodes a second)")
    p.add_argument("--kube-api-burst", type=int, default=Settings.burst,
                   help="requests sent at once before --kube-api-qps paces them (a burst of cordons)")
    p.add_argument("--loop-workers", type=int, default=Settings.loop_workers,
                   help="nodes each loop (drain, repair, validate, quarantine) steps at once; a node is never "
                        "stepped by two at once, and drain admissions (the budget) are decided one at a time")
    p.add_argument("--maintenance-group", default="gpuremediate.io",
                   help="API group of MaintenanceRequest (nvsentinel.dgxc.nvidia.com for NVSentinel's)")
    p.add_argument("--preflight-webhook-port", type=int, default=0,
                   help="serve the preflight admission webhook over HTTPS on this port (0: off; docs/preflight.md)")
    p.add_argument("--preflight-webhook-cert-dir", default="/var/run/gpuremediate/webhook-tls",
                   help="tls.crt and tls.key of the webhook (a mounted Secret; a rotated one is read again)")
    p.add_argument("--preflight-image", default="",
                   help="the image of the preflight init container (the controller's own)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    host, port = parse_addr(args.metrics_addr)
    return Settings(
        preflight_webhook_port=args.preflight_webhook_port,
        preflight_webhook_cert_dir=args.preflight_webhook_cert_dir,
        preflight_image=args.preflight_image,
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
        shard_hash=args.shard_hash,
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
        prometheus_shard_label=args.prometheus_shard_label,
        prometheus_fault_poll_s=(0.0 if args.prometheus_fault_poll == "off" else
                                 parse_duration(args.prometheus_fault_poll, "--prometheus-fault-poll", MAX_INTERVAL_S)),
        scrape_interval_s=(parse_duration(args.scrape_interval, "--scrape-interval", MAX_INTERVAL_S)
                           if args.scrape_interval else
                           PROMETHEUS_READ_INTERVAL_S if args.source == "prometheus" else SCRAPE_INTERVAL_S),
        resync_s=parse_duration(args.resync, "--resync", MAX_INTERVAL_S),
        loop_workers=args.loop_workers,
        gpu_node_selector=args.gpu_node_selector,
        maintenance_group=args.maintenance_group,
        qps=args.kube_api_qps,
        burst=args.kube_api_burst,
    ).validate()


HELP_EPILOG = f"""\
exit codes: 0 done; {EXIT_ERROR} a usage error (an unknown flag, a missing or bad value), a bad setting, policy
file or kubeconfig, a refused request or an API error, in one line on stderr. `check` has its own: 0-3 its
verdict, 64 a usage error (see `gpuremediate check --help`). A reader that stops early (`| head`) cuts the
output quietly, with no traceback, and the exit code stays the command's own (check's verdict included).
"""


def build_parser(prog: str = "gpuremediate") -> CliParser:
    """``prog``: the command's name in usage lines (``kubectl gpuremediate`` for the kubectl plugin)."""
    parser = CliParser(
        prog=prog,
        description="Keeps the GPU nodes of a Kubernetes cluster healthy: detect, drain, repair, validate.",
        epilog=HELP_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"gpuremediate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = sub.choices

    sub.add_parser("version", help="print the version")

    _add_run_flags(sub.add_parser("run", help="run the controller (in-cluster, or with --kubeconfig)"))

    status = sub.add_parser("status", help="a table of the GPU nodes: state, since, fault, action, blocked")
    _add_kube_flags(status)
    _add_output_flags(status, "table: one line per GPU node")
    status.add_argument("--by", choices=("node", "domain"), default="node",
                        help="domain: group the nodes by NVLink domain (--domain-label), each group's count first")
    status.add_argument("--domain-label", default=CLIQUE_LABEL,
                        help=f"the node label naming a node's NVLink domain (default {CLIQUE_LABEL})")
    _add_namespace_flag(status)

    explain = sub.add_parser("explain", help="why a node is where it is: its record and history in words")
    _add_kube_flags(explain)
    explain.add_argument("node", help="the Node's name")
    explain.add_argument("--policy", help="the controller's policy file (to count the pods a drain skips, and show "
                                                   "the escalation ladder's rung and attempts)")
    _add_output_flags(explain, "table: the record in words")
    _add_namespace_flag(explain)

    release = sub.add_parser("release", help="a person clears a quarantined node: it goes back through validation")
    _add_kube_flags(release)
    release.add_argument("node", help="the quarantined Node's name")
    release.add_argument("--by", default="", help="who releases it (default: the local user)")

    breaker = sub.add_parser("breaker", help="the circuit breaker")
    _add_kube_flags(breaker)
    breaker.add_argument("action", choices=("status", "reset"),
                         help="status: open or closed, and why; reset: close it (new work starts again)")
    _add_output_flags(breaker, "table: the breaker in words", choices=("table", "json", "yaml"))
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
    demo.add_argument("--nodes", type=int, default=6, help="simulated GPU nodes (at least 6: the timeline faults five)")
    demo.add_argument("--speed", type=float, default=1.0, help="> 1 runs the timeline faster")
    demo.add_argument("--no-color", action="store_true", help="no colours (also when stdout is not a terminal)")
    demo.add_argument("--keep", action="store_true",
                      help="a sandbox: after the timeline the cluster and the controller keep running over TLS until "
                           "Ctrl-C, with a kubeconfig for kubectl and this CLI (`make sandbox`)")
    demo.add_argument("--kubeconfig-out", metavar="FILE", default=None,
                      help="where --keep writes the sandbox's kubeconfig (default: gpuremediate-sandbox.kubeconfig "
                           "in the temp directory)")

    from gpuremediate import check
    from gpuremediate.agent import cli as agent_cli
    from gpuremediate.replay import cli as replay_cli

    check.add_arguments(sub.add_parser(
        "check", help="check this machine's GPUs with nvidia-smi", usage_exit=check.EXIT_USAGE,
        description="This machine's GPUs through nvidia-smi (and the kernel log), judged by the controller's policy.",
        epilog=check.EXIT_CODES_HELP))
    from gpuremediate import preflight

    preflight.add_arguments(sub.add_parser(
        "preflight", help="check the GPUs given to this pod before its job starts (the webhook's init container)",
        usage_exit=preflight.EXIT_USAGE,
        description="The pod's GPUs through nvidia-smi (judged as check does), dcgmi diag -r 1 and an operator's "
                    "command; a failure's one line goes to the termination log.",
        epilog=preflight.EXIT_CODES_HELP))
    agent_cli.add_parser(sub)
    replay_cli.add_parser(sub)
    plugin = sub.add_parser("plugin", help="run a reference plugin (NVSentinel plugin contracts)")
    plugins = plugin.add_subparsers(dest="plugin", metavar="PLUGIN", required=True)
    from gpuremediate.plugins import drain_window

    drain_window.add_arguments(plugins.add_parser("drain-window", help="drain DrainRequests in a maintenance window"))
    return parser


class ReaderMayLeave(io.TextIOWrapper):
    """The process's stdout while a command runs: once its reader has gone (``gpuremediate status --json | head``
    closed the pipe) the rest of the output is dropped without a word, no BrokenPipeError traceback, and the
    command goes on to its own exit code (check's verdict included). What is still buffered is written to
    /dev/null, put in place of the closed pipe (as Python's documentation of SIGPIPE advises)."""

    reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return super().write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                super().flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.fileno())
        finally:
            os.close(devnull)


@contextmanager
def _stdout_reader_may_leave() -> Iterator[None]:
    """sys.stdout as a ReaderMayLeave over the same buffer while the command runs (the process's own stdout
    only: a test's capture, or any other stream, is left as it is)."""
    original = sys.stdout
    if type(original) is not io.TextIOWrapper:
        yield
        return
    guarded = ReaderMayLeave(original.buffer, encoding=original.encoding, errors=original.errors,
                             line_buffering=original.line_buffering, write_through=original.write_through)
    sys.stdout = guarded
    try:
        yield
    finally:
        guarded.flush()
        sys.stdout = original
        guarded.detach()  # the buffer stays open: it is the original's too


def main(argv: Sequence[str] | None = None, shutdown: Shutdown | None = None, prog: str = "gpuremediate") -> int:
    """``shutdown``: a SIGTERM handler installed already (``__main__`` does it before the imports)."""
    with _stdout_reader_may_leave():
        return _main(argv, shutdown, prog)


KUBECTL_PLUGIN = "kubectl gpuremediate"


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl-gpuremediate`` entry point (setup.cfg): kubectl runs it for ``kubectl gpuremediate ARGS``,
    handing it the ARGS. The same CLI, every command, named as kubectl users typed it in usage lines."""
    return main(argv, prog=KUBECTL_PLUGIN)


def _main(argv: Sequence[str] | None, shutdown: Shutdown | None, prog: str = "gpuremediate") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_ERROR
    if args.command == "version":
        print(f"gpuremediate {__version__}")
        return 0
    try:
        return _dispatch(parser, args, shutdown)
    except (SettingsError, PolicyError, FleetError, KubeError) as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        if isinstance(exc, Forbidden) and args.command in PEOPLE_COMMANDS:
            print(FORBIDDEN_HINT, file=sys.stderr)
        return EXIT_ERROR


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace, shutdown: Shutdown | None) -> int:
    if args.command == "check":
        from gpuremediate import check

        return check.main(args)
    if args.command == "preflight":
        from gpuremediate import preflight

        return preflight.main(args)
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

        return demo.main(nodes=args.nodes, speed=args.speed, color=not args.no_color and sys.stdout.isatty(),
                         keep=args.keep, kubeconfig_out=args.kubeconfig_out or demo.SANDBOX_KUBECONFIG)
    client = KubeClient(load_config(args.kubeconfig, args.context))
    if args.command == "status":
        journal = _dry_run(client, args.namespace)
        rows = fleet.status_rows(client, journal, args.domain_label)
        if args.output in ("json", "yaml"):
            print(_structured(_status_object(client, args.namespace, journal, rows), args.output), end="")
        else:
            lines = ([fleet.dry_run_line(journal)] if journal is not None else []) + \
                _safety_lines(client, args.namespace, journal) + _replaced_lines(client, args.namespace)
            print(fleet.render_status(rows, header_lines=lines, wide=args.output == "wide",
                                      by_domain=args.by == "domain"), end="")
        return 0
    if args.command == "explain":
        policy = load_policy(args.policy) if args.policy else None
        journal = _dry_run(client, args.namespace)
        explained = fleet.explain_view(client, args.node, policy, journal, namespace=args.namespace)
        if args.output in ("json", "yaml"):
            print(_structured(explained.as_dict(), args.output), end="")
        else:
            print((explained.wide() if args.output == "wide" else explained.text)
                  + _look_line(client, args.namespace, args.node, journal), end="")
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


def _structured(value: Any, output: str) -> str:
    """``-o json`` (indented, as ``--json`` always printed) or ``-o yaml`` (miniyaml.dump: reads back the same)."""
    return miniyaml.dump(value) if output == "yaml" else json.dumps(value, indent=2) + "\n"


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
    # `kill -USR1 <pid>` writes every thread's stack to stderr: what a stuck controller waits on, without a debugger
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    limit_malloc_arenas()  # before any thread: its RSS follows what it holds, not the arenas (malloc_arenas.py)
    controller = Controller(settings, policy, client=KubeClient(config, qps=settings.qps, burst=settings.burst))
    return 0 if shutdown.requested else controller.run(shutdown)


def _dry_run(client: KubeClient, namespace: str) -> Journal | None:
    """The journal of a dry run that runs now (None: none, or it ended; unreadable: said, and None)."""
    try:
        journal = read_journal(client, namespace)
    except (KubeError, ValueError) as exc:
        if not isinstance(exc, Forbidden):
            print(f"dry-run journal unreadable: {exc}", file=sys.stderr)
        return None
    return journal if journal is not None and journal.live(time.time()) else None


def _breaker(client: KubeClient, args: argparse.Namespace) -> int:
    journal = _dry_run(client, args.namespace) if args.action == "status" else None
    output = getattr(args, "output", "table")
    if journal is not None:  # the dry run's own breaker: what it would have done
        breaker = CircuitBreaker.from_dict(journal.breaker) if journal.breaker else CircuitBreaker()
        if output in ("json", "yaml"):
            view = structured.breaker_view(breaker, dry_run=True)
            print(_structured(structured.frame(structured.KIND_BREAKER_STATUS, {"breaker": view}), output), end="")
            return 0
        state = "open" if breaker.is_open else "closed"
        print(f"circuit breaker (DRY RUN: what it would be): {state}" +
              (f" ({breaker.reason})" if breaker.is_open else ""))
        for trip in breaker.domains:
            print(f"domain breaker (DRY RUN) open for {trip.label}={trip.value}: {trip.reason}")
        if breaker.look is not None:
            print(f"storm look (DRY RUN): {breaker.look.describe(time.time())}")
            _print_look_nodes(breaker)
        return 0
    store = BreakerStore(client, args.namespace, read_only=args.action == "status")  # status writes nothing
    breaker = store.reset() if args.action == "reset" else store.load()
    if output in ("json", "yaml"):
        view = structured.breaker_view(breaker, reset_requested=store.reset_requested)
        print(_structured(structured.frame(structured.KIND_BREAKER_STATUS, {"breaker": view}), output), end="")
        return 0
    state = "open" if breaker.is_open else "closed"
    detail = breaker.reason if breaker.is_open else (f"reset by {breaker.reset_by}" if breaker.reset_by else "")
    print(f"circuit breaker: {state}" + (f" ({detail})" if detail else ""))
    for trip in breaker.domains:
        print(f"domain breaker open for {trip.label}={trip.value}: {trip.reason}")
    if breaker.look is not None:
        print(f"storm look: {breaker.look.describe(time.time())}")
        _print_look_nodes(breaker)
    if store.reset_requested is not None:
        print(f"reset requested (annotation {RESET_ANNOTATION}={store.reset_requested}): the controller applies it")
    return 0


def _look_line(client: KubeClient, namespace: str, node: str, journal: Journal | None) -> str:
    """For ``explain``: the breaker's storm look holds this node's new fault (nothing is written to the Node
    until the look ends, so its record does not say it); "" when none does or the breaker cannot be read."""
    try:
        breaker = BreakerStore(client, namespace, read_only=True).load()
    except KubeError:
        return ""
    if journal is not None and journal.breaker:
        breaker = CircuitBreaker.from_dict(journal.breaker)
    look = breaker.looking
    if look is None or not look.holds(node):
        return ""
    would = " (DRY RUN: would be)" if journal is not None else ""
    return (f"  Storm look{would}: its new fault is held until {_utc_text(look.until)} with "
            f"{len(look.nodes) - 1} other(s), to see whether the storm passes the breaker's threshold "
            f"({look.reason}); `gpuremediate breaker status`\n")


def _utc_text(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _print_look_nodes(breaker: CircuitBreaker, shown: int = 20) -> None:
    """The faults a look under way holds, by node (the first ``shown``)."""
    look = breaker.looking
    if look is None or not look.nodes:
        return
    more = f" and {len(look.nodes) - shown} more" if len(look.nodes) > shown else ""
    print(f"  held: {', '.join(look.nodes[:shown])}{more}")


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


def _status_object(client: KubeClient, namespace: str, journal: Journal | None,
                   rows: Sequence[fleet.StatusRow]) -> dict[str, Any]:
    """``status -o json|yaml``: the schema's FleetStatus (gpuremediate/structured.py). What the table's banner
    says (a dry run, a pause, the breaker, the source, the shards) is in ``fleet``; what cannot be read is
    null there and said in ``fleet.errors``."""
    errors: list[str] = []
    store = BreakerStore(client, namespace, read_only=True)
    paused = breaker = source = None
    try:
        real = store.load()
    except KubeError as exc:
        errors.append(f"pause and breaker unknown: ConfigMap {namespace}/{BREAKER_CONFIGMAP} unreadable ({exc})")
    else:
        paused, source = structured.pause_view(store.latest_pause()), structured.source_view(store.latest_source())
        if journal is not None and journal.breaker:
            breaker = structured.breaker_view(CircuitBreaker.from_dict(journal.breaker), dry_run=True)
        else:
            breaker = structured.breaker_view(real, reset_requested=store.reset_requested)
    shards: list[dict[str, Any]] = []
    try:
        leases = list_shard_leases(client, namespace)
    except Forbidden:
        leases = []  # as the table: whether the controller is sharded is not this reader's to see
    except KubeError as exc:
        leases = []
        errors.append(f"shards unknown: Leases in {namespace} unreadable ({exc})")
    now = time.time()
    for lease in leases:
        expired = lease.renewed_at is not None and now - lease.renewed_at > lease.duration_s
        shards.append({"index": lease.index, "holder": lease.holder or None,
                       "renewedAt": structured.rfc3339(lease.renewed_at), "expired": bool(lease.holder) and expired})
    replaced = None
    try:
        replaced = structured.replaced_view(fleet.read_replaced(client, namespace), now)
    except HistoryError as exc:
        errors.append(f"replaced nodes unknown: {exc}")
    return structured.fleet_status([r.as_dict() for r in rows], dry_run=structured.dry_run_view(journal),
                                   paused=paused, breaker=breaker, source=source, shards=shards, errors=errors,
                                   replaced=replaced)


def _replaced_lines(client: KubeClient, namespace: str) -> list[str]:
    """status's lines on the replaced nodes (none when none was); one saying so when the history is unreadable."""
    try:
        return fleet.replaced_lines(fleet.read_replaced(client, namespace))
    except HistoryError as exc:
        return [f"replaced nodes unknown: {exc}"]


def _safety_lines(client: KubeClient, namespace: str, journal: Journal | None = None) -> list[str]:
    """The pause and breaker lines for status; a reader without access to the ConfigMap gets a line saying so.
    In a dry run the breaker is the one the dry run would have (the real one is never written)."""
    store = BreakerStore(client, namespace, read_only=True)  # a reset annotation is the controller's to apply
    try:
        breaker = store.load()
    except KubeError as exc:
        lines = [f"pause and breaker unknown: ConfigMap {namespace}/{BREAKER_CONFIGMAP} unreadable ({exc})"]
    else:
        if journal is not None and journal.breaker:
            breaker = CircuitBreaker.from_dict(journal.breaker)
        lines = fleet.safety_lines(store.latest_pause(), breaker, source=store.latest_source())
        if journal is not None:
            lines = [line.replace("CIRCUIT BREAKER OPEN", "CIRCUIT BREAKER WOULD BE OPEN") for line in lines]
    return lines + shard_status_lines(client, namespace, time.time())


if __name__ == "__main__":
    sys.exit(main())
