"""Faults at RocketMQ 5's gRPC door: garbage bytes on its port, calls whose request does not parse,
unknown calls and messages over its limits are answered with an error and write no table; a client
SIGKILLed in the middle of a receive leaves its leased messages to another consumer after their
invisible time; the door keeps serving throughout. Each scenario records a row in FAULTS.md."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator

import grpc
import pytest

from engine import Admin, Store
from engine.grpc import GrpcServer
from engine.grpc.server import MAX_INBOUND_BYTES
from engine.grpc.v2 import definition_pb2 as pb
from engine.grpc.v2 import service_pb2 as spb
from engine.grpc.v2 import service_pb2_grpc as spb_grpc
from engine.store import schemas
from tests.fault.history import Figures, History, check, record
from tests.grpc.official_client import run as official
from tests.grpc.official_client import start

pytestmark = pytest.mark.fault

META = (("x-mq-client-id", "fault-client"),)
SERVICE = "/apache.rocketmq.v2.MessagingService/"


@pytest.fixture
def door(store: Store) -> Iterator[GrpcServer]:
    Admin(store).create_topic("orders", 2)
    with GrpcServer(store, port=0) as running:
        yield running


def _versions(store: Store) -> dict[str, int]:
    return {name: store.version(name) for name in schemas.SCHEMAS}


def _closed_by_server(sock: socket.socket) -> bool:
    """The server ends the connection (an HTTP/2 GOAWAY frame may come first)."""
    sock.settimeout(30)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def _still_serves(door: GrpcServer) -> str:
    """A message sent and received through the door's own stubs; its id."""
    with grpc.insecure_channel(door.address) as channel:
        stub = spb_grpc.MessagingServiceStub(channel)
        message = pb.Message(body=b"still here")
        message.topic.name = "orders"
        message.system_properties.message_id = "STILL-1"
        answer = stub.SendMessage(spb.SendMessageRequest(messages=[message]), metadata=META, timeout=30)
        assert answer.status.code == pb.OK, answer.status
        return answer.entries[0].message_id


GARBAGE = {
    "http/1.1 request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "random bytes": bytes(range(256)) * 4,
    "preface then garbage frame": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64,
    "truncated preface": b"PRI * HTTP/2.0\r\n",
}
_frames: dict[str, bool] = {}


@pytest.fixture(scope="module", autouse=True)
def _record_frames() -> Iterator[None]:
    """One FAULTS.md row for the bad-frames cases of this module: how many, and how many wrote."""
    yield
    if _frames:
        wrote = sorted(name for name, clean in _frames.items() if not clean)
        figures = Figures(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, problems=wrote)
        record(
            "gRPC door: bad frames and malformed calls", figures, cases=len(_frames), wrote_or_died=len(wrote)
        )


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_on_the_port_closes_the_connection_and_writes_nothing(
    store: Store, door: GrpcServer, name: str
) -> None:
    _frames[name] = False
    before = _versions(store)
    host, port = door.address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(GARBAGE[name])
        if name == "truncated preface":
            sock.shutdown(socket.SHUT_WR)  # the client vanishes half-way through the preface
        assert _closed_by_server(sock)
    assert _versions(store) == before
    _still_serves(door)
    _frames[name] = True


@pytest.mark.parametrize(
    ("method", "payload", "code"),
    [
        ("SendMessage", b"\xff\xff\xff\xff", grpc.StatusCode.INTERNAL),  # not a protobuf message
        ("EndTransaction", b"\x0a\x05\xff", grpc.StatusCode.INTERNAL),  # a field cut short
        ("NoSuchCall", b"", grpc.StatusCode.UNIMPLEMENTED),
    ],
)
def test_a_call_whose_request_does_not_parse_is_an_error_and_writes_nothing(
    store: Store, door: GrpcServer, method: str, payload: bytes, code: grpc.StatusCode
) -> None:
    case = f"malformed {method}"
    _frames[case] = False
    before = _versions(store)
    with grpc.insecure_channel(door.address) as channel:
        call = channel.unary_unary(SERVICE + method)
        with pytest.raises(grpc.RpcError) as caught:
            call(payload, metadata=META, timeout=30)
    assert caught.value.code() == code  # type: ignore[attr-defined]
    assert _versions(store) == before
    _still_serves(door)
    _frames[case] = True


def test_messages_over_the_limits_are_refused_and_write_nothing(store: Store, door: GrpcServer) -> None:
    _frames["over-limit messages"] = False
    before = _versions(store)
    with grpc.insecure_channel(door.address, options=[("grpc.max_send_message_length", -1)]) as channel:
        stub = spb_grpc.MessagingServiceStub(channel)
        message = pb.Message(body=b"x" * (4 * 1024 * 1024 + 1))  # RocketMQ 5's body limit + 1
        message.topic.name = "orders"
        message.system_properties.message_id = "BIG-1"
        answer = stub.SendMessage(spb.SendMessageRequest(messages=[message]), metadata=META, timeout=60)
        assert answer.status.code == pb.MESSAGE_BODY_TOO_LARGE
        # A frame past what the transport takes at all: refused by gRPC before the door reads it.
        message.body = b"x" * (MAX_INBOUND_BYTES + 1)
        with pytest.raises(grpc.RpcError) as caught:
            stub.SendMessage(spb.SendMessageRequest(messages=[message]), metadata=META, timeout=120)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert _versions(store) == before
    _still_serves(door)
    _frames["over-limit messages"] = True


def test_a_client_killed_mid_receive_leaves_its_messages_to_another_consumer(
    store: Store, door: GrpcServer
) -> None:
    history = History()
    sent = official("send", door.address, "orders", 4)["ids"]
    history.add("sent", sent)
    history.add("acknowledged", sent)
    proc = start("receive_hold", door.address, "orders", "g1", 4)
    try:
        assert proc.stdout is not None
        held = json.loads(proc.stdout.readline() or "null")
        assert held is not None, proc.stderr.read() if proc.stderr else ""
        history.add("received", held["held"])
    finally:
        proc.send_signal(signal.SIGKILL)  # in the middle of its next receive's long polling
        proc.wait(60)
    # Another client of the group gets them once their 10 s invisible time is over (attempt 2).
    again = official("receive_ack", door.address, "orders", "g1", 4)["received"]
    history.add("received", [m["id"] for m in again])
    history.add("acked", [m["id"] for m in again])
    after = _still_serves(door)
    history.add("sent", [after])
    history.add("acknowledged", [after])
    figures = check(store, history, topics=["orders"], id_of="uniq_key")
    record(
        "gRPC door: official client SIGKILLed mid-receive",
        figures,
        held=len(held["held"]),
        redelivered_to_other=len(again),
    )
    assert sorted(held["held"]) == sorted(sent)
    assert sorted(m["id"] for m in again) == sorted(sent)
    assert {m["attempt"] for m in again} == {2}
    figures.assert_ok()
