"""The webhook notifier: bodies, retries, a receiver that is down, a full queue, the URL from a Secret."""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuremediate.obs import notify
from gpuremediate.obs.notify import Notification, NotifyError, WebhookNotifier
from gpuremediate.policy.config import PolicyError, default_policy, loads_policy
from gpuremediate.policy.workflow import NOTIFY_DEFAULT_EVENTS, NOTIFY_EVENTS, NOTIFY_FIELDS
from gpuremediate.vocab import states
from sim.waiting import wait_for

NOTE = Notification(notify.KIND_QUARANTINED, "gpu-node-3", "repeat-offender", "3 repairs within 7d", 0.0)


class Receiver:
    """A webhook receiver on loopback answering the statuses it is given, in order (then 200)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.bodies: list[dict[str, object]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                outer.bodies.append(json.loads(self.rfile.read(length)))
                status = outer.statuses.pop(0) if outer.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver([])
    yield r
    r.close()


def no_sleep(_: float) -> None:
    pass


def test_generic_json_body_is_posted(receiver: Receiver) -> None:
    assert WebhookNotifier(receiver.url, cluster="prod-a", sleep=no_sleep).deliver(NOTE)
    assert receiver.bodies == [{"kind": "quarantined", "node": "gpu-node-3", "nodes": ["gpu-node-3"], "from": "",
                                "to": "", "reason": "repeat-offender", "message": "3 repairs within 7d",
                                "time": "1970-01-01T00:00:00Z", "cluster": "prod-a"}]


def test_slack_body_is_one_text(receiver: Receiver) -> None:
    WebhookNotifier(receiver.url, fmt="slack", sleep=no_sleep).deliver(NOTE)
    assert receiver.bodies == [{"text": "gpuremediate: quarantined on gpu-node-3 (repeat-offender): "
                                        "3 repairs within 7d"}]


def test_server_errors_are_retried_with_backoff(receiver: Receiver) -> None:
    receiver.statuses = [500, 503]
    slept: list[float] = []
    assert WebhookNotifier(receiver.url, retries=3, backoff_s=0.5, sleep=slept.append).deliver(NOTE)
    assert len(receiver.bodies) == 3 and slept == [0.5, 1.0]


def test_a_refused_body_is_not_retried(receiver: Receiver) -> None:
    receiver.statuses = [400]
    assert not WebhookNotifier(receiver.url, retries=3, sleep=no_sleep).deliver(NOTE)
    assert len(receiver.bodies) == 1


def test_a_receiver_that_is_down_costs_the_retries_only() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    notifier = WebhookNotifier(f"http://127.0.0.1:{port}/", retries=2, timeout_s=1.0, sleep=no_sleep)
    assert not notifier.deliver(NOTE)


def test_notify_never_blocks_and_counts_drops() -> None:
    gate = threading.Event()

    def slow(_url: str, _data: bytes, _timeout: float) -> int:
        gate.wait(5)
        return 200

    notifier = WebhookNotifier("http://127.0.0.1:1/", queue_size=2, sender=slow, sleep=no_sleep).start()
    results = [notifier.notify(NOTE) for _ in range(6)]
    assert results.count(False) >= 3 and notifier.dropped == results.count(False)
    gate.set()
    wait_for(lambda: notifier.sent == results.count(True), timeout=10, describe="the queued notifications sent")
    notifier.stop()


@pytest.mark.parametrize(
    ("to_state", "reason", "kind"),
    [
        (states.QUARANTINED, states.REPEAT_OFFENDER, notify.KIND_QUARANTINED),
        (states.DRAINING, states.REPAIR_FAILED, notify.KIND_REPAIR_FAILED),
        (states.HEALTHY, states.VALIDATION_PASSED, None),
        (states.DRAINING, "xid-79", None),
    ],
)
def test_only_transitions_that_need_a_person_notify(to_state: str, reason: str, kind: str | None) -> None:
    note = notify.for_transition("n", states.REPAIRING, to_state, reason, "m", 1.0)
    assert (note.kind if note else None) == kind


def test_url_from_a_secret() -> None:
    encoded = base64.b64encode(b"https://hooks.example/T0/B0/x\n").decode()
    assert notify.url_from_secret({"metadata": {"name": "s"}, "data": {"url": encoded}}) == "https://hooks.example/T0/B0/x"
    assert notify.url_from_secret({"stringData": {"webhook": "http://r:8/"}}, key="webhook") == "http://r:8/"
    with pytest.raises(NotifyError, match="Secret s: no key 'url'"):
        notify.url_from_secret({"metadata": {"name": "s"}, "data": {}})
    with pytest.raises(NotifyError, match="not base64"):
        notify.url_from_secret({"metadata": {"name": "s"}, "data": {"url": "%%%"}})
    with pytest.raises(NotifyError, match="must start with https://"):
        notify.url_from_secret({"stringData": {"url": "ftp://x"}})


def test_bad_format_is_refused() -> None:
    with pytest.raises(NotifyError, match="expected one of json, slack"):
        WebhookNotifier("https://x/", fmt="xml")


# -- [notifications].events and .template -------------------------------------------------------------


def test_the_notifier_kinds_are_the_policys_events_and_the_template_fields_are_filled() -> None:
    assert notify.KINDS == NOTIFY_EVENTS and NOTIFY_DEFAULT_EVENTS == (
        notify.KIND_QUARANTINED, notify.KIND_REPAIR_FAILED, notify.KIND_BREAKER_OPEN, notify.KIND_DRAIN_BLOCKED)
    every = "|".join("{" + f + "}" for f in NOTIFY_FIELDS)
    note = Notification(notify.KIND_RETURNED, "gpu-7", "validation-passed", "validation Job v passed", 86400.0,
                        from_state=states.VALIDATING, to_state=states.HEALTHY)
    assert notify.render(note, every, "prod") == ("gpu-7|validating|healthy|validation-passed|validation Job v passed|"
                                                  "prod|returned|1970-01-02T00:00:00Z")


@pytest.mark.parametrize(
    ("from_state", "to_state", "reason", "kind"),
    [
        (states.REPAIRING, states.VALIDATING, states.REPAIR_COMPLETE, notify.KIND_REPAIRED),
        (states.VALIDATING, states.HEALTHY, states.VALIDATION_PASSED, notify.KIND_RETURNED),
        (states.CORDONED, states.HEALTHY, states.THERMAL_CLEARED, notify.KIND_RETURNED),
        ("unreadable", states.HEALTHY, states.RECORD_MALFORMED, None),  # a record replaced: not a return
        (states.HEALTHY, states.DRAINING, "xid-79", None),  # a drain starts when admitted, not here
        (states.VALIDATING, states.QUARANTINED, states.VALIDATION_FAILED, notify.KIND_QUARANTINED),
    ],
)
def test_every_repair_step_notifies_when_chosen(from_state: str, to_state: str, reason: str,
                                                kind: str | None) -> None:
    note = notify.for_transition("gpu-7", from_state, to_state, reason, "m", 1.0, NOTIFY_EVENTS)
    assert (note.kind if note else None) == kind
    if note is not None:
        assert (note.node, note.from_state, note.to_state) == ("gpu-7", from_state, to_state)
    if kind in (notify.KIND_REPAIRED, notify.KIND_RETURNED):  # not by default: the default is unchanged
        assert notify.for_transition("gpu-7", from_state, to_state, reason, "m", 1.0) is None


def test_kinds_not_chosen_are_not_queued() -> None:
    notifier = WebhookNotifier("http://127.0.0.1:1/", sleep=no_sleep)
    returned = Notification(notify.KIND_RETURNED, "gpu-7", "validation-passed", "", 0.0)
    assert not notifier.notify(returned) and notifier.dropped == 0
    chosen = WebhookNotifier("http://127.0.0.1:1/", sleep=no_sleep, events=[notify.KIND_RETURNED])
    assert chosen.notify(returned) and not chosen.notify(NOTE)


def test_a_template_is_slacks_text_and_the_json_bodys_text(receiver: Receiver) -> None:
    template = "[{cluster}] {node}: {from} → {to} ({reason}) {message}"
    note = notify.drain_started("gpu-node-3", states.DRAINING, states.DRAINING, "xid-79", "XID 79 on GPU 3", 0.0)
    WebhookNotifier(receiver.url, fmt="slack", cluster="prod", template=template, sleep=no_sleep,
                    events=NOTIFY_EVENTS).deliver(note)
    WebhookNotifier(receiver.url, cluster="prod", template=template, sleep=no_sleep).deliver(note)
    slack, generic = receiver.bodies
    text = "[prod] gpu-node-3: draining → draining (xid-79) drain started: XID 79 on GPU 3"
    assert slack == {"text": text}
    assert generic["text"] == text and generic["kind"] == "drain-started" and generic["node"] == "gpu-node-3"


def test_a_breaker_notification_names_the_nodes_whose_faults_opened_it(receiver: Receiver) -> None:
    names = tuple(f"gpu-{i:02d}" for i in range(25))
    note = Notification(notify.KIND_BREAKER_OPEN, "", "breaker-open", "25 of 40 faulted", 0.0, nodes=names)
    WebhookNotifier(receiver.url, fmt="slack", sleep=no_sleep).deliver(note)
    WebhookNotifier(receiver.url, sleep=no_sleep).deliver(note)
    slack, generic = receiver.bodies
    assert slack["text"].startswith("gpuremediate: breaker-open on gpu-00, gpu-01, ")
    assert "gpu-19 (+5 more) (breaker-open): 25 of 40 faulted" in slack["text"]
    assert generic["node"] == "" and generic["nodes"] == list(names)


@pytest.mark.parametrize(("text", "error"), [
    ('events = ["quarantined", "rebooted"]', "notifications.events[1]: expected one of quarantined, repair-failed"),
    ('template = "{node} {pod}"', "notifications.template: unknown field {pod}; the fields: {node}, {from}"),
    ('template = "{node"', "notifications.template: "),
    ('template = "{node.__class__}"', "unknown field {node.__class__}"),
    ('template = "{node:{to}}"', "a field's format must not hold another field"),
])
def test_bad_events_or_templates_are_refused_naming_the_key(text: str, error: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(error)):
        loads_policy(f"[notifications]\n{text}\n", "policy.toml")


def test_the_policy_reads_events_and_a_template() -> None:
    cfg = loads_policy('[notifications]\nevents = ["quarantined", "drain-started", "returned"]\n'
                       'template = "{node} back ({reason}) {{ok}}"\n', "p").cluster.notifications
    assert cfg.events == ("quarantined", "drain-started", "returned")
    note = Notification(notify.KIND_RETURNED, "n1", "validation-passed", "", 0.0)
    assert notify.render(note, cfg.template) == "n1 back (validation-passed) {ok}"
    assert default_policy().cluster.notifications.events == NOTIFY_DEFAULT_EVENTS
    assert default_policy().cluster.notifications.template == ""
