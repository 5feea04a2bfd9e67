"""The preflight webhook's HTTPS server (issue 46), in the controller process on its own port.

Why in-process: the decision needs only the controller's policy (``[preflight]``, ``[gpu_resources]``) and image,
which the controller already holds; a second Deployment would be a second thing to roll out, scale and keep in step
with the policy for no gain. The webhook holds no state and reads no API, so a controller busy with a storm still
answers in microseconds (a thread per connection); and ``failurePolicy: Ignore`` keeps pods being created while the
controller restarts. Every replica serves it (not only the leader): the Service spreads the calls.

TLS: the certificate and key are read from files (a mounted Secret: cert-manager's Certificate in the chart); a
rotated certificate (the kubelet updates the mounted files) is read again, checked at most once a second as
connections come, and used for the connections after it. A certificate that cannot be read keeps the last good
one. The TLS handshake happens on the connection's own thread: a slow client does not hold up the others.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuremediate.webhook.mutate import Settings, review

log = logging.getLogger(__name__)
PATH = "/mutate-pods"
MAX_BODY = 3 * 1024 * 1024  # a Pod is at most ~1.5 MiB in etcd; the review carries it once (twice for an update)
RELOAD_EVERY_S = 1.0


class CertificateFiles:
    """A server TLS context from cert and key files, made again when either file changes."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._stamp: tuple[float, ...] = ()
        self._checked = 0.0
        self.context = self._load()  # fails at start: a webhook without its certificate is not started
        self.reloads = 0

    def _files_stamp(self) -> tuple[float, ...]:
        return tuple(v for p in (self.cert, self.key) for v in (os.stat(p).st_mtime, float(os.stat(p).st_size)))

    def _load(self) -> ssl.SSLContext:
        stamp = self._files_stamp()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        self._stamp = stamp
        return context

    def current(self, now: float | None = None) -> ssl.SSLContext:
        now = time.monotonic() if now is None else now
        if now - self._checked >= RELOAD_EVERY_S:
            self._checked = now
            try:
                if self._files_stamp() != self._stamp:
                    self.context = self._load()
                    self.reloads += 1
                    log.info("webhook certificate read again", extra={"cert": self.cert})
            except (OSError, ssl.SSLError) as exc:  # half-written during a rotation: the next check reads it
                log.warning("webhook certificate not read again; the last one serves",
                            extra={"cert": self.cert, "error": str(exc)})
        return self.context


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 certs: CertificateFiles | None) -> None:
        self.certs = certs
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET  # before the bind
        super().__init__(address, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The handler writes the head and the body apart: with Nagle's algorithm the body waits for the client's
        # delayed ACK of the head (40 ms on Linux), on every review.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.certs is not None:  # the handshake on this connection's thread
            request.settimeout(10.0)
            try:
                request = self.certs.current().wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return
        super().finish_request(request, client_address)


class WebhookServer:
    """Serves ``POST /mutate-pods`` (and ``GET /healthz``) until ``stop()``; ``certs`` None: plain HTTP (tests)."""

    def __init__(self, settings: Callable[[], Settings], certs: CertificateFiles | None, host: str = "0.0.0.0",
                 port: int = 9443, observe: Callable[[str, float], None] | None = None) -> None:
        self.settings = settings
        self.observe = observe or (lambda _result, _seconds: None)
        self._httpd = _TLSServer((host, port), self._handler(), certs)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="webhook-https", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> WebhookServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kube-apiserver keeps connections open

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] in ("/healthz", "/readyz"):
                    self._send(200, b"ok\n", "text/plain")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def do_POST(self) -> None:
                started = time.monotonic()
                if self.path.split("?", 1)[0] != PATH:
                    self._send(404, b"not found\n", "text/plain")
                    return
                try:
                    length = int(self.headers.get("Content-Length") or "0")
                    if not 0 < length <= MAX_BODY:
                        raise ValueError(f"body of {length} bytes")
                    answer, result = review(json.loads(self.rfile.read(length)), server.settings())
                except (ValueError, TypeError, AttributeError) as exc:
                    server.observe("error", time.monotonic() - started)
                    self._send(400, f"bad AdmissionReview: {exc}\n".encode(), "text/plain")
                    return
                self._send(200, json.dumps(answer).encode(), "application/json")
                server.observe(result, time.monotonic() - started)

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # every pod creation would be a line

        return Handler
