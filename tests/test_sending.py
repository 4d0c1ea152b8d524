"""engine.client.sending: a send's checks and the results it answers."""

from __future__ import annotations

import pytest

from engine import (
    Admin,
    InvalidMessageError,
    Message,
    MessageQueue,
    Producer,
    SendResult,
    SendStatus,
    Store,
    TopicNotFoundError,
)
from engine.client.sending import (
    PreparedSend,
    bodies_bytes,
    has_timer,
    is_plain,
    is_plain_batch,
    send_results,
    sent_result,
    writeable_topic,
)
from engine.protocol.permissions import Perm
from engine.store.commit_log.stamping import StampedBatch


def test_send_results_equal_results_built_by_their_constructor() -> None:
    stamped = StampedBatch(["m0", "m1"], ["u0", "u1"], ["T", "T"], [1, 2], [7, 0], [100, 180], 5)
    expected = [
        SendResult(SendStatus.SEND_OK, "u0", "m0", "T", 1, 7, 100, 5),
        SendResult(SendStatus.SEND_OK, "u1", "m1", "T", 2, 0, 180, 5),
    ]
    assert send_results(stamped) == expected
    assert [vars(r) for r in send_results(stamped)] == [vars(r) for r in expected]


def test_bodies_bytes_counts_the_stored_bodies_only(store: Store) -> None:
    Admin(store).create_topic("B", 1)
    with Producer(store) as p:
        sends: list[PreparedSend] = [
            p.prepare(Message("B", b"abc", tags="T", properties={"k": "v" * 50})),
            p.prepare(Message("B", b"\x00" * 10, keys=("key",))),
        ]
    assert bodies_bytes(sends) == 13
    assert bodies_bytes([]) == 0


def test_sent_result_names_the_destination_of_a_send_stored_in_the_schedule_topic() -> None:
    stored = SendResult(SendStatus.SEND_OK, "u", "m", "SCHEDULE_TOPIC_XXXX", 2, 9, 0)
    sent = sent_result(stored, MessageQueue("Orders", 3))
    assert (sent.topic, sent.queue_id, sent.queue_offset) == ("Orders", 3, 9)
    assert (sent.msg_id, sent.offset_msg_id, sent.physical_offset) == ("u", "m", 0)
    plain = SendResult(SendStatus.SEND_OK, "u", "m", "Orders", 1, 4, 0)
    assert sent_result(plain, None) is plain


@pytest.mark.parametrize(
    "message",
    [
        Message("T", b""),
        Message("T", b"x", tags=""),
        Message("T", b"x", tags="a||b"),
        Message("T", b"x", keys=("k",)),
        Message("T", b"x", properties={"a": "b"}),
        Message("T", b"x", deliver_at_ms=1),
        Message("bad topic!", b"x"),
    ],
)
def test_anything_but_a_plain_message_takes_the_full_checks(message: Message) -> None:
    assert not is_plain(message)
    assert not is_plain_batch([Message("T", b"ok"), message], "T")


def test_plain_messages_and_batches() -> None:
    assert is_plain(Message("T", b"x", tags="TagA"))
    assert is_plain_batch([Message("T", b"x"), Message("T", b"y", tags="A")], "T")
    assert not is_plain_batch([Message("T", b"x"), Message("U", b"y")], "T")
    assert not is_plain_batch([Message("T", b"x"), "not a message"], "T")
    assert has_timer({"TIMER_DELAY_SEC": "3"}) and not has_timer({"KEYS": "k"})


def test_writeable_topic_refuses_system_read_only_and_missing_topics(store: Store) -> None:
    admin = Admin(store)
    admin.create_topic("T", 2)
    admin.create_topic("ReadOnly", 2, perm=int(Perm.READ))
    assert writeable_topic(store, "T").queues == 2
    with pytest.raises(InvalidMessageError, match="system topic"):
        writeable_topic(store, "%RETRY%g")
    with pytest.raises(InvalidMessageError, match="not writable"):
        writeable_topic(store, "ReadOnly")
    with pytest.raises(TopicNotFoundError):
        writeable_topic(store, "Missing")
