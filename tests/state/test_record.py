"""The record codec: round trips, malformed input, the Node helpers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuremediate.vocab import record as r
from gpuremediate.vocab import states

SETTINGS = settings(max_examples=150, deadline=None)

times = st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False)
words = st.text(max_size=20)
json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
faults = st.builds(
    r.Fault,
    kind=words,
    code=words,
    gpus=st.lists(words, max_size=3).map(tuple),
    fingerprint=words,
    action=words,
    first_seen=times,
    last_seen=times,
    message=words,
    urgent=st.booleans(),
    diagnostics=st.none() | st.builds(r.Diagnostics, outcome=words, job=words, location=words, at=times),
)
actions = st.builds(
    r.ActionInProgress,
    kind=words,
    name=words,
    attempt=st.integers(1, 10),
    started=times,
    deadline=st.none() | times,
    rung=st.integers(0, 5),
)
history = st.builds(r.HistoryEntry, at=times, kind=words, code=words, action=words, outcome=words)
blocked = st.builds(r.Blocked, reason=st.sampled_from(r.BLOCK_REASONS), detail=words, since=times)
records = st.builds(
    r.NodeRecord,
    state=st.sampled_from(states.STATES),
    since=times,
    reason=words,
    message=words,
    fault=st.none() | faults,
    action=st.none() | actions,
    cordoned_by_us=st.booleans(),
    was_unschedulable=st.booleans(),
    history=st.lists(history, max_size=r.HISTORY_LIMIT).map(tuple),
    handled=st.lists(words, max_size=10).map(tuple),
    blocked=st.none() | blocked,
    policy_memory=st.dictionaries(st.text(max_size=5), json_values, max_size=3),
    stopped=st.booleans(),
    thermal_hold_ends=st.dictionaries(st.text(max_size=8), times, max_size=2),
)


@SETTINGS
@given(records)
def test_any_record_round_trips(record: r.NodeRecord) -> None:
    text = r.encode(record)
    assert r.decode(text) == record
    assert r.encode(r.decode(text)) == text  # stable: sorted keys, compact


@SETTINGS
@given(st.text(max_size=200))
def test_decode_of_any_text_is_a_record_or_record_error(text: str) -> None:
    try:
        result = r.decode(text)
    except r.RecordError:
        return
    assert isinstance(result, r.NodeRecord)


@SETTINGS
@given(records, st.data())
def test_decode_of_a_mangled_record_is_a_record_or_record_error(record: r.NodeRecord, data: st.DataObject) -> None:
    doc = r.to_dict(record)
    key = data.draw(st.sampled_from(sorted(doc)))
    doc[key] = data.draw(json_values)
    try:
        result = r.decode(json.dumps(doc))
    except r.RecordError:
        return
    assert isinstance(result, r.NodeRecord)


def test_encoding_is_compact_sorted_and_versioned() -> None:
    text = r.encode(r.NodeRecord(state=states.CORDONED, since=5.0, reason="thermal"))
    assert " " not in text
    doc = json.loads(text)
    assert doc["v"] == 1 and doc["state"] == "cordoned"
    assert list(doc) == sorted(doc)


def _doc(**overrides: Any) -> str:
    doc = r.to_dict(r.NodeRecord(state=states.DRAINING, since=1.0))
    doc.update(overrides)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "record must be a JSON object, not array"),
        ('"draining"', "must be a JSON object, not string"),
        (_doc(v=2), "unknown record version 2"),
        (_doc(v="1"), "record.v must be int, not string"),
        (_doc(v=True), "record.v must be int, not boolean"),
        (json.dumps({"state": "healthy"}), "record.v is missing"),
        (json.dumps({"v": 1}), "record.state is missing"),
        (_doc(state="broken"), "unknown state 'broken'"),
        (_doc(state=3), "record.state must be str, not number"),
        (_doc(since="yesterday"), "record.since must be a number, not string"),
        (_doc(since=True), "record.since must be a number"),
        (_doc(cordoned_by_us="yes"), "record.cordoned_by_us must be bool, not string"),
        (_doc(was_unschedulable=1), "record.was_unschedulable must be bool, not number"),
        (_doc(handled=["a", 3]), "record.handled[1] must be a string, not number"),
        (_doc(history=[{"at": "x"}]), "record.history[0].at must be a number"),
        (_doc(history={"at": 1}), "record.history must be list, not object"),
        (_doc(fault={"kind": "xid"}), "record.fault.fingerprint is missing"),
        (_doc(fault=[]), "record.fault must be a JSON object, not array"),
        (_doc(action={"kind": "reboot", "attempt": 0}), "record.action.attempt must be >= 1"),
        (_doc(blocked={"reason": "bored", "since": 1}), "blocked.reason 'bored' is not one of"),
        (_doc(policy_memory=[1]), "record.policy_memory must be dict, not array"),
        ('{"v": 1, "state": "healthy", "since": NaN}', "non-finite number NaN"),
        ('{"v": 1, "state": "healthy", "since": 1e999}', "record.since must be a number"),
        (_doc(since=1e308), "record.since = 1e+308 is not a plausible time"),
        (_doc(since=-5), "record.since = -5.0 is not a plausible time"),
        (_doc(fault={"kind": "xid", "fingerprint": "f", "action": "reboot", "first_seen": 1e308}),
         "record.fault.first_seen = 1e+308 is not a plausible time"),
        (_doc(action={"kind": "reboot", "attempt": 1, "started": 1.0, "deadline": 1e300}),
         "record.action.deadline = 1e+300 is not a plausible time"),
        (_doc(blocked={"reason": "pdb", "since": 1e17}), "record.blocked.since = 1e+17 is not a plausible time"),
        (_doc(thermal_hold_ends=[1]), "record.thermal_hold_ends must be dict, not array"),
        (_doc(thermal_hold_ends={"GPU-1": "soon"}), "record.thermal_hold_ends.GPU-1 must be a number, not string"),
        (_doc(thermal_hold_ends={"GPU-1": 1e300}), "record.thermal_hold_ends.GPU-1 = 1e+300 is not a plausible"),
    ],
)
def test_malformed_records_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(r.RecordError, match=None) as info:
        r.decode(text)
    assert fragment in str(info.value)


def test_unknown_keys_are_ignored_and_missing_optional_keys_default() -> None:
    decoded = r.decode(json.dumps({"v": 1, "state": "quarantined", "future_field": {"x": 1}}))
    assert decoded == r.NodeRecord(state=states.QUARANTINED)


def test_oversized_lists_are_cut_to_their_limits_newest_kept() -> None:
    entries = [
        {"at": float(i), "kind": "xid", "code": "79", "action": "reboot", "outcome": "repaired"} for i in range(30)
    ]
    decoded = r.decode(_doc(history=entries, handled=[f"fp{i}" for i in range(100)]))
    assert len(decoded.history) == r.HISTORY_LIMIT and decoded.history[-1].at == 29.0
    assert len(decoded.handled) == r.HANDLED_LIMIT and decoded.handled[-1] == "fp99"


def test_encode_refuses_policy_memory_that_is_not_json() -> None:
    with pytest.raises(r.RecordError, match="cannot be encoded"):
        r.encode(r.NodeRecord(policy_memory={"t": object()}))
    with pytest.raises(r.RecordError, match="cannot be encoded"):
        r.encode(r.NodeRecord(policy_memory={"t": float("nan")}))


def test_constructing_a_record_in_an_unknown_state_fails() -> None:
    with pytest.raises(r.RecordError, match="unknown state 'sleeping'"):
        r.NodeRecord(state="sleeping")


def test_add_handled_dedupes_keeps_newest_and_is_bounded() -> None:
    record = r.add_handled(r.NodeRecord(), "a", "b", "a", "")
    assert record.handled == ("a", "b")
    assert r.add_handled(record, "a").handled == ("b", "a")
    many = r.add_handled(record, *[f"x{i}" for i in range(200)])
    assert len(many.handled) == r.HANDLED_LIMIT and many.handled[-1] == "x199"


def test_add_history_is_bounded() -> None:
    record = r.NodeRecord()
    for i in range(25):
        record = r.add_history(record, r.HistoryEntry(float(i), "xid", "79", "reboot", r.OUTCOME_REPAIRED))
    assert [e.at for e in record.history] == [float(i) for i in range(5, 25)]


def test_block_keeps_since_while_the_same_block_persists() -> None:
    first = r.block(r.NodeRecord(state=states.DRAINING), r.BLOCK_PDB, "ns/pdb-a", 10.0)
    assert r.block(first, r.BLOCK_PDB, "ns/pdb-a", 20.0).blocked == r.Blocked("pdb", "ns/pdb-a", 10.0)
    assert r.block(first, r.BLOCK_PDB, "ns/pdb-b", 20.0).blocked == r.Blocked("pdb", "ns/pdb-b", 20.0)
    assert r.unblock(first).blocked is None


def test_start_action_sets_deadline() -> None:
    record = r.start_action(r.NodeRecord(state=states.REPAIRING), "reboot", "gpr-n1-abc-1", 1, 100.0, 600.0)
    assert record.action == r.ActionInProgress("reboot", "gpr-n1-abc-1", 1, 100.0, 700.0)


def _node(annotations: dict[str, str] | None = None, unschedulable: bool | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"metadata": {"name": "gpu-1"}}
    if annotations is not None:
        node["metadata"]["annotations"] = annotations
    if unschedulable is not None:
        node["spec"] = {"unschedulable": unschedulable}
    return node


def test_record_from_node() -> None:
    assert r.record_from_node(_node()) is None
    assert r.record_from_node(_node({"other": "x"})) is None
    stored = r.NodeRecord(state=states.CORDONED, since=3.0, reason="thermal")
    assert r.record_from_node(_node({r.RECORD_ANNOTATION: r.encode(stored)})) == stored
    broken = r.record_from_node(_node({r.RECORD_ANNOTATION: "{"}))
    assert isinstance(broken, r.RecordError)


def test_node_patch_sets_annotation_label_and_optionally_cordon_and_precondition() -> None:
    record = r.NodeRecord(state=states.DRAINING, since=2.0, reason="xid-79")
    patch = r.node_patch(record)
    assert patch == {
        "metadata": {
            "annotations": {r.RECORD_ANNOTATION: r.encode(record)},
            "labels": {r.STATE_LABEL: "draining"},
        }
    }
    full = r.node_patch(record, unschedulable=True, resource_version="42")
    assert full["spec"] == {"unschedulable": True}
    assert full["metadata"]["resourceVersion"] == "42"
    assert r.record_from_node(full) == record  # the patch, applied, reads back as the record


def test_node_unschedulable() -> None:
    assert not r.node_unschedulable(_node())
    assert r.node_unschedulable(_node(unschedulable=True))
    assert not r.node_unschedulable(_node(unschedulable=False))


def test_occurrence_names_each_fault_occurrence_apart() -> None:
    from gpuremediate.vocab.record import Fault, NodeRecord, occurrence

    def with_fault(first_seen: float) -> NodeRecord:
        fault = Fault("xid", "48", ("GPU-1",), "xid:GPU-1:48", "reset-gpu", first_seen, first_seen, "m")
        return NodeRecord(state="draining", since=first_seen, fault=fault)

    assert occurrence(with_fault(100.0)) == occurrence(with_fault(100.0))  # stable: restart-safe
    assert occurrence(with_fault(100.0)) != occurrence(with_fault(200.0))  # the same XID again is a new one
    assert occurrence(NodeRecord(state="validating", since=5.0)) == "since-5000"


def test_a_huge_timeout_gives_a_deadline_the_record_can_hold() -> None:
    """A policy timeout of 1e300 must not make the controller write a record it cannot read back."""
    started = r.start_action(r.NodeRecord(state=states.REPAIRING), "reboot", "job", 1, 1000.0, 1e300)
    assert r.decode(r.encode(started)) == started
    created = r.mark_created(started, 1001.0, 1e300)
    assert r.decode(r.encode(created)).action == created.action


def test_created_at_round_trips_and_marks_the_action_created() -> None:
    started = r.start_action(r.NodeRecord(state=states.REPAIRING), "rma", "cr-1", 1, 1000.0, 30.0)
    assert not started.action.created  # type: ignore[union-attr]
    created = r.mark_created(started, 1002.0, 30.0)
    action = created.action
    assert action is not None and action.created and action.created_at == 1002.0
    assert action.deadline == 1032.0  # from the object's creation, not from the start
    assert r.decode(r.encode(created)) == created
    assert r.mark_created(created, 2000.0, 30.0) == created  # the first creation time stays


def test_a_record_from_before_ladders_reads_with_rung_0_and_no_diagnostics() -> None:
    """The previous version wrote no ``rung`` and no ``diagnostics``: such a record still reads."""
    old = ('{"v":1,"state":"repairing","since":5,"fault":{"kind":"xid","code":"79","fingerprint":"f","action":'
           '"reset-gpu","first_seen":1,"last_seen":1},"action":{"kind":"reset-gpu","name":"j","attempt":2,'
           '"started":4}}')
    record = r.decode(old)
    assert record.action is not None and record.action.rung == 0 and record.action.attempt == 2
    assert record.fault is not None and record.fault.diagnostics is None


def test_a_record_from_before_thermal_hold_ends_reads_with_none_and_one_with_them_round_trips() -> None:
    """A watched GPU's hold end (issue 24) is a new optional key: the previous version's record still reads,
    and a previous controller reading the new one ignores it (unknown keys are ignored)."""
    old = ('{"v":1,"state":"healthy","since":5,"policy_memory":{"v":1,"thermal":{"GPU-1":{"hot_since":5,'
           '"cool_since":null,"cordoned_since":null,"cause":""}}}}')
    assert r.decode(old).thermal_hold_ends == {}
    watched = r.NodeRecord(since=5.0, thermal_hold_ends={"GPU-1": 65.0})
    assert r.decode(r.encode(watched)) == watched and r.decode(r.encode(watched)).thermal_hold_ends == {"GPU-1": 65.0}
    assert r.decode(r.encode(watched).replace('"GPU-1":65.0', '"GPU-1":null')).thermal_hold_ends == {}


def test_rung_and_diagnostics_round_trip_and_bad_values_are_named() -> None:
    fault = r.Fault("xid", "79", (), "f", "reset-gpu", 1.0, 1.0, "",
                    diagnostics=r.Diagnostics(r.DIAGNOSTICS_TIMED_OUT, "gpur-diagnostics-n1", "/var/log/x.log", 3.0))
    action = r.ActionInProgress("reboot", "", 1, 4.0, rung=1)
    record = r.NodeRecord(state=states.REPAIRING, since=5.0, fault=fault, action=action)
    assert r.decode(r.encode(record)) == record
    bad = r.encode(record).replace('"rung":1', '"rung":-1')
    with pytest.raises(r.RecordError, match=r"record\.action\.rung must be >= 0"):
        r.decode(bad)
    no_outcome = r.encode(record).replace(',"outcome":"timed-out"', "")
    with pytest.raises(r.RecordError, match=r"record\.fault\.diagnostics\.outcome is missing"):
        r.decode(no_outcome)


def test_start_action_keeps_the_rung_of_the_attempt_it_starts() -> None:
    """The next attempt is written with name "" and its rung; creating its object must not lose the rung."""
    pending = r.NodeRecord(state=states.REPAIRING, action=r.ActionInProgress("reboot", "", 1, 4.0, rung=2))
    started = r.start_action(pending, "reboot", "gpur-reboot-n1-1", 1, 5.0, 60.0)
    assert started.action is not None and started.action.rung == 2 and started.action.name == "gpur-reboot-n1-1"
    assert r.start_action(r.NodeRecord(), "drain", "", 1, 5.0).action.rung == 0  # type: ignore[union-attr]


def test_a_record_is_stamped_with_its_node_and_a_copy_on_another_node_is_foreign() -> None:
    node = {"metadata": {"name": "gpu-a", "uid": "uid-a"}}
    written = r.node_patch(r.NodeRecord(state=states.DRAINING), owner=node)["metadata"]["annotations"]
    on_a = {"metadata": {"name": "gpu-a", "uid": "uid-a", "annotations": written}}
    mine = r.record_from_node(on_a)
    assert isinstance(mine, r.NodeRecord) and (mine.node, mine.node_uid) == ("gpu-a", "uid-a")
    copied = r.record_from_node({"metadata": {"name": "gpu-b", "uid": "uid-b", "annotations": written}})
    assert isinstance(copied, r.RecordError) and "written on node 'gpu-a', not on 'gpu-b'" in str(copied)
    recreated = r.record_from_node({"metadata": {"name": "gpu-a", "uid": "uid-new", "annotations": written}})
    assert isinstance(recreated, r.RecordError) and "uid uid-a" in str(recreated)


def test_a_record_from_before_owners_were_stamped_is_taken() -> None:
    old = {r.RECORD_ANNOTATION: r.encode(r.NodeRecord(state=states.DRAINING))}
    taken = r.record_from_node({"metadata": {"name": "gpu-b", "uid": "uid-b", "annotations": old}})
    assert isinstance(taken, r.NodeRecord) and taken.state == states.DRAINING


def test_the_largest_record_the_controller_writes_stays_small() -> None:
    """Every list at its limit, every free text long (a plugin's status message may be any length): the record
    written stays under 16 KiB of a Node's 256 KiB of annotations (docs/operations.md gives the figure)."""
    long = "m" * 50_000
    gpu = "GPU-" + "0" * 36
    fault = r.Fault(kind="xid", code="79", gpus=tuple(f"{gpu[:-1]}{i}" for i in range(8)),
                    fingerprint=f"xid:79:{gpu}:1", action="reboot", first_seen=1.0, last_seen=2.0, message=long)
    action = r.ActionInProgress(kind="reset-gpu", name="gpur-reset-gpu-" + "n" * 40, attempt=3, started=1.0,
                                deadline=2.0, detail="d" * 200, gpu_ids=tuple(str(i) for i in range(8)))
    record = r.NodeRecord(
        state=states.DRAINING, since=1.0, reason="xid-79", message=long, fault=fault, action=action,
        history=tuple(r.HistoryEntry(at=float(i), kind="xid", code="79", action="reboot",
                                     outcome=r.OUTCOME_REPAIR_FAILED) for i in range(r.HISTORY_LIMIT)),
        handled=tuple(f"xid:79:{gpu}:{i}" for i in range(r.HANDLED_LIMIT)),
        blocked=r.Blocked(r.BLOCK_PDB, long, 1.0),
        policy_memory={"thermal": {f"{gpu[:-1]}{i}": {"hot_since": 1.0, "cool_since": 2.0} for i in range(8)}},
        node="n" * 63, node_uid="u" * 36)
    written = r.node_patch(record)["metadata"]["annotations"][r.RECORD_ANNOTATION]
    assert len(written.encode()) < 16 * 1024, len(written.encode())
    back = r.decode(written)
    assert back.fault is not None and len(back.fault.message) == r.TEXT_LIMIT and back.message.endswith("…")
