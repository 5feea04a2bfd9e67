"""The client against real kube-apiserver v1.28.7 responses, replayed byte for byte."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuremediate.kube import errors
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import CONFIGMAPS, LEASES, NODES, PODS, Resource

from .replay import Canned, ReplayServer


@pytest.fixture()
def replay() -> Iterator[ReplayServer]:
    server = ReplayServer().start()
    yield server
    server.stop()


def make_client(url: str, **kwargs: object) -> KubeClient:
    options: dict[str, object] = {"backoff_base": 0.01, "backoff_cap": 0.05, "retry_after_cap": 0.2, **kwargs}
    return KubeClient(ClusterConfig(server=url, token_source=StaticToken("t0k")), **options)  # type: ignore[arg-type]


@pytest.fixture()
def client(replay: ReplayServer) -> Iterator[KubeClient]:
    c = make_client(replay.url)
    yield c
    c.close()


def test_404_missing_node_is_not_found_with_details(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("01", "get missing node")
    with pytest.raises(errors.NotFound) as caught:
        client.get(NODES, "does-not-exist")
    assert caught.value.code == 404
    assert caught.value.reason == "NotFound"
    assert caught.value.details == {"name": "does-not-exist", "kind": "nodes"}
    assert replay.requests[0].path == "/api/v1/nodes/does-not-exist"
    assert replay.requests[0].headers["Authorization"] == "Bearer t0k"
    assert replay.requests[0].headers["User-Agent"].startswith("gpuremediate/")


def test_404_unknown_resource_type_has_empty_details(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("01", "unknown resource type")
    widgets = Resource("", "v1", "widgetz", "Widget", True)
    with pytest.raises(errors.NotFound) as caught:
        client.get(widgets, "x", "capture")
    assert caught.value.details == {}
    assert caught.value.message == "the server could not find the requested resource"


def test_409_already_exists_vs_conflict(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("02")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-dup"}}
    with pytest.raises(errors.AlreadyExists) as exists:
        client.create(CONFIGMAPS, body, "capture")
    assert isinstance(exists.value, errors.Conflict)
    replay.add_exchange("03")
    stale = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-put", "resourceVersion": "729"}}
    with pytest.raises(errors.Conflict) as conflict:
        client.replace(CONFIGMAPS, "cm-put", stale, "capture")
    assert not isinstance(conflict.value, errors.AlreadyExists)
    assert "the object has been modified" in conflict.value.message
    assert len(replay.requests) == 2  # neither 409 is retried


def test_delete_preconditions_send_delete_options_and_409(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("11", "DELETE uid mismatch")
    with pytest.raises(errors.Conflict) as caught:
        client.delete(CONFIGMAPS, "cm-pre", "capture", preconditions={"uid": "nope"}, grace_period_seconds=0,
                      propagation_policy="Foreground")
    assert "UID in the precondition" in caught.value.message
    sent = json.loads(replay.requests[0].body)
    assert sent == {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                    "propagationPolicy": "Foreground", "preconditions": {"uid": "nope"}}
    assert replay.requests[0].headers["Content-Type"] == "application/json"


def test_delete_returns_status_or_object(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("12", "DELETE plain cm")
    replay.add_exchange("12", "DELETE (finalizer present)")
    status = client.delete(CONFIGMAPS, "cm-plain", "capture")
    assert status["kind"] == "Status" and status["status"] == "Success"
    held = client.delete(CONFIGMAPS, "cm-fin", "capture")
    assert held["kind"] == "ConfigMap" and held["metadata"]["deletionTimestamp"]


def test_410_list_with_old_resource_version(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("23")
    with pytest.raises(errors.Gone) as caught:
        client.list_page(PODS, "capture", resource_version="831", resource_version_match="Exact")
    assert caught.value.reason == "Expired"
    assert replay.requests[0].query == {"resourceVersion": "831", "resourceVersionMatch": "Exact"}


def test_pagination_follows_continue(replay: ReplayServer, client: KubeClient) -> None:
    for step in ("page 1 limit=1", "page 2 via continue", "page 3 via continue"):
        replay.add_exchange("18", step)
    result = client.list(PODS, "capture", label_selector="case=list", limit=1)
    assert [p["metadata"]["name"] for p in result["items"]] == ["list-a", "list-b", "list-c"]
    assert result["metadata"] == {"resourceVersion": "822"}
    queries = [r.query for r in replay.requests]
    assert queries[0] == {"labelSelector": "case=list", "limit": "1"}
    assert "continue" in queries[1] and queries[1]["continue"] != queries[2]["continue"]
    assert len({r.connection for r in replay.requests}) == 1  # keep-alive across pages


def test_expired_continue_token_restarts_unpaged(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("18", "page 1 limit=1")
    replay.add_exchange("18", "continue token from before an etcd compaction")
    replay.add_exchange("18", "limit=0 (no paging)")
    result = client.list(PODS, "capture", label_selector="case=list", limit=1)
    assert [p["metadata"]["name"] for p in result["items"]] == ["rc-a", "rc-b", "rc-c"]
    assert "limit" not in replay.requests[2].query and "continue" not in replay.requests[2].query


def test_garbage_continue_token_is_bad_request(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("18", "garbage continue token")
    with pytest.raises(errors.BadRequest, match="invalid continue token"):
        client.list_page(PODS, "capture", continue_="garbage", limit=1)


def test_watch_stream_events_and_bookmarks(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("21")
    events = list(client.watch(PODS, "capture", resource_version="825", label_selector="case=watch",
                               timeout_seconds=10))
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED", "BOOKMARK",
                                        "BOOKMARK"]
    assert events[-1].resource_version == "830"
    assert replay.requests[0].query == {"watch": "true", "resourceVersion": "825", "allowWatchBookmarks": "true",
                                        "labelSelector": "case=watch", "timeoutSeconds": "10"}


def test_410_inside_a_200_watch_stream_raises_gone(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("22")
    stream = client.watch(PODS, "capture", resource_version="1", timeout_seconds=5)
    with pytest.raises(errors.Gone) as caught:
        next(stream)
    assert caught.value.reason == "Expired"
    assert "too old resource version" in caught.value.message


def test_watch_500_on_bad_resource_version(replay: ReplayServer) -> None:
    client = make_client(replay.url, max_retries=0)
    replay.add_exchange("22", "non-numeric")
    with pytest.raises(errors.ServerError) as caught:
        client.watch(PODS, "capture", resource_version="abc", timeout_seconds=3)
    assert caught.value.code == 500 and caught.value.reason == ""


def test_415_unsupported_media_type(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("08")
    with pytest.raises(errors.UnsupportedMediaType) as caught:
        client.patch(CONFIGMAPS, "cm-jp", {"data": {"a": "b"}}, "capture")
    assert caught.value.message == "415: Unsupported Media Type"


def test_422_invalid_with_causes(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("09", "bad name + bad label key")
    with pytest.raises(errors.Invalid) as caught:
        client.create(CONFIGMAPS, {"metadata": {"name": "Bad_Name", "namespace": "capture"}})
    assert len(caught.value.causes) >= 3
    assert {c["field"] for c in caught.value.causes} >= {"metadata.name"}
    assert replay.requests[0].path == "/api/v1/namespaces/capture/configmaps"  # namespace taken from the body


def test_422_lease_microtime_without_fraction(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("25", "renewTime with second precision only")
    with pytest.raises(errors.Invalid, match=re.escape("2006-01-02T15:04:05.000000Z07:00")):
        client.patch(LEASES, "capture-leader", {"spec": {"renewTime": "2026-11-29T21:21:00Z"}}, "capture")


def test_429_eviction_pdb_refusal_is_raised_at_once(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("14")
    replay.add_exchange("14")  # a second copy that a retry would consume
    with pytest.raises(errors.TooManyRequests) as caught:
        client.evict("pdb1-pod-a", "capture")
    assert caught.value.retry_after is None
    assert caught.value.causes[0]["reason"] == "DisruptionBudget"
    assert len(replay.requests) == 1
    assert json.loads(replay.requests[0].body) == {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "pdb1-pod-a", "namespace": "capture"}}


def test_eviction_success_and_dry_run(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("15")
    status = client.evict("pdb1-pod-b", "capture", grace_period_seconds=5, dry_run=True)
    assert status == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    assert replay.requests[0].query == {"dryRun": "All"}
    assert json.loads(replay.requests[0].body)["deleteOptions"] == {"gracePeriodSeconds": 5, "dryRun": ["All"]}


def test_500_two_pdbs_is_server_error_without_reason_and_not_retried(
    replay: ReplayServer, client: KubeClient
) -> None:
    replay.add_exchange("16")
    replay.add_exchange("16")
    with pytest.raises(errors.ServerError) as caught:
        client.evict("pdb1-pod-a", "capture")
    assert caught.value.reason == "" and "more than one PodDisruptionBudget" in caught.value.message
    assert len(replay.requests) == 1


class CountingToken:
    def __init__(self) -> None:
        self.invalidations = 0

    def token(self) -> str | None:
        return f"token-{self.invalidations}"

    def invalidate(self) -> None:
        self.invalidations += 1


def test_401_refreshes_credentials_once_then_raises(replay: ReplayServer) -> None:
    source = CountingToken()
    client = KubeClient(ClusterConfig(server=replay.url, token_source=source), backoff_base=0.01)
    replay.add_exchange("27", "bad bearer token")
    replay.add_exchange("27", "bad bearer token")
    with pytest.raises(errors.Unauthorized) as caught:
        client.list(NODES)
    assert caught.value.details == {} and caught.value.message == "Unauthorized"
    assert [r.headers["Authorization"] for r in replay.requests] == ["Bearer token-0", "Bearer token-1"]


def test_401_then_success_after_refresh(replay: ReplayServer) -> None:
    source = CountingToken()
    client = KubeClient(ClusterConfig(server=replay.url, token_source=source))
    replay.add_exchange("27", "bad bearer token")
    replay.add_exchange("30", "nodes as Table")
    assert client.list_page(NODES)["kind"] == "Table"
    assert source.invalidations == 1


def test_403_forbidden(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("27", "SA token list nodes")
    with pytest.raises(errors.Forbidden) as caught:
        client.list(NODES)
    assert caught.value.details == {"kind": "nodes"}
    assert "system:serviceaccount:capture:nobody" in caught.value.message


def test_504_with_retry_after_is_retried_for_reads(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("23", "far-future")
    replay.add_exchange("23", "NotOlderThan")
    start = time.monotonic()
    result = client.list_page(PODS, "capture", resource_version="999999999")
    assert result["kind"] == "PodList"
    assert time.monotonic() - start >= 0.2  # Retry-After: 1, capped at retry_after_cap=0.2
    assert len(replay.requests) == 2


def test_504_retry_after_parsed_when_not_retried(replay: ReplayServer) -> None:
    client = make_client(replay.url, max_retries=0)
    replay.add_exchange("23", "far-future")
    with pytest.raises(errors.ServerError) as caught:
        client.list_page(PODS, "capture", resource_version="999999999")
    assert caught.value.code == 504 and caught.value.retry_after == 1.0 and caught.value.reason == "Timeout"


def _status(code: int, reason: str, retry_after: str | None = None, method: str = "GET",
            path: str = "/api/v1/namespaces/capture/configmaps/x") -> Canned:
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": reason, "reason": reason, "code": code}).encode()
    headers = [("Content-Type", "application/json")]
    if retry_after:
        headers.append(("Retry-After", retry_after))
    return Canned(method, path, code, reason, headers, body)


def _ok(method: str = "GET", path: str = "/api/v1/namespaces/capture/configmaps/x") -> Canned:
    body = json.dumps({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "x"}}).encode()
    return Canned(method, path, 200, "OK", [("Content-Type", "application/json")], body)


def test_non_json_error_body_still_typed(replay: ReplayServer) -> None:
    client = make_client(replay.url, max_retries=0)
    replay.add(Canned("GET", "/api/v1/nodes/n", 502, "Bad Gateway", [("Content-Type", "text/html")],
                      b"<html>upstream down</html>"))
    with pytest.raises(errors.ServerError) as caught:
        client.get(NODES, "n")
    assert caught.value.code == 502 and "upstream down" in caught.value.message


@pytest.mark.parametrize(
    ("verb", "retried"),
    [
        ("get", True),
        ("put_conditional", True),
        ("put_unconditional", False),
        ("delete_preconditions", True),
        ("delete_plain", False),
        ("apply", True),
        ("merge", False),
        ("create", False),
    ],
)
def test_5xx_retried_only_for_idempotent_verbs(replay: ReplayServer, client: KubeClient, verb: str,
                                                retried: bool) -> None:
    method = {"get": "GET", "put_conditional": "PUT", "put_unconditional": "PUT", "delete_preconditions": "DELETE",
              "delete_plain": "DELETE", "apply": "PATCH", "merge": "PATCH", "create": "POST"}[verb]
    path = "/api/v1/namespaces/capture/configmaps" + ("" if verb == "create" else "/x")
    replay.add(_status(503, "ServiceUnavailable", method=method, path=path))
    replay.add(_ok(method, path))
    call = {
        "get": lambda: client.get(CONFIGMAPS, "x", "capture"),
        "put_conditional": lambda: client.replace(CONFIGMAPS, "x", {"metadata": {"resourceVersion": "5"}},
                                                  "capture"),
        "put_unconditional": lambda: client.replace(CONFIGMAPS, "x", {"metadata": {}}, "capture"),
        "delete_preconditions": lambda: client.delete(CONFIGMAPS, "x", "capture",
                                                      preconditions={"resourceVersion": "5"}),
        "delete_plain": lambda: client.delete(CONFIGMAPS, "x", "capture"),
        "apply": lambda: client.patch(CONFIGMAPS, "x", {"data": {}}, "capture", patch_type="apply"),
        "merge": lambda: client.patch(CONFIGMAPS, "x", {"data": {}}, "capture"),
        "create": lambda: client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "capture"),
    }[verb]
    if retried:
        assert call()["metadata"]["name"] == "x"
        assert len(replay.requests) == 2
    else:
        with pytest.raises(errors.ServerError):
            call()
        assert len(replay.requests) == 1


def test_429_throttling_is_retried_for_mutations(replay: ReplayServer, client: KubeClient) -> None:
    path = "/api/v1/namespaces/capture/configmaps"
    replay.add(_status(429, "TooManyRequests", retry_after="1", method="POST", path=path))
    replay.add(_ok("POST", path))
    assert client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "capture")["metadata"]["name"] == "x"
    assert len(replay.requests) == 2


def test_dropped_connection_retries_reads_not_creates(replay: ReplayServer, client: KubeClient) -> None:
    drop = _ok()
    drop.drop = True
    replay.add(drop)
    replay.add(_ok())
    assert client.get(CONFIGMAPS, "x", "capture")["metadata"]["name"] == "x"
    path = "/api/v1/namespaces/capture/configmaps"
    dropped_post = _ok("POST", path)
    dropped_post.drop = True
    replay.add(dropped_post)
    replay.add(_ok("POST", path))
    with pytest.raises(errors.TransportError):
        client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "capture")


def test_connection_refused_is_transport_error() -> None:
    server = ReplayServer().start()
    url = server.url
    server.stop()
    client = make_client(url, max_retries=1)
    with pytest.raises(errors.TransportError):
        client.get(NODES, "n")


def test_keep_alive_reuses_one_connection(replay: ReplayServer, client: KubeClient) -> None:
    for _ in range(5):
        replay.add(_ok())
    for _ in range(5):
        client.get(CONFIGMAPS, "x", "capture")
    assert replay.connections == 1
    closing = _ok()
    closing.close_after = True
    replay.add(closing)
    replay.add(_ok())
    client.get(CONFIGMAPS, "x", "capture")
    client.get(CONFIGMAPS, "x", "capture")
    assert replay.connections == 2  # the server's Connection: close forces one new connection


@pytest.mark.parametrize(
    ("patch_type", "content_type"),
    [("merge", "application/merge-patch+json"), ("json", "application/json-patch+json"),
     ("strategic", "application/strategic-merge-patch+json"), ("apply", "application/apply-patch+yaml")],
)
def test_patch_content_types(replay: ReplayServer, client: KubeClient, patch_type: str, content_type: str) -> None:
    replay.add(_ok("PATCH"))
    patch: object = [{"op": "add", "path": "/data/a", "value": "b"}] if patch_type == "json" else {"data": {}}
    client.patch(CONFIGMAPS, "x", patch, "capture", patch_type=patch_type, dry_run=True)
    sent = replay.requests[0]
    assert sent.headers["Content-Type"] == content_type
    assert sent.query.get("dryRun") == "All"
    assert json.loads(sent.body) == patch
    assert sent.query.get("fieldManager") == ("gpuremediate" if patch_type == "apply" else None)


def test_apply_conflict_and_force(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("07")
    with pytest.raises(errors.Conflict) as caught:
        client.patch(CONFIGMAPS, "cm-ssa", {"data": {"shared": "b"}}, "capture", patch_type="apply",
                     field_manager="b")
    assert caught.value.causes[0]["reason"] == "FieldManagerConflict"
    replay.add_exchange("07", "with force=true")
    client.patch(CONFIGMAPS, "cm-ssa", {"data": {"shared": "b"}}, "capture", patch_type="apply",
                 field_manager="b", force=True)
    assert replay.requests[1].query == {"fieldManager": "b", "force": "true"}


def test_bad_arguments_are_rejected_before_sending(client: KubeClient) -> None:
    with pytest.raises(ValueError, match="patch_type"):
        client.patch(CONFIGMAPS, "x", {}, "capture", patch_type="yaml")
    with pytest.raises(ValueError, match="force"):
        client.patch(CONFIGMAPS, "x", {}, "capture", force=True)
    with pytest.raises(ValueError, match="namespace"):
        client.get(PODS, "p")
    with pytest.raises(ValueError, match="cluster-scoped"):
        client.get(NODES, "n", "capture")
    with pytest.raises(ValueError, match="namespace"):
        client.create(CONFIGMAPS, {"metadata": {"name": "x"}})


def test_dry_run_create(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("10")
    created = client.create(CONFIGMAPS, {"metadata": {"name": "cm-dry"}}, "capture", dry_run=True)
    assert created["metadata"]["uid"] and "resourceVersion" not in created["metadata"]
    assert replay.requests[0].query == {"dryRun": "All"}


def test_discovery_resolves_custom_kinds_and_caches(replay: ReplayServer, client: KubeClient) -> None:
    replay.add_exchange("24", "discovery APIResourceList")
    gadgets = client.resolve("capture.example.com/v1", "Gadget")
    assert (gadgets.plural, gadgets.namespaced, gadgets.group) == ("gadgets", True, "capture.example.com")
    expected = "/apis/capture.example.com/v1/namespaces/capture/gadgets/g1/status"
    assert gadgets.path("capture", "g1", "status") == expected
    assert client.resolve("capture.example.com/v1", "Gadget") is gadgets
    assert len(replay.requests) == 1
    assert client.resolve("v1", "Node") is NODES and len(replay.requests) == 1
    replay.add_exchange("24", "discovery APIResourceList")
    with pytest.raises(errors.NotFound):
        client.resolve("capture.example.com/v1", "Widget")  # unknown kind: discovery is asked again
    assert len(replay.requests) == 2


def test_rate_limiter_spaces_requests(replay: ReplayServer) -> None:
    client = make_client(replay.url, qps=20.0, burst=2)
    for _ in range(6):
        replay.add(_ok())
    start = time.monotonic()
    for _ in range(6):
        client.get(CONFIGMAPS, "x", "capture")
    assert time.monotonic() - start >= 0.18  # 4 requests beyond the burst at 20/s


_label_key = st.from_regex(r"([a-z0-9]([-a-z0-9.]{0,10}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?",
                           fullmatch=True)
_requirement = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", _label_key, _label_key),
    st.builds(lambda k, v: f"{k}!={v}", _label_key, _label_key),
    st.builds(lambda k, vs: f"{k} in ({','.join(vs)})", _label_key, st.lists(_label_key, min_size=1, max_size=3)),
    st.builds(lambda k: f"!{k}", _label_key),
    _label_key,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_requirement, min_size=1, max_size=4).map(",".join), _label_key.map(lambda k: f"metadata.name={k}"))
def test_selector_strings_reach_the_server_intact(replay: ReplayServer, client: KubeClient, labels: str,
                                                   fields: str) -> None:
    replay.requests.clear()
    replay.add(Canned("GET", "/api/v1/pods", 200, "OK", [("Content-Type", "application/json")],
                      b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}'))
    client.list(PODS, label_selector=labels, field_selector=fields)
    assert replay.requests[0].query == {"labelSelector": labels, "fieldSelector": fields, "limit": "500"}
