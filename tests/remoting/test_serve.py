"""Entry points of the RocketMQ endpoint: ``mq serve`` (with the broker work in-process, so a send
becomes pullable without starting anything else) and ``jobs/broker.py --serve``'s options."""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

import pytest

from engine import Admin, Store
from engine.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from jobs.broker import serve_options
from tests.remoting.wire_client import WireClient
from tests.serve_process import STOP_WAIT_S, mq_serve


def test_mq_serve_makes_a_wire_send_pullable_and_stops_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "served"
    Admin(Store.open(root)).create_topic("T", 2)
    ports = ("--namesrv-port", "0", "--broker-port", "0")
    with mq_serve(root, *ports, errors=tmp_path / "serve.err") as (_, ready):
        assert ready["broker_jobs"] is True and ready["namesrv"].startswith("127.0.0.1:")
        namesrv = WireClient(ready["namesrv"])
        assert namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}).code == ResponseCode.SUCCESS
        namesrv.close()
        client = WireClient(ready["broker"])
        assert client.send("T", b"served", queue_id=1).code == ResponseCode.SUCCESS
        # Nobody dispatches but the server's own broker loop: a suspended pull is answered once it has.
        flags = int(PullSysFlag.SUSPEND)
        response, messages = client.pull("G", "T", 1, 0, sys_flag=flags, suspend_ms=20_000, timeout=60)
        while response.code == ResponseCode.PULL_NOT_FOUND:
            response, messages = client.pull("G", "T", 1, 0, sys_flag=flags, suspend_ms=20_000, timeout=60)
        assert response.code == ResponseCode.SUCCESS and [m.body for m in messages] == [b"served"]
        client.close()


def test_mq_serve_takes_sigterm_as_a_stop_from_the_moment_it_prints_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A supervisor may send SIGTERM the moment it reads the ready line: the handler must already be
    # there, or the default action ends the server without stopping its doors (CI met it: code -15).
    from engine.cli.app import main
    from engine.cli.common import Output

    root = str(tmp_path / "s")
    at_ready: list[object] = []

    def emit(self: Output, data: object, *rest: object) -> None:
        at_ready.append(signal.getsignal(signal.SIGTERM))
        if at_ready[-1] in (signal.SIG_DFL, signal.SIG_IGN, None):
            raise AssertionError("ready printed before SIGTERM stops the server")
        signal.raise_signal(signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(Output, "emit", emit)
    try:
        code = main(
            ["--store", root, "serve", "--no-broker-jobs", "--namesrv-port", "0", "--broker-port", "0"]
        )
    finally:
        signal.signal(signal.SIGTERM, before)
    assert code == 0 and len(at_ready) == 1


def _threads(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def _blocks(tid: int, sig: int) -> bool:
    status = Path(f"/proc/{tid}/status").read_text()
    blocked = next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(int(blocked, 16) >> (sig - 1) & 1)


def test_mq_serve_stops_on_a_sigterm_that_another_of_its_threads_takes(tmp_path: Path) -> None:
    # The kernel hands a process's signal to any thread not blocking it; Python runs the handler in
    # the main thread, which a wait without a timeout never woke: the server ran on, unstopped.
    root = tmp_path / "served"
    Admin(Store.open(root)).create_topic("T", 1)
    options = ("--no-broker-jobs", "--namesrv-port", "0", "--broker-port", "0")
    with mq_serve(root, *options, errors=tmp_path / "serve.err") as (proc, _):
        tid = next(t for t in _threads(proc.pid) if t != proc.pid and not _blocks(t, signal.SIGTERM))
        assert ctypes.CDLL(None, use_errno=True).tgkill(proc.pid, tid, signal.SIGTERM) == 0
        proc.wait(STOP_WAIT_S)  # stopped by the signal above (mq_serve sends none then), with code 0


def test_broker_app_serve_options_are_split_off_and_store_kept() -> None:
    args, rest = serve_options(["--serve", "--broker-port", "1234", "--store", "/s", "--once"])
    assert (args.serve, args.broker_port, args.namesrv_port, args.host, args.store) == (
        True,
        1234,
        9876,
        "127.0.0.1",
        "/s",
    )
    assert rest == ["--store", "/s", "--once"]
    plain, rest = serve_options(["--once"])
    assert not plain.serve and rest == ["--once"]


def test_mq_serve_refuses_a_bad_port_and_a_taken_one(tmp_path: Path) -> None:
    from engine.cli.app import main
    from engine.remoting import RemotingServer

    root = str(tmp_path / "s")
    assert main(["--store", root, "serve", "--broker-port", "-1"]) == 2
    with RemotingServer(Store.open(root), namesrv_port=0, broker_port=0, run_broker_jobs=False) as taken:
        code = main(
            ["--store", root, "serve", "--namesrv-port", "0", "--broker-port", str(taken.broker_port)]
        )
    assert code == 2
