"""`make demo` works: the embedded default walks every injected fault to its end state."""

import io

from gpuremediate.demo import Demo


def test_demo_heals_the_fleet_and_quarantines_the_repeat_offender() -> None:
    out = io.StringIO()
    assert Demo(nodes=6, speed=2.0, color=False, out=out).run() == 0
    text = out.getvalue()
    status = text.split("$ gpuremediate status")[1].split("$ gpuremediate explain")[0]
    states = {line.split()[0]: line.split()[1] for line in status.splitlines() if line.startswith("gpu-node-")}
    assert states == {
        "gpu-node-1": "healthy", "gpu-node-2": "healthy", "gpu-node-3": "healthy",
        "gpu-node-4": "quarantined", "gpu-node-5": "healthy", "gpu-node-6": "healthy",
    }, text
    for expected in ("(xid-48)", "(thermal)", "(thermal-cleared)", "(repeat-offender)", "(condition)",
                     "GPUDriverResponsive=False", "reboot done", "reset-gpu done", "validation-passed"):
        assert expected in text, f"{expected!r} missing from the demo output:\n{text}"
    # gpu-node-1's XID 79 and gpu-node-2's ECC error reach both sources: whichever the controller sees first (the
    # agent's NodeCondition or the scrape) opens the fault, so either reason is right.
    both = (("gpu-node-1", "(xid-79)", "NeedsReboot"), ("gpu-node-2", "(ecc-dbe)", "NeedsResetGpu"))
    for node, metric, condition in both:
        draining = [line for line in text.splitlines() if f"{node}  draining" in line]
        assert any(metric in line or condition in line for line in draining), f"{node} never drained:\n{text}"
    assert "gpu-node-4: quarantined" in text and "gpuremediate release gpu-node-4" in text
