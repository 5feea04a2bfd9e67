"""One hostile exporter costs only its own node (issue 17 items 4-6).

Hostile exporters are raw TCP servers on their own loopback address, on the same port as the healthy
gpu-sim nodes beside them: a slow-loris trickling its headers forever, a non-HTTP status line, 101
headers, a connection reset, a non-UTF-8 body, 100,000 series, a label ``gpu="²"``. Each must become that
node's unknown with a reason, and the healthy nodes' faults must still be read in the same cycle.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuremediate.kube.client import KubeClient
from gpuremediate.kube.config import ClusterConfig, StaticToken
from gpuremediate.kube.resources import NAMESPACES, PODS
from gpuremediate.signals.model import SOURCE_OK, SOURCE_UNKNOWN, NodeReadings
from gpuremediate.signals.sources import ExporterSource
from sim.gpusim import GpuSim
from sim.kubeapi import KubeAPIServer

NS = "gpu-operator"
Behaviour = Callable[[socket.socket], None]


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk


def trickle_forever(stop: threading.Event) -> Behaviour:
    def serve(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.3):  # one byte of one endless header every 0.3 s
            conn.sendall(b"X")
    return serve


def answer(raw: bytes) -> Behaviour:
    def serve(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(raw)
    return serve


def reset(conn: socket.socket) -> None:
    _read_request(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def ok_body(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + body


def huge_body(series: int) -> bytes:
    lines = (f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i % 8}",UUID="GPU-{i}",Hostname="big",extra="{i:032d}"}} 40\n'
             for i in range(series))
    return ok_body("".join(lines).encode())


HOSTILE: dict[str, Callable[[threading.Event], Behaviour]] = {
    "slowloris": trickle_forever,
    "badstatus": lambda _: answer(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
    "manyheaders": lambda _: answer(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(101))
                                    + b"\r\n"),
    "reset": lambda _: reset,
    "garbage": lambda _: answer(ok_body(b"\xff\xfe\x00\x80 not text")),
    "huge": lambda _: answer(huge_body(100_000)),
    "superscript": lambda _: answer(ok_body('DCGM_FI_DEV_XID_ERRORS{gpu="²",UUID="GPU-x",Hostname="s"} 79\n'
                                            .encode())),
}


class RawServer:
    """Accepts connections on (ip, port) and hands each to ``behaviour`` in its own thread."""

    def __init__(self, ip: str, port: int, behaviour: Behaviour) -> None:
        self.sock = socket.create_server((ip, port))
        self.sock.settimeout(0.1)
        self.behaviour = behaviour
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self.behaviour(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()


@pytest.fixture(scope="module")
def client() -> Iterator[KubeClient]:
    srv = KubeAPIServer().start()
    c = KubeClient(ClusterConfig(server=srv.url, token_source=StaticToken(srv.admin_token)))
    c.create(NAMESPACES, {"metadata": {"name": NS}})
    yield c
    srv.stop()


@pytest.fixture(scope="module")
def fleet(client: KubeClient) -> Iterator[tuple[GpuSim, dict[str, str]]]:
    """Two healthy gpu-sim nodes and one hostile node per behaviour, all on one port; their exporter pods."""
    stop = threading.Event()
    sim = GpuSim(port=0)
    for i in (1, 2):
        sim.add_node(f"healthy-{i}", gpus=8, ip=f"127.0.0.{60 + i}")
    sim.start()
    ips = {name: f"127.0.0.{70 + i}" for i, name in enumerate(HOSTILE)}
    servers = [RawServer(ips[name], sim.port, make(stop)) for name, make in HOSTILE.items()]
    nodes = {**{n: sim.node(n).ip for n in sim.nodes()}, **ips}
    for node, ip in nodes.items():
        name = f"dcgm-{node}"
        client.create(PODS, {"metadata": {"name": name, "labels": {"app": "nvidia-dcgm-exporter"}},
                             "spec": {"nodeName": node, "containers": [{"name": "e", "image": "x"}]}}, NS)
        client.patch(PODS, name, {"status": {"phase": "Running", "podIP": ip}}, NS, subresource="status")
    yield sim, nodes
    stop.set()
    for server in servers:
        server.stop()
    sim.stop()


def read_in_thread(src: ExporterSource, limit_s: float = 60.0) -> dict[str, NodeReadings]:
    """src.read() in a thread; fails (instead of hanging the suite) if it has not returned in ``limit_s``."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(src.read()), daemon=True)
    worker.start()
    worker.join(limit_s)
    assert out, f"read() did not return within {limit_s:g} s: one scrape held up the whole cycle"
    return {r.node: r for r in out[0]}


def test_hostile_exporters_cost_only_their_own_node(client: KubeClient,
                                                    fleet: tuple[GpuSim, dict[str, str]]) -> None:
    sim, nodes = fleet
    sim.inject_xid("healthy-1", 3, 79)
    src = ExporterSource(client, port=sim.port, timeout_s=1.0, max_bytes=4 * 1024 * 1024, workers=4)
    try:
        got = read_in_thread(src)
    finally:
        src.stop()  # its pod informer would go on watching a stopped API server for the rest of the run
    assert set(got) == set(nodes)
    assert got["healthy-1"].status == SOURCE_OK and got["healthy-2"].status == SOURCE_OK
    assert next(g.xid for g in got["healthy-1"].gpus if g.gpu == "3") == 79
    expected = {
        "slowloris": "timed out after 1 s",
        "badstatus": "BadStatusLine",
        "manyheaders": "more than 100 headers",
        "reset": "reset",
        "garbage": "not UTF-8",
        "huge": "exceeds the 4194304 byte limit",
        "superscript": "",
    }
    for node, words in expected.items():
        assert got[node].status == SOURCE_UNKNOWN, node
        assert words in got[node].reason and "dcgm-" + node in got[node].reason, (node, got[node].reason)


def test_a_stuck_scrape_does_not_hold_the_next_cycle(client: KubeClient,
                                                     fleet: tuple[GpuSim, dict[str, str]]) -> None:
    """A scrape thread stuck outside any socket read is left behind; its node is not scraped twice at once."""
    sim, _ = fleet
    release = threading.Event()
    entered: list[str] = []

    class StuckOnHealthy2:
        def scrape(self, node: str, seconds: float, ok: bool, reason: str) -> None:
            if node == "healthy-2" and ok:
                entered.append(node)
                release.wait(60)

    src = ExporterSource(client, port=sim.port, timeout_s=0.5, workers=4, observer=StuckOnHealthy2())
    try:
        first = read_in_thread(src)
        second = read_in_thread(src)
    finally:
        release.set()
        src.stop()
    assert first["healthy-1"].status == SOURCE_OK and second["healthy-1"].status == SOURCE_OK
    for got in (first, second):
        assert got["healthy-2"].status == SOURCE_UNKNOWN
        assert "still running past its 0.5 s deadline" in got["healthy-2"].reason
    assert entered == ["healthy-2"], "the stuck node was scraped again while its first scrape still ran"
