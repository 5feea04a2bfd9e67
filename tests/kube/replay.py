"""A local HTTP server that replays the real kube-apiserver exchanges in /work/shared/data/kube-apiserver.

Each queued response is served, byte for byte (status, headers, body), to the next request whose method and
path match; watch bodies are sent as the recorded chunks. Every request and connection is recorded.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

DATA_DIR = Path(os.environ.get("KUBE_APISERVER_DATA", "/work/shared/data/kube-apiserver"))


def load_case(name: str) -> dict[str, Any]:
    path = next(DATA_DIR.glob(f"{name}*.json"))
    return json.loads(path.read_text())


def exchange(case: str, step: str | None = None) -> dict[str, Any]:
    """One exchange of a case: the key one, or the one whose step label contains `step`."""
    for ex in load_case(case)["exchanges"]:
        if (step is None and ex.get("key")) or (step is not None and step in ex["step"]):
            return ex
    raise KeyError(f"{case}: no exchange {step!r}")


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    connection: int


@dataclass
class Canned:
    method: str
    path: str  # without the query
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes | None = None
    chunks: list[bytes] = field(default_factory=list)
    close_after: bool = False
    drop: bool = False  # close the connection without answering


def canned_from_exchange(ex: dict[str, Any]) -> Canned:
    req, resp = ex["request"], ex["response"]
    headers: list[tuple[str, str]] = []
    for name, value in resp["headers"].items():
        if name.lower() in ("content-length", "transfer-encoding", "connection"):
            continue
        for one in value if isinstance(value, list) else [value]:
            headers.append((name, one))
    canned = Canned(req["method"], urlsplit(req["path"]).path, resp["status"], resp.get("reason", ""), headers)
    body = resp["body"]
    if isinstance(body, list) and body and isinstance(body[0], dict) and ("raw" in body[0] or "t_s" in body[0]):
        canned.chunks = [c["raw"].encode() for c in body if "raw" in c]
        return canned
    if resp.get("body_raw") is not None:
        canned.body = resp["body_raw"].encode()
    elif isinstance(body, str):
        canned.body = body.encode()
    else:
        text = json.dumps(body, separators=(",", ":"))
        canned.body = (text + ("\n" if resp.get("body_ends_with_newline") else "")).encode()
    return canned


class ReplayServer:
    def __init__(self) -> None:
        self.queue: list[Canned] = []
        self.requests: list[Recorded] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.replay = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ReplayServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, canned: Canned) -> Canned:
        with self._lock:
            self.queue.append(canned)
        return canned

    def add_exchange(self, case: str, step: str | None = None) -> Canned:
        return self.add(canned_from_exchange(exchange(case, step)))

    def take(self, method: str, path: str) -> Canned | None:
        with self._lock:
            for i, canned in enumerate(self.queue):
                if canned.method == method and canned.path == path:
                    return self.queue.pop(i)
        return None

    def new_connection(self) -> int:
        with self._lock:
            self.connections += 1
            return self.connections


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    replay: ReplayServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection_id = self.server.replay.new_connection()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _serve(self) -> None:
        replay = self.server.replay
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        with replay._lock:
            replay.requests.append(Recorded(self.command, parts.path, dict(parse_qsl(parts.query)),
                                            dict(self.headers.items()), body, self.connection_id))
        canned = replay.take(self.command, parts.path)
        if canned is None:
            self._send_plain(599, b"replay: no canned response for " + self.path.encode())
            return
        if canned.drop:
            self.close_connection = True
            return
        self.send_response(canned.status, canned.reason or None)
        for name, value in canned.headers:
            self.send_header(name, value)
        if canned.chunks:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in canned.chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = canned.body or b""
            self.send_header("Content-Length", str(len(data)))
            if canned.close_after:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

    def _send_plain(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


__all__ = ["Canned", "ReplayServer", "canned_from_exchange", "exchange", "load_case"]
