"""The alerts people get (manifests/monitoring/prometheusrule.yaml): every one links its runbook, an absolute URL
into the project's docs whose anchor exists in docs/troubleshooting.md; node-level ones name their nodes; they ship
as a plain rules file too (manifests/monitoring/rules/gpuremediate-alerts.rules.yml, generated from the
PrometheusRule: the same rules); the promtool unit tests shipped beside them (manifests/monitoring/tests/*.yaml)
cover every alert, and `promtool check rules` / `promtool test rules` pass on the shipped files, where promtool is
installed (Debian's prometheus package; .ci/run installs it)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from manifests_support import MANIFESTS, PROMTOOL_TESTS, ROOT, known_series, named, series_in

from gpuremediate.kube.miniyaml import load
from gpuremediate.obs import alert_rules

TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
PROMETHEUS_RULE = MANIFESTS / "monitoring" / "prometheusrule.yaml"
RULES_FILE = MANIFESTS / "monitoring" / "rules" / "gpuremediate-alerts.rules.yml"  # the PrometheusRule's spec
PROMTOOL = shutil.which("promtool")
# Alerts about nodes: their text names the nodes (from gpuremediate_node_state / _node_health_unknown).
NODE_ALERTS = ("GpuremediateNodeQuarantined", "GpuremediateNodeStuckDraining", "GpuremediateNodeStuckRepairing",
               "GpuremediateNodeStuckValidating", "GpuremediateGpuHealthUnknown", "GpuremediateBudgetExhausted")


def _alerts() -> list[dict[str, Any]]:
    rule = named("PrometheusRule", "gpuremediate")
    return [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def test_github_anchors_are_made_as_github_makes_them() -> None:
    assert github_anchors("## A node is stuck in `validating` with `BLOCKED gpu-pods`\n## 403 Forbidden in the logs\n"
                          "### A node's record does not fit: its annotations are full\n") == {
        "a-node-is-stuck-in-validating-with-blocked-gpu-pods", "403-forbidden-in-the-logs",
        "a-nodes-record-does-not-fit-its-annotations-are-full"}


def project_home() -> str:
    """The project's home as it names it (setup.cfg's ``url``): where its docs are read."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    return config["metadata"]["url"].rstrip("/")


def test_every_alert_links_a_runbook_section_that_exists_at_an_absolute_url() -> None:
    """Alertmanager and Grafana open runbook_url as it is: an absolute https URL into the project's docs (its
    home, setup.cfg), whose fragment is a section of docs/troubleshooting.md."""
    anchors = github_anchors(TROUBLESHOOTING.read_text(encoding="utf-8"))
    page = f"{project_home()}/blob/main/docs/troubleshooting.md"
    alerts = _alerts()
    assert len(alerts) >= 16
    for alert in alerts:
        url = urlsplit(alert["annotations"].get("runbook_url", ""))
        assert url.scheme == "https" and url.netloc, f"{alert['alert']}: runbook_url {url.geturl()!r} is not absolute"
        assert url.geturl().split("#")[0] == page and url.fragment, f"{alert['alert']}: {url.geturl()!r} not {page}"
        assert url.fragment in anchors, f"{alert['alert']}: docs/troubleshooting.md has no section #{url.fragment}"


def test_the_promtool_tests_expect_the_rules_runbook_urls() -> None:
    """promtool compares annotations exactly: its files expect each alert's own runbook_url (checked here too,
    where promtool is not installed)."""
    urls = {a["alert"]: a["annotations"]["runbook_url"] for a in _alerts()}
    for path in _test_files():
        for case in load(path.read_text(encoding="utf-8"))["tests"]:
            for test in case.get("alert_rule_test", []):
                for fired in test.get("exp_alerts") or []:
                    expected = fired.get("exp_annotations", {}).get("runbook_url")
                    assert expected in (None, urls[test["alertname"]]), f"{path.name}: {test['alertname']}"


def test_node_level_alerts_name_their_nodes_from_series_the_controller_exports() -> None:
    by_name = {a["alert"]: a for a in _alerts()}
    for name in NODE_ALERTS:
        text = " ".join(by_name[name]["annotations"].values())
        assert "$s.Labels.node" in text and "query " in text, f"{name} does not name its nodes: {text}"
        used = series_in(text)
        assert used & {"gpuremediate_node_state", "gpuremediate_node_health_unknown"}, name
        assert used <= known_series(), f"{name}: unknown metrics {used - known_series()}"


def _test_files() -> list[Path]:
    return sorted(PROMTOOL_TESTS.glob("*.yaml"))


def test_the_promtool_tests_cover_every_alert() -> None:
    tested: set[str] = set()
    for path in _test_files():
        spec = load(path.read_text(encoding="utf-8"))
        assert spec["rule_files"] == ["../rules/gpuremediate-alerts.rules.yml"], path  # the shipped file
        assert (path.parent / spec["rule_files"][0]).resolve() == RULES_FILE
        for case in spec["tests"]:
            tested |= {t["alertname"] for t in case.get("alert_rule_test", [])
                       if t.get("exp_alerts")}  # a case where it fires, not only where it stays quiet
    missing = {a["alert"] for a in _alerts()} - tested
    assert not missing, f"no promtool test sees these alerts fire: {sorted(missing)}"


def test_the_plain_rules_file_is_the_prometheus_rules_spec() -> None:
    """One source: the shipped rules file is the generator's output from the PrometheusRule, the same rules."""
    regenerate = f"python -m gpuremediate.obs.alert_rules {PROMETHEUS_RULE.relative_to(ROOT)} > " \
                 f"{RULES_FILE.relative_to(ROOT)}"
    generated = alert_rules.rules_file(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert RULES_FILE.read_text(encoding="utf-8") == generated, f"regenerate: {regenerate}"
    assert load(RULES_FILE.read_text(encoding="utf-8")) == named("PrometheusRule", "gpuremediate")["spec"]


def test_the_generator_refuses_what_is_not_a_prometheus_rule() -> None:
    with pytest.raises(ValueError, match="one top-level `spec:`"):
        alert_rules.rules_file("apiVersion: v1\nkind: ConfigMap\ndata: {}\n")
    with pytest.raises(ValueError, match="last key"):
        alert_rules.rules_file("kind: PrometheusRule\nspec:\n  groups: []\nmetadata:\n  name: x\n")


@pytest.mark.skipif(PROMTOOL is None,
                    reason="promtool not installed (Debian's prometheus package: apt-get install -y prometheus)")
def test_promtool_checks_the_shipped_rules_and_passes_their_unit_tests() -> None:
    """On the files as shipped, from the repository's root: promtool resolves each test file's rule_files from
    that file's folder."""
    assert PROMTOOL is not None
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES_FILE.relative_to(ROOT))], cwd=ROOT,
                             capture_output=True, text=True, timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout, checked.stdout
    tests = [str(p.relative_to(ROOT)) for p in _test_files()]
    tested = subprocess.run([PROMTOOL, "test", "rules", *tests], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.count("SUCCESS") == len(_test_files()), tested.stdout


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install -y prometheus)")
def test_promtool_refuses_the_prometheus_rule_itself() -> None:
    """Why the plain file ships: promtool (and a Prometheus configured by file) cannot read the Operator's CR."""
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(PROMETHEUS_RULE)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode != 0


def test_the_rule_file_is_what_the_kustomization_ships() -> None:
    spec = load((MANIFESTS / "monitoring" / "kustomization.yaml").read_text(encoding="utf-8"))
    assert "prometheusrule.yaml" in spec["resources"]
    assert not any(r.startswith("tests") for r in spec["resources"])  # promtool's files are not resources
