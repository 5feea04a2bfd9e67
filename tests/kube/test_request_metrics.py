"""The client's request observer (client-go's request and rate-limiter latencies): every request on the wire is
observed once per attempt, with its wait on the client's own rate limit; a write the fence refuses never is."""

from __future__ import annotations

from typing import Any

import pytest

from gpuremediate.kube import errors
from gpuremediate.kube.resources import CONFIGMAPS
from gpuremediate.obs.controller_metrics import ControllerMetrics
from tests.kube.conftest import KubeTarget


def _configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


def test_each_request_is_observed_with_its_wait_on_the_rate_limit(kube_target: KubeTarget) -> None:
    client = kube_target.client(qps=5.0, burst=1)
    seen: list[tuple[str, float, float]] = []
    client.observe_request = lambda verb, took, waited: seen.append((verb, took, waited))
    client.create(CONFIGMAPS, _configmap("observed"), kube_target.namespace)
    client.patch(CONFIGMAPS, "observed", {"data": {"k": "w"}}, kube_target.namespace)
    with pytest.raises(errors.NotFound):
        client.get(CONFIGMAPS, "absent", kube_target.namespace)
    assert [verb for verb, _, _ in seen] == ["POST", "PATCH", "GET"]
    assert all(0 < took < 30 for _, took, _ in seen)
    # 5 a second with a burst of 1: the 2nd and 3rd each waited about 0.2 s for their token, sent or not
    assert all(waited >= 0.1 for _, _, waited in seen[1:]), seen


def test_a_write_the_fence_refuses_is_not_observed(kube_target: KubeTarget) -> None:
    client = kube_target.client()
    seen: list[str] = []
    client.observe_request = lambda verb, took, waited: seen.append(verb)

    def refuse(method: str, path: str) -> None:
        raise errors.NotLeader(method, path, "not the leader")
    client.write_fence = refuse
    with pytest.raises(errors.NotLeader):
        client.create(CONFIGMAPS, _configmap("refused"), kube_target.namespace)
    client.list(CONFIGMAPS, kube_target.namespace)
    assert seen == ["GET"]


def test_the_controllers_metrics_render_requests_by_verb() -> None:
    metrics = ControllerMetrics()
    metrics.api_request("PATCH", 0.03, 0.0)
    metrics.api_request("PATCH", 1.5, 0.2)
    text = metrics.registry.render()
    assert 'gpuremediate_api_request_duration_seconds_count{verb="PATCH"} 2' in text
    assert 'gpuremediate_api_request_duration_seconds_bucket{verb="PATCH",le="0.025"} 0' in text
    assert 'gpuremediate_api_request_duration_seconds_bucket{verb="PATCH",le="2"} 2' in text
    assert 'gpuremediate_api_rate_limiter_duration_seconds_bucket{verb="PATCH",le="0.005"} 1' in text
