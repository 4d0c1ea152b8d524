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

The proxy serves from a process of its own (``python -m bench.s3proxy``), driven through control
requests under ``/__s3proxy__/`` (not a valid bucket name): delta-rs's Python storage handler holds
the GIL while it waits for an answer, so a proxy thread in the process it serves would never get to
answer.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
CONTROL = "/__s3proxy__/"

_MAX_TIMED = 1_000_000  # requests whose round trip is kept between two readings
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"}
# Headers of the upstream answer the proxy writes itself.
_REWRITTEN = {"content-length", "transfer-encoding", "server", "date"}


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


class _ProxyServer:
    """The proxy itself, in the process ``python -m bench.s3proxy`` runs (see :class:`S3Proxy`)."""

    def __init__(self, upstream: str, delay_ms: float = 0.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.delay_ms = delay_ms
        self.rules: list[Rule] = []
        self.requests = 0
        self.seen: list[str] | None = None  # every request's "METHOD target" while recording
        # how long each request took here, from its first byte read to its answer written (the delay
        # and the server's own time included): the round trip a client of this store sees
        self.round_trips_ms: list[float] = []
        self._lock = threading.Lock()
        # Requests being served: a reading of the round trips waits for them, since a client may
        # have its answer (and ask for the reading) before the handler has noted the time.
        self._serving = 0
        self._served = threading.Condition(self._lock)
        self._local = threading.local()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

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
    def control(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """A control request: ``POST rules`` (a rule as JSON; answers its index), ``GET rules/<i>``,
        ``POST clear``, ``GET stats``, ``POST delay`` (``{"delay_ms": ...}``), ``POST record``
        (``{"on": bool}``; answers what was recorded since the last one), ``POST round-trips``
        (answers each request's time in the proxy since the last one)."""
        what = path[len(CONTROL) :]
        with self._lock:
            if method == "POST" and what == "rules":
                self.rules.append(Rule(**json.loads(body)))
                return 200, {"id": len(self.rules) - 1}
            if method == "GET" and what.startswith("rules/"):
                rule = (
                    self.rules[int(what[6:])]
                    if what[6:].isdigit() and int(what[6:]) < len(self.rules)
                    else None
                )
                return (200, asdict(rule)) if rule is not None else (404, {"error": "no such rule"})
            if method == "POST" and what == "clear":
                for rule in self.rules:
                    rule.times = 0  # kept for their hits; cleared rules match nothing
                return 200, {}
            if method == "POST" and what == "delay":
                self.delay_ms = float(json.loads(body)["delay_ms"])
                return 200, {}
            if method == "POST" and what == "record":
                seen, self.seen = self.seen or [], ([] if json.loads(body)["on"] else None)
                return 200, {"seen": seen}
            if method == "POST" and what == "round-trips":
                self._served.wait_for(lambda: self._serving == 0, timeout=5)
                taken, self.round_trips_ms = self.round_trips_ms, []
                return 200, {"round_trips_ms": taken}
            if method == "GET" and what == "stats":
                return 200, {"requests": self.requests, "delay_ms": self.delay_ms}
        return 404, {"error": f"unknown control request {method} {path}"}

    def start(self, port: int = 0) -> _ProxyServer:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: with Nagle on, the client's delayed ACK holds
            # the body ~40 ms on every answer (a round trip the benchmark would measure as the store's).
            disable_nagle_algorithm = True

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
                began = time.perf_counter()
                if self.path.startswith(CONTROL):
                    self._serve()
                    return
                with proxy._lock:
                    proxy._serving += 1
                try:
                    self._serve()
                finally:
                    took_ms = (time.perf_counter() - began) * 1000
                    with proxy._lock:
                        if len(proxy.round_trips_ms) < _MAX_TIMED:
                            proxy.round_trips_ms.append(took_ms)
                        proxy._serving -= 1
                        proxy._served.notify_all()

            def _serve(self) -> None:
                body = self._body()
                if self.path.startswith(CONTROL):
                    status, answer = proxy.control(self.command, self.path, body)
                    self._answer(status, "OK" if status == 200 else "Error", [], json.dumps(answer).encode())
                    return
                with proxy._lock:
                    proxy.requests += 1
                    if proxy.seen is not None:
                        proxy.seen.append(f"{self.command} {self.path}")
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
                length = str(len(data))
                if self.command == "HEAD":  # no body, but the object's length: clients size reads by it
                    length = next((v for k, v in headers if k.lower() == "content-length"), "0")
                try:
                    self.send_response(status, reason)  # adds its own Server and Date
                    for name, value in headers:
                        if name.lower() not in _HOP_BY_HOP and name.lower() not in _REWRITTEN:
                            self.send_header(name, value)
                    self.send_header("Content-Length", length)
                    self.end_headers()
                    if self.command != "HEAD" and data:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up on this request (a timeout)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
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


class RemoteRule:
    """A rule installed in the proxy process: ``hits`` (the requests it hit so far) and ``times``
    (how many more it applies to) are read from there."""

    def __init__(self, proxy: S3Proxy, index: int) -> None:
        self._proxy = proxy
        self.index = index

    def _state(self) -> dict[str, Any]:
        return dict(self._proxy._control("GET", f"rules/{self.index}"))

    @property
    def hits(self) -> list[str]:
        return list(self._state()["hits"])

    @property
    def times(self) -> int:
        return int(self._state()["times"])


class S3Proxy:
    """The proxy, in a process of its own listening on a free 127.0.0.1 port; a context manager.

    Args:
        upstream: the S3 server's endpoint, ``http://127.0.0.1:<port>``.
        delay_ms: added before forwarding every request (settable while it runs).
    """

    def __init__(self, upstream: str, delay_ms: float = 0.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = upstream
        self._delay_ms = delay_ms
        self._proc: subprocess.Popen[str] | None = None
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
    ) -> RemoteRule:
        """Answer the next ``times`` matching requests with ``status`` (after forwarding when ``after``)."""
        return self._add(Rule(method, path, status=status, after=after, times=times))

    def slow(self, path: str, hold_ms: float, *, method: str | None = None, times: int = 1) -> RemoteRule:
        """Hold the next ``times`` matching requests ``hold_ms`` before forwarding them."""
        return self._add(Rule(method, path, status=0, hold_ms=hold_ms, times=times))

    def clear(self) -> None:
        """Drop every rule (the delay stays)."""
        self._control("POST", "clear", {})

    def record(self, on: bool = True) -> list[str]:
        """Start (``on``) or stop recording every request as ``"METHOD target"``; returns what was
        recorded since the previous call."""
        return list(self._control("POST", "record", {"on": on})["seen"])

    def round_trips(self) -> list[float]:
        """How long each request took in the proxy since the previous call, in ms, from its first
        byte read to its answer written: the injected delay plus the server's own time, the round
        trip a client of this store sees (the loopback hops to and from the proxy apart)."""
        return [float(ms) for ms in self._control("POST", "round-trips", {})["round_trips_ms"]]

    @property
    def requests(self) -> int:
        """Requests the proxy received so far (control requests apart)."""
        return int(self._control("GET", "stats")["requests"])

    @property
    def delay_ms(self) -> float:
        return self._delay_ms

    @delay_ms.setter
    def delay_ms(self, value: float) -> None:
        self._delay_ms = value
        if self._proc is not None:
            self._control("POST", "delay", {"delay_ms": value})

    def _add(self, rule: Rule) -> RemoteRule:
        answer = self._control("POST", "rules", asdict(rule))
        return RemoteRule(self, int(answer["id"]))

    def _control(self, method: str, what: str, payload: Any = None) -> Any:
        if self._proc is None:
            raise RuntimeError("the proxy is not running: start() it first")
        parts = urlsplit(self.endpoint)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        try:
            body = json.dumps(payload).encode() if payload is not None else b""
            conn.request(method, CONTROL + what, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = json.loads(resp.read() or b"{}")
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"proxy control {method} {what}: {data}")
        return data

    # ------------------------------------------------------------------ life cycle
    def start(self, timeout_s: float = 30) -> S3Proxy:
        """Start the proxy process and wait until it listens."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.s3proxy", self.upstream, "--delay-ms", str(self._delay_ms)],
            cwd=ROOT,
            stdin=subprocess.PIPE,  # closed by this process's end: the proxy then ends too
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the S3 proxy did not start: {line!r}")
        self.endpoint = line
        return self

    def stop(self) -> None:
        """End the proxy process."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> S3Proxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """The proxy process: prints its endpoint, serves until its stdin closes or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.s3proxy", description=__doc__.splitlines()[0])
    parser.add_argument("upstream", help="the S3 server, http://127.0.0.1:<port>")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = _ProxyServer(args.upstream, args.delay_ms).start(args.port)
    print(server.endpoint, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        sys.stdin.read()  # EOF: the parent ended (or closed it)
    server.stop()
    return 0


def _error_body(status: int) -> bytes:
    code = {503: "SlowDown", 500: "InternalError", 502: "BadGateway", 408: "RequestTimeout"}.get(
        status, "Error"
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>injected by the test proxy</Message></Error>"
    ).encode()


if __name__ == "__main__":
    sys.exit(main())
