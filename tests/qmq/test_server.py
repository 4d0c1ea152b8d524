"""QMQ's door over the wire (a Python client speaking QMQ's frames): the locator names the meta
server, the meta server names the broker, the broker stores sends, hands them out numbered in the
consumer's pull-log sequence space, and acks by those sequences. Bad frames close a connection or
get an error answer; nothing breaks the server or writes a table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest

from engine import Admin, PullConsumer, Store
from engine.broker.pull_log import build_pull_log
from engine.client.trace import TraceKind, trace_message
from engine.protocol.actions import ACK, PULL
from engine.protocol.names import PROPERTY_REAL_TOPIC, PROPERTY_TIMER_DELIVER_MS, SCHEDULE_TOPIC
from engine.protocol.qmq import QMQ_GROUP_ATTRIBUTE, qmq_retry_subject, qmq_store_group
from engine.qmq import QmqServer, codec
from engine.qmq.codec import AckRequest, PullRequest, QmqMessage, Reader, TagFilter
from engine.qmq.messages import attributes
from engine.qmq.pull_sequences import pulled_offsets
from engine.qmq.server import FORGOTTEN_AFTER_MS, OFFLINE_AFTER_MS, pull_log_consumer_id
from engine.remoting import RemotingServer
from engine.store import schemas
from engine.store.action_log import read_actions
from engine.store.store import now_ms
from tests.qmq.qmq_client import QmqWire, locate, register
from tests.remoting.wire_client import WireClient
from tests.serve_process import mq_serve


@pytest.fixture
def server(store: Store) -> Iterator[QmqServer]:
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as running:
        yield running


def qmq_message(subject: str, i: int) -> QmqMessage:
    attrs = codec.encode_attrs({"payload": f"p-{i}", "qmq_createTime": "1"})
    return QmqMessage(subject, f"id-{i}", 1_000 + i, 2_000 + i, attrs=attrs)


def send(server: QmqServer, messages: list[QmqMessage]) -> list[tuple[str, int, str]]:
    with QmqWire(server.broker_address) as wire:
        answer = wire.request(codec.Code.SEND_MESSAGE, codec.encode_send_messages(messages))
    assert answer.code == codec.Code.SUCCESS
    return codec.decode_send_results(answer.body)


def pull(
    wire: QmqWire, subject: str, group: str, consumer: str, n: int, timeout_ms: int = 0, last: int = -1
) -> codec.Frame:
    request = PullRequest(subject, group, consumer, n, -1, -1, last, timeout_ms, False)
    return wire.request(codec.Code.PULL_MESSAGE, codec.encode_pull_request(request))


def test_the_locator_names_the_meta_server_and_the_meta_server_the_broker(server: QmqServer) -> None:
    assert locate(server.meta_server_url) == server.meta_address
    answer = register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
    assert answer.code == codec.Code.SUCCESS and answer.request_code == codec.Code.CLIENT_REGISTER
    reader = Reader(answer.body)
    reader.int64()
    assert (reader.string(), reader.string()) == ("orders", "g1")
    assert (reader.int8(), reader.int8(), reader.int16()) == (codec.ONLINE, codec.ClientType.CONSUMER, 1)
    assert (reader.string(), reader.string()) == ("lakemq-qmq", server.broker_address)
    reader.int64()
    assert reader.int8() == codec.BROKER_STATE_RW
    assert [(s.client_id, s.online) for s in server.consumers_of("orders", "g1")] == [("c1", True)]


def test_a_send_is_stored_with_a_result_per_message(server: QmqServer, store: Store) -> None:
    Admin(store).create_topic("orders", 1)
    results = send(server, [qmq_message("orders", i) for i in range(3)])
    assert results == [(f"id-{i}", codec.ProducerCode.SUCCESS, "") for i in range(3)]
    stored = PullConsumer(store, "reader").pull("orders", 0, 0).messages
    assert [attributes(m)["payload"] for m in stored] == ["p-0", "p-1", "p-2"]
    assert [m.keys for m in stored] == [("id-0",), ("id-1",), ("id-2",)]


def test_a_subject_the_store_cannot_name_gets_a_failed_result_and_writes_nothing(
    server: QmqServer, store: Store
) -> None:
    results = send(server, [qmq_message("bad subject!", 0)])
    assert results == [("id-0", codec.ProducerCode.SUBJECT_NOT_ASSIGNED, "bad subject")]
    assert "bad subject!" not in store.topic_configs(refresh=True)


def test_pulls_are_numbered_as_the_pull_log_and_acks_map_back_to_queue_offsets(
    server: QmqServer, store: Store
) -> None:
    Admin(store).create_topic("orders", 2)
    register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
    send(server, [qmq_message("orders", i) for i in range(6)])
    handed: dict[int, str] = {}
    with QmqWire(server.broker_address) as wire:
        for _ in range(4):
            answer = pull(wire, "orders", "g1", "c1", 2, last=max(handed, default=-1))
            if answer.code == codec.Code.NO_MESSAGE:
                continue
            first, messages = codec.decode_pulled(answer.body)
            handed.update({first + i: m.message_id for i, m in enumerate(messages)})
        assert pull(wire, "orders", "g1", "c1", 2, last=5).code == codec.Code.NO_MESSAGE
        assert sorted(handed) == list(range(6))
        assert sorted(handed.values()) == [f"id-{i}" for i in range(6)]
        ack = AckRequest("orders", "g1", "c1", 0, 3, 0)
        assert wire.request(codec.Code.ACK_REQUEST, codec.encode_ack_request(ack)).code == codec.Code.SUCCESS

    consumer_id = pull_log_consumer_id("orders", "c1")
    build_pull_log(store)
    log = store.read(schemas.PULL_LOG)
    log = log.filter(pc.equal(log["consumer_id"], consumer_id)).sort_by("pull_sequence")
    offsets = dict(zip(log["pull_sequence"].to_pylist(), log["queue_offset"].to_pylist(), strict=True))
    queues = dict(zip(log["pull_sequence"].to_pylist(), log["queue_id"].to_pylist(), strict=True))
    assert sorted(offsets) == list(range(6))
    # What the pull log says sequence k is, is the message the door handed out as k.
    reader = PullConsumer(store, "reader")
    for seq, message_id in handed.items():
        stored = reader.pull("orders", queues[seq], offsets[seq], 1).messages[0]
        assert stored.keys == (message_id,)
    acked = {
        (r["queue_id"], o)
        for r in read_actions(store, "g1", ACK)
        if r["consumer_id"] == consumer_id
        for o in range(r["queue_offset"], r["end_offset"] or r["queue_offset"] + 1)
    }
    assert acked == {(queues[s], offsets[s]) for s in range(4)}


def test_a_restarted_door_continues_a_consumers_sequences(store: Store) -> None:
    Admin(store).create_topic("orders", 1)
    for round_ in range(2):
        with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
            register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
            send(server, [qmq_message("orders", 10 * round_ + i) for i in range(2)])
            with QmqWire(server.broker_address) as wire:
                answer = pull(wire, "orders", "g1", "c1", 5, last=2 * round_ - 1)
                first, messages = codec.decode_pulled(answer.body)
            assert (first, len(messages)) == (2 * round_, 2)
    rows = read_actions(store, "g1", PULL)
    assert len(pulled_offsets(rows, pull_log_consumer_id("orders", "c1"))) == 4


def test_a_long_poll_answers_when_a_message_arrives(server: QmqServer, store: Store) -> None:
    Admin(store).create_topic("orders", 1)
    register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
    with QmqWire(server.broker_address) as waiting:
        request = PullRequest("orders", "g1", "c1", 5, -1, -1, -1, 20_000, False)
        waiting.send_raw(
            codec.encode_frame(
                codec.Frame(codec.Code.PULL_MESSAGE, 1, 0, 9, 11, codec.encode_pull_request(request))
            )
        )
        send(server, [qmq_message("orders", 0)])
        answer = waiting.read_frame()
    assert answer.code == codec.Code.SUCCESS
    assert [m.message_id for m in codec.decode_pulled(answer.body)[1]] == ["id-0"]


def test_a_pull_of_a_missing_subject_finds_no_message(server: QmqServer) -> None:
    with QmqWire(server.broker_address) as wire:
        assert pull(wire, "nothing", "g1", "c1", 5).code == codec.Code.NO_MESSAGE


def test_unknown_codes_and_unreadable_bodies_get_error_answers(server: QmqServer, store: Store) -> None:
    versions = store.version(schemas.ACTION_LOG), store.version(schemas.COMMIT_LOG)
    with QmqWire(server.broker_address) as wire:
        assert wire.request(77).code == codec.Code.UNKNOWN_CODE
        assert wire.request(codec.Code.SEND_MESSAGE, b"\x00\x01garbage").code == codec.Code.BROKER_ERROR
        assert wire.request(codec.Code.PULL_MESSAGE, b"\x00").code == codec.Code.PARAM_ERROR
        assert wire.request(codec.Code.ACK_REQUEST, b"\x00\x05ab").code == codec.Code.PARAM_ERROR
    assert (store.version(schemas.ACTION_LOG), store.version(schemas.COMMIT_LOG)) == versions


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x20" + b"\x00\x12" + b"\x11" * 30,  # bad magic
        b"\x7f\xff\xff\xff",  # oversized
        b"\x00\x00\x00\x05abcde",  # shorter than a header
    ],
)
def test_a_bad_frame_closes_its_connection_and_the_server_serves_on(
    server: QmqServer, garbage: bytes
) -> None:
    with QmqWire(server.broker_address) as wire:
        wire.send_raw(garbage)
        assert wire.closed()
    with QmqWire(server.broker_address) as wire:
        assert wire.request(codec.Code.HEARTBEAT).code == codec.Code.SUCCESS


def test_mq_serve_with_qmq_answers_the_locator_and_stops_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "served"
    Admin(Store.open(root)).create_topic("orders", 1)
    ports = ["--namesrv-port", "0", "--broker-port", "0", "--qmq-http-port", "0"]
    ports += ["--qmq-meta-port", "0", "--qmq-broker-port", "0"]
    with mq_serve(root, "--qmq", *ports, errors=tmp_path / "serve.err") as (_, ready):
        assert ready["qmq_meta_server"].startswith("http://127.0.0.1:")
        assert locate(ready["qmq_meta_server"]) == ready["qmq_meta"]
        with QmqWire(ready["qmq_broker"]) as wire:
            body = codec.encode_send_messages([qmq_message("orders", 0)])
            answer = wire.request(codec.Code.SEND_MESSAGE, body)
        assert codec.decode_send_results(answer.body) == [("id-0", codec.ProducerCode.SUCCESS, "")]


def pull_after(wire: QmqWire, consumer: str, last: int, n: int = 10) -> tuple[int, list[str]]:
    request = PullRequest("orders", "g1", consumer, n, -1, -1, last, 0, False)
    answer = wire.request(codec.Code.PULL_MESSAGE, codec.encode_pull_request(request))
    if answer.code == codec.Code.NO_MESSAGE:
        return -1, []
    first, messages = codec.decode_pulled(answer.body)
    return first, [m.message_id for m in messages]


def test_a_consumer_that_restarts_gets_its_unacked_messages_again_under_the_same_sequences(
    store: Store,
) -> None:
    Admin(store).create_topic("orders", 1)
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
        send(server, [qmq_message("orders", i) for i in range(4)])
        with QmqWire(server.broker_address) as wire:
            assert pull_after(wire, "c1", -1) == (0, ["id-0", "id-1", "id-2", "id-3"])
            # The client knows of sequence 3: nothing comes again, nothing is new.
            assert pull_after(wire, "c1", 3) == (-1, [])
            ack = AckRequest("orders", "g1", "c1", 0, 1, 0)
            wire.request(codec.Code.ACK_REQUEST, codec.encode_ack_request(ack))
            # Restarted (it knows of nothing): what it did not ack comes again at once.
            assert pull_after(wire, "c1", -1) == (2, ["id-2", "id-3"])
            # Another consumer of the group does not get them (they are c1's until acked).
            assert pull_after(wire, "c2", -1) == (-1, [])
    # A restarted door knows the same from the action log.
    with (
        QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server,
        QmqWire(server.broker_address) as wire,
    ):
        assert pull_after(wire, "c1", -1) == (2, ["id-2", "id-3"])
        ack = AckRequest("orders", "g1", "c1", 2, 3, 0)
        wire.request(codec.Code.ACK_REQUEST, codec.encode_ack_request(ack))
        assert pull_after(wire, "c1", -1) == (-1, [])
    rows = read_actions(store, "g1", PULL)
    assert len(pulled_offsets(rows, pull_log_consumer_id("orders", "c1"))) == 4  # never leased twice


def test_tag_filters_hand_out_only_matching_messages_and_ack_the_rest_without_a_sequence(
    server: QmqServer, store: Store
) -> None:
    Admin(store).create_topic("orders", 1)
    tagged = [("a",), ("a", "b"), (), ("b",), ("a", "b", "c")]
    for group in ("g1", "g2"):
        register(server.meta_address, codec.ClientType.CONSUMER, "orders", group, "c1")
    send(
        server,
        [
            QmqMessage("orders", f"id-{i}", 1, 2, tags=t, attrs=b"\x00\x01k\x00\x01v")
            for i, t in enumerate(tagged)
        ],
    )
    both = PullRequest(
        "orders", "g1", "c1", 10, -1, -1, -1, 0, False, (TagFilter(codec.TAG_AND, ("a", "b")),)
    )
    either = PullRequest(
        "orders", "g2", "c1", 10, -1, -1, -1, 0, False, (TagFilter(codec.TAG_OR, ("b", "c")),)
    )
    with QmqWire(server.broker_address) as wire:
        first, messages = codec.decode_pulled(
            wire.request(codec.Code.PULL_MESSAGE, codec.encode_pull_request(both)).body
        )
        assert (first, [m.message_id for m in messages]) == (0, ["id-1", "id-4"])
        assert messages[0].tags == ("a", "b")
        first, messages = codec.decode_pulled(
            wire.request(codec.Code.PULL_MESSAGE, codec.encode_pull_request(either)).body
        )
        assert (first, [m.message_id for m in messages]) == (0, ["id-1", "id-3", "id-4"])
    build_pull_log(store)
    log = store.read(schemas.PULL_LOG)
    mine = log.filter(pc.equal(log["group"], "g1"))
    assert sorted(zip(mine["pull_sequence"].to_pylist(), mine["queue_offset"].to_pylist(), strict=True)) == [
        (0, 1),
        (1, 4),
    ]
    acked = {r["queue_offset"] for r in read_actions(store, "g1", ACK)}
    assert acked == {0, 2, 3}  # what the filter did not keep is consumed, not handed out


def test_a_consumer_silent_for_3_minutes_goes_offline_and_its_unacked_go_to_retry(
    server: QmqServer, store: Store
) -> None:
    Admin(store).create_topic("orders", 1)
    server.retry_delay_ms = 0  # the copies reach the retry subject at once
    register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
    send(server, [qmq_message("orders", i) for i in range(3)])
    with QmqWire(server.broker_address) as wire:
        assert pull_after(wire, "c1", -1)[1] == ["id-0", "id-1", "id-2"]
        wire.request(
            codec.Code.ACK_REQUEST, codec.encode_ack_request(AckRequest("orders", "g1", "c1", 0, 0, 0))
        )
    (state,) = server.consumers_of("orders", "g1")
    assert server.sweep(state.last_heartbeat_ms + OFFLINE_AFTER_MS) == []  # not yet
    assert server.sweep(state.last_heartbeat_ms + OFFLINE_AFTER_MS + 1) == [state]
    assert not state.online
    retry = qmq_retry_subject("orders", "g1")
    copies = PullConsumer(store, "reader").pull(retry, 0, 0).messages
    assert sorted(m.keys[0] for m in copies) == ["id-1", "id-2"]
    assert sorted(attributes(m)["payload"] for m in copies) == ["p-1", "p-2"]
    with QmqWire(server.broker_address) as wire:
        assert pull_after(wire, "c1", -1) == (-1, [])  # handed over: nothing comes again
    # Registering again brings it back online; after 2 days of silence it is forgotten.
    register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
    assert state.online
    server.sweep(state.last_heartbeat_ms + FORGOTTEN_AFTER_MS + 1)
    assert server.consumers_of("orders", "g1") == []


def test_the_message_trace_shows_the_pull_sequence_a_qmq_consumer_was_handed(
    server: QmqServer, store: Store
) -> None:
    Admin(store).create_topic("orders", 1)
    register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
    send(server, [qmq_message("orders", i) for i in range(2)])
    with QmqWire(server.broker_address) as wire:
        assert pull_after(wire, "c1", -1)[1] == ["id-0", "id-1"]
    build_pull_log(store)
    (stored,) = [
        m for m in PullConsumer(store, "reader").pull("orders", 0, 0).messages if m.keys == ("id-1",)
    ]
    events = trace_message(store, stored.msg_id).events
    logged = [e for e in events if e.kind is TraceKind.PULL_LOGGED]
    assert [(e.group, e.consumer_id, e.detail) for e in logged] == [
        ("g1", pull_log_consumer_id("orders", "c1"), "pull sequence 1")
    ]


def pulled_ids(wire: QmqWire, subject: str, group: str, consumer: str, rounds: int = 4) -> list[str]:
    """Every message id a consumer is handed in ``rounds`` pulls (the queues are leased in turn)."""
    ids: list[str] = []
    last = -1
    for _ in range(rounds):
        answer = pull(wire, subject, group, consumer, 10, last=last)
        if answer.code == codec.Code.SUCCESS:
            first, messages = codec.decode_pulled(answer.body)
            ids += [m.message_id for m in messages]
            last = first + len(messages) - 1
    return sorted(ids)


def test_a_new_group_starts_at_the_latest_message_from_its_registration_or_first_pull(
    server: QmqServer, store: Store
) -> None:
    Admin(store).create_topic("orders", 2)
    send(server, [qmq_message("orders", i) for i in range(4)])  # before any group
    register(server.meta_address, codec.ClientType.CONSUMER, "orders", "registered", "c1")
    with QmqWire(server.broker_address) as wire:
        assert pulled_ids(wire, "orders", "pulled-first", "c1") == []  # its first pull: nothing yet
        send(server, [qmq_message("orders", i) for i in range(4, 7)])
        assert pulled_ids(wire, "orders", "registered", "c1") == ["id-4", "id-5", "id-6"]
        assert pulled_ids(wire, "orders", "pulled-first", "c1") == ["id-4", "id-5", "id-6"]
        # A group first seen now gets nothing of what was stored before.
        assert pulled_ids(wire, "orders", "late", "c1") == []


def test_a_registered_groups_start_survives_a_restart_of_the_door(store: Store) -> None:
    Admin(store).create_topic("orders", 2)
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        send(server, [qmq_message("orders", 0)])
        register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
        # Registered again (QMQ's clients re-register as their heartbeat): nothing more is written.
        version = store.version(schemas.ACTION_LOG)
        register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
        assert server.subscribe("orders", "g1", "c2") == 0  # another consumer of the group: started
        assert store.version(schemas.ACTION_LOG) == version
    with QmqServer(store, http_port=0, meta_port=0, broker_port=0) as server:
        send(server, [qmq_message("orders", 1)])  # stored while the group's consumer was away
        with QmqWire(server.broker_address) as wire:
            assert pulled_ids(wire, "orders", "g1", "c1") == ["id-1"]


def test_subjects_and_groups_with_dots_are_sent_pulled_and_acked(server: QmqServer, store: Store) -> None:
    register(server.meta_address, codec.ClientType.CONSUMER, "order.changed", "billing.v2", "c1")
    assert send(server, [qmq_message("order.changed", 0)]) == [("id-0", codec.ProducerCode.SUCCESS, "")]
    with QmqWire(server.broker_address) as wire:
        answer = pull(wire, "order.changed", "billing.v2", "c1", 5)
        first, messages = codec.decode_pulled(answer.body)
        assert (first, [(m.subject, m.message_id) for m in messages]) == (0, [("order.changed", "id-0")])
        ack = AckRequest("order.changed", "billing.v2", "c1", 0, 0, 0)
        assert wire.request(codec.Code.ACK_REQUEST, codec.encode_ack_request(ack)).code == codec.Code.SUCCESS
    assert [r["queue_offset"] for r in read_actions(store, "billing.v2", ACK)] == [0]


def stored_rows(store: Store, key: str) -> list[dict[str, object]]:
    log = store.read(schemas.COMMIT_LOG, columns=["topic", "queue_id", "keys", "properties"]).to_pylist()
    return [dict(row, properties=dict(row["properties"])) for row in log if key in row["keys"]]


def test_a_consumers_delayed_retry_waits_in_the_schedule_bound_for_its_groups_retry_subject(
    server: QmqServer, store: Store
) -> None:
    Admin(store).create_topic("orders", 1)
    # What QMQ's client sends for a listener's NeedRetryException(next): the message on its real
    # subject, delayed to ``next``, carrying the group that pulled it.
    attrs = codec.encode_attrs({"payload": "p", QMQ_GROUP_ATTRIBUTE: "g1", "qmq_times": "2"})
    due = 4_000_000_000_000
    again = QmqMessage("orders", "id-9", 1, due, flag=codec.MESSAGE_FLAG_DELAY, attrs=attrs)
    assert send(server, [again]) == [("id-9", codec.ProducerCode.SUCCESS, "")]
    (row,) = stored_rows(store, "id-9")
    assert row["topic"] == SCHEDULE_TOPIC
    props = row["properties"]
    assert isinstance(props, dict)
    assert props[PROPERTY_REAL_TOPIC] == qmq_retry_subject("orders", "g1")
    assert props[PROPERTY_TIMER_DELIVER_MS] == str(due)
    assert PullConsumer(store, "reader").pull("orders", 0, 0).messages == []  # not on the subject


def test_a_nack_reaches_the_retry_subject_after_the_retry_delay_through_the_schedule(
    server: QmqServer, store: Store
) -> None:
    retry = qmq_retry_subject("orders", "g1")
    assert send(server, [qmq_message(retry, 1)]) == [("id-1", codec.ProducerCode.SUCCESS, "")]
    (row,) = stored_rows(store, "id-1")
    props = row["properties"]
    assert isinstance(props, dict)
    assert (row["topic"], props[PROPERTY_REAL_TOPIC]) == (SCHEDULE_TOPIC, retry)
    assert int(props[PROPERTY_TIMER_DELIVER_MS]) >= 5_000  # QMQ's broker: 5 s after it was stored
    server.retry_delay_ms = 0
    send(server, [qmq_message(retry, 2)])
    assert [r["topic"] for r in stored_rows(store, "id-2")] == [retry]  # at once


def test_what_a_consumer_holds_is_handed_on_once_it_neither_pulls_nor_acks_for_its_lease(
    store: Store,
) -> None:
    Admin(store).create_topic("orders", 1)
    lease = 60_000  # QMQ's is 180 s; the test names its own and passes the clock to hand_on
    with (
        QmqServer(store, http_port=0, meta_port=0, broker_port=0, lease_ms=lease, retry_delay_ms=0) as server,
        QmqWire(server.broker_address) as wire,
    ):
        register(server.meta_address, codec.ClientType.CONSUMER, "orders", "g1", "c1")
        send(server, [qmq_message("orders", i) for i in range(3)])
        assert pull_after(wire, "c1", -1) == (0, ["id-0", "id-1", "id-2"])
        wire.request(
            codec.Code.ACK_REQUEST, codec.encode_ack_request(AckRequest("orders", "g1", "c1", 0, 0, 0))
        )
        consumer = server.consumer("orders", "g1", "c1")
        active = consumer.last_active_ms
        assert server.hand_on(active + lease) == []  # within its lease: still c1's
        assert pull_after(wire, "c1", 2) == (-1, [])  # it pulls on: its lease runs from this pull
        assert consumer.last_active_ms >= active
        active = consumer.last_active_ms
        assert server.hand_on(active + lease) == []
        assert server.hand_on(active + lease + 1) == [("orders", "g1", "c1")]
        retry = qmq_retry_subject("orders", "g1")
        assert sorted(m.keys[0] for m in PullConsumer(store, "reader").pull(retry, 0, 0).messages) == [
            "id-1",
            "id-2",
        ]
        (state,) = server.consumers_of("orders", "g1")
        assert state.online  # handed on though still registered
        assert pull_after(wire, "c1", -1) == (-1, [])  # nothing comes again, even after a restart
        assert server.hand_on(active + 2 * lease) == []  # handed on once
    # The PULL rows' deadlines are the lease too.
    rows = [
        r for r in read_actions(store, "g1", PULL) if r["consumer_id"] == pull_log_consumer_id("orders", "c1")
    ]
    assert {r["deadline_ms"] - r["ts_ms"] for r in rows} == {lease}


def test_broadcast_consumers_each_get_every_message_once_acked_as_handed_out(
    server: QmqServer, store: Store
) -> None:
    Admin(store).create_topic("orders", 1)
    ids = ["box-1@@9f0e", "box-2@@9f0e"]  # a broadcast consumer's group is its client id
    for client_id in ids:
        register(server.meta_address, codec.ClientType.CONSUMER, "orders", client_id, client_id)
    send(server, [qmq_message("orders", i) for i in range(3)])

    def broadcast_pull(wire: QmqWire, client_id: str, last: int) -> tuple[int, list[str]]:
        request = PullRequest("orders", client_id, client_id, 10, -1, -1, last, 0, True)
        answer = wire.request(codec.Code.PULL_MESSAGE, codec.encode_pull_request(request))
        if answer.code == codec.Code.NO_MESSAGE:
            return -1, []
        first, messages = codec.decode_pulled(answer.body)
        return first, [m.message_id for m in messages]

    with QmqWire(server.broker_address) as wire:
        for client_id in ids:
            assert broadcast_pull(wire, client_id, -1) == (0, ["id-0", "id-1", "id-2"])
            # Its acks are not needed (QMQ's broker ignores them), and nothing comes again: not
            # on its next pull, not after a restart.
            ack = AckRequest("orders", client_id, client_id, 0, 2, 1)
            assert (
                wire.request(codec.Code.ACK_REQUEST, codec.encode_ack_request(ack)).code == codec.Code.SUCCESS
            )
            assert broadcast_pull(wire, client_id, 2) == (-1, [])
            assert broadcast_pull(wire, client_id, -1) == (-1, [])
    for client_id in ids:
        group = qmq_store_group(client_id)
        consumer = pull_log_consumer_id("orders", client_id)
        handed = pulled_offsets(read_actions(store, group, PULL), consumer)
        acked = pulled_offsets([{**r, "action": PULL} for r in read_actions(store, group, ACK)], consumer)
        assert [o for _, _, o, _ in handed] == [0, 1, 2]
        assert sorted(o for _, _, o, _ in acked) == [0, 1, 2]
    assert server.hand_on(now_ms() + OFFLINE_AFTER_MS + 1) == []  # nothing held, nothing handed on


def test_the_rocketmq_door_and_the_qmq_door_read_each_others_messages(store: Store) -> None:
    Admin(store).create_topic("orders", 1)
    with (
        QmqServer(store, http_port=0, meta_port=0, broker_port=0) as qmq,
        RemotingServer(store, namesrv_port=0, broker_port=0, run_broker_jobs=False) as rocketmq,
    ):
        register(qmq.meta_address, codec.ClientType.CONSUMER, "orders", "qmq-group", "c1")
        send(qmq, [qmq_message("orders", 0)])
        rocket = WireClient(rocketmq.broker_address)
        assert rocket.send("orders", b"from rocketmq", properties={"color": "red"}).code == 0
        # A RocketMQ consumer pulls both: the QMQ message under its QMQ id, its map as the body.
        response, messages = rocket.pull("rocket-group", "orders", 0, 0)
        assert response.code == 0
        from_qmq, from_rocket = messages
        assert from_qmq.properties["KEYS"] == "id-0"
        assert codec.decode_attrs(from_qmq.body)["payload"] == "p-0"
        assert from_rocket.body == b"from rocketmq"
        rocket.close()
        # A QMQ consumer gets both: the RocketMQ message's properties and body as attributes.
        with QmqWire(qmq.broker_address) as wire:
            answer = pull(wire, "orders", "qmq-group", "c1", 10)
            assert answer.code == codec.Code.SUCCESS
            _, handed = codec.decode_pulled(answer.body)
        by_body = {decode_attrs_of(m).get("payload") or decode_attrs_of(m).get("body"): m for m in handed}
        assert set(by_body) == {"p-0", "from rocketmq"}
        assert decode_attrs_of(by_body["from rocketmq"])["color"] == "red"


def decode_attrs_of(message: QmqMessage) -> dict[str, str]:
    return codec.decode_attrs(message.attrs)
