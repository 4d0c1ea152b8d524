"""The gRPC door's answers to what a client may send wrong, called through the door's own stubs:
RocketMQ 5's status codes, nothing written on bad input, the Telemetry settings reply the 5.x
clients' start-up waits for, and the edge rules of :mod:`engine.protocol.rocketmq5`."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from engine import Admin, Message, Producer, Store
from engine.config import load_config
from engine.errors import InvalidArgumentError, InvalidReceiptHandleError
from engine.grpc import GrpcServer
from engine.grpc.v2 import definition_pb2 as pb
from engine.grpc.v2 import service_pb2 as spb
from engine.grpc.v2 import service_pb2_grpc as spb_grpc
from engine.protocol.messages import message_group_queue
from engine.protocol.rocketmq5 import (
    MAX_INVISIBLE_MS,
    ReceiptHandle,
    check_group,
    check_invisible_ms,
    check_tag,
    check_user_properties,
    client_queue,
    long_polling_ms,
)
from engine.store import schemas

META = (("x-mq-client-id", "test-client"),)


def message(topic: str = "orders", body: bytes = b"hello", tag: str | None = None) -> pb.Message:
    out = pb.Message(body=body)
    out.topic.name = topic
    out.system_properties.message_id = "01ABC"
    out.system_properties.message_type = pb.NORMAL
    if tag is not None:
        out.system_properties.tag = tag
    return out


def test_a_route_names_every_queue_of_the_topic_on_this_endpoint(
    stub: spb_grpc.MessagingServiceStub, door: GrpcServer
) -> None:
    request = spb.QueryRouteRequest()
    request.topic.name = "orders"
    answer = stub.QueryRoute(request, metadata=META)
    assert answer.status.code == pb.OK
    assert [q.id for q in answer.message_queues] == [0, 1]
    queue = answer.message_queues[0]
    assert queue.permission == pb.READ_WRITE and queue.broker.id == 0
    [address] = queue.broker.endpoints.addresses
    assert f"{address.host}:{address.port}" == door.address


def test_a_missing_topic_is_topic_not_found_and_a_missing_client_id_is_refused(
    stub: spb_grpc.MessagingServiceStub,
) -> None:
    request = spb.QueryRouteRequest()
    request.topic.name = "nothing"
    assert stub.QueryRoute(request, metadata=META).status.code == pb.TOPIC_NOT_FOUND
    request.topic.name = "orders"
    assert stub.QueryRoute(request).status.code == pb.CLIENT_ID_REQUIRED


def test_telemetry_answers_a_producers_settings_with_the_servers(stub: spb_grpc.MessagingServiceStub) -> None:
    command = spb.TelemetryCommand()
    command.settings.client_type = pb.PRODUCER
    command.settings.publishing.topics.add(name="orders")
    replies = stub.Telemetry(iter([command]), metadata=META)
    reply = next(replies)
    replies.cancel()
    assert reply.status.code == pb.OK
    assert reply.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert reply.settings.backoff_policy.max_attempts == 3
    assert [t.name for t in reply.settings.publishing.topics] == ["orders"]


def test_telemetry_answers_a_consumers_settings_with_the_long_polling_and_attempts(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    command = spb.TelemetryCommand()
    command.settings.client_type = pb.SIMPLE_CONSUMER
    command.settings.subscription.group.name = "g1"
    replies = stub.Telemetry(iter([command]), metadata=META)
    reply = next(replies)
    replies.cancel()
    assert reply.settings.subscription.long_polling_timeout.seconds == 20
    assert reply.settings.backoff_policy.max_attempts == store.config.max_reconsume_times + 1


def test_telemetry_tells_a_fifo_groups_consumer_fifo(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    Admin(store).update_group("fifo-g", fifo=True)

    def fifo_of(group: str) -> bool:
        command = spb.TelemetryCommand()
        command.settings.client_type = pb.SIMPLE_CONSUMER
        command.settings.subscription.group.name = group
        replies = stub.Telemetry(iter([command]), metadata=META)
        reply = next(replies)
        replies.cancel()
        return bool(reply.settings.subscription.fifo)

    assert (fifo_of("fifo-g"), fifo_of("g1")) == (True, False)


def test_bad_sends_get_rocketmq_5s_codes_and_write_nothing(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    before = store.version(schemas.COMMIT_LOG)
    cases = [
        (message(tag="a|b"), pb.ILLEGAL_MESSAGE_TAG),
        (message(body=b""), pb.MESSAGE_BODY_EMPTY),
        (message(body=b"x" * (4 * 1024 * 1024 + 1)), pb.MESSAGE_BODY_TOO_LARGE),
        (message(topic="nothing"), pb.TOPIC_NOT_FOUND),
    ]
    for bad, code in cases:
        answer = stub.SendMessage(spb.SendMessageRequest(messages=[bad]), metadata=META)
        assert (answer.status.code, answer.entries[0].status.code) == (code, code), bad.topic.name
    too_many = message()
    for i in range(129):
        too_many.user_properties[f"k{i}"] = "v"
    answer = stub.SendMessage(spb.SendMessageRequest(messages=[too_many]), metadata=META)
    assert answer.status.code == pb.MESSAGE_PROPERTIES_TOO_LARGE
    assert store.version(schemas.COMMIT_LOG) == before


def test_a_send_of_good_and_bad_messages_answers_multiple_results(
    stub: spb_grpc.MessagingServiceStub,
) -> None:
    answer = stub.SendMessage(spb.SendMessageRequest(messages=[message(), message(tag="a|b")]), metadata=META)
    assert answer.status.code == pb.MULTIPLE_RESULTS
    assert [e.status.code for e in answer.entries] == [pb.OK, pb.ILLEGAL_MESSAGE_TAG]
    assert answer.entries[0].message_id == "01ABC"


def test_receive_ack_and_change_refuse_bad_times_and_handles(stub: spb_grpc.MessagingServiceStub) -> None:
    receive = spb.ReceiveMessageRequest(batch_size=1)
    receive.group.name = "g1"
    receive.message_queue.topic.name = "orders"
    receive.invisible_duration.seconds = 1  # below the proxy's 10 s
    receive.long_polling_timeout.seconds = 5
    [answer] = list(stub.ReceiveMessage(receive, metadata=META, timeout=30))
    assert answer.status.code == pb.ILLEGAL_INVISIBLE_TIME

    ack = spb.AckMessageRequest()
    ack.group.name = "g1"
    ack.topic.name = "orders"
    ack.entries.add(message_id="01ABC", receipt_handle="not-a-handle")
    answer = stub.AckMessage(ack, metadata=META)
    assert answer.status.code == pb.INVALID_RECEIPT_HANDLE

    change = spb.ChangeInvisibleDurationRequest(receipt_handle="not-a-handle")
    change.group.name = "g1"
    change.topic.name = "orders"
    change.invisible_duration.seconds = 13 * 3600  # above 12 h
    assert stub.ChangeInvisibleDuration(change, metadata=META).status.code == pb.ILLEGAL_INVISIBLE_TIME
    change.invisible_duration.seconds = 30
    assert stub.ChangeInvisibleDuration(change, metadata=META).status.code == pb.INVALID_RECEIPT_HANDLE


def test_a_receive_with_too_little_time_left_is_illegal_polling_time(
    stub: spb_grpc.MessagingServiceStub,
) -> None:
    receive = spb.ReceiveMessageRequest(batch_size=1)
    receive.group.name = "g1"
    receive.message_queue.topic.name = "orders"
    receive.invisible_duration.seconds = 30
    [answer] = list(stub.ReceiveMessage(receive, metadata=META, timeout=3))
    assert answer.status.code == pb.ILLEGAL_POLLING_TIME


def test_a_receipt_handle_round_trips_and_garbage_is_refused() -> None:
    handle = ReceiptHandle("g1", "client-1", "orders", 3, 42, "grpc:client-1#17")
    assert ReceiptHandle.decode(handle.encode()) == handle
    for garbage in ("", "not-a-handle", "@@@", ReceiptHandle("g", "c", "t", 0, 0, "x").encode()[:-3]):
        with pytest.raises(InvalidReceiptHandleError) as caught:
            ReceiptHandle.decode(garbage)
        assert caught.value.status == "INVALID_RECEIPT_HANDLE"


def test_long_polling_is_clamped_to_5_to_20_seconds_and_the_calls_deadline() -> None:
    assert long_polling_ms(1_000, 60_000, 3_000) == 5_000
    assert long_polling_ms(60_000, 60_000, 3_000) == 20_000
    assert long_polling_ms(15_000, 12_000, 3_000) == 12_000
    assert long_polling_ms(None, 30_000, 4_000) == 20_000
    assert long_polling_ms(None, 9_000, 4_000) == 7_000
    with pytest.raises(InvalidArgumentError) as caught:
        long_polling_ms(10_000, 4_000, 3_000)
    assert caught.value.status == "ILLEGAL_POLLING_TIME"


@pytest.mark.parametrize(
    ("check", "value", "status"),
    [
        (lambda v: check_invisible_ms(v, 10_000), 9_999, "ILLEGAL_INVISIBLE_TIME"),
        (lambda v: check_invisible_ms(v, 0), MAX_INVISIBLE_MS + 1, "ILLEGAL_INVISIBLE_TIME"),
        (check_tag, "a|b", "ILLEGAL_MESSAGE_TAG"),
        (check_tag, "  ", "ILLEGAL_MESSAGE_TAG"),
        (check_tag, "a\x01", "ILLEGAL_MESSAGE_TAG"),
        (check_group, "g" * 121, "ILLEGAL_CONSUMER_GROUP"),
        (check_group, "bad group", "ILLEGAL_CONSUMER_GROUP"),
        (check_user_properties, {"k": "v" * 16_384}, "MESSAGE_PROPERTIES_TOO_LARGE"),
        (check_user_properties, {" ": "v"}, "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    ],
)
def test_edge_rules_name_rocketmq_5s_code(check: object, value: object, status: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        check(value)  # type: ignore[operator]
    assert caught.value.status == status


def test_edge_rules_let_good_values_through() -> None:
    assert check_invisible_ms(10_000, 10_000) == 10_000
    assert check_invisible_ms(MAX_INVISIBLE_MS, 0) == MAX_INVISIBLE_MS
    assert check_group("g" * 120) == "g" * 120
    check_tag("TagA")
    check_user_properties({f"k{i}": "v" for i in range(128)})


def test_messages_a_client_never_got_are_handed_back_visible_soon(door: GrpcServer, store: Store) -> None:
    from engine import Message, Producer
    from engine.protocol.selectors import MessageSelector

    with Producer(store, "p") as producer:
        producer.send(Message("orders", b"lost on the way"))
    everything = MessageSelector.by_tag("*")
    [got] = door.receive("g1", "gone", "orders", everything, 1, 60_000, 5_000)
    assert door.hand_back("g1", "gone", [got]) == 1
    # Visible again in a second (not the 60 s it was received for), to any client of the group.
    [again] = door.receive("g1", "other", "orders", everything, 1, 60_000, 20_000)
    assert (again.msg_id, again.reconsume_times) == (got.msg_id, 1)
    assert door.hand_back("g1", "nobody", [again]) == 0


def test_a_client_silent_past_the_idle_time_is_forgotten_with_its_consumer(
    door: GrpcServer, stub: spb_grpc.MessagingServiceStub
) -> None:
    from engine.grpc.server import CLIENT_IDLE_MS
    from engine.store.store import now_ms

    heartbeat = spb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER)
    heartbeat.group.name = "g1"
    assert stub.Heartbeat(heartbeat, metadata=META).status.code == pb.OK
    door.consumer("g1", "test-client")
    assert door.sweep(now_ms()) == 0 and door.consumer_keys() == [("g1", "test-client")]
    assert door.sweep(now_ms() + CLIENT_IDLE_MS) == 1
    assert door.consumer_keys() == [] and "test-client" not in door.clients


def test_lite_consumers_are_told_no_lite_subscription_and_refused_as_the_proxy_refuses_them(
    stub: spb_grpc.MessagingServiceStub, door: GrpcServer
) -> None:
    settings = pb.Settings(client_type=pb.LITE_SIMPLE_CONSUMER)
    settings.subscription.group.name = "lite-group"
    answer = door.settings_for(settings).subscription
    assert (answer.lite_subscription_quota, answer.max_lite_topic_size) == (0, 64)
    heartbeat = spb.HeartbeatRequest(client_type=pb.LITE_PUSH_CONSUMER)
    heartbeat.group.name = "lite-group"
    assert stub.Heartbeat(heartbeat, metadata=META).status.code == pb.UNRECOGNIZED_CLIENT_TYPE
    heartbeat.client_type = pb.SIMPLE_CONSUMER
    assert stub.Heartbeat(heartbeat, metadata=META).status.code == pb.OK
    sync = spb.SyncLiteSubscriptionRequest(lite_topic_set=["lite-1"])
    sync.topic.name, sync.group.name = "orders", "lite-group"
    with pytest.raises(grpc.RpcError) as refused:
        stub.SyncLiteSubscription(sync, metadata=META)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_send_goes_to_the_queue_the_client_chose_when_its_client_names_one(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    def send(language: str, queue_id: int, uniq: str, group: str | None = None) -> int:
        sent = message()
        sent.system_properties.message_id = uniq
        sent.system_properties.queue_id = queue_id
        if group is not None:
            sent.system_properties.message_group = group
        metadata = (*META, ("x-mq-language", language))
        return stub.SendMessage(spb.SendMessageRequest(messages=[sent]), metadata=metadata).status.code

    group = next(g for g in (f"g{i}" for i in range(99)) if message_group_queue(g, 2) == 0)
    # A Java client names its queue (for a message group, by its own hash): the door keeps it.
    assert send("JAVA", 1, "java-1", group) == pb.OK
    assert send("JAVA", 1, "java-2") == pb.OK
    # The Python client names none (queue_id 0 unset): the door chooses, by the message group.
    other = next(g for g in (f"h{i}" for i in range(99)) if message_group_queue(g, 2) == 1)
    assert send("PYTHON", 0, "python-1", other) == pb.OK
    before = store.version(schemas.COMMIT_LOG)
    assert send("JAVA", 2, "java-bad") == pb.BAD_REQUEST  # not a queue of the topic
    assert store.version(schemas.COMMIT_LOG) == before
    stored = {r["uniq_key"]: r["queue_id"] for r in store.read(schemas.COMMIT_LOG).to_pylist()}
    assert stored == {"java-1": 1, "java-2": 1, "python-1": 1}


def test_client_queue_is_the_named_queue_of_clients_that_name_one() -> None:
    assert client_queue("JAVA", 3, 4) == 3
    assert client_queue("CPP", 0, 4) == 0
    assert client_queue("PYTHON", 3, 4) is None
    assert client_queue("GOLANG", 0, 4) is None
    assert client_queue(None, 2, 4) is None
    for bad in (-1, 4):
        with pytest.raises(InvalidArgumentError) as refused:
            client_queue("JAVA", bad, 4)
        assert refused.value.context["status"] == "BAD_REQUEST"


def test_a_receive_hands_out_only_the_topic_it_names(
    stub: spb_grpc.MessagingServiceStub, store: Store
) -> None:
    Admin(store).create_topic("other", 1)
    with Producer(store, "p") as producer:
        for topic in ("orders", "other"):
            for i in range(3):
                producer.send(Message(topic, f"{topic}-{i}".encode()))

    def receive(topic: str, n: int) -> list[str]:
        request = spb.ReceiveMessageRequest(batch_size=n)
        request.group.name = "g1"
        request.message_queue.topic.name = topic
        request.invisible_duration.FromSeconds(30)
        request.long_polling_timeout.FromSeconds(5)
        answers = stub.ReceiveMessage(request, metadata=META)
        return [r.message.topic.name for r in answers if r.HasField("message")]

    # The same client of the group receives from both topics; what it leased of one topic is never
    # handed out to a receive of the other.
    def receive_all(topic: str, want: int) -> list[str]:
        got: list[str] = []
        for _ in range(5):
            got += receive(topic, 16)
            if len(got) >= want:
                break
        return got

    assert receive("orders", 1) == ["orders"]
    assert receive_all("other", 3) == ["other"] * 3
    assert receive_all("orders", 2) == ["orders"] * 2


@pytest.mark.parametrize(
    ("in_memory_max_bytes", "first"),
    [
        (0, ["old-2"]),  # an old queue (its first message out of "memory"): the last message
        (4 * 1024**3, ["old-0", "old-1", "old-2"]),  # a young queue: from its first message
    ],
)
def test_a_new_group_starts_where_rocketmq_5s_pop_starts_it(
    tmp_path: Path, in_memory_max_bytes: int, first: list[str]
) -> None:
    store = Store.open(tmp_path / "mq", config=load_config(in_memory_max_bytes=in_memory_max_bytes))
    Admin(store).create_topic("orders", 1)
    with Producer(store, "p") as producer:
        for i in range(3):
            producer.send(Message("orders", f"old-{i}".encode()))
    with GrpcServer(store, port=0) as door, grpc.insecure_channel(door.address) as channel:
        messaging = spb_grpc.MessagingServiceStub(channel)

        def receive() -> list[str]:
            request = spb.ReceiveMessageRequest(batch_size=16)
            request.group.name = "brand-new"
            request.message_queue.topic.name = "orders"
            request.invisible_duration.FromSeconds(30)
            request.long_polling_timeout.FromSeconds(5)
            answers = messaging.ReceiveMessage(request, metadata=META)
            return [r.message.body.decode() for r in answers if r.HasField("message")]

        assert receive() == first
        with Producer(store, "p") as producer:
            producer.send(Message("orders", b"new"))
        assert receive() == ["new"]  # the group's start was recorded with its first receive
