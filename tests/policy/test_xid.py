"""The XID table: built from NVIDIA's catalog, one action per XID, equal to docs/xid-policy.md."""

from __future__ import annotations

import csv
import io
from importlib import resources
from pathlib import Path

import pytest

from gpuremediate.policy import xid
from gpuremediate.policy.xid import (
    BUCKET_ACTIONS,
    EXPLICIT_DECISIONS,
    NEWER_THAN_CATALOG,
    XID_TABLE,
    XidOverride,
    action_from_xid154_text,
    lookup,
    parse_catalog,
)
from gpuremediate.vocab.findings import BUILTIN_ACTIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "xid-policy.md"
CATALOG_TEXT = resources.files("gpuremediate").joinpath("data", "Xids.csv").read_text(encoding="utf-8")


def _catalog_rows() -> list[list[str]]:
    return list(csv.reader(io.StringIO(CATALOG_TEXT)))[1:]


def test_every_catalog_xid_is_in_the_table_once() -> None:
    codes = [int(row[1]) for row in _catalog_rows()]
    assert sorted(codes) == [c for c in XID_TABLE if c not in NEWER_THAN_CATALOG]
    assert len(XID_TABLE) == 172 + len(NEWER_THAN_CATALOG)


def test_every_entry_has_a_builtin_action_and_a_one_sentence_reason() -> None:
    for entry in XID_TABLE.values():
        assert entry.action in BUILTIN_ACTIONS, entry
        assert entry.reason.endswith(".") and "\n" not in entry.reason, entry
        assert entry.mnemonic and "\n" not in entry.mnemonic


def test_plain_buckets_map_to_their_action() -> None:
    for entry in XID_TABLE.values():
        if entry.code not in EXPLICIT_DECISIONS and entry.code not in NEWER_THAN_CATALOG:
            assert entry.action == BUCKET_ACTIONS[entry.bucket], entry


def test_every_non_plain_bucket_is_decided_explicitly() -> None:
    odd = {e.code for e in XID_TABLE.values() if e.bucket not in BUCKET_ACTIONS}
    assert odd <= set(EXPLICIT_DECISIONS) | set(NEWER_THAN_CATALOG)
    assert {45, 48, 74, 144, 150, 154, 159, 162, 172} <= odd


@pytest.mark.parametrize(
    ("code", "bucket", "action"),
    [
        (13, "RESTART_APP", "none"),
        (31, "RESTART_APP", "none"),
        (43, "IGNORE", "none"),
        (45, "WORKFLOW_XID_45", "none"),
        (48, "WORKFLOW_XID_48", "reset-gpu"),
        (61, "CONTACT_SUPPORT", "quarantine"),
        (63, "IGNORE", "none"),
        (64, "RESET_GPU", "reset-gpu"),
        (79, "RESTART_BM", "reboot"),
        (94, "RESTART_APP", "none"),
        (95, "RESET_GPU", "reset-gpu"),
        (119, "RESET_GPU", "reset-gpu"),
        (120, "RESET_GPU", "reset-gpu"),
        (140, "RESET_GPU", "reset-gpu"),
        (151, "RESTART_VM", "reboot"),
        (154, "XID_154", "reboot"),
        (167, "", "reboot"),
    ],
)
def test_known_xids(code: int, bucket: str, action: str) -> None:
    entry = XID_TABLE[code]
    assert (entry.bucket, entry.action) == (bucket, action)


def test_mnemonic_of_a_multi_line_cell_is_joined() -> None:
    assert XID_TABLE[13].mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"
    assert XID_TABLE[79].mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"


def test_unknown_xid_quarantines_unless_policy_says_otherwise() -> None:
    assert lookup(999).action == "quarantine"
    assert lookup(999).mnemonic == "UNKNOWN"
    assert lookup(999, unknown_action="reboot").action == "reboot"
    assert lookup(79, unknown_action="none").action == "reboot"


def test_override_changes_action_and_keeps_catalog_identity() -> None:
    entry = lookup(79, {79: XidOverride("reset-gpu")})
    assert (entry.action, entry.mnemonic, entry.bucket) == ("reset-gpu", XID_TABLE[79].mnemonic, "RESTART_BM")
    assert "override" in entry.reason and "reboot" in entry.reason
    assert lookup(13, {13: XidOverride("my-fix", "ours.")}).reason == "ours."
    assert lookup(999, {999: XidOverride("none")}).action == "none"
    assert lookup(48, {79: XidOverride("none")}) == XID_TABLE[48]


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("Xid 154 GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "reboot"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "reset-gpu"),
        ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "none"),
        ("recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "reset-gpu"),
        ("recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", "reset-gpu"),
        ("recovery action changed from 0x0 (None) to 0x9 (Something New)", None),
        ("garbage", None),
    ],
)
def test_xid154_text(text: str, action: str | None) -> None:
    assert action_from_xid154_text(text) == action


