"""The injecting S3 proxy (:class:`bench.s3proxy.S3Proxy`) in a process of its own, for benchmarks.

In the benchmark's own process the proxy shares the GIL with the client it measures: every Python
thread of the client slows its answers, and a delta-rs call that does I/O while holding the GIL
(pyarrow's file handle over delta-rs's storage handler does) waits for an answer the proxy can never
give until the HTTP client times out (a first send took 264 s that way). A spawned process has
neither problem; the parent asks it for its request count over a pipe.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any


def _serve(upstream: str, delay_ms: float, conn: Connection, log: str | None) -> None:
    from bench.s3proxy import S3Proxy

    if log is not None:  # a client hanging up mid-answer prints a traceback per request: keep them apart
        sys.stderr = open(log, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    with S3Proxy(upstream, delay_ms=delay_ms) as proxy:
        conn.send(proxy.endpoint)
        while True:
            try:
                command = conn.recv()
            except EOFError:  # the parent is gone
                return
            if command == "requests":
                conn.send(proxy.requests)
            elif command == "stop":
                conn.send(None)
                return


class ProxyProcess:
    """``S3Proxy(upstream, delay_ms)`` running in a spawned process; a context manager. The
    process's stderr goes to ``log`` when given.

    Attributes:
        endpoint: the proxy's ``http://127.0.0.1:<port>`` (point storage options at it).
    """

    def __init__(self, upstream: str, delay_ms: float = 0.0, log: Path | None = None) -> None:
        self.upstream, self.delay_ms, self.log = upstream, delay_ms, log
        self.endpoint = ""
        self._conn: Connection | None = None
        self._proc: Any = None

    def start(self, timeout_s: float = 60.0) -> ProxyProcess:
        """Start the process and wait for its endpoint."""
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(self.upstream, self.delay_ms, child, None if self.log is None else str(self.log)),
            daemon=True,
        )
        self._proc.start()
        child.close()
        if not parent.poll(timeout_s):
            self.stop()
            raise RuntimeError(f"the S3 proxy process did not start in {timeout_s:.0f} s")
        self.endpoint, self._conn = parent.recv(), parent
        return self

    @property
    def requests(self) -> int:
        """Requests the proxy has received so far."""
        if self._conn is None:
            raise RuntimeError("the proxy process is not running")
        self._conn.send("requests")
        return int(self._conn.recv())

    def stop(self) -> None:
        """Stop the proxy and its process."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.send("stop")
                conn.poll(10)
            except (OSError, EOFError):
                pass
            conn.close()
        if self._proc is not None:
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(10)
            self._proc = None

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
