"""explain shows a failed preflight: which pod, which GPU, its termination line and when it ended (issue 46)."""

from __future__ import annotations

from gpuremediate.fleet import explain
from gpuremediate.policy.preflight import PreflightJudge, PreflightPolicy, last_preflight
from gpuremediate.signals.workload import WorkloadSignal, reduce
from gpuremediate.vocab.preflight import failed_message
from gpuremediate.vocab.record import Fault, NodeRecord
from tests.policy.test_preflight_finding import T0, preflighted

LINE = failed_message(("GPU-5e3f8a11",), "ecc-dbe", "GPU GPU-5e3f8a11 has 2 volatile double-bit ECC error(s)")


def finding_record(*lines: str) -> NodeRecord:
    signal = WorkloadSignal()
    for i, line in enumerate(lines):
        signal.seen(reduce(preflighted(f"p{i}", line, at=T0 + 10 * i)))
    [f] = PreflightJudge(signal).findings("node-1", T0 + 60, PreflightPolicy())
    fault = Fault(f.kind, f.code, f.gpus, f.fingerprint, f.action, T0 + 30, T0 + 30, f.message)
    return NodeRecord(state="draining", since=T0 + 30, fault=fault)


def test_explain_names_the_pod_the_gpu_the_line_and_when() -> None:
    text = explain(finding_record(LINE), "node-1", now=T0 + 90)
    [line] = [t for t in text.splitlines() if t.startswith("  Failed preflight:")]
    stamp = preflighted("p0", LINE)["status"]["initContainerStatuses"][0]["state"]["terminated"]["finishedAt"]
    assert line == (f"  Failed preflight: pod ml/p0 at {stamp}, GPU(s) GPU-5e3f8a11 (ecc-dbe; 1 pod(s) in the "
                    f"window): {LINE}")


def test_the_last_of_several_and_a_lost_gpu() -> None:
    lost = failed_message(("pci0000:5d:00.0",), "gpu-lost", "GPU at PCI 0000:5d:00.0 is lost: GPU is lost (x).")
    record = finding_record(LINE, lost)
    assert record.fault is not None
    last = last_preflight(record.fault.message)
    assert last is not None and (last.count, last.pod, last.gpus, last.check, last.line) == (
        2, "ml/p1", ("pci0000:5d:00.0",), "gpu-lost", lost)


def test_no_preflight_line_for_other_faults() -> None:
    other = Fault("xid", "79", ("GPU-1",), "xid:GPU-1:79", "reboot", T0, T0, "1 pod(s)' preflight failed ...")
    assert "Failed preflight" not in explain(NodeRecord(state="draining", since=T0, fault=other), "n", now=T0 + 5)
    assert last_preflight("anything else") is None
