"""A fleet's first list: each page's items are reduced as that page arrives (20,000 Nodes are never held as
the API server sent them), and the controller waits for the node cache while pages keep coming, giving up
only after a whole timeout without one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from gpuremediate.controller import Controller
from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import CONFIGMAPS, NAMESPACES
from gpuremediate.shutdown import Shutdown
from sim.kubeapi import KubeAPIServer


@pytest.fixture
def client() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    made = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    made.create(NAMESPACES, {"metadata": {"name": "paged"}})
    yield made
    made.close()
    srv.stop()


def test_each_item_is_mapped_as_its_page_arrives(client: KubeClient) -> None:
    for index in range(5):
        client.create(CONFIGMAPS, {"metadata": {"name": f"c{index}"}, "data": {"bulk": "x" * 1000}}, "paged")
    seen: list[str] = []

    def each(item: dict[str, Any]) -> str:
        seen.append(item["metadata"]["name"])
        return item["metadata"]["name"]

    names = [name for name in client.list(CONFIGMAPS, "paged", limit=2, each=each,
                                           on_page=lambda: seen.append("page"))["items"]
             if name.startswith("c")]
    assert names == ["c0", "c1", "c2", "c3", "c4"]
    pages = [i for i, entry in enumerate(seen) if entry == "page"]
    assert len(pages) == 3 and seen[pages[0] + 1:pages[1]] == ["c0", "c1"]  # mapped before the next page came


class SlowList:
    """An informer whose list sends a page every ``every`` seconds and syncs after ``pages`` of them."""

    def __init__(self, pages: int, every: float) -> None:
        self.pages, self.every, self.started = pages, every, 0.0

    def start(self) -> None:
        self.started = time.monotonic()

    def _pages_so_far(self) -> int:
        return int((time.monotonic() - self.started) / self.every)

    def last_progress(self) -> float:
        sent = min(self._pages_so_far(), self.pages)
        return self.started + sent * self.every if sent else 0.0

    def wait_for_sync(self, timeout: float) -> bool:
        time.sleep(timeout)
        return self._pages_so_far() >= self.pages


def _sync(informer: SlowList, timeout: float) -> tuple[bool, float]:
    started = time.monotonic()
    synced = Controller._sync_caches(SimpleNamespace(informer=informer), Shutdown(poll_s=0.01),  # type: ignore[arg-type]
                                     timeout=timeout)
    return synced, time.monotonic() - started


def test_the_node_cache_sync_waits_while_pages_keep_coming() -> None:
    synced, took = _sync(SlowList(pages=8, every=0.1), timeout=0.4)  # 0.8 s in all, a page every 0.1 s
    assert synced and took >= 0.75


def test_the_node_cache_sync_gives_up_a_timeout_after_the_last_page() -> None:
    synced, took = _sync(SlowList(pages=10**6, every=10.0), timeout=0.3)  # no page within the timeout
    assert not synced and 0.3 <= took < 5.0
