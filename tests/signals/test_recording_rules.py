"""The recording rules the Prometheus source reads (issue 21): the shipped files are the generator's output, and
``promtool check rules`` / ``promtool test rules`` (Debian's prometheus package; skipped, saying why, without it)
accept them and show they record what the policy reads. The alerts of prometheusrule.yaml are checked too."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from gpuremediate.kube import miniyaml
from gpuremediate.signals import recording, sources

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
RULES_FILE = MONITORING / "rules" / "gpuremediate-recording.rules.yml"
PROMETHEUS_RULE = MONITORING / "recording-rules.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install -y prometheus)")


def test_the_shipped_rules_are_the_generators_output() -> None:
    generate = "python -m gpuremediate.signals.recording"
    assert RULES_FILE.read_text(encoding="utf-8") == recording.rules_file(), f"regenerate: {generate} > {RULES_FILE}"
    assert PROMETHEUS_RULE.read_text(encoding="utf-8") == recording.prometheus_rule(), \
        f"regenerate: {generate} --prometheus-rule > {PROMETHEUS_RULE}"
    rule = miniyaml.load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    plain = miniyaml.load(RULES_FILE.read_text(encoding="utf-8"))
    assert rule["kind"] == "PrometheusRule" and rule["spec"] == plain
    assert "recording-rules.yaml" in miniyaml.load((MONITORING / "kustomization.yaml").read_text())["resources"]


def test_the_rules_carry_what_the_source_needs_to_find_them() -> None:
    (info,) = [r for r in recording.rules(("node", "Hostname")) if r[0] == sources.RULES_INFO]
    assert info[2] == {"version": sources.RULES_VERSION, "node_labels": "node,Hostname", "interval": "30s"}
    recorded = {labels.get(sources.NAME_LABEL) for record, _, labels in recording.rules()
                if record == sources.RECORDED_FAULTS}
    assert recorded == set(sources.FAULT_METRICS)  # every fault the policy reads; temperatures are read raw
    with pytest.raises(ValueError, match="interval"):
        recording.groups_yaml(interval="soon")


def _spec_file(tmp_path: Path, manifest: Path) -> Path:
    """A PrometheusRule's spec as a rules file (the Operator hands Prometheus exactly that)."""
    text = manifest.read_text(encoding="utf-8")
    spec = textwrap.dedent(text[text.index("\nspec:\n") + len("\nspec:\n"):])
    out = tmp_path / f"{manifest.stem}.rules.yml"
    out.write_text(spec, encoding="utf-8")
    return out