def _catalog(rows: list[str]) -> str:
    return "Code,Mnemonic,Description,Resolution Bucket (Immediate Action)\n" + "\n".join(rows) + "\n"


def test_parse_catalog_finds_columns_by_header_and_rejects_duplicates_and_undecided_buckets() -> None:
    with pytest.raises(ValueError, match="EXPLICIT_DECISIONS names XIDs the catalog lacks"):
        parse_catalog(_catalog(["79,OFF_BUS,fallen off,RESTART_BM"]))
    full = [f"{code},M{code},d,RESET_GPU" for code in EXPLICIT_DECISIONS]
    table = parse_catalog(_catalog([*full, "79,OFF_BUS,fallen off,RESTART_BM"]))
    assert table[79].action == "reboot" and table[48].action == EXPLICIT_DECISIONS[48][0]
    with pytest.raises(ValueError, match="XID 79 listed twice"):
        parse_catalog(_catalog([*full, "79,A,d,RESTART_BM", "79,B,d,RESET_GPU"]))
    with pytest.raises(ValueError, match="XID 500: bucket 'NEW_BUCKET' has no decision"):
        parse_catalog(_catalog([*full, "500,NEW,d,NEW_BUCKET"]))


# --- docs/xid-policy.md <-> code ------------------------------------------------------------------


def _doc_rows(text: str) -> list[tuple[str, ...]]:
    begin, end = text.index(xid.TABLE_BEGIN), text.index(xid.TABLE_END)
    lines = [line for line in text[begin:end].splitlines() if line.startswith("|")]
    assert lines[0] == "| " + " | ".join(xid.TABLE_HEADER) + " |"
    rows = []
    for line in lines[2:]:
        cells = [cell.strip().replace("\\|", "|") for cell in line.strip("|").split(" | ")]
        rows.append(tuple(cells))
    return rows


def test_doc_table_equals_the_code_row_by_row() -> None:
    doc = {row[0]: row for row in _doc_rows(DOC.read_text(encoding="utf-8"))}
    code = {row[0]: row for row in xid.markdown_rows(XID_TABLE)}
    assert sorted(doc) == sorted(code), "XIDs differ between docs/xid-policy.md and the code"
    different = [f"XID {key}: doc {doc[key]} != code {code[key]}" for key in code if doc[key] != code[key]]
    assert not different, "\n".join(different) + "\nregenerate: python -m gpuremediate.policy.xid --markdown " \
                                                 "docs/xid-policy.md"


def test_doc_check_catches_a_changed_row() -> None:
    text = DOC.read_text(encoding="utf-8").replace("| 79 | ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS | RESTART_BM | "
                                                   "reboot |", "| 79 | ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS | "
                                                   "RESTART_BM | reset-gpu |")
    rows = {row[0]: row for row in _doc_rows(text)}
    assert rows["79"][3] == "reset-gpu" != XID_TABLE[79].action


def test_regenerating_the_doc_is_a_fixed_point() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert xid.replace_table(text) == text


def test_markdown_cli_prints_the_table_and_rewrites_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert xid.main(["--markdown"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == xid.markdown_table()
    target = tmp_path / "doc.md"
    target.write_text(f"intro\n{xid.TABLE_BEGIN}\nstale\n{xid.TABLE_END}\noutro\n", encoding="utf-8")
    assert xid.main(["--markdown", str(target)]) == 0
    written = target.read_text(encoding="utf-8")
    assert written.startswith("intro\n") and written.endswith("outro\n") and "stale" not in written
    assert len(_doc_rows(written)) == len(XID_TABLE)


def test_replace_table_requires_the_markers() -> None:
    with pytest.raises(ValueError, match="lacks the markers"):
        xid.replace_table("no markers here")


def test_the_xids_newer_than_the_catalog_have_their_driver_names_and_a_decision() -> None:
    assert max(c for c in XID_TABLE if c not in NEWER_THAN_CATALOG) == 172  # the catalog's last
    assert (lookup(173).mnemonic, lookup(173).action) == ("C2C_FATAL_LINK_FAILURE", "reboot")
    assert lookup(174).action == lookup(176).action == lookup(185).action == "none"  # benign: never a quarantine
    assert lookup(175).action == lookup(119).action == "reset-gpu"
    assert all(XID_TABLE[c].bucket == "" for c in NEWER_THAN_CATALOG)
    assert lookup(177).action == "quarantine"  # still unknown: the policy's unknown action
