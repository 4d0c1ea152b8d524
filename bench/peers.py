"""The peers of the benchmark: a Redis server on loopback, and bare delta-rs tables.

Redis runs as a real broker: ``redis-server`` installed with apt-get when missing (as ``.ci/run``
does), started on a free loopback port with persistence off, stopped when the run ends, also on an
error or Ctrl-C. When it cannot be installed or started, the Redis columns say why and the run goes on.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from engine.store import schemas


class PortBook:
    """Free ports on 127.0.0.1, never one handed out twice by one book (see :func:`free_port`)."""

    def __init__(self) -> None:
        self.given: set[int] = set()

    def free_port(self, preferred: int | None = None) -> int:
        """A free port on 127.0.0.1: ``preferred`` when it is free, else one the kernel picks.

        No port is handed out twice: a port is free again once its probe socket is closed, and the
        kernel gives a port closed a moment ago to the next ephemeral bind, so two servers started
        together (a broker's two listeners) could otherwise be given the same one.
        """
        held: list[socket.socket] = []  # ports given already stay bound until one is found
        try:
            tries = ((preferred,) if preferred and preferred not in self.given else ()) + (0,) * 50
            for port in tries:
                s = socket.socket()
                held.append(s)
                try:
                    s.bind(("127.0.0.1", port or 0))
                except OSError:
                    continue
                found = int(s.getsockname()[1])
                if found not in self.given:
                    self.given.add(found)
                    return found
        finally:
            for s in held:
                s.close()
        raise OSError("no free port on 127.0.0.1")


PORTS = PortBook()
"""The process's book of ports: every server a test or benchmark starts takes its ports here."""
free_port = PORTS.free_port


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    """Stop a process started with ``start_new_session=True`` and all it started: SIGTERM to its
    process group, SIGKILL after ``grace_s``. Nothing happens when it has ended already."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass


def install_redis_server() -> str | None:
    """The path of ``redis-server``, installing it with apt-get when missing; None when impossible."""
    found = shutil.which("redis-server")
    if found or shutil.which("apt-get") is None:
        return found
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return None
        sudo = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "-q", "redis-server"]
    for cmd in (install, [*sudo, "apt-get", "update", "-q"], install):
        subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=600, check=False)
        if shutil.which("redis-server"):
            break
    return shutil.which("redis-server")


def redis_server_version(server: str | None) -> str:
    if server is None:
        return "not available"
    out = subprocess.run([server, "--version"], capture_output=True, text=True, check=False).stdout
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return out.strip() or "unknown"


class RedisServer:
    """A ``redis-server`` on a free loopback port, no persistence; a context manager.

    ``client`` is None (and ``why`` says why) when Redis is not available; callers then record the
    Redis columns as unavailable.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: Any = None
        self.why = ""
        self.binary: str | None = None

    def __enter__(self) -> RedisServer:
        try:
            import redis
        except ImportError:
            self.why = "redis-py is not installed"
            return self
        self.binary = install_redis_server()
        if self.binary is None:
            self.why = "redis-server is not installed and could not be installed"
            return self
        port = free_port()
        args = [
            self.binary,
            *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--dir", str(self.workdir), "--protected-mode", "yes", "--daemonize", "no"),
        ]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.why = f"redis-server did not start (exit code {self.proc.poll()})"
                    self.stop()
                    return self
                time.sleep(0.05)
        self.client = client
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ----------------------------------------------------------------------------- bare delta-rs
COMMIT_LOG_TABLE_CONFIG = {"delta.dataSkippingNumIndexedCols": "8"}  # as the store's commit log


def create_commit_log_like(uri: str, storage_options: dict[str, str] | None = None) -> DeltaTable:
    """An empty table with the commit log's schema and settings, for bare ``write_deltalake`` appends
    (``storage_options`` for an object-store ``uri``)."""
    return DeltaTable.create(
        uri,
        schemas.COMMIT_LOG_SCHEMA,
        mode="error",
        configuration=COMMIT_LOG_TABLE_CONFIG,
        storage_options=storage_options,
    )


def append_slices(dt: DeltaTable, parts: list[pa.Table]) -> float:
    """Append each part in its own commit; the seconds it took."""
    began = time.perf_counter()
    for part in parts:
        write_deltalake(dt, part, mode="append")
    return time.perf_counter() - began


def slices(rows: pa.Table, sizes: list[int]) -> list[pa.Table]:
    """``rows`` cut into consecutive slices of the given sizes."""
    out, start = [], 0
    for size in sizes:
        out.append(rows.slice(start, size))
        start += size
    return out
