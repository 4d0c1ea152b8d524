"""Parked pulls (engine.remoting.pull_hold): a long-polling pull waits on the event loop, not on a
thread, and is woken by a send through the endpoint, by a message another writer committed, or by
the end of its suspension."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from engine import Message, Producer, Store
from engine.remoting import RemotingServer
from engine.remoting.codes import PullSysFlag, ResponseCode
from tests.remoting.wire_client import WireClient

SUSPEND = int(PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    return thread, out


def _until(cond: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_more_parked_pulls_than_pull_threads_are_all_answered_by_one_send_each(
    server: RemotingServer,
) -> None:
    pulls = 3 * server.ctx.pull_executor._max_workers  # more than could each hold a thread
    clients = [WireClient(server.broker_address) for _ in range(pulls)]
    parked = [
        _in_thread(lambda c=c: c.pull("G", "T", 1, 0, sys_flag=SUSPEND, suspend_ms=20_000, timeout=60))
        for c in clients
    ]
    _until(lambda: server.ctx.hold.parked == pulls)
    sender = WireClient(server.broker_address)
    # Parked pulls hold no thread: the send is served at once, and wakes every one of them
    # (no dispatch runs here: they read the message from the commit log's tail).
    assert sender.send("T", b"for all", queue_id=1).code == ResponseCode.SUCCESS
    for thread, out in parked:
        thread.join(60)
        [(response, messages)] = out
        assert response.code == ResponseCode.SUCCESS
        assert [m.body for m in messages] == [b"for all"]
    assert server.ctx.hold.parked == 0
    for c in [*clients, sender]:
        c.close()


def test_a_parked_pull_is_woken_by_a_message_another_writer_committed(
    store: Store, server: RemotingServer, broker: WireClient
) -> None:
    thread, out = _in_thread(
        lambda: broker.pull("G", "T", 3, 0, sys_flag=SUSPEND, suspend_ms=20_000, timeout=60)
    )
    _until(lambda: server.ctx.hold.parked == 1)
    with Producer(Store.open(store.root)) as producer:  # not through the endpoint: the watcher sees it
        producer.send(Message("T", b"from elsewhere"), queue_id=3)
    thread.join(60)
    [(response, messages)] = out
    assert response.code == ResponseCode.SUCCESS
    assert [m.body for m in messages] == [b"from elsewhere"]


def test_a_send_to_another_queue_leaves_a_parked_pull_parked_until_its_time_is_up(
    server: RemotingServer, broker: WireClient
) -> None:
    began = time.monotonic()
    thread, out = _in_thread(
        lambda: broker.pull("G", "T", 0, 0, sys_flag=SUSPEND, suspend_ms=1_500, timeout=60)
    )
    _until(lambda: server.ctx.hold.parked == 1)
    sender = WireClient(server.broker_address)
    sender.send("T", b"elsewhere", queue_id=2)
    sender.close()
    thread.join(60)
    [(response, messages)] = out
    assert (response.code, messages) == (ResponseCode.PULL_NOT_FOUND, [])
    assert time.monotonic() - began >= 1.5
    assert server.ctx.hold.parked == 0


def test_a_pull_that_does_not_suspend_is_answered_at_once(server: RemotingServer, broker: WireClient) -> None:
    response, messages = broker.pull("G", "T", 0, 0, sys_flag=int(PullSysFlag.SUBSCRIPTION))
    assert (response.code, messages) == (ResponseCode.PULL_NOT_FOUND, [])
    assert server.ctx.hold.parked == 0


def test_a_client_that_hangs_up_while_parked_leaves_nothing_parked(server: RemotingServer) -> None:
    client = WireClient(server.broker_address)

    def pull() -> object:
        try:
            return client.pull("G", "T", 0, 0, sys_flag=SUSPEND, suspend_ms=20_000, timeout=5)
        except Exception as exc:  # the connection it waits on is closed under it
            return exc

    thread, _ = _in_thread(pull)
    _until(lambda: server.ctx.hold.parked == 1)
    client.close()
    _until(lambda: server.ctx.hold.parked == 0)  # long before its 20 s suspension ends
    thread.join(60)
