"""The per-node gauges the alerts name their nodes from: gpuremediate_node_state{node,state} for every GPU node
out of healthy (none for a healthy one: as many series as nodes out of service), and
gpuremediate_node_health_unknown{node} for each node whose health is unknown. Read from the controller's own
/metrics text, on a bare emulator with the controller in process."""

from __future__ import annotations

import re

from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals.model import SOURCE_OK, SOURCE_UNKNOWN, GpuReading, NodeReadings
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_QUARANTINE, KIND_ROW_REMAP_FAILURE
from gpuremediate.vocab.record import Fault, NodeRecord
from sim.waiting import wait_for

from .test_admission import BASE, NS, World, world  # noqa: F401 (the fixture)


class OneUnknown:
    """Every node healthy but ``unknown``, whose exporter does not answer."""

    def __init__(self, nodes: list[str], unknown: str) -> None:
        self.nodes, self.unknown = nodes, unknown

    def read(self) -> list[NodeReadings]:
        return [NodeReadings(node=n, source="exporter", status=SOURCE_UNKNOWN, reason="connection refused")
                if n == self.unknown else
                NodeReadings(node=n, source="exporter", status=SOURCE_OK, gpus=(GpuReading(node=n, gpu="0"),))
                for n in self.nodes]


def _series(text: str, name: str) -> set[str]:
    return set(re.findall(rf"^{name}(\{{[^}}]*\}}) 1$", text, re.MULTILINE))


def test_node_state_names_the_nodes_out_of_healthy_and_only_those(world: World) -> None:  # noqa: F811
    fault = Fault(KIND_ROW_REMAP_FAILURE, "", ("GPU-1",), "row-remap-failure:GPU-1", ACTION_QUARANTINE, 1000.0,
                  1000.0, "row remapping failed")
    world.node("gpu-healthy")
    world.node("gpu-quarantined", record=NodeRecord(state=states.QUARANTINED, since=1000.0, reason="row-remap-failure",
                                                    fault=fault, cordoned_by_us=True))
    world.node("gpu-unknown")
    controller = Controller(Settings(namespace=NS, scrape_interval_s=0.1, resync_s=0.3),
                            loads_policy(BASE, "test-policy"), client=world.kube,
                            source=OneUnknown(world.nodes, "gpu-unknown"))
    assert controller.start_caches(timeout=20)
    controller.start_loops()
    world.controllers.append(controller)
    render = controller.metrics.registry.render

    def shown() -> tuple[set[str], set[str]]:
        text = render()
        return _series(text, "gpuremediate_node_state"), _series(text, "gpuremediate_node_health_unknown")

    wait_for(lambda: shown() == ({'{node="gpu-quarantined",state="quarantined"}'}, {'{node="gpu-unknown"}'}),
             15, "one node_state series (the quarantined node) and one node_health_unknown (the silent one)",
             seen=shown)
    assert world.record("gpu-quarantined").state == states.QUARANTINED
