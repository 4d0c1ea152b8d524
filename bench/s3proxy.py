"""A fault- and latency-injecting HTTP proxy in front of an S3 server, for tests and benchmarks.

Clients are pointed at the proxy's endpoint instead of the server's; the proxy forwards every request
unchanged (the ``Host`` header too, so SigV4 signatures stay valid) and can:

- add a fixed delay to every request (``delay_ms``: the round trip of a cloud object store, 20 ms in
  the benchmark's injected-latency profile);
- answer a matching request with an error *instead of* forwarding it (``fail``), or *after* forwarding
  it (``after=True``): the write landed on the server, but the client hears 503 — the case where a
  Delta commit's answer is lost and object_store's retry meets 412;
- hold a matching request for a while before forwarding it (``slow``).

Faults are rules checked in order, each with a count of requests it still applies to; every rule
records the requests it hit, so a test can tell that the fault it meant to inject really happened.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"}


@dataclass
class Rule:
    """One injected fault: requests matching ``method`` and ``path`` (a regular expression searched
    in the path and query) are answered with ``status`` — before forwarding, or after when ``after``
    — or, with ``status`` 0, only delayed by ``hold_ms``. Applies to ``times`` requests (-1: all)."""

    method: str | None
    path: str
    status: int = 503
    after: bool = False
    hold_ms: float = 0.0
    times: int = 1
    hits: list[str] = field(default_factory=list)

    def matches(self, method: str, target: str) -> bool:
        if self.times == 0:
            return False
        if self.method is not None and self.method != method:
            return False
        return re.search(self.path, target) is not None


class S3Proxy:
    """The proxy, listening on a free 127.0.0.1 port; a context manager.

    Args:
        upstream: the S3 server's endpoint, ``http://127.0.0.1:<port>``.
        delay_ms: added before forwarding every request.
    """

    def __init__(self, upstream: str, delay_ms: float = 0.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.delay_ms = delay_ms
        self.rules: list[Rule] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    # ------------------------------------------------------------------ faults
    def fail(
        self,
        path: str,
        *,
        method: str | None = None,
        status: int = 503,
        after: bool = False,
        times: int = 1,
    ) -> Rule:
        """Answer the next ``times`` matching requests with ``status`` (after forwarding when ``after``)."""
        rule = Rule(method, path, status=status, after=after, times=times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def slow(self, path: str, hold_ms: float, *, method: str | None = None, times: int = 1) -> Rule:
        """Hold the next ``times`` matching requests ``hold_ms`` before forwarding them."""
        rule = Rule(method, path, status=0, hold_ms=hold_ms, times=times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Drop every rule (the delay stays)."""
        with self._lock:
            self.rules.clear()

    def _take(self, method: str, target: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, target):
                    if rule.times > 0:
                        rule.times -= 1
                    rule.hits.append(f"{method} {target}")
                    return rule
        return None

    # ------------------------------------------------------------------ forwarding
    def _upstream(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
            self._local.conn = conn
        return conn

    def _drop_upstream(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Send one request upstream on this thread's connection (reconnecting once if it went stale)."""
        for attempt in (1, 2):
            conn = self._upstream()
            try:
                conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    conn.putheader(name, value)
                conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body if body else None)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, resp.reason, resp.getheaders(), data
            except (http.client.HTTPException, OSError):
                self._drop_upstream()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ life cycle
    def start(self) -> S3Proxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                with proxy._lock:
                    proxy.requests += 1
                if proxy.delay_ms:
                    time.sleep(proxy.delay_ms / 1000)
                rule = proxy._take(self.command, self.path)
                if rule is not None and rule.status == 0:
                    time.sleep(rule.hold_ms / 1000)
                    rule = None
                if rule is not None and not rule.after:
                    self._answer(rule.status, "Injected", [], _error_body(rule.status))
                    return
                headers = [
                    (k, v)
                    for k, v in self.headers.items()
                    if k.lower() not in _HOP_BY_HOP
                    and k.lower() not in ("content-length", "transfer-encoding")
                ]
                try:
                    status, reason, resp_headers, data = proxy.forward(self.command, self.path, headers, body)
                except (http.client.HTTPException, OSError):
                    self._answer(502, "Bad Gateway", [], _error_body(502))
                    return
                if rule is not None:  # the request landed; its answer is lost
                    self._answer(rule.status, "Injected", [], _error_body(rule.status))
                    return
                self._answer(status, reason, resp_headers, data)

            def _answer(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status, reason)
                for name, value in headers:
                    if name.lower() not in _HOP_BY_HOP and name.lower() not in (
                        "content-length",
                        "transfer-encoding",
                    ):
                        self.send_header(name, value)
                sized = [v for k, v in headers if k.lower() == "content-length" and self.command == "HEAD"]
                self.send_header("Content-Length", sized[0] if sized else str(len(data)))  # HEAD: upstream's
                self.end_headers()
                if self.command != "HEAD" and data:
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, name="s3-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> S3Proxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _error_body(status: int) -> bytes:
    code = {503: "SlowDown", 500: "InternalError", 502: "BadGateway", 408: "RequestTimeout"}.get(
        status, "Error"
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>injected by the test proxy</Message></Error>"
    ).encode()
