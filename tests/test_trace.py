"""``Admin.trace``: the life of one message, read from the logs themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import (
    Admin,
    InvalidArgumentError,
    Message,
    MessageNotFoundError,
    Producer,
    PullConsumer,
    SendResult,
    SimpleConsumer,
    Store,
    TraceKind,
)
from engine.broker.dispatch import dispatch_pending
from engine.broker.index import index_pending
from engine.broker.pull_log import build_pull_log
from engine.broker.retry import route_retries
from engine.broker.schedule import deliver_due
from tests.helpers import dead_letter_received

FAR_FUTURE = 2**50


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store.open(str(tmp_path / "mq"))
    Admin(store).create_topic("T", 2)
    return store


def send(store: Store, body: bytes = b"hello", **options: object) -> SendResult:
    with Producer(store) as producer:
        return producer.send(Message("T", body, tags="A", keys=["order-1"]), queue_id=0, **options)  # type: ignore[arg-type]


def dead_letter(store: Store, group: str = "g") -> None:
    """Receive everything of T with a per-message consumer, nack it, route the nacks to the DLQ."""
    dead_letter_received(store, "T", group)
    build_pull_log(store)


def test_a_stored_message_is_traced_by_offset_id_and_by_uniq_key(store: Store) -> None:
    sent = send(store)
    trace = Admin(store).trace(sent.msg_id)
    assert [c.offset_msg_id for c in trace.copies] == [sent.offset_msg_id]
    assert trace.msg_id == sent.msg_id
    assert trace.kinds() == [TraceKind.STORED]
    assert trace.uniq_key == sent.uniq_key
    assert Admin(store).trace(sent.uniq_key).kinds() == [TraceKind.STORED]


def test_dispatch_index_and_a_group_commit_appear_in_order(store: Store) -> None:
    sent = send(store)
    dispatch_pending(store)
    index_pending(store)
    PullConsumer(store, "billing").commit_offset("T", 0, 1)
    trace = Admin(store).trace(sent.msg_id)
    assert trace.kinds() == [
        TraceKind.STORED,
        TraceKind.DISPATCHED,
        TraceKind.INDEXED,
        TraceKind.INDEXED,
        TraceKind.CONSUMED,
    ]
    indexed = sorted(e.detail for e in trace.events if e.kind is TraceKind.INDEXED)
    assert indexed == ["KEY order-1", f"UNIQ_KEY {sent.uniq_key}"]
    consumed = trace.events[-1]
    assert (consumed.group, consumed.detail) == ("billing", "committed offset 1")


def test_a_group_that_has_not_passed_the_message_has_not_consumed_it(store: Store) -> None:
    sent = send(store)
    send(store, b"second")
    dispatch_pending(store)
    PullConsumer(store, "slow").commit_offset("T", 0, 0)
    assert TraceKind.CONSUMED not in Admin(store).trace(sent.msg_id).kinds()


def test_delivery_nack_dead_letter_and_resend_are_one_story(store: Store) -> None:
    sent = send(store)
    dispatch_pending(store)
    dead_letter(store)
    admin = Admin(store)
    [dlq] = admin.dlq_messages("g")
    resent = admin.resend_dlq("g", dlq.msg_id)
    trace = admin.trace(sent.msg_id)
    kinds = trace.kinds()
    for kind in (
        TraceKind.PULLED,
        TraceKind.PULL_LOGGED,
        TraceKind.NACKED,
        TraceKind.DEAD_LETTERED,
        TraceKind.RESENT,
    ):
        assert kind in kinds, kinds
    assert (
        kinds.index(TraceKind.PULLED) < kinds.index(TraceKind.NACKED) < kinds.index(TraceKind.DEAD_LETTERED)
    )
    assert kinds.index(TraceKind.DEAD_LETTERED) < kinds.index(TraceKind.RESENT)
    assert [c.topic for c in trace.copies] == ["T", "%DLQ%g", "T"]
    assert trace.copies[-1].offset_msg_id == resent.offset_msg_id
    assert {c.msg_id for c in trace.copies} == {sent.msg_id}  # every copy keeps the id
    pulled = next(e for e in trace.events if e.kind is TraceKind.PULLED)
    assert pulled.group == "g" and pulled.consumer_id
    # The same story from the resent copy's ids: the family is closed over both links.
    assert admin.trace(resent.msg_id).kinds() == kinds
    assert admin.trace(resent.offset_msg_id).kinds() == kinds


def test_a_retry_goes_through_the_schedule_topic(store: Store) -> None:
    sent = send(store)
    dispatch_pending(store)
    with SimpleConsumer(store, "g") as consumer:
        consumer.subscribe("T")
        for message in consumer.receive(max_nums=8, invisible_ms=60_000):
            consumer.nack(message)
    route_retries(store)
    dispatch_pending(store)
    deliver_due(store, FAR_FUTURE)
    trace = Admin(store).trace(sent.msg_id)
    assert [c.topic for c in trace.copies] == ["T", "SCHEDULE_TOPIC_XXXX", "%RETRY%g"]
    kinds = trace.kinds()
    assert kinds.index(TraceKind.SCHEDULED) < kinds.index(TraceKind.RETRY)


def test_a_delayed_message_is_scheduled_then_reput_into_its_topic(store: Store) -> None:
    sent = send(store, delay_level=1)
    dispatch_pending(store)
    deliver_due(store, FAR_FUTURE)
    trace = Admin(store).trace(sent.uniq_key)
    assert [e.kind for e in trace.events if e.kind is not TraceKind.DISPATCHED] == [
        TraceKind.SCHEDULED,
        TraceKind.REPUT,
    ]
    assert trace.copies[-1].topic == "T"


def test_other_messages_are_not_part_of_the_story(store: Store) -> None:
    sent = send(store)
    send(store, b"unrelated")
    assert len(Admin(store).trace(sent.msg_id).copies) == 1


@pytest.mark.parametrize("msg_id", ["", "has space", None, 42])
def test_a_malformed_id_is_refused(store: Store, msg_id: object) -> None:
    with pytest.raises(InvalidArgumentError):
        Admin(store).trace(msg_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("msg_id", ["0" * 32, "F" * 32, "not-an-id"])
def test_an_unknown_id_is_message_not_found(store: Store, msg_id: str) -> None:
    send(store)
    with pytest.raises(MessageNotFoundError, match="no message"):
        Admin(store).trace(msg_id)


def test_a_committed_transaction_is_a_half_then_a_reput(store: Store) -> None:
    from engine import LocalTransactionState, TransactionProducer

    with TransactionProducer(store, lambda m: LocalTransactionState.COMMIT, group="tx") as producer:
        sent = producer.send_in_transaction(Message("T", b"paid"), lambda m: LocalTransactionState.COMMIT)
    trace = Admin(store).trace(sent.msg_id)
    assert [(e.kind, e.topic) for e in trace.events] == [
        (TraceKind.HALF, "RMQ_SYS_TRANS_HALF_TOPIC"),
        (TraceKind.REPUT, "T"),
    ]
