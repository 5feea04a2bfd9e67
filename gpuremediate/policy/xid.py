"""The XID table: what gpuremediate does when a GPU reports an XID.

Built at import from NVIDIA's XID catalog (``gpuremediate/data/Xids.csv``): each XID's immediate
resolution bucket maps to an action. Buckets that are workflows (or empty) are decided here, per XID,
with a reason. ``docs/xid-policy.md`` is generated from this module
(``python -m gpuremediate.policy.xid --markdown docs/xid-policy.md``) and a test keeps them equal.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType

from gpuremediate.policy import nvlink5
from gpuremediate.vocab.findings import (
    ACTION_NONE,
    ACTION_QUARANTINE,
    ACTION_REBOOT,
    ACTION_RESET_GPU,
)

CATALOG_RESOURCE = "Xids.csv"

# The immediate-action bucket → action, for buckets that say plainly what to do.
BUCKET_ACTIONS: Mapping[str, str] = MappingProxyType(
    {
        "RESET_GPU": ACTION_RESET_GPU,
        "RESTART_BM": ACTION_REBOOT,
        "RESTART_VM": ACTION_REBOOT,
        "RESTART_APP": ACTION_NONE,
        "IGNORE": ACTION_NONE,
        "CONTACT_SUPPORT": ACTION_QUARANTINE,
    }
)

_BUCKET_PHRASES: Mapping[str, str] = MappingProxyType(
    {
        "RESET_GPU": "NVIDIA's immediate action is a GPU reset",
        "RESTART_BM": "NVIDIA's immediate action is a bare-metal restart",
        "RESTART_VM": "NVIDIA's immediate action is restarting the VM that owns the GPU, a node reboot here",
        "RESTART_APP": "only the application must restart, so the node is evented, not repaired",
        "IGNORE": "NVIDIA says no action is required, so it is only evented",
        "CONTACT_SUPPORT": "NVIDIA says contact support, so a person looks (quarantine)",
    }
)



def _nvlink5(unit: str) -> str:
    return f"NVLink5 {unit} error: its message is decoded (IGNORE: evented, RESET_GPU: reset); undecodable: reset."


# XIDs whose bucket is a workflow, a special case or empty: decided here, one reason each.
EXPLICIT_DECISIONS: Mapping[int, tuple[str, str]] = MappingProxyType(
    {
        45: (ACTION_NONE, "Preemptive cleanup after an application ended or another XID; that XID carries the fault."),
        48: (ACTION_RESET_GPU, "Uncorrectable ECC error: NVIDIA's data-center recovery is a GPU reset (drain first)."),
        54: (ACTION_QUARANTINE, "Auxiliary power not connected: a person must check the board's mechanicals."),
        74: (ACTION_RESET_GPU, "NVLink error: a GPU reset or node reboot clears it (catalog); reset is the smaller."),
        78: (ACTION_QUARANTINE, "vGPU start error from a driver/firmware mismatch: a person must update the software."),
        144: (ACTION_RESET_GPU, _nvlink5("SAW")),
        145: (ACTION_RESET_GPU, _nvlink5("RLW")),
        146: (ACTION_RESET_GPU, _nvlink5("TLW")),
        147: (ACTION_RESET_GPU, _nvlink5("TREX")),
        148: (ACTION_RESET_GPU, _nvlink5("NVLPW_CTRL")),
        149: (ACTION_RESET_GPU, _nvlink5("NETIR")),
        150: (ACTION_RESET_GPU, _nvlink5("MSE")),
        154: (ACTION_REBOOT, "Recovery action changed: its text names the action; without it, the largest one."),
        159: (ACTION_RESET_GPU, "CHI non-data error: NVIDIA resets when UVM is in use, and CUDA loads nvidia-uvm."),
        162: (ACTION_NONE, "Power smoothing circuitry re-engaged: informational."),
        163: (ACTION_NONE, "Power smoothing disengaged: the catalog says no GPU reset is required."),
        164: (ACTION_NONE, "Power smoothing low lifetime: plan a replacement; nothing to repair now."),
        165: (ACTION_NONE, "Power smoothing lifetime exhausted: power swings follow, computing stays correct."),
        166: (ACTION_QUARANTINE, "Confidential-computing link configuration error: a person must fix the setup."),
        167: (ACTION_REBOOT, "PCIe fatal timeout: like a GPU off the bus, only a node reboot brings the link back."),
        168: (ACTION_REBOOT, "Errors in the write-protected region: the catalog says re-attempt boot."),
        169: (ACTION_RESET_GPU, "SEC2 micro-controller halt: treated like the PMU halt (XID 62), a GPU reset."),
        170: (ACTION_QUARANTINE, "Unexpected interrupt in confidential-computing mode: a person must look."),
        171: (ACTION_RESET_GPU, "DRAM detail of an XID 48: same recovery, a GPU reset."),
        172: (ACTION_RESET_GPU, "SRAM detail of an XID 48: same recovery, a GPU reset."),
    }
)

# XID 154's text names the new recovery action; see ``action_from_xid154_text``.
_XID154_ACTIONS: Mapping[str, str] = MappingProxyType(
    {
        "none": ACTION_NONE,
        "drain p2p": ACTION_RESET_GPU,
        "drain and reset": ACTION_RESET_GPU,
        "gpu reset required": ACTION_RESET_GPU,
        "node reboot required": ACTION_REBOOT,
    }
)
_XID154_TARGET = re.compile(r"\bto\s+0x[0-9a-fA-F]+\s*\(([^)]*)\)")


@dataclass(frozen=True)
class XidEntry:
    code: int
    mnemonic: str
    bucket: str  # NVIDIA's immediate resolution bucket; "" when the catalog gives none
    action: str
    reason: str  # one sentence


@dataclass(frozen=True)
class XidOverride:
    """A policy-file change to one XID's action (the reason is optional)."""

    action: str
    reason: str = ""


