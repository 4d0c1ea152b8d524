"""Garbage on the wire: bad, truncated, oversized and slow frames close the connection that sent
them (or get RocketMQ's error response); the server keeps serving and no table gets a new version."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from engine import Admin, Store
from engine.remoting import RemotingServer
from engine.remoting.codes import RequestCode, ResponseCode
from engine.store import schemas
from tests.remoting.wire_client import WireClient

pytestmark = pytest.mark.fault


@pytest.fixture
def server(store: Store) -> Iterator[RemotingServer]:
    Admin(store).create_topic("T", 2)
    with RemotingServer(
        store, namesrv_port=0, broker_port=0, run_broker_jobs=False, frame_timeout_s=1.0
    ) as srv:
        yield srv


def _versions(store: Store) -> dict[str, int]:
    return {name: store.version(name) for name in schemas.SCHEMAS}


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed the connection (a read returns EOF or a reset)."""
    sock.settimeout(30)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def _header(code: int = 105) -> bytes:
    return b'{"code":%d,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":1,"version":399}' % code


GARBAGE = {
    "http request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "negative length": struct.pack(">i", -5) + b"abcd",
    "length below the header word": struct.pack(">i", 2) + b"ab",
    "oversized length": struct.pack(">i", 16 * 1024 * 1024 + 1) + b"x" * 100,
    "header length past the frame": struct.pack(">ii", 8, 1000) + b"abcd",
    "unknown serialize type": struct.pack(">ii", 4 + 2, (7 << 24) | 2) + b"{}",
    "not json": struct.pack(">ii", 4 + 5, 5) + b"{nope",
    "json array": struct.pack(">ii", 4 + 2, 2) + b"[]",
    "malformed binary header": struct.pack(">ii", 4 + 3, (1 << 24) | 3) + b"\x00\x01\x00",
    "random bytes": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_closes_the_connection_and_writes_nothing(
    store: Store, server: RemotingServer, name: str
) -> None:
    before = _versions(store)
    for address in (server.broker_address, server.namesrv_address):
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(GARBAGE[name])
            assert _closed_by_server(sock)
    assert _versions(store) == before
    _still_serves(server)


@pytest.mark.parametrize("cut", [1, 4, 10, 60])
def test_a_truncated_frame_from_a_vanished_client_is_dropped(
    store: Store, server: RemotingServer, cut: int
) -> None:
    header = _header(RequestCode.SEND_MESSAGE_V2)
    frame = struct.pack(">ii", 4 + len(header) + 5, len(header)) + header + b"hello"
    before = _versions(store)
    host, port = server.broker_address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(frame[: len(frame) - cut])
    assert _versions(store) == before
    _still_serves(server)


def test_a_slow_client_that_stops_mid_frame_is_closed(store: Store, server: RemotingServer) -> None:
    header = _header()
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header
    host, port = server.broker_address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(frame[:20])  # then nothing: the frame never completes
        assert _closed_by_server(sock)
    _still_serves(server)


def test_unknown_codes_and_bad_fields_are_answered_on_a_connection_that_stays_open(
    store: Store, server: RemotingServer
) -> None:
    before = _versions(store)
    client = WireClient(server.broker_address)
    assert client.call(12345).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    bad_pull = {"consumerGroup": "G", "topic": "T", "queueId": "zero", "queueOffset": 0}
    assert client.call(RequestCode.PULL_MESSAGE, bad_pull).code == ResponseCode.SYSTEM_ERROR
    assert client.call(RequestCode.HEART_BEAT, body=b"not json").code == ResponseCode.SYSTEM_ERROR
    assert (
        client.call(RequestCode.LOCK_BATCH_MQ, body=b'{"consumerGroup":"G"}').code
        == ResponseCode.SYSTEM_ERROR
    )
    assert client.send("T", b"x" * (4 * 1024 * 1024 + 1)).code == ResponseCode.MESSAGE_ILLEGAL
    assert client.send("T", b"\x00garbage", sys_flag=1).code == ResponseCode.MESSAGE_ILLEGAL  # not zlib
    assert client.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 10**12}).code == ResponseCode.SYSTEM_ERROR
    assert _versions(store) == before
    assert client.send("T", b"still here").code == ResponseCode.SUCCESS
    client.close()


def _still_serves(server: RemotingServer) -> None:
    namesrv = WireClient(server.namesrv_address)
    assert namesrv.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}).code == ResponseCode.SUCCESS
    namesrv.close()
    broker = WireClient(server.broker_address)
    assert broker.call(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0}).code == ResponseCode.SUCCESS
    broker.close()
