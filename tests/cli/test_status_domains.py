"""``status`` on NVL72 trays (issue 28): a DOMAIN column from ``nvidia.com/gpu.clique``, ``--by domain`` groups."""

from __future__ import annotations

from typing import Any

from gpuremediate import fleet
from gpuremediate.cli import build_parser
from gpuremediate.signals.fabric import CLIQUE_LABEL
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states

RACK_A, RACK_B = "c0ffee00-0000-4000-8000-00000000000a.1", "c0ffee00-0000-4000-8000-00000000000b.1"


def node(name: str, clique: str | None, record: r.NodeRecord | None = None, cordoned: bool = False) -> dict[str, Any]:
    labels = {CLIQUE_LABEL: clique} if clique else {}
    annotations = {r.RECORD_ANNOTATION: r.encode(record)} if record else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"unschedulable": cordoned}, "status": {"capacity": {"nvidia.com/gpu": "4"}}}


def cordoned() -> r.NodeRecord:
    fault = r.Fault("fabric-unhealthy", "fabric-unhealthy", ("GPU-0",), "fabric-unhealthy:GPU-0:1", "cordon",
                    80.0, 80.0, "Not Started")
    return r.NodeRecord(state=states.CORDONED, since=80.0, reason="fabric-unhealthy", fault=fault)


def rows() -> list[fleet.StatusRow]:
    nodes = [node("a-tray-2", RACK_A), node("b-tray-1", RACK_B), node("a-tray-1", RACK_A, cordoned(), True),
             node("hgx-1", None)]
    return [fleet.row_for(n, now=100.0) for n in nodes]


def test_a_domain_column_when_nodes_carry_the_clique_label() -> None:
    table = fleet.render_status(rows(), now=100.0)
    header = table.splitlines()[0].split()
    assert header[:3] == ["NODE", "DOMAIN", "STATE"]
    line = next(ln for ln in table.splitlines() if ln.startswith("a-tray-1"))
    assert RACK_A in line and "cordoned *" in line
    assert next(ln for ln in table.splitlines() if ln.startswith("hgx-1")).split()[1] == "-"
    plain = fleet.render_status([fleet.row_for(node("hgx-1", None), now=100.0)], now=100.0)
    assert "DOMAIN" not in plain  # no NVLink domain anywhere: the table is as before


def test_by_domain_groups_and_counts_the_trays_out() -> None:
    text = fleet.render_status(rows(), now=100.0, by_domain=True)
    titles = [ln for ln in text.splitlines() if ln.startswith("DOMAIN ")]
    assert titles == [f"DOMAIN {RACK_A}: 2 node(s), 1 out of service", f"DOMAIN {RACK_B}: 1 node(s), 0 out of service",
                      "DOMAIN (none): 1 node(s), 0 out of service"]
    assert text.index("a-tray-1") < text.index("a-tray-2") < text.index("b-tray-1") < text.index("hgx-1")


def test_the_flags_parse() -> None:
    args = build_parser().parse_args(["status", "--by", "domain", "--domain-label", "example.com/rack"])
    assert (args.by, args.domain_label) == ("domain", "example.com/rack")
    assert build_parser().parse_args(["status"]).domain_label == CLIQUE_LABEL
    custom = fleet.row_for({**node("x", None), "metadata": {"name": "x", "labels": {"example.com/rack": "r1"}}},
                           now=100.0, domain_label="example.com/rack")
    assert custom.domain == "r1"


class _Nodes:
    """A client whose list() answers a label selector over fixed Nodes."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes

    def list(self, _res: object, namespace: str | None = None, *, label_selector: str | None = None,
             **_: object) -> dict[str, Any]:
        key, _, value = (label_selector or "").partition("=")
        return {"items": [n for n in self.nodes if (n["metadata"].get("labels") or {}).get(key) == value]}


def test_explain_names_the_domain_and_its_trays_out() -> None:
    nodes = [node("a-tray-1", RACK_A, cordoned(), True), node("a-tray-2", RACK_A), node("b-tray-1", RACK_B),
             node("hgx-1", None)]
    line = fleet.domain_line(_Nodes(nodes), nodes[1])  # type: ignore[arg-type]
    assert line == f"  NVLink domain: {CLIQUE_LABEL}={RACK_A}: 2 node(s), 1 out of service (a-tray-1)\n"
    assert fleet.domain_line(_Nodes(nodes), nodes[3]) == ""  # type: ignore[arg-type]
