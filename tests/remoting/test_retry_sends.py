"""A client's send to %RETRY%<group> (engine.remoting.retry_sends): where its copy goes and what the
client is told, the copy's real destination kept from where its envelope is made."""

from __future__ import annotations

from engine import Admin, MessageQueue, Store
from engine.protocol import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC
from engine.remoting.retry_sends import retry_copy, send_retry
from engine.remoting.wire_messages import IncomingMessage, incoming
from engine.remoting.wire_producer import WireProducer

RETRY = "%RETRY%g"
UNIQ = "AB" * 16


def _item(delay: int = 0) -> IncomingMessage:
    props = {"RETRY_TOPIC": "T", "UNIQ_KEY": UNIQ, **({"DELAY": str(delay)} if delay else {})}
    return incoming(RETRY, b"again", props)


def test_a_retry_copy_below_the_maximum_waits_in_the_schedule_topic_bound_for_the_retry_queue() -> None:
    copy = retry_copy(_item(delay=4), "g", 1, 16, born_ts_ms=5, now=1_000)
    assert copy.destination == MessageQueue(RETRY, 0)
    assert (copy.pending.topic, copy.pending.queue_id, copy.pending.delay_level) == (SCHEDULE_TOPIC, 3, 4)
    assert copy.pending.properties[PROPERTY_REAL_TOPIC] == RETRY
    assert copy.pending.properties[PROPERTY_REAL_QUEUE_ID] == "0"
    assert (copy.pending.uniq_key, copy.pending.reconsume_times) == (UNIQ, 1)


def test_a_retry_copy_at_the_maximum_is_stored_in_the_dead_letter_topic_where_it_was_sent() -> None:
    copy = retry_copy(_item(), "g", 16, 16, born_ts_ms=5, now=1_000)
    assert copy.destination is None
    assert (copy.pending.topic, copy.pending.queue_id, copy.pending.reconsume_times) == ("%DLQ%g", 0, 16)


def test_a_retry_send_answers_with_the_retry_queue_and_creates_the_topics_it_needs(store: Store) -> None:
    Admin(store).create_topic("T", 1)
    producer = WireProducer(store, linger_ms=0)
    try:
        result = send_retry(store, producer, RETRY, _item(delay=2), 1, 16, 5)
    finally:
        producer.close()
    assert (result.topic, result.queue_id, result.msg_id) == (RETRY, 0, UNIQ)
    assert {RETRY, SCHEDULE_TOPIC} <= set(store.topic_configs(refresh=True))