def _clean(cell: str) -> str:
    return " ".join(cell.split())


def _standard_reason(description: str, bucket: str) -> str:
    what = "Unused by current drivers" if description == "Unused" else description
    return f"{what}: {_BUCKET_PHRASES[bucket]}."


def _entry_from_row(row: Mapping[str, str]) -> XidEntry:
    code = int(row["code"])
    bucket = row["bucket"]
    if code in EXPLICIT_DECISIONS:
        action, reason = EXPLICIT_DECISIONS[code]
    elif bucket in BUCKET_ACTIONS:
        action, reason = BUCKET_ACTIONS[bucket], _standard_reason(row["description"], bucket)
    else:
        raise ValueError(f"XID {code}: bucket {bucket!r} has no decision in EXPLICIT_DECISIONS")
    return XidEntry(code=code, mnemonic=row["mnemonic"], bucket=bucket, action=action, reason=reason)


def parse_catalog(text: str) -> dict[int, XidEntry]:
    """NVIDIA's Xids.csv → the table, by code. Columns are found by header, not position."""
    rows = list(csv.reader(io.StringIO(text)))
    header = [_clean(cell).lower() for cell in rows[0]]
    column = {
        "code": header.index("code"),
        "mnemonic": header.index("mnemonic"),
        "description": header.index("description"),
        "bucket": header.index("resolution bucket (immediate action)"),
    }
    table: dict[int, XidEntry] = {}
    for line, raw in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in raw):
            continue
        cells = {name: _clean(raw[index]) if index < len(raw) else "" for name, index in column.items()}
        entry = _entry_from_row(cells)
        if entry.code in table:
            raise ValueError(f"Xids.csv line {line}: XID {entry.code} listed twice")
        table[entry.code] = entry
    missing = sorted(set(EXPLICIT_DECISIONS) - set(table))
    if missing:
        raise ValueError(f"EXPLICIT_DECISIONS names XIDs the catalog lacks: {missing}")
    return dict(sorted(table.items()))


# XIDs newer than the catalog (it ends at 172): the driver's own names (open-gpu-kernel-modules nverror.h, 580.105.08
# to 595.45.04; 185 from the GPU Operational Events release notes, R620), with no resolution bucket from NVIDIA yet,
# so each action is decided here. An unknown XID's default is a quarantine: wrong for a benign one like 174 or 176.
NEWER_THAN_CATALOG: Mapping[int, tuple[str, str, str]] = MappingProxyType(
    {
        173: ("C2C_FATAL_LINK_FAILURE", ACTION_REBOOT,
              "Fatal chip-to-chip (Grace-Blackwell C2C) link failure: no bucket from NVIDIA yet; a node reboot "
              "re-trains the link (the largest repair short of a person)."),
        174: ("ROBUST_CHANNEL_RESETCHANNEL_KILL_PROCESS_SILENT", ACTION_NONE,
              "A channel reset that killed a process silently: the application's, like the RESTART_APP XIDs."),
        175: ("MEMORY_SUBSYSTEM_ERROR", ACTION_RESET_GPU,
              "GPU memory subsystem timeout (also what a GSP RPC timeout traced to memory becomes): no bucket from "
              "NVIDIA yet; a GPU reset, as the catalog gives the GSP RPC timeouts (XID 119/120) it refines."),
        176: ("PCIE_CORRECTABLE_ERROR_FAULT", ACTION_NONE,
              "PCIe correctable errors past the driver's threshold: corrected, so nothing to repair; an Event."),
        185: ("SPARING_EVENT", ACTION_NONE,
              "Memory sparing state changed (GPU-RAS event 0x003D): informational, the hardware spared the memory."),
    }
)


def _load_table() -> Mapping[int, XidEntry]:
    text = resources.files("gpuremediate").joinpath("data", CATALOG_RESOURCE).read_text(encoding="utf-8")
    table = parse_catalog(text)
    for code, (mnemonic, action, reason) in NEWER_THAN_CATALOG.items():
        table.setdefault(code, XidEntry(code=code, mnemonic=mnemonic, bucket="", action=action, reason=reason))
    return MappingProxyType(dict(sorted(table.items())))


XID_TABLE: Mapping[int, XidEntry] = _load_table()


def unknown_entry(code: int, action: str = ACTION_QUARANTINE) -> XidEntry:
    reason = f"Not in NVIDIA's XID catalog: the policy's action for unknown XIDs ({action})."
    return XidEntry(code=code, mnemonic="UNKNOWN", bucket="", action=action, reason=reason)


def lookup(
    code: int,
    overrides: Mapping[int, XidOverride] | None = None,
    unknown_action: str = ACTION_QUARANTINE,
    messages: Sequence[str] = (),
) -> XidEntry:
    """The entry for ``code``, after the policy's overrides; XIDs not in the catalog get ``unknown_action``.

    ``messages`` (the driver's text for this XID: kernel log, exporter err_msg) decide the NVLink5 XIDs
    144-150 and XID 154; an override still wins over them.
    """
    entry = XID_TABLE.get(code) or unknown_entry(code, unknown_action)
    override = (overrides or {}).get(code)
    if override is None:
        return decoded_entry(entry, messages) if messages else entry
    reason = override.reason or f"Policy override (catalog default: {entry.action})."
    return XidEntry(code=code, mnemonic=entry.mnemonic, bucket=entry.bucket, action=override.action, reason=reason)


_BUCKET_ACTIONS_NVLINK5: Mapping[str, str] = MappingProxyType(
    {"IGNORE": ACTION_NONE, "XID_154_EVAL": ACTION_NONE, "RESET_GPU": ACTION_RESET_GPU}
)
_ACTION_ORDER = (ACTION_NONE, ACTION_RESET_GPU, ACTION_REBOOT)


def decoded_entry(entry: XidEntry, messages: Sequence[str]) -> XidEntry:
    """``entry`` with the action its messages decode to (NVLink5 144-150, XID 154); unchanged when any
    message does not decode: without a readable message the catalog's cautious default stands."""
    if entry.code in nvlink5.NVLINK5_XIDS:
        worst, complete = nvlink5.worst_decode(entry.code, messages)
        if worst is None or not complete:
            return entry
        action = _BUCKET_ACTIONS_NVLINK5[worst.bucket]
        reason = (f"NVLink5 {worst.unit} ({worst.severity}), error status 0x{worst.error_status:08x}: "
                  f"{nvlink5.BUCKET_WORDS[worst.bucket]}.")
        return dataclasses.replace(entry, action=action, reason=reason)
    if entry.code == 154:
        actions = [action_from_xid154_text(message) for message in messages]
        if not actions or None in actions:
            return entry
        action = max((a for a in actions if a is not None), key=_ACTION_ORDER.index)
        return dataclasses.replace(entry, action=action, reason=f"XID 154 names the recovery action: {action}.")
    return entry


def action_from_xid154_text(message: str) -> str | None:
    """The action XID 154's message names ("... changed from 0x0 (None) to 0x2 (Node Reboot Required)")."""
    match = _XID154_TARGET.search(message)
    if match is None:
        return None
    return _XID154_ACTIONS.get(_clean(match.group(1)).lower())


# --- docs/xid-policy.md --------------------------------------------------------------------------

TABLE_BEGIN = "<!-- BEGIN XID TABLE: generated by `python -m gpuremediate.policy.xid --markdown` -->"
TABLE_END = "<!-- END XID TABLE -->"
TABLE_HEADER = ("code", "mnemonic", "NVIDIA bucket", "action", "reason")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_rows(table: Mapping[int, XidEntry]) -> list[tuple[str, str, str, str, str]]:
    return [(str(e.code), e.mnemonic, e.bucket or "(none)", e.action, e.reason) for e in table.values()]


def markdown_table(table: Mapping[int, XidEntry] = XID_TABLE) -> str:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + " --- |" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in markdown_rows(table)]
    return "\n".join(lines)


def replace_table(document: str, table: Mapping[int, XidEntry] = XID_TABLE) -> str:
    """``document`` with the text between the table markers regenerated."""
    begin, end = document.find(TABLE_BEGIN), document.find(TABLE_END)
    if begin < 0 or end < begin:
        raise ValueError(f"document lacks the markers {TABLE_BEGIN!r} ... {TABLE_END!r}")
    head = document[: begin + len(TABLE_BEGIN)]
    return f"{head}\n{markdown_table(table)}\n{document[end:]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuremediate.policy.xid", description=__doc__)
    parser.add_argument(
        "--markdown",
        nargs="?",
        const="-",
        metavar="PATH",
        help="print the markdown table, or regenerate the table inside PATH (docs/xid-policy.md)",
    )
    args = parser.parse_args(argv)
    if args.markdown is None:
        parser.print_help()
        return 2
    if args.markdown == "-":
        print(markdown_table())
        return 0
    path = Path(args.markdown)
    path.write_text(replace_table(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
