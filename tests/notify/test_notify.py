"""The webhook notifier: bodies, retries, a receiver that is down, a full queue, the URL from a Secret."""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuremediate.obs import notify
from gpuremediate.obs.notify import Notification, NotifyError, WebhookNotifier
from gpuremediate.state import states
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
    assert receiver.bodies == [{"kind": "quarantined", "node": "gpu-node-3", "reason": "repeat-offender",
                                "message": "3 repairs within 7d", "time": "1970-01-01T00:00:00Z",
                                "cluster": "prod-a"}]


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
