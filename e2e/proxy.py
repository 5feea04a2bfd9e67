"""A recording proxy in front of an API server: the request audit of a target whose server the harness
cannot read (``apiserver``: a real kube-apiserver keeps its audit log to itself unless started with one).

``RecordingProxy(config).start()`` listens on a loopback port (plain HTTP) and forwards every request to
``config.server`` with the client's own headers (its bearer token included), streaming the answer back as
it comes (watches included). Each request is recorded as the emulator's audit records it
(``sim.kubeapi.KubeAPIServer.requests``): ``(user, verb, group, resource, subresource, namespace, name)``,
parsed the way kube-apiserver's RequestInfo parses a path; ``user`` is the proxy's name for its one client.
``write_kubeconfig(path)`` gives that client (the controller subprocess) a kubeconfig pointing at the proxy.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpuremediate.kube.config import ClusterConfig

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                        "upgrade", "host", "content-length"})
NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
Record = tuple[str, str, str, str, str, str | None, str | None]


def request_info(method: str, target: str) -> tuple[str, str, str, str, str | None, str | None]:
    """(verb, group, resource, subresource, namespace, name) of a request, as kube-apiserver's RequestInfo
    reads its path: a list or watch selecting ``metadata.name`` is for that name; a non-resource path is a
    ``get`` of nothing."""
    split = urlsplit(target)
    query = parse_qs(split.query)
    parts = [p for p in split.path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return "get", "", "", "", None, None  # discovery, /version, /healthz...
    if not rest:
        return "get", group, "", "", None, None
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
        else:
            namespace = None  # the Namespace itself
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else ""
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch", [""])[0] in ("1", "true") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    if verb in ("list", "watch"):
        for term in (query.get("fieldSelector", [""])[0]).split(","):
            key, sep, value = term.partition("=")
            if sep and key.strip() == "metadata.name":
                name = value.removeprefix("=").strip()
    return verb, group, resource, subresource, namespace, name


class RecordingProxy:
    def __init__(self, upstream: ClusterConfig, user: str = "controller") -> None:
        self.upstream = upstream
        self.user = user
        self.requests: list[Record] = []
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> RecordingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns, self._open = list(self._open), set()
        for conn in conns:  # a watch still relayed: its thread's read ends (closing it here would wait for it)
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for the proxy, with the upstream's bearer token."""
        auth = self.upstream.authorization()
        user = f"    token: {json.dumps(auth.removeprefix('Bearer '))}\n" if auth else "    {}\n"
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: proxy
  cluster:
    server: {self.url}
users:
- name: proxy
  user:
{user}contexts:
- name: proxy
  context:
    cluster: proxy
    user: proxy
current-context: proxy
""")
        path.chmod(0o600)
        return path

    def record(self, method: str, target: str) -> None:
        with self._lock:
            self.requests.append((self.user, *request_info(method, target)))

    def connect(self) -> http.client.HTTPConnection:
        cfg = self.upstream
        conn: http.client.HTTPConnection
        if cfg.scheme == "https":
            conn = http.client.HTTPSConnection(cfg.host, cfg.port, context=cfg.ssl_context(), timeout=600)
        else:
            conn = http.client.HTTPConnection(cfg.host, cfg.port, timeout=600)
        with self._lock:
            self._open.add(conn)
        return conn

    def forget(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._open.discard(conn)
        conn.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: RecordingProxy
    protocol_version = "HTTP/1.1"
    upstream_conn: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        self._relay()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def finish(self) -> None:
        if self.upstream_conn is not None:
            self.owner.forget(self.upstream_conn)
            self.upstream_conn = None
        super().finish()

    def _relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        self.owner.record(self.command, self.path)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        try:
            if self.upstream_conn is None:
                self.upstream_conn = self.owner.connect()
            self.upstream_conn.request(self.command, self.path, body=body, headers=headers)
            response = self.upstream_conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            if self.upstream_conn is not None:
                self.owner.forget(self.upstream_conn)
                self.upstream_conn = None
            self._bad_gateway(str(exc))
            return
        self.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        if response.getheader("Content-Length") is not None or self.command == "HEAD" \
                or response.status in (204, 304):
            data = response.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")  # a watch: each piece on as it comes
        self.end_headers()
        try:
            while piece := response.read1(65536):
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (OSError, http.client.HTTPException):  # either side went: so does the other
            self.close_connection = True
            if self.upstream_conn is not None:
                self.owner.forget(self.upstream_conn)
                self.upstream_conn = None

    def _bad_gateway(self, why: str) -> None:
        data = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 502,
                           "reason": "ServiceUnavailable", "message": f"recording proxy: {why}"}).encode()
        self.send_response_only(502)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
