"""``gpuremediate replay``: what would gpuremediate have done to this fleet over this time range?

Wiring (gpuremediate/cli.py): ``replay_cli.add_parser(sub)`` in ``build_parser`` and
``if args.command == "replay": return replay_cli.main(args)`` in ``_dispatch``.
``python -m gpuremediate.replay ARGS`` runs the same command on its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuremediate.actions.replaced import Entry
from gpuremediate.actions.replaced import HistoryError as ReplacedHistoryError
from gpuremediate.kube.errors import KubeError
from gpuremediate.policy.config import PolicyError, PolicyFile, default_policy, load_policy
from gpuremediate.replay.cluster import Durations
from gpuremediate.replay.engine import ReplayError, ReplayOptions, network_counters, replay, uses_degradation
from gpuremediate.replay.history import (
    History,
    HistoryError,
    load_conditions,
    load_pods,
    load_scrapes,
    parse_time,
)
from gpuremediate.replay.html import render_html
from gpuremediate.replay.prometheus import DEGRADATION_METRICS, PrometheusHistory
from gpuremediate.replay.replaced import FILE_IN_SCRAPES, in_range, load_replaced
from gpuremediate.replay.result import ReplayResult
from gpuremediate.replay.text import render_compare, render_json, render_text
from gpuremediate.signals.sources import POLICY_METRICS

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def duration_arg(text: str) -> float:
    """``30s``, ``10m``, ``2h``, ``1d`` or plain seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration like 30s, 10m, 2h, 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_argument_group("history (one of)")
    source.add_argument("--prometheus", metavar="URL", help="Prometheus server holding the dcgm-exporter series")
    source.add_argument("--scrapes", metavar="DIR", help="folder of saved scrapes (<node>/<ts>.prom, <ts>.prom)")
    p.add_argument("--pods", metavar="FILE", help="failed pods for the workload signal ([workload]) and failed "
                   "preflights ([preflight]): one Pod a line (.jsonl) or a PodList"
                   " (kubectl get pods -A --field-selector status.phase=Failed -o json); "
                   "--scrapes DIR reads DIR/pods.jsonl or DIR/pods.json by itself")
    p.add_argument("--conditions", metavar="FILE", help="Node conditions over time (the agent's GPUNetworkHealthy: "
                   "NIC findings), one {time, node, type, status, reason, message} a line; --scrapes DIR reads "
                   "DIR/conditions.jsonl by itself")
    p.add_argument("--from", dest="start", metavar="TIME", help="start: unix seconds or RFC 3339 "
                   "(required with --prometheus; default for --scrapes: the oldest scrape)")
    p.add_argument("--to", dest="end", metavar="TIME", help="end (required with --prometheus; default for "
                   "--scrapes: the newest scrape)")
    p.add_argument("--step", type=duration_arg, default=30.0, help="the controller's scrape interval (default 30s)")
    p.add_argument("--chunk", type=duration_arg, default=3600.0,
                   help="time per Prometheus range query (default 1h; at most 10000 steps)")
    p.add_argument("--prometheus-token-file", default="", help="bearer token for Prometheus")
    p.add_argument("--prometheus-ca-file", default="", help="CA bundle for an https Prometheus")
    p.add_argument("--node-label", default=None, help="series label naming the node (default: Hostname, "
                   "hostname, node, kubernetes_node)")
    p.add_argument("--replaced", metavar="FILE", help="the controller's replaced nodes: `kubectl -n "
                   "gpuremediate-system get cm gpuremediate-replaced -o json` (--scrapes DIR reads DIR/replaced.json "
                   "by itself; --kubeconfig reads the ConfigMap)")
    p.add_argument("--namespace", default="gpuremediate-system", help="the controller's namespace, where "
                   "--kubeconfig reads ConfigMap gpuremediate-replaced (default gpuremediate-system)")
    p.add_argument("--policy", help="TOML policy file (default: the built-in policy)")
    p.add_argument("--compare", metavar="POLICY2", help="replay a second policy on the same history, side by side")
    nodes = p.add_argument_group("the cluster's Nodes (labels, groups, GPU capacity; optional)")
    nodes.add_argument("--nodes", metavar="FILE", help="output of `kubectl get nodes -o json`")
    nodes.add_argument("--kubeconfig", help="read the Node list from this cluster")
    nodes.add_argument("--context", help="kubeconfig context")
    times = p.add_argument_group("simulated durations")
    times.add_argument("--drain-time", type=duration_arg, default=600.0, help="a node's drain (default 10m)")
    times.add_argument("--reset-time", type=duration_arg, default=300.0, help="a reset-gpu repair (default 5m)")
    times.add_argument("--reboot-time", type=duration_arg, default=900.0, help="a reboot repair (default 15m)")
    times.add_argument("--validate-time", type=duration_arg, default=600.0, help="a validation (default 10m)")
    out = p.add_argument_group("output")
    out.add_argument("--format", choices=("text", "json"), default="text", help="what goes to stdout")
    out.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with the timeline")
    out.add_argument("--json", dest="json_out", metavar="FILE", help="also write the JSON result to FILE")
    p.add_argument("--verbose", action="store_true", help="show the controller loops' own log lines")


def add_parser(subparsers: Any) -> None:
    """Add the ``replay`` subcommand to ``gpuremediate``'s subparsers."""
    add_arguments(subparsers.add_parser(
        "replay", help="what gpuremediate would have done to this fleet over a past time range"))


def thermal_thresholds(policies: Sequence[PolicyFile]) -> list[float]:
    """Every temperature threshold of the policies (their defaults and node groups)."""
    found: set[float] = set()
    for policy in policies:
        for p in (policy.defaults, *(g.policy for g in policy.groups)):
            t = p.thermal
            found.update((t.gpu_cordon_c, t.gpu_clear_c, t.memory_cordon_c, t.memory_clear_c))
    return sorted(found)


