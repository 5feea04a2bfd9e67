"""`status`, `explain` and `breaker status` with `-o json` / `-o yaml` (`--json`): one object each, framed with
apiVersion and kind, the fleet's pause, breaker and dry run beside the nodes, times in RFC 3339, an absent value
null (never the table's `-` or ""), every field as gpuremediate/structured.py's SCHEMA says, and that schema the
one docs/output.md shows."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpuremediate import cli, structured
from gpuremediate.actions.breaker import BreakerStore
from gpuremediate.actions.dry_run_journal import DryRunJournal
from gpuremediate.kube import miniyaml
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.resources import NODES
from gpuremediate.policy.safety import LOOK_OPENED, CircuitBreaker, DomainTrip, Look, Pause
from gpuremediate.vocab import record as r
from gpuremediate.vocab import states
from gpuremediate.vocab.findings import ACTION_RESET_GPU, KIND_ECC_DBE
from gpuremediate.vocab.record import Fault, NodeRecord, node_patch

NS = "gpuremediate-system"
NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
NOW_TEXT = "2023-11-14T22:13:20Z"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "output.md"


def _node(client: KubeClient, name: str, record: NodeRecord | None = None, gpus: int = 8,
          annotation: str | None = None) -> None:
    client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                          "spec": {"unschedulable": record is not None},
                          "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                                     "allocatable": {"nvidia.com/gpu": str(gpus)}}})
    if record is not None:
        client.patch(NODES, name, node_patch(record, owner=client.get(NODES, name)))
    if annotation is not None:
        client.patch(NODES, name, {"metadata": {"annotations": {r.RECORD_ANNOTATION: annotation}}})


def _fault() -> Fault:
    return Fault(KIND_ECC_DBE, "ecc_dbe_volatile", ("GPU-1",), "ecc-dbe:GPU-1", ACTION_RESET_GPU, NOW, NOW + 5,
                 "volatile double-bit ECC error")


def _draining_on_a_pdb() -> NodeRecord:
    record = NodeRecord(state=states.DRAINING, since=NOW, reason="ecc-dbe", message="volatile double-bit ECC error",
                        fault=_fault(), cordoned_by_us=True, handled=("ecc-dbe:GPU-1",))
    record = r.start_action(record, "drain", "", 1, NOW, 3600.0)
    return r.block(record, r.BLOCK_PDB, "work/pdb-llm", NOW)


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def _printed(capsys: pytest.CaptureFixture[str], argv: list[str], kind: str) -> dict[str, Any]:
    """The command's -o json, checked: the same as --json and as -o yaml read back, and as SCHEMA says."""
    as_json = json.loads(_out(capsys, [*argv, "-o", "json"]))
    assert json.loads(_out(capsys, [*argv, "--json"])) == as_json
    assert miniyaml.loads(_out(capsys, [*argv, "-o", "yaml"])) == as_json
    assert as_json["apiVersion"] == structured.API_VERSION and as_json["kind"] == kind
    assert structured.validate(as_json, kind) == []
    assert not list(_placeholders(as_json)), list(_placeholders(as_json))
    return as_json


