"""The alerts as a plain Prometheus rules file, made from their one source, the PrometheusRule.

manifests/monitoring/prometheusrule.yaml is what the Prometheus Operator loads (and what people edit);
manifests/monitoring/rules/gpuremediate-alerts.rules.yml is its ``spec`` as a rules file, for a Prometheus
configured by file (``rule_files:``) and for ``promtool check rules`` / ``promtool test rules`` (the unit tests in
manifests/monitoring/tests name it). The spec is taken as text, dedented, comments and all, so the two read
alike; a test keeps the shipped file equal to this output and the two equal as YAML. Regenerate after an edit::

    python -m gpuremediate.obs.alert_rules manifests/monitoring/prometheusrule.yaml \\
        > manifests/monitoring/rules/gpuremediate-alerts.rules.yml
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

HEADER = """\
# gpuremediate's alerts, for a Prometheus configured by file (rule_files:). Generated from
# ../prometheusrule.yaml (the Prometheus Operator's form, the one to edit) by
# `python -m gpuremediate.obs.alert_rules manifests/monitoring/prometheusrule.yaml`: its spec, as it is.
# promtool unit tests: ../tests/*.yaml (`promtool test rules`, run from that folder).
"""


def rules_file(prometheus_rule: str) -> str:
    """The rules file of a PrometheusRule manifest's text: the header, then its ``spec:`` block dedented."""
    lines = prometheus_rule.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip() == "spec:"]
    if len(starts) != 1:
        raise ValueError("a PrometheusRule has one top-level `spec:` line")
    body = lines[starts[0] + 1:]
    outdented = [line for line in body if line.strip() and not line.startswith(" ")]
    if outdented:
        raise ValueError(f"spec: must be the manifest's last key, found {outdented[0].strip()!r} after it")
    spec = textwrap.dedent("".join(body))
    if not spec.startswith("groups:"):
        raise ValueError("a PrometheusRule's spec starts with `groups:`")
    return HEADER + spec


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuremediate.obs.alert_rules",
                                     description="print a PrometheusRule's spec as a Prometheus rules file")
    parser.add_argument("prometheus_rule", help="the PrometheusRule (manifests/monitoring/prometheusrule.yaml)")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(rules_file(Path(args.prometheus_rule).read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        print(f"alert_rules: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
