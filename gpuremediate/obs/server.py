"""One HTTP port: /metrics, /healthz, /readyz."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpuremediate.obs.metrics import Registry

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class ObservabilityServer:
    """Serves the registry and the health probes until ``stop()``.

    ``ready`` returns (ok, reason): ready means the caches synced and, for the leader, the loops run.
    """

    def __init__(
        self,
        registry: Registry,
        ready: Callable[[], tuple[bool, str]],
        host: str = "0.0.0.0",
        port: int = 8080,
        alive: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        self.registry = registry
        self.ready = ready
        self.alive = alive or (lambda: (True, "ok"))
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="obs-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> ObservabilityServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, server.registry.render(), CONTENT_TYPE_METRICS)
                elif path in ("/healthz", "/livez"):
                    ok, reason = server.alive()
                    self._send(200 if ok else 500, reason + "\n")
                elif path == "/readyz":
                    ok, reason = server.ready()
                    self._send(200 if ok else 503, reason + "\n")
                else:
                    self._send(404, "not found\n")

            def _send(self, code: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler
