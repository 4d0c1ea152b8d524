"""Receipt handles across doors: a 5.x client that reconnects to another ``mq serve --grpc`` over the
same store with its client id keeps its leases there (acks and changes of its handles work), and a
handle whose lease was superseded (the message delivered again) is refused on every door."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from engine import Admin, Message, Producer, SimpleConsumer, Store
from engine.errors import InvalidReceiptHandleError
from engine.grpc import GrpcServer
from engine.grpc.v2 import definition_pb2 as pb
from engine.grpc.v2 import service_pb2 as spb
from engine.grpc.v2 import service_pb2_grpc as spb_grpc
from engine.protocol.selectors import MessageSelector

META = (("x-mq-client-id", "client-1"),)


@pytest.fixture
def doors(tmp_path: Path) -> Iterator[tuple[GrpcServer, GrpcServer]]:
    """Two doors, each on a store of its own opened on one root, with 2 messages in ``orders``."""
    root = tmp_path / "mq"
    store = Store.open(root)
    Admin(store).create_topic("orders", 1)
    with Producer(store, "p") as producer:
        for i in range(2):
            producer.send(Message("orders", f"m{i}".encode()))
    with GrpcServer(store, port=0) as first, GrpcServer(Store.open(root), port=0) as second:
        yield first, second


def stub(door: GrpcServer) -> Iterator[spb_grpc.MessagingServiceStub]:
    with grpc.insecure_channel(door.address) as channel:
        yield spb_grpc.MessagingServiceStub(channel)


def receive(messaging: spb_grpc.MessagingServiceStub, n: int) -> list[pb.Message]:
    request = spb.ReceiveMessageRequest(batch_size=n)
    request.group.name = "g1"
    request.message_queue.topic.name = "orders"
    request.invisible_duration.FromSeconds(30)
    request.long_polling_timeout.FromSeconds(5)
    return [r.message for r in messaging.ReceiveMessage(request, metadata=META) if r.HasField("message")]


def ack(messaging: spb_grpc.MessagingServiceStub, handle: str) -> int:
    request = spb.AckMessageRequest(entries=[spb.AckMessageEntry(message_id="x", receipt_handle=handle)])
    request.group.name = "g1"
    request.topic.name = "orders"
    return int(messaging.AckMessage(request, metadata=META).status.code)


def change(messaging: spb_grpc.MessagingServiceStub, handle: str) -> tuple[int, str]:
    request = spb.ChangeInvisibleDurationRequest(receipt_handle=handle, message_id="x")
    request.group.name = "g1"
    request.topic.name = "orders"
    request.invisible_duration.FromSeconds(60)
    answer = messaging.ChangeInvisibleDuration(request, metadata=META)
    return int(answer.status.code), answer.receipt_handle


def test_a_client_reconnected_to_another_door_acks_and_changes_its_handles_there(
    doors: tuple[GrpcServer, GrpcServer],
) -> None:
    first, second = doors
    for on_first in stub(first):
        got = receive(on_first, 2)
    assert sorted(m.body for m in got) == [b"m0", b"m1"]
    handles = {m.body: m.system_properties.receipt_handle for m in got}
    for on_second in stub(second):
        code, changed = change(on_second, handles[b"m0"])
        assert code == pb.OK and changed != handles[b"m0"]
        assert ack(on_second, changed) == pb.OK
        assert ack(on_second, handles[b"m1"]) == pb.OK
        assert ack(on_second, handles[b"m1"]) == pb.INVALID_RECEIPT_HANDLE  # acked already
    second.stop()  # its acks are appended
    with SimpleConsumer(first.store, "g1", "inspect") as consumer:
        consumer.subscribe("orders")
        assert consumer.receive(16, 30_000) == []


def test_a_handle_whose_lease_was_superseded_is_refused_on_every_door(
    doors: tuple[GrpcServer, GrpcServer],
) -> None:
    first, second = doors
    everything = MessageSelector.by_tag("*")
    [message] = first.receive("g1", "client-1", "orders", everything, 1, 1000, 0)
    old = first.handle_of("g1", "client-1", message)
    time.sleep(max(0.0, (message.invisible_until_ms - time.time() * 1000) / 1000) + 0.1)
    # Its invisible time ended: the client, now on the second door, gets it again (attempt 2).
    again = [
        m
        for _ in range(20)
        for m in second.receive("g1", "client-1", "orders", everything, 2, 30_000, 500)
        if m.queue_offset == message.queue_offset
    ][:1]
    assert [m.reconsume_times for m in again] == [1]
    for door in (first, second):
        with pytest.raises(InvalidReceiptHandleError):
            door.ack("g1", "client-1", old)
    second.ack("g1", "client-1", second.handle_of("g1", "client-1", again[0]))
