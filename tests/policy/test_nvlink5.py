"""NVLink5 XIDs 144-150 decoded from the driver's message; XID 154's text names its action."""

from __future__ import annotations

from pathlib import Path

import pytest
from policy_builders import UUID, gpu, node, run

from gpuremediate.policy import nvlink5
from gpuremediate.policy.config import loads_policy
from gpuremediate.policy.xid import lookup

CATALOG = Path("/work/shared/data/xid-catalog/Xid_144-150_Decode.csv")

# Kernel lines quoted in leptonai/gpud pull request #1174 (real GB200 kmsg), the text after "<xid>, ".
LINK_DOWN_PEER = ("NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
                  "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
NETIR_FATAL = "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
RXPIPE_NONFATAL = ("RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
                   "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)")
# Hand-made from the decode table's rows (intrInfo pattern, error status)
SAW_NONFATAL = "SAW_MVB Nonfatal XC0 i0 Link 01 (0x00000021 0x00000005 0x0 0x0 0x0 0x0)"  # bits 0 and 2: IGNORE
SAW_FATAL = "SAW_MVB Fatal XC0 i0 Link 01 (0x00000021 0x00000012 0x0 0x0 0x0 0x0)"  # bits 1 and 4: RESET_GPU
SAW_UNKNOWN_BIT = "SAW_MVB Fatal XC0 i0 Link 01 (0x00000021 0x00000040 0x0 0x0 0x0 0x0)"  # bit 6: not in the table
RXPIPE_ACTION2 = "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a4c2 0x00000001 0x0 0x0 0x0 0x0)"  # bit 10: action 2
REMAP_154 = "RLW_REMAP Nonfatal XC0 i0 Link 02 (0x00000082 0x00000001 0x0 0x0 0x0 0x0)"  # XID_154_EVAL
BER_V2 = "NETIR_BER_EVENT Nonfatal XC0 i0 Link 04 (0x00000013 0x00000002 0x0 0x0 0x0 0x0)"  # R575+ pattern
LINK_DOWN_SLEEP = "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x0 0x0 0x0 0x0)"  # 100110: IGNORE


def test_the_bundled_table_is_nvidias_decode_sheet() -> None:
    bundled = Path(nvlink5.__file__).resolve().parents[1] / "data" / nvlink5.DECODE_RESOURCE
    assert bundled.read_bytes() == CATALOG.read_bytes()
    assert {row.xid for row in nvlink5.DECODE_TABLE} == set(nvlink5.NVLINK5_XIDS)
    assert {row.bucket for row in nvlink5.DECODE_TABLE} == set(nvlink5.BUCKET_ORDER)


@pytest.mark.parametrize(("xid", "message", "unit", "bucket"), [
    (149, LINK_DOWN_PEER, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "RESET_GPU"),
    (149, NETIR_FATAL, "NETIR/NETIR_INT", "RESET_GPU"),
    (145, RXPIPE_NONFATAL, "RLW_RXPIPE", "IGNORE"),
    (144, SAW_NONFATAL, "SAW_MVB", "IGNORE"),
    (144, SAW_FATAL, "SAW_MVB", "RESET_GPU"),
    (145, RXPIPE_ACTION2, "RLW_RXPIPE", "RESET_GPU"),
    (145, REMAP_154, "RLW_REMAP", "XID_154_EVAL"),
    (149, BER_V2, "NETIR_BER_EVENT", "IGNORE"),
    (149, LINK_DOWN_SLEEP, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "IGNORE"),
])
def test_messages_decode_to_nvidias_bucket(xid: int, message: str, unit: str, bucket: str) -> None:
    decoded = nvlink5.decode(xid, message)
    assert decoded is not None and (decoded.unit, decoded.bucket) == (unit, bucket)


@pytest.mark.parametrize(("xid", "message"), [
    (144, SAW_UNKNOWN_BIT), (144, "NVLINK: SAW Error"), (145, SAW_NONFATAL), (79, RXPIPE_NONFATAL), (145, ""),
])
def test_what_does_not_decode_is_none(xid: int, message: str) -> None:
    assert nvlink5.decode(xid, message) is None


def _xid_actions(code: int, *messages: str, policy: str = "") -> list[tuple[str, str]]:
    readings = node(gpu(xid_counts={code: 1.0}, xid_messages={code: messages} if messages else {}))
    findings = run(readings, loads_policy(policy).defaults if policy else None).findings
    return [(f.code, f.action) for f in findings]


def test_nonfatal_nvlink5_xids_are_reported_not_acted_on() -> None:
    assert _xid_actions(145, RXPIPE_NONFATAL) == [("145", "none")]
    assert _xid_actions(144, SAW_NONFATAL) == [("144", "none")]
    assert _xid_actions(145, REMAP_154) == [("145", "none")]  # an XID 154 beside it carries the action
    finding = run(node(gpu(xid_counts={145: 1.0}, xid_messages={145: (RXPIPE_NONFATAL,)}))).findings[0]
    assert "RLW_RXPIPE" in finding.message and "0x00000008" in finding.message and UUID in finding.message


def test_fatal_undecodable_or_mixed_messages_reset() -> None:
    assert _xid_actions(149, LINK_DOWN_PEER) == [("149", "reset-gpu")]
    assert _xid_actions(145) == [("145", "reset-gpu")]  # no message: the cautious default
    assert _xid_actions(144, SAW_UNKNOWN_BIT) == [("144", "reset-gpu")]
    assert _xid_actions(144, SAW_NONFATAL, SAW_FATAL) == [("144", "reset-gpu")]
    assert _xid_actions(144, SAW_NONFATAL, "garbled") == [("144", "reset-gpu")]  # one unreadable: stay cautious


def test_a_policy_override_wins_over_the_decode() -> None:
    assert _xid_actions(145, RXPIPE_NONFATAL, policy='[xid.overrides]\n145 = "reboot"') == [("145", "reboot")]


def test_xid_154_text_decides_its_action() -> None:
    to_reset = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    to_none = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    assert _xid_actions(154, to_reset) == [("154", "reset-gpu")]
    assert _xid_actions(154, to_none) == [("154", "none")]
    assert _xid_actions(154, to_none, to_reset) == [("154", "reset-gpu")]
    assert _xid_actions(154) == [("154", "reboot")]  # no text: the largest action it may name
    assert _xid_actions(154, "recovery action changed from 0x0 (None) to 0x9 (New)") == [("154", "reboot")]
    assert lookup(154, messages=(to_reset,)).action == "reset-gpu"


def test_the_exporters_xid_gauge_carries_err_msg_to_the_decode() -> None:
    from gpuremediate.signals.dcgm import readings_from_samples
    from gpuremediate.signals.exposition import parse

    text = (f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="GPU-a",Hostname="n",err_code="145",'
            f'err_msg="{RXPIPE_NONFATAL}"}} 145\n')
    [readings] = readings_from_samples(parse(text, strict=False).samples, node=None, source="exporter",
                                       observed_at=0.0)
    assert dict(readings.gpus[0].xid_messages) == {145: (RXPIPE_NONFATAL,)}
    assert [(f.code, f.action) for f in run(readings).findings] == [("145", "none")]