def _placeholders(value: Any, where: str = "$") -> Any:
    """Every string that is a table's placeholder ("-") or empty: an absent value is null, never these."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _placeholders(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _placeholders(item, f"{where}[{i}]")
    elif value in ("-", ""):
        yield where


# -- status -------------------------------------------------------------------------------------


def test_status_is_one_fleet_status_object_with_nulls_not_placeholders(api: tuple[KubeClient, str],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", _draining_on_a_pdb())
    _node(client, "gpu-b", gpus=4)
    shown = _printed(capsys, ["status", "--kubeconfig", kubeconfig, "-n", NS], structured.KIND_FLEET_STATUS)
    fleet = shown["fleet"]
    assert fleet["dryRun"] is None and fleet["paused"] is None and fleet["source"] is None
    assert fleet["breaker"]["open"] is False and fleet["breaker"]["domains"] == [] and not fleet["breaker"]["dryRun"]
    assert fleet["budget"] == {"gpuNodes": 2, "outOfService": 1} and fleet["shards"] == [] and fleet["errors"] == []
    nodes = {n["name"]: n for n in shown["nodes"]}
    assert list(nodes) == ["gpu-a", "gpu-b"]
    a = nodes["gpu-a"]
    assert a["state"] == "draining" and a["since"] == NOW_TEXT and a["schedulable"] is False and a["gpus"] == 8
    assert a["fault"] == {"kind": KIND_ECC_DBE, "code": "ecc_dbe_volatile", "gpus": ["GPU-1"],
                          "action": ACTION_RESET_GPU, "message": "volatile double-bit ECC error", "held": False,
                          "firstSeen": NOW_TEXT, "lastSeen": "2023-11-14T22:13:25Z"}
    assert a["action"] == {"kind": "drain", "attempt": 1, "rung": 0, "name": None, "started": NOW_TEXT,
                           "deadline": "2023-11-14T23:13:20Z", "step": None}
    assert a["blocked"] == {"reason": "pdb", "detail": "work/pdb-llm", "since": NOW_TEXT}
    assert a["heldBy"] == "work/pdb-llm" and a["reason"] == "ecc-dbe" and a["dryRun"] is False
    b = nodes["gpu-b"]
    assert b == {"name": "gpu-b", "state": "healthy", "stateText": "healthy", "dryRun": False, "since": None,
                 "schedulable": True, "excluded": False, "gpus": 4, "gpusInService": 4, "isolatedGPUs": [],
                 "domain": None, "reason": None, "message": None, "fault": None, "watching": [], "action": None,
                 "blocked": None, "heldBy": None, "error": None}


def test_status_says_the_pause_and_the_breaker_the_banner_shows(api: tuple[KubeClient, str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    held = NodeRecord(state=states.HEALTHY, since=NOW, held=_fault())
    _node(client, "gpu-a", held)
    store = BreakerStore(client, NS)
    store.set_pause(Pause(paused=True, by="alice", reason="k8s upgrade", at=NOW))
    store.save(CircuitBreaker(open=True, opened_at=NOW, reason="4 of 5 nodes faulted within 600s",
                              domains=(DomainTrip("rack", "r1", "3 of 4 faulted", NOW),)))
    argv = ["status", "--kubeconfig", kubeconfig, "-n", NS]
    table = _out(capsys, argv)
    assert "PAUSED by alice" in table and "CIRCUIT BREAKER OPEN" in table and "DOMAIN BREAKER OPEN" in table
    fleet = _printed(capsys, argv, structured.KIND_FLEET_STATUS)["fleet"]
    assert fleet["paused"] == {"by": "alice", "reason": "k8s upgrade", "at": NOW_TEXT}
    assert fleet["breaker"]["open"] is True and fleet["breaker"]["openedAt"] == NOW_TEXT
    assert fleet["breaker"]["reason"] == "4 of 5 nodes faulted within 600s"
    assert fleet["breaker"]["domains"] == [{"label": "rack", "value": "r1", "reason": "3 of 4 faulted",
                                            "openedAt": NOW_TEXT}]
    node = _printed(capsys, argv, structured.KIND_FLEET_STATUS)["nodes"][0]
    assert node["fault"] is not None and node["fault"]["held"] is True and node["state"] == "healthy"
    store.set_pause(Pause())
    assert _printed(capsys, argv, structured.KIND_FLEET_STATUS)["fleet"]["paused"] is None


def test_status_in_a_dry_run_says_so_fleet_wide_and_per_node(api: tuple[KubeClient, str],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a")
    _node(client, "gpu-b")
    started = time.time()
    journal = DryRunJournal(client, NS, "replica-a", clock=lambda: started)
    journal.note_record("gpu-a", NodeRecord(state=states.DRAINING, since=NOW, reason="ecc-dbe", fault=_fault()))
    journal.note_breaker({"open": True, "reason": "storm", "opened_at": NOW})
    journal.flush()
    shown = _printed(capsys, ["status", "--kubeconfig", kubeconfig, "-n", NS], structured.KIND_FLEET_STATUS)
    dry = shown["fleet"]["dryRun"]
    assert dry is not None and dry["identity"] == "replica-a" and dry["leftOut"] == 0
    assert dry["started"] == structured.rfc3339(started)
    assert shown["fleet"]["breaker"]["dryRun"] is True and shown["fleet"]["breaker"]["reason"] == "storm"
    nodes = {n["name"]: n for n in shown["nodes"]}
    assert nodes["gpu-a"]["dryRun"] is True and nodes["gpu-a"]["state"] == "draining"
    assert nodes["gpu-a"]["stateText"] == "would drain" and nodes["gpu-a"]["since"] == NOW_TEXT
    assert nodes["gpu-b"]["dryRun"] is False and nodes["gpu-b"]["state"] == "healthy"
    breaker = _printed(capsys, ["breaker", "status", "--kubeconfig", kubeconfig, "-n", NS],
                       structured.KIND_BREAKER_STATUS)["breaker"]
    assert breaker["dryRun"] is True and breaker["open"] is True
    explained = _printed(capsys, ["explain", "gpu-a", "--kubeconfig", kubeconfig, "-n", NS],
                         structured.KIND_NODE_EXPLANATION)
    assert explained["dryRun"] is True and explained["node"] == nodes["gpu-a"]
    assert explained["record"]["state"] == "draining" and explained["explanation"][0].startswith("DRY RUN: ")


def test_an_unreadable_record_is_its_own_state_with_the_error(api: tuple[KubeClient, str],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", annotation="{not json")
    node = _printed(capsys, ["status", "--kubeconfig", kubeconfig, "-n", NS], structured.KIND_FLEET_STATUS)["nodes"][0]
    assert node["state"] == "unreadable" and node["stateText"] == "unreadable"
    assert node["error"] is not None and "not valid JSON" in node["error"] and node["fault"] is None
    explained = _printed(capsys, ["explain", "gpu-a", "--kubeconfig", kubeconfig, "-n", NS],
                         structured.KIND_NODE_EXPLANATION)
    assert explained["node"] == node and explained["record"] is None


# -- explain ------------------------------------------------------------------------------------


def test_explain_is_the_nodes_status_entry_its_record_and_the_words(api: tuple[KubeClient, str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    _node(client, "gpu-a", _draining_on_a_pdb())
    _node(client, "gpu-b")
    flags = ["--kubeconfig", kubeconfig, "-n", NS]
    status = _printed(capsys, ["status", *flags], structured.KIND_FLEET_STATUS)
    text = _out(capsys, ["explain", "gpu-a", *flags])
    shown = _printed(capsys, ["explain", "gpu-a", *flags], structured.KIND_NODE_EXPLANATION)
    assert shown["node"] == status["nodes"][0] and shown["dryRun"] is False
    assert shown["explanation"] == text.splitlines()
    record = shown["record"]
    assert record["state"] == "draining" and record["since"] == NOW_TEXT and record["cordonedByUs"] is True
    assert record["fault"]["firstSeen"] == NOW_TEXT and record["fault"]["kind"] == KIND_ECC_DBE
    assert record["blocked"] == {"reason": "pdb", "detail": "work/pdb-llm", "since": NOW_TEXT}
    assert record["action"]["started"] == NOW_TEXT and record["handled"] == ["ecc-dbe:GPU-1"]
    healthy = _printed(capsys, ["explain", "gpu-b", *flags], structured.KIND_NODE_EXPLANATION)
    assert healthy["record"] is None and healthy["node"] == status["nodes"][1]


def test_record_view_turns_every_time_into_rfc3339_and_keeps_policy_memory() -> None:
    record = NodeRecord(state=states.CORDONED, since=NOW, thermal_hold_ends={"GPU-1": NOW + 60},
                        policy_memory={"thermal": {"GPU-1": {"hot_since": NOW}}},
                        history=(r.HistoryEntry(NOW, "xid", "79", "reboot", "repaired"),))
    view = structured.record_view(r.to_dict(record))
    assert view["thermalHoldEnds"] == {"GPU-1": "2023-11-14T22:14:20Z"}
    assert view["policyMemory"] == {"thermal": {"GPU-1": {"hot_since": NOW}}}  # the policy layer's, as stored
    assert view["history"][0]["at"] == NOW_TEXT and view["history"][0]["outcome"] == "repaired"
    assert "cordoned_by_us" not in view and view["cordonedByUs"] is False


# -- breaker status -----------------------------------------------------------------------------


def test_breaker_status_and_reset_print_a_breaker_status(api: tuple[KubeClient, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    client, kubeconfig = api
    flags = ["--kubeconfig", kubeconfig, "-n", NS]
    closed = _printed(capsys, ["breaker", "status", *flags], structured.KIND_BREAKER_STATUS)["breaker"]
    assert closed == {"open": False, "dryRun": False, "reason": None, "openedAt": None, "resetBy": None,
                      "resetAt": None, "resetRequested": None, "domains": [], "look": None}
    look = Look(opened_at=NOW, until=NOW + 20, reason="12 GPU nodes faulted within 30s", nodes=("gpu-a", "gpu-b"),
                ended_at=NOW + 20, outcome=LOOK_OPENED)
    BreakerStore(client, NS).save(CircuitBreaker(open=True, opened_at=NOW, reason="storm", look=look))
    opened = _printed(capsys, ["breaker", "status", *flags], structured.KIND_BREAKER_STATUS)["breaker"]
    assert opened["open"] is True and opened["reason"] == "storm" and opened["openedAt"] == NOW_TEXT
    assert opened["look"] == {"looking": False, "openedAt": NOW_TEXT, "until": "2023-11-14T22:13:40Z",
                              "reason": "12 GPU nodes faulted within 30s", "nodes": ["gpu-a", "gpu-b"],
                              "endedAt": "2023-11-14T22:13:40Z", "outcome": LOOK_OPENED}
    assert "circuit breaker: open (storm)" in _out(capsys, ["breaker", "status", *flags])
    reset = json.loads(_out(capsys, ["breaker", "reset", *flags, "-o", "json"]))
    assert structured.validate(reset, structured.KIND_BREAKER_STATUS) == []
    assert reset["breaker"]["open"] is False and reset["breaker"]["resetBy"] is not None
    assert reset["breaker"]["resetAt"] is not None


# -- the schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("broken", "problem"), [
    ({"apiVersion": "v", "kind": "BreakerStatus"}, "$.breaker: missing"),
    ({"apiVersion": "v", "kind": "BreakerStatus", "breaker": None}, "$.breaker: null"),
    ({"apiVersion": "v", "kind": "BreakerStatus", "extra": 1, "breaker": {}}, "$.extra: not in BreakerStatus"),
    ({"apiVersion": "v", "kind": "BreakerStatus", "breaker": {
        "open": "no", "dryRun": False, "reason": "-", "openedAt": 1700000000.0, "resetBy": None, "resetAt": None,
        "resetRequested": None, "domains": [{"label": "rack"}], "look": None}},
     "$.breaker.open: 'no' is not a boolean"),
])
def test_validate_names_what_differs_from_the_schema(broken: dict[str, Any], problem: str) -> None:
    problems = structured.validate(broken, structured.KIND_BREAKER_STATUS)
    assert any(p.startswith(problem) for p in problems), problems


def test_validate_refuses_an_epoch_an_empty_string_and_a_missing_nested_key() -> None:
    breaker = {"open": False, "dryRun": False, "reason": "", "openedAt": 1700000000.0, "resetBy": None,
               "resetAt": None, "resetRequested": None, "domains": [{"label": "rack"}], "look": None}
    problems = structured.validate(breaker, "Breaker")
    assert "$.reason: '' is not a string" in problems
    assert "$.openedAt: 1700000000.0 is not a time" in problems
    assert "$.domains[0].value: missing" in problems


def test_every_object_a_field_names_is_in_the_schema() -> None:
    named = {f.type.strip("[]") for fields in structured.SCHEMA.values() for f in fields}
    assert named - set(structured.SCHEMA) - {"string", "integer", "boolean", "time", "object"} == set()
    assert set(structured.SCHEMA) - named == set(structured.KINDS)  # every other object is used by one


def test_docs_output_md_shows_the_schema_as_printed() -> None:
    """docs/output.md carries structured.markdown() (`python -m gpuremediate.structured` prints it)."""
    page = DOCS.read_text()
    assert structured.markdown() in page, "docs/output.md's schema is stale: paste structured.markdown() in"
