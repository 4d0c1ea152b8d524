"""The gRPC door's transactions, dead letters and Telemetry commands, called through the door's own
stubs: transaction ids, EndTransaction's refusals, the check-back on a producer's Telemetry stream,
ForwardMessageToDeadLetterQueue, and thread-stack / verify commands answered on the stream or
refused with the proxy's statuses (never left hanging)."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from engine import PullConsumer, Store
from engine.broker.dispatch import dispatch_pending
from engine.broker.retry import route_retries
from engine.broker.transactions import check_transactions, undecided_halves
from engine.errors import InvalidArgumentError
from engine.grpc import GrpcServer
from engine.grpc.v2 import definition_pb2 as pb
from engine.grpc.v2 import service_pb2 as spb
from engine.grpc.v2 import service_pb2_grpc as spb_grpc
from engine.protocol.names import dlq_topic
from engine.protocol.rocketmq5 import TransactionId
from engine.store import schemas

META = (("x-mq-client-id", "test-client"),)


def message(body: bytes, kind: int = pb.NORMAL, message_id: str = "01ABC") -> pb.Message:
    out = pb.Message(body=body)
    out.topic.name = "orders"
    out.system_properties.message_id = message_id
    out.system_properties.message_type = kind  # type: ignore[assignment]
    return out


class Telemetry:
    """A client's Telemetry stream: what it sends goes through :meth:`send`, what the door sends
    arrives in :attr:`received`."""

    def __init__(self, stub: spb_grpc.MessagingServiceStub, settings: pb.Settings, client_id: str) -> None:
        self._out: queue.Queue[spb.TelemetryCommand | None] = queue.Queue()
        self.received: queue.Queue[spb.TelemetryCommand] = queue.Queue()
        first = spb.TelemetryCommand()
        first.settings.CopyFrom(settings)
        self._out.put(first)
        self.call = stub.Telemetry(iter(self._out.get, None), metadata=(("x-mq-client-id", client_id),))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.settings = self.next()

    def _read(self) -> None:
        try:
            for command in self.call:
                self.received.put(command)
        except grpc.RpcError:
            pass

    def next(self, timeout: float = 30) -> spb.TelemetryCommand:
        return self.received.get(timeout=timeout)

    def send(self, command: spb.TelemetryCommand) -> None:
        self._out.put(command)

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()


def producer_settings(topic: str = "orders") -> pb.Settings:
    settings = pb.Settings(client_type=pb.PRODUCER)
    settings.publishing.topics.add(name=topic)
    return settings


def test_a_transaction_id_round_trips_and_garbage_is_invalid_transaction_id() -> None:
    tid = TransactionId(1234, "01ABC")
    assert TransactionId.decode(tid.encode()) == tid
    for garbage in ("", "not-an-id", TransactionId(1, "x").encode()[:-2]):
        with pytest.raises(InvalidArgumentError) as caught:
            TransactionId.decode(garbage)
        assert caught.value.status == "INVALID_TRANSACTION_ID"


def test_a_transactional_send_is_a_half_message_until_committed(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    answer = stub.SendMessage(
        spb.SendMessageRequest(messages=[message(b"tx", pb.TRANSACTION)]), metadata=META
    )
    [entry] = answer.entries
    assert (answer.status.code, entry.message_id) == (pb.OK, "01ABC") and entry.transaction_id
    [half] = undecided_halves(store)[0]
    assert (half.topic, half.producer_group, half.uniq_key) == ("orders", "orders", "01ABC")

    end = spb.EndTransactionRequest(
        message_id="01ABC", transaction_id=entry.transaction_id, resolution=pb.COMMIT, source=pb.SOURCE_CLIENT
    )
    end.topic.name = "orders"
    assert stub.EndTransaction(end, metadata=META).status.code == pb.OK
    assert undecided_halves(store)[0] == []
    dispatch_pending(store)
    pulled = [m for q in range(2) for m in PullConsumer(store, "pg").pull("orders", q, 0).messages]
    assert [(m.msg_id, m.body) for m in pulled] == [("01ABC", b"tx")]
    # A second decision is answered OK and changes nothing (the first one stands).
    end.resolution = pb.ROLLBACK
    assert stub.EndTransaction(end, metadata=META).status.code == pb.OK


def test_end_transaction_refuses_ids_it_did_not_give_and_writes_nothing(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    answer = stub.SendMessage(
        spb.SendMessageRequest(messages=[message(b"tx", pb.TRANSACTION)]), metadata=META
    )
    real = answer.entries[0].transaction_id
    before = store.version(schemas.COMMIT_LOG)
    cases = [
        ("01ABC", "", pb.INVALID_TRANSACTION_ID),
        ("01ABC", "garbage", pb.INVALID_TRANSACTION_ID),
        ("OTHER", real, pb.INVALID_TRANSACTION_ID),
        ("01ABC", TransactionId(10**9, "01ABC").encode(), pb.INVALID_TRANSACTION_ID),
    ]
    for message_id, tid, code in cases:
        end = spb.EndTransactionRequest(message_id=message_id, transaction_id=tid, resolution=pb.COMMIT)
        end.topic.name = "orders"
        assert stub.EndTransaction(end, metadata=META).status.code == code, (message_id, tid)
    end = spb.EndTransactionRequest(message_id="01ABC", transaction_id=real, resolution=pb.COMMIT)
    end.topic.name = "nothing"
    assert stub.EndTransaction(end, metadata=META).status.code == pb.TOPIC_NOT_FOUND
    assert store.version(schemas.COMMIT_LOG) == before
    assert len(undecided_halves(store)[0]) == 1


def test_a_check_request_reaches_the_producers_stream_and_its_answer_decides(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    stub.SendMessage(spb.SendMessageRequest(messages=[message(b"tx", pb.TRANSACTION)]), metadata=META)
    stream = Telemetry(stub, producer_settings(), "producer-1")
    try:
        assert check_transactions(store, timeout_ms=0) == 1
        command = stream.next().recover_orphaned_transaction_command
        assert command.message.system_properties.message_id == "01ABC"
        assert command.message.system_properties.message_type == pb.TRANSACTION
        assert (command.message.topic.name, command.message.body) == ("orders", b"tx")
        end = spb.EndTransactionRequest(
            message_id="01ABC",
            transaction_id=command.transaction_id,
            resolution=pb.ROLLBACK,
            source=pb.SOURCE_SERVER_CHECK,
        )
        end.topic.name = "orders"
        assert stub.EndTransaction(end, metadata=META).status.code == pb.OK
        assert undecided_halves(store)[0] == []
    finally:
        stream.close()
    dispatch_pending(store)
    assert [m for q in range(2) for m in PullConsumer(store, "pg").pull("orders", q, 0).messages] == []


def test_a_thread_stack_command_is_answered_on_the_stream_and_a_silent_client_times_out(
    stub: spb_grpc.MessagingServiceStub, door: GrpcServer
) -> None:
    stream = Telemetry(stub, producer_settings(), "producer-1")
    try:
        asked = spb.TelemetryCommand()
        asked.print_thread_stack_trace_command.SetInParent()
        answered: list[spb.TelemetryCommand] = []
        waiter = threading.Thread(target=lambda: answered.append(door.ask("producer-1", asked, 30)))
        waiter.start()
        nonce = stream.next().print_thread_stack_trace_command.nonce
        reply = spb.TelemetryCommand(status=pb.Status(code=pb.OK))
        reply.thread_stack_trace.nonce = nonce
        reply.thread_stack_trace.thread_stack_trace = "main: waiting"
        stream.send(reply)
        waiter.join(60)
        assert answered[0].thread_stack_trace.thread_stack_trace == "main: waiting"

        verify = spb.TelemetryCommand()
        verify.verify_message_command.message.CopyFrom(message(b"check me"))
        with pytest.raises(InvalidArgumentError) as caught:
            door.ask("producer-1", verify, 0.5)  # the client never answers
        assert caught.value.status == "PROXY_TIMEOUT"
        assert stream.next().verify_message_command.message.body == b"check me"
        recover = spb.TelemetryCommand()
        recover.recover_orphaned_transaction_command.transaction_id = "x"
        with pytest.raises(InvalidArgumentError) as caught:
            door.ask("producer-1", recover, 1)  # not a command a client answers
        assert caught.value.status == "BAD_REQUEST"
    finally:
        stream.close()
    with pytest.raises(InvalidArgumentError) as caught:
        door.ask("nobody", asked, 1)
    assert caught.value.status == "NOT_FOUND"


def test_settings_without_publishing_or_subscription_end_the_stream_invalid_argument(
    stub: spb_grpc.MessagingServiceStub,
) -> None:
    command = spb.TelemetryCommand()
    command.settings.client_type = pb.PRODUCER
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Telemetry(iter([command]), metadata=META, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_an_answer_to_nothing_and_a_server_only_command_from_a_client_are_dropped(
    stub: spb_grpc.MessagingServiceStub,
) -> None:
    stream = Telemetry(stub, producer_settings(), "producer-1")
    try:
        stray = spb.TelemetryCommand()
        stray.thread_stack_trace.nonce = "never-asked"
        server_only = spb.TelemetryCommand()
        server_only.recover_orphaned_transaction_command.transaction_id = "x"
        again = spb.TelemetryCommand()
        again.settings.CopyFrom(producer_settings())
        for command in (stray, server_only, again):
            stream.send(command)
        # The stream still serves: the settings sent after them are answered.
        assert stream.next().settings.publishing.topics[0].name == "orders"
    finally:
        stream.close()


def test_forward_to_dead_letter_queue_moves_a_received_message_to_the_groups_dlq(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    stub.SendMessage(spb.SendMessageRequest(messages=[message(b"poison")]), metadata=META)
    receive = spb.ReceiveMessageRequest(batch_size=1)
    receive.group.name = "g1"
    receive.message_queue.topic.name = "orders"
    receive.invisible_duration.seconds = 30
    receive.long_polling_timeout.seconds = 5
    got = [
        r.message for r in stub.ReceiveMessage(receive, metadata=META, timeout=30) if r.HasField("message")
    ]
    [received] = got
    forward = spb.ForwardMessageToDeadLetterQueueRequest(
        receipt_handle=received.system_properties.receipt_handle,
        message_id=received.system_properties.message_id,
        delivery_attempt=1,
        max_delivery_attempts=store.config.max_reconsume_times + 1,
    )
    forward.group.name = "g1"
    forward.topic.name = "orders"
    assert stub.ForwardMessageToDeadLetterQueue(forward, metadata=META).status.code == pb.OK
    # The handle is spent: forwarding it again is refused, as an ack of it would be.
    again = stub.ForwardMessageToDeadLetterQueue(forward, metadata=META).status.code
    assert again == pb.INVALID_RECEIPT_HANDLE
    assert route_retries(store) == 1
    dispatch_pending(store)
    [dead] = PullConsumer(store, "inspect").pull(dlq_topic("g1"), 0, 0).messages
    assert (dead.msg_id, dead.body) == ("01ABC", b"poison")
