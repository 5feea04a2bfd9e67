"""HTTP plumbing for the kube client: a keep-alive connection pool and a token-bucket rate limiter."""

from __future__ import annotations

import http.client
import select
import ssl
import threading
import time

from gpuremediate.kube.config import ClusterConfig


class RateLimiter:
    """Token bucket: `qps` tokens per second, at most `burst` saved up; acquire() blocks until one is free.

    Two priorities share the one budget: a background request (an Event, the GPURemediation condition: what
    reports an action) waits while any foreground request (the actions themselves: a cordon, an eviction)
    waits for a token, so a burst of cordons is not paced by their own reports, and the server never sees
    more than `qps` from us either way."""

    def __init__(self, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"rate limit needs qps > 0 and burst >= 1, got qps={qps} burst={burst}")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()
        self._foreground_waiting = 0

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now

    def _reserve(self) -> float:
        """Take a token (possibly going negative); the seconds to wait before using it."""
        with self._lock:
            self._refill()
            self._tokens -= 1.0
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
            if wait > 0:
                self._foreground_waiting += 1
            return wait

    def acquire(self, background: bool = False) -> float:
        """Block until a request may go; returns the seconds waited."""
        if background:
            return self._acquire_background()
        wait = self._reserve()
        if wait > 0:
            try:
                time.sleep(wait)
            finally:
                with self._lock:
                    self._foreground_waiting -= 1
        return wait

    def _acquire_background(self) -> float:
        started = time.monotonic()
        while True:
            with self._lock:
                self._refill()
                if self._foreground_waiting == 0 and self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return time.monotonic() - started
                short = max(0.0, 1.0 - self._tokens) / self.qps
            time.sleep(min(0.05, max(0.002, short)))


class ConnectionPool:
    """A few idle keep-alive connections to the one API server, shared by threads."""

    def __init__(self, config: ClusterConfig, timeout: float, max_idle: int = 4) -> None:
        self.config = config
        self.timeout = timeout
        self.max_idle = max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def take(self) -> http.client.HTTPConnection:
        """An idle connection that is still open, or a new one."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if _still_open(conn):
                    conn.timeout = self.timeout
                    if conn.sock is not None:
                        conn.sock.settimeout(self.timeout)
                    return conn
                conn.close()
        return self._new()

    def _new(self) -> http.client.HTTPConnection:
        ctx = self.config.ssl_context()
        if ctx is not None:
            return _TLSConnection(self.config.host, self.config.port, timeout=self.timeout, context=ctx,
                                  server_name=self.config.tls_server_name)
        return http.client.HTTPConnection(self.config.host, self.config.port, timeout=self.timeout)

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive socket that is readable has been closed by the server (or is out of sync)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class _TLSConnection(http.client.HTTPSConnection):
    """HTTPS to the API server, verifying its certificate for ``server_name`` when the kubeconfig sets
    ``tls-server-name`` (the server is reached by an address its certificate does not name), else the host."""

    def __init__(self, host: str, port: int | None, *, timeout: float, context: ssl.SSLContext,
                 server_name: str | None) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls_context = context
        self._server_name = server_name

    def connect(self) -> None:
        if not self._server_name:
            super().connect()
            return
        http.client.HTTPConnection.connect(self)  # TCP (and any tunnel), then TLS with the configured name
        self.sock = self._tls_context.wrap_socket(self.sock, server_hostname=self._server_name)
