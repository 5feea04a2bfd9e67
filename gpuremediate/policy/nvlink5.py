"""NVLink5 XIDs 144-150: the driver's message → NVIDIA's resolution bucket.

The catalog's bucket for these XIDs is a workflow (WORKFLOW_NVLINK5_ERR): the message must be decoded
with NVIDIA's "XID 144-150 Decode" table (``gpuremediate/data/Xid_144-150_Decode.csv``). The message is

    <unit> <Fatal|Nonfatal> <cross-contain> <injected> Link <n> (<intrInfo> <errorStatus> <debug data x5>)

e.g. ``RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 ...)``.
``intrInfo`` is matched against the table's bit patterns (one per driver generation: before R575 and
from R575 on; '-' is "any bit"), ``errorStatus`` against the row's status: a bit of a mask where the
unit lists single bits, the exact value where it lists values (NETIR BER / MFDE), anything where it
lists none. Several status bits: the worst bucket of them. A message that does not decode gives None
(the caller then keeps the catalog's cautious default, a GPU reset).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

DECODE_RESOURCE = "Xid_144-150_Decode.csv"
NVLINK5_XIDS = range(144, 151)

# NVIDIA's buckets in this table, best to worst. XID_154_EVAL: "if an XID 154 is seen along with this
# error, take that action; if no XID 154 present, RESTART_APP" — the XID 154 finding carries its action.
BUCKET_ORDER = ("IGNORE", "XID_154_EVAL", "RESET_GPU")

_MESSAGE = re.compile(r"(?P<unit>[A-Za-z0-9_/]+)\b.*?\((?P<intr>0x[0-9A-Fa-f]+)[ ,]+(?P<status>0x[0-9A-Fa-f]+)")


@dataclass(frozen=True)
class DecodeRow:
    xid: int
    unit: str
    patterns: tuple[tuple[int, int], ...]  # (mask, value) per driver generation
    statuses: tuple[int, ...]  # empty: any status
    bucket: str
    severity: str


@dataclass(frozen=True)
class Decoded:
    xid: int
    unit: str
    error_status: int
    bucket: str  # one of BUCKET_ORDER
    severity: str  # the table's words: Fatal, Non-fatal, Link Fatal, ...


def _pattern(bits: str) -> tuple[int, int] | None:
    """A binary pattern, most significant bit first, '-' for "any": (mask, value)."""
    bits = bits.strip()
    if not bits or set(bits) - {"0", "1", "-"}:
        return None
    mask = int("".join("0" if b == "-" else "1" for b in bits), 2)
    return mask, int(bits.replace("-", "0"), 2)


def _statuses(cell: str) -> tuple[int, ...]:
    return tuple(int(part, 16) for part in cell.replace(" ", "").split("/") if part)


def parse_decode_table(text: str) -> list[DecodeRow]:
    """NVIDIA's decode sheet → rows; an Action 2 pattern (a second bucket) becomes a row of its own."""
    rows = list(csv.reader(io.StringIO(text)))
    found: list[DecodeRow] = []
    for raw in rows[1:]:
        if len(raw) < 11 or not (raw[0].strip().isascii() and raw[0].strip().isdigit()):
            continue
        xid, unit, statuses, severity = int(raw[0]), raw[1].strip(), _statuses(raw[4]), raw[10].strip()
        for first, second, bucket in ((raw[2], raw[3], raw[5]), (raw[6], raw[7], raw[8])):
            patterns = tuple(p for p in (_pattern(first), _pattern(second)) if p is not None)
            if patterns and bucket.strip():
                found.append(DecodeRow(xid, unit, patterns, statuses, bucket.strip(), severity))
    unknown = {row.bucket for row in found} - set(BUCKET_ORDER)
    if unknown:
        raise ValueError(f"{DECODE_RESOURCE}: buckets {sorted(unknown)} have no meaning here")
    return found


def _load() -> tuple[DecodeRow, ...]:
    text = resources.files("gpuremediate").joinpath("data", DECODE_RESOURCE).read_text(encoding="utf-8")
    return tuple(parse_decode_table(text))


DECODE_TABLE: tuple[DecodeRow, ...] = _load()


def _matches(row: DecodeRow, intr_info: int) -> bool:
    return any(intr_info & mask == value for mask, value in row.patterns)


def _is_bitmask(rows: Sequence[DecodeRow]) -> bool:
    """A unit whose statuses are all single bits reads errorStatus as a mask."""
    listed = [status for row in rows for status in row.statuses]
    return bool(listed) and all(status and status & (status - 1) == 0 for status in listed)


def _status_rows(rows: Sequence[DecodeRow], status: int) -> list[DecodeRow]:
    if all(not row.statuses for row in rows):
        return list(rows)
    if _is_bitmask(rows):
        bits = [1 << n for n in range(32) if status >> n & 1]
        per_bit = [[row for row in rows if bit in row.statuses] for bit in bits]
        if not bits or any(not found for found in per_bit):
            return []  # a bit the table does not know: no decode
        return [row for found in per_bit for row in found]
    return [row for row in rows if not row.statuses or status in row.statuses]


def decode(xid: int, message: str, table: Sequence[DecodeRow] = DECODE_TABLE) -> Decoded | None:
    """The bucket NVIDIA's table gives ``message`` of NVLink5 XID ``xid``; None when it does not decode."""
    match = _MESSAGE.search(message)
    if xid not in NVLINK5_XIDS or match is None:
        return None
    intr_info, status = int(match.group("intr"), 16), int(match.group("status"), 16)
    rows = [row for row in table if row.xid == xid and _matches(row, intr_info)]
    named = [row for row in rows if match.group("unit") in row.unit.split("/") + row.unit.split()]
    found = _status_rows(named or rows, status)
    if not found:
        return None
    worst = max(found, key=lambda row: BUCKET_ORDER.index(row.bucket))
    return Decoded(xid, worst.unit, status, worst.bucket, worst.severity)


def worst_decode(xid: int, messages: Sequence[str]) -> tuple[Decoded | None, bool]:
    """The worst decode over ``messages``, and whether every message decoded (else the caller stays cautious)."""
    decoded = [decode(xid, message) for message in messages]
    known = [d for d in decoded if d is not None]
    if not known:
        return None, False
    return max(known, key=lambda d: BUCKET_ORDER.index(d.bucket)), len(known) == len(decoded)


BUCKET_WORDS: Mapping[str, str] = {
    "IGNORE": "NVIDIA's decode says no action (non-fatal), so it is only evented",
    "XID_154_EVAL": "NVIDIA's decode says follow an XID 154 if one comes, else restart the application: evented",
    "RESET_GPU": "NVIDIA's decode says reset the GPU",
}
