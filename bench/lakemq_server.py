"""lakemq's RocketMQ endpoint (``mq serve``) as a process: started on free loopback ports, stopped after.

The tests of the real RocketMQ client and the wire benchmark talk to it exactly as to the real
RocketMQ broker: a name server address, nothing else.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from bench.java_harness import ROOT, HarnessError
from bench.peers import free_port, stop_process_group

START_TIMEOUT_S = 120.0


def _answers_route_query(port: int, topic: str = "TBW102") -> bool:
    """True when the name server answers a GET_ROUTEINFO_BY_TOPIC request (with any response code)."""
    from engine.remoting.codes import RequestCode
    from engine.remoting.frames import RemotingCommand, decode_frame, encode_command

    request = RemotingCommand(
        code=int(RequestCode.GET_ROUTEINFO_BY_TOPIC), opaque=1, ext_fields={"topic": topic}
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(encode_command(request))
            head = s.recv(4, socket.MSG_WAITALL)
            length = int.from_bytes(head, "big")
            return len(head) == 4 and decode_frame(s.recv(length, socket.MSG_WAITALL)).opaque == 1
    except OSError:
        return False


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class LakemqServer:
    """``mq serve`` over the store at ``store_root``; a context manager. ``namesrv`` is ``host:port``."""

    def __init__(self, store_root: Path, log: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.store_root = store_root
        self.log = log
        self.extra_args = extra_args
        self.namesrv = ""
        self.broker_port = 0
        self.why = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self, namesrv_port: int, broker_port: int) -> list[str]:
        return [
            sys.executable, "-m", "engine.cli", "serve", "--store", str(self.store_root),
            "--host", "127.0.0.1",
            "--namesrv-port", str(namesrv_port),
            "--broker-port", str(broker_port),
            *self.extra_args,
        ]  # fmt: skip

    def __enter__(self) -> LakemqServer:
        namesrv_port, broker_port = free_port(), free_port()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                self.command(namesrv_port, broker_port),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        # ready when both ports accept and the name server answers (what the RocketMQ peer's "boot
        # success" line says); a client's first route query times out after 3 s
        while not (_accepts(namesrv_port) and _accepts(broker_port) and _answers_route_query(namesrv_port)):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.why = f"mq serve did not start (exit code {self._proc.poll()}):\n{self.output()[-3000:]}"
                self.stop()
                return self
            time.sleep(0.1)
        self.namesrv = f"127.0.0.1:{namesrv_port}"
        self.broker_port = broker_port
        return self

    @property
    def pids(self) -> list[int]:
        """The server's process (its broker process descends from it); empty when not running."""
        return [] if self._proc is None else [self._proc.pid]

    def output(self) -> str:
        """What the server printed so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def check(self) -> None:
        """Raise HarnessError when the server is not running (with what it printed)."""
        if self._proc is None or self._proc.poll() is not None:
            code = None if self._proc is None else self._proc.poll()
            raise HarnessError(
                f"mq serve is not running (exit code {code}): {self.why}\n{self.output()[-3000:]}"
            )

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 15 s."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process_group(proc)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
