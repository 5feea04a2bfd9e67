"""A corrupted exporter line is counted and skipped, never read as another GPU's fault (issue 22 item 6).

The real A100 scrape, its XID series at 79 and one comma of that line lost (``UUID="..."pci_bus_id=...``):
lenient parsing once read it as an XID 79 on a GPU whose UUID ran on into the next labels, and the node was
cordoned for a reboot of that GPU. The line is malformed now: the node stays healthy and
``gpuremediate_scrape_malformed_lines_total`` says a line was skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuremediate.config import Settings
from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, NODES
from gpuremediate.policy.config import loads_policy
from gpuremediate.signals import dcgm, exposition
from gpuremediate.signals.model import NodeReadings
from gpuremediate.vocab.record import NodeRecord, record_from_node
from sim.kubeapi import KubeAPIServer

DATA = Path(__file__).resolve().parents[1] / "signals" / "data" / "dcgm-exporter"
NODE = "gpu-1"
POD_NS = "gpuremediate-system"


def a100_scrape(xid: int, lose_a_comma: bool) -> str:
    lines = []
    for line in (DATA / "scrape-A100-vgpu-xid-labels.prom").read_text(encoding="utf-8").splitlines():
        if line.startswith("DCGM_FI_DEV_XID_ERRORS{"):
            line = line.rsplit(" ", 1)[0] + f" {xid}"
            if lose_a_comma:
                line = line.replace('",pci_bus_id=', '"pci_bus_id=')
        lines.append(line)
    return "\n".join(lines) + "\n"


class ScrapeSource:
    """Readings the way ExporterSource makes them from a scrape: lenient parse, then the dcgm series."""

    def __init__(self) -> None:
        self.text = a100_scrape(0, False)

    def read(self) -> list[NodeReadings]:
        parsed = exposition.parse(self.text, strict=False)
        return dcgm.readings_from_samples(parsed.samples, node=NODE, source="exporter", observed_at=1.0,
                                          malformed_lines=len(parsed.malformed))


@pytest.fixture
def world() -> Iterator[tuple[KubeClient, Controller, ScrapeSource]]:
    srv = KubeAPIServer().start()
    client = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)), qps=500, burst=500)
    client.create(NAMESPACES, {"metadata": {"name": POD_NS}})
    client.create(NODES, {"metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}}})
    source = ScrapeSource()
    controller = Controller(Settings(namespace=POD_NS, scrape_interval_s=0.05), loads_policy(""), client=client,
                            source=source)
    assert controller.start_caches(timeout=20)
    yield client, controller, source
    controller.stop()
    srv.stop()


def test_a_corrupted_xid_line_is_counted_and_acts_on_nothing(
    world: tuple[KubeClient, Controller, ScrapeSource]
) -> None:
    client, controller, source = world
    malformed = controller.metrics.scrape_malformed
    controller.detect.cycle()
    assert malformed.value(source="exporter") == 0
    source.text = a100_scrape(79, lose_a_comma=True)
    controller.detect.cycle()
    controller.detect.cycle()
    assert malformed.value(source="exporter") == 2  # one line, in each cycle's read
    assert record_from_node(client.get(NODES, NODE)) is None, "a corrupted line started a repair"
    source.text = a100_scrape(79, lose_a_comma=False)  # the same fault, read whole: acted on
    controller.detect.cycle()
    record = record_from_node(client.get(NODES, NODE))
    assert isinstance(record, NodeRecord) and record.fault is not None and record.fault.code == "79"
    assert record.fault.gpus == ("GPU-f809e614-a528-4083-acbf-334600000000",)
    assert malformed.value(source="exporter") == 2
