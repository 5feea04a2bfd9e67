"""A client that hangs up on the emulator (over TLS: no close_notify) is one debug line, not a traceback on stderr.

`make sandbox` runs the emulator over https in the user's terminal: kubectl and the controller's watches going away
mid-response used to print socketserver's "Exception occurred during processing of request" with SSLEOFError and
then BAD_LENGTH (the 500 the emulator then tried to write on the dead connection)."""

from __future__ import annotations

import logging
import shutil
import socket
import ssl
import struct
import time
import urllib.request
from collections.abc import Iterator

import pytest

from sim.kubeapi import KubeAPIServer

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed (the TLS emulator's "
                                "certificate): apt-get install -y openssl")


@pytest.fixture(scope="module")
def tls_srv() -> Iterator[KubeAPIServer]:
    server = KubeAPIServer(tls=True).start()
    nodes = server.type_for("", "nodes")
    pad = {"sim.example.com/pad": "x" * 8000}
    for i in range(1000):  # an 8 MB list, past any socket buffer: the client is gone while it is still written
        server.store.create(nodes, {"metadata": {"name": f"n{i:04}", "annotations": pad}}, "")
    yield server
    server.stop()


def _client(srv: KubeAPIServer) -> ssl.SSLSocket:
    assert srv.ca_file is not None
    context = ssl.create_default_context(cafile=srv.ca_file)
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's writes wait on us
    raw.settimeout(10)
    raw.connect(("127.0.0.1", srv.port))
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _list_then_hang_up(srv: KubeAPIServer, rst: bool) -> None:
    tls = _client(srv)
    tls.sendall(b"GET /api/v1/nodes HTTP/1.1\r\nHost: sim\r\nAuthorization: Bearer " + srv.admin_token.encode()
                + b"\r\n\r\n")
    assert tls.recv(12).startswith(b"HTTP/1.1 200")
    if rst:
        tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        tls.close()
    else:  # the TCP connection ends without TLS's close_notify: SSLEOFError on the server's next write
        raw = socket.socket(fileno=tls.detach())
        raw.shutdown(socket.SHUT_RDWR)
        raw.close()


def _answers(srv: KubeAPIServer) -> bool:
    assert srv.ca_file is not None
    request = urllib.request.Request(srv.url + "/api/v1/namespaces",
                                     headers={"Authorization": f"Bearer {srv.admin_token}"})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=srv.ca_file), timeout=10) as r:
        return bool(r.status == 200)


def test_a_client_hanging_up_mid_response_is_one_debug_line(tls_srv: KubeAPIServer,
                                                             capsys: pytest.CaptureFixture[str],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sim.kube_http")
    for rst in (False, True, False, True):
        _list_then_hang_up(tls_srv, rst)
    plain = socket.create_connection(("127.0.0.1", tls_srv.port))  # not TLS at all: the handshake fails
    plain.sendall(b"GET /api/v1/nodes HTTP/1.1\r\n\r\n")
    time.sleep(0.2)
    plain.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any("HTTP_REQUEST" in r.getMessage() for r in caplog.records):
        time.sleep(0.05)
    time.sleep(0.3)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err and "SSL" not in err, err
    lines = [r.getMessage() for r in caplog.records if r.name == "sim.kube_http"]
    # Which hang-ups the server notices depends on how much of the list the kernel had buffered; the EOF and the
    # plain-text client always are, each in one line.
    assert any("HTTP_REQUEST" not in line for line in lines), lines  # the lists' (EOF, reset, broken pipe)
    assert any("HTTP_REQUEST" in line for line in lines), lines
    assert all(line.startswith("client 127.0.0.1:") and " hung up: " in line and "\n" not in line
               for line in lines), lines
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "sim.kube_http")
    assert _answers(tls_srv)  # and the server serves on


def test_a_client_that_never_speaks_tls_holds_up_no_one(tls_srv: KubeAPIServer) -> None:
    """The handshake runs in the connection's own thread: a silent TCP connection does not stall accept()."""
    silent = socket.create_connection(("127.0.0.1", tls_srv.port))
    try:
        started = time.monotonic()
        assert _answers(tls_srv)
        assert time.monotonic() - started < 5
    finally:
        silent.close()
