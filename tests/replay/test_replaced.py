"""Issue 47: the replay reads the controller's replaced-node history (ConfigMap gpuremediate-replaced) and shows the
replacements within its range, in the text and the JSON; a file that is not that history is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuremediate.actions.replaced import REPLACED_CONFIGMAP, REPLACED_KEY
from tests.replay.helpers import HOUR, T0
from tests.replay.test_cli_outputs import replay_cli, saved  # noqa: F401 (the fixture)

ENTRIES = [
    {"node": "node-9", "node_uid": "u-old", "provider_id": "aws:///us-east-1a/i-0old", "provider": "karpenter",
     "target": "NodeClaim gpu-abcde", "target_uid": "t-old", "fault": "xid 79", "at": T0 - 40 * 86400.0,
     "state": "deleted"},
    {"node": "node-3", "node_uid": "u-3", "provider_id": "aws:///us-east-1a/i-03", "provider": "cluster-api",
     "target": "Machine default/gpu-workers-x7", "target_uid": "t-3", "fault": "ecc-dbe", "at": T0 + HOUR,
     "state": "deleted"},
]


def configmap() -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": REPLACED_CONFIGMAP},
            "data": {REPLACED_KEY: json.dumps(ENTRIES)}}


def test_the_replay_shows_the_replacements_in_its_range(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    (saved / "cm.json").write_text(json.dumps(configmap()))
    args = ["--scrapes", str(saved / "scrapes"), "--nodes", str(saved / "nodes.json"),
            "--replaced", str(saved / "cm.json")]
    assert replay_cli(*args) == 0
    text = capsys.readouterr().out
    assert "Replaced (from the controller's history, 1)" in text
    assert "2026-11-01T01:00:00Z  node-3: replaced through Machine default/gpu-workers-x7 (cluster-api)" in text
    assert "node-9" not in text  # replaced before the range
    assert replay_cli(*args, "--format", "json") == 0
    [shown] = json.loads(capsys.readouterr().out)["replaced"]
    assert (shown["node"], shown["provider"], shown["fault"]) == ("node-3", "cluster-api", "ecc-dbe")


def test_a_saved_scrapes_folder_brings_its_own_history(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    (saved / "scrapes" / "replaced.json").write_text(json.dumps(ENTRIES))  # the data key's list itself
    assert replay_cli("--scrapes", str(saved / "scrapes"), "--format", "json") == 0
    assert [r["node"] for r in json.loads(capsys.readouterr().out)["replaced"]] == ["node-3"]


def test_a_file_that_is_not_the_history_is_refused(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    (saved / "bad.json").write_text(json.dumps({"data": {REPLACED_KEY: "[{\"node\": 1}]"}}))
    assert replay_cli("--scrapes", str(saved / "scrapes"), "--replaced", str(saved / "bad.json")) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and REPLACED_CONFIGMAP in err, err