@needs_promtool
def test_promtool_checks_the_rules_file_and_both_prometheus_rules(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    files = [RULES_FILE, _spec_file(tmp_path, PROMETHEUS_RULE),
             _spec_file(tmp_path, MONITORING / "prometheusrule.yaml")]
    done = subprocess.run([PROMTOOL, "check", "rules", *map(str, files)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# Two nodes x 2 GPUs, 7 series per GPU as a real fleet sends them. n1: an XID 79 held in the value (an exporter
# before 3.3) on GPU 1 from minute 2, a DBE on GPU 0 from minute 3; n2: an XID 48 in labels (err_code, dcgm-
# exporter >= 3.3: a NEW series, the "No Error" one goes stale) on GPU 0 from minute 2, then its exporter stops
# at minute 5 (the raw series go stale: n2's recorded series go with them).
UNIT_TEST = """\
rule_files:
  - {rules}
evaluation_interval: 30s
tests:
  - interval: 1m
    input_series:
      - series: 'DCGM_FI_DEV_XID_ERRORS{{Hostname="n1", gpu="0", UUID="GPU-n1-0", instance="a", job="dcgm"}}'
        values: '0x6'
      - series: 'DCGM_FI_DEV_XID_ERRORS{{Hostname="n1", gpu="1", UUID="GPU-n1-1", instance="a", job="dcgm"}}'
        values: '0 0 79x4'
      - series: 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{Hostname="n1", gpu="0", UUID="GPU-n1-0", instance="a", job="dcgm"}}'
        values: '0 0 0 2x3'
      - series: 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{Hostname="n1", gpu="1", UUID="GPU-n1-1", instance="a", job="dcgm"}}'
        values: '0x6'
      - series: 'DCGM_FI_DEV_ROW_REMAP_FAILURE{{Hostname="n1", gpu="0", UUID="GPU-n1-0", instance="a", job="dcgm"}}'
        values: '0x6'
      - series: 'DCGM_FI_DEV_ROW_REMAP_PENDING{{Hostname="n1", gpu="0", UUID="GPU-n1-0", instance="a", job="dcgm"}}'
        values: '0x6'
      - series: 'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{Hostname="n1", gpu="0", UUID="GPU-n1-0", instance="a",
          job="dcgm"}}'
        values: '0x6'
      - series: 'DCGM_FI_DEV_GPU_TEMP{{Hostname="n1", gpu="0", UUID="GPU-n1-0", instance="a", job="dcgm"}}'
        values: '40x6'
      - series: 'DCGM_FI_DEV_GPU_TEMP{{Hostname="n1", gpu="1", UUID="GPU-n1-1", instance="a", job="dcgm"}}'
        values: '41x6'
      - series: 'DCGM_FI_DEV_XID_ERRORS{{Hostname="n2", gpu="0", UUID="GPU-n2-0", err_code="0", err_msg="No Error",
          instance="b", job="dcgm"}}'
        values: '0 0 stale'
      - series: 'DCGM_FI_DEV_XID_ERRORS{{Hostname="n2", gpu="0", UUID="GPU-n2-0", err_code="48",
          err_msg="DBE (Double Bit Error) ECC Error", instance="b", job="dcgm"}}'
        values: '_ _ 48 48 48 stale'
      - series: 'DCGM_FI_DEV_XID_ERRORS{{Hostname="n2", gpu="1", UUID="GPU-n2-1", err_code="0", err_msg="No Error",
          instance="b", job="dcgm"}}'
        values: '0 0 0 0 0 stale'
      - series: 'DCGM_FI_DEV_GPU_TEMP{{Hostname="n2", gpu="0", UUID="GPU-n2-0", instance="b", job="dcgm"}}'
        values: '50 50 50 50 50 stale'
    promql_expr_test:
      - expr: gpuremediate:gpu_faults:max
        eval_time: 1m
        exp_samples: []
      - expr: gpuremediate:gpu_faults:max
        eval_time: 4m
        exp_samples:
          - labels: 'gpuremediate:gpu_faults:max{{Hostname="n1", gpu="1", UUID="GPU-n1-1",
              gpuremediate_metric="DCGM_FI_DEV_XID_ERRORS"}}'
            value: 79
          - labels: 'gpuremediate:gpu_faults:max{{Hostname="n1", gpu="0", UUID="GPU-n1-0",
              gpuremediate_metric="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}}'
            value: 2
      - expr: gpuremediate:node_open_faults:count
        eval_time: 4m
        exp_samples:
          - labels: 'gpuremediate:node_open_faults:count{{Hostname="n1"}}'
            value: 2
          - labels: 'gpuremediate:node_open_faults:count{{Hostname="n2"}}'
            value: 1
      - expr: gpuremediate:node_newest_sample_timestamp_seconds:max
        eval_time: 4m
        exp_samples:
          - labels: 'gpuremediate:node_newest_sample_timestamp_seconds:max{{Hostname="n1"}}'
            value: 240
          - labels: 'gpuremediate:node_newest_sample_timestamp_seconds:max{{Hostname="n2"}}'
            value: 240
      - expr: gpuremediate:node_newest_sample_timestamp_seconds:max
        eval_time: 6m
        exp_samples:
          - labels: 'gpuremediate:node_newest_sample_timestamp_seconds:max{{Hostname="n1"}}'
            value: 360
      - expr: gpuremediate:node_open_faults:count
        eval_time: 6m
        exp_samples:
          - labels: 'gpuremediate:node_open_faults:count{{Hostname="n1"}}'
            value: 2
      - expr: gpuremediate:recording_rules_info
        eval_time: 1m
        exp_samples:
          - labels: 'gpuremediate:recording_rules_info{{version="{version}",
              node_labels="Hostname,hostname,node,kubernetes_node", interval="30s"}}'
            value: 1
"""


@needs_promtool
def test_promtool_unit_test_of_what_the_rules_record(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    test = tmp_path / "recording.test.yml"
    test.write_text(UNIT_TEST.format(rules=RULES_FILE, version=sources.RULES_VERSION), encoding="utf-8")
    done = subprocess.run([PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
