"""Command-line entry point: the only module that reads flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpuremediate import __version__


def _add_kube_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuremediate",
        description="Keeps the GPU nodes of a Kubernetes cluster healthy: detect, drain, repair, validate.",
    )
    parser.add_argument("--version", action="version", version=f"gpuremediate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("version", help="print the version")

    check = sub.add_parser("check", help="check this machine's GPUs with nvidia-smi")
    check.add_argument("--json", action="store_true", help="print JSON instead of a table")
    check.add_argument("--nvidia-smi", dest="nvidia_smi", help="path to nvidia-smi (default: found on PATH)")
    check.add_argument("--policy", help="TOML policy file (default: built-in policy)")
    check.add_argument(
        "--kernel-log",
        choices=("auto", "yes", "no"),
        default="auto",
        help="also read NVRM Xid lines from journalctl -k / dmesg (Linux; default: when readable)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "version":
        print(f"gpuremediate {__version__}")
        return 0
    if args.command == "check":
        from gpuremediate import check

        return check.main(args)
    parser.error(f"unknown command {args.command!r}")
    return 2  # unreachable: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