def history_metrics(policies: Sequence[PolicyFile]) -> tuple[str, ...]:
    """The series a Prometheus history asks for: the policy's, and the degradation detector's where a policy
    enables ``[degradation]`` (clocks move every scrape: such a history keeps a change point per scrape)."""
    if any(uses_degradation(p) for p in policies):
        return (*POLICY_METRICS, *DEGRADATION_METRICS)
    return POLICY_METRICS


def history_network_counters(policies: Sequence[PolicyFile]) -> tuple[str, ...] | None:
    """node_exporter's counters a history reads: those a node group with ``[network] prometheus`` judges (the
    union over the policies); None when none has it (a Prometheus history then asks for no NIC series)."""
    found = [c for policy in policies if (c := network_counters(policy)) is not None]
    return tuple(sorted({name for counters in found for name in counters})) if found else None


def load_history(args: argparse.Namespace, policies: Sequence[PolicyFile] = ()) -> History:
    if bool(args.prometheus) == bool(args.scrapes):
        raise HistoryError("give the history as exactly one of --prometheus URL or --scrapes DIR")
    start = parse_time(args.start, "--from") if args.start else None
    end = parse_time(args.end, "--to") if args.end else None
    if args.scrapes:
        history = load_scrapes(args.scrapes, start=start, end=end, node_label=args.node_label,
                               network_counters=history_network_counters(policies))
    elif start is None or end is None:
        raise HistoryError("--prometheus needs --from and --to")
    else:
        token = Path(args.prometheus_token_file).read_text().strip() if args.prometheus_token_file else None
        source = PrometheusHistory(args.prometheus, token=token, ca_file=args.prometheus_ca_file or None,
                                   node_label=args.node_label, metrics=history_metrics(policies),
                                   network_counters=history_network_counters(policies))
        history = source.load(start, end, args.step, args.chunk, thermal_thresholds(policies))
    if getattr(args, "pods", None):
        history.add_pods(load_pods(args.pods))
    if getattr(args, "conditions", None):
        history.add_conditions(load_conditions(args.conditions))
    return history


def load_node_list(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    if args.nodes and args.kubeconfig:
        raise HistoryError("give the Node list as one of --nodes FILE or --kubeconfig, not both")
    if args.nodes:
        try:
            doc = json.loads(Path(args.nodes).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise HistoryError(f"--nodes {args.nodes}: not a readable JSON file: {exc}") from None
        items = doc.get("items") if isinstance(doc, dict) and "items" in doc else [doc]
        if not isinstance(items, list) or not all(isinstance(i, dict) and i.get("kind", "Node") == "Node"
                                                  for i in items):
            raise HistoryError(f"--nodes {args.nodes}: expected `kubectl get nodes -o json` output (a NodeList)")
        return items
    if args.kubeconfig:
        from gpuremediate.kube.client import KubeClient
        from gpuremediate.kube.config import load_config
        from gpuremediate.kube.resources import NODES

        return list(KubeClient(load_config(args.kubeconfig, args.context)).list(NODES)["items"])
    return None


def _policy(path: str | None) -> PolicyFile:
    return load_policy(path) if path else default_policy()


def run(args: argparse.Namespace) -> list[ReplayResult]:
    policies = [_policy(args.policy)] + ([_policy(args.compare)] if args.compare else [])
    history = load_history(args, policies)
    node_list = load_node_list(args)
    durations = Durations(drain_s=args.drain_time, reset_gpu_s=args.reset_time, reboot_s=args.reboot_time,
                          validate_s=args.validate_time)
    options = ReplayOptions(step_s=args.step, durations=durations)
    entries = load_replaced_history(args)
    results = [replay(history, p, node_list, options) for p in policies]
    for result in results:
        result.replaced = in_range(entries, result.start, result.end)
    return results


def load_replaced_history(args: argparse.Namespace) -> list[Entry]:
    """--replaced FILE, else --scrapes DIR/replaced.json, else the ConfigMap through --kubeconfig (none: [])."""
    try:
        if getattr(args, "replaced", None):
            return load_replaced(args.replaced)
        if args.scrapes and (Path(args.scrapes) / FILE_IN_SCRAPES).is_file():
            return load_replaced(str(Path(args.scrapes) / FILE_IN_SCRAPES))
    except ValueError as exc:
        raise HistoryError(f"--replaced {exc}") from None
    if args.kubeconfig:
        from gpuremediate.actions.replaced import ReplacedHistory
        from gpuremediate.kube.client import KubeClient
        from gpuremediate.kube.config import load_config

        client = KubeClient(load_config(args.kubeconfig, args.context))
        return ReplacedHistory(client, getattr(args, "namespace", "gpuremediate-system")).entries()
    return []


def main(args: argparse.Namespace) -> int:
    logger = logging.getLogger("gpuremediate")
    level = logger.level
    if not args.verbose:
        logger.setLevel(logging.CRITICAL)  # the loops narrate every step
    try:
        results = run(args)
    except (HistoryError, ReplacedHistoryError, ReplayError, PolicyError, KubeError, OSError) as exc:
        print(f"gpuremediate replay: {exc}", file=sys.stderr)
        return 2
    finally:
        logger.setLevel(level)  # a caller in the same process (a test, a notebook) keeps its logging
    if args.format == "json":
        sys.stdout.write(render_json(results))
    else:
        sys.stdout.write(render_text(results[0]) if len(results) == 1 else render_compare(results))
    if args.json_out:
        Path(args.json_out).write_text(render_json(results), encoding="utf-8")
    if args.html:
        Path(args.html).write_text(render_html(results), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def entry(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuremediate replay", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return main(parser.parse_args(argv))
