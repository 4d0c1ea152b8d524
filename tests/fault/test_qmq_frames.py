"""Garbage on QMQ's wire: bad, truncated, oversized and slow frames close the connection that sent
them, unreadable requests get QMQ's error answers; the door keeps serving (meta server, broker and
locator) and no table gets a new version."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from engine import Admin, Store
from engine.qmq import QmqServer, codec
from engine.qmq.codec import Frame, QmqMessage
from engine.store import schemas
from tests.qmq.qmq_client import QmqWire, locate, register

pytestmark = pytest.mark.fault


@pytest.fixture
def server(store: Store) -> Iterator[QmqServer]:
    Admin(store).create_topic("T", 2)
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0, frame_timeout_s=1.0) as srv:
        yield srv


def _versions(store: Store) -> dict[str, int]:
    return {name: store.version(name) for name in schemas.SCHEMAS}


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(30)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def _header(magic: int = codec.MAGIC, code: int = codec.Code.SEND_MESSAGE) -> bytes:
    return codec.HEADER.pack(magic, code, 9, 1, 0, code)


GARBAGE = {
    "http request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "negative length": struct.pack(">i", -5) + b"abcd",
    "length below a header": struct.pack(">i", 10) + b"x" * 10,
    "oversized length": struct.pack(">i", 16 * 1024 * 1024 + 1) + b"x" * 100,
    "header size past the frame": struct.pack(">ih", 20, 500) + _header(),
    "header size below 18": struct.pack(">ih", 20, 4) + _header(),
    "bad magic": struct.pack(">ih", 20, 18) + _header(magic=0x12345678),
    "random bytes": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_closes_the_connection_and_writes_nothing(store: Store, server: QmqServer, name: str) -> None:
    before = _versions(store)
    for address in (server.broker_address, server.meta_address):
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(GARBAGE[name])
            assert _closed_by_server(sock)
    assert _versions(store) == before
    _still_serves(server)


@pytest.mark.parametrize("cut", [1, 4, 10, 30])
def test_a_truncated_frame_from_a_vanished_client_is_dropped(
    store: Store, server: QmqServer, cut: int
) -> None:
    body = codec.encode_send_messages([QmqMessage("T", "id", 1, 2, attrs=codec.encode_attrs({"k": "v"}))])
    frame = codec.encode_frame(Frame(codec.Code.SEND_MESSAGE, 1, 0, 9, 10, body))
    before = _versions(store)
    host, port = server.broker_address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(frame[: len(frame) - cut])
    assert _versions(store) == before
    _still_serves(server)


def test_a_slow_client_that_stops_mid_frame_is_closed(server: QmqServer) -> None:
    host, port = server.broker_address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(struct.pack(">ih", 40, 18) + _header())  # then nothing: the body never comes
        assert _closed_by_server(sock)
    _still_serves(server)


def test_unreadable_requests_are_answered_on_a_connection_that_stays_open(
    store: Store, server: QmqServer
) -> None:
    before = _versions(store)
    with QmqWire(server.broker_address) as wire:
        assert wire.request(9999).code == codec.Code.UNKNOWN_CODE
        assert wire.request(codec.Code.SEND_MESSAGE, b"\xff" * 40).code == codec.Code.BROKER_ERROR
        assert wire.request(codec.Code.PULL_MESSAGE, b"\x00\x01").code == codec.Code.PARAM_ERROR
        assert wire.request(codec.Code.ACK_REQUEST, b"\x7f\xff").code == codec.Code.PARAM_ERROR
        assert wire.request(codec.Code.CLIENT_REGISTER).code == codec.Code.UNKNOWN_CODE  # not a broker code
    with QmqWire(server.meta_address) as wire:
        assert wire.request(codec.Code.CLIENT_REGISTER, b"\x00\x05\x00").code == codec.Code.PARAM_ERROR
    assert _versions(store) == before


def _still_serves(server: QmqServer) -> None:
    assert locate(server.meta_server_url) == server.meta_address
    assert register(server.meta_address, codec.ClientType.PRODUCER, "T").code == codec.Code.SUCCESS
    with QmqWire(server.broker_address) as wire:
        assert wire.request(codec.Code.HEARTBEAT).code == codec.Code.SUCCESS
