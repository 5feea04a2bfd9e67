"""HTTP plumbing: the request handler, response writing as Go's net/http does it, watch chunks."""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import sys
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from sim.kube_errors import ApiError, encode

log = logging.getLogger(__name__)

GO_BUFFER = 2048  # Go switches to chunked encoding once a body passes its write buffer
BASE_HEADERS = {"Cache-Control": "no-cache, private", "Content-Type": "application/json",
                "X-Kubernetes-Pf-Flowschema-Uid": "5a1f0c4e-7d2b-4c1a-9e3f-2b6d8a0c1e77",
                "X-Kubernetes-Pf-Prioritylevel-Uid": "9c3e5b7a-1f4d-4e2a-8b6c-0d9e7f1a3b55"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    raw_path: str
    user: str = ""
    groups: tuple[str, ...] = ()
    warnings: list[str] = field(default_factory=list)

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("true", "1")

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()


class RequestSink(Protocol):
    """What a connection's handler hands each request to (the server implements it; this module owns it)."""

    def handle(self, h: Handler, req: Request) -> None: ...


# What a client that goes away mid-request raises here: a reset, a closed pipe, or over TLS an EOF without
# close_notify (SSLEOFError) and the write OpenSSL refuses after it (BAD_LENGTH). Not the server's error.
HANG_UPS: tuple[type[BaseException], ...] = (ConnectionError, ssl.SSLError, TimeoutError)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Server(ThreadingHTTPServer):
    """The threaded server, saying a client's hang-up in one debug line instead of socketserver's traceback."""

    daemon_threads = True
    # Go's net.Listen asks for the system's somaxconn (4096 on current kernels, which caps it there); socketserver's
    # 5 overflowed when 750 agents wrote at once, and a connection whose handshake the full queue dropped was reset
    # after its request was sent: a status write lost, its retry a whole agent interval later
    request_queue_size = 4096

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, HANG_UPS):
            log.debug("client %s:%s hung up: %s", *tuple(client_address)[:2], _short(exc))
            return
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small responses on a kept-alive connection: no 40 ms delayed-ACK stalls
    api: RequestSink  # set on the subclass the server makes

    def log_message(self, format: str, *args: Any) -> None:
        return

    def send_response(self, code: int, message: str | None = None) -> None:
        self.send_response_only(code, message)
        self.send_header("Date", self.date_time_string())

    def _request(self) -> Request:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        return Request(self.command, split.path.rstrip("/") or "/", query, headers, body, self.path)

    def _dispatch(self) -> None:
        try:
            self.api.handle(self, self._request())
        except HANG_UPS as exc:
            self.close_connection = True
            log.debug("client %s:%s hung up: %s", *self.client_address[:2], _short(exc))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    # --- writing ----------------------------------------------------------------------------------
    def send_bytes(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        merged = {**BASE_HEADERS, **(headers or {})}
        for key, value in merged.items():
            self.send_header(key, value)
        if len(body) > GO_BUFFER:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.write_chunk(body)
            self.end_chunks()
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        self.wfile.flush()

    def send_json(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(code, encode(obj), headers)

    def send_error_status(self, err: ApiError) -> None:
        if err.plain is not None:
            self.send_bytes(err.code, err.plain, {"Content-Type": "text/plain; charset=utf-8",
                                                  "X-Content-Type-Options": "nosniff", **err.headers})
            return
        self.send_json(err.code, err.body, err.headers)

    def start_stream(self) -> None:
        self.send_response(200)
        for key, value in BASE_HEADERS.items():
            self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def reset(self) -> None:
        """Drop the connection with a TCP RST (no response at all)."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass
