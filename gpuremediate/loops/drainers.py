"""The table of drain variants: drain kind → the ``Drainer`` that runs it (``loops.drainer``).

The drain loop runs the first row whose ``matches`` takes the step: a DeviceTaintRule for a GPU-level isolation
(``[isolation] scope = "gpu"``, the fault's one GPU alone) — or, without DRA and ``without_dra = "device-plugin"``,
the eviction of that GPU's pods while the device plugin holds it out of allocatable —, a DrainRequest for a drain plugin
(``[customDrain]`` on, and not fallen back to the built-in drain), and last the built-in eviction drain.

A new way of draining is one new module (a class with ``step(ctx, node, record) -> StepResult``) and one row
here, above the eviction row that takes any drain left; the loop is not edited.
"""

from __future__ import annotations

from gpuremediate.loops import custom_drain, drain_device_plugin, drain_device_taint, drain_evict
from gpuremediate.loops.drainer import DrainRow
from gpuremediate.policy.config import Policy
from gpuremediate.vocab.record import NodeRecord

DRAINERS: tuple[DrainRow, ...] = (
    DrainRow("device-plugin", drain_device_plugin.by_device_plugin, drain_device_plugin.DevicePluginDrain),
    DrainRow("device-taint", drain_device_taint.isolating, drain_device_taint.DeviceTaintDrain),
    DrainRow("drain-request", custom_drain.requested, custom_drain.DrainRequestDrain, guarded=True),
    DrainRow("eviction", drain_evict.always, drain_evict.EvictionDrain),
)


def select(policy: Policy, record: NodeRecord, rows: tuple[DrainRow, ...] = DRAINERS) -> DrainRow:
    """The first row that takes this step (the eviction row takes any drain)."""
    return next(row for row in rows if row.matches(policy, record))
